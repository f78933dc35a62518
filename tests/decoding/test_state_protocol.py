"""Every decoding state honours the protocol of decoding_state.DecodingState (tensor functions: prefill makes the
state tensors, step and chunk take and return them): a prefill followed by single steps reaches the state a prefill
of the whole sequence gives (and the steps give the mixer's outputs), a chunk equals its tokens stepped one by one,
reordering or repeating the cache layer's batch rows equals running the selected rows, and rows at different
positions step together as each would alone."""

from __future__ import annotations

import copy

import pytest
import torch

from modeling_tnn import TnnForCausalLM
from modeling_tnn.decoding_cache import TnnCacheLayer
from modeling_tnn.decoding_compact import CompactState
from modeling_tnn.decoding_plan import PLANNERS, PlanSettings
from modeling_tnn.decoding_ssm import SsmState
from modeling_tnn.decoding_poles import pole_powers
from modeling_tnn.decoding_window import WindowState, window_history

from tests.support import tiny_config

ETSC_LENGTH = 16
# (mixer, gamma, generation_cache mode, the state class it must give, whether the state is exact)
CASES = {
    "window": ("dense", 0.9, "exact", WindowState, True),
    "growing window": ("dense", 1.0, "exact", WindowState, True),
    "ssm": ("dense", 0.9, "etsc", SsmState, True),
    "ssm with the closing tap": ("fd", 1.0, "etsc", SsmState, False),
    "compact": ("dense", 0.9, "compact", CompactState, False),
}


def _mixer_and_state(case):
    mixer_name, gamma, mode, state_class, exact = CASES[case]
    torch.manual_seed(0)
    config = tiny_config(mixer_name, decay_gamma=gamma, etsc_length=ETSC_LENGTH, fd_kernel_length=ETSC_LENGTH)
    mixer = TnnForCausalLM(config).eval().model.layers[0].gtu.token_mixer
    with torch.no_grad():
        state = PLANNERS[mode].choose(mixer, PlanSettings(ETSC_LENGTH), torch.device("cpu"), torch.float32)
    assert type(state) is state_class
    return mixer, state, exact


def _span(state) -> int:
    """Where the state changes shape or kind: the window's width, the SSM's period (the growing history: 64)."""
    return state.describe()["window"] or 64


def _prefilled(state, mixer, v):
    """A cache layer holding the state after ``v``, as the cache drives it."""
    layer = TnnCacheLayer()
    layer.state = copy.copy(state)  # the constants are shared, the plan's numbers are the layer's own
    layer.set_states(layer.state.prefill(mixer, v))
    return layer


def _run(layer, mixer, v, seen, chunk=1):
    """Outputs (b, n, c) of ``v``'s tokens fed after ``seen`` tokens, ``chunk`` at a time (1: steps)."""
    outputs = []
    for start in range(0, v.shape[1], chunk):
        piece = v[:, start:start + chunk]
        states = layer.states()
        if piece.shape[1] == 1:
            states = layer.state.reserve(mixer, states, seen + start)
            out, states = layer.state.step(states, piece[:, 0], seen + start)
            outputs.append(out[:, None])
        else:
            out, states = layer.state.chunk(mixer, states, piece, seen + start)
            outputs.append(out)
        layer.set_states(states)
    return torch.cat(outputs, dim=1)


def _assert_same_state(a, b, seen):
    """The two layers hold the same state after ``seen`` tokens: the same tensors (the window as the inputs it holds,
    which a growing history may keep in buffers of different widths; the modes whole),
    and the same outputs for the same next tokens."""
    for index in (0, 1):
        x, y = a.recurrent_states[index], b.recurrent_states[index]
        assert (x is None) == (y is None)
        if x is None:
            continue
        if index == 0 and not x.is_complex():
            x, y = window_history(x, seen), window_history(y, seen)
        torch.testing.assert_close(x, y, atol=2e-5, rtol=2e-5)


def _inputs(mixer, batch, n):
    return torch.randn(batch, n, mixer.channels, generator=torch.Generator().manual_seed(1))


