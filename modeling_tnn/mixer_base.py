"""The interface every token mixer implements, and what they share: precision rules, FFT sizes, the eval cache."""

from __future__ import annotations

from collections.abc import Callable, Hashable
from typing import Any

import torch
import torch.nn.functional as F
from torch import nn
from torch.autograd.function import once_differentiable

from .ops_fft_sizes import fft_length, smooth_size  # noqa: F401  (re-exported for the mixers)
from .runtime import as_dtype, compute_dtype, tracing  # noqa: F401


# Elements of one channel chunk's window buffer on CPU. The convolution runs chunk by chunk over the channels
# so that its FFT buffers are reused from the allocator (a fresh buffer of the full activation size costs page
# faults) and stay in cache between the transpose, the FFT, the product and the inverse FFT.
CHUNK_ELEMENTS = 1 << 19
CHUNK_ALIGN = 16  # whole 64-byte lines of float32 channels per row when chunks are cut out of (b, n, c)


def _onesided_weights(fft_len: int, dtype: torch.dtype, device: torch.device) -> torch.Tensor:
    """How often each rfft bin counts in the full spectrum, over fft_len: 1 at DC (and Nyquist), else 2."""
    weights = torch.full((fft_len // 2 + 1,), 2.0 / fft_len, dtype=dtype, device=device)
    weights[0] = 1.0 / fft_len
    if fft_len % 2 == 0:
        weights[-1] = 1.0 / fft_len
    return weights


def _chunk_channels(x: torch.Tensor, per_channel: int) -> int:
    """Channels per chunk: the whole tensor off CPU, else what fits the chunk budget (whole cache lines)."""
    channels = x.shape[-1]
    if x.device.type != "cpu":
        return channels
    fit = CHUNK_ELEMENTS // max(per_channel, 1) // CHUNK_ALIGN * CHUNK_ALIGN
    return min(channels, max(CHUNK_ALIGN, fit))


def _fill_windows(out: torch.Tensor, x: torch.Tensor, channels: slice, step: int, offset: int) -> torch.Tensor:
    """``out`` (b, k, blocks, M) <- the windows of ``x[:, :, channels]`` (b, n, c): window j holds
    ``x[j * step - offset + u]`` at slot u, zero outside the sequence."""
    b, n, c = x.shape
    k, blocks, size = out.shape[1:]
    # Windows that lie inside the sequence are one strided view of x; the first and last few touch the edges.
    first = -(-offset // step)
    last = min(blocks, (n + offset - size) // step + 1)
    if last > first:
        start = first * step - offset
        inner = x.as_strided((b, k, last - first, size), (n * c, 1, step * c, c),
                             x.storage_offset() + start * c + channels.start)
        out[:, :, first:last].copy_(inner)
    for j in [*range(0, min(first, blocks)), *range(max(last, first, 0), blocks)]:
        start = j * step - offset
        lo, hi = max(start, 0), min(start + size, n)
        window = out[:, :, j]
        if hi <= lo:
            window.zero_()
            continue
        window[..., : lo - start].zero_()
        window[..., hi - start:].zero_()
        window[..., lo - start: hi - start].copy_(x[:, lo:hi, channels].transpose(1, 2))
    return out


def _staged(stage: torch.Tensor | None, source: torch.Tensor, channels: slice) -> tuple[torch.Tensor, slice]:
    """``source[..., channels]`` as a contiguous tensor in the front of the flat buffer ``stage`` (row copies), and
    the channels to read from it; ``source`` itself when ``stage`` is None.

    The windows and kernel layouts read a channel chunk transposed. Straight out of the full width that read misses
    cache on every element (one row of c channels apart); out of the contiguous chunk of k channels it streams:
    measured 4x faster for the copy (8192 x 32 of 768 channels), which is most of it back from the FFTs' time.
    """
    if stage is None:
        return source, channels
    k = channels.stop - channels.start
    shape = (*source.shape[:-1], k)
    out = stage[: source[..., :1].numel() * k].view(shape)
    return out.copy_(source[..., channels]), slice(0, k)


def _place_kernel(buffer: torch.Tensor, kernel: torch.Tensor, channels: slice, lag0: int,
                  stage: torch.Tensor | None = None) -> torch.Tensor:
    """``buffer`` (k, fft_len) <- the circular layout of ``kernel[:, channels]`` (L, c), whose row r holds lag
    ``r - lag0``: lag m at slot m mod fft_len, zero at the slots no row reaches."""
    fft_len, rows = buffer.shape[1], kernel.shape[0]
    kernel, channels = _staged(stage, kernel, channels)
    taps = kernel[:, channels].t()
    buffer[:, : rows - lag0].copy_(taps[:, lag0:])
    buffer[:, rows - lag0: fft_len - lag0].zero_()
    if lag0:
        buffer[:, fft_len - lag0:].copy_(taps[:, :lag0])
    return buffer


def _gather_kernel_grad(out: torch.Tensor, circular: torch.Tensor, channels: slice, lag0: int) -> None:
    """``out[:, channels]`` (L, c) <- the gradient of the compact kernel from that of its circular layout
    (k, fft_len): the adjoint of :func:`_place_kernel`."""
    fft_len, rows = circular.shape[1], out.shape[0]
    out[lag0:, channels].copy_(circular[:, : rows - lag0].t())
    if lag0:
        out[:lag0, channels].copy_(circular[:, fft_len - lag0:].t())


class _BlockConvolution(torch.autograd.Function):
    """Overlap-save convolution along dim 1 of (b, n, c), channel chunk by channel chunk, with a hand-written
    backward: one rfft of the zero-padded output gradient serves both the input gradient (one irfft, then
    overlap-add) and the kernel gradient (its product with the input spectra).

    The kernel is real, (L, c) with row r holding lag ``r - lag0`` (its circular layout is built chunk by chunk, in
    cache), or a complex spectrum (fft_len // 2 + 1, c). With ``recompute`` the function saves only its real inputs
    and recomputes the input and kernel spectra in backward (two more FFTs per chunk, half the saved bytes: a
    spectrum of fft_len // 2 + 1 complex values per channel weighs about twice its n real inputs); otherwise it keeps
    the spectra of the forward.
    """

    @staticmethod
    def forward(ctx, x: torch.Tensor, kernel: torch.Tensor, fft_len: int, step: int, offset: int, lag0: int,
                recompute: bool, rebuild: Callable[[], torch.Tensor] | None, activate: bool,
                mask: torch.Tensor | None) -> torch.Tensor:
        pre = x
        if activate:  # x is a pre-activation: convolve silu(x) * mask, keep x alone for backward
            x = _activation(pre, mask).contiguous()
        b, n, c = x.shape
        blocks = -(-n // step)
        chunk = _chunk_channels(x, b * blocks * fft_len)
        windows = x.new_empty(b, chunk, blocks, fft_len)
        spectral = kernel.is_complex()
        placed = None if spectral else x.new_empty(chunk, fft_len)
        stage = x.new_empty(max(b * n, kernel.shape[0]) * chunk) if chunk < c else None
        y = x.new_empty(b, n, c)
        keep = ctx.needs_input_grad[1] and not recompute  # the input spectra, for the kernel gradient
        input_spectra, kernel_spectra = [], []
        for start in range(0, c, chunk):
            channels = slice(start, min(c, start + chunk))
            k = channels.stop - start
            kernel_f = _chunk_spectrum(kernel, channels, lag0, None if spectral else placed[:k], stage)
            x_f = torch.fft.rfft(_fill_windows(windows[:, :k], *_staged(stage, x, channels), step, offset), dim=-1)
            if keep:
                input_spectra.append(x_f)
                y_f = x_f * kernel_f[:, None]
            else:
                y_f = x_f.mul_(kernel_f[:, None])
            if not recompute and not spectral:
                kernel_spectra.append(kernel_f)
            out = torch.fft.irfft(y_f, n=fft_len, dim=-1)[..., offset: offset + step]
            y[:, :, channels].copy_(out.reshape(b, k, blocks * step)[..., :n].transpose(1, 2))
        kept = pre if activate else (x if recompute and ctx.needs_input_grad[1] else None)
        if recompute:
            # With ``rebuild`` the kernel is not kept either: backward calls it for the same values.
            ctx.save_for_backward(kept, kernel if rebuild is None or spectral else None, mask)
            ctx.rebuild = rebuild
        else:
            ctx.save_for_backward(kept, kernel if spectral else None, mask, *kernel_spectra, *input_spectra)
        ctx.geometry = (n, fft_len, step, offset, chunk, kernel.shape[0], lag0, recompute, spectral, activate)
        return y

    @staticmethod
    @once_differentiable
    def backward(ctx, grad: torch.Tensor):
        n, fft_len, step, offset, chunk, rows, lag0, recompute, spectral, activate = ctx.geometry
        b, _, c = grad.shape
        chunks = -(-c // chunk)
        saved = ctx.saved_tensors  # unpacked once: activation checkpointing allows no second unpacking
        pre, kernel, mask = saved[:3]
        x = pre
        need_x, need_kernel = ctx.needs_input_grad[:2]
        if activate and recompute and need_kernel:
            x = _activation(pre, mask).contiguous()
        if recompute and kernel is None and need_x:
            with torch.no_grad():
                kernel = ctx.rebuild()
        kernel_spectra = saved[3: 3 + chunks] if not recompute and not spectral else None
        input_spectra = saved[3 + (0 if spectral or recompute else chunks):]
        blocks = -(-n // step)
        grad_x = grad.new_empty(b, n, c) if need_x else None
        grad_kernel = None
        if need_kernel:
            if spectral:
                grad_kernel = grad.new_empty((fft_len // 2 + 1, c), dtype=grad.dtype.to_complex())
                weights = _onesided_weights(fft_len, grad.dtype, grad.device)
            else:
                grad_kernel = grad.new_empty(rows, c)
        if recompute:
            windows = grad.new_empty(b, chunk, blocks, fft_len) if need_kernel else None
            placed = None if spectral else grad.new_empty(chunk, fft_len)
        # Each window's output gradient sits at slots offset .. offset + step - 1, zero elsewhere.
        padded = grad.new_zeros(b, chunk, blocks, fft_len)
        stage = grad.new_empty(max(b * n, rows) * chunk) if chunk < c else None
        whole, rest = divmod(n, step)
        spans = -(-fft_len // step)  # how many blocks of x one window overlaps
        if need_x and blocks > 1:
            summed = grad.new_empty(b, chunk, blocks + spans, step)
        for index, start in enumerate(range(0, c, chunk)):
            channels = slice(start, min(c, start + chunk))
            k = channels.stop - start
            g, inside = _staged(stage, grad, channels)
            g = g[:, :, inside].transpose(1, 2)                                        # (b, k, n)
            slots = padded[:, :k, :, offset: offset + step]
            if whole:
                slots[:, :, :whole].copy_(g[..., : whole * step].reshape(b, k, whole, step))
            if rest:
                slots[:, :, whole, :rest].copy_(g[..., whole * step:])
            g_f = torch.fft.rfft(padded[:, :k], dim=-1)
            if need_kernel:
                # Correlation of the output gradient with the input, per bin: conj(X) G summed over batch and blocks
                # (reducing dims 0 and 2 at once is slow). Its irfft is the gradient of the time-domain kernel; the
                # spectrum's (PyTorch's convention for complex inputs) weighs each bin as irfft counts it.
                if recompute:
                    x_f = torch.fft.rfft(_fill_windows(windows[:, :k], *_staged(stage, x, channels), step, offset),
                                         dim=-1)
                    product = x_f.conj_physical_().mul_(g_f)
                else:
                    product = input_spectra[index].conj_physical().mul_(g_f)
                if blocks == 1:  # a sum over the size-1 block dim still fills and copies a whole output
                    product = product[0, :, 0] if b == 1 else product[:, :, 0].sum(0)              # (k, F)
                else:
                    product = product.sum(2).sum(0)
                if spectral:
                    grad_kernel[:, channels] = (product * weights).t()
                else:
                    _gather_kernel_grad(grad_kernel, torch.fft.irfft(product, n=fft_len, dim=-1), channels, lag0)
            if need_x:
                if recompute:
                    kernel_f = _chunk_spectrum(kernel, channels, lag0, None if spectral else placed[:k], stage)
                else:
                    kernel_f = kernel[:, channels].t() if spectral else kernel_spectra[index]
                # The adjoint of a convolution is the correlation with the same kernel: multiply by conj(K).
                window_grad = torch.fft.irfft(g_f.mul_(kernel_f.conj()[:, None]), n=fft_len, dim=-1)
                if blocks == 1:
                    source = window_grad[:, :, 0, offset: offset + n]
                else:  # overlap-add the window gradients back onto the sequence
                    acc = summed[:, :k]
                    acc.zero_()
                    for span in range(spans):
                        width = min(step, fft_len - span * step)
                        acc[:, :, span: span + blocks, :width] += window_grad[..., span * step: span * step + width]
                    source = acc.view(b, k, -1)[..., offset: offset + n]
                grad_x[:, :, channels].copy_(source.transpose(1, 2))
        if activate and need_x:  # back through x = silu(source) * mask, as autograd would
            if mask is not None:
                grad_x.mul_(mask[..., None].to(grad_x.dtype))
            grad_x = torch.ops.aten.silu_backward(grad_x, pre)
        return grad_x, grad_kernel, None, None, None, None, None, None, None, None


# Most channel chunks' worth (CHUNK_ELEMENTS each) of (batch x fft_len x channels) a CPU input may have for
# :class:`_SingleBlockConvolution` (off CPU it serves every single block). 0: none on CPU. Per mixer it takes
# 0.9-1.06x the chunked convolution's time up to about four chunks (one thread) with a third of its operators (116
# against 377 aten events at 12 x 64 x 384), and 1.5-2.6x beyond (its FFTs along the strided sequence dimension fall
# out of cache); but in a whole training step at the small-GPT size (12 x 64, width 128) four chunks measured 5-8%
# slower than none (bench_training.py --suite small_gpt, three A/B pairs). CPU time is what counts on CPU; the
# operator count is what carries over to accelerators, where it applies.
SINGLE_BLOCK_CHUNKS = 0


class _SingleBlockConvolution(torch.autograd.Function):
    """One zero-padded FFT of the whole sequence (all channels at once, along dim 1 of (b, n, c)) with real taps
    (L, c) whose row r holds lag ``r - lag0``: the taps at slots 0..L-1 make the circular product's outputs
    ``lag0 .. lag0 + n - 1`` the convolution's (exact when ``n + L - 1 - lag0 <= fft_len`` and ``lag0 + n <= fft_len``:
    no wrapped term reaches them). No window, staging or layout buffers: rfft's ``n`` pads. Backward correlates:
    the output gradient placed at ``lag0`` is transformed once and serves both gradients. Keeps both spectra."""

    @staticmethod
    def forward(ctx, x: torch.Tensor, taps: torch.Tensor, fft_len: int, lag0: int) -> torch.Tensor:
        n = x.shape[1]
        x_f = torch.fft.rfft(x, n=fft_len, dim=1)
        kernel_f = torch.fft.rfft(taps, n=fft_len, dim=0)
        y = torch.fft.irfft(x_f * kernel_f, n=fft_len, dim=1)[:, lag0: lag0 + n]
        ctx.save_for_backward(x_f if ctx.needs_input_grad[1] else None, kernel_f)
        ctx.geometry = (n, taps.shape[0], fft_len, lag0)
        return y.contiguous()

    @staticmethod
    @once_differentiable
    def backward(ctx, grad: torch.Tensor):
        x_f, kernel_f = ctx.saved_tensors
        n, rows, fft_len, lag0 = ctx.geometry
        grad_f = torch.fft.rfft(F.pad(grad, (0, 0, lag0, 0)) if lag0 else grad, n=fft_len, dim=1)
        grad_taps = grad_x = None
        if ctx.needs_input_grad[1]:
            grad_taps = torch.fft.irfft((x_f.conj() * grad_f).sum(0), n=fft_len, dim=0)[:rows]
        if ctx.needs_input_grad[0]:
            grad_x = torch.fft.irfft(grad_f.mul_(kernel_f.conj()), n=fft_len, dim=1)[:, :n]
        return grad_x, grad_taps, None, None


def _chunk_spectrum(kernel: torch.Tensor, channels: slice, lag0: int = 0, placed: torch.Tensor | None = None,
                    stage: torch.Tensor | None = None) -> torch.Tensor:
    """The spectrum (k, F) of some channels of a kernel given as a spectrum (F, c) or as real taps (L, c) whose
    row r holds lag ``r - lag0``, laid out circularly in ``placed`` (k, fft_len)."""
    if kernel.is_complex():
        return kernel[:, channels].t().contiguous()
    return torch.fft.rfft(_place_kernel(placed, kernel, channels, lag0, stage), dim=-1)


# Saved input spectra above this many bytes are recomputed in backward instead (``recompute=None``): below it the
# two extra FFTs cost more than the memory is worth; above it the saved spectra dominate a layer's training memory.
RECOMPUTE_BYTES = 1 << 26


def fft_convolve(x: torch.Tensor, kernel: torch.Tensor, fft_len: int, step: int | None = None,
                 offset: int = 0, lag0: int | None = None, recompute: bool | None = None,
                 rebuild: Callable[[], torch.Tensor] | None = None, activate: bool = False,
                 mask: torch.Tensor | None = None) -> torch.Tensor:
    """Per-channel convolution of ``x`` (b, n, c) with a real kernel, given as real taps (L, c) whose row r holds
    lag ``r - lag0`` (``lag0=None``: the whole circular layout (fft_len, c), lag m at slot m mod fft_len), or as the
    rfft of that circular layout (fft_len // 2 + 1, c).

    With ``step=None`` the whole sequence is one FFT block (exact when the kernel's lags m satisfy
    n + |m| <= fft_len). Otherwise overlap-save: block j computes outputs ``j*step .. j*step + step - 1`` from the
    window of x starting at ``j*step - offset``; exact for kernels with lags in ``[offset + step - fft_len, offset]``.
    Pass real taps when training: their FFT and the FFT of their gradient then run in cache-sized chunks.

    ``recompute``: save only ``x`` and the real kernel for backward and recompute their spectra there (True), keep
    the forward's spectra (False), or decide by size (None: recompute once the input spectra would exceed
    ``RECOMPUTE_BYTES``). Outputs and gradients are the same either way. ``rebuild``, when recomputing: a function
    returning the real kernel's values again (without autograd), so that backward keeps no copy of the kernel either
    (the dense kernel has as many rows as the input; its RPE costs little next to the FFTs).

    ``activate``: ``x`` is a pre-activation and the convolution applies to ``silu(x) * mask[..., None]`` (``mask``
    (b, n) or None), keeping only ``x`` for backward (the activation is recomputed there), where a separate silu
    would keep ``x`` and the convolution its output.
    """
    n = x.shape[1]
    step = n if step is None else step
    if lag0 is None:
        lag0 = 0
        if not kernel.is_complex() and kernel.shape[0] != fft_len:
            raise ValueError(f"kernel: a circular layout needs fft_len={fft_len} rows, got {kernel.shape[0]}; "
                             "pass lag0 for compact taps")
    if not kernel.is_complex() and not (0 <= lag0 < kernel.shape[0] <= fft_len):
        raise ValueError(f"lag0: must lie in [0, rows) for a kernel of at most fft_len={fft_len} rows, got "
                         f"lag0={lag0} for {kernel.shape[0]} rows")
    if not kernel.is_complex() and not activate and single_block(x, fft_len, step, recompute):
        return _SingleBlockConvolution.apply(x, kernel, fft_len, lag0)
    recompute = _resolve_recompute(x, fft_len, step, recompute)
    # A pre-activation stays as given (the GTU's is a view of its fused projection, which the gate keeps alive
    # anyway): a contiguous copy saved for backward would be one activation more per layer.
    return _BlockConvolution.apply(x if activate else x.contiguous(), kernel, fft_len, step, offset, lag0,
                                   bool(recompute), rebuild, activate, mask)


def _resolve_recompute(x: torch.Tensor, fft_len: int, step: int | None, recompute: bool | None) -> bool:
    """``recompute`` as given, or (None) whether the input spectra would exceed ``RECOMPUTE_BYTES``."""
    if recompute is not None:
        return recompute
    blocks = -(-x.shape[1] // (step or x.shape[1]))
    return x.shape[0] * blocks * (fft_len // 2 + 1) * x.shape[2] * 2 * x.element_size() > RECOMPUTE_BYTES


def single_block(x: torch.Tensor, fft_len: int, step: int | None, recompute: bool | None) -> bool:
    """Whether :func:`fft_convolve` of ``x`` with real taps (not activated) runs as :class:`_SingleBlockConvolution`:
    one block (``step`` None or n) whose spectra are kept, of at most ``SINGLE_BLOCK_CHUNKS`` channel chunks on CPU.
    Mixers ask it in eval mode too, to convolve with the same taps (not a memoised spectrum) there: eval and
    training outputs then agree bitwise."""
    n = x.shape[1]
    if (step or n) != n or _resolve_recompute(x, fft_len, step, recompute):
        return False
    return x.device.type != "cpu" or x.shape[0] * fft_len * x.shape[2] <= SINGLE_BLOCK_CHUNKS * CHUNK_ELEMENTS


def _activation(pre: torch.Tensor, mask: torch.Tensor | None) -> torch.Tensor:
    """``silu(pre) * mask[..., None]``, the GTU's mixer input, with the same operations as the GTU."""
    x = F.silu(pre)
    return x if mask is None else x * mask[..., None].to(x.dtype)


# -- the short-sequence path: the Toeplitz matrix itself, one batched product per channel ------------------------

# Longest input the direct product serves (longer ones go through the FFT) and the most (channels x n x n) entries
# of the Toeplitz matrices it may build: measured in run_scripts/bench_token_mixers.py --direct (docs/training-speed.md).
DIRECT_MAX_LENGTH = 96
DIRECT_MAX_ENTRIES = 1 << 22
# ... and the fewest batch rows per token of the sequence (see use_direct).
DIRECT_MIN_BATCH_PER_TOKEN = 0.5


def use_direct(batch: int, n: int, channels: int) -> bool:
    """Whether a (batch, n, channels) input is mixed by :func:`direct_convolve`: short enough, and with a batch of at
    least n / 2 rows, so that the (channels, n, n) matrices it builds and reduces in backward weigh at most about
    twice the activations (measured at 384 channels: at n = 64 the FFT path is 1.2-1.7x faster at batch 12 and
    1.4x slower at batch 128; at n = 32 and batch 24 it is 1.1-1.4x slower)."""
    return (n <= DIRECT_MAX_LENGTH and batch >= DIRECT_MIN_BATCH_PER_TOKEN * n
            and channels * n * n <= DIRECT_MAX_ENTRIES)


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


class _DirectToeplitz(torch.autograd.Function):
    """``y[b, i, c] = sum_j t_c(i - j) x[b, j, c]`` as one batched product with the (n, n) Toeplitz matrix per
    channel, with a hand-written backward: the input gradient is the product with the transposed matrices, the
    kernel's the diagonal sums of ``g x^T``. Keeps the input (channel-major) and the matrices: rebuilding them in
    backward records ~19 operators (pad, flip and their views), and they weigh at most twice the input (the batch
    rule of :func:`use_direct`) and ``DIRECT_MAX_ENTRIES`` floats."""

    @staticmethod
    def forward(ctx, x: torch.Tensor, taps: torch.Tensor, lag0: int) -> torch.Tensor:
        channel_major = _channel_major(x)                                             # (c, b, n)
        matrices = _toeplitz_matrices(_lag_rows(taps, x.shape[1], lag0))
        y = torch.bmm(channel_major, matrices.transpose(1, 2))                         # (c, b, n)
        ctx.save_for_backward(channel_major if ctx.needs_input_grad[1] else None,
                              matrices if ctx.needs_input_grad[0] else None)
        ctx.lag0, ctx.rows = lag0, taps.shape[0]
        return _sequence_major(y)

    @staticmethod
    @once_differentiable
    def backward(ctx, grad: torch.Tensor):
        channel_major, matrices = ctx.saved_tensors
        b, n, c = grad.shape
        grad_major = _channel_major(grad)                                              # (c, b, n)
        grad_x = grad_taps = None
        if ctx.needs_input_grad[0]:
            grad_x = _sequence_major(torch.bmm(grad_major, matrices))
        if ctx.needs_input_grad[1]:
            lags = _diagonal_sums(torch.bmm(grad_major.transpose(1, 2), channel_major))  # (c, 2n - 1)
            rows = ctx.rows
            low, high = max(0, ctx.lag0 - (n - 1)), min(rows, ctx.lag0 + n)
            start = (n - 1) - (ctx.lag0 - low)
            inside = lags[:, start: start + high - low].t()
            if high - low == rows:
                grad_taps = inside.contiguous()
            else:  # taps at lags no output reaches
                grad_taps = lags.new_zeros(rows, c)
                grad_taps[low:high] = inside
        return grad_x, grad_taps, None


def direct_convolve(x: torch.Tensor, taps: torch.Tensor, lag0: int) -> torch.Tensor:
    """Per-channel convolution of ``x`` (b, n, c) with real ``taps`` (rows, c), row r holding lag ``r - lag0``, as a
    product with the dense (n, n) Toeplitz matrix of each channel: exact (no FFT rounding) and few operations, for
    short inputs (:func:`use_direct`). Lags with ``|lag| >= n`` reach no output and are ignored."""
    if not 0 <= lag0 < taps.shape[0]:
        raise ValueError(f"lag0: must lie in [0, rows) for a kernel of {taps.shape[0]} rows, got {lag0}")
    return _DirectToeplitz.apply(x, taps, lag0)


class _SiluGate(torch.autograd.Function):
    """``silu(pre) * mixed``, keeping ``pre`` and ``mixed`` for backward (``silu(pre)`` is recomputed there), where
    a separate silu and product would keep ``pre``, ``silu(pre)`` and ``mixed``."""

    @staticmethod
    def forward(ctx, pre: torch.Tensor, mixed: torch.Tensor) -> torch.Tensor:
        ctx.save_for_backward(pre, mixed)
        return F.silu(pre) * mixed

    @staticmethod
    @once_differentiable
    def backward(ctx, grad: torch.Tensor):
        pre, mixed = ctx.saved_tensors
        grad_pre = torch.ops.aten.silu_backward(grad * mixed, pre) if ctx.needs_input_grad[0] else None
        grad_mixed = grad * F.silu(pre) if ctx.needs_input_grad[1] else None
        return grad_pre, grad_mixed


# Parameter-free tensors (TokenMixer.constant) a mixer keeps: one or two per input length it has seen.
MAX_CONSTANTS = 16


class TokenMixer(nn.Module):
    """Mixes a sequence along its length, per channel: ``y[:, i, c] = sum_j T_c[i, j] x[:, j, c]``.

    Subclasses implement :meth:`mix`. Inputs arrive with padding positions already zeroed; ``attention_mask``
    (b, n) is passed for mixers whose operator depends on each row's real length (SKI).

    In eval mode, kernel quantities that depend only on the weights and the length are memoised with
    :meth:`cached`, until a parameter changes (an optimizer step, ``load_state_dict``) or ``train()`` is called.
    """

    def __init__(self, channels: int, causal: bool, recompute_spectra: bool | None = None):
        super().__init__()
        self.channels = channels
        self.causal = causal
        self._eval_cache: dict[Hashable, Any] = {}
        self._eval_cache_version: tuple = ()
        self._constants: dict[Hashable, torch.Tensor] = {}
        # What the FFT convolution keeps for backward (see fft_convolve): None decides by size, True saves only the
        # real inputs and recomputes their spectra, False keeps the spectra (TnnConfig.fft_recompute).
        self.recompute_spectra = recompute_spectra

    def forward(self, x: torch.Tensor, attention_mask: torch.Tensor | None = None) -> torch.Tensor:
        dtype = compute_dtype(x.dtype)
        with torch.autocast(device_type=x.device.type, enabled=False):
            y = self.mix(as_dtype(x, dtype), attention_mask)
        return as_dtype(y, x.dtype)

    def mix(self, x: torch.Tensor, attention_mask: torch.Tensor | None, activate: bool = False) -> torch.Tensor:
        """Mix ``x`` (b, n, channels) in the compute dtype. With ``activate`` ``x`` is the GTU's pre-activation and
        the mixer applies to ``silu(x) * mask`` (``attention_mask``), keeping only ``x`` for backward where it can
        (see :func:`fft_convolve`)."""
        raise NotImplementedError

    def direct(self, x: torch.Tensor, taps: Callable[[], torch.Tensor], lag0: int, attention_mask: torch.Tensor | None,
               activate: bool, n: int) -> torch.Tensor:
        """The short-sequence path (:func:`direct_convolve`) with the kernel's ``taps()`` (memoised in eval mode);
        the activation, if asked for, runs in front of it under autograd (short inputs keep little for backward)."""
        if activate:
            x = _activation(x, attention_mask)
        return direct_convolve(x, self.cached(("taps", n, x.device, x.dtype), taps), lag0)

    def gated_mix(self, u_pre: torch.Tensor, v_pre: torch.Tensor, attention_mask: torch.Tensor | None = None,
                  mix: Callable[[torch.Tensor], torch.Tensor] | None = None) -> torch.Tensor:
        """The GTU's gating, ``silu(u_pre) * mix(silu(v_pre) * mask)`` (mask: ``attention_mask`` (b, n) or None), the
        one place it is written: ``mix`` is this mixer's parallel form by default, the recurrent cache's step when
        decoding.

        On the parallel path, when gradients flow and :attr:`recompute_spectra` asks for it (None: when the
        activations exceed ``RECOMPUTE_BYTES / 2``), it keeps ``u_pre``, ``v_pre`` and the mixer's output for
        backward instead of also ``silu(u_pre)`` and the mixer's input (the silus are recomputed there): two
        activation-sized tensors fewer per layer; same values and gradients."""
        lean = False
        if mix is None:
            dtype = compute_dtype(v_pre.dtype)
            grad = torch.is_grad_enabled() and (u_pre.requires_grad or v_pre.requires_grad) and not tracing()
            # As the convolution's spectra: recomputing costs time (measured up to 15% of a mixer's forward +
            # backward), so by default only activations as large as those the convolution recomputes for are left out.
            lean = grad and (self.recompute_spectra if self.recompute_spectra is not None
                             else 2 * v_pre.numel() * v_pre.element_size() > RECOMPUTE_BYTES)
            if lean and v_pre.dtype == dtype:
                with torch.autocast(device_type=v_pre.device.type, enabled=False):
                    mixed = self.mix(v_pre, attention_mask, activate=True)
                return _SiluGate.apply(u_pre, as_dtype(mixed, u_pre.dtype))
            mix = lambda v: self(v, attention_mask)  # noqa: E731
        mixed = as_dtype(mix(_activation(v_pre, attention_mask)), u_pre.dtype)
        return _SiluGate.apply(u_pre, mixed) if lean else F.silu(u_pre) * mixed

    # -- recurrent decoding (causal mixers; see decoding_state.py and decoding_plan.py) ----------------------------

    def causal_taps(self, n: int, device: torch.device) -> torch.Tensor:
        """The causal kernel ``t_0 .. t_{n-1}`` (n, channels) the parallel path applies."""
        raise NotImplementedError(f"{type(self).__name__} has no causal recurrent form.")

    def ssm_kernel(self, length: int, device: torch.device) -> tuple[torch.Tensor, float]:
        """``(taps, gamma)`` with ``t_k = taps[k] * gamma**k`` for k < length: what ETSC converts into an SSM
        (the decay is folded into the SSM's eigenvalues, which is exact)."""
        raise NotImplementedError(f"{type(self).__name__} has no causal recurrent form.")

    def ssm_kernel_decay(self) -> float:
        """The ``gamma`` :meth:`ssm_kernel` folds into the eigenvalues (1: the kernel does not decay)."""
        return 1.0

    def kernel_support(self, device: torch.device) -> int | None:
        """Number of causal taps that reach an output to float32 resolution (lags beyond contribute nothing a
        float32 model can see), or None when the kernel has no such bound. Decoding keeps that many past inputs."""
        return None

    def has_kernel_support(self) -> bool:
        """Whether this kind of kernel has a :meth:`kernel_support`, known before any weight is read (a cache asks it
        when built): its decoding states then keep their shapes from the prefill on (a window of the support, or
        the compact state), so a compiled decode step is one graph."""
        return False

    def modal_tail_rpe(self) -> nn.Module | None:
        """Where the mixer offers the compact decoding state (an exact window and its tail as modes): the RPE
        (:class:`~modeling_tnn.rpe.Rpe`) whose values times ``ssm_kernel_decay()**k`` (below 1) are the causal taps.
        The modal fit evaluates the kernel from it in float64 and bounds its tail by its ``supremum_bound``. None:
        no compact state."""
        return None

    # -- eval-mode memoisation -----------------------------------------------------------------------------------
    def train(self, mode: bool = True) -> "TokenMixer":
        self._eval_cache.clear()
        return super().train(mode)

    def _parameter_version(self) -> tuple:
        return tuple((p._version, p.data_ptr(), p.device, p.dtype) for p in self.parameters())

    def _memoising(self) -> bool:
        # Under torch.compile / torch.export parameters are fake tensors (no storage to key on): trace the maths.
        return not (self.training or torch.is_grad_enabled() or tracing())

    def convolution_kernel(self, key: Hashable, layout: Callable[[], torch.Tensor],
                           spectrum: Callable[[], torch.Tensor], taps_only: bool = False) -> torch.Tensor:
        """The kernel to hand to :func:`fft_convolve`: its time-domain ``layout()`` when gradients flow (the FFT of
        the kernel and of its gradient then run inside the convolution, in cache-sized chunks), or its
        ``spectrum()``, computed once and memoised under ``key``, in eval mode; with ``taps_only`` (the convolution
        runs as one unchunked block: :func:`single_block`) the memoised ``layout()`` there too."""
        if not self._memoising():
            return layout()
        return self.cached(("taps", key), layout) if taps_only else self.cached(key, spectrum)

    def constant(self, key: Hashable, compute: Callable[[], Any]) -> Any:
        """``compute()`` for tensors that depend on no parameter (lags, decay factors, frequency grids), memoised
        under ``key`` in training as in eval: building it costs a few operators per call that every step repeats.
        Recomputed under torch.compile / export (a traced tensor must not outlive its trace); at most
        ``MAX_CONSTANTS`` are kept."""
        if tracing():
            return compute()
        if key not in self._constants:
            if len(self._constants) >= MAX_CONSTANTS:
                self._constants.clear()
            with torch.no_grad():
                self._constants[key] = compute()
        return self._constants[key]

    def cached(self, key: Hashable, compute: Callable[[], Any]) -> Any:
        """``compute()``, memoised under ``key`` in eval mode without autograd; recomputed otherwise."""
        if not self._memoising():
            return compute()
        version = self._parameter_version()
        if version != self._eval_cache_version:
            self._eval_cache.clear()
            self._eval_cache_version = version
        if key not in self._eval_cache:
            self._eval_cache[key] = compute()
        return self._eval_cache[key]
