"""The original TNN token mixer: a Toeplitz matrix whose coefficients an RPE MLP builds, with exponential decay,
applied by FFT in O(n log n)."""

from __future__ import annotations

import torch
import torch.nn.functional as F

from .configuration_tnn import TnnConfig
from .mixer_base import TokenMixer, fft_convolve, fft_length
from .rpe import Rpe


class DenseTno(TokenMixer):
    """Toeplitz neural operator: ``t_k = RPE(k) * gamma**|k|`` (``t_k = 0`` for ``k < 0`` when causal)."""

    def __init__(self, config: TnnConfig, channels: int):
        super().__init__(channels, causal=bool(config.causal))
        self.gamma = float(config.decay_gamma)
        self.rpe = Rpe(config.rpe_dim, config.rpe_layers, channels)

    def rpe_values(self, lags: torch.Tensor) -> torch.Tensor:
        """The pre-decay kernel ``RPE(k)`` at integer ``lags`` (L,) -> (L, channels)."""
        return self.rpe(lags)

    def decayed(self, lags: torch.Tensor, keep: torch.Tensor | None = None) -> torch.Tensor:
        """Kernel values ``RPE(k) * gamma**|k|`` at integer ``lags`` (L,) -> (L, channels); zero where ``keep`` is
        False."""
        values = self.rpe_values(lags)
        decay = self.gamma ** lags.abs().to(values.dtype)
        if keep is not None:
            decay = decay * keep
        return values * decay[:, None]

    def coefficients(self, n: int, device: torch.device) -> torch.Tensor:
        """Kernel values at lags ``0..n-1`` (causal) or ``-(n-1)..n-1`` (bidirectional), shape (lags, channels)."""
        return self.decayed(torch.arange(0 if self.causal else -(n - 1), n, device=device))

    def layout(self, n: int, fft_len: int, device: torch.device, dtype: torch.dtype) -> torch.Tensor:
        """The kernel's circular layout (fft_len, channels): lag k at slot k, lag -k at slot fft_len - k, zero
        elsewhere."""
        if self.causal:
            return F.pad(self.coefficients(n, device).to(dtype), (0, 0, 0, fft_len - n))
        # The RPE runs on each slot's own lag (slot s holds lag s, or s - fft_len past the middle) and the few slots
        # between lags n-1 and -(n-1) are zeroed through the decay: no concatenation to build or undo.
        slots = torch.arange(fft_len, device=device)
        lags = torch.where(slots < n, slots, slots - fft_len)
        return self.decayed(lags, keep=lags > -n).to(dtype)

    def spectrum(self, n: int, fft_len: int, device: torch.device, dtype: torch.dtype) -> torch.Tensor:
        """rfft of the circulant embedding of the kernel (:meth:`layout`), (fft_len // 2 + 1, channels)."""
        return torch.fft.rfft(self.layout(n, fft_len, device, dtype), dim=0)

    def mix(self, x: torch.Tensor, attention_mask: torch.Tensor | None) -> torch.Tensor:
        n = x.shape[1]
        fft_len = fft_length(n)
        kernel = self.convolution_kernel(("spectrum", n, x.device, x.dtype),
                                         lambda: self.layout(n, fft_len, x.device, x.dtype),
                                         lambda: self.spectrum(n, fft_len, x.device, x.dtype))
        return fft_convolve(x, kernel, fft_len)

    def causal_taps(self, n: int, device: torch.device) -> torch.Tensor:
        return self.coefficients(n, device)

    def ssm_kernel(self, length: int, device: torch.device) -> tuple[torch.Tensor, float]:
        return self.rpe_values(torch.arange(length, device=device)), self.gamma
