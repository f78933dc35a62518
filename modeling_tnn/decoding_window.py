"""The exact decoding state: a window of past mixer inputs (b, W, c), read against the kernel's taps.

W is the kernel's support (:meth:`~modeling_tnn.mixer_base.TokenMixer.kernel_support`): FD's fixed support
(``fd_kernel_length + 1`` taps), or the lags after which a decaying dense kernel ``RPE(k) gamma**k`` falls below
float32 resolution; without one (a kernel that does not decay) the window is the whole history, which grows (O(t)
per token). The window is a ring: the input of position ``p`` sits in slot ``p mod W``; the ring helpers here serve
the SSM's window phase and the compact state's window too.
"""

from __future__ import annotations

import dataclasses
from typing import TYPE_CHECKING

import torch

from .decoding_state import DecodingState
from .ops_fft_sizes import smooth_size
from .runtime import compute_dtype

if TYPE_CHECKING:
    from .decoding_cache import TnnCacheLayer
    from .mixer_base import TokenMixer

READ_CHUNK_ELEMENTS = 1 << 20  # elements of one window read's temporary product (4 MiB of float32)


def reversed_taps(mixer: TokenMixer, width: int, device: torch.device, dtype: torch.dtype) -> torch.Tensor:
    """(2 width, c) in ``dtype``: taps ``width-1 .. 0`` twice, so that the taps a ring buffer's slots need at any write
    position are one contiguous slice; memoised by the mixer in eval mode."""
    def build():
        taps = mixer.causal_taps(width, device).detach().to(dtype).flip(0)
        return torch.cat([taps, taps]).contiguous()
    return mixer.cached(("reversed taps", width, device, dtype), build)


def window_state(v: torch.Tensor, seen: int, capacity: int) -> torch.Tensor:
    """A zero buffer (b, capacity, c) holding inputs ``v`` (b, n, c), the last ``n`` of ``seen`` tokens, at their ring
    slots ``position mod capacity`` (only the last ``capacity`` fit)."""
    b, n, c = v.shape
    keep = min(n, capacity)
    buffer = v.new_zeros(b, capacity, c, dtype=compute_dtype(v.dtype))
    buffer[:, ring_order(seen, keep, capacity, v.device)] = v[:, n - keep:].to(buffer.dtype)
    return buffer


def ring_order(seen: int, count: int, capacity: int, device: torch.device) -> torch.Tensor:
    """Slots of a ring of ``capacity`` holding positions ``seen - count .. seen - 1``, oldest first."""
    return torch.arange(seen - count, seen, device=device) % capacity


def window_history(buffer: torch.Tensor, seen: int) -> torch.Tensor:
    """The inputs a window holds after ``seen`` tokens, oldest first, (b, min(seen, W), c)."""
    capacity = buffer.shape[1]
    return buffer[:, ring_order(seen, min(seen, capacity), capacity, buffer.device)]


def ring_slot(seen: int, capacity: int, counter: torch.Tensor | None) -> int | torch.Tensor:
    """The ring slot ``seen mod capacity`` of the next input: a Python int eagerly; under torch.compile a one-element
    tensor from the cache's ``counter`` (the same count), since indexing by a Python int specialises the graph on
    its value (a recompilation per slot), where indexing by a tensor leaves one graph for every step."""
    if counter is None or not torch.compiler.is_compiling():  # (torch.export too; tracing() costs 6 us a call)
        return seen % capacity
    return torch.remainder(counter, capacity)


def slot_read(buffer: torch.Tensor, slot: int | torch.Tensor) -> torch.Tensor:
    """``buffer[:, slot]`` (b, c)."""
    return buffer[:, slot] if isinstance(slot, int) else buffer.index_select(1, slot)[:, 0]


def slot_write(buffer: torch.Tensor, slot: int | torch.Tensor, value: torch.Tensor) -> None:
    """``buffer[:, slot] = value`` in place."""
    if isinstance(slot, int):
        buffer[:, slot] = value
    else:
        buffer.index_copy_(1, slot, value[:, None].to(buffer.dtype))


