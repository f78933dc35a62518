"""The compact decoding state of a decaying kernel: a short exact window and its tail as a few complex modes.

The kernel is exact for the first W lags and, beyond, the tail of r complex modes per channel, ``Re(sum_j c_j
z_j**(l-W))``, with a certified bound of its relative l1 error (:mod:`~modeling_tnn.fit_modal`). The state keeps the
latest inputs in a ring of W + K slots, read against those taps, and the older ones as the modes ``g = sum_i c
z**(F-1-i) v_i`` over the inputs before a frontier F. Every K positions (a fold) the K oldest inputs of the ring enter
the modes and the modes' contribution to the next K outputs is tabled (the readout rows; the fold's maths:
:mod:`~modeling_tnn.decoding_fold`): between folds a step writes one slot, reads the ring and adds a readout row, and
touches no mode. Folds fall at positions that are multiples of K past W (:func:`frontier`), so every row of a batch
knows from its position alone where it stands. The modes are (b, c, r, 2) real (interleaved real and imaginary parts,
channels in group order); the readout rows follow the ring in one tensor (b, W + 2K, c). The
functions here take and return those two tensors (:func:`compact_prefill`, :func:`compact_step`,
:func:`compact_chunk`); :class:`CompactState` is the layer's plan that calls them with its constants.
"""

from __future__ import annotations

import dataclasses
from typing import TYPE_CHECKING

import torch

from .decoding_fold import (FoldTables, fold_in, fold_tables, readout_rows, to_channel_order, to_group_order,
                           write_readout)
from .decoding_poles import pole_power_range, pole_powers
from .decoding_state import DecodingState, Positions, States
from .decoding_window import (in_place, ring_history, ring_order, ring_slot, row_slots, slot_taps, slot_write,
                              window_prefill, window_read)

from .fit_store import PoleGroups

if TYPE_CHECKING:
    from .fit_store import ModalTail
    from .mixer_base import TokenMixer

# Inputs per block of the parallel modal state: its (block, c, r) powers stay a few MB.
MODAL_BLOCK = 128
# Positions between two folds of the ring into the modes: a step between folds reads W + K ring rows and touches no
# mode (measured at the 48.7M preset, batch 1: see docs/benchmarks.md, bench_decode_floor).
FOLD_EVERY = 16

def as_complex(planes: torch.Tensor) -> torch.Tensor:
    """Real planes (2, ...) (real part, imaginary part) as one complex tensor."""
    return torch.complex(planes[0], planes[1])


