"""The original TNN token mixer: a Toeplitz matrix whose coefficients an RPE MLP builds, with exponential decay,
applied by FFT in O(n log n)."""

from __future__ import annotations

import math

import torch
import torch.nn.functional as F

from .configuration_tnn import TnnConfig
from .mixer_base import TokenMixer
from .rpe import Rpe
from .runtime import as_dtype, compute_dtype, tracing

# float32's unit roundoff: kernel taps below it relative to the kernel's peak change no float32 output.
FLOAT32_RESOLUTION = 2.0**-24
# Longest support decoding keeps as a window or an exact SSM (per layer: that many inputs per channel).
MAX_SUPPORT = 16384


class DenseTno(TokenMixer):
    """Toeplitz neural operator: ``t_k = RPE(k) * gamma**|k|`` (``t_k = 0`` for ``k < 0`` when causal)."""

    # The kernel is as long as the input and its RPE costs little next to the FFTs: when the convolution recomputes
    # its spectra in backward, it rebuilds the taps too rather than keep them.
    rebuilds_taps = True

    def __init__(self, config: TnnConfig, channels: int):
        super().__init__(channels, causal=bool(config.causal), recompute_spectra=config.fft_recompute)
        self.gamma = float(config.decay_gamma)
        self.rpe = Rpe(config.rpe_dim, config.rpe_layers, channels)
        self._traced_support: int | None = None

    def rpe_values(self, lags: torch.Tensor) -> torch.Tensor:
        """The pre-decay kernel ``RPE(k)`` at integer ``lags`` (L,) -> (L, channels)."""
        return self.rpe(lags)

    def decayed(self, lags: torch.Tensor, keep: torch.Tensor | None = None) -> torch.Tensor:
        """Kernel values ``RPE(k) * gamma**|k|`` at integer ``lags`` (L,) -> (L, channels); zero where ``keep`` is
        False."""
        return self.rpe(lags, scale=self._decay(lags, keep))

    def _decay(self, lags: torch.Tensor, keep: torch.Tensor | None) -> torch.Tensor:
        decay = self.gamma ** lags.abs().to(self._rpe_dtype())
        return decay if keep is None else decay * keep

    def _rpe_dtype(self) -> torch.dtype:
        """What the RPE computes in (see :class:`Rpe`): float32, or float64 for float64 weights."""
        return compute_dtype(self.rpe.pos_proj.weight.dtype)

    def coefficients(self, n: int, device: torch.device) -> torch.Tensor:
        """Kernel values at lags ``0..n-1`` (causal) or ``-(n-1)..n-1`` (bidirectional), shape (lags, channels)."""
        # The lags (in the RPE's dtype: exact, integers below 2**24) and their decay, kept from call to call.
        lags, decay = self.constant(("lags", n, device, self._rpe_dtype(), self.gamma),
                                    lambda: self._lags_and_decay(n, device))
        return self.rpe(lags, scale=decay)

    def _lags_and_decay(self, n: int, device: torch.device) -> tuple[torch.Tensor, torch.Tensor]:
        lags = torch.arange(0 if self.causal else -(n - 1), n, device=device)
        return lags.to(self._rpe_dtype()), self._decay(lags, None)

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

    def taps(self, reach: int, device: torch.device, dtype: torch.dtype) -> torch.Tensor:
        """:meth:`coefficients` at lags up to ``reach`` (those of an input of ``reach + 1`` tokens), in ``dtype``."""
        return as_dtype(self.coefficients(reach + 1, device), dtype)

    def spectrum(self, reach: int, fft_len: int, device: torch.device, dtype: torch.dtype) -> torch.Tensor:
        """rfft of the circulant embedding of the kernel (:meth:`layout` of ``reach + 1`` tokens), (fft_len // 2 + 1,
        channels)."""
        return torch.fft.rfft(self.layout(reach + 1, fft_len, device, dtype), dim=0)

    def causal_taps(self, n: int, device: torch.device) -> torch.Tensor:
        return self.coefficients(n, device)

    def ssm_kernel(self, length: int, device: torch.device) -> tuple[torch.Tensor, float]:
        return self.rpe_values(torch.arange(length, device=device)), self.gamma

    def ssm_kernel_decay(self) -> float:
        return self.gamma

    def has_kernel_support(self) -> bool:
        return self.gamma < 1  # the decay bounds the support (kernel_support measures it)

    def modal_tail_rpe(self) -> Rpe | None:
        return self.rpe if self.gamma < 1 else None

    def kernel_support(self, device: torch.device) -> int | None:
        """The lag after which ``|RPE(k)| gamma**k`` stays below float32 resolution relative to the kernel's peak
        (None for ``gamma == 1``, or when that takes more than ``MAX_SUPPORT`` lags).

        ``gamma**k`` alone falls below float32's unit roundoff after ``log(eps) / log(gamma)`` lags (1,654 for 0.99).
        The RPE is bounded (its first stage normalises the lag's embedding, so it converges as the lag grows): its
        supremum over all later lags, read off dense lags up to twice that horizon and a geometric probe out to
        1e9, bounds the tail.
        """
        if self.gamma >= 1:
            return None
        if tracing():
            # Fake parameters have no values: the last support measured eagerly, else twice gamma's horizon (exact
            # unless the RPE's supremum exceeds 2**24 times the kernel's peak).
            return self._traced_support or 2 * self._horizon()
        self._traced_support = self.cached(("support", device), lambda: self._kernel_support(device))
        return self._traced_support

    def _horizon(self) -> int:
        return math.ceil(math.log(FLOAT32_RESOLUTION) / math.log(self.gamma))

    def _kernel_support(self, device: torch.device) -> int | None:
        horizon = self._horizon()
        if horizon > MAX_SUPPORT:
            return None
        dense = torch.arange(2 * horizon, device=device, dtype=torch.float64)
        probe = torch.logspace(math.log10(2 * horizon), 9, 64, device=device, dtype=torch.float64)
        with torch.no_grad():
            magnitude = self.rpe_values(torch.cat([dense, probe])).abs().amax(dim=1).to(torch.float64)
        far = magnitude[2 * horizon:].max()
        bound = torch.maximum(magnitude[: 2 * horizon].flip(0).cummax(0).values.flip(0), far)  # sup over k' >= k
        decay = self.gamma ** dense
        peak = (magnitude[: 2 * horizon] * decay).max()
        below = (bound * decay <= FLOAT32_RESOLUTION * peak).nonzero()
        return int(below[0]) if len(below) else None