@pytest.mark.parametrize("case", list(CASES))
def test_prefill_then_steps_equals_a_prefill_of_the_whole(case):
    mixer, state, exact = _mixer_and_state(case)
    span = _span(state)
    total = span + 6
    v = _inputs(mixer, 2, total)
    with torch.no_grad():
        reference = mixer(v)
        whole = _prefilled(state, mixer, v)
        for prompt in (1, span - 3, span, span + 2):  # before, at and past the point where the state changes
            layer = _prefilled(state, mixer, v[:, :prompt])
            stepped = _run(layer, mixer, v[:, prompt:], prompt)
            _assert_same_state(layer, whole, total)
            scale = reference.abs().max()
            exact_until = total if state.horizon is None else max(state.horizon - prompt, 0)  # ETSC's horizon
            difference = (stepped - reference[:, prompt:])[:, :exact_until]
            error = difference.abs().max() / scale if difference.numel() else 0.0
            assert error < (1e-5 if exact else 1e-3), (prompt, error)
            probe = _inputs(mixer, 2, 3)  # and the same future
            torch.testing.assert_close(_run(layer, mixer, probe, total),
                                       _run(copy.deepcopy(whole), mixer, probe, total), atol=2e-5 * scale, rtol=0)


@pytest.mark.parametrize("chunk", [2, 5])
@pytest.mark.parametrize("case", list(CASES))
def test_a_chunk_equals_its_tokens_stepped(case, chunk):
    mixer, state, _ = _mixer_and_state(case)
    span = _span(state)
    v = _inputs(mixer, 2, span + 12)
    with torch.no_grad():
        for prompt in (2, span - 3, span + 1):  # chunks that cross the change of state, and chunks after it
            chunked, stepped = _prefilled(state, mixer, v[:, :prompt]), _prefilled(state, mixer, v[:, :prompt])
            out_chunked = _run(chunked, mixer, v[:, prompt:], prompt, chunk)
            out_stepped = _run(stepped, mixer, v[:, prompt:], prompt)
            if state.horizon is not None and prompt < span:
                # ETSC's closed kernel repeats past its horizon; a chunk of the window phase runs the parallel
                # path, whose kernel does not: the two agree up to the horizon (then the cache warns).
                within = state.horizon - prompt
                out_chunked, out_stepped = out_chunked[:, :within], out_stepped[:, :within]
            torch.testing.assert_close(out_chunked, out_stepped, atol=2e-5 * out_stepped.abs().max(), rtol=0)
            _assert_same_state(chunked, stepped, v.shape[1])


@pytest.mark.parametrize("case", list(CASES))
def test_reordered_or_repeated_rows_equal_running_the_selected_rows(case):
    mixer, state, _ = _mixer_and_state(case)
    span = _span(state)
    v = _inputs(mixer, 3, span + 8)
    prompt = span + 2
    rows = torch.tensor([2, 0, 2])
    with torch.no_grad():
        reordered = _prefilled(state, mixer, v[:, :prompt])
        reordered.batch_select_indices(rows)  # beam search's and transformers' way in: the layer asks its state
        selected = _prefilled(state, mixer, v[rows, :prompt])
        _assert_same_state(reordered, selected, prompt)
        torch.testing.assert_close(_run(reordered, mixer, v[rows, prompt:], prompt),
                                   _run(selected, mixer, v[rows, prompt:], prompt))
        repeated = _prefilled(state, mixer, v[:, :prompt])
        repeated.batch_repeat_interleave(2)
        expanded = v.repeat_interleave(2, dim=0)
        assert repeated.batch_size == 6
        torch.testing.assert_close(_run(repeated, mixer, expanded[:, prompt:], prompt),
                                   _run(_prefilled(state, mixer, expanded[:, :prompt]), mixer, expanded[:, prompt:],
                                        prompt))


FIXED_SHAPES = [case for case in CASES if case in ("window", "compact")]


