"""FD-TNN ("SKI to go faster", Moreno et al. 2023): the RPE models the kernel's frequency response directly.

The RPE is sampled on the fixed rfft grid of FFT size ``N = 2 * fd_kernel_length`` (never on a grid that follows the
input length, which would make padding change the outputs), which gives a kernel of fixed support: lags 0..N/2 when
causal, |lag| <= N/2 when bidirectional. Every input length uses that same kernel, truncated or zero-padded.
"""

from __future__ import annotations

import math

import torch

from .configuration_tnn import TnnConfig
from .mixer_base import TokenMixer, fft_convolve, fft_length
from .rpe import Rpe


def hilbert_causal_kernel(real_response: torch.Tensor, grid: int) -> torch.Tensor:
    """The causal kernel (lags 0..grid/2) whose spectrum has real part ``real_response`` (grid/2 + 1, c).

    Discrete Hilbert transform through the even part: ``h_e = irfft(Re H)`` is even; the causal kernel keeps lag 0
    and lag grid/2 once, doubles lags 1..grid/2-1 and zeroes negative lags, so ``Re rfft(h) == Re H`` exactly.
    """
    even = torch.fft.irfft(real_response, n=grid, dim=0)
    half = grid // 2
    kernel = even[: half + 1].clone()
    kernel[1:half] *= 2
    return kernel


class FdTno(TokenMixer):
    """Token mixer whose RPE maps frequencies in [0, pi] to the frequency response: Re H (causal, the imaginary part
    follows from causality) or Re H and Im H (bidirectional, Im H = 0 at DC and Nyquist). No decay bias."""

    def __init__(self, config: TnnConfig, channels: int):
        super().__init__(channels, causal=bool(config.causal))
        self.grid = 2 * config.fd_kernel_length
        self.decode_window = self.grid // 2 + 1  # the causal kernel's support: a ring buffer decodes exactly
        self.rpe = Rpe(config.rpe_dim, config.rpe_layers, channels if self.causal else 2 * channels)

    def frequencies(self, device: torch.device) -> torch.Tensor:
        return torch.linspace(0, math.pi, self.grid // 2 + 1, device=device)

    def response(self, device: torch.device) -> torch.Tensor:
        """The RPE's output on the frequency grid: Re H (causal) or complex H (bidirectional), (grid/2 + 1, c)."""
        out = self.rpe(self.frequencies(device))
        if self.causal:
            return out
        real, imag = out[:, : self.channels], out[:, self.channels:]
        edge = torch.ones(out.shape[0], 1, dtype=out.dtype, device=device)
        edge[0] = edge[-1] = 0  # a real kernel has a real spectrum at DC and Nyquist
        return torch.complex(real, imag * edge)

    def kernel(self, device: torch.device) -> torch.Tensor:
        """The time-domain kernel: lags 0..grid/2 (causal) or lags -grid/2..grid/2 (bidirectional; lag +-grid/2
        share the grid's Nyquist tap equally, so the circular sum of the two is the grid's own kernel)."""
        if self.causal:
            return hilbert_causal_kernel(self.response(device), self.grid)
        circular = torch.fft.irfft(self.response(device), n=self.grid, dim=0)
        half = self.grid // 2
        nyquist = circular[half: half + 1] / 2
        return torch.cat([nyquist, circular[half + 1:], circular[:half], nyquist])

    def spectrum(self, n: int, fft_len: int, device: torch.device, dtype: torch.dtype) -> torch.Tensor:
        if fft_len == self.grid and not self.causal:
            return self.response(device).to(dtype.to_complex())  # the RPE output is the spectrum: no kernel FFT
        kernel = self.kernel(device).to(dtype)
        layout = kernel.new_zeros(fft_len, self.channels)
        half = self.grid // 2
        taps = min(half, n - 1)  # lags >= n never reach y[:n]
        if self.causal:
            layout[: taps + 1] = kernel[: taps + 1]
        else:
            layout[: taps + 1] = kernel[half: half + taps + 1]
            if taps:
                layout[fft_len - taps:] = kernel[half - taps: half]
        return torch.fft.rfft(layout, dim=0)

    def mix(self, x: torch.Tensor, attention_mask: torch.Tensor | None) -> torch.Tensor:
        n = x.shape[1]
        fft_len = fft_length(n)  # >= 2n: every kernel tap that reaches y[:n] lands without circular wrap
        spectrum = self.cached(("spectrum", n, x.device, x.dtype),
                               lambda: self.spectrum(n, fft_len, x.device, x.dtype))
        return fft_convolve(x, spectrum, fft_len)

    def causal_taps(self, n: int, device: torch.device) -> torch.Tensor:
        kernel = self.kernel(device)[:n]
        return torch.cat([kernel, kernel.new_zeros(n - kernel.shape[0], self.channels)])

    def ssm_kernel(self, length: int, device: torch.device) -> tuple[torch.Tensor, float]:
        return self.causal_taps(length, device), 1.0
