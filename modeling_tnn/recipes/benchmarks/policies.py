"""The convolution paths a benchmark forces, each in one scoped context manager (nothing else in the benchmarks
touches the library's path choice).

Each scopes a :class:`modeling_tnn.ops_dispatch.ConvolutionPolicy` derived from the current one, so every
convolution inside the block (and the mixers that run it) follows it and nothing outlives the block. The dispatcher
is imported when a scope opens, not with this module: the A/B workers (:mod:`.compare`) import the benchmark modules
against older model code too, which has no dispatcher (they never open these scopes)."""

from __future__ import annotations

from collections.abc import Iterator
from contextlib import contextmanager

PATHS = ("direct", "fft")


@contextmanager
def accelerator_like_policy() -> Iterator[None]:
    """The FFT convolution as an accelerator runs it: all channels in one chunk (on CPU it cuts them into
    cache-sized chunks, each a few more operators) and a single block as one unchunked FFT
    (``ConvolutionPolicy.as_on_accelerator``). Used to count the operators an accelerator would launch."""
    from modeling_tnn.ops_dispatch import convolution_policy, current_policy

    with convolution_policy(current_policy().as_on_accelerator()):
        yield


@contextmanager
def forced_convolution_path(path: str) -> Iterator[None]:
    """Every dense / FD mixer on one path: ``"direct"`` (each channel's Toeplitz product) or ``"fft"``, whatever the
    length and batch (``ConvolutionPolicy.forcing_direct``); used to time the two paths against each other."""
    if path not in PATHS:
        raise ValueError(f"path must be one of {PATHS}, got {path!r}.")
    from modeling_tnn.ops_dispatch import convolution_policy, current_policy

    with convolution_policy(current_policy().forcing_direct(path == "direct")):
        yield
