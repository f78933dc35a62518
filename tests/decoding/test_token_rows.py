"""A state that steps token rows (``STEPS_TOKEN_ROWS``: the cache passes the layer's (b, 1, c) input as it is) gives
the same outputs, of shape (b, 1, c), and the same state tensors as its step on (b, c) inputs: every row at one
position (the int path, folds included) and rows at their own positions (a serving batch)."""

from __future__ import annotations

import pytest
import torch

from modeling_tnn.decoding_ssm import SsmState

from tests.decoding.test_state_protocol import FIXED_SHAPES, _inputs, _mixer_and_state, _span


@pytest.mark.parametrize("per_row", [False, True], ids=["one position", "rows at their own positions"])
@pytest.mark.parametrize("case", FIXED_SHAPES)
def test_a_token_row_steps_as_its_flat_input(case, per_row):
    mixer, state, _ = _mixer_and_state(case)
    assert state.STEPS_TOKEN_ROWS
    span = _span(state)
    prompt, steps = span - 2, 2 * span + 3  # through the window's filling and past several folds
    v = _inputs(mixer, 3, prompt + steps)
    with torch.no_grad():
        flat = state.prefill(mixer, v[:, :prompt])
        rows = tuple(tensor.clone() for tensor in flat)
        for k in range(steps):
            positions = torch.full((3,), prompt + k) if per_row else prompt + k
            out_flat, flat = state.step(flat, v[:, prompt + k], positions)
            out_rows, rows = state.step(rows, v[:, prompt + k:prompt + k + 1], positions)
            assert out_rows.shape == (3, 1, mixer.channels)
            torch.testing.assert_close(out_rows[:, 0], out_flat, atol=0, rtol=0)
        for mine, flat_one in zip(rows, flat):
            torch.testing.assert_close(mine, flat_one, atol=0, rtol=0)


def test_the_ssm_state_steps_flat_inputs_only():
    """The SSM's step broadcasts the input against its (b, c, M) state: it must keep taking (b, c)."""
    assert not SsmState.STEPS_TOKEN_ROWS
