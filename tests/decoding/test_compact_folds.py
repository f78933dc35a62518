"""The compact state's folds: every K positions the ring's K oldest inputs enter the modes and the readout rows are
renewed; between folds a step touches no mode. Whatever K and wherever the prompt ends (before the window fills, on
a fold, between two), the steps give the compact kernel's convolution (exact taps, then the modal tail), computed
here in float64 by brute force; rows at their own positions (folding at different steps) step together as each
alone; a chunk across folds continues the same state."""

from __future__ import annotations

import pytest
import torch

from modeling_tnn import TnnForCausalLM, decoding_compact
from modeling_tnn.decoding_compact import CompactState, frontier
from modeling_tnn.decoding_plan import PLANNERS, PlanSettings
from modeling_tnn.fit_modal import float64_taps, modal_taps
from modeling_tnn.fit_plans import modal_tail

from tests.support import tiny_config

FOLDS = [1, 3, 16]


def _mixer():
    torch.manual_seed(0)
    model = TnnForCausalLM(tiny_config("dense", decay_gamma=0.9)).eval()
    return model.model.layers[0].gtu.token_mixer


def _plan(mixer, fold_every):
    with torch.no_grad():
        shipped = PLANNERS["compact"].choose(mixer, PlanSettings(16), torch.device("cpu"), torch.float32)
        tail = modal_tail(mixer, PlanSettings(16).tolerance, torch.device("cpu"))
        plan = CompactState.from_tail(tail, mixer, torch.device("cpu"), torch.float32, fold_every=fold_every)
    assert type(shipped) is CompactState and shipped.capacity == plan.capacity
    return plan, tail


def _compact_kernel_output(mixer, tail, v):
    """The compact kernel (exact taps below W, the modal tail from W on) applied to ``v`` (b, n, c), float64."""
    n = v.shape[1]
    taps = float64_taps(mixer, torch.arange(n))
    window = tail.window
    if n > window:
        taps[window:] = modal_taps(tail.poles.to(torch.complex128), tail.residues.to(torch.complex128),
                                   torch.arange(n - window))
    x = v.double()
    lags = torch.arange(n)[:, None] - torch.arange(n)[None]  # (out, in)
    dense = taps[lags.clamp_min(0)] * (lags >= 0)[..., None]  # (n, n, c)
    return torch.einsum("oic,bic->boc", dense, x)


def _steps(plan, mixer, v, prompt):
    with torch.no_grad():
        states = plan.prefill(mixer, v[:, :prompt])
        outputs = []
        for position in range(prompt, v.shape[1]):
            out, states = plan.step(states, v[:, position], position)
            outputs.append(out)
    return torch.stack(outputs, dim=1), states


@pytest.mark.parametrize("fold_every", FOLDS)
def test_steps_across_folds_give_the_compact_kernel(fold_every):
    mixer = _mixer()
    plan, tail = _plan(mixer, fold_every)
    window = plan.capacity
    v = torch.randn(2, 3 * window + 3 * fold_every + 9, mixer.channels, generator=torch.Generator().manual_seed(1))
    reference = _compact_kernel_output(mixer, tail, v)
    scale = reference.abs().max()
    for prompt in (5, window, window + fold_every + 2, 2 * window + 5):
        got, _ = _steps(plan, mixer, v, prompt)
        assert ((got.double() - reference[:, prompt:]).abs().max() / scale) < 1e-5, prompt


@pytest.mark.parametrize("fold_every", FOLDS)
def test_the_modes_hold_the_inputs_before_the_frontier(fold_every):
    """After a prompt and steps, the modes are those of a prompt of the inputs before the frontier alone."""
    mixer = _mixer()
    plan, _ = _plan(mixer, fold_every)
    v = torch.randn(1, 2 * plan.capacity + 2 * fold_every + 3, mixer.channels,
                    generator=torch.Generator().manual_seed(2))
    _, (_, modes) = _steps(plan, mixer, v, plan.capacity + 1)
    front = frontier(v.shape[1], plan.capacity, fold_every)
    _, direct = plan.prefill(mixer, v[:, :front + plan.capacity])  # its frontier: the same inputs
    torch.testing.assert_close(modes, direct, atol=1e-6, rtol=1e-5)


