"""FD and SKI token mixers against their definitions."""

from __future__ import annotations

import pytest
import torch

from modeling_tnn.naive import toeplitz_matmul
from modeling_tnn.tno_fd import FdTno
from modeling_tnn.tno_ski import SkiTno, interpolation_weights

from tests.support import tiny_config


def _fd(causal, kernel_length=16, channels=3):
    return FdTno(tiny_config("fd", causal=causal, fd_kernel_length=kernel_length), channels).double().eval()


def test_fd_causal_real_part_of_spectrum_equals_rpe_output():
    mixer = _fd(True)
    spectrum = torch.fft.rfft(mixer.kernel(torch.device("cpu")), n=mixer.grid, dim=0)
    torch.testing.assert_close(spectrum.real, mixer.response(torch.device("cpu")), atol=1e-6, rtol=0)
    # ... also at the precision a float32 model computes in.
    mixer32 = _fd(True).float()
    spectrum32 = torch.fft.rfft(mixer32.kernel(torch.device("cpu")), n=mixer32.grid, dim=0)
    torch.testing.assert_close(spectrum32.real, mixer32.response(torch.device("cpu")), atol=1e-6, rtol=1e-5)


def test_fd_causal_kernel_is_zero_at_negative_lags():
    mixer = _fd(True)
    circular = torch.fft.irfft(mixer.spectrum(16, mixer.grid, torch.device("cpu"), torch.float64), n=mixer.grid,
                               dim=0)
    # Circular lags grid/2 + 1 .. grid - 1 are the negative lags -(grid/2 - 1) .. -1.
    assert circular[mixer.grid // 2 + 1:].abs().max() < 1e-12
    assert circular[: mixer.grid // 2 + 1].abs().max() > 1e-3


def test_fd_bidirectional_spectrum_is_the_rpe_output_with_real_edges():
    mixer = _fd(False)
    response = mixer.response(torch.device("cpu"))
    assert response.imag[0].abs().max() == 0 and response.imag[-1].abs().max() == 0
    raw = mixer.rpe(mixer.frequencies(torch.device("cpu")))
    torch.testing.assert_close(response.real, raw[:, :3])
    torch.testing.assert_close(response.imag[1:-1], raw[1:-1, 3:])


@pytest.mark.parametrize("causal", [True, False])
@pytest.mark.parametrize(("n", "kernel_length"), [(1, 16), (5, 16), (16, 16), (17, 16), (37, 16), (70, 16),
                                                  (100, 16), (250, 16), (100, 12), (61, 6), (100, 6)])
def test_fd_is_a_toeplitz_product_with_its_fixed_kernel(causal, n, kernel_length, mixer_path):
    """Every input length uses the same kernel: lags up to the grid's half, zero beyond. Inputs several times the
    grid go through overlap-save blocks, which must stay exact."""
    mixer = _fd(causal, kernel_length)
    half = mixer.grid // 2
    kernel = mixer.kernel(torch.device("cpu"))
    lags = torch.arange(0, n) if causal else torch.arange(-(n - 1), n)
    offset = 0 if causal else half
    coeffs = torch.stack([kernel[k + offset] if abs(k) <= half else torch.zeros(3, dtype=torch.float64)
                          for k in lags.tolist()])
    x = torch.randn(2, n, 3, dtype=torch.float64)
    expected = toeplitz_matmul(x, coeffs, causal)
    torch.testing.assert_close(mixer(x), expected, atol=1e-10, rtol=0)


@pytest.mark.parametrize("causal", [True, False])
def test_fd_gradients_equal_the_dense_matrix_product(causal, mixer_path):
    """Through overlap-save blocks too (n several times the grid), or the direct product, input and RPE gradients
    are exact."""
    mixer = _fd(causal, kernel_length=6).train()
    n = 100
    assert mixer.plan(n)[1] is not None  # overlap-save blocks on the FFT path
    x = torch.randn(2, n, 3, dtype=torch.float64, requires_grad=True)
    kernel = mixer.kernel(torch.device("cpu"))
    half = mixer.grid // 2
    lags = torch.arange(0, n) if causal else torch.arange(-(n - 1), n)
    offset = 0 if causal else half
    coeffs = torch.stack([kernel[k + offset] if abs(k) <= half else kernel.new_zeros(3) for k in lags.tolist()])
    expected = toeplitz_matmul(x, coeffs, causal)
    grad = torch.randn_like(expected)
    inputs = (x, *mixer.parameters())
    for got, want in zip(torch.autograd.grad(mixer(x), inputs, grad), torch.autograd.grad(expected, inputs, grad)):
        torch.testing.assert_close(got, want, atol=1e-10, rtol=1e-10)


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


@pytest.mark.parametrize("n", [6, 13])
def test_ski_full_rank_low_rank_part_is_the_exact_toeplitz_product(n):
    mixer = SkiTno(tiny_config("ski", causal=False, ski_rank=n), channels=3).double()
    x = torch.randn(2, n, 3, dtype=torch.float64)
    lags = torch.arange(-(n - 1), n)
    coeffs = mixer.rpe(lags) * (mixer.gamma ** lags.abs().double())[:, None]
    expected = toeplitz_matmul(x, coeffs, False)
    torch.testing.assert_close(mixer.low_rank(x, None), expected, atol=1e-8, rtol=0)


def test_ski_band_is_a_centred_convolution():
    mixer = SkiTno(tiny_config("ski", causal=False, ski_kernel_size=5), channels=2).double()
    x = torch.randn(1, 9, 2, dtype=torch.float64)
    y = mixer.band_conv(x)
    half = 2
    for i in range(9):
        expected = sum(mixer.band[:, half + o] * x[0, i + o] for o in range(-half, half + 1) if 0 <= i + o < 9)
        torch.testing.assert_close(y[0, i], expected)


@pytest.mark.parametrize(("batch", "n", "kernel_size"), [(2, 19, 5), (1, 3, 7), (2, 16, 1)])
def test_ski_band_gradients(batch, n, kernel_size):
    """The band convolution's hand-written backward (flipped-kernel input gradient, accumulated weight gradient,
    including rows that do not fill a step) against numerical derivatives."""
    mixer = SkiTno(tiny_config("ski", causal=False, ski_kernel_size=kernel_size), channels=3).double()
    x = torch.randn(batch, n, 3, dtype=torch.float64, requires_grad=True)
    # gradcheck perturbs its inputs in place, so passing the parameter itself checks its gradient.
    assert torch.autograd.gradcheck(lambda a, _: mixer.band_conv(a), (x, mixer.band), fast_mode=True)


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


@pytest.mark.parametrize(("batch", "n", "kernel_size"), [(3, 40, 5), (2, 3, 7), (1, 200, 17)])
def test_ski_band_weight_gradient_by_offset_equals_the_blocked_loop(batch, n, kernel_size):
    """The accelerator form of the band's weight gradient (one product per offset over the whole batch) against the
    CPU's cache-blocked loop."""
    from modeling_tnn.tno_ski import _band_weight_grad, _band_weight_grad_by_offset

    x = torch.randn(batch, n, 6, dtype=torch.float64)
    grad = torch.randn(batch, n, 6, dtype=torch.float64)
    torch.testing.assert_close(_band_weight_grad_by_offset(grad, x, kernel_size),
                               _band_weight_grad(grad, x, kernel_size), atol=1e-12, rtol=1e-12)
