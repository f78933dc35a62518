"""FD-TNN ("SKI to go faster", Moreno et al. 2023): the RPE models the kernel's frequency response directly.

The RPE is sampled on the fixed rfft grid of FFT size ``N = 2 * fd_kernel_length`` (never on a grid that follows the
input length, which would make padding change the outputs), which gives a kernel of fixed support: lags 0..N/2 when
causal, |lag| <= N/2 when bidirectional. Every input length uses that same kernel, truncated or zero-padded.
"""

from __future__ import annotations

import math

import torch
import torch.nn.functional as F

from .configuration_tnn import TnnConfig
from .mixer_base import TokenMixer
from .rpe import Rpe
from .runtime import as_dtype


def causal_fold(grid: int, dtype: torch.dtype, device: torch.device) -> torch.Tensor:
    """(grid/2 + 1, 1): 1 at lags 0 and grid/2, 2 between: what the even part's lags weigh in the causal kernel."""
    half = grid // 2
    fold = torch.full((half + 1, 1), 2.0, dtype=dtype, device=device)
    fold[0] = fold[half] = 1
    return fold


def hilbert_causal_kernel(real_response: torch.Tensor, grid: int, fold: torch.Tensor | None = None) -> torch.Tensor:
    """The causal kernel (lags 0..grid/2) whose spectrum has real part ``real_response`` (grid/2 + 1, c).

    Discrete Hilbert transform through the even part: ``h_e = irfft(Re H)`` is even; the causal kernel keeps lag 0
    and lag grid/2 once, doubles lags 1..grid/2-1 and zeroes negative lags, so ``Re rfft(h) == Re H`` exactly.
    ``fold``: :func:`causal_fold` of the grid, if already at hand.
    """
    even = torch.fft.irfft(real_response, n=grid, dim=0)
    fold = causal_fold(grid, even.dtype, even.device) if fold is None else fold
    return even[: grid // 2 + 1] * fold


class FdTno(TokenMixer):
    """Token mixer whose RPE maps frequencies in [0, pi] to the frequency response: Re H (causal, the imaginary part
    follows from causality) or Re H and Im H (bidirectional, Im H = 0 at DC and Nyquist). No decay bias."""

    def __init__(self, config: TnnConfig, channels: int):
        super().__init__(channels, causal=bool(config.causal), recompute_spectra=config.fft_recompute)
        self.grid = 2 * config.fd_kernel_length
        self.rpe = Rpe(config.rpe_dim, config.rpe_layers, channels if self.causal else 2 * channels)

    def frequencies(self, device: torch.device) -> torch.Tensor:
        """The rfft grid's frequencies 0..pi, (grid/2 + 1,): kept from call to call (:meth:`constant`)."""
        return self.constant(("frequencies", self.grid, device),
                             lambda: torch.linspace(0, math.pi, self.grid // 2 + 1, device=device))

    def response(self, device: torch.device) -> torch.Tensor:
        """The RPE's output on the frequency grid: Re H (causal) or complex H (bidirectional), (grid/2 + 1, c)."""
        out = self.rpe(self.frequencies(device))
        if self.causal:
            return out
        real, imag = out[:, : self.channels], out[:, self.channels:]
        edge = self.constant(("edge", out.shape[0], out.dtype, device), lambda: self._inner_bins(out))
        return torch.complex(real, imag * edge)

    @staticmethod
    def _inner_bins(out: torch.Tensor) -> torch.Tensor:
        """(bins, 1): 0 at DC and Nyquist (a real kernel has a real spectrum there), 1 between."""
        edge = torch.ones(out.shape[0], 1, dtype=out.dtype, device=out.device)
        edge[0] = edge[-1] = 0
        return edge

    def kernel(self, device: torch.device) -> torch.Tensor:
        """The time-domain kernel: lags 0..grid/2 (causal) or lags -grid/2..grid/2 (bidirectional; lag +-grid/2
        share the grid's Nyquist tap equally, so the circular sum of the two is the grid's own kernel)."""
        if self.causal:
            response = self.response(device)
            fold = self.constant(("fold", self.grid, response.dtype, device),
                                 lambda: causal_fold(self.grid, response.dtype, device))
            return hilbert_causal_kernel(response, self.grid, fold)
        circular = torch.fft.irfft(self.response(device), n=self.grid, dim=0)
        half = self.grid // 2
        nyquist = circular[half: half + 1] / 2
        return torch.cat([nyquist, circular[half + 1:], circular[:half], nyquist])

    @property
    def fixed_support(self) -> int:
        """The kernel's largest lag, grid/2 (fixed: long inputs are convolved in overlap-save blocks)."""
        return self.grid // 2

    def layout(self, n: int, fft_len: int, device: torch.device, dtype: torch.dtype) -> torch.Tensor:
        """The kernel's lags that reach ``y[:n]``, in circular layout (fft_len, c): lag m at slot m mod fft_len."""
        half = self.grid // 2
        taps = min(half, n - 1)  # lags >= n never reach y[:n]
        kernel = self.kernel(device).to(dtype)
        if self.causal:
            return F.pad(kernel[: taps + 1], (0, 0, 0, fft_len - taps - 1))
        gap = kernel.new_zeros(fft_len - 2 * taps - 1, self.channels)
        return torch.cat([kernel[half: half + taps + 1], gap, kernel[half - taps: half]])

    def native_spectrum(self, reach: int, fft_len: int) -> bool:
        """Bidirectional inputs of at most grid/2 tokens convolved on the grid itself use the RPE output as is."""
        return fft_len == self.grid and reach < self.grid // 2 and not self.causal

    def spectrum(self, reach: int, fft_len: int, device: torch.device, dtype: torch.dtype) -> torch.Tensor:
        """rfft (fft_len // 2 + 1, c) of :meth:`layout` of the lags up to ``reach``."""
        if self.native_spectrum(reach, fft_len):
            return self.response(device).to(dtype.to_complex())  # the RPE output is the spectrum: no kernel FFT
        return torch.fft.rfft(self.layout(reach + 1, fft_len, device, dtype), dim=0)

    def taps(self, reach: int, device: torch.device, dtype: torch.dtype) -> torch.Tensor:
        """The kernel's lags 0..reach (causal) or -reach..reach (bidirectional), (rows, c), reach <= grid/2: what
        :meth:`layout` lays out circularly, without the zeros."""
        half = self.grid // 2
        kernel = as_dtype(self.kernel(device), dtype)
        return kernel[: reach + 1] if self.causal else kernel[half - reach: half + reach + 1]

    def causal_taps(self, n: int, device: torch.device) -> torch.Tensor:
        kernel = self.kernel(device)[:n]
        return torch.cat([kernel, kernel.new_zeros(n - kernel.shape[0], self.channels)])

    def ssm_kernel(self, length: int, device: torch.device) -> tuple[torch.Tensor, float]:
        return self.causal_taps(length, device), 1.0

    def kernel_support(self, device: torch.device) -> int:
        return self.grid // 2 + 1  # the causal kernel's lags 0 .. grid/2: a window of inputs decodes exactly

    def has_kernel_support(self) -> bool:
        return True  # a fixed support, whatever the weights
