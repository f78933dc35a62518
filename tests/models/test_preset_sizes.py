"""The `small` preset's size, as each language-model head builds it: the demo's model, whose parameter count the
preset's description and the model docs state."""

from __future__ import annotations

import torch

from modeling_tnn import TnnForCausalLM, TnnForMaskedLM, load_preset


def _trainable(model: torch.nn.Module) -> int:
    return sum(p.numel() for p in model.parameters() if p.requires_grad)


def test_small_preset_sizes_as_causal_and_masked_lm():
    with torch.device("meta"):  # sizes only: no memory, no initialisation
        causal, masked = TnnForCausalLM(load_preset("small")), TnnForMaskedLM(load_preset("small"))
    assert _trainable(causal) == 2_101_632
    # The output projection is the input embedding (tied): the rest of the causal LM is the blocks and the norms.
    assert causal.get_output_embeddings().weight is causal.get_input_embeddings().weight
    assert _trainable(causal) - causal.get_input_embeddings().weight.numel() == 1_053_056
    # The masked LM adds its prediction head's transform and bias on top of the same backbone.
    assert _trainable(masked) == 2_126_592
