"""The short-sequence convolution: the product with each channel's dense (n, n) Toeplitz matrix, one batched
matmul, with a hand-written backward. Exact (no FFT rounding) and few operations for short inputs; when it runs is
ops_dispatch's choice (``ConvolutionPolicy.direct``)."""

from __future__ import annotations

import torch
import torch.nn.functional as F
from torch.autograd.function import once_differentiable


def _lag_rows(taps: torch.Tensor, n: int, lag0: int) -> torch.Tensor:
    """``r`` (c, 2n - 1) with ``r[:, k]`` the kernel at lag ``k - (n - 1)``, from ``taps`` (rows, c) whose row r holds
    lag ``r - lag0`` (zero at the lags the taps do not cover, taps beyond ``|lag| < n`` dropped)."""
    rows = taps.shape[0]
    low, high = max(0, lag0 - (n - 1)), min(rows, lag0 + n)
    before, after = (n - 1) - (lag0 - low), (n - 1) - (high - 1 - lag0)
    # Channel-major in memory (pad keeps its input's layout): the matrices built from it must be contiguous, else
    # bmm runs channel by channel.
    return F.pad(taps[low:high].t(), (before, after)).contiguous()


def _toeplitz_matrices(rows: torch.Tensor) -> torch.Tensor:
    """``M[c, i, j] = r[c, i - j + n - 1]`` (c, n, n) from ``rows`` (c, 2n - 1): a Hankel view (unfold) of the lags,
    its columns reversed, materialised in one copy."""
    n = (rows.shape[1] + 1) // 2
    return rows.unfold(1, n, 1).flip(2)


def _diagonal_sums(matrices: torch.Tensor) -> torch.Tensor:
    """The adjoint of :func:`_toeplitz_matrices`: ``s[c, k] = sum_{i - j = k - (n - 1)} A[c, i, j]`` (c, 2n - 1).

    Padding each row with n - 1 zeros on both sides and stepping one entry further per row lines the diagonals up
    as columns of a strided view (no index tensor, one reduction)."""
    c, n, _ = matrices.shape
    padded = F.pad(matrices, (n - 1, n - 1))
    width = 3 * n - 2
    diagonals = padded.as_strided((c, n, 2 * n - 1), (n * width, width + 1, 1))  # [c, i, k] = A[c, i, i + k - n + 1]
    return diagonals.sum(1).flip(1)


def _channel_major(x: torch.Tensor) -> torch.Tensor:
    """(b, n, c) -> (c, b, n) contiguous, as one 2-D transpose of (b * n, c): a copy through a 3-D permutation
    strides over c on every read and measured 10x slower."""
    b, n, c = x.shape
    return x.reshape(b * n, c).t().contiguous().view(c, b, n)


def _sequence_major(y: torch.Tensor) -> torch.Tensor:
    """The inverse of :func:`_channel_major`: (c, b, n) -> (b, n, c) contiguous."""
    c, b, n = y.shape
    return y.reshape(c, b * n).t().contiguous().view(b, n, c)


def direct_toeplitz_forward(x: torch.Tensor, taps: torch.Tensor, lag0: int, need_x: bool, need_taps: bool
                            ) -> tuple[torch.Tensor, torch.Tensor | None, torch.Tensor | None]:
    """:class:`_DirectToeplitz`'s forward: the output and what its backward needs, the input channel-major (c, b, n)
    where the taps need a gradient (``need_taps``) and the (c, n, n) matrices where the input does (``need_x``)."""
    channel_major = _channel_major(x)                                             # (c, b, n)
    matrices = _toeplitz_matrices(_lag_rows(taps, x.shape[1], lag0))
    y = torch.bmm(channel_major, matrices.transpose(1, 2))                         # (c, b, n)
    return _sequence_major(y), channel_major if need_taps else None, matrices if need_x else None


def direct_toeplitz_backward(grad: torch.Tensor, channel_major: torch.Tensor | None, matrices: torch.Tensor | None,
                             lag0: int, rows: int, need_x: bool, need_taps: bool
                             ) -> tuple[torch.Tensor | None, torch.Tensor | None]:
    """The gradients of :class:`_DirectToeplitz`'s input and ``rows`` taps (None where not needed) from that of its
    output, with what :func:`direct_toeplitz_forward` kept."""
    b, n, c = grad.shape
    grad_major = _channel_major(grad)                                              # (c, b, n)
    grad_x = grad_taps = None
    if need_x:
        grad_x = _sequence_major(torch.bmm(grad_major, matrices))
    if need_taps:
        lags = _diagonal_sums(torch.bmm(grad_major.transpose(1, 2), channel_major))  # (c, 2n - 1)
        low, high = max(0, lag0 - (n - 1)), min(rows, lag0 + n)
        start = (n - 1) - (lag0 - low)
        inside = lags[:, start: start + high - low].t()
        if high - low == rows:
            grad_taps = inside.contiguous()
        else:  # taps at lags no output reaches
            grad_taps = lags.new_zeros(rows, c)
            grad_taps[low:high] = inside
    return grad_x, grad_taps


class _DirectToeplitz(torch.autograd.Function):
    """``y[b, i, c] = sum_j t_c(i - j) x[b, j, c]`` as one batched product with the (n, n) Toeplitz matrix per
    channel, with a hand-written backward: the input gradient is the product with the transposed matrices, the
    kernel's the diagonal sums of ``g x^T``. Keeps the input (channel-major) and the matrices: rebuilding them in
    backward records ~19 operators (pad, flip and their views), and they weigh at most twice the input (the batch
    rule of ``ConvolutionPolicy.direct``) and its ``direct_max_entries`` floats."""

    @staticmethod
    def forward(ctx, x: torch.Tensor, taps: torch.Tensor, lag0: int) -> torch.Tensor:
        y, channel_major, matrices = direct_toeplitz_forward(x, taps, lag0, *ctx.needs_input_grad[:2])
        ctx.save_for_backward(channel_major, matrices)
        ctx.lag0, ctx.rows = lag0, taps.shape[0]
        return y

    @staticmethod
    @once_differentiable
    def backward(ctx, grad: torch.Tensor):
        return *direct_toeplitz_backward(grad, *ctx.saved_tensors, ctx.lag0, ctx.rows, *ctx.needs_input_grad[:2]), None


def direct_convolve(x: torch.Tensor, taps: torch.Tensor, lag0: int) -> torch.Tensor:
    """Per-channel convolution of ``x`` (b, n, c) with real ``taps`` (rows, c), row r holding lag ``r - lag0``, as a
    product with the dense (n, n) Toeplitz matrix of each channel: exact (no FFT rounding) and few operations, for
    short inputs (``ConvolutionPolicy.direct``). Lags with ``|lag| >= n`` reach no output and are ignored."""
    if not 0 <= lag0 < taps.shape[0]:
        raise ValueError(f"lag0: must lie in [0, rows) for a kernel of {taps.shape[0]} rows, got {lag0}")
    return _DirectToeplitz.apply(x, taps, lag0)
