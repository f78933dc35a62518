"""The modes of many inputs at once, for a prefill or a chunk of the compact state (:mod:`~modeling_tnn.decoding_compact`):
``residues * sum_i z**(T-1-i) v_i`` over a prompt, and what given modes contribute to the next outputs, each group of
channels that shares its poles (:class:`~modeling_tnn.fit_store.PoleGroups`) in one matrix product, the channels with
poles of their own in a batched one."""

from __future__ import annotations

import torch

from .decoding_poles import pole_power_range, pole_powers
from .fit_store import PoleGroups

# Inputs per block of the parallel modal state: its (block, c, r) powers stay a few MB.
MODAL_BLOCK = 128


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