def channel_modal_state(inputs: torch.Tensor, poles: torch.Tensor, residues: torch.Tensor) -> torch.Tensor:
    """``residues * sum_i z**(T-1-i) inputs_i`` (b, c, r) complex64 for ``inputs`` (b, T, c) and poles of each channel's
    own, in one parallel pass: per channel one matrix product of the blocks of ``MODAL_BLOCK`` inputs with the powers
    within a block (real and imaginary parts side by side), then the blocks weighted by ``z**(block * later
    blocks)``."""
    b, steps, c = inputs.shape
    modes = residues.shape[1]
    block = min(steps, MODAL_BLOCK)
    blocks = -(-steps // block)
    inputs = torch.nn.functional.pad(inputs.to(torch.float32), (0, 0, blocks * block - steps, 0))
    # Each block's inputs newest first, against z**i ascending (= oldest first against z**(B-1-i)): the flip moves the
    # inputs, not the complex powers; the powers come from a grid of B + M exps per pole (exp dominated the prefill).
    rows = inputs.reshape(b * blocks, block, c).flip(1).permute(2, 0, 1).contiguous()       # (c, b * blocks, block)
    local = pole_power_range(poles, 0, block)                                                # (B, c, r)
    with torch.autocast(device_type=rows.device.type, enabled=False):  # the state stays float32 under autocast
        within = torch.bmm(rows, torch.cat([local.real, local.imag], dim=-1).transpose(0, 1))  # (c, b * blocks, 2r)
    within = torch.complex(within[..., :modes], within[..., modes:]).reshape(c, b, blocks, modes)
    later = torch.arange(blocks - 1, -1, -1, device=poles.device) * block
    across = pole_powers(poles, later).permute(1, 0, 2)                                      # (c, blocks, r)
    return residues * (within * across[:, None]).sum(2).permute(1, 0, 2)


def shared_mode_sums(inputs: torch.Tensor, poles: torch.Tensor) -> torch.Tensor:
    """``sum_i z**(T-1-i) inputs_i`` (b, s, r) complex64 for channels that share the poles (r,), before their
    residues: one matrix product (b, s, T) @ (T, 2r) with the powers (real and imaginary parts side by side)."""
    modes = poles.shape[0]
    powers = pole_power_range(poles, 0, inputs.shape[1]).flip(0)                             # (T, r)
    with torch.autocast(device_type=inputs.device.type, enabled=False):
        sums = torch.matmul(inputs.to(torch.float32).transpose(1, 2), torch.cat([powers.real, powers.imag], dim=-1))
    return torch.complex(sums[..., :modes], sums[..., modes:])


def channel_contribution(state: torch.Tensor, poles: torch.Tensor, steps: int) -> torch.Tensor:
    """What the modes contribute to the next ``steps`` outputs, ``Re(sum_j z_j**(i+1) g_j)`` (b, steps, c), for poles
    of each channel's own."""
    powers = pole_power_range(poles, 1, steps)                                              # (steps, c, r)
    return torch.einsum("icr,bcr->bic", powers, state).real


def shared_contribution(state: torch.Tensor, poles: torch.Tensor, steps: int) -> torch.Tensor:
    """The same for channels that share the poles (r,): ``Re(P g) = Re P Re g - Im P Im g``, one matrix product."""
    powers = pole_power_range(poles, 1, steps)                                              # (steps, r)
    return torch.matmul(torch.cat([powers.real, -powers.imag], dim=-1),
                        torch.cat([state.real, state.imag], dim=-1).transpose(1, 2))


def _runs(groups: PoleGroups, channels: int) -> list[tuple[int, int, bool]]:
    """``(start, count, shared)`` of each run of ``groups.order``: every shared group, then the channels of their own."""
    runs, start = [], 0
    for size in groups.sizes:
        runs.append((start, size, True))
        start += size
    if start < channels:
        runs.append((start, channels - start, False))
    return runs


# A shared group of at least this fraction of a layer's channels runs its product over every channel and keeps its
# own rows: gathering a large part of the inputs' last dimension costs more than the product's few extra rows.
FULL_PRODUCT_SHARE = 0.25


def modal_state(inputs: torch.Tensor, poles: torch.Tensor, residues: torch.Tensor,
                groups: PoleGroups | None = None) -> torch.Tensor:
    """``residues * sum_i z**(T-1-i) inputs_i`` (b, c, r) complex64 for ``inputs`` (b, T, c): the modes of a prompt,
    each group of channels that shares its poles in one matrix product."""
    b, steps, c = inputs.shape
    if steps == 0:
        return residues.new_zeros(b, c, residues.shape[1])
    if groups is None or not groups.sizes:
        return channel_modal_state(inputs, poles, residues)
    state = residues.new_empty(b, c, residues.shape[1])
    for a, n, shared in _runs(groups, c):
        channels = groups.order[a:a + n]
        if shared:
            whole = n >= FULL_PRODUCT_SHARE * c
            block = shared_mode_sums(inputs if whole else inputs.index_select(2, channels),
                                     poles.index_select(0, channels[:1])[0])
            rows = block.index_select(1, channels) if whole else block
            state.index_copy_(1, channels, residues.index_select(0, channels) * rows)
        else:
            state.index_copy_(1, channels, channel_modal_state(inputs.index_select(2, channels),
                                                               poles.index_select(0, channels),
                                                               residues.index_select(0, channels)))
    return state


def modal_contribution(state: torch.Tensor, poles: torch.Tensor, steps: int,
                       groups: PoleGroups | None = None) -> torch.Tensor:
    """What the modes (b, c, r) contribute to the next ``steps`` outputs, ``Re(sum_j z_j**(i+1) g_j)`` (b, steps,
    c), each group of channels that shares its poles in one matrix product (over every channel, the other channels'
    modes zero: no scatter along the outputs' last dimension)."""
    if groups is None or not groups.sizes:
        return channel_contribution(state, poles, steps)
    b, c, _ = state.shape
    out = state.real.new_zeros(b, steps, c)
    for a, n, shared in _runs(groups, c):
        channels = groups.order[a:a + n]
        if shared:
            only = torch.zeros_like(state).index_copy_(1, channels, state.index_select(1, channels))
            out += shared_contribution(only, poles.index_select(0, channels[:1])[0], steps)
        else:
            out.index_add_(2, channels, channel_contribution(state.index_select(1, channels),
                                                             poles.index_select(0, channels), steps))
    return out


def frontier(seen: int | torch.Tensor, capacity: int, fold_every: int) -> int | torch.Tensor:
    """How many of the first ``seen`` inputs the modes hold (a count, or a tensor of counts): the largest multiple of
    ``fold_every`` that leaves at least ``capacity`` inputs out (0 before that). Folds happen at the same positions
    whatever the prompt's length, so a step knows from its position alone whether it folds and which readout row it
    reads."""
    front = fold_every * ((seen - capacity) // fold_every)
    return front.clamp_min(0) if isinstance(front, torch.Tensor) else max(0, front)


def compact_taps(mixer: TokenMixer, capacity: int, fold_every: int, poles: torch.Tensor, residues: torch.Tensor,
                 device: torch.device, dtype: torch.dtype, groups: PoleGroups | None = None) -> torch.Tensor:
    """The ring's reversed taps twice (2 (W + K), c), as :func:`~.decoding_window.reversed_taps`: the exact taps of
    lags ``0 .. W-1``, then the modal tail's of lags ``W .. W+K-1`` (``Re(sum_j c_j z_j**(l-W))``), the kernel the
    steps between two folds read the inputs not yet folded against: the same kernel as the modes'."""
    exact = mixer.causal_taps(capacity, device).detach().to(torch.float32)
    tables = fold_tables(poles.to(device), residues.to(device), groups, fold_every)
    tail = readout_rows(to_group_order(residues[None].to(device), tables), tables)[0]
    taps = torch.cat([exact, tail]).flip(0).to(dtype)
    return torch.cat([taps, taps]).contiguous()


def compact_prefill(v: torch.Tensor, positions: int, plan: CompactState,
                    prior: tuple[torch.Tensor, int] | None = None) -> States:
    """The state (window (b, W + 2K, c), modes (b, c, r, 2)) after inputs ``v`` (b, n, c) that follow ``positions``
    tokens: the inputs from the :func:`frontier` on in the ring (the window's first W + K rows), the ones before in
    the modes, and the modes' readout rows (the last K). ``prior``: the modes before ``v`` (complex (b, c, r), channel
    order) and their frontier; ``v`` then holds zeros before that frontier (a ring's history)."""
    capacity, fold_every, tables = plan.capacity, plan.fold_every, plan.fold_tables()
    poles, residues = as_complex(plan.poles), as_complex(plan.residues)
    seen = positions + v.shape[1]
    front = frontier(seen, capacity, fold_every)
    kept = max(0, front - positions)
    modes = modal_state(v[:, :kept], poles, residues, plan._groups)
    if prior is not None:
        modes += prior[0] * pole_powers(poles, front - prior[1], prior[0].dtype)
    modes = to_group_order(modes, tables)
    ring = window_prefill(v[:, kept:], positions + kept, capacity + fold_every)
    return torch.cat([ring, readout_rows(modes, tables).to(ring.dtype)], dim=1), modes


def reads_rows_on_host(positions: torch.Tensor) -> bool:
    """Whether a step may read which rows fold: positions on the CPU outside a compiled graph, where reading a value
    syncs nothing. On an accelerator a step never reads one (every row's fold is computed and kept where it folds)."""
    return positions.device.type == "cpu" and not torch.compiler.is_compiling()


def fold_rows(ring: torch.Tensor, readout: torch.Tensor, modes: torch.Tensor, index: torch.Tensor,
              rows: torch.Tensor, tables: FoldTables) -> None:
    """In place, for the batch ``rows`` (k,) alone: the ring's slots ``index`` (b, K, c) enter the modes, the readout
    rows are renewed and those slots zeroed."""
    index = index.index_select(0, rows)
    held = ring.index_select(0, rows)
    part = modes.index_select(0, rows)
    fold_in(part, held.gather(1, index), tables)
    modes.index_copy_(0, rows, part)
    readout.index_copy_(0, rows, readout_rows(part, tables).to(readout.dtype))
    ring.index_copy_(0, rows, held.scatter_(1, index, 0.0))


def fold_oldest(window: torch.Tensor, modes: torch.Tensor, end: int, plan: CompactState) -> None:
    """In place, every row: the ring's inputs of positions ``end - K .. end - 1`` enter the modes, their slots are
    zeroed and the readout rows renewed."""
    capacity, fold_every, tables = plan.capacity, plan.fold_every, plan.fold_tables()
    length = capacity + fold_every
    start = (end - fold_every) % length
    if start + fold_every <= length:  # one block of slots (always where K divides W, as for the fit's windows)
        leaving = window[:, start:start + fold_every]
        fold_in(modes, leaving, tables)
        leaving.zero_()
    else:
        slots = ring_order(end, fold_every, length, window.device)
        fold_in(modes, window[:, slots], tables)
        window[:, slots] = 0
    write_readout(window[:, length:], modes, tables)


def leaving_slots(positions: torch.Tensor, b: int, c: int, plan: CompactState) -> torch.Tensor:
    """(b, K, c) ring slots of the K inputs each row's fold at ``positions`` (b,) or (1,) moves into the modes."""
    fold_every, length = plan.fold_every, plan.capacity + plan.fold_every
    index = row_slots(positions + 1 - plan.capacity - fold_every, fold_every, length).expand(b, fold_every)
    return index[..., None].expand(b, fold_every, c)


def compact_step(window: torch.Tensor, modes: torch.Tensor, v_t: torch.Tensor, positions: Positions,
                 plan: CompactState) -> torch.Tensor:
    """In place: ``v_t`` (b, c), or a token row (b, 1, c) (the output keeps its shape), takes its ring slot; every
    ``K`` positions the K oldest inputs of the ring enter the modes (:func:`frontier`) and the readout rows are
    renewed; the output is the ring read against the taps plus the readout row of the position. Between folds a step
    is a few operators on (W + K, c) rows: the modes are not touched. Rows at their own positions (a tensor) fold
    where their position says: on the CPU only the rows that fold compute it; elsewhere every row's fold is computed
    and kept where the row folds (:func:`reads_rows_on_host`)."""
    capacity, fold_every = plan.capacity, plan.fold_every
    length = capacity + fold_every
    keepdim = v_t.dim() == 3
    slot = ring_slot(positions, length)
    slot_write(window, slot, v_t)  # a ring slot: the window's first rows are the ring
    if not isinstance(positions, torch.Tensor):  # a count (an int, or a size under export)
        phase = (positions + 1 - capacity) % fold_every
        if phase == 0:
            fold_oldest(window, modes, positions + 1 - capacity, plan)
        row = length + phase
        readout = window[:, row:row + 1] if keepdim else window[:, row]
        filled = min(positions + 1, length)
        return window_read(window[:, :length], plan.slot_taps(slot), filled, keepdim) + readout
    ring, readout = window[:, :length], window[:, length:]
    b, _, c = ring.shape
    phase = torch.remainder(positions + 1 - capacity, fold_every).expand(b)
    folds = phase == 0
    tables = plan.fold_tables()
    if reads_rows_on_host(positions):  # fold the rows that fold alone (most steps none)
        rows = folds.nonzero()[:, 0]
        if rows.numel():
            fold_rows(ring, readout, modes, leaving_slots(positions, b, c, plan), rows, tables)
    else:  # no host read on an accelerator: every row's fold computed, kept where the row folds
        index = leaving_slots(positions, b, c, plan)
        leaving = ring.gather(1, index)
        folded = modes.clone()
        fold_in(folded, leaving, tables)
        modes.copy_(torch.where(folds[:, None, None, None], folded, modes))
        readout.copy_(torch.where(folds[:, None, None], readout_rows(folded, tables), readout))
        ring.scatter_(1, index, leaving * ~folds[:, None, None])
    row = readout.gather(1, phase[:, None, None].expand(b, 1, c))
    return window_read(ring, plan.slot_taps(slot), length, keepdim) + (row if keepdim else row[:, 0])


def compact_chunk(mixer: TokenMixer, window: torch.Tensor, modes: torch.Tensor, v: torch.Tensor,
                  positions: Positions, plan: CompactState) -> torch.Tensor:
    """Several tokens ``v`` (b, n, c) on a filled state, in place: the ring's inputs and the chunk through the mixer's
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
    sequence = torch.cat([ring_history(window[:, :length], positions).to(v.dtype), v], dim=1)
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
    sequence = torch.cat([ring_history(window[:, :length], positions).to(v.dtype), v], dim=1)  # (b, T, c)
    ahead = (positions - capacity - before).clamp_min(0)
    contribution = modal_contribution(prior * pole_powers(poles, ahead, prior.dtype), poles, n, plan._groups)
    out = mixer(sequence, None)[:, -n:] + contribution.to(v.dtype)
    steps = sequence.shape[1]
    first = positions - length                                      # the position of each row's first entry
    offsets = torch.arange(steps, device=v.device)
    # The inputs before the new frontier, shifted so that the last of them is the last entry (their powers count
    # from there); earlier entries of the ring are zeros already (folded before).
    index = offsets - (first + steps - after)[:, None]
    shifted = sequence.gather(1, index.clamp_min(0)[..., None].expand(b, steps, c)) * (index >= 0)[..., None]
    folded = (modal_state(shifted, poles, residues, plan._groups)
              + prior * pole_powers(poles, after - before, prior.dtype))
    kept = (first[:, None] + offsets[steps - length:] >= after[:, None])[..., None]   # from the new frontier on
    ring = window_prefill(sequence[:, steps - length:] * kept, positions + n - length, length)
    folded = to_group_order(folded, tables)
    in_place((window, modes), (torch.cat([ring, readout_rows(folded, tables).to(ring.dtype)], dim=1), folded))
    return out


@dataclasses.dataclass(eq=False)
class CompactState(DecodingState):
    """A ring of ``capacity + fold_every`` inputs with the modes' readout rows after it (b, W + 2K, c) and ``modes``
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
    fold_every: int = 1                         # K: positions between two folds of the ring's oldest inputs
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
        self._tap_views = None

    def slot_taps(self, slot: int | torch.Tensor) -> torch.Tensor:
        """:func:`~.decoding_window.slot_taps` of the ring's taps; for an int slot one of W + K views made once (a
        step at batch 1 is bound by its operator calls)."""
        if type(slot) is not int:
            return slot_taps(self.taps_twice, slot)
        if self._tap_views is None or self._tap_views[0] is not self.taps_twice:
            views = [slot_taps(self.taps_twice, s) for s in range(self.capacity + self.fold_every)]
            self._tap_views = (self.taps_twice, views)
        return self._tap_views[1][slot]

    def fold_tables(self) -> FoldTables:
        """The powers a fold reads (:func:`~.decoding_fold.fold_tables`), built once."""
        if self._fold is None:
            self._fold = fold_tables(as_complex(self.poles), as_complex(self.residues), self._groups,
                                     self.fold_every)
        return self._fold

    @classmethod
    def from_tail(cls, tail: ModalTail, mixer: TokenMixer, device: torch.device, dtype: torch.dtype,
                  fold_every: int | None = None) -> CompactState:
        """The state of a fitted (or loaded) ``tail``: poles and residues as real planes on ``device``, the ring's
        taps (:func:`compact_taps`) in ``dtype``; folding every ``fold_every`` positions (default
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

    def step(self, states: States, v_t: torch.Tensor, positions: Positions) -> tuple[torch.Tensor, States]:
        window, modes = states
        return compact_step(window, modes, v_t, positions, self), states

    def chunk(self, mixer: TokenMixer, states: States, v: torch.Tensor,
              positions: Positions) -> tuple[torch.Tensor, States]:
        window, modes = states
        return compact_chunk(mixer, window, modes, v, positions, self), states
