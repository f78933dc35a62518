"""The SKI token mixer against its definition: band plus low rank, the low-rank part exact at full rank, one
inducing kernel shared by a batch of equal lengths."""

from __future__ import annotations

import pytest
import torch

from modeling_tnn.naive import naive_convolve
from modeling_tnn.tno_ski import SkiTno

from tests.support import tiny_config


@pytest.mark.parametrize("n", [6, 13])
def test_ski_full_rank_low_rank_part_is_the_exact_toeplitz_product(n):
    mixer = SkiTno(tiny_config("ski", causal=False, ski_rank=n), channels=3).double()
    x = torch.randn(2, n, 3, dtype=torch.float64)
    lags = torch.arange(-(n - 1), n)
    coeffs = mixer.rpe(lags) * (mixer.gamma ** lags.abs().double())[:, None]
    expected = naive_convolve(x, coeffs, False)
    torch.testing.assert_close(mixer.low_rank(x, None), expected, atol=1e-8, rtol=0)


def test_ski_band_is_a_centred_convolution():
    mixer = SkiTno(tiny_config("ski", causal=False, ski_kernel_size=5), channels=2).double()
    x = torch.randn(1, 9, 2, dtype=torch.float64)
    y = mixer.band_conv(x)
    half = 2
    for i in range(9):
        expected = sum(mixer.band[:, half + o] * x[0, i + o] for o in range(-half, half + 1) if 0 <= i + o < 9)
        torch.testing.assert_close(y[0, i], expected)


def test_ski_mixer_is_band_plus_low_rank_with_exact_gradients():
    """The fused forward/backward of the whole mixer against autograd through its two parts, with padding."""
    mixer = SkiTno(tiny_config("ski", causal=False, ski_rank=5, ski_kernel_size=5), channels=3).double()
    x = torch.randn(2, 23, 3, dtype=torch.float64, requires_grad=True)
    mask = torch.ones(2, 23, dtype=torch.long)
    mask[1, 17:] = 0
    x_masked = x * mask[..., None]
    expected = mixer.band_conv(x_masked) + mixer.low_rank(x_masked, mask)
    got = mixer(x_masked, mask)
    torch.testing.assert_close(got, expected, atol=1e-12, rtol=0)
    grad = torch.randn_like(got)
    inputs = (x, *mixer.parameters())
    fused = torch.autograd.grad(got, inputs, grad, retain_graph=True)  # the masking is shared by both graphs
    for a, b in zip(fused, torch.autograd.grad(expected, inputs, grad)):
        torch.testing.assert_close(a, b, atol=1e-10, rtol=1e-10)
    assert torch.autograd.gradcheck(lambda a: mixer(a, None), (torch.randn(1, 19, 3, dtype=torch.float64,
                                                                           requires_grad=True),), fast_mode=True)


def test_ski_shared_inducing_kernel_gradients_equal_per_row():
    """A batch of equal lengths shares one K_r (1, c, r, r): outputs and gradients equal those of each row alone."""
    mixer = SkiTno(tiny_config("ski", ski_rank=6, ski_kernel_size=5), 4).double()
    x = torch.randn(3, 20, 4, dtype=torch.float64, requires_grad=True)
    weights, k_r = mixer.low_rank_factors(x, None)
    assert k_r.shape[0] == 1
    grad = torch.randn(3, 20, 4, dtype=torch.float64)
    params = list(mixer.parameters())
    together = torch.autograd.grad(mixer(x), [x, *params], grad)
    rows = [torch.autograd.grad(mixer(x[i: i + 1]), [x, *params], grad[i: i + 1]) for i in range(3)]
    for index, value in enumerate(together):
        torch.testing.assert_close(value, sum(row[index] for row in rows), atol=1e-10, rtol=1e-8)
    assert torch.autograd.gradcheck(lambda a: mixer(a), (x,), fast_mode=True)
