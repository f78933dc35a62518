"""The one place that decides how a per-channel convolution along the sequence runs.

A mixer describes its kernel (:class:`ConvolutionKernel`: real taps around ``lag0``, a spectrum where that is cheaper
or is the kernel's own parametrisation, a fixed support or none); :func:`convolve` picks the operator per device and
shape from a :class:`ConvolutionPolicy`:

- ``DIRECT``: the product with the dense Toeplitz matrices (ops_direct_toeplitz), for short inputs with enough batch;
- ``SINGLE_BLOCK``: one unchunked FFT of the whole sequence (ops_fft_convolution.single_block_convolve), off CPU
  whenever one block of the sequence keeps its spectra, on CPU up to ``single_block_chunks`` chunks;
- ``CHUNKED``: one FFT block, channel chunk by channel chunk (ops_fft_convolution.fft_convolve);
- ``OVERLAP_SAVE``: fixed-size FFT blocks for a kernel of fixed short support (FD) on a long input.

Tests and benchmarks force a path by passing a policy or scoping one (``with convolution_policy(...)``). Packed
sequences (several documents per row) reach :func:`convolve` as batches of documents (ops_documents gathers them by
length, TokenMixer.forward runs each bucket through the mixer's own operator), so no mixer and no path changes.
"""

from __future__ import annotations

import contextlib
import contextvars
import dataclasses
import enum
from collections.abc import Callable, Iterator
from dataclasses import dataclass
from typing import TYPE_CHECKING

import torch

from .ops_direct_toeplitz import direct_convolve
from .ops_fft_convolution import fft_convolve, single_block_convolve
from .ops_fft_sizes import fft_length, smooth_size
from .runtime import tracing

if TYPE_CHECKING:
    from .ops_input_map import InputMap


