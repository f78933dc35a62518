"""The GTU's and GLU's fused input projections (``uv_proj``, ``gate_up_proj``): checkpoints written with the two
separate Linears of earlier versions load into them and give the same outputs."""

from __future__ import annotations

import pytest
import torch
from safetensors.torch import load_file, save_file

from modeling_tnn import TnnForCausalLM, TnnForMaskedLM
from modeling_tnn.naive import naive_glu, naive_gtu_gate

from tests.support import tiny_config

SPLITS = {"gtu.uv_proj": ("gtu.u_proj", "gtu.v_proj"), "glu.gate_up_proj": ("glu.gate_proj", "glu.up_proj")}


def split_state_dict(model: torch.nn.Module) -> dict[str, torch.Tensor]:
    """The model's weights as the earlier layout named them: each fused Linear as two, first half first."""
    old = {}
    for key, value in model.state_dict().items():
        fused = next((f for f in SPLITS if f"{f}." in key), None)
        if fused is None:
            old[key] = value.clone()
            continue
        first, second = value.chunk(2, dim=0)
        old[key.replace(fused, SPLITS[fused][0])] = first.clone()
        old[key.replace(fused, SPLITS[fused][1])] = second.clone()
    return old


@pytest.mark.parametrize("cls, mixer", [(TnnForCausalLM, "dense"), (TnnForMaskedLM, "ski")])
def test_an_old_layout_folder_loads_with_the_same_logits(tmp_path, cls, mixer):
    model = cls(tiny_config(mixer)).eval()
    ids = torch.randint(1, model.config.vocab_size, (2, 11))
    expected = model(input_ids=ids).logits
    model.config.save_pretrained(tmp_path)
    old = split_state_dict(model)
    old.pop("lm_head.weight", None)  # tied to the embedding
    old.pop("lm_head.decoder.weight", None)
    assert not any("uv_proj" in k or "gate_up_proj" in k for k in old)
    save_file(old, tmp_path / "model.safetensors", metadata={"format": "pt"})
    loaded, info = cls.from_pretrained(tmp_path, output_loading_info=True)
    assert not info["missing_keys"] and not info["unexpected_keys"], info
    torch.testing.assert_close(loaded.eval()(input_ids=ids).logits, expected, rtol=0, atol=0)


def test_saved_folders_keep_the_original_layout_and_round_trip(tmp_path):
    """save_pretrained writes the original format (transformers' default): split projections, which earlier versions
    of this code read too; loading them back gives the model again."""
    model = TnnForCausalLM(tiny_config("fd")).eval()
    model.save_pretrained(tmp_path)
    keys = set(load_file(tmp_path / "model.safetensors"))
    assert "model.layers.0.gtu.u_proj.weight" in keys and "model.layers.0.glu.up_proj.bias" in keys
    assert not any("uv_proj" in k or "gate_up_proj" in k for k in keys)
    loaded = TnnForCausalLM.from_pretrained(tmp_path).eval()
    for (name, a), (_, b) in zip(model.state_dict().items(), loaded.state_dict().items()):
        torch.testing.assert_close(a, b, rtol=0, atol=0, msg=name)


def test_a_fused_layout_folder_loads_too(tmp_path):
    model = TnnForCausalLM(tiny_config("dense")).eval()
    model.config.save_pretrained(tmp_path)
    state = {k: v.contiguous() for k, v in model.state_dict().items() if k != "lm_head.weight"}
    save_file(state, tmp_path / "model.safetensors", metadata={"format": "pt"})
    loaded, info = TnnForCausalLM.from_pretrained(tmp_path, output_loading_info=True)
    assert not info["missing_keys"] and not info["unexpected_keys"], info
    ids = torch.randint(1, model.config.vocab_size, (1, 7))
    torch.testing.assert_close(loaded.eval()(input_ids=ids).logits, model(input_ids=ids).logits, rtol=0, atol=0)


def test_the_fused_gtu_and_glu_are_the_plain_ones_of_their_halves():
    model = TnnForCausalLM(tiny_config("dense")).double().eval()
    block = model.model.layers[0]
    x = torch.randn(2, 9, model.config.hidden_size, dtype=torch.float64)
    uv = block.gtu.uv_proj
    width = uv.out_features // 2
    u = torch.nn.functional.linear(x, uv.weight[:width], uv.bias[:width])
    v = torch.nn.functional.linear(x, uv.weight[width:], uv.bias[width:])
    wanted = block.gtu.o_proj(naive_gtu_gate(u, v, block.gtu.token_mixer))
    torch.testing.assert_close(block.gtu(x), wanted, rtol=0, atol=1e-12)
    fused = block.glu.gate_up_proj
    half = fused.out_features // 2
    gate, up = torch.nn.Linear(1, 1).double(), torch.nn.Linear(1, 1).double()
    gate.weight, gate.bias = torch.nn.Parameter(fused.weight[:half]), torch.nn.Parameter(fused.bias[:half])
    up.weight, up.bias = torch.nn.Parameter(fused.weight[half:]), torch.nn.Parameter(fused.bias[half:])
    torch.testing.assert_close(block.glu(x), naive_glu(x, gate, up, block.glu.down_proj), rtol=0, atol=1e-12)
