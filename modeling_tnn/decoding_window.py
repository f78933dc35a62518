"""The exact decoding state: a window of past mixer inputs (b, W, c), read against the kernel's taps.

W is the kernel's support (:meth:`~modeling_tnn.mixer_base.TokenMixer.kernel_support`): FD's fixed support
(``fd_kernel_length + 1`` taps), or the lags after which a decaying dense kernel ``RPE(k) gamma**k`` falls below
float32 resolution; without one (a kernel that does not decay) the window is the whole history, which grows (O(t)
per token). The window is a ring: the input of position ``p`` sits in slot ``p mod W`` of its row, so rows at
different positions step together; the ring functions here serve the SSM's window phase too (the compact state keeps
its inputs in position order instead: :mod:`~modeling_tnn.decoding_compact`).
"""

from __future__ import annotations

import dataclasses
from typing import TYPE_CHECKING

import torch

from .decoding_state import DecodingState, Positions, States, one_position
from .ops_fft_sizes import smooth_size
from .runtime import compute_dtype

if TYPE_CHECKING:
    from .mixer_base import TokenMixer

READ_CHUNK_ELEMENTS = 1 << 20  # elements of one window read's temporary product (4 MiB of float32)


def reversed_taps(mixer: TokenMixer, width: int, device: torch.device, dtype: torch.dtype) -> torch.Tensor:
    """(2 width, c) in ``dtype``: taps ``width-1 .. 0`` twice, so that the taps a ring buffer's slots need at any write
    position are one contiguous slice; memoised by the mixer in eval mode."""
    def build():
        taps = mixer.causal_taps(width, device).detach().to(dtype).flip(0)
        return torch.cat([taps, taps]).contiguous()
    return mixer.cached(("reversed taps", width, device, dtype), build)


def ring_order(end: int, count: int, capacity: int, device: torch.device) -> torch.Tensor:
    """Slots of a ring of ``capacity`` holding positions ``end - count .. end - 1``, oldest first."""
    return torch.arange(end - count, end, device=device) % capacity


def row_slots(positions: torch.Tensor, count: int, capacity: int) -> torch.Tensor:
    """(b, count) ring slots of positions ``positions[r] + 0 .. count - 1`` of each row (``positions`` (b,) or (1,))."""
    return torch.remainder(positions[:, None] + torch.arange(count, device=positions.device), capacity)


def window_prefill(v: torch.Tensor, positions: Positions, capacity: int) -> torch.Tensor:
    """A zero ring (b, capacity, c) holding the last inputs of ``v`` (b, n, c), which follow ``positions`` tokens, at
    their slots ``position mod capacity`` (only the last ``capacity`` fit)."""
    b, n, c = v.shape
    keep = min(n, capacity)
    buffer = v.new_zeros(b, capacity, c, dtype=compute_dtype(v.dtype))
    recent = v[:, n - keep:].to(buffer.dtype)
    if not isinstance(positions, torch.Tensor):  # a count (an int, or a size under export)
        buffer[:, ring_order(positions + n, keep, capacity, v.device)] = recent
    else:
        slots = row_slots(positions + (n - keep), keep, capacity)
        buffer.scatter_(1, slots[..., None].expand(b, keep, c), recent)
    return buffer


def ring_history(buffer: torch.Tensor, positions: Positions) -> torch.Tensor:
    """Every slot of a ring after ``positions`` tokens, oldest first (b, W, c): zeros before a row's first token."""
    b, capacity, c = buffer.shape
    if not isinstance(positions, torch.Tensor):  # a count (an int, or a size under export)
        return buffer[:, ring_order(positions, capacity, capacity, buffer.device)]
    slots = row_slots(positions - capacity, capacity, capacity).expand(b, capacity)
    return buffer.gather(1, slots[..., None].expand(b, capacity, c))


def window_history(buffer: torch.Tensor, positions: Positions) -> torch.Tensor:
    """The inputs a ring holds after ``positions`` tokens, oldest first: (b, min(positions, W), c) for one count;
    for rows at their own positions every slot (:func:`ring_history`)."""
    if isinstance(positions, int) and positions < buffer.shape[1]:
        return buffer[:, :positions]
    return ring_history(buffer, positions)


def slot_write(buffer: torch.Tensor, slot: int | torch.Tensor, value: torch.Tensor) -> None:
    """``buffer[r, slot[r]] = value[r]`` in place, ``value`` (b, c) or a token row (b, 1, c)."""
    row = value.dim() == 3
    if isinstance(slot, int):
        if row:
            buffer[:, slot:slot + 1] = value
        else:
            buffer[:, slot] = value
        return
    b, _, c = buffer.shape
    rows = value if row else value[:, None]
    buffer.scatter_(1, slot.expand(b)[:, None, None].expand(b, 1, c), rows.to(buffer.dtype))


def slot_taps(taps_twice: torch.Tensor, slot: int | torch.Tensor) -> torch.Tensor:
    """The taps each ring slot is read against when ``slot`` was written last: ``t[(slot - j) mod W]`` for slot
    ``j``, (W, c) for one slot (a view of the doubled taps), (b, W, c) for a slot per row (each row's taps gathered:
    no table stored)."""
    capacity = taps_twice.shape[0] // 2
    if isinstance(slot, int):
        return taps_twice[capacity - 1 - slot: 2 * capacity - 1 - slot]
    # Whole rows of the doubled taps, gathered contiguously (a strided window view read 1.4x slower at 16 rows).
    rows = (capacity - 1 - slot)[:, None] + torch.arange(capacity, device=slot.device)
    return taps_twice.index_select(0, rows.flatten()).view(*rows.shape, taps_twice.shape[1])