@dataclass(frozen=True)
class ConvolutionPolicy:
    """The limits :func:`convolve` picks its path by (the defaults are what the measurements below chose).

    - ``direct_max_length``, ``direct_max_entries``, ``direct_min_batch_per_token``: the direct product serves inputs
      of at most that many tokens, whose (channels x n x n) Toeplitz matrices have at most that many entries and with
      a batch of at least that many rows per token, so that the matrices it builds and reduces in backward weigh at
      most about twice the activations (measured in run_scripts/bench_token_mixers.py --direct at 384 channels: at
      n = 64 the FFT path is 1.2-1.7x faster at batch 12 and 1.4x slower at batch 128; at n = 32 and batch 24 it is
      1.1-1.4x slower).
    - ``chunk_elements``: on CPU, elements of one channel chunk's FFT window buffer (the chunks' buffers stay in
      cache and are reused from the allocator); off CPU all channels run as one chunk.
    - ``single_block_chunks``: on CPU, the most channel chunks' worth of (batch x fft_len x channels) a single block
      may have to run as one unchunked FFT (off CPU every single block that keeps its spectra does). 0: none on CPU.
      Per mixer it takes 0.9-1.06x the chunked convolution's time up to about four chunks (one thread) with a third
      of its operators (116 against 377 aten events at 12 x 64 x 384), and 1.5-2.6x beyond (its FFTs along the
      strided sequence dimension fall out of cache); but in a whole training step at the small-GPT size (12 x 64,
      width 128) four chunks measured 5-8% slower than none. CPU time is what counts on CPU; the operator count is
      what carries over to accelerators, where it applies.
    - ``recompute_bytes``: input spectra above this many bytes are recomputed in backward rather than kept (when the
      caller leaves ``recompute`` to the size): below it the two extra FFTs cost more than the memory is worth.
    - ``block_multiple``: overlap-save FFT size as a multiple of the lags a block must cover; each block then yields
      (multiple - 1) x that many outputs. 4 measured best against 2 and 8 (FD's default kernel).
    """

    direct_max_length: int = 96
    direct_max_entries: int = 1 << 22
    direct_min_batch_per_token: float = 0.5
    chunk_elements: int = 1 << 19
    single_block_chunks: int = 0
    recompute_bytes: int = 1 << 26
    block_multiple: int = 4

    def __post_init__(self) -> None:
        for field in dataclasses.fields(self):
            if getattr(self, field.name) < 0:
                raise ValueError(f"{field.name}: must be >= 0, got {getattr(self, field.name)}")
        if self.chunk_elements < 1 or self.block_multiple < 2:
            raise ValueError(f"chunk_elements must be >= 1 and block_multiple >= 2, got {self.chunk_elements} and "
                             f"{self.block_multiple}")

    def direct(self, batch: int, n: int, channels: int) -> bool:
        """Whether a (batch, n, channels) input takes the direct product."""
        return (n <= self.direct_max_length and batch >= self.direct_min_batch_per_token * n
                and channels * n * n <= self.direct_max_entries)

    def chunk_budget(self, device: torch.device) -> int | None:
        """The FFT convolution's window budget per channel chunk on ``device`` (None: one chunk)."""
        return self.chunk_elements if device.type == "cpu" else None

    def single_block(self, x: torch.Tensor, fft_len: int) -> bool:
        """Whether a single FFT block of ``x`` (b, n, c) that keeps its spectra runs unchunked."""
        size = x.shape[0] * fft_len * x.shape[2]
        return x.device.type != "cpu" or size <= self.single_block_chunks * self.chunk_elements

    def recomputes(self, saved_bytes: int, recompute: bool | None) -> bool:
        """``recompute`` as given, or (None) whether ``saved_bytes`` of saved tensors exceed ``recompute_bytes``."""
        return recompute if recompute is not None else saved_bytes > self.recompute_bytes

    def forcing_direct(self, direct: bool) -> ConvolutionPolicy:
        """This policy with the direct product taken at every shape (True) or never (False)."""
        if direct:
            return dataclasses.replace(self, direct_max_length=1 << 62, direct_max_entries=1 << 62,
                                       direct_min_batch_per_token=0.0)
        return dataclasses.replace(self, direct_max_length=0)

    def as_on_accelerator(self) -> ConvolutionPolicy:
        """This policy with a CPU's convolutions run as an accelerator's would (one channel chunk, single blocks
        unchunked): what the operator counts that carry over to accelerators are taken with."""
        return dataclasses.replace(self, chunk_elements=1 << 62, single_block_chunks=1)


_POLICY: contextvars.ContextVar[ConvolutionPolicy] = contextvars.ContextVar("convolution_policy",
                                                                           default=ConvolutionPolicy())


def current_policy() -> ConvolutionPolicy:
    """The policy :func:`convolve` uses when none is passed: the innermost :func:`convolution_policy`, else the
    defaults."""
    return _POLICY.get()


@contextlib.contextmanager
def convolution_policy(policy: ConvolutionPolicy | None = None, **fields) -> Iterator[ConvolutionPolicy]:
    """Scope a policy: ``policy`` (default: the current one) with ``fields`` replaced, for every :func:`convolve` in
    the block (and the mixers that call it)."""
    token = _POLICY.set(dataclasses.replace(current_policy() if policy is None else policy, **fields))
    try:
        yield _POLICY.get()
    finally:
        _POLICY.reset(token)


@dataclass(frozen=True)
class ConvolutionKernel:
    """What a convolution needs to know of a real per-channel kernel, lazily (only the form the path takes is built).

    ``taps(reach)``: the kernel at lags ``0..reach`` (causal) or ``-reach..reach``, (rows, c), in the input's dtype.
    ``spectrum(reach, fft_len)``: the rfft (fft_len // 2 + 1, c) of those taps laid out circularly on fft_len points
    (None: the paths transform the taps).
    ``support``: the largest lag of a kernel of fixed support (FD), None for one as long as the input (dense).
    ``spectrum_cached``: spectra are computed once and kept (eval mode): the chunked FFT paths take the spectrum.
    ``native_spectrum(reach, fft_len)``: whether the spectrum is the kernel's own parametrisation on that grid (no
    FFT of taps), taken even when gradients flow. ``rebuild(reach)``: a function backward may call for the same taps
    instead of keeping them (when it recomputes its spectra), or None.
    """

    taps: Callable[[int], torch.Tensor]
    causal: bool
    spectrum: Callable[[int, int], torch.Tensor] | None = None
    support: int | None = None
    spectrum_cached: bool = False
    native_spectrum: Callable[[int, int], bool] | None = None
    rebuild: Callable[[int], Callable[[], torch.Tensor] | None] | None = None


