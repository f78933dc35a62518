"""The loading keywords transformers documents (``dtype="auto"``, ``device_map``, ``revision``, ...) work on a saved TNN
folder through ``AutoConfig``, the Auto model classes and the TNN classes, as they do for transformers' own models."""

from __future__ import annotations

import pytest
import torch
from transformers import AutoConfig, AutoModelForCausalLM, AutoModelForMaskedLM

import modeling_tnn  # noqa: F401  (registers the TNN Auto classes)
from modeling_tnn import TnnConfig, TnnForCausalLM, TnnForMaskedLM, TnnModel

from tests.support import tiny_config


@pytest.fixture(scope="module")
def saved_bf16_lm(tmp_path_factory):
    """A tiny causal LM saved in bfloat16 (so ``dtype="auto"`` has something other than the default to find)."""
    folder = tmp_path_factory.mktemp("tnn_bf16")
    torch.manual_seed(0)
    TnnForCausalLM(tiny_config()).to(torch.bfloat16).save_pretrained(folder)
    return folder


@pytest.mark.parametrize("loader", [AutoConfig.from_pretrained, TnnConfig.from_pretrained])
def test_config_accepts_dtype_auto(saved_bf16_lm, loader):
    config = loader(saved_bf16_lm, dtype="auto")  # raised AttributeError: module 'torch' has no attribute 'auto'
    assert isinstance(config, TnnConfig) and config.causal is True
    # An explicit dtype is kept as transformers' own configs keep it (Llama's gives the same value).
    assert str(loader(saved_bf16_lm, dtype="float16").dtype).endswith("float16")
    # A field override still goes through the constructor's validation with the file's values.
    assert loader(saved_bf16_lm, dtype="auto", decay_gamma=0.9).decay_gamma == 0.9
    with pytest.raises(ValueError, match="decay_gamma"):
        loader(saved_bf16_lm, dtype="auto", decay_gamma=2.0)


@pytest.mark.parametrize("loader", [AutoModelForCausalLM.from_pretrained, TnnForCausalLM.from_pretrained])
def test_model_loading_keywords(saved_bf16_lm, loader):
    auto = loader(saved_bf16_lm, dtype="auto")
    assert auto.dtype == torch.bfloat16  # "auto": the dtype the weights were saved in
    model = loader(saved_bf16_lm, dtype=torch.float32, device_map="cpu", revision="main", local_files_only=True,
                   low_cpu_mem_usage=True)
    assert model.dtype == torch.float32 and model.device.type == "cpu"
    for name, tensor in auto.state_dict().items():
        torch.testing.assert_close(model.state_dict()[name], tensor.float(), rtol=0, atol=0, msg=name)
    # The keywords go through generate's path too: a loaded model decodes.
    out = model.generate(torch.tensor([[5, 6, 7]]), max_new_tokens=3, do_sample=False)
    assert out.shape == (1, 6)


def test_a_head_of_the_other_direction_loads_from_a_causal_folder_with_an_override(saved_bf16_lm):
    # The saved config says causal=True; the keyword override is validated with it and lets a masked LM load.
    for loader in (AutoModelForMaskedLM.from_pretrained, TnnForMaskedLM.from_pretrained):
        model = loader(saved_bf16_lm, causal=False, dtype="auto")
        assert model.config.causal is False and model.dtype == torch.bfloat16


def test_a_backbone_built_from_an_unresolved_config_runs_causally():
    # TnnModel resolves causal=None to True on its own copy, and its mixers are built from that copy: a token's output
    # does not depend on the tokens after it.
    torch.manual_seed(0)
    model = TnnModel(tiny_config("fd")).eval()
    ids = torch.randint(1, 100, (1, 12))
    changed = ids.clone()
    changed[0, 8:] = 3
    with torch.no_grad():
        torch.testing.assert_close(model(ids, use_cache=False).last_hidden_state[:, :8],
                                   model(changed, use_cache=False).last_hidden_state[:, :8])
