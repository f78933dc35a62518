"""The convolution paths a benchmark forces, each in one scoped context manager (nothing else in the benchmarks
touches the library's path choice).

Today the library chooses its FFT-convolution path from constants of ``modeling_tnn.mixer_base``, so these scopes
set those constants and put them back. When the operator dispatcher (``modeling_tnn.ops_dispatch``) lands with its
policy object, only the bodies below change: each becomes the scoping of a policy."""

from __future__ import annotations

from collections.abc import Iterator
from contextlib import contextmanager

PATHS = ("direct", "fft")


@contextmanager
def _constants(module, values: dict[str, object]) -> Iterator[None]:
    saved = {name: getattr(module, name) for name in values}
    for name, value in values.items():
        setattr(module, name, value)
    try:
        yield
    finally:
        for name, value in saved.items():
            setattr(module, name, value)


@contextmanager
def accelerator_like_policy() -> Iterator[None]:
    """The FFT convolution as an accelerator runs it: all channels in one chunk (on CPU it cuts them into
    cache-sized chunks, each a few more operators) and a single block as one unchunked FFT. Used to count the
    operators an accelerator would launch."""
    # Switch point for the merge with ops_dispatch: scope the dispatcher's accelerator policy here instead.
    from modeling_tnn import mixer_base

    with _constants(mixer_base, dict(CHUNK_ELEMENTS=1 << 62, SINGLE_BLOCK_CHUNKS=1)):
        yield


@contextmanager
def forced_convolution_path(path: str) -> Iterator[None]:
    """Every dense / FD mixer on one path: ``"direct"`` (each channel's Toeplitz product) or ``"fft"``, whatever the
    length and batch; used to time the two paths against each other."""
    if path not in PATHS:
        raise ValueError(f"path must be one of {PATHS}, got {path!r}.")
    # Switch point for the merge with ops_dispatch: scope a policy that always picks ``path`` here instead.
    from modeling_tnn import mixer_base

    limits = dict(direct=(1 << 30, 1 << 62, 0.0), fft=(0, 0, 0.0))[path]
    with _constants(mixer_base, dict(zip(("DIRECT_MAX_LENGTH", "DIRECT_MAX_ENTRIES", "DIRECT_MIN_BATCH_PER_TOKEN"),
                                         limits))):
        yield
