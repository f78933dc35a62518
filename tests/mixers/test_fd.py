"""The FD token mixer against its definition: the causal kernel from the real part of its response, a Toeplitz
product with its fixed kernel at every length, exact gradients through overlap-save blocks."""

from __future__ import annotations

import pytest
import torch

from modeling_tnn.naive import naive_convolve
from modeling_tnn.ops_dispatch import ConvolutionPolicy, Path, convolution_policy, plan_convolution
from modeling_tnn.tno_fd import FdTno

from tests.support import tiny_config


def _fd(causal, kernel_length=16, channels=3):
    return FdTno(tiny_config("fd", causal=causal, fd_kernel_length=kernel_length), channels).double().eval()


def overlap_save(mixer: FdTno, n: int) -> bool:
    """Whether an input of n tokens goes through overlap-save blocks on the FFT path."""
    x = torch.empty(2, n, mixer.channels, dtype=torch.float64)
    plan = plan_convolution(x, mixer.convolution_kernel(x.device, x.dtype),
                            policy=ConvolutionPolicy().forcing_direct(False))
    return plan.path is Path.OVERLAP_SAVE


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
    circular = torch.fft.irfft(mixer.spectrum(15, mixer.grid, torch.device("cpu"), torch.float64), n=mixer.grid,
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
    expected = naive_convolve(x, coeffs, causal)
    torch.testing.assert_close(mixer(x), expected, atol=1e-10, rtol=0)


@pytest.mark.parametrize("causal", [True, False])
def test_fd_gradients_equal_the_dense_matrix_product(causal, mixer_path):
    """Through overlap-save blocks too (n several times the grid), or the direct product, input and RPE gradients
    are exact."""
    mixer = _fd(causal, kernel_length=6).train()
    n = 100
    assert overlap_save(mixer, n)  # overlap-save blocks on the FFT path
    x = torch.randn(2, n, 3, dtype=torch.float64, requires_grad=True)
    kernel = mixer.kernel(torch.device("cpu"))
    half = mixer.grid // 2
    lags = torch.arange(0, n) if causal else torch.arange(-(n - 1), n)
    offset = 0 if causal else half
    coeffs = torch.stack([kernel[k + offset] if abs(k) <= half else kernel.new_zeros(3) for k in lags.tolist()])
    expected = naive_convolve(x, coeffs, causal)
    grad = torch.randn_like(expected)
    inputs = (x, *mixer.parameters())
    for got, want in zip(torch.autograd.grad(mixer(x), inputs, grad), torch.autograd.grad(expected, inputs, grad)):
        torch.testing.assert_close(got, want, atol=1e-10, rtol=1e-10)


@pytest.mark.parametrize("recompute", [False, True])
@pytest.mark.parametrize("causal", [True, False])
def test_fd_gradients_in_both_memory_modes(causal, recompute):
    """Overlap-save blocks (n well beyond the kernel's support) in both modes against the Toeplitz product."""
    mixer = FdTno(tiny_config("fd", causal=causal, fd_kernel_length=4), channels=3).double()
    mixer.recompute_spectra = recompute
    n = 80
    assert overlap_save(mixer, n)
    kernel = mixer.kernel(torch.device("cpu"))
    half = mixer.grid // 2
    lags = torch.arange(n)[:, None] - torch.arange(n)[None, :]
    values = torch.cat([kernel, kernel.new_zeros(1, 3)])
    if causal:
        index = torch.where((lags >= 0) & (lags <= half), lags, half + 1)
    else:
        index = torch.where(lags.abs() <= half, lags + half, 2 * half + 1)
    matrix = values[index].permute(2, 0, 1)                                   # (c, n, n)
    x = torch.randn(2, n, 3, dtype=torch.float64, requires_grad=True)
    expected = torch.einsum("cij,bjc->bic", matrix, x)
    grad = torch.randn_like(expected)
    wanted = torch.autograd.grad(expected, [x, *mixer.parameters()], grad)
    with convolution_policy(ConvolutionPolicy().forcing_direct(False)):
        got = torch.autograd.grad(mixer(x), [x, *mixer.parameters()], grad)
    for a, b in zip(got, wanted):
        torch.testing.assert_close(a, b, atol=1e-10, rtol=1e-8)


@pytest.mark.parametrize("n", [9, 16])
def test_fd_native_spectrum_is_the_grid_response(n):
    """A bidirectional input short enough to be convolved on FD's own grid takes the RPE output as its spectrum,
    with gradients, in training and eval alike."""
    mixer = _fd(False, kernel_length=16).train()
    x = torch.randn(2, n, 3, dtype=torch.float64, requires_grad=True)
    with convolution_policy(ConvolutionPolicy().forcing_direct(False)):
        plan = plan_convolution(x, mixer.convolution_kernel(x.device, x.dtype))
        assert plan.spectrum == (n == 16) and (plan.fft_len == mixer.grid) == (n == 16)
        y = mixer(x)
    kernel = mixer.kernel(torch.device("cpu"))
    half = mixer.grid // 2
    lags = torch.arange(-(n - 1), n)
    expected = naive_convolve(x, kernel[lags + half], False)
    torch.testing.assert_close(y, expected, atol=1e-10, rtol=0)
    grad = torch.randn_like(y)
    inputs = (x, *mixer.parameters())
    for got, want in zip(torch.autograd.grad(y, inputs, grad), torch.autograd.grad(expected, inputs, grad)):
        torch.testing.assert_close(got, want, atol=1e-10, rtol=1e-10)