@pytest.mark.parametrize("host", [True, False])  # False: the accelerator's path, no value read on the host
@pytest.mark.parametrize("fold_every", FOLDS)
def test_rows_folding_at_different_steps_step_together_as_each_alone(fold_every, host, monkeypatch):
    monkeypatch.setattr(decoding_compact, "reads_rows_on_host", lambda positions: host)
    mixer = _mixer()
    plan, _ = _plan(mixer, fold_every)
    prompts = [3, plan.capacity, plan.capacity + 1, plan.capacity + fold_every + 2]
    steps = 2 * fold_every + 3
    v = torch.randn(len(prompts), max(prompts) + steps, mixer.channels, generator=torch.Generator().manual_seed(3))
    with torch.no_grad():
        alone = [_steps(plan, mixer, v[row:row + 1, :prompt + steps], prompt)[0] for row, prompt in enumerate(prompts)]
        states = tuple(torch.cat(parts) for parts in zip(*[plan.prefill(mixer, v[row:row + 1, :prompt])
                                                          for row, prompt in enumerate(prompts)]))
        positions = torch.tensor(prompts)
        together = []
        for k in range(steps):
            tokens = torch.stack([v[row, prompt + k] for row, prompt in enumerate(prompts)])
            out, states = plan.step(states, tokens, positions + k)
            together.append(out)
    together = torch.stack(together, dim=1)
    for row in range(len(prompts)):
        torch.testing.assert_close(together[row:row + 1], alone[row], atol=1e-6, rtol=1e-5)


@pytest.mark.parametrize("given_count", [True, False])  # True: a compiled step's, the fold a branch on the count
@pytest.mark.parametrize("fold_every", FOLDS)
def test_rows_at_one_position_given_as_a_tensor_step_as_with_an_int(fold_every, given_count, monkeypatch):
    """A (1,) counter for a batch of rows at one position (how a compiled step reads the cache's count), with the count
    as a host int beside it or not, gives the int path's outputs and states over two fold periods."""
    monkeypatch.setattr(decoding_compact, "reads_rows_on_host", lambda positions: False)
    mixer = _mixer()
    plan, _ = _plan(mixer, fold_every)
    prompt, steps = plan.capacity + 1, 2 * fold_every + 3
    v = torch.randn(3, prompt + steps, mixer.channels, generator=torch.Generator().manual_seed(4))
    with torch.no_grad():
        by_int = plan.prefill(mixer, v[:, :prompt])
        by_tensor = tuple(state.clone() for state in by_int)
        for position in range(prompt, prompt + steps):
            expected, by_int = plan.step(by_int, v[:, position], position)
            out, by_tensor = plan.step(by_tensor, v[:, position], torch.tensor([position]),
                                       position if given_count else None)
            torch.testing.assert_close(out, expected, atol=1e-6, rtol=1e-5)
    for state, reference in zip(by_tensor, by_int):
        torch.testing.assert_close(state, reference, atol=1e-6, rtol=1e-5)


@pytest.mark.parametrize("fold_every", FOLDS)
def test_a_chunk_across_folds_continues_the_state(fold_every):
    """Steps, then a chunk spanning folds, then steps: the compact kernel's outputs (the chunk reads its ring's
    inputs against the exact kernel, which the certified bound covers)."""
    mixer = _mixer()
    plan, tail = _plan(mixer, fold_every)
    prompt, chunk = plan.capacity + 2, 2 * fold_every + 5
    v = torch.randn(1, prompt + 3 + chunk + 4, mixer.channels, generator=torch.Generator().manual_seed(4))
    reference = _compact_kernel_output(mixer, tail, v)
    with torch.no_grad():
        states = plan.prefill(mixer, v[:, :prompt])
        outputs = []
        for position in range(prompt, prompt + 3):
            out, states = plan.step(states, v[:, position], position)
            outputs.append(out[:, None])
        out, states = plan.chunk(mixer, states, v[:, prompt + 3:prompt + 3 + chunk], prompt + 3)
        outputs.append(out)
        for position in range(prompt + 3 + chunk, v.shape[1]):
            out, states = plan.step(states, v[:, position], position)
            outputs.append(out[:, None])
    got = torch.cat(outputs, dim=1).double()
    assert ((got - reference[:, prompt:]).abs().max() / reference.abs().max()) < 1e-5


@pytest.mark.parametrize("fold_every", [0, -1, 2.0])
def test_a_fold_period_that_is_not_a_positive_int_is_refused(fold_every):
    with pytest.raises(ValueError, match="fold_every"):
        CompactState(fold_every=fold_every)


