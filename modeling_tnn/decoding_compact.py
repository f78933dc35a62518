"""The compact decoding state of a decaying kernel: a short exact window and its tail as a few complex modes.

The kernel is exact for the first W lags and, beyond, the tail of r complex modes per channel, ``Re(sum_j c_j
z_j**(l-W))``, with a certified bound of its relative l1 error (:mod:`~modeling_tnn.fit_modal`). The older inputs are
the modes ``g = sum_i c z**(F-1-i) v_i`` over the inputs before a frontier F; the later ones are rows of one tensor
(b, W + 2K, c): the W inputs before the last fold (oldest first; row 0, whose input the modes hold, zero), the K rows
of the inputs since (zeros ahead of the newest), then K table rows: what everything before each of the next K
outputs contributes to it. Every K positions (a fold) the K oldest inputs enter the modes, the rows move up by K, and
the table is renewed: what the modes (their readout rows, the fold's maths: :mod:`~modeling_tnn.decoding_fold`) and
the W inputs before the fold (one depthwise convolution with the taps) add to each of the next K outputs. Between
folds a step writes its input to its row and adds it, times the taps, to the table rows from its own on, in one
operator; its output is its table row. Neither the modes nor the W older inputs are touched. Folds fall at positions
that are multiples of K past W (:func:`frontier`), so every row of a batch knows from its position alone where it
stands. The modes are (b, c, r, 2) real (interleaved real and imaginary parts, channels in group order). The functions
here take and return those two tensors (:func:`compact_prefill`, :func:`compact_step`, :func:`compact_chunk`);
:class:`CompactState` is the layer's plan that calls them with its constants.
"""

from __future__ import annotations

import dataclasses
from typing import TYPE_CHECKING

import torch
import torch.nn.functional as F

from .decoding_fold import (FoldTables, fold_in, fold_tables, readout_rows, to_channel_order, to_group_order,
                           write_readout)
from .decoding_modal_sums import modal_contribution, modal_state
from .decoding_poles import pole_powers
from .decoding_state import DecodingState, Positions, States
from .decoding_window import in_place, slot_write
from .runtime import compute_dtype

from .fit_store import PoleGroups

if TYPE_CHECKING:
    from .fit_store import ModalTail
    from .mixer_base import TokenMixer

# Positions between two folds into the modes: a step between folds writes K table rows at most and touches no mode
# (measured at the 48.7M preset, batch 1: see docs/benchmarks.md, bench_decode_floor).
FOLD_EVERY = 16


def as_complex(planes: torch.Tensor) -> torch.Tensor:
    """Real planes (2, ...) (real part, imaginary part) as one complex tensor."""
    return torch.complex(planes[0], planes[1])


