"""The per-request state slots (no vLLM needed): one padded shape over the layers, and rows read and written at
their slots' corners."""

from __future__ import annotations

import pytest
import torch

from modeling_tnn.serving.servable import refusal
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
