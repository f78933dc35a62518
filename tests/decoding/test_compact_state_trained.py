"""The compact decoding state on a kernel trained by the demo's recipe (run_scripts/train_clm.py on the embedded
corpus, a short run of the tiny preset): generation_cache="auto" certifies each layer within compact_tolerance or
falls back to the exact window, and greedy decoding matches the no-cache forward within what the tolerance
implies."""

from __future__ import annotations

import pytest
import torch

from modeling_tnn import TnnForCausalLM
from modeling_tnn.recipes.pretraining import arguments as lm_arguments
from modeling_tnn.recipes.pretraining import training as lm_training

# The demo's optimiser settings (Makefile `demo`) on the tiny preset, a few steps: the RPE moves off its
# initialisation the way the recipe moves it.
RECIPE = ["--config_name", "tiny", "--block_size", "32", "--vocab_size", "300", "--report_to", "none",
          "--per_device_train_batch_size", "16", "--learning_rate", "3e-3", "--weight_decay", "0.01",
          "--num_warmup_steps", "2", "--max_train_steps", "12", "--max_eval_samples", "8",
          "--per_device_eval_batch_size", "8"]


@pytest.fixture(scope="module")
def trained(tmp_path_factory) -> TnnForCausalLM:
    out = tmp_path_factory.mktemp("trained_clm")
    lm_training.run(lm_arguments.parse_args("clm", RECIPE + ["--output_dir", str(out)]), "clm")
    return TnnForCausalLM.from_pretrained(out).eval()


def test_a_trained_kernel_certifies_or_falls_back_and_decodes_within_tolerance(trained):
    config = trained.config
    assert config.token_mixer == "dense" and config.decay_gamma < 1
    prompt = torch.randint(1, config.vocab_size, (1, 5), generator=torch.Generator().manual_seed(0))
    steps = 100  # well past the compact window (32 lags): the modes carry the tail
    with torch.no_grad():
        out = trained.generate(prompt, max_new_tokens=steps, do_sample=False, min_new_tokens=steps,
                               generation_cache="auto", return_dict_in_generate=True, output_logits=True,
                               pad_token_id=0)
        full = trained(input_ids=out.sequences[:, :-1], use_cache=False).logits[:, prompt.shape[1] - 1:]
    cache = out.past_key_values if hasattr(out, "past_key_values") else out.cache
    rows = cache.describe()
    assert len(rows) == config.num_hidden_layers
    for row in rows:
        assert row["plan"] in ("compact", "window")
        if row["plan"] == "compact":
            assert row["error_bound"] <= config.compact_tolerance
    decoded = torch.stack(out.logits, 1)
    assert decoded.shape == full.shape
    # compact_tolerance bounds each mixer output's relative l1 kernel error; its default is chosen so that logits
    # stay within 1e-5 relative of the no-cache forward (docs/compact-decoding.md)
    error = ((decoded - full).abs().max() / full.abs().max()).item()
    assert error < 1e-5
