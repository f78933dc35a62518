"""The compact decoding state of a decaying kernel: a short exact window and its tail as a few complex modes.

A window of the first W lags (b, W, c) and the tail as r complex modes per channel, ``g = z * g + c * v_{t-W}``
(the input leaving the window enters the modes), with a certified bound of the kernel's relative l1 error
(:mod:`~modeling_tnn.fit_modal`). The modes are kept as real planes (b, 3, c, r): real part, imaginary part
and the step's scratch (real arithmetic vectorises where PyTorch's complex kernels on CPU do not); everything is
allocated at prefill and updated in place. The functions here take and return those two tensors
(:func:`compact_prefill`, :func:`compact_step`, :func:`compact_chunk`); :class:`CompactState` is the layer's plan
that calls them with its constants.
"""

from __future__ import annotations

import dataclasses
from typing import TYPE_CHECKING

import torch

from .decoding_poles import pole_power_range, pole_powers
from .decoding_state import DecodingState, Positions, States
from .decoding_window import (in_place, reversed_taps, ring_history, ring_slot, slot_read, slot_taps, slot_write,
                              window_prefill, window_read)

from .fit_store import PoleGroups

if TYPE_CHECKING:
    from .fit_store import ModalTail
    from .mixer_base import TokenMixer

# Inputs per block of the parallel modal state: its (block, c, r) powers stay a few MB.
MODAL_BLOCK = 128
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


def compact_prefill(v: torch.Tensor, positions: Positions, poles: torch.Tensor, residues: torch.Tensor,
                    capacity: int, prior: torch.Tensor | None = None, groups: PoleGroups | None = None) -> States:
    """(window (b, W, c), modes (b, 3, c, r)) after inputs ``v`` (b, n, c) that follow ``positions`` tokens: the last
    W inputs in the window, the ones before in the modes; ``prior`` (the modes before ``v``, complex (b, c, r)) is
    decayed over them and added. ``poles``, ``residues``: complex (c, r); ``groups``: channels sharing poles."""
    n = v.shape[1]
    keep = min(n, capacity)
    modes = modal_state(v[:, : n - keep], poles, residues, groups)
    if prior is not None:
        modes += prior * pole_powers(poles, n - keep, prior.dtype)
    return (window_prefill(v, positions, capacity),
            torch.stack([modes.real, modes.imag, torch.zeros_like(modes.real)], dim=1))


def compact_step(window: torch.Tensor, modes: torch.Tensor, v_t: torch.Tensor, positions: Positions,
                 pole_planes: tuple[torch.Tensor, torch.Tensor], residue_planes: tuple[torch.Tensor, torch.Tensor],
                 taps_twice: torch.Tensor) -> torch.Tensor:
    """In place: the input leaving each row's window enters its modes, ``v_t`` (b, c) takes its slot; the output is
    the window read against the exact taps plus the modes' real part. ``pole_planes``, ``residue_planes``: the
    (real, imaginary) planes (c, r) of the constants."""
    position = ring_slot(positions, window.shape[1])
    real, imag, scratch = modes.unbind(1)
    (pole_re, pole_im), (res_re, res_im) = pole_planes, residue_planes
    leaving = slot_read(window, position)[..., None]
    if torch.compiler.is_compiling():  # dynamo takes no non-contiguous out= (the planes of a batch above 1)
        scratch.copy_(imag).mul_(pole_im)
    else:
        torch.mul(imag, pole_im, out=scratch)
    imag.mul_(pole_re).addcmul_(real, pole_im).addcmul_(leaving, res_im)
    real.mul_(pole_re).sub_(scratch).addcmul_(leaving, res_re)
    slot_write(window, position, v_t)
    return window_read(window, slot_taps(taps_twice, position), window.shape[1]) + real.sum(-1)