def window_read(buffer: torch.Tensor, taps_twice: torch.Tensor, position: int | torch.Tensor,
                filled: int) -> torch.Tensor:
    """``sum_j buffer[:, j] * t[(position - j) mod W]`` over the ``filled`` slots in use, (b, c); ``position`` is a
    :func:`ring_slot`, ``taps_twice`` the :func:`reversed_taps` of the window."""
    capacity = buffer.shape[1]
    if isinstance(position, int):
        taps = taps_twice[capacity - 1 - position: 2 * capacity - 1 - position]
    else:  # every window of the doubled taps as a view (W + 1, c, W): the slot's one gathered, no table stored
        taps = taps_twice.unfold(0, capacity, 1).index_select(0, capacity - 1 - position)[0].t()
    if filled < capacity:  # no wrap yet: slots 0 .. position, a contiguous block of rows
        buffer, taps = buffer[:, :filled], taps[:filled]
    b, width, c = buffer.shape
    # A reduction over the lag rows, vectorised over the channels (measured 1.5-2x faster than channel-major
    # rows), in row chunks: a fresh temporary of the window's size costs page faults (4-10x slower at batch 8).
    rows = max(1, READ_CHUNK_ELEMENTS // (b * c))
    if rows >= width:
        return (buffer * taps).sum(1)
    out = buffer.new_zeros(b, c)
    for start in range(0, width, rows):
        out += (buffer[:, start:start + rows] * taps[start:start + rows]).sum(1)
    return out


def ring_step(layer: TnnCacheLayer, taps_twice: torch.Tensor, v_t: torch.Tensor, seen: int,
              counter: torch.Tensor | None) -> torch.Tensor:
    """Write ``v_t`` into the window ``recurrent_states[0]`` at its ring slot and read the window: the exact mixer
    output over the inputs it holds."""
    buffer = layer.recurrent_states[0]
    position = ring_slot(seen, buffer.shape[1], counter)
    slot_write(buffer, position, v_t)
    return window_read(buffer, taps_twice, position, seen + 1)


@dataclasses.dataclass(eq=False)
class WindowState(DecodingState):
    """The last ``capacity`` mixer inputs (b, W, c) as ``recurrent_states[0]``, read against the exact taps; with
    ``capacity`` None the whole history, in a buffer that doubles when full (copied O(log t) times)."""

    PLAN = "window"
    CONSTANTS = ("taps_twice",)

    capacity: int | None = None
    taps_twice: torch.Tensor | None = None  # (2 W, c): reversed_taps of the buffer's width

    @property
    def fixed_shapes(self) -> bool:
        return self.capacity is not None

    def describe(self) -> dict:
        return {**super().describe(), "window": self.capacity}

    def _buffer_width(self, needed: int) -> int:
        """The buffer's slots: the support, or (a growing history) a smooth size of at least twice ``needed``."""
        return self.capacity if self.capacity is not None else smooth_size(max(2 * needed, 64))

    def prefill(self, layer: TnnCacheLayer, mixer: TokenMixer, v: torch.Tensor, seen: int) -> None:
        width = self._buffer_width(seen + 1)
        if self.taps_twice is None or self.taps_twice.shape[0] != 2 * width:
            self.taps_twice = reversed_taps(mixer, width, v.device, compute_dtype(v.dtype))
        layer.update_recurrent_state(window_state(v, seen, width))

    def step(self, layer: TnnCacheLayer, mixer: TokenMixer, v_t: torch.Tensor, seen: int,
             counter: torch.Tensor | None) -> torch.Tensor:
        if self.capacity is None and seen >= layer.recurrent_states[0].shape[1]:  # a full history: grow it
            buffer = layer.recurrent_states[0]
            self.prefill(layer, mixer, torch.cat([window_history(buffer, seen), v_t[:, None].to(buffer.dtype)], 1),
                         seen + 1)
            buffer = layer.recurrent_states[0]
            return window_read(buffer, self.taps_twice, seen % buffer.shape[1], seen + 1)
        return ring_step(layer, self.taps_twice, v_t, seen, counter)

    def chunk(self, layer: TnnCacheLayer, mixer: TokenMixer, v: torch.Tensor, seen: int) -> torch.Tensor:
        history = torch.cat([window_history(layer.recurrent_states[0], seen).to(v.dtype), v], dim=1)
        n = v.shape[1]
        out = mixer(history, None)[:, -n:]
        self.prefill(layer, mixer, history, seen + n)
        return out
