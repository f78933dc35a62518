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

from typing import TYPE_CHECKING

import torch
from torch import nn

from .configuration_tnn import TnnConfig
from .mixer_base import TokenMixer
from .ops_ski import inducing_toeplitz, interpolation_weights, sparse_plus_low_rank, toeplitz_product
from .rpe import Rpe
from .runtime import tracing

if TYPE_CHECKING:
    from .ops_input_map import InputMap

class SkiTno(TokenMixer):
    """Sparse (band convolution) plus low-rank (structured kernel interpolation) Toeplitz approximation."""

    def __init__(self, config: TnnConfig, channels: int):
        # Bidirectional only: TnnConfig refuses a causal SKI config (validate_causal_token_mixer).
        super().__init__(channels, causal=False, recompute_spectra=config.fft_recompute)
        self.rank = config.ski_rank
        self.gamma = float(config.decay_gamma)
        self.kernel_size = config.ski_kernel_size
        bound = 1 / math.sqrt(self.kernel_size)  # nn.Conv1d's default init for a depthwise kernel
        self.band = nn.Parameter(torch.empty(channels, self.kernel_size).uniform_(-bound, bound))
        self.rpe = Rpe(config.rpe_dim, config.rpe_layers, channels)

    def band_conv(self, x: torch.Tensor) -> torch.Tensor:
        """Centred depthwise convolution along the sequence, (b, n, c) -> (b, n, c)."""
        return sparse_plus_low_rank(x, self.band.to(x.dtype))

    def inducing_kernel(self, lengths: torch.Tensor, dtype: torch.dtype, shared: bool = False) -> torch.Tensor:
        """Kernel at the inducing lags ``(-(r-1)..r-1) * spacing`` of each row, (b, 2r - 1, c); with ``shared``, one
        (1, 2r - 1, c) for the whole batch where every row has the same length."""
        unique, inverse = torch.unique(lengths, return_inverse=True)
        spacing = (unique.to(dtype) - 1).clamp(min=0) / (self.rank - 1)
        steps = torch.arange(-(self.rank - 1), self.rank, device=lengths.device, dtype=dtype)
        lags = spacing[:, None] * steps[None, :]                                       # (u, 2r - 1)
        values = self.rpe(lags.reshape(-1)).to(dtype).view(*lags.shape, self.channels)
        values = values * (self.gamma ** lags.abs())[..., None]
        if shared and not tracing() and unique.shape[0] == 1:
            return values
        return values[inverse]

    def low_rank_factors(self, x: torch.Tensor, attention_mask: torch.Tensor | None
                         ) -> tuple[torch.Tensor, torch.Tensor]:
        """``W`` (b, n, r) and ``K_r`` (b, c, r, r), with each row's inducing grid spanning its real tokens; K_r is
        (1, c, r, r), shared, when every row has the same length (a batch of b copies would cost b * c * r * r
        values: 400 MB at b = 128, 768 channels, rank 32)."""
        b, n, _ = x.shape
        if attention_mask is None:
            lengths = torch.full((b,), n, device=x.device, dtype=torch.long)
            offsets = None
        else:
            mask = attention_mask > 0
            lengths = mask.sum(dim=1)
            offsets = mask.to(torch.int8).argmax(dim=1)  # first real slot: left padding works too
        weights = interpolation_weights(lengths, n, self.rank, x.dtype, offsets)       # (b, n, r)
        kernel = self.inducing_kernel(lengths, x.dtype, shared=True)                   # (b or 1, 2r - 1, c)
        return weights, inducing_toeplitz(kernel)

    def low_rank(self, x: torch.Tensor, attention_mask: torch.Tensor | None) -> torch.Tensor:
        """``W K_r W^T x`` alone (the mixer computes it together with the band, see :meth:`mix`)."""
        weights, k_r = self.low_rank_factors(x, attention_mask)
        z = torch.bmm(weights.transpose(1, 2), x)                                      # (b, r, c)
        return torch.bmm(weights, toeplitz_product(k_r, z))

    def mix(self, x: torch.Tensor, attention_mask: torch.Tensor | None, input_map: InputMap | None = None
            ) -> torch.Tensor:
        """SKI's own operator (not a convolution the dispatcher plans): band plus low rank in one function."""
        weights, k_r = self.low_rank_factors(x, attention_mask)
        return sparse_plus_low_rank(x, self.band.to(x.dtype), weights, k_r, input_map)
