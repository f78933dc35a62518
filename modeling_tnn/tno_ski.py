"""SKI-TNN ("SKI to go faster", Moreno et al. 2023), bidirectional only: ``T x ~ band(x) + W K_r W^T x``.

``band`` is a learned, centred depthwise convolution of odd width ``ski_kernel_size``. The low-rank part places
``ski_rank`` inducing points evenly on each row's real (unpadded) span [0, L-1]; ``W`` (n x r) holds the linear
interpolation weights from positions to inducing points (two non-zeros per row, each in [0, 1], summing to 1), and
``K_r`` is the r x r Toeplitz matrix of the kernel ``RPE(lag) * gamma**|lag|`` at the inducing lags. The decay lives
in the kernel, never in ``W`` (the public ski-tnn code scales W's rows, which breaks the Toeplitz structure, and
assigns its interpolation weights the wrong way round). Cost O(n (r + k) d), memory O(n r).
"""

from __future__ import annotations

import math

import torch
import torch.nn.functional as F
from torch import nn

from .configuration_tnn import TnnConfig
from .mixer_base import TokenMixer
from .rpe import Rpe

BAND_BLOCK = 32  # outputs per block of the banded matmul: larger blocks waste MACs, smaller ones make small GEMMs


def interpolation_weights(lengths: torch.Tensor, n: int, rank: int, dtype: torch.dtype,
                          offsets: torch.Tensor | None = None) -> torch.Tensor:
    """Linear-interpolation matrix (b, n, r) from the positions of each row to its ``rank`` inducing points.

    Row ``b`` has real tokens at slots ``offsets[b] .. offsets[b] + lengths[b] - 1``; other slots get zero rows.
    """
    device = lengths.device
    slots = torch.arange(n, device=device, dtype=dtype)
    start = torch.zeros_like(lengths) if offsets is None else offsets
    positions = slots[None, :] - start[:, None].to(dtype)                       # (b, n), position within the row
    spacing = (lengths.to(dtype) - 1).clamp(min=0) / (rank - 1)                  # (b,)
    scaled = positions / spacing.clamp(min=torch.finfo(dtype).tiny)[:, None]
    scaled = torch.where(spacing[:, None] > 0, scaled, torch.zeros_like(scaled))
    lower = scaled.floor().clamp(0, rank - 2)
    frac = (scaled - lower).clamp(0, 1)
    valid = ((positions >= 0) & (positions <= (lengths[:, None] - 1))).to(dtype)
    weights = torch.zeros(*positions.shape, rank, device=device, dtype=dtype)
    index = lower.long()[..., None]
    weights.scatter_add_(2, index, ((1 - frac) * valid)[..., None])
    weights.scatter_add_(2, index + 1, (frac * valid)[..., None])
    return weights


class SkiTno(TokenMixer):
    """Sparse (band convolution) plus low-rank (structured kernel interpolation) Toeplitz approximation."""

    def __init__(self, config: TnnConfig, channels: int):
        if config.causal:
            raise ValueError(config._causal_ski_message())
        super().__init__(channels, causal=False)
        self.rank = config.ski_rank
        self.gamma = float(config.decay_gamma)
        self.kernel_size = config.ski_kernel_size
        bound = 1 / math.sqrt(self.kernel_size)  # nn.Conv1d's default init for a depthwise kernel
        self.band = nn.Parameter(torch.empty(channels, self.kernel_size).uniform_(-bound, bound))
        self.rpe = Rpe(config.rpe_dim, config.rpe_layers, channels)

    def band_conv(self, x: torch.Tensor) -> torch.Tensor:
        """Centred depthwise convolution along the sequence, (b, n, c) -> (b, n, c).

        Computed as one batched matmul over channels: the sequence is cut into blocks of ``BAND_BLOCK`` outputs,
        each read from a window of ``BAND_BLOCK + k - 1`` inputs through a per-channel banded matrix. On CPU this
        beats ``F.conv1d(groups=channels)``, whose backward (the weight gradient above all) is the slow part.
        """
        b, n, c = x.shape
        half = self.kernel_size // 2
        block = BAND_BLOCK
        blocks = -(-n // block)
        padded = F.pad(x, (0, 0, half, blocks * block - n + half))
        windows = padded.unfold(1, block + 2 * half, block)                         # (b, blocks, c, window)
        offset = torch.arange(block + 2 * half, device=x.device)[None, :] - torch.arange(block, device=x.device)[:, None]
        inside = (offset >= 0) & (offset < self.kernel_size)
        banded = self.band.to(x.dtype)[:, offset.clamp(0, self.kernel_size - 1)] * inside    # (c, block, window)
        y = torch.einsum("bncj,cij->bnic", windows, banded)
        return y.reshape(b, blocks * block, c)[:, :n]

    def inducing_kernel(self, lengths: torch.Tensor, dtype: torch.dtype) -> torch.Tensor:
        """Kernel at the inducing lags ``(-(r-1)..r-1) * spacing`` of each row, (b, 2r - 1, c)."""
        unique, inverse = torch.unique(lengths, return_inverse=True)
        spacing = (unique.to(dtype) - 1).clamp(min=0) / (self.rank - 1)
        steps = torch.arange(-(self.rank - 1), self.rank, device=lengths.device, dtype=dtype)
        lags = spacing[:, None] * steps[None, :]                                       # (u, 2r - 1)
        values = self.rpe(lags.reshape(-1)).to(dtype).view(*lags.shape, self.channels)
        values = values * (self.gamma ** lags.abs())[..., None]
        return values[inverse]

    def low_rank(self, x: torch.Tensor, attention_mask: torch.Tensor | None) -> torch.Tensor:
        """``W K_r W^T x`` with each row's inducing grid spanning its real tokens."""
        b, n, _ = x.shape
        if attention_mask is None:
            lengths = torch.full((b,), n, device=x.device, dtype=torch.long)
            offsets = None
        else:
            mask = attention_mask > 0
            lengths = mask.sum(dim=1)
            offsets = mask.to(torch.int8).argmax(dim=1)  # first real slot: left padding works too
        weights = interpolation_weights(lengths, n, self.rank, x.dtype, offsets)       # (b, n, r)
        kernel = self.inducing_kernel(lengths, x.dtype)                                # (b, 2r - 1, c)
        r = self.rank
        toeplitz_index = torch.arange(r, device=x.device)[:, None] - torch.arange(r, device=x.device)[None, :]
        k_r = kernel[:, toeplitz_index + r - 1]                                        # (b, r, r, c)
        z = torch.bmm(weights.transpose(1, 2), x)                                      # (b, r, c)
        z = torch.einsum("bijc,bjc->bic", k_r, z)
        return torch.bmm(weights, z)

    def mix(self, x: torch.Tensor, attention_mask: torch.Tensor | None) -> torch.Tensor:
        return self.band_conv(x) + self.low_rank(x, attention_mask)
