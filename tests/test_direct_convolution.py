"""The short-sequence path: the product with each channel's dense Toeplitz matrix, against the direct sum and
numerical gradients, and the choice between it and the FFT by length."""

from __future__ import annotations

import pytest
import torch

from modeling_tnn import mixer_base
from modeling_tnn.mixer_base import direct_convolve, fft_convolve, fft_length, use_direct
from modeling_tnn.naive import direct_convolution
from modeling_tnn.tno_dense import DenseTno
from modeling_tnn.tno_fd import FdTno

from tests.support import tiny_config

# (n, rows, lag0): causal kernels (lag0 = 0) as long as the input, shorter, longer; two-sided kernels of lags
# -(n-1)..n-1, narrower (FD's fixed support) and wider than the input reaches.
CASES = [(1, 1, 0), (6, 6, 0), (6, 3, 0), (4, 9, 0), (6, 11, 5), (7, 5, 2), (4, 15, 7), (5, 4, 3)]


@pytest.mark.parametrize(("n", "rows", "lag0"), CASES)
def test_direct_product_is_the_direct_sum_with_exact_gradients(n, rows, lag0):
    x = torch.randn(2, n, 3, dtype=torch.float64, requires_grad=True)
    taps = torch.randn(rows, 3, dtype=torch.float64, requires_grad=True)
    torch.testing.assert_close(direct_convolve(x, taps, lag0), direct_convolution(x, taps, lag0), atol=1e-12, rtol=0)
    assert torch.autograd.gradcheck(lambda a, k: direct_convolve(a, k, lag0), (x, taps))


def test_direct_product_equals_the_fft_path_in_float32():
    x = torch.randn(4, 50, 16)
    taps = torch.randn(99, 16)
    fft = fft_convolve(x, taps, fft_length(50), lag0=49)
    torch.testing.assert_close(direct_convolve(x, taps, 49), fft, atol=1e-4, rtol=1e-4)


def test_non_contiguous_gradients_and_inputs():
    """The GTU hands the mixer a view of its fused projection (every other block of channels)."""
    both = torch.randn(2, 9, 8, dtype=torch.float64, requires_grad=True)
    x = both[..., 4:]
    taps = torch.randn(9, 4, dtype=torch.float64, requires_grad=True)
    assert torch.autograd.gradcheck(lambda a, k: direct_convolve(a[..., 4:], k, 0).transpose(0, 1), (both, taps))
    torch.testing.assert_close(direct_convolve(x, taps, 0), direct_convolution(x, taps, 0))


def test_bad_lag0_is_refused():
    with pytest.raises(ValueError, match="lag0"):
        direct_convolve(torch.randn(1, 4, 2), torch.randn(3, 2), 3)


def test_the_path_is_chosen_by_length_batch_and_size():
    n = mixer_base.DIRECT_MAX_LENGTH
    assert use_direct(n, n, 8)
    assert not use_direct(n + 1, n + 1, 8)
    assert use_direct(n // 2, n, 8)
    assert not use_direct(n // 2 - 1, n, 8)  # fewer rows than half the matrices' side
    assert not use_direct(n, n, mixer_base.DIRECT_MAX_ENTRIES // (n * n) + 1)  # too many matrix entries


@pytest.mark.parametrize("mixer_class, kind", [(DenseTno, "dense"), (FdTno, "fd")])
def test_mixers_take_the_direct_path_at_short_lengths(monkeypatch, mixer_class, kind):
    calls = []
    original = mixer_base._DirectToeplitz.apply
    monkeypatch.setattr(mixer_base._DirectToeplitz, "apply", lambda *a: calls.append(a[0].shape[1]) or original(*a))
    mixer = mixer_class(tiny_config(kind, causal=True, fd_kernel_length=8), 4)
    n = mixer_base.DIRECT_MAX_LENGTH
    mixer(torch.randn(n, n, 4))
    mixer(torch.randn(n + 1, n + 1, 4))
    mixer(torch.randn(n // 2 - 1, n, 4))
    assert calls == [n]