@pytest.mark.parametrize("host", [True, False])  # False: the frontiers as tensors (an accelerator, a compiled graph)
def test_a_chunk_at_rows_own_positions_equals_each_row_alone(host, monkeypatch):
    monkeypatch.setattr(decoding_compact, "reads_rows_on_host", lambda positions: host)
    mixer = _mixer()
    plan, _ = _plan(mixer, 16)
    prompts, chunk = [3, plan.capacity, plan.capacity + 5, plan.capacity + 21], 19
    v = torch.randn(len(prompts), max(prompts) + chunk + 2, mixer.channels, generator=torch.Generator().manual_seed(5))
    with torch.no_grad():
        alone = []
        for row, prompt in enumerate(prompts):
            states = plan.prefill(mixer, v[row:row + 1, :prompt])
            out, states = plan.chunk(mixer, states, v[row:row + 1, prompt:prompt + chunk], prompt)
            step, _ = plan.step(states, v[row:row + 1, prompt + chunk], prompt + chunk)
            alone.append(torch.cat([out, step[:, None]], dim=1))
        states = tuple(torch.cat(parts) for parts in zip(*[plan.prefill(mixer, v[row:row + 1, :prompt])
                                                          for row, prompt in enumerate(prompts)]))
        positions = torch.tensor(prompts)
        pieces = torch.stack([v[row, prompt:prompt + chunk] for row, prompt in enumerate(prompts)])
        out, states = plan.chunk(mixer, states, pieces, positions)
        tokens = torch.stack([v[row, prompt + chunk] for row, prompt in enumerate(prompts)])
        step, _ = plan.step(states, tokens, positions + chunk)
    together = torch.cat([out, step[:, None]], dim=1)
    for row in range(len(prompts)):
        torch.testing.assert_close(together[row:row + 1], alone[row], atol=1e-6, rtol=1e-5)


def test_a_fold_of_grouped_channels_gives_the_modes_and_readout_rows_in_channel_order():
    """Channels in two shared pole groups and channels with poles of their own, in a shuffled order (the group order
    is not the channel order): a fold of K inputs and its readout rows, written into the window's readout view,
    equal the float64 brute force ``g' = z**K g + sum_k c z**(K-1-k) u_k``, ``Re(sum_j z_j**e g'_j)``."""
    from modeling_tnn.decoding_fold import fold_in, fold_tables, to_channel_order, to_group_order, write_readout
    from modeling_tnn.fit_store import pole_groups

    generator = torch.Generator().manual_seed(0)
    shared = torch.polar(0.5 + 0.45 * torch.rand(6, generator=generator), 3 * torch.rand(6, generator=generator))
    own = torch.polar(0.5 + 0.45 * torch.rand(5, 6, generator=generator), 3 * torch.rand(5, 6, generator=generator))
    poles = torch.cat([shared.expand(9, -1), own, (shared.flip(0) * 0.9).expand(10, -1), shared.expand(3, -1)])[
        torch.randperm(27, generator=generator)].to(torch.complex64)
    residues = torch.randn(27, 6, dtype=torch.complex64, generator=generator)
    groups = pole_groups(poles)
    fold_every, b = 5, 2
    tables = fold_tables(poles, residues, groups, fold_every)
    assert not tables.identity and [run.shared for run in tables.runs] == [True, True, False]
    g = torch.randn(b, 27, 6, dtype=torch.complex64, generator=generator)
    inputs = torch.randn(b, fold_every, 27, generator=generator)

    modes = to_group_order(g, tables)
    fold_in(modes, inputs, tables)
    window = torch.zeros(b, 3 + fold_every, 27)
    write_readout(window[:, 3:], modes, tables)

    z, c = poles.to(torch.complex128), residues.to(torch.complex128)
    ages = torch.arange(fold_every - 1, -1, -1, dtype=torch.float64)
    sums = torch.einsum("kcr,bkc->bcr", z[None] ** ages[:, None, None], inputs.to(torch.complex128))
    expected = z ** fold_every * g.to(torch.complex128) + c * sums
    rows = torch.einsum("ecr,bcr->bec", z[None] ** torch.arange(fold_every, dtype=torch.float64)[:, None, None],
                        expected).real
    torch.testing.assert_close(to_channel_order(modes, tables).to(torch.complex128), expected, atol=1e-5, rtol=1e-5)
    torch.testing.assert_close(window[:, 3:].double(), rows, atol=1e-5, rtol=1e-5)
    assert not window[:, :3].any()  # the ring's rows untouched


def test_a_host_count_with_rows_at_their_own_positions_is_refused():
    mixer = _mixer()
    plan, _ = _plan(mixer, 16)
    with torch.no_grad():
        states = plan.prefill(mixer, torch.randn(2, plan.capacity + 1, mixer.channels))
        with pytest.raises(ValueError, match="host_count"):
            plan.step(states, torch.randn(2, mixer.channels), torch.tensor([4, 5]), 4)
