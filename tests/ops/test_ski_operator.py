"""SKI's operator (band plus low rank, one autograd function) against its plain reference in naive.py and
numerical gradients, and the interpolation weights it is built with."""

from __future__ import annotations

import pytest
import torch

from modeling_tnn.naive import naive_silu_mask, naive_sparse_plus_low_rank
from modeling_tnn.ops_fused_gating import SiluMask
from modeling_tnn.ops_ski import (_band_weight_grad, _band_weight_grad_by_offset, inducing_toeplitz,
                                  interpolation_weights, sparse_plus_low_rank)


def test_interpolation_rows_are_convex_and_reproduce_positions():
    lengths = torch.tensor([70, 37, 2, 1])
    weights = interpolation_weights(lengths, 70, 8, torch.float64)
    for row, length in enumerate(lengths.tolist()):
        real, pad = weights[row, :length], weights[row, length:]
        assert (real >= 0).all() and (real <= 1).all()
        torch.testing.assert_close(real.sum(-1), torch.ones(length, dtype=torch.float64))
        assert ((real > 0).sum(-1) <= 2).all()
        assert pad.abs().sum() == 0
        # Linear interpolation is exact for linear functions: W @ inducing positions == positions.
        inducing = torch.linspace(0, length - 1, 8, dtype=torch.float64)
        torch.testing.assert_close(real @ inducing, torch.arange(length, dtype=torch.float64))


def test_interpolation_with_left_padding_offsets():
    weights = interpolation_weights(torch.tensor([5]), 9, 3, torch.float64, offsets=torch.tensor([4]))
    assert weights[0, :4].abs().sum() == 0
    torch.testing.assert_close(weights[0, 4:] @ torch.tensor([0.0, 2.0, 4.0], dtype=torch.float64),
                               torch.arange(5, dtype=torch.float64))


@pytest.mark.parametrize(("batch", "n", "kernel_size"), [(2, 19, 5), (1, 3, 7), (2, 16, 1)])
def test_ski_band_gradients(batch, n, kernel_size):
    """The band convolution's hand-written backward (flipped-kernel input gradient, accumulated weight gradient,
    including rows that do not fill a step) against numerical derivatives."""
    x = torch.randn(batch, n, 3, dtype=torch.float64, requires_grad=True)
    band = torch.randn(3, kernel_size, dtype=torch.float64, requires_grad=True)
    assert torch.autograd.gradcheck(sparse_plus_low_rank, (x, band), fast_mode=True)
    torch.testing.assert_close(sparse_plus_low_rank(x, band), naive_sparse_plus_low_rank(x, band), atol=1e-12, rtol=0)


@pytest.mark.parametrize(("batch", "n", "kernel_size"), [(3, 40, 5), (2, 3, 7), (1, 200, 17)])
def test_ski_band_weight_gradient_by_offset_equals_the_blocked_loop(batch, n, kernel_size):
    """The accelerator form of the band's weight gradient (one product per offset over the whole batch) against the
    CPU's cache-blocked loop."""
    x = torch.randn(batch, n, 6, dtype=torch.float64)
    grad = torch.randn(batch, n, 6, dtype=torch.float64)
    torch.testing.assert_close(_band_weight_grad_by_offset(grad, x, kernel_size),
                               _band_weight_grad(grad, x, kernel_size), atol=1e-12, rtol=1e-12)


@pytest.mark.parametrize("shared", [True, False])
@pytest.mark.parametrize("mapped", [False, True])
def test_operator_is_the_plain_band_plus_low_rank_with_exact_gradients(shared, mapped):
    """Values and gradients (input, band, K_r) of the fused function against naive.naive_sparse_plus_low_rank, with
    one K_r for the batch or one per row, on the input or on an input map (silu * mask) applied inside."""
    x = torch.randn(2, 11, 3, dtype=torch.float64, requires_grad=True)
    band = torch.randn(3, 5, dtype=torch.float64, requires_grad=True)
    weights = interpolation_weights(torch.tensor([11, 8]), 11, 4, torch.float64)
    toeplitz = inducing_toeplitz(torch.randn(1 if shared else 2, 7, 3, dtype=torch.float64)).requires_grad_()
    mask = torch.tensor([[1.0] * 11, [1.0] * 8 + [0.0] * 3], dtype=torch.float64) if mapped else None
    input_map = SiluMask(mask) if mapped else None

    def fused(a, k, t):
        return sparse_plus_low_rank(a, k, weights, t, input_map)

    def plain(a, k, t):
        return naive_sparse_plus_low_rank(naive_silu_mask(a, mask) if mapped else a, k, weights, t)

    torch.testing.assert_close(fused(x, band, toeplitz), plain(x, band, toeplitz), atol=1e-12, rtol=0)
    assert torch.autograd.gradcheck(fused, (x, band, toeplitz), fast_mode=True)
    grad = torch.randn(2, 11, 3, dtype=torch.float64)
    inputs = (x, band, toeplitz)
    wanted = torch.autograd.grad(plain(*inputs), inputs, grad)
    for a, b in zip(torch.autograd.grad(fused(*inputs), inputs, grad), wanted):
        torch.testing.assert_close(a, b, atol=1e-10, rtol=1e-10)


def test_inducing_toeplitz_is_the_toeplitz_matrix_of_the_inducing_lags():
    kernel = torch.randn(2, 7, 3, dtype=torch.float64)
    toeplitz = inducing_toeplitz(kernel)
    for i in range(4):
        for j in range(4):
            torch.testing.assert_close(toeplitz[:, :, i, j], kernel[:, i - j + 3])