def window_read(buffer: torch.Tensor, taps: torch.Tensor, filled: int, keepdim: bool = False) -> torch.Tensor:
    """``sum_j buffer[:, j] * taps[..., j, :]`` over the first ``filled`` slots, (b, c), or (b, 1, c) with
    ``keepdim``; ``taps`` from :func:`slot_taps`."""
    capacity = buffer.shape[1]
    if filled < capacity:  # no wrap yet: slots 0 .. position, a contiguous block of rows
        buffer, taps = buffer[:, :filled], taps[..., :filled, :]
    b, width, c = buffer.shape
    # A reduction over the lag rows, vectorised over the channels (measured 1.5-2x faster than channel-major
    # rows), in row chunks: a fresh temporary of the window's size costs page faults (4-10x slower at batch 8).
    rows = max(1, READ_CHUNK_ELEMENTS // (b * c))
    if rows >= width:
        return (buffer * taps).sum(1, keepdim=keepdim)
    out = buffer.new_zeros(b, 1, c) if keepdim else buffer.new_zeros(b, c)
    for start in range(0, width, rows):
        out += (buffer[:, start:start + rows] * taps[..., start:start + rows, :]).sum(1, keepdim=keepdim)
    return out


def ring_slot(positions: Positions, capacity: int) -> int | torch.Tensor:
    """The ring slot of the next input of each row: an int for one count, else a tensor of slots."""
    return positions % capacity if isinstance(positions, int) else torch.remainder(positions, capacity)


def window_step(buffer: torch.Tensor, taps_twice: torch.Tensor, v_t: torch.Tensor, positions: Positions) -> torch.Tensor:
    """Write ``v_t`` (b, c), or a token row (b, 1, c), into the ring at each row's slot and read the ring: the exact
    mixer output over the inputs it holds (in place), of ``v_t``'s shape."""
    capacity = buffer.shape[1]
    slot = ring_slot(positions, capacity)
    slot_write(buffer, slot, v_t)
    filled = min(positions + 1, capacity) if isinstance(positions, int) else capacity  # unwritten slots hold zeros
    return window_read(buffer, slot_taps(taps_twice, slot), filled, v_t.dim() == 3)


def in_place(old: States, new: States) -> States:
    """``old`` holding ``new``'s values (a state of fixed shapes keeps its tensors: a serving engine's slots)."""
    for target, value in zip(old, new):
        target.copy_(value)
    return old


@dataclasses.dataclass(eq=False)
class WindowState(DecodingState):
    """The last ``capacity`` mixer inputs (b, W, c), the one state tensor, read against the exact taps; with
    ``capacity`` None the whole history, in a buffer that doubles when full (copied O(log t) times)."""

    PLAN = "window"
    CONSTANTS = ("taps_twice",)
    STEPS_TOKEN_ROWS = True

    capacity: int | None = None
    taps_twice: torch.Tensor | None = None  # (2 W, c): reversed_taps of the buffer's width

    @property
    def fixed_shapes(self) -> bool:
        return self.capacity is not None

    def state_shapes(self, channels: int) -> tuple[tuple[int, ...], ...]:
        if self.capacity is None:
            return super().state_shapes(channels)
        return ((self.capacity, channels),)

    def describe(self) -> dict:
        return {**super().describe(), "window": self.capacity}

    def prefill(self, mixer: TokenMixer, v: torch.Tensor, positions: Positions = 0) -> States:
        if self.capacity is None:  # a growing history: a smooth size of at least twice what it holds
            width = smooth_size(max(2 * (one_position(positions, "window of the whole history") + v.shape[1] + 1),
                                    64))
        else:
            width = self.capacity
        if self.taps_twice is None or self.taps_twice.shape[0] != 2 * width:
            self.taps_twice = reversed_taps(mixer, width, v.device, compute_dtype(v.dtype))
        return (window_prefill(v, positions, width),)

    def reserve(self, mixer: TokenMixer, states: States, positions: int) -> States:
        buffer = states[0]
        if self.capacity is not None or positions < buffer.shape[1]:
            return states
        history = window_history(buffer, positions)  # a full history: grow it
        return self.prefill(mixer, history, positions - history.shape[1])

    def step(self, states: States, v_t: torch.Tensor, positions: Positions,
             host_count: int | None = None) -> tuple[torch.Tensor, States]:
        return window_step(states[0], self.taps_twice, v_t, positions), states

    def chunk(self, mixer: TokenMixer, states: States, v: torch.Tensor,
              positions: Positions) -> tuple[torch.Tensor, States]:
        held = window_history(states[0], positions).to(v.dtype)
        history = torch.cat([held, v], dim=1)
        out = mixer(history, None)[:, -v.shape[1]:]
        after = self.prefill(mixer, history, positions - held.shape[1])
        return out, in_place(states, after) if self.fixed_shapes else after
