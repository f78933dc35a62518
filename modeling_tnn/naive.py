"""Plain references of the model's fast operations, written straight from their definitions.

Every fast path (the FFT and direct convolutions, the GTU's fused gating, the hand-written norm backward) is checked
against these in the tests. They are slow (entry by entry, or dense matrices) and meant for small inputs only.
"""

from __future__ import annotations

import torch
import torch.nn.functional as F


def toeplitz_matrix(coefficients: torch.Tensor, n: int, causal: bool) -> torch.Tensor:
    """``T[c, i, j] = t_c(i - j)`` (channels, n, n), from kernel values at lags ``0..n-1`` (causal, zero at negative
    lags) or ``-(n-1)..n-1`` (bidirectional), given as (lags, channels); built entry by entry."""
    offset = 0 if causal else n - 1
    matrix = coefficients.new_zeros(coefficients.shape[1], n, n)
    for i in range(n):
        for j in range(n):
            lag = i - j
            if causal and lag < 0:
                continue
            matrix[:, i, j] = coefficients[lag + offset]
    return matrix


def toeplitz_matmul(x: torch.Tensor, coefficients: torch.Tensor, causal: bool) -> torch.Tensor:
    """``y[b, i, c] = sum_j T_c[i, j] x[b, j, c]`` for ``x`` (b, n, c), with :func:`toeplitz_matrix`."""
    return torch.einsum("cij,bjc->bic", toeplitz_matrix(coefficients, x.shape[1], causal), x)


def direct_convolution(x: torch.Tensor, taps: torch.Tensor, lag0: int) -> torch.Tensor:
    """``y[:, i] = sum_r taps[r] x[:, i - (r - lag0)]`` along dim 1 of ``x`` (b, n, c), over the positions inside
    the sequence; ``taps`` (rows, c), row r holding lag ``r - lag0`` (causal: ``lag0 = 0``), by loops."""
    n = x.shape[1]
    y = torch.zeros_like(x)
    for r in range(taps.shape[0]):
        lag = r - lag0
        for i in range(n):
            if 0 <= i - lag < n:
                y[:, i] += taps[r] * x[:, i - lag]
    return y


def simple_rms_norm(x: torch.Tensor, eps: float = 1e-8) -> torch.Tensor:
    """SimpleRMSNorm: ``x / (sqrt(mean(x^2)) + eps)`` over the last dimension, no parameters."""
    return x / (x.pow(2).mean(dim=-1, keepdim=True).sqrt() + eps)


def gtu_gate(u_pre: torch.Tensor, v_pre: torch.Tensor, mix, attention_mask: torch.Tensor | None = None
             ) -> torch.Tensor:
    """The GTU's gating around a token mixer ``mix``: ``silu(u_pre) * mix(silu(v_pre) * mask)``, the mask (b, n)
    zeroing padding positions of the mixer's input."""
    v = F.silu(v_pre)
    if attention_mask is not None:
        v = v * attention_mask[..., None].to(v.dtype)
    return F.silu(u_pre) * mix(v)


def glu(x: torch.Tensor, gate: torch.nn.Linear, up: torch.nn.Linear, down: torch.nn.Linear) -> torch.Tensor:
    """The GLU channel mixer ``down(silu(gate(x)) * up(x))``."""
    return down(F.silu(gate(x)) * up(x))
