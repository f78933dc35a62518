"""The interface every token mixer implements, and what they share: precision rules, FFT sizes, the eval cache."""

from __future__ import annotations

from collections.abc import Callable, Hashable
from typing import Any

import torch
from torch import nn
from torch.autograd.function import once_differentiable


def compute_dtype(dtype: torch.dtype) -> torch.dtype:
    """FFTs run in at least float32: half precision is upcast, float64 stays float64."""
    return torch.float64 if dtype == torch.float64 else torch.float32


def smooth_size(minimum: int) -> int:
    """Smallest 2^a 3^b 5^c >= ``minimum``: FFT sizes that stay fast whatever the length they must cover."""
    best = 1 << max(minimum - 1, 0).bit_length()
    p3 = 1
    while p3 < best:
        p35 = p3
        while p35 < best:
            size = p35
            while size < minimum:
                size *= 2
            best = min(best, size)
            p35 *= 5
        p3 *= 3
    return best


def fft_length(n: int) -> int:
    """Smallest 2^a 3^b 5^c >= 2n: a linear (not circular) convolution of n samples with a kernel of lags
    -(n-1)..n-1 needs at least 2n - 1 points, and smooth sizes keep the FFT fast for any n."""
    return smooth_size(2 * n)


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


class _BlockConvolution(torch.autograd.Function):
    """Overlap-save convolution along dim 1 of (b, n, c), channel chunk by channel chunk, with a hand-written
    backward: one rfft of the zero-padded output gradient serves both the input gradient (one irfft, then
    overlap-add) and the kernel gradient (its product with the saved input spectra).

    The kernel is a real circular layout (fft_len, c), whose rfft runs here chunk by chunk (and whose gradient is
    one irfft per chunk), or a complex spectrum (fft_len // 2 + 1, c).
    """

    @staticmethod
    def forward(ctx, x: torch.Tensor, kernel: torch.Tensor, fft_len: int, step: int, offset: int) -> torch.Tensor:
        b, n, c = x.shape
        blocks = -(-n // step)
        chunk = _chunk_channels(x, b * blocks * fft_len)
        windows = x.new_empty(b, chunk, blocks, fft_len)
        y = x.new_empty(b, n, c)
        input_spectra, kernel_spectra = [], []
        for start in range(0, c, chunk):
            channels = slice(start, min(c, start + chunk))
            k = channels.stop - start
            kernel_f = _chunk_spectrum(kernel, channels)
            x_f = torch.fft.rfft(_fill_windows(windows[:, :k], x, channels, step, offset), dim=-1)
            if ctx.needs_input_grad[1]:
                input_spectra.append(x_f)
                y_f = x_f * kernel_f[:, None]
            else:
                y_f = x_f.mul_(kernel_f[:, None])
            kernel_spectra.append(kernel_f)
            out = torch.fft.irfft(y_f, n=fft_len, dim=-1)[..., offset: offset + step]
            y[:, :, channels].copy_(out.reshape(b, k, blocks * step)[..., :n].transpose(1, 2))
        ctx.save_for_backward(*kernel_spectra, *input_spectra)
        ctx.geometry = (n, fft_len, step, offset, chunk, kernel.shape, kernel.is_complex())
        return y

    @staticmethod
    @once_differentiable
    def backward(ctx, grad: torch.Tensor):
        n, fft_len, step, offset, chunk, kernel_shape, spectral = ctx.geometry
        b, _, c = grad.shape
        chunks = -(-c // chunk)
        saved = ctx.saved_tensors  # unpacked once: activation checkpointing allows no second unpacking
        kernel_spectra, input_spectra = saved[:chunks], saved[chunks:]
        blocks = -(-n // step)
        need_x, need_kernel = ctx.needs_input_grad[:2]
        grad_x = grad.new_empty(b, n, c) if need_x else None
        grad_kernel = None
        if need_kernel:
            grad_kernel = grad.new_empty(kernel_shape, dtype=kernel_spectra[0].dtype if spectral else grad.dtype)
            weights = _onesided_weights(fft_len, grad.dtype, grad.device)
        # Each window's output gradient sits at slots offset .. offset + step - 1, zero elsewhere.
        padded = grad.new_zeros(b, chunk, blocks, fft_len)
        whole, rest = divmod(n, step)
        spans = -(-fft_len // step)  # how many blocks of x one window overlaps
        if need_x and blocks > 1:
            summed = grad.new_empty(b, chunk, blocks + spans, step)
        for index, start in enumerate(range(0, c, chunk)):
            channels = slice(start, min(c, start + chunk))
            k = channels.stop - start
            g = grad[:, :, channels].transpose(1, 2)                                   # (b, k, n)
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
                product = input_spectra[index].conj_physical().mul_(g_f)
                product = product[0, :, 0] if b * blocks == 1 else product.sum(2).sum(0)              # (k, F)
                if spectral:
                    grad_kernel[:, channels] = (product * weights).t()
                else:
                    grad_kernel[:, channels] = torch.fft.irfft(product, n=fft_len, dim=-1).t()
            if need_x:
                # The adjoint of a convolution is the correlation with the same kernel: multiply by conj(K).
                window_grad = torch.fft.irfft(g_f.mul_(kernel_spectra[index].conj()[:, None]), n=fft_len, dim=-1)
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
        return grad_x, grad_kernel, None, None, None


def _chunk_spectrum(kernel: torch.Tensor, channels: slice) -> torch.Tensor:
    """The spectrum (k, F) of some channels of a kernel given as a spectrum (F, c) or a real layout (fft_len, c)."""
    if kernel.is_complex():
        return kernel[:, channels].t().contiguous()
    return torch.fft.rfft(kernel[:, channels].t(), dim=-1)


def fft_convolve(x: torch.Tensor, kernel: torch.Tensor, fft_len: int, step: int | None = None,
                 offset: int = 0) -> torch.Tensor:
    """Per-channel convolution of ``x`` (b, n, c) with a real kernel, given either as its circular layout
    (fft_len, c) (lag m at slot m mod fft_len) or as the rfft of that layout (fft_len // 2 + 1, c).

    With ``step=None`` the whole sequence is one FFT block (exact when the kernel's lags m satisfy
    n + |m| <= fft_len). Otherwise overlap-save: block j computes outputs ``j*step .. j*step + step - 1`` from the
    window of x starting at ``j*step - offset``; exact for kernels with lags in ``[offset + step - fft_len, offset]``.
    Pass the layout when training: its FFT and the FFT of its gradient then run in cache-sized chunks.
    """
    n = x.shape[1]
    step = n if step is None else step
    return _BlockConvolution.apply(x.contiguous(), kernel, fft_len, step, offset)


def tracing() -> bool:
    """True under torch.compile or torch.export, where parameters may be fake tensors (no storage, no values)."""
    from torch._guards import detect_fake_mode

    return torch.compiler.is_compiling() or torch.compiler.is_exporting() or detect_fake_mode() is not None


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
                           spectrum: Callable[[], torch.Tensor]) -> torch.Tensor:
        """The kernel to hand to :func:`fft_convolve`: its time-domain ``layout()`` when gradients flow (the FFT of
        the kernel and of its gradient then run inside the convolution, in cache-sized chunks), or its
        ``spectrum()``, computed once and memoised under ``key``, in eval mode."""
        return layout() if not self._memoising() else self.cached(key, spectrum)

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
