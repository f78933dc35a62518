"""The short-sequence convolution: the product with each channel's dense Toeplitz matrix, against the direct sum of
naive.py and numerical gradients, and against the FFT convolution."""

from __future__ import annotations

import pytest
import torch

from modeling_tnn.naive import naive_direct_convolve
from modeling_tnn.ops_direct_toeplitz import direct_convolve
from modeling_tnn.ops_fft_convolution import fft_convolve
from modeling_tnn.ops_fft_sizes import fft_length

# (n, rows, lag0): causal kernels (lag0 = 0) as long as the input, shorter, longer; two-sided kernels of lags
# -(n-1)..n-1, narrower (FD's fixed support) and wider than the input reaches.
CASES = [(1, 1, 0), (6, 6, 0), (6, 3, 0), (4, 9, 0), (6, 11, 5), (7, 5, 2), (4, 15, 7), (5, 4, 3)]


@pytest.mark.parametrize(("n", "rows", "lag0"), CASES)
def test_direct_product_is_the_direct_sum_with_exact_gradients(n, rows, lag0):
    x = torch.randn(2, n, 3, dtype=torch.float64, requires_grad=True)
    taps = torch.randn(rows, 3, dtype=torch.float64, requires_grad=True)
    torch.testing.assert_close(direct_convolve(x, taps, lag0), naive_direct_convolve(x, taps, lag0), atol=1e-12, rtol=0)
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
    torch.testing.assert_close(direct_convolve(x, taps, 0), naive_direct_convolve(x, taps, 0))


def test_bad_lag0_is_refused():
    with pytest.raises(ValueError, match="lag0"):
        direct_convolve(torch.randn(1, 4, 2), torch.randn(3, 2), 3)
