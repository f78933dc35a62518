"""The dense TNO against the dense Toeplitz matrix, its precision rules and its eval-mode coefficient cache."""

from __future__ import annotations

import pytest
import torch

from modeling_tnn.mixer_base import fft_convolve, fft_length
from modeling_tnn.naive import toeplitz_matmul
from modeling_tnn.tno_dense import DenseTno

from tests.support import tiny_config


@pytest.mark.parametrize("causal", [True, False])
@pytest.mark.parametrize("n", [1, 7, 16, 37])
def test_product_equals_dense_matrix(causal, n, mixer_path):
    mixer = DenseTno(tiny_config(causal=causal), channels=5).double().eval()
    x = torch.randn(3, n, 5, dtype=torch.float64)
    expected = toeplitz_matmul(x, mixer.coefficients(n, x.device), causal)
    torch.testing.assert_close(mixer(x), expected, atol=1e-10, rtol=0)


def test_coefficients_are_decayed_rpe_values():
    mixer = DenseTno(tiny_config(causal=False, decay_gamma=0.9), channels=4).double()
    coeffs = mixer.coefficients(6, torch.device("cpu"))
    lags = torch.arange(-5, 6)
    expected = mixer.rpe_values(lags) * (0.9 ** lags.abs().double())[:, None]
    torch.testing.assert_close(coeffs, expected)


@pytest.mark.parametrize("n", [1, 2, 3, 37, 70, 100, 1000, 4096])
def test_fft_length_is_smooth_and_long_enough(n):
    size = fft_length(n)
    assert size >= 2 * n
    rest = size
    for p in (2, 3, 5):
        while rest % p == 0:
            rest //= p
    assert rest == 1


@pytest.mark.parametrize("dtype", [torch.float16, torch.bfloat16])
def test_half_precision_inputs_are_upcast(dtype, mixer_path):
    mixer = DenseTno(tiny_config(), channels=4).eval()
    x = torch.randn(2, 50, 4)
    y_half = mixer(x.to(dtype))
    assert y_half.dtype == dtype
    # Computed in float32: the only error is rounding the input and the output to half precision.
    reference = mixer(x.to(dtype).float())
    torch.testing.assert_close(y_half.float(), reference.to(dtype).float())


def test_float64_stays_float64():
    mixer = DenseTno(tiny_config(), channels=4).double()
    assert mixer(torch.randn(1, 9, 4, dtype=torch.float64)).dtype == torch.float64


def test_eval_cache_reuses_and_invalidates(monkeypatch, mixer_path):
    mixer = DenseTno(tiny_config(causal=True), channels=4)
    calls = []
    original = mixer.coefficients  # what both the training path and the memoised spectrum are computed from
    monkeypatch.setattr(mixer, "coefficients", lambda n, *args: calls.append(n) or original(n, *args))
    assert mixer.causal  # the causal layout is built from coefficients(n)
    x = torch.randn(1, 12, 4)
    mixer.eval()
    with torch.no_grad():
        first = mixer(x)
        second = mixer(x)
    assert calls == [12]
    torch.testing.assert_close(first, second, atol=0, rtol=0)
    with torch.no_grad():
        mixer(torch.randn(1, 13, 4))  # another length is another entry
    assert calls == [12, 13]
    # A weight update (as an optimizer step does, in place) invalidates the cache.
    with torch.no_grad():
        mixer.rpe.out_proj.bias.add_(1.0)
        third = mixer(x)
    assert calls == [12, 13, 12]
    assert not torch.allclose(first, third)
    # Training mode never reads the cache; returning to eval recomputes.
    mixer.train()
    mixer(x)
    mixer.eval()
    with torch.no_grad():
        mixer(x)
    assert calls == [12, 13, 12, 12, 12]


@pytest.mark.parametrize(("n", "fft_len", "step", "offset"),
                         [(9, 18, None, 0), (7, 15, None, 0), (9, 16, 4, 2), (13, 12, 5, 4), (2, 12, 5, 4)])
def test_fft_convolve_gradients(n, fft_len, step, offset):
    """The hand-written backward (one block, or overlap-save blocks), for a kernel given as its time-domain layout
    or as its spectrum, against numerical derivatives in float64."""
    x = torch.randn(2, n, 3, dtype=torch.float64, requires_grad=True)
    layout = torch.randn(fft_len, 3, dtype=torch.float64, requires_grad=True)
    assert torch.autograd.gradcheck(lambda a, k: fft_convolve(a, k, fft_len, step, offset), (x, layout),
                                    fast_mode=True)
    spectrum = torch.fft.rfft(layout.detach(), dim=0).requires_grad_()
    assert torch.autograd.gradcheck(lambda a, k: fft_convolve(a, k, fft_len, step, offset), (x, spectrum),
                                    fast_mode=True)
    torch.testing.assert_close(fft_convolve(x, layout, fft_len, step, offset),
                               fft_convolve(x, spectrum, fft_len, step, offset), atol=1e-12, rtol=0)


@pytest.mark.parametrize("causal", [True, False])
def test_gradients_equal_the_dense_matrix_product(causal, mixer_path):
    """Input and RPE gradients through either path equal autograd through the dense Toeplitz matrix."""
    mixer = DenseTno(tiny_config(causal=causal), channels=5).double()
    n = 23
    x = torch.randn(2, n, 5, dtype=torch.float64, requires_grad=True)
    expected = toeplitz_matmul(x, mixer.coefficients(n, x.device), causal)
    grad = torch.randn_like(expected)
    inputs = (x, *mixer.parameters())
    for got, want in zip(torch.autograd.grad(mixer(x), inputs, grad), torch.autograd.grad(expected, inputs, grad)):
        torch.testing.assert_close(got, want, atol=1e-10, rtol=1e-10)
