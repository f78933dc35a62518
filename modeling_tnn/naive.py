"""Plain references of the model's fast operations, written straight from their definitions.

Each is named after its fast twin, ``naive_<twin>`` (``naive_silu_mask`` for ops_fused_gating.silu_mask,
``naive_sparse_plus_low_rank`` for ops_ski.sparse_plus_low_rank, ``naive_gtu_gate`` for tnn_block.Gtu.gate, ...), and
none is a copy of its twin's code: every operator of the ``ops_*`` modules (the FFT and direct convolutions, SKI's band
plus low rank, the GTU's fused gating, the fused RPE, the norm's hand-written backward) and every mixer is checked
against these in tests/ops and tests/mixers. They are slow (entry by entry, or dense matrices) and meant for small
inputs only.
"""

from __future__ import annotations

import torch
import torch.nn.functional as F


def naive_toeplitz_matrices(coefficients: torch.Tensor, n: int, causal: bool) -> torch.Tensor:
    """``T[c, i, j] = t_c(i - j)`` (channels, n, n), from kernel values at lags ``0..n-1`` (causal, zero at negative
    lags) or ``-(n-1)..n-1`` (bidirectional), given as (lags, channels); built entry by entry (twin:
    ops_direct_toeplitz._toeplitz_matrices)."""
    offset = 0 if causal else n - 1
    matrix = coefficients.new_zeros(coefficients.shape[1], n, n)
    for i in range(n):
        for j in range(n):
            lag = i - j
            if causal and lag < 0:
                continue
            matrix[:, i, j] = coefficients[lag + offset]
    return matrix


def naive_convolve(x: torch.Tensor, coefficients: torch.Tensor, causal: bool) -> torch.Tensor:
    """``y[b, i, c] = sum_j T_c[i, j] x[b, j, c]`` for ``x`` (b, n, c), with :func:`naive_toeplitz_matrices`: what
    ops_dispatch.convolve computes for a mixer's kernel (every mixer's reference in tests/mixers)."""
    return torch.einsum("cij,bjc->bic", naive_toeplitz_matrices(coefficients, x.shape[1], causal), x)


def naive_direct_convolve(x: torch.Tensor, taps: torch.Tensor, lag0: int) -> torch.Tensor:
    """``y[:, i] = sum_r taps[r] x[:, i - (r - lag0)]`` along dim 1 of ``x`` (b, n, c), over the positions inside
    the sequence; ``taps`` (rows, c), row r holding lag ``r - lag0`` (causal: ``lag0 = 0``), by loops: the reference
    of ops_direct_toeplitz.direct_convolve (same arguments) and of the FFT convolutions."""
    n = x.shape[1]
    y = torch.zeros_like(x)
    for r in range(taps.shape[0]):
        lag = r - lag0
        for i in range(n):
            if 0 <= i - lag < n:
                y[:, i] += taps[r] * x[:, i - lag]
    return y


def naive_rms_norm(x: torch.Tensor, eps: float = 1e-8) -> torch.Tensor:
    """SimpleRMSNorm: ``x / (sqrt(mean(x^2)) + eps)`` over the last dimension, no parameters (twin:
    ops_rms_norm.rms_norm)."""
    return x / (x.pow(2).mean(dim=-1, keepdim=True).sqrt() + eps)


def naive_fused_rpe(positions: torch.Tensor, weights: list[torch.Tensor], biases: list[torch.Tensor],
                    eps: float = 1e-8, scale: torch.Tensor | None = None) -> torch.Tensor:
    """The RPE MLP at ``positions`` (L,): ``Linear(1, r)``, then ``[SimpleRMSNorm, ReLU, Linear]`` per further layer
    (``weights[i]`` (out, in), ``biases[i]``), each output row times ``scale`` (L,) when given (twin:
    ops_fused_rpe.fused_rpe)."""
    z = positions[:, None] * weights[0].t() + biases[0]
    for weight, bias in zip(weights[1:], biases[1:]):
        z = F.relu(naive_rms_norm(z, eps)) @ weight.t() + bias
    return z if scale is None else z * scale[:, None]


def naive_silu_mask(pre: torch.Tensor, attention_mask: torch.Tensor | None = None) -> torch.Tensor:
    """``silu(pre)`` with the positions the mask (b, n) marks 0 set to zero: the GTU's mixer input (twin:
    ops_fused_gating.silu_mask, which multiplies by the mask instead)."""
    v = F.silu(pre)
    return v if attention_mask is None else torch.where(attention_mask[..., None] != 0, v, 0.0)


def naive_gtu_gate(u_pre: torch.Tensor, v_pre: torch.Tensor, mix, attention_mask: torch.Tensor | None = None
             ) -> torch.Tensor:
    """The GTU's gating around a token mixer ``mix``: ``silu(u_pre) * mix(silu(v_pre) * mask)``, the mask (b, n)
    zeroing padding positions of the mixer's input (twin: tnn_block.Gtu.gate, with ops_fused_gating's pieces)."""
    return F.silu(u_pre) * mix(naive_silu_mask(v_pre, attention_mask))


def naive_sparse_plus_low_rank(x: torch.Tensor, band: torch.Tensor, weights: torch.Tensor | None = None,
                               toeplitz: torch.Tensor | None = None) -> torch.Tensor:
    """SKI's operator ``y = band(x) + W K_r W^T x`` for ``x`` (b, n, c): ``band`` (c, k), k odd, a centred
    depthwise kernel (``y[:, i] += band[:, o] x[:, i + o - k//2]`` inside the sequence), ``weights`` W (b, n, r),
    ``toeplitz`` K_r (b or 1, c, r, r); by loops over the band and dense products for the low rank (twin:
    ops_ski.sparse_plus_low_rank)."""
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


def naive_glu(x: torch.Tensor, gate: torch.nn.Linear, up: torch.nn.Linear, down: torch.nn.Linear) -> torch.Tensor:
    """The GLU channel mixer ``down(silu(gate(x)) * up(x))`` (twin: tnn_block.Glu, its gate and up projections one
    Linear)."""
    return down(F.silu(gate(x)) * up(x))