@pytest.mark.parametrize("case", FIXED_SHAPES)
def test_rows_at_different_positions_step_together_as_each_alone(case):
    """A batch whose rows were prefilled with different prompt lengths (before, at and past the window), stepped and
    then continued by a chunk together with per-row positions, equals each row run alone; the state tensors are
    updated in place (a serving engine's slots)."""
    mixer, state, _ = _mixer_and_state(case)
    span = _span(state)
    prompts = [3, span, span + 7]
    v = _inputs(mixer, len(prompts), span + 20)
    with torch.no_grad():
        alone_outputs, alone_states = [], []
        for row, prompt in enumerate(prompts):
            layer = _prefilled(state, mixer, v[row:row + 1, :prompt])
            stepped = _run(layer, mixer, v[row:row + 1, prompt:prompt + 4], prompt)
            chunked = _run(layer, mixer, v[row:row + 1, prompt + 4:prompt + 9], prompt + 4, chunk=5)
            alone_outputs.append(torch.cat([stepped, chunked], dim=1))
            alone_states.append(layer.states())
        rows = [state.prefill(mixer, v[row:row + 1, :prompt]) for row, prompt in enumerate(prompts)]
        states = tuple(torch.cat(parts) for parts in zip(*rows))
        held = [tensor.data_ptr() for tensor in states]
        positions = torch.tensor(prompts)
        outputs = []
        for k in range(4):
            tokens = torch.stack([v[row, prompt + k] for row, prompt in enumerate(prompts)])
            out, states = state.step(states, tokens, positions + k)
            outputs.append(out[:, None])
        chunk = torch.stack([v[row, prompt + 4:prompt + 9] for row, prompt in enumerate(prompts)])
        out, states = state.chunk(mixer, states, chunk, positions + 4)
        outputs.append(out)
        together = torch.cat(outputs, dim=1)
        assert [tensor.data_ptr() for tensor in states] == held
        for row in range(len(prompts)):
            torch.testing.assert_close(together[row:row + 1], alone_outputs[row], atol=2e-5, rtol=2e-5)
            for mine, alone in zip(states, alone_states[row]):
                if mine.dim() == 3:  # the window: the inputs it holds, oldest first
                    seen = prompts[row] + 9
                    mine, alone = window_history(mine[row:row + 1], seen), window_history(alone, seen)
                else:
                    mine = mine[row:row + 1]
                torch.testing.assert_close(mine, alone, atol=2e-5, rtol=2e-5)


def test_the_ssm_state_refuses_rows_at_their_own_positions():
    mixer, state, _ = _mixer_and_state("ssm")
    with torch.no_grad():
        states = state.prefill(mixer, _inputs(mixer, 2, 4))
        with pytest.raises(ValueError, match="positions"):
            state.step(states, torch.zeros(2, mixer.channels), torch.tensor([4, 5]))


def test_pole_powers_equal_products_of_float64_factors_in_the_shape_of_exponents_then_poles():
    """The one helper for powers of poles: any exponents' shape in front of the poles' shape, the poles' dtype (or the
    one asked for), and the values of repeated complex128 products (to float64 rounding of k multiplications)."""
    generator = torch.Generator().manual_seed(0)
    poles = torch.polar(0.5 + 0.49 * torch.rand(3, 4, generator=generator, dtype=torch.float64),
                        3.0 * torch.rand(3, 4, generator=generator, dtype=torch.float64))
    products = torch.cumprod(torch.cat([torch.ones_like(poles)[None], poles[None].expand(299, -1, -1)]), dim=0)
    exponents = torch.tensor([[0, 7], [150, 299]])
    powers = pole_powers(poles.to(torch.complex64), exponents, torch.complex128)
    assert powers.shape == (2, 2, 3, 4) and powers.dtype == torch.complex128
    torch.testing.assert_close(powers, products[exponents], atol=1e-6, rtol=1e-5)  # poles rounded to complex64
    torch.testing.assert_close(pole_powers(poles, exponents), products[exponents], atol=1e-13, rtol=1e-12)
    assert pole_powers(poles.to(torch.complex64), 5).dtype == torch.complex64
    torch.testing.assert_close(pole_powers(poles, 5), products[5], atol=1e-14, rtol=1e-13)