def shared_kernel(kernel: ConvolutionKernel, reach: int) -> ConvolutionKernel:
    """``kernel`` for several inputs of at most ``reach + 1`` tokens (the length buckets of a packed batch): its taps
    are evaluated once, at ``reach``, and every shorter reach takes a slice of them (a kernel's value at a lag does not
    depend on the reach it is asked at), and each spectrum is built once per grid (per reach too, unless it is the
    kernel's native one). One kernel evaluation, and one backward through it, instead of one per bucket."""
    memo: dict = {}

    def taps(r: int) -> torch.Tensor:
        if "taps" not in memo:
            memo["taps"] = kernel.taps(reach)
        return memo["taps"][: r + 1] if kernel.causal else memo["taps"][reach - r: reach + r + 1]

    def spectrum(r: int, fft_len: int) -> torch.Tensor:
        native = kernel.native_spectrum is not None and kernel.native_spectrum(r, fft_len)
        key = (fft_len,) if native else (r, fft_len)
        if key not in memo:
            memo[key] = kernel.spectrum(r, fft_len)
        return memo[key]
    return dataclasses.replace(kernel, taps=taps, spectrum=None if kernel.spectrum is None else spectrum)


class Path(enum.Enum):
    """The operators :func:`convolve` can run (see the module docstring)."""

    DIRECT = "direct"
    SINGLE_BLOCK = "single block"
    CHUNKED = "chunked"
    OVERLAP_SAVE = "overlap-save"


@dataclass(frozen=True)
class ConvolutionPlan:
    """How :func:`convolve` runs one input: the ``path``, the kernel's ``reach`` (largest lag that reaches an
    output) and ``lag0`` (row of lag 0 in its taps), the FFT geometry, whether backward recomputes the spectra, and
    whether the kernel goes in as its ``spectrum`` (else as taps)."""

    path: Path
    reach: int
    lag0: int
    fft_len: int = 0
    step: int | None = None
    offset: int = 0
    recompute: bool = False
    spectrum: bool = False


def fft_geometry(n: int, reach: int, causal: bool, fixed_support: bool, policy: ConvolutionPolicy
                 ) -> tuple[int, int | None, int]:
    """``(fft_len, step, offset)`` for :func:`ops_fft_convolution.fft_convolve` (step None: one block).

    A kernel as long as the input is one block of :func:`fft_length` points. A kernel of fixed support: a short input
    is one FFT block of at least ``n + reach`` points; a long one is cut into overlap-save blocks of a fixed size,
    which costs O(n log block) and no FFT that grows with n (blocks redo the overlap and gather windows: measured on
    CPU they win once the single FFT is 2x larger).
    """
    if not fixed_support:
        return fft_length(n), None, 0
    span = reach if causal else 2 * reach  # lags other than 0 that a block must cover
    single = smooth_size(n + reach)
    block = smooth_size(policy.block_multiple * span)
    if span and single >= 2 * block:
        return block, block - span, reach
    return single, None, 0


