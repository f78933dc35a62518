"""The vLLM-free parts of serving: the per-request state slots (one padded shape over the layers, rows read and
written at their slots' corners) and which folders and decoding plans are refused."""

from __future__ import annotations

import pytest
import torch

from modeling_tnn import TnnForCausalLM
from modeling_tnn.decoding_plan import PLANNERS, PlanSettings
from modeling_tnn.serving.servable import growing_state, refusal
from modeling_tnn.serving.state_slots import gather_rows, padded_shapes, scatter_rows
from tests.support import tiny_config


def test_padded_shapes_take_each_dimensions_largest():
    assert padded_shapes([((8, 4), (3, 4, 2)), ((16, 4),), ((5, 4), (3, 4, 6))]) == ((16, 4), (3, 4, 6))


def test_padded_shapes_refuse_states_of_different_rank():
    with pytest.raises(ValueError, match="rank"):
        padded_shapes([((8, 4),), ((3, 4, 2),)])


def test_rows_round_trip_through_their_corners():
    slots = (torch.zeros(5, 16, 4), torch.zeros(5, 3, 4, 6))
    shapes = ((8, 4), (3, 4, 2))
    indices = torch.tensor([3, 1])
    rows = gather_rows(slots, indices, shapes)
    assert [tuple(r.shape) for r in rows] == [(2, 8, 4), (2, 3, 4, 2)]
    rows[0].add_(1.0)
    rows[1].add_(2.0)
    scatter_rows(slots, indices, rows)
    assert slots[0][[1, 3], :8].eq(1).all() and slots[0][:, 8:].eq(0).all()
    assert slots[0][[0, 2, 4]].eq(0).all()
    assert slots[1][[1, 3], :, :, :2].eq(2).all() and slots[1][..., 2:].eq(0).all()
    again = gather_rows(slots, indices, shapes)
    assert all(torch.equal(a, b) for a, b in zip(again, rows))


@pytest.mark.parametrize("config, reason", [
    (tiny_config("dense", causal=True), None),
    (tiny_config("fd", causal=True), None),
    (tiny_config("ski", causal=False), "bidirectional only"),
    (tiny_config("dense", causal=False), "causal=False"),
    (tiny_config("dense", causal=True, architectures=["TnnForMaskedLM"]), "not a causal language model"),
])
def test_which_folders_are_served(config, reason):
    found = refusal(config)
    assert (found is None) if reason is None else (reason in found)


@pytest.mark.parametrize("mixer, overrides, mode, grows", [
    ("fd", {}, "auto", False),                       # the window of FD's support
    ("dense", {"decay_gamma": 1.0}, "auto", True),   # no float32 support: ETSC's state
    ("dense", {}, "etsc", True),
    ("dense", {}, "exact", False),                   # the window of the decaying kernel's support
])
def test_a_state_that_grows_is_refused(mixer, overrides, mode, grows):
    config = tiny_config(mixer, causal=True, **overrides)
    layer_mixer = TnnForCausalLM(config).eval().model.layers[0].gtu.token_mixer
    plan = PLANNERS[mode].choose(layer_mixer, PlanSettings(etsc_length=config.etsc_length), torch.device("cpu"),
                                 torch.float32)
    problem = growing_state(plan, 0, mode)
    assert (problem is not None) == grows
    if grows:
        assert "grows with the context" in problem and f"generation_cache={mode!r}" in problem


def test_the_entry_point_names_the_registration_function():
    """vLLM finds the plugin by pyproject's ``vllm.general_plugins`` entry point (importable without vLLM)."""
    import importlib
    import tomllib

    from tests.support import PROJECT_ROOT

    points = tomllib.loads((PROJECT_ROOT / "pyproject.toml").read_text())["project"]["entry-points"]
    module, function = points["vllm.general_plugins"]["modeling_tnn"].split(":")
    assert callable(getattr(importlib.import_module(module), function))
