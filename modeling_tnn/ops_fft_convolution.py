"""Per-channel convolution along the sequence by FFT: the chunked overlap-save convolution with its hand-written
backward, and the single-block convolution (one FFT of the whole sequence). Pure operators: which one runs, on what
kernel form and with which chunk budget is chosen by ops_dispatch.convolve."""

from __future__ import annotations

from collections.abc import Callable
from typing import TYPE_CHECKING

import torch
import torch.nn.functional as F
from torch.autograd.function import once_differentiable

if TYPE_CHECKING:
    from .ops_input_map import InputMap

CHUNK_ALIGN = 16  # whole 64-byte lines of float32 channels per row when chunks are cut out of (b, n, c)


def _onesided_weights(fft_len: int, dtype: torch.dtype, device: torch.device) -> torch.Tensor:
    """How often each rfft bin counts in the full spectrum, over fft_len: 1 at DC (and Nyquist), else 2."""
    weights = torch.full((fft_len // 2 + 1,), 2.0 / fft_len, dtype=dtype, device=device)
    weights[0] = 1.0 / fft_len
    if fft_len % 2 == 0:
        weights[-1] = 1.0 / fft_len
    return weights


def channels_per_chunk(channels: int, per_channel: int, chunk_elements: int | None) -> int:
    """Channels per chunk: all of them without a budget (``chunk_elements`` None), else as many as fit
    ``chunk_elements`` elements of window buffer (whole cache lines of channels).

    The convolution runs chunk by chunk over the channels so that its FFT buffers are reused from the allocator (a
    fresh buffer of the full activation size costs page faults) and stay in cache between the transpose, the FFT, the
    product and the inverse FFT."""
    if chunk_elements is None:
        return channels
    fit = chunk_elements // max(per_channel, 1) // CHUNK_ALIGN * CHUNK_ALIGN
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


def _place_output_grad(slots: torch.Tensor, g: torch.Tensor) -> None:
    """``slots`` (b, k, blocks, step) <- the output gradient ``g`` (b, k, n) cut into blocks of ``step`` (the last one
    cut short): each window's output gradient sits at its output slots, the adjoint of keeping only those outputs."""
    b, k, _, step = slots.shape
    whole, rest = divmod(g.shape[-1], step)
    if whole:
        slots[:, :, :whole].copy_(g[..., : whole * step].reshape(b, k, whole, step))
    if rest:
        slots[:, :, whole, :rest].copy_(g[..., whole * step:])


def _overlap_add(acc: torch.Tensor, window_grad: torch.Tensor, step: int) -> torch.Tensor:
    """The window gradients ``window_grad`` (b, k, blocks, fft_len) added back onto the sequence they were cut from
    (window j starts at block j), in ``acc`` (b, k, blocks + spans, step): the adjoint of :func:`_fill_windows`, as
    (b, k, (blocks + spans) * step) from the first window's start."""
    blocks, fft_len = window_grad.shape[2:]
    acc.zero_()
    for span in range(-(-fft_len // step)):
        width = min(step, fft_len - span * step)
        acc[:, :, span: span + blocks, :width] += window_grad[..., span * step: span * step + width]
    return acc.view(*acc.shape[:2], -1)


def block_convolution_forward(x: torch.Tensor, kernel: torch.Tensor, fft_len: int, step: int, offset: int, lag0: int,
                              recompute: bool, rebuild: Callable[[], torch.Tensor] | None, input_map: InputMap | None,
                              chunk_elements: int | None, kernel_grad: bool
                              ) -> tuple[torch.Tensor, tuple[torch.Tensor | None, ...], tuple]:
    """:class:`_BlockConvolution`'s forward: ``(y, saved, geometry)``, ``saved`` the tensors its backward needs (the
    pre-image or input where needed, the spectral kernel, and the spectra it keeps unless ``recompute``) and
    ``geometry`` the sizes and modes that read them back (:func:`block_convolution_backward`). ``kernel_grad``:
    whether the kernel needs a gradient (then the input, or its spectra, are kept)."""
    pre = x
    if input_map is not None:  # x is a pre-image: convolve input_map(x), keep x alone for backward
        x = input_map(pre).contiguous()
    b, n, c = x.shape
    blocks = -(-n // step)
    chunk = channels_per_chunk(c, b * blocks * fft_len, chunk_elements)
    windows = x.new_empty(b, chunk, blocks, fft_len)
    spectral = kernel.is_complex()
    placed = None if spectral else x.new_empty(chunk, fft_len)
    stage = x.new_empty(max(b * n, kernel.shape[0]) * chunk) if chunk < c else None
    y = x.new_empty(b, n, c)
    keep = kernel_grad and not recompute  # the input spectra, for the kernel gradient
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
    kept = pre if input_map is not None else (x if recompute and kernel_grad else None)
    if recompute:
        # With ``rebuild`` the kernel is not kept either: backward calls it for the same values.
        saved = (kept, kernel if rebuild is None or spectral else None)
    else:
        saved = (kept, kernel if spectral else None, *kernel_spectra, *input_spectra)
    return y, saved, (n, fft_len, step, offset, chunk, kernel.shape[0], lag0, recompute, spectral)


def block_convolution_backward(grad: torch.Tensor, saved: tuple[torch.Tensor | None, ...], geometry: tuple,
                               input_map: InputMap | None, rebuild: Callable[[], torch.Tensor] | None,
                               need_x: bool, need_kernel: bool) -> tuple[torch.Tensor | None, torch.Tensor | None]:
    """The gradients of :class:`_BlockConvolution`'s input and kernel (None where not needed) from that of its output,
    with what :func:`block_convolution_forward` saved (``saved``, unpacked once: activation checkpointing allows no
    second unpacking) and its ``geometry``; ``rebuild`` recomputes a kernel that was not kept."""
    n, fft_len, step, offset, chunk, rows, lag0, recompute, spectral = geometry
    b, _, c = grad.shape
    chunks = -(-c // chunk)
    pre, kernel = saved[:2]
    x = pre
    if input_map is not None and recompute and need_kernel:
        x = input_map(pre).contiguous()
    if recompute and kernel is None and need_x:
        with torch.no_grad():
            kernel = rebuild()
    kernel_spectra = saved[2: 2 + chunks] if not recompute and not spectral else None
    input_spectra = saved[2 + (0 if spectral or recompute else chunks):]
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
    spans = -(-fft_len // step)  # how many blocks of x one window overlaps
    if need_x and blocks > 1:
        summed = grad.new_empty(b, chunk, blocks + spans, step)
    for index, start in enumerate(range(0, c, chunk)):
        channels = slice(start, min(c, start + chunk))
        k = channels.stop - start
        g, inside = _staged(stage, grad, channels)
        _place_output_grad(padded[:, :k, :, offset: offset + step], g[:, :, inside].transpose(1, 2))
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
            else:
                source = _overlap_add(summed[:, :k], window_grad, step)[..., offset: offset + n]
            grad_x[:, :, channels].copy_(source.transpose(1, 2))
    if input_map is not None and need_x:  # back through x = input_map(pre)
        grad_x = input_map.backward(grad_x, pre)
    return grad_x, grad_kernel


class _BlockConvolution(torch.autograd.Function):
    """Overlap-save convolution along dim 1 of (b, n, c), channel chunk by channel chunk, with a hand-written
    backward: one rfft of the zero-padded output gradient serves both the input gradient (one irfft, then
    overlap-add) and the kernel gradient (its product with the input spectra).

    The kernel is real, (L, c) with row r holding lag ``r - lag0`` (its circular layout is built chunk by chunk, in
    cache), or a complex spectrum (fft_len // 2 + 1, c). With ``recompute`` the function saves only its real inputs
    and recomputes the input and kernel spectra in backward (two more FFTs per chunk, half the saved bytes: a
    spectrum of fft_len // 2 + 1 complex values per channel weighs about twice its n real inputs); otherwise it keeps
    the spectra of the forward. With an ``input_map`` it convolves ``input_map(x)`` and keeps ``x`` alone (the map is
    recomputed in backward where needed).
    """

    @staticmethod
    def forward(ctx, x: torch.Tensor, kernel: torch.Tensor, fft_len: int, step: int, offset: int, lag0: int,
                recompute: bool, rebuild: Callable[[], torch.Tensor] | None, input_map: InputMap | None,
                chunk_elements: int | None) -> torch.Tensor:
        y, saved, ctx.geometry = block_convolution_forward(x, kernel, fft_len, step, offset, lag0, recompute, rebuild,
                                                           input_map, chunk_elements, ctx.needs_input_grad[1])
        ctx.save_for_backward(*saved)
        ctx.input_map, ctx.rebuild = input_map, rebuild if recompute else None
        return y

    @staticmethod
    @once_differentiable
    def backward(ctx, grad: torch.Tensor):
        grad_x, grad_kernel = block_convolution_backward(grad, ctx.saved_tensors, ctx.geometry, ctx.input_map,
                                                         ctx.rebuild, *ctx.needs_input_grad[:2])
        return grad_x, grad_kernel, None, None, None, None, None, None, None, None


def single_block_forward(x: torch.Tensor, taps: torch.Tensor, fft_len: int, lag0: int, taps_grad: bool
                         ) -> tuple[torch.Tensor, torch.Tensor | None, torch.Tensor]:
    """:class:`_SingleBlockConvolution`'s forward: the output and the two spectra its backward needs, the input's
    (None unless ``taps_grad``, a gradient of the taps is wanted) and the kernel's."""
    n = x.shape[1]
    x_f = torch.fft.rfft(x, n=fft_len, dim=1)
    kernel_f = torch.fft.rfft(taps, n=fft_len, dim=0)
    y = torch.fft.irfft(x_f * kernel_f, n=fft_len, dim=1)[:, lag0: lag0 + n]
    return y.contiguous(), x_f if taps_grad else None, kernel_f


def single_block_backward(grad: torch.Tensor, x_f: torch.Tensor | None, kernel_f: torch.Tensor, rows: int,
                          fft_len: int, lag0: int, need_x: bool, need_taps: bool
                          ) -> tuple[torch.Tensor | None, torch.Tensor | None]:
    """The gradients of :class:`_SingleBlockConvolution`'s input and ``rows`` taps (None where not needed) from that
    of its output, with the spectra :func:`single_block_forward` kept."""
    n = grad.shape[1]
    grad_f = torch.fft.rfft(F.pad(grad, (0, 0, lag0, 0)) if lag0 else grad, n=fft_len, dim=1)
    grad_taps = grad_x = None
    if need_taps:
        grad_taps = torch.fft.irfft((x_f.conj() * grad_f).sum(0), n=fft_len, dim=0)[:rows]
    if need_x:
        grad_x = torch.fft.irfft(grad_f.mul_(kernel_f.conj()), n=fft_len, dim=1)[:, :n]
    return grad_x, grad_taps


class _SingleBlockConvolution(torch.autograd.Function):
    """One zero-padded FFT of the whole sequence (all channels at once, along dim 1 of (b, n, c)) with real taps
    (L, c) whose row r holds lag ``r - lag0``: the taps at slots 0..L-1 make the circular product's outputs
    ``lag0 .. lag0 + n - 1`` the convolution's (exact when ``n + L - 1 - lag0 <= fft_len`` and ``lag0 + n <= fft_len``:
    no wrapped term reaches them). No window, staging or layout buffers: rfft's ``n`` pads. Backward correlates:
    the output gradient placed at ``lag0`` is transformed once and serves both gradients. Keeps both spectra."""

    @staticmethod
    def forward(ctx, x: torch.Tensor, taps: torch.Tensor, fft_len: int, lag0: int) -> torch.Tensor:
        y, x_f, kernel_f = single_block_forward(x, taps, fft_len, lag0, ctx.needs_input_grad[1])
        ctx.save_for_backward(x_f, kernel_f)
        ctx.geometry = (taps.shape[0], fft_len, lag0)
        return y

    @staticmethod
    @once_differentiable
    def backward(ctx, grad: torch.Tensor):
        return *single_block_backward(grad, *ctx.saved_tensors, *ctx.geometry, *ctx.needs_input_grad[:2]), None, None


def _chunk_spectrum(kernel: torch.Tensor, channels: slice, lag0: int = 0, placed: torch.Tensor | None = None,
                    stage: torch.Tensor | None = None) -> torch.Tensor:
    """The spectrum (k, F) of some channels of a kernel given as a spectrum (F, c) or as real taps (L, c) whose
    row r holds lag ``r - lag0``, laid out circularly in ``placed`` (k, fft_len)."""
    if kernel.is_complex():
        return kernel[:, channels].t().contiguous()
    return torch.fft.rfft(_place_kernel(placed, kernel, channels, lag0, stage), dim=-1)


def fft_convolve(x: torch.Tensor, kernel: torch.Tensor, fft_len: int, step: int | None = None, offset: int = 0,
                 lag0: int | None = None, recompute: bool = False, rebuild: Callable[[], torch.Tensor] | None = None,
                 input_map: InputMap | None = None, chunk_elements: int | None = None) -> torch.Tensor:
    """Per-channel convolution of ``x`` (b, n, c) with a real kernel, given as real taps (L, c) whose row r holds
    lag ``r - lag0`` (``lag0=None``: the whole circular layout (fft_len, c), lag m at slot m mod fft_len), or as the
    rfft of that circular layout (fft_len // 2 + 1, c), channel chunk by channel chunk (:class:`_BlockConvolution`).

    With ``step=None`` the whole sequence is one FFT block (exact when the kernel's lags m satisfy
    n + |m| <= fft_len). Otherwise overlap-save: block j computes outputs ``j*step .. j*step + step - 1`` from the
    window of x starting at ``j*step - offset``; exact for kernels with lags in ``[offset + step - fft_len, offset]``.
    Pass real taps when gradients flow: their FFT and the FFT of their gradient then run in cache-sized chunks.

    ``recompute``: save only ``x`` and the real kernel for backward and recompute their spectra there (True), or keep
    the forward's spectra (False); outputs and gradients are the same either way. ``rebuild``, when recomputing: a
    function returning the real kernel's values again (without autograd), so that backward keeps no copy of the
    kernel either. ``input_map``: convolve ``input_map(x)`` (an elementwise map with its own ``backward``, such as
    :class:`ops_fused_gating.SiluMask`) keeping only ``x`` for backward. ``chunk_elements``: the window buffer's
    budget per channel chunk (see :func:`channels_per_chunk`); None: all channels at once.
    """
    step = x.shape[1] if step is None else step
    if lag0 is None:
        lag0 = 0
        if not kernel.is_complex() and kernel.shape[0] != fft_len:
            raise ValueError(f"kernel: a circular layout needs fft_len={fft_len} rows, got {kernel.shape[0]}; "
                             "pass lag0 for compact taps")
    if not kernel.is_complex() and not (0 <= lag0 < kernel.shape[0] <= fft_len):
        raise ValueError(f"lag0: must lie in [0, rows) for a kernel of at most fft_len={fft_len} rows, got "
                         f"lag0={lag0} for {kernel.shape[0]} rows")
    # A pre-image stays as given (the GTU's is a view of its fused projection, which the gate keeps alive anyway): a
    # contiguous copy saved for backward would be one activation more per layer.
    return _BlockConvolution.apply(x if input_map is not None else x.contiguous(), kernel, fft_len, step, offset,
                                   lag0, recompute, rebuild, input_map, chunk_elements)


def single_block_convolve(x: torch.Tensor, taps: torch.Tensor, fft_len: int, lag0: int) -> torch.Tensor:
    """Per-channel convolution of ``x`` (b, n, c) with real ``taps`` (L, c), row r holding lag ``r - lag0``, as one
    zero-padded FFT of the whole sequence and all channels (:class:`_SingleBlockConvolution`): no chunking, both
    spectra kept for backward. Needs ``n + L - 1 - lag0 <= fft_len`` and ``lag0 + n <= fft_len``."""
    n, rows = x.shape[1], taps.shape[0]
    if not (0 <= lag0 < rows and n + rows - 1 - lag0 <= fft_len and lag0 + n <= fft_len):
        raise ValueError(f"fft_len: {fft_len} points are too few for {n} inputs and {rows} taps with lag0={lag0}")
    return _SingleBlockConvolution.apply(x, taps, fft_len, lag0)