def plan_convolution(x: torch.Tensor, kernel: ConvolutionKernel, recompute: bool | None = None,
                     mapped: bool = False, policy: ConvolutionPolicy | None = None) -> ConvolutionPlan:
    """The plan :func:`convolve` follows for ``x`` (b, n, c) (``mapped``: with an input map)."""
    policy = current_policy() if policy is None else policy
    b, n, c = x.shape
    reach = n - 1 if kernel.support is None else min(kernel.support, n - 1)
    lag0 = 0 if kernel.causal else reach
    if policy.direct(b, n, c):
        return ConvolutionPlan(Path.DIRECT, reach, lag0)
    fft_len, step, offset = fft_geometry(n, reach, kernel.causal, kernel.support is not None, policy)
    blocks = -(-n // (step or n))
    spectra_bytes = b * blocks * (fft_len // 2 + 1) * c * 2 * x.element_size()
    recompute = policy.recomputes(spectra_bytes, recompute)
    path = Path.CHUNKED if step is None else Path.OVERLAP_SAVE
    native = kernel.native_spectrum is not None and kernel.native_spectrum(reach, fft_len)
    if not native and path is Path.CHUNKED and not mapped and not recompute and policy.single_block(x, fft_len):
        # Taps (memoised in eval mode too, not a spectrum): eval and training outputs then agree bitwise.
        return ConvolutionPlan(Path.SINGLE_BLOCK, reach, lag0, fft_len)
    cached = kernel.spectrum_cached and kernel.spectrum is not None
    return ConvolutionPlan(path, reach, lag0, fft_len, step, offset, recompute, native or cached)


def convolve(x: torch.Tensor, kernel: ConvolutionKernel, recompute: bool | None = None,
             input_map: InputMap | None = None, policy: ConvolutionPolicy | None = None) -> torch.Tensor:
    """``y[:, i, c] = sum_j t_c(i - j) x[:, j, c]`` for ``x`` (b, n, c) and the kernel ``t`` that ``kernel``
    describes, along the path :func:`plan_convolution` picks under ``policy`` (default: :func:`current_policy`).

    ``recompute``: whether the FFT paths recompute spectra in backward instead of keeping them (None: by size, see
    ``ConvolutionPolicy.recompute_bytes``). ``input_map``: convolve ``input_map(x)``; the FFT paths apply it inside
    their autograd node and keep only ``x`` (the direct path applies it in front: short inputs keep little)."""
    policy = current_policy() if policy is None else policy
    plan = plan_convolution(x, kernel, recompute, input_map is not None, policy)
    if plan.path is Path.DIRECT:
        return direct_convolve(x if input_map is None else input_map(x), kernel.taps(plan.reach), plan.lag0)
    if plan.path is Path.SINGLE_BLOCK:
        return single_block_convolve(x, kernel.taps(plan.reach), plan.fft_len, plan.lag0)
    if plan.spectrum:
        weights, rebuild = kernel.spectrum(plan.reach, plan.fft_len), None
    else:
        weights = kernel.taps(plan.reach)
        rebuild = kernel.rebuild(plan.reach) if kernel.rebuild is not None and weights.requires_grad else None
    return fft_convolve(x, weights, plan.fft_len, plan.step, plan.offset, plan.lag0, plan.recompute, rebuild,
                        input_map, policy.chunk_budget(x.device))


def use_direct(batch: int, n: int, channels: int, policy: ConvolutionPolicy | None = None) -> bool:
    """Whether a (batch, n, channels) input takes the direct product under ``policy`` (default: the current one)."""
    return (current_policy() if policy is None else policy).direct(batch, n, channels)


def fuses_gating(u_pre: torch.Tensor, v_pre: torch.Tensor, recompute: bool | None) -> bool:
    """Whether the GTU's gating of ``u_pre`` and ``v_pre`` takes the fused ops of ops_fused_gating (which recompute
    their silus in backward): when gradients flow and ``recompute`` (the mixer's ``recompute_spectra``) asks for it,
    or (None) when the two activations exceed the current policy's ``recompute_bytes``, the size at which the
    convolution recomputes its spectra too."""
    grad = torch.is_grad_enabled() and (u_pre.requires_grad or v_pre.requires_grad) and not tracing()
    return grad and current_policy().recomputes(2 * v_pre.numel() * v_pre.element_size(), recompute)
