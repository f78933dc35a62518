"""The dense TNO against the dense Toeplitz matrix, its precision rules, its eval-mode coefficient cache and its
kernel's memory rules in training."""

from __future__ import annotations

import pytest
import torch

from modeling_tnn.naive import naive_convolve
from modeling_tnn.ops_dispatch import ConvolutionPolicy, convolution_policy
from modeling_tnn.tno_dense import DenseTno

from tests.support import tiny_config


@pytest.mark.parametrize("causal", [True, False])
@pytest.mark.parametrize("n", [1, 7, 16, 37])
def test_product_equals_dense_matrix(causal, n, mixer_path):
    mixer = DenseTno(tiny_config(causal=causal), channels=5).double().eval()
    x = torch.randn(3, n, 5, dtype=torch.float64)
    expected = naive_convolve(x, mixer.coefficients(n, x.device), causal)
    torch.testing.assert_close(mixer(x), expected, atol=1e-10, rtol=0)


def test_coefficients_are_decayed_rpe_values():
    mixer = DenseTno(tiny_config(causal=False, decay_gamma=0.9), channels=4).double()
    coeffs = mixer.coefficients(6, torch.device("cpu"))
    lags = torch.arange(-5, 6)
    expected = mixer.rpe_values(lags) * (0.9 ** lags.abs().double())[:, None]
    torch.testing.assert_close(coeffs, expected)


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


@pytest.mark.parametrize("causal", [True, False])
def test_gradients_equal_the_dense_matrix_product(causal, mixer_path):
    """Input and RPE gradients through either path equal autograd through the dense Toeplitz matrix."""
    mixer = DenseTno(tiny_config(causal=causal), channels=5).double()
    n = 23
    x = torch.randn(2, n, 5, dtype=torch.float64, requires_grad=True)
    expected = naive_convolve(x, mixer.coefficients(n, x.device), causal)
    grad = torch.randn_like(expected)
    inputs = (x, *mixer.parameters())
    for got, want in zip(torch.autograd.grad(mixer(x), inputs, grad), torch.autograd.grad(expected, inputs, grad)):
        torch.testing.assert_close(got, want, atol=1e-10, rtol=1e-10)


@pytest.fixture
def fft_path():
    """The FFT path at every length (the short-sequence path is tested with ``mixer_path``)."""
    with convolution_policy(ConvolutionPolicy().forcing_direct(False)):
        yield


@pytest.mark.parametrize("recompute", [False, True])
@pytest.mark.parametrize("causal", [True, False])
def test_gradients_in_both_memory_modes(causal, recompute, fft_path):
    mixer = DenseTno(tiny_config(causal=causal), channels=5).double()
    mixer.recompute_spectra = recompute
    n = 19
    x = torch.randn(2, n, 5, dtype=torch.float64, requires_grad=True)
    expected = naive_convolve(x, mixer.coefficients(n, x.device), causal)
    grad = torch.randn_like(expected)
    wanted = torch.autograd.grad(expected, [x, *mixer.parameters()], grad)
    got = torch.autograd.grad(mixer(x), [x, *mixer.parameters()], grad)
    for a, b in zip(got, wanted):
        torch.testing.assert_close(a, b, atol=1e-10, rtol=1e-8)


def test_recompute_keeps_neither_spectra_nor_kernel(fft_path):
    """In recompute mode the dense mixer's convolution saves its input alone: no spectrum, no (n, c) kernel."""
    mixer = DenseTno(tiny_config(causal=True), channels=8)
    x = torch.randn(2, 256, 8, requires_grad=True)
    for recompute in (True, False):
        mixer.recompute_spectra = recompute
        shapes = []
        with torch.autograd.graph.saved_tensors_hooks(lambda t: shapes.append((tuple(t.shape), t.is_complex())) or t,
                                                      lambda t: t):
            mixer(x)
        assert (((2, 256, 8), False) in shapes) == recompute
        assert any(complex_ for _, complex_ in shapes) != recompute
        assert ((256, 8), False) not in shapes


def test_recompute_refuses_a_parameter_changed_before_backward(fft_path):
    mixer = DenseTno(tiny_config(causal=True), channels=4)
    mixer.recompute_spectra = True
    y = mixer(torch.randn(1, 16, 4, requires_grad=True))
    with torch.no_grad():
        mixer.rpe.out_proj.bias.add_(1.0)
    with pytest.raises(RuntimeError, match="changed in place"):
        y.sum().backward()


@pytest.mark.parametrize("causal", [True, False])
def test_eval_equals_training_bitwise_on_the_single_block_path(causal):
    """Eval mode convolves the same (memoised) taps as training where the input is one unchunked block, not a
    memoised spectrum: outputs agree bitwise."""
    mixer = DenseTno(tiny_config(causal=causal), channels=4)
    x = torch.randn(2, 30, 4)
    with convolution_policy(ConvolutionPolicy(single_block_chunks=1 << 20).forcing_direct(False)):
        trained = mixer.train()(x)
        with torch.no_grad():
            evaluated = mixer.eval()(x)
            again = mixer(x)
    torch.testing.assert_close(evaluated, trained.detach(), atol=0, rtol=0)
    torch.testing.assert_close(again, evaluated, atol=0, rtol=0)
