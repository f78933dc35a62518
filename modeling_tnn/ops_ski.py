"""SKI's operator: a centred band (depthwise) convolution plus a low-rank Toeplitz term, ``y = band(x) + W K_r W^T
x``, as one autograd function with a hand-written backward, and the interpolation weights ``W``. Pure operators:
SKI's module (tno_ski.py) holds the parameters and builds ``K_r`` from its RPE."""

from __future__ import annotations

from typing import TYPE_CHECKING

import torch
import torch.nn.functional as F
from torch.autograd.function import once_differentiable

if TYPE_CHECKING:
    from .ops_input_map import InputMap

# Rows of the sequence per step of the band's weight gradient: its (kernel_size, rows, channels) accumulator stays
# in cache, and steps are few enough that dispatch costs little (64 measured best of 8..256 at n=16384).
WEIGHT_GRAD_ROWS = 64


def _depthwise(x: torch.Tensor, weight: torch.Tensor) -> torch.Tensor:
    """Centred depthwise convolution along dim 1 of (b, n, c) with ``weight`` (c, k), k odd.

    (b, n, c) is the channels-last layout of a (b, c, 1, n) image, so conv2d runs on it without any transpose
    (oneDNN's depthwise kernel on CPU).
    """
    image = x.permute(0, 2, 1).unsqueeze(2)
    y = F.conv2d(image, weight[:, None, None, :], padding=(0, weight.shape[1] // 2), groups=weight.shape[0])
    return y.squeeze(2).permute(0, 2, 1)


def _band_weight_grad(grad: torch.Tensor, x: torch.Tensor, kernel_size: int) -> torch.Tensor:
    """``dL/dw[c, o] = sum_{b,i} grad[b, i, c] * x[b, i + o - k//2, c]``, (c, k), for contiguous (b, n, c) inputs.

    conv2d's own weight gradient is slow on CPU for depthwise kernels. Rows whose window lies inside the sequence
    accumulate shifted products a few rows at a time (one fused multiply-add on a strided view of x, in cache) and
    reduce the rows once at the end; the few rows at either edge are summed directly. No padded copy of x.
    """
    b, n, c = x.shape
    half = kernel_size // 2
    if x.device.type != "cpu":
        return _band_weight_grad_by_offset(grad, x, kernel_size)
    total = x.new_zeros(kernel_size, c)
    inner_start, inner_stop = half, n - half
    if inner_stop > inner_start:
        rows = min(WEIGHT_GRAD_ROWS, inner_stop - inner_start)
        acc = x.new_zeros(kernel_size, rows, c)
        steps = range(inner_start, inner_stop - rows + 1, rows)
        for item in range(b):
            base = x.storage_offset() + item * n * c
            for start in steps:
                windows = x.as_strided((kernel_size, rows, c), (c, c, 1), base + (start - half) * c)
                acc.addcmul_(windows, grad[item, None, start: start + rows])
        total += acc.sum(1)
        done = steps[-1] + rows
        edges = [(0, inner_start), (done, n)]
    else:
        edges = [(0, n)]
    for lo, hi in edges:  # rows whose window may leave the sequence, or that do not fill a step
        for o in range(kernel_size):
            first, last = max(lo, half - o), min(hi, n + half - o)
            if last > first:
                shifted = x[:, first + o - half: last + o - half]
                total[o] += (grad[:, first:last] * shifted).sum((0, 1))
    return total.t()


def _band_weight_grad_by_offset(grad: torch.Tensor, x: torch.Tensor, kernel_size: int) -> torch.Tensor:
    """:func:`_band_weight_grad` as one product and reduction over the whole batch per offset: ``kernel_size``
    operations whatever the batch and length, for accelerators (on CPU the cache-blocked loop measured 2-8x
    faster: each offset here streams the whole activation)."""
    n = x.shape[1]
    half = kernel_size // 2
    total = x.new_empty(kernel_size, x.shape[2])
    for o in range(kernel_size):
        lo, hi = max(0, half - o), min(n, n + half - o)
        torch.sum(grad[:, lo:hi] * x[:, lo + o - half: hi + o - half], dim=(0, 1), out=total[o])
    return total.t()


def toeplitz_product(toeplitz: torch.Tensor, z: torch.Tensor) -> torch.Tensor:
    """``K_r z`` per channel: ``toeplitz`` (b, c, r, r), ``z`` (b, r, c) -> (b, r, c), one batched matmul over b*c
    (channel-major, so no per-channel copies). A shared ``toeplitz`` (1, c, r, r) multiplies every row at once, one
    (r, r) x (r, b) product per channel (broadcasting it would copy it b times)."""
    if toeplitz.shape[0] == 1 < z.shape[0]:
        return torch.bmm(toeplitz[0], z.permute(2, 1, 0)).permute(2, 1, 0)
    return torch.matmul(toeplitz, z.transpose(1, 2).unsqueeze(-1)).squeeze(-1).transpose(1, 2)


def sparse_plus_low_rank_forward(x: torch.Tensor, band: torch.Tensor, weights: torch.Tensor | None,
                                 toeplitz: torch.Tensor | None, input_map: InputMap | None = None
                                 ) -> tuple[torch.Tensor, torch.Tensor | None]:
    """:class:`_SparsePlusLowRank`'s forward: the output and the inducing values ``W^T x`` (b, r, c) its backward
    needs (None without a low-rank term)."""
    if input_map is not None:  # x is a pre-image: mix input_map(x), keep x alone
        x = input_map(x)
    y = _depthwise(x, band)
    inducing = None
    if toeplitz is not None:
        inducing = torch.bmm(weights.transpose(1, 2), x)                                # (b, r, c)
        y.baddbmm_(weights, toeplitz_product(toeplitz, inducing))
    return y, inducing


def sparse_plus_low_rank_backward(grad: torch.Tensor, pre: torch.Tensor, band: torch.Tensor,
                                  weights: torch.Tensor | None, toeplitz: torch.Tensor | None,
                                  inducing: torch.Tensor | None, input_map: InputMap | None, need_x: bool,
                                  need_band: bool, need_toeplitz: bool
                                  ) -> tuple[torch.Tensor | None, torch.Tensor | None, torch.Tensor | None]:
    """The gradients of :class:`_SparsePlusLowRank`'s input, band and ``K_r`` (None where not needed) from that of
    its output, with its input (the pre-image under an ``input_map``) and what :func:`sparse_plus_low_rank_forward`
    returned besides the output."""
    x = input_map(pre) if input_map is not None and need_band else pre
    grad = grad.contiguous()
    grad_x = _depthwise(grad, band.flip(1)) if need_x else None
    grad_band = _band_weight_grad(grad, x, band.shape[1]) if need_band else None
    grad_toeplitz = None
    if toeplitz is not None and (need_x or need_toeplitz):
        grad_mixed = torch.bmm(weights.transpose(1, 2), grad)                             # (b, r, c)
        if need_toeplitz and toeplitz.shape[0] == 1 < grad_mixed.shape[0]:  # one K_r shared by the batch
            grad_toeplitz = torch.einsum("bic,bjc->cij", grad_mixed, inducing)[None]
        elif need_toeplitz:
            grad_toeplitz = grad_mixed.transpose(1, 2).unsqueeze(-1) * inducing.transpose(1, 2).unsqueeze(-2)
        if need_x:
            grad_x.baddbmm_(weights, toeplitz_product(toeplitz.transpose(-1, -2), grad_mixed))
    if input_map is not None and need_x:  # back through x = input_map(pre)
        grad_x = input_map.backward(grad_x, pre)
    return grad_x, grad_band, grad_toeplitz


class _SparsePlusLowRank(torch.autograd.Function):
    """``y = band(x) + W (K_r (W^T x))`` in one function, so that forward and backward each write one activation-
    sized tensor (the low-rank term is accumulated in place) and the band uses fast kernels: the input gradient is
    the convolution with the flipped kernel, the weight gradient :func:`_band_weight_grad`. ``W`` carries no
    gradient; ``toeplitz`` (b, c, r, r) may be None for the band alone. With an ``input_map`` it mixes
    ``input_map(x)`` and keeps ``x`` alone (see ops_fft_convolution)."""

    @staticmethod
    def forward(ctx, x: torch.Tensor, band: torch.Tensor, weights: torch.Tensor | None,
                toeplitz: torch.Tensor | None, input_map: InputMap | None = None) -> torch.Tensor:
        y, inducing = sparse_plus_low_rank_forward(x, band, weights, toeplitz, input_map)
        ctx.save_for_backward(x, band, weights, toeplitz, inducing)
        ctx.input_map = input_map
        return y

    @staticmethod
    @once_differentiable
    def backward(ctx, grad: torch.Tensor):
        need_x, need_band, _, need_toeplitz = ctx.needs_input_grad[:4]
        grad_x, grad_band, grad_toeplitz = sparse_plus_low_rank_backward(
            grad, *ctx.saved_tensors, ctx.input_map, need_x, need_band, need_toeplitz)
        return grad_x, grad_band, None, grad_toeplitz, None


def interpolation_weights(lengths: torch.Tensor, n: int, rank: int, dtype: torch.dtype,
                          offsets: torch.Tensor | None = None) -> torch.Tensor:
    """Linear-interpolation matrix (b, n, r) from the positions of each row to its ``rank`` inducing points.

    Row ``b`` has real tokens at slots ``offsets[b] .. offsets[b] + lengths[b] - 1``; other slots get zero rows.
    """
    device = lengths.device
    slots = torch.arange(n, device=device, dtype=dtype)
    start = torch.zeros_like(lengths) if offsets is None else offsets
    positions = slots[None, :] - start[:, None].to(dtype)                       # (b, n), position within the row
    spacing = (lengths.to(dtype) - 1).clamp(min=0) / (rank - 1)                  # (b,)
    scaled = positions / spacing.clamp(min=torch.finfo(dtype).tiny)[:, None]
    scaled = torch.where(spacing[:, None] > 0, scaled, torch.zeros_like(scaled))
    lower = scaled.floor().clamp(0, rank - 2)
    frac = (scaled - lower).clamp(0, 1)
    valid = ((positions >= 0) & (positions <= (lengths[:, None] - 1))).to(dtype)
    weights = torch.zeros(*positions.shape, rank, device=device, dtype=dtype)
    index = lower.long()[..., None]
    weights.scatter_add_(2, index, ((1 - frac) * valid)[..., None])
    weights.scatter_add_(2, index + 1, (frac * valid)[..., None])
    return weights


def inducing_toeplitz(kernel: torch.Tensor) -> torch.Tensor:
    """``K_r`` (b, c, r, r) with ``K_r[b, c, i, j] = kernel[b, i - j + r - 1, c]``, from the kernel at the inducing
    lags ``-(r-1) .. r-1``, (b, 2r - 1, c)."""
    r = (kernel.shape[1] + 1) // 2
    index = torch.arange(r, device=kernel.device)[:, None] - torch.arange(r, device=kernel.device)[None, :]
    return kernel.transpose(1, 2)[..., index + r - 1]


def sparse_plus_low_rank(x: torch.Tensor, band: torch.Tensor, weights: torch.Tensor | None = None,
                         toeplitz: torch.Tensor | None = None, input_map: InputMap | None = None) -> torch.Tensor:
    """``band(x) + W (K_r (W^T x))`` for ``x`` (b, n, c): ``band`` (c, k) a centred depthwise kernel of odd width,
    ``weights`` ``W`` (b, n, r) (no gradient), ``toeplitz`` ``K_r`` (b or 1, c, r, r), both None for the band alone;
    ``input_map`` as in :func:`ops_fft_convolution.fft_convolve`."""
    return _SparsePlusLowRank.apply(x.contiguous(), band, weights, toeplitz, input_map)
