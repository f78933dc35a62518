"""Plain references of the model's fast operations, written straight from their definitions.

Every operator of the ``ops_*`` modules (the FFT and direct convolutions, SKI's band plus low rank, the GTU's fused
gating, the fused RPE, the norm's hand-written backward) is checked against these in tests/ops. They are slow (entry
by entry, or dense matrices) and meant for small inputs only.
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


def rpe_mlp(positions: torch.Tensor, weights: list[torch.Tensor], biases: list[torch.Tensor], eps: float = 1e-8,
            scale: torch.Tensor | None = None) -> torch.Tensor:
    """The RPE MLP at ``positions`` (L,): ``Linear(1, r)``, then ``[SimpleRMSNorm, ReLU, Linear]`` per further layer
    (``weights[i]`` (out, in), ``biases[i]``), each output row times ``scale`` (L,) when given."""
    z = positions[:, None] * weights[0].t() + biases[0]
    for weight, bias in zip(weights[1:], biases[1:]):
        z = F.relu(simple_rms_norm(z, eps)) @ weight.t() + bias
    return z if scale is None else z * scale[:, None]


def masked_silu(pre: torch.Tensor, attention_mask: torch.Tensor | None = None) -> torch.Tensor:
    """``silu(pre)`` with the positions the mask (b, n) marks 0 zeroed: the GTU's mixer input."""
    v = F.silu(pre)
    return v if attention_mask is None else v * attention_mask[..., None].to(v.dtype)


def gtu_gate(u_pre: torch.Tensor, v_pre: torch.Tensor, mix, attention_mask: torch.Tensor | None = None
             ) -> torch.Tensor:
    """The GTU's gating around a token mixer ``mix``: ``silu(u_pre) * mix(silu(v_pre) * mask)``, the mask (b, n)
    zeroing padding positions of the mixer's input."""
    return F.silu(u_pre) * mix(masked_silu(v_pre, attention_mask))


def band_plus_low_rank(x: torch.Tensor, band: torch.Tensor, weights: torch.Tensor | None = None,
                       toeplitz: torch.Tensor | None = None) -> torch.Tensor:
    """SKI's operator ``y = band(x) + W K_r W^T x`` for ``x`` (b, n, c): ``band`` (c, k), k odd, a centred
    depthwise kernel (``y[:, i] += band[:, o] x[:, i + o - k//2]`` inside the sequence), ``weights`` W (b, n, r),
    ``toeplitz`` K_r (b or 1, c, r, r); by loops over the band and dense products for the low rank."""
    n, half = x.shape[1], band.shape[1] // 2
    y = torch.zeros_like(x)
    for o in range(band.shape[1]):
        for i in range(n):
            if 0 <= i + o - half < n:
                y[:, i] += band[:, o] * x[:, i + o - half]
    if toeplitz is None:
        return y
    inducing = torch.einsum("bnr,bnc->brc", weights, x)
    mixed = torch.einsum("bcij,bjc->bic", toeplitz.expand(x.shape[0], -1, -1, -1), inducing)
    return y + torch.einsum("bnr,brc->bnc", weights, mixed)


def glu(x: torch.Tensor, gate: torch.nn.Linear, up: torch.nn.Linear, down: torch.nn.Linear) -> torch.Tensor:
    """The GLU channel mixer ``down(silu(gate(x)) * up(x))``."""
    return down(F.silu(gate(x)) * up(x))