def frontier(seen: int | torch.Tensor, capacity: int, fold_every: int) -> int | torch.Tensor:
    """How many of the first ``seen`` inputs the modes hold (a count, or a tensor of counts): the largest multiple of
    ``fold_every`` that leaves at least ``capacity`` inputs out (0 before that). Folds happen at the same positions
    whatever the prompt's length, so a step knows from its position alone whether it folds and which table row it
    reads."""
    front = fold_every * ((seen - capacity) // fold_every)
    return front.clamp_min(0) if isinstance(front, torch.Tensor) else max(0, front)


def compact_taps(mixer: TokenMixer, capacity: int, fold_every: int, poles: torch.Tensor, residues: torch.Tensor,
                 device: torch.device, dtype: torch.dtype, groups: PoleGroups | None = None) -> torch.Tensor:
    """The window's reversed taps twice (2 (W + K), c), as :func:`~.decoding_window.reversed_taps`: the exact taps
    of lags ``0 .. W-1``, then the modal tail's of lags ``W .. W+K-1`` (``Re(sum_j c_j z_j**(l-W))``), the kernel
    the inputs not yet folded are read against (by the steps and the fold's table): the same kernel as the modes'."""
    exact = mixer.causal_taps(capacity, device).detach().to(torch.float32)
    tables = fold_tables(poles.to(device), residues.to(device), groups, fold_every)
    tail = readout_rows(to_group_order(residues[None].to(device), tables), tables)[0]
    taps = torch.cat([exact, tail]).flip(0).to(dtype)
    return torch.cat([taps, taps]).contiguous()


def compact_prefill(v: torch.Tensor, positions: int, plan: CompactState,
                    prior: tuple[torch.Tensor, int] | None = None) -> States:
    """The state (window (b, W + 2K, c), modes (b, c, r, 2)) after inputs ``v`` (b, n, c) that follow ``positions``
    tokens: the inputs from the :func:`frontier` on in the window's first W + K rows (:func:`held_rows`), the ones
    before in the modes, and the table rows (the last K, :func:`table_rows`). ``prior``: the modes before ``v``
    (complex (b, c, r), channel order) and their frontier; ``v`` then holds zeros before that frontier (a window's
    :func:`latest_inputs`)."""
    capacity, fold_every, tables = plan.capacity, plan.fold_every, plan.fold_tables()
    poles, residues = as_complex(plan.poles), as_complex(plan.residues)
    seen = positions + v.shape[1]
    front = frontier(seen, capacity, fold_every)
    kept = max(0, front - positions)
    modes = modal_state(v[:, :kept], poles, residues, plan._groups)
    if prior is not None:
        modes += prior[0] * pole_powers(poles, front - prior[1], prior[0].dtype)
    modes = to_group_order(modes, tables)
    length = capacity + fold_every
    recent = v[:, max(kept, v.shape[1] - length):].to(compute_dtype(v.dtype))
    rows = held_rows(F.pad(recent, (0, 0, length - recent.shape[1], 0)), seen, plan)
    return torch.cat([rows, table_rows(rows, modes, plan)], dim=1), modes


def layout_shift(seen: int | torch.Tensor, plan: CompactState) -> int | torch.Tensor:
    """How far the window's rows after ``seen`` inputs are rotated from the latest W + K inputs oldest first (a count,
    or a tensor of counts): its first row is the position before the unclamped :func:`frontier`."""
    capacity, fold_every = plan.capacity, plan.fold_every
    if isinstance(seen, torch.Tensor):
        return fold_every - 1 - torch.remainder(seen - capacity, fold_every)
    return fold_every - 1 - (seen - capacity) % fold_every


def rolled(rows: torch.Tensor, shift: int | torch.Tensor) -> torch.Tensor:
    """``torch.roll(rows, shift, 1)``: row ``j`` from row ``j - shift`` (mod the row count), ``shift`` an int or one
    per batch row (a tensor)."""
    if not isinstance(shift, torch.Tensor):
        return torch.roll(rows, shift, 1)
    b, length, c = rows.shape
    index = torch.remainder(torch.arange(length, device=rows.device) - shift.expand(b)[:, None], length)
    return rows.gather(1, index[..., None].expand(b, length, c))


def held_rows(latest: torch.Tensor, seen: Positions, plan: CompactState) -> torch.Tensor:
    """The window's first W + K rows (b, W + K, c) from the latest W + K inputs after ``seen`` tokens, oldest first,
    those the modes hold zero: each input at its row (:func:`layout_shift`), the rows of positions not seen yet
    zero."""
    return rolled(latest, -layout_shift(seen, plan))


def latest_inputs(window: torch.Tensor, seen: Positions, plan: CompactState) -> torch.Tensor:
    """The inverse of :func:`held_rows`: the latest W + K inputs (b, W + K, c) oldest first, those the modes hold
    zero, from the window."""
    return rolled(window[:, :plan.capacity + plan.fold_every], layout_shift(seen, plan))


def table_rows(rows: torch.Tensor, modes: torch.Tensor, plan: CompactState) -> torch.Tensor:
    """The K table rows (b, K, c) of a window whose first W + K rows are ``rows``: what the modes
    (:func:`~.decoding_fold.readout_rows`) and those rows contribute to each of the K outputs from the last fold's
    position on. Rows ahead of an output meet the kernel's wrapped taps in the convolution, so an output already
    produced holds no meaning; every later one is exact, which is all a step reads."""
    return readout_rows(modes, plan.fold_tables()).to(rows.dtype) + lag_contribution(rows, plan)


def lag_contribution(rows: torch.Tensor, plan: CompactState) -> torch.Tensor:
    """What the window's first n rows ``rows`` (b, n, c; row ``i`` at lag ``W - i + e`` from the e-th position since
    the last fold) contribute to the K outputs from that fold's position on: one depthwise convolution (each channel
    its own taps), read in the rows' own layout (channels last: no transposed copy)."""
    c, fold_every = rows.shape[2], plan.fold_every
    weight = plan.lag_weight(rows.shape[1])
    out = F.conv2d(rows.transpose(1, 2).unsqueeze(2), weight, padding=(0, fold_every - 1), groups=c)
    return out[:, :, 0].transpose(1, 2)


def reads_rows_on_host(positions: torch.Tensor) -> bool:
    """Whether a step may read which rows fold: positions on the CPU outside a compiled graph, where reading a value
    syncs nothing. On an accelerator a step never reads one (every row's fold is computed and kept where it folds)."""
    return positions.device.type == "cpu" and not torch.compiler.is_compiling()


def fold_oldest(window: torch.Tensor, modes: torch.Tensor, plan: CompactState) -> None:
    """In place, every row, at a fold: the window's inputs of the K oldest positions not yet folded (its rows 1 .. K)
    enter the modes, the later ones move to the front (row 0 stays zero: its input is in the modes), the rows of new
    inputs are zeroed and the table rows renewed."""
    capacity, fold_every, tables = plan.capacity, plan.fold_every, plan.fold_tables()
    length = capacity + fold_every
    fold_in(modes, window[:, 1:fold_every + 1], tables)
    window[:, 1:capacity] = window[:, fold_every + 1:length].clone()
    window[:, capacity:length].zero_()
    table = window[:, length:]
    write_readout(table, modes, tables)
    table += lag_contribution(window[:, :capacity], plan)  # the new rows are zero: W rows are all that count


def step_phase(seen: Positions, plan: CompactState) -> Positions:
    """The phase of the step after ``seen`` inputs (a count, or a tensor of counts): the e-th position since the last
    fold, 0 where the step folds first."""
    return (seen + 1 - plan.capacity) % plan.fold_every


def compact_step(window: torch.Tensor, modes: torch.Tensor, v_t: torch.Tensor, positions: Positions,
                 plan: CompactState, host_count: int | None = None) -> torch.Tensor:
    """In place: ``v_t`` (b, c), or a token row (b, 1, c) (the output keeps its shape), takes the row of its phase
    among the K rows of new inputs and adds its contribution, through the taps, to the table rows from its phase on;
    the output is the table row of its phase. Every ``K`` positions a fold first moves the K oldest inputs into the
    modes (:func:`frontier`) and tables what the modes and the W inputs before it contribute to the next K outputs.
    Between folds a step touches neither the modes nor the W older inputs. Rows at their own positions (a tensor)
    fold where their position says: on the CPU only the rows that fold compute it; elsewhere every row's fold is
    computed and kept where the row folds (:func:`reads_rows_on_host`), unless the caller passes ``host_count``,
    the count every row shares as a Python int (a compiled step's), on which the fold is a branch: a graph that
    folds and one that does not, instead of every layer's fold at every token."""
    capacity, fold_every = plan.capacity, plan.fold_every
    length = capacity + fold_every
    keepdim = v_t.dim() == 3
    if not isinstance(positions, torch.Tensor):  # a count (an int, or a size under export)
        phase = step_phase(positions, plan)
        if phase == 0:
            fold_oldest(window, modes, plan)
        # The phase's row of new inputs (still zero) and the table rows from the phase on lie K rows apart: one view
        # (2, b, K - phase, c) of both, which one addcmul_ writes (the row takes the input, the table rows its
        # contribution; the rows of new inputs ahead are multiplied by zero).
        stride = window.stride()
        span = window.as_strided((2, window.shape[0], fold_every - phase, window.shape[2]),
                                 (fold_every * stride[1], *stride),
                                 window.storage_offset() + (capacity + phase) * stride[1])
        span.addcmul_(v_t if keepdim else v_t[:, None], plan.step_taps(phase))
        table = window[:, length + phase:length + phase + 1] if keepdim else window[:, length + phase]
        return table.clone()  # the table row is rewritten at the next fold
    b, _, c = window.shape
    if host_count is not None and positions.numel() != 1:  # a shape, not a value: no host read
        raise ValueError(f"host_count is the one count every row shares; positions holds {positions.numel()} "
                         "counts (rows at their own positions fold where each says: pass host_count=None).")
    phases = step_phase(positions, plan)  # (1,) where every row is at one position
    phase = phases.expand(b)
    if host_count is not None:  # every row at one count the host holds: fold when due (dynamo guards the branch)
        if step_phase(host_count, plan) == 0:
            fold_oldest(window, modes, plan)
    elif reads_rows_on_host(positions):  # fold the rows that fold alone (most steps none)
        rows = (phase == 0).nonzero()[:, 0]
        if rows.numel():
            part, part_modes = window.index_select(0, rows), modes.index_select(0, rows)
            fold_oldest(part, part_modes, plan)
            window.index_copy_(0, rows, part)
            modes.index_copy_(0, rows, part_modes)
    else:  # no host read on an accelerator: every row's fold computed, kept where the row folds
        folds = phase == 0
        folded, folded_modes = window.clone(), modes.clone()
        fold_oldest(folded, folded_modes, plan)
        window.copy_(torch.where(folds[:, None, None], folded, window))
        modes.copy_(torch.where(folds[:, None, None, None], folded_modes, modes))
    slot_write(window, capacity + phase, v_t)
    window[:, length:].addcmul_(v_t.view(b, 1, c), plan.step_taps(phases))  # one row of taps for rows at one phase
    table = window.gather(1, (length + phase)[:, None, None].expand(b, 1, c))
    return table if keepdim else table[:, 0]


def compact_chunk(mixer: TokenMixer, window: torch.Tensor, modes: torch.Tensor, v: torch.Tensor,
                  positions: Positions, plan: CompactState) -> torch.Tensor:
    """Several tokens ``v`` (b, n, c) on a filled state, in place: the window's inputs and the chunk through the mixer's
    exact kernel in parallel, plus what the modes contribute; then the state after the chunk. Rows at their own
    positions (a tensor) continue one at a time."""
    if isinstance(positions, torch.Tensor):
        if not reads_rows_on_host(positions):
            return chunk_on_device(mixer, window, modes, v, positions, plan)
        rows = positions.expand(v.shape[0]).tolist()
        return torch.cat([compact_chunk(mixer, window[r:r + 1], modes[r:r + 1], v[r:r + 1], rows[r], plan)
                          for r in range(v.shape[0])])
    capacity, fold_every = plan.capacity, plan.fold_every
    length = capacity + fold_every
    poles = as_complex(plan.poles)
    prior = to_channel_order(modes, plan.fold_tables())
    before = frontier(positions, capacity, fold_every)
    sequence = torch.cat([latest_inputs(window, positions, plan).to(v.dtype), v], dim=1)
    n = v.shape[1]
    # The modes hold the inputs before the frontier: their powers count from lag W of the last of them.
    ahead = max(0, positions - capacity - before)
    contribution = modal_contribution(prior * pole_powers(poles, ahead, prior.dtype), poles, n, plan._groups)
    out = mixer(sequence, None)[:, -n:] + contribution.to(v.dtype)
    in_place((window, modes), compact_prefill(sequence, positions - length, plan, (prior, before)))
    return out


def chunk_on_device(mixer: TokenMixer, window: torch.Tensor, modes: torch.Tensor, v: torch.Tensor,
                    positions: torch.Tensor, plan: CompactState) -> torch.Tensor:
    """:func:`compact_chunk` for rows at ``positions`` (b,) or (1,) that no step may read (an accelerator, a
    compiled or exported graph): each row's frontiers as tensors, and the inputs it folds picked by masks."""
    capacity, fold_every, tables = plan.capacity, plan.fold_every, plan.fold_tables()
    length = capacity + fold_every
    b, n, c = v.shape
    poles, residues = as_complex(plan.poles), as_complex(plan.residues)
    positions = positions.expand(b)
    before, after = frontier(positions, capacity, fold_every), frontier(positions + n, capacity, fold_every)
    prior = to_channel_order(modes, tables)
    sequence = torch.cat([latest_inputs(window, positions, plan).to(v.dtype), v], dim=1)  # (b, T, c)
    ahead = (positions - capacity - before).clamp_min(0)
    contribution = modal_contribution(prior * pole_powers(poles, ahead, prior.dtype), poles, n, plan._groups)
    out = mixer(sequence, None)[:, -n:] + contribution.to(v.dtype)
    steps = sequence.shape[1]
    first = positions - length                                      # the position of each row's first entry
    offsets = torch.arange(steps, device=v.device)
    # The inputs before the new frontier, shifted so that the last of them is the last entry (their powers count
    # from there); earlier entries of the window are zeros already (folded before).
    index = offsets - (first + steps - after)[:, None]
    shifted = sequence.gather(1, index.clamp_min(0)[..., None].expand(b, steps, c)) * (index >= 0)[..., None]
    folded = (modal_state(shifted, poles, residues, plan._groups)
              + prior * pole_powers(poles, after - before, prior.dtype))
    kept = (first[:, None] + offsets[steps - length:] >= after[:, None])[..., None]   # from the new frontier on
    rows = held_rows((sequence[:, steps - length:] * kept).to(window.dtype), positions + n, plan)
    folded = to_group_order(folded, tables)
    in_place((window, modes), (torch.cat([rows, table_rows(rows, folded, plan)], dim=1), folded))
    return out


@dataclasses.dataclass(eq=False)
class CompactState(DecodingState):
    """The W + K latest inputs not in the modes and K table rows (b, W + 2K, c, the module's layout) and ``modes``
    complex modes per channel, interleaved real and imaginary parts in group order (b, c, r, 2), the two state
    tensors; its kernel is within
    ``error_bound`` (relative l1, the largest channel's) of the exact one. Build it from a fitted tail with
    :meth:`from_tail`."""

    PLAN = "compact"
    CONSTANTS = ("poles", "residues", "taps_twice", "channel_order", "channel_rank")
    STEPS_TOKEN_ROWS = True

    capacity: int = 0
    modes: int = 0
    error_bound: float = 0.0
    fold_every: int = 1                         # K: positions between two folds of the oldest inputs
    shared_groups: tuple[int, ...] = ()         # PoleGroups.sizes: channels sharing a pole set, group by group
    poles: torch.Tensor | None = None           # (2, c, r) float32: real and imaginary planes of the poles
    residues: torch.Tensor | None = None        # (2, c, r) float32: the same of their residues
    taps_twice: torch.Tensor | None = None      # (2 (W + K), c): compact_taps
    channel_order: torch.Tensor | None = None   # (c,) PoleGroups.order
    channel_rank: torch.Tensor | None = None    # (c,) PoleGroups.rank

    def __post_init__(self):
        if not isinstance(self.fold_every, int) or self.fold_every < 1:
            raise ValueError(f"fold_every must be a positive int, got {self.fold_every!r}.")
        self._groups = (None if self.channel_order is None
                        else PoleGroups(self.channel_order, self.channel_rank, tuple(self.shared_groups)))
        self._fold = None
        self._step_taps = None
        self._lag_weights = (None, {})

    def step_taps(self, phase: int | torch.Tensor) -> torch.Tensor:
        """What a step at ``phase`` (the e-th position since a fold) multiplies its input by. An int: (2, 1, K - e, c),
        for its row of new inputs and the rows after it (1, then zeros) and for the table rows from e on (the taps of
        lags 0 .. K-1-e); one of K views made once (a step at batch 1 is bound by its operator calls). A tensor of
        n phases (one per batch row, or one for every row): (n, K, c) for the table rows, the taps of lag ``m - e``
        for row ``m`` (zero before e), gathered per phase."""
        fold_every, length = self.fold_every, self.capacity + self.fold_every
        if self._step_taps is None or self._step_taps[0] is not self.taps_twice:
            taps = self.taps_twice[length - fold_every:length].flip(0)                     # lags 0 .. K-1
            planes = taps.new_zeros(2, 1, 2 * fold_every - 1, taps.shape[1])
            planes[0, 0, fold_every - 1] = 1
            planes[1, 0, fold_every - 1:] = taps
            views = [planes[:, :, fold_every - 1:2 * fold_every - 1 - e] for e in range(fold_every)]
            self._step_taps = (self.taps_twice, views, planes[1, 0])
        _, views, lags = self._step_taps
        if type(phase) is not int:
            index = (fold_every - 1 - phase)[:, None] + torch.arange(fold_every, device=phase.device)
            return lags.index_select(0, index.flatten()).view(*index.shape, lags.shape[1])
        return views[phase]

    def lag_weight(self, rows: int) -> torch.Tensor:
        """:func:`lag_contribution`'s depthwise kernel (c, 1, 1, n + K - 1) for the window's first n ``rows``: each
        channel's taps of lags W + K - 1 .. 1 for n = W (a fold), down to lag 1 - K for n = W + K; made once."""
        def kernel(n: int) -> torch.Tensor:
            return self.taps_twice[:n + self.fold_every - 1].t().contiguous()[:, None, None]
        if self._lag_weights[0] is not self.taps_twice:
            # A fold's kernel and a prefill's, made together by the (eager) prefill: a memo first filled inside a
            # compiled fold cost one more graph.
            self._lag_weights = (self.taps_twice, {n: kernel(n) for n in (self.capacity,
                                                                         self.capacity + self.fold_every)})
        weights = self._lag_weights[1]
        if rows not in weights:
            weights[rows] = kernel(rows)
        return weights[rows]

    def fold_tables(self) -> FoldTables:
        """The powers a fold reads (:func:`~.decoding_fold.fold_tables`), built once."""
        if self._fold is None:
            self._fold = fold_tables(as_complex(self.poles), as_complex(self.residues), self._groups,
                                     self.fold_every)
        return self._fold

    @classmethod
    def from_tail(cls, tail: ModalTail, mixer: TokenMixer, device: torch.device, dtype: torch.dtype,
                  fold_every: int | None = None) -> CompactState:
        """The state of a fitted (or loaded) ``tail``: poles and residues as real planes on ``device``, the
        window's taps (:func:`compact_taps`) in ``dtype``; folding every ``fold_every`` positions (default
        :data:`FOLD_EVERY`)."""
        fold_every = FOLD_EVERY if fold_every is None else fold_every
        def planes(values: torch.Tensor) -> torch.Tensor:
            return torch.stack([values.real, values.imag]).to(device).contiguous()
        groups = tail.pole_groups()
        order, rank = groups.order.to(device), groups.rank.to(device)
        taps = compact_taps(mixer, tail.window, fold_every, tail.poles, tail.residues, device, dtype,
                            PoleGroups(order, rank, groups.sizes))
        return cls(capacity=tail.window, modes=tail.modes, error_bound=tail.max_bound, fold_every=fold_every,
                   shared_groups=groups.sizes, poles=planes(tail.poles), residues=planes(tail.residues),
                   taps_twice=taps, channel_order=order, channel_rank=rank)

    def describe(self) -> dict:
        return {**super().describe(), "window": self.capacity, "modes": self.modes, "error_bound": self.error_bound,
                "fold_every": self.fold_every}

    def state_shapes(self, channels: int) -> tuple[tuple[int, ...], ...]:
        return (self.capacity + 2 * self.fold_every, channels), (channels, self.modes, 2)

    def prefill(self, mixer: TokenMixer, v: torch.Tensor, positions: Positions = 0) -> States:
        if isinstance(positions, torch.Tensor):
            raise ValueError("a compact prefill starts every row at one position (an int); continue rows at their "
                             "own positions with chunk")
        return compact_prefill(v, positions, self)

    def step(self, states: States, v_t: torch.Tensor, positions: Positions,
             host_count: int | None = None) -> tuple[torch.Tensor, States]:
        window, modes = states
        return compact_step(window, modes, v_t, positions, self, host_count), states

    def chunk(self, mixer: TokenMixer, states: States, v: torch.Tensor,
              positions: Positions) -> tuple[torch.Tensor, States]:
        window, modes = states
        return compact_chunk(mixer, window, modes, v, positions, self), states
