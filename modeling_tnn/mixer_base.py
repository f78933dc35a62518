"""The interface every token mixer implements, and what they share: precision rules, FFT sizes, the eval cache."""

from __future__ import annotations

from collections.abc import Callable, Hashable
from typing import Any

import torch
from torch import nn


def compute_dtype(dtype: torch.dtype) -> torch.dtype:
    """FFTs run in at least float32: half precision is upcast, float64 stays float64."""
    return torch.float64 if dtype == torch.float64 else torch.float32


def fft_length(n: int) -> int:
    """Smallest 2^a 3^b 5^c >= 2n: a linear (not circular) convolution of n samples with a kernel of lags
    -(n-1)..n-1 needs at least 2n - 1 points, and smooth sizes keep the FFT fast for any n."""
    target = 2 * n
    best = 1 << (target - 1).bit_length()
    p3 = 1
    while p3 < best:
        p35 = p3
        while p35 < best:
            size = p35
            while size < target:
                size *= 2
            best = min(best, size)
            p35 *= 5
        p3 *= 3
    return best


def fft_convolve(x: torch.Tensor, kernel_spectrum: torch.Tensor, fft_len: int) -> torch.Tensor:
    """Per-channel convolution of ``x`` (b, n, c) with a kernel given by its rfft (fft_len // 2 + 1, c)."""
    n = x.shape[1]
    x_f = torch.fft.rfft(x, n=fft_len, dim=1)
    return torch.fft.irfft(x_f * kernel_spectrum, n=fft_len, dim=1)[:, :n]


class TokenMixer(nn.Module):
    """Mixes a sequence along its length, per channel: ``y[:, i, c] = sum_j T_c[i, j] x[:, j, c]``.

    Subclasses implement :meth:`mix`. Inputs arrive with padding positions already zeroed; ``attention_mask``
    (b, n) is passed for mixers whose operator depends on each row's real length (SKI).

    In eval mode, kernel quantities that depend only on the weights and the length are memoised with
    :meth:`cached`, until a parameter changes (an optimizer step, ``load_state_dict``) or ``train()`` is called.
    """

    def __init__(self, channels: int, causal: bool):
        super().__init__()
        self.channels = channels
        self.causal = causal
        self._eval_cache: dict[Hashable, Any] = {}
        self._eval_cache_version: tuple = ()

    def forward(self, x: torch.Tensor, attention_mask: torch.Tensor | None = None) -> torch.Tensor:
        dtype = compute_dtype(x.dtype)
        with torch.autocast(device_type=x.device.type, enabled=False):
            y = self.mix(x.to(dtype), attention_mask)
        return y.to(x.dtype)

    def mix(self, x: torch.Tensor, attention_mask: torch.Tensor | None) -> torch.Tensor:
        raise NotImplementedError

    # -- recurrent decoding (causal mixers; see etsc_cache.py) ---------------------------------------------------
    #: Number of past inputs the exact decoding mode must keep: the kernel's support, or None when unbounded.
    decode_window: int | None = None

    def causal_taps(self, n: int, device: torch.device) -> torch.Tensor:
        """The causal kernel ``t_0 .. t_{n-1}`` (n, channels) the parallel path applies."""
        raise NotImplementedError(f"{type(self).__name__} has no causal recurrent form.")

    def ssm_kernel(self, length: int, device: torch.device) -> tuple[torch.Tensor, float]:
        """``(taps, gamma)`` with ``t_k = taps[k] * gamma**k`` for k < length: what ETSC converts into an SSM
        (the decay is folded into the SSM's eigenvalues, which is exact)."""
        raise NotImplementedError(f"{type(self).__name__} has no causal recurrent form.")

    # -- eval-mode memoisation -----------------------------------------------------------------------------------
    def train(self, mode: bool = True) -> "TokenMixer":
        self._eval_cache.clear()
        return super().train(mode)

    def _parameter_version(self) -> tuple:
        return tuple((p._version, p.data_ptr(), p.device, p.dtype) for p in self.parameters())

    def cached(self, key: Hashable, compute: Callable[[], Any]) -> Any:
        """``compute()``, memoised under ``key`` in eval mode without autograd; recomputed otherwise."""
        if self.training or torch.is_grad_enabled():
            return compute()
        version = self._parameter_version()
        if version != self._eval_cache_version:
            self._eval_cache.clear()
            self._eval_cache_version = version
        if key not in self._eval_cache:
            self._eval_cache[key] = compute()
        return self._eval_cache[key]