def compact_chunk(mixer: TokenMixer, window: torch.Tensor, modes: torch.Tensor, v: torch.Tensor,
                  positions: Positions, poles: torch.Tensor, residues: torch.Tensor,
                  groups: PoleGroups | None = None) -> torch.Tensor:
    """Several tokens ``v`` (b, n, c) on a filled state, in place: the window and the chunk through the mixer's
    exact kernel in parallel, plus what the modes contribute; then the state after the chunk."""
    capacity = window.shape[1]
    prior = torch.complex(modes[:, 0], modes[:, 1])
    sequence = torch.cat([ring_history(window, positions).to(v.dtype), v], dim=1)
    n = v.shape[1]
    out = mixer(sequence, None)[:, -n:] + modal_contribution(prior, poles, n, groups).to(v.dtype)
    in_place((window, modes),
             compact_prefill(sequence, positions - capacity, poles, residues, capacity, prior, groups))
    return out


@dataclasses.dataclass(eq=False)
class CompactState(DecodingState):
    """A window of ``capacity`` lags (b, W, c) and ``modes`` complex modes per channel (b, 3, c, r) real planes, the
    two state tensors; its kernel is within ``error_bound`` (relative l1, the largest channel's) of the exact one.
    Build it from a fitted tail with :meth:`from_tail`."""

    PLAN = "compact"
    CONSTANTS = ("poles", "residues", "taps_twice", "channel_order", "channel_rank")

    capacity: int = 0
    modes: int = 0
    error_bound: float = 0.0
    shared_groups: tuple[int, ...] = ()         # PoleGroups.sizes: channels sharing a pole set, group by group
    poles: torch.Tensor | None = None           # (2, c, r) float32: real and imaginary planes of the poles
    residues: torch.Tensor | None = None        # (2, c, r) float32: the same of their residues
    taps_twice: torch.Tensor | None = None      # (2 W, c): the window's reversed taps
    channel_order: torch.Tensor | None = None   # (c,) PoleGroups.order
    channel_rank: torch.Tensor | None = None    # (c,) PoleGroups.rank

    def __post_init__(self):
        # The constants' planes as views, once: unpacking a tensor per step costs an operator per plane.
        self._planes = None if self.poles is None else (self.poles.unbind(0), self.residues.unbind(0))
        self._groups = (None if self.channel_order is None
                        else PoleGroups(self.channel_order, self.channel_rank, tuple(self.shared_groups)))

    @classmethod
    def from_tail(cls, tail: ModalTail, mixer: TokenMixer, device: torch.device, dtype: torch.dtype) -> CompactState:
        """The state of a fitted (or loaded) ``tail``: poles and residues as real planes on ``device``, the window's
        exact taps in ``dtype``."""
        def planes(values: torch.Tensor) -> torch.Tensor:
            return torch.stack([values.real, values.imag]).to(device).contiguous()
        groups = tail.pole_groups()
        return cls(capacity=tail.window, modes=tail.modes, error_bound=tail.max_bound, shared_groups=groups.sizes,
                   poles=planes(tail.poles), residues=planes(tail.residues),
                   taps_twice=reversed_taps(mixer, tail.window, device, dtype),
                   channel_order=groups.order.to(device), channel_rank=groups.rank.to(device))

    def describe(self) -> dict:
        return {**super().describe(), "window": self.capacity, "modes": self.modes, "error_bound": self.error_bound}

    def state_shapes(self, channels: int) -> tuple[tuple[int, ...], ...]:
        return (self.capacity, channels), (3, channels, self.modes)

    def prefill(self, mixer: TokenMixer, v: torch.Tensor, positions: Positions = 0) -> States:
        return compact_prefill(v, positions, as_complex(self.poles), as_complex(self.residues), self.capacity,
                               groups=self._groups)

    def step(self, states: States, v_t: torch.Tensor, positions: Positions) -> tuple[torch.Tensor, States]:
        window, modes = states
        return compact_step(window, modes, v_t, positions, *self._planes, self.taps_twice), states

    def chunk(self, mixer: TokenMixer, states: States, v: torch.Tensor,
              positions: Positions) -> tuple[torch.Tensor, States]:
        window, modes = states
        return compact_chunk(mixer, window, modes, v, positions, as_complex(self.poles), as_complex(self.residues),
                             self._groups), states
