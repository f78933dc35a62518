"""The FFT convolution's compact kernels and its recompute mode, against a direct sum and numerical gradients."""

from __future__ import annotations

import pytest
import torch

from modeling_tnn import mixer_base
from modeling_tnn.mixer_base import fft_convolve
from modeling_tnn.tno_dense import DenseTno
from modeling_tnn.tno_fd import FdTno

from modeling_tnn.naive import direct_convolution, toeplitz_matrix

from tests.support import saved_bytes, tiny_config


@pytest.fixture(autouse=True)
def _fft_path(monkeypatch):
    """The mixers here take their FFT path at every length (their short-sequence path is tested elsewhere)."""
    monkeypatch.setattr(mixer_base, "DIRECT_MAX_LENGTH", 0)


# (n, fft_len, step, offset, rows, lag0): single blocks (causal and two-sided kernels) and overlap-save blocks whose
# kernels span the lags [offset + step - fft_len, offset] that a block covers exactly.
CASES = [(9, 18, None, 0, 9, 0), (9, 18, None, 0, 17, 8), (7, 15, None, 0, 3, 1), (13, 12, 5, 4, 5, 0),
         (13, 12, 5, 4, 8, 3), (16, 16, 8, 3, 9, 5), (2, 12, 5, 4, 5, 0)]


@pytest.mark.parametrize("single_block", [True, False])
@pytest.mark.parametrize("recompute", [False, True])
@pytest.mark.parametrize(("n", "fft_len", "step", "offset", "rows", "lag0"), CASES)
def test_compact_kernel_matches_the_direct_sum_with_exact_gradients(monkeypatch, n, fft_len, step, offset, rows, lag0,
                                                                    recompute, single_block):
    """Both single-block forms (one unchunked FFT of the sequence, or the windowed one) and overlap-save."""
    monkeypatch.setattr(mixer_base, "SINGLE_BLOCK_CHUNKS", 4 if single_block else 0)
    x = torch.randn(2, n, 3, dtype=torch.float64, requires_grad=True)
    taps = torch.randn(rows, 3, dtype=torch.float64, requires_grad=True)

    def convolve(a, k):
        return fft_convolve(a, k, fft_len, step, offset, lag0=lag0, recompute=recompute)

    torch.testing.assert_close(convolve(x, taps), direct_convolution(x, taps, lag0), atol=1e-12, rtol=0)
    assert torch.autograd.gradcheck(convolve, (x, taps))


def test_single_block_form_is_chosen_by_size_and_mode(monkeypatch):
    """The unchunked FFT serves single blocks of a real kernel that keep their spectra and fit SINGLE_BLOCK_CHUNKS
    channel chunks (none on CPU by default); recomputing, activating or overlap-save inputs take the chunked
    convolution."""
    x = torch.randn(2, 9, 3, requires_grad=True)
    taps = torch.randn(9, 3, requires_grad=True)

    def node(**options) -> str:
        return type(fft_convolve(x, taps, 18, lag0=0, **options).grad_fn).__name__

    assert node(recompute=False) == "_BlockConvolutionBackward"  # CPU's default
    monkeypatch.setattr(mixer_base, "SINGLE_BLOCK_CHUNKS", 4)
    assert node(recompute=False) == "_SingleBlockConvolutionBackward"
    assert node(recompute=True) == "_BlockConvolutionBackward"
    assert node(recompute=False, activate=True) == "_BlockConvolutionBackward"
    assert type(fft_convolve(x, taps[:5], 12, 5, 4, lag0=0).grad_fn).__name__ == "_BlockConvolutionBackward"
    monkeypatch.setattr(mixer_base, "CHUNK_ELEMENTS", 2 * 18 * 3 // mixer_base.SINGLE_BLOCK_CHUNKS - 1)
    assert node(recompute=False) == "_BlockConvolutionBackward"


@pytest.mark.parametrize("recompute", [False, True])
def test_spectral_kernel_gradients_in_both_modes(recompute):
    x = torch.randn(2, 9, 3, dtype=torch.float64, requires_grad=True)
    spectrum = torch.fft.rfft(torch.randn(18, 3, dtype=torch.float64), dim=0).requires_grad_()
    assert torch.autograd.gradcheck(lambda a, k: fft_convolve(a, k, 18, recompute=recompute), (x, spectrum),
                                    fast_mode=True)



def test_recompute_saves_only_the_real_inputs():
    """The saving mode keeps complex spectra of the padded input and kernel; recompute keeps x and the taps."""
    b, n, c = 2, 64, 8
    x = torch.randn(b, n, c, requires_grad=True)
    taps = torch.randn(n, c, requires_grad=True)
    keep = saved_bytes(lambda: fft_convolve(x, taps, 128, lag0=0, recompute=False))
    lean = saved_bytes(lambda: fft_convolve(x, taps, 128, lag0=0, recompute=True))
    assert lean == (b * n * c + n * c) * 4
    assert keep >= 2 * lean
    # With recompute=None the size decides.
    saved = saved_bytes(lambda: fft_convolve(x, taps, 128, lag0=0))
    assert saved == keep


def test_recompute_is_chosen_by_size(monkeypatch):
    x = torch.randn(1, 64, 8, requires_grad=True)
    taps = torch.randn(64, 8, requires_grad=True)
    monkeypatch.setattr(mixer_base, "RECOMPUTE_BYTES", 0)
    lean = saved_bytes(lambda: fft_convolve(x, taps, 128, lag0=0))
    assert lean == (64 * 8 + 64 * 8) * 4


def test_bad_kernel_rows_are_refused():
    x = torch.randn(1, 8, 2)
    with pytest.raises(ValueError, match="lag0"):
        fft_convolve(x, torch.randn(20, 2), 16, lag0=0)
    with pytest.raises(ValueError, match="lag0"):
        fft_convolve(x, torch.randn(5, 2), 16, lag0=5)
    with pytest.raises(ValueError, match="kernel"):
        fft_convolve(x, torch.randn(5, 2), 16)


@pytest.mark.parametrize("recompute", [False, True])
@pytest.mark.parametrize("causal", [True, False])
def test_dense_mixer_gradients_in_both_modes(causal, recompute):
    mixer = DenseTno(tiny_config(causal=causal), channels=5).double()
    mixer.recompute_spectra = recompute
    n = 19
    x = torch.randn(2, n, 5, dtype=torch.float64, requires_grad=True)
    expected = torch.einsum("cij,bjc->bic", toeplitz_matrix(mixer.coefficients(n, x.device), n, causal), x)
    grad = torch.randn_like(expected)
    wanted = torch.autograd.grad(expected, [x, *mixer.parameters()], grad)
    got = torch.autograd.grad(mixer(x), [x, *mixer.parameters()], grad)
    for a, b in zip(got, wanted):
        torch.testing.assert_close(a, b, atol=1e-10, rtol=1e-8)


@pytest.mark.parametrize("recompute", [False, True])
@pytest.mark.parametrize("causal", [True, False])
def test_fd_mixer_gradients_in_both_modes(causal, recompute):
    """Overlap-save blocks (n well beyond the kernel's support) in both modes against the Toeplitz product."""
    mixer = FdTno(tiny_config("fd", causal=causal, fd_kernel_length=4), channels=3).double()
    mixer.recompute_spectra = recompute
    n = 80
    assert mixer.plan(n)[1] is not None  # overlap-save
    kernel = mixer.kernel(torch.device("cpu"))
    half = mixer.grid // 2
    lags = torch.arange(n)[:, None] - torch.arange(n)[None, :]
    if causal:
        values = torch.cat([kernel, kernel.new_zeros(1, 3)])
        index = torch.where((lags >= 0) & (lags <= half), lags, half + 1)
    else:
        values = torch.cat([kernel, kernel.new_zeros(1, 3)])
        index = torch.where(lags.abs() <= half, lags + half, 2 * half + 1)
    matrix = values[index].permute(2, 0, 1)                                   # (c, n, n)
    x = torch.randn(2, n, 3, dtype=torch.float64, requires_grad=True)
    expected = torch.einsum("cij,bjc->bic", matrix, x)
    grad = torch.randn_like(expected)
    wanted = torch.autograd.grad(expected, [x, *mixer.parameters()], grad)
    got = torch.autograd.grad(mixer(x), [x, *mixer.parameters()], grad)
    for a, b in zip(got, wanted):
        torch.testing.assert_close(a, b, atol=1e-10, rtol=1e-8)


def test_dense_recompute_keeps_neither_spectra_nor_kernel():
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


def test_dense_recompute_refuses_a_parameter_changed_before_backward():
    mixer = DenseTno(tiny_config(causal=True), channels=4)
    mixer.recompute_spectra = True
    y = mixer(torch.randn(1, 16, 4, requires_grad=True))
    with torch.no_grad():
        mixer.rpe.out_proj.bias.add_(1.0)
    with pytest.raises(RuntimeError, match="changed in place"):
        y.sum().backward()


@pytest.mark.parametrize("masked", [False, True])
@pytest.mark.parametrize("recompute", [False, True])
def test_activated_input_is_silu_then_mask(recompute, masked):
    """``activate=True`` convolves silu(x) * mask, with exact gradients through the activation."""
    x = torch.randn(2, 9, 3, dtype=torch.float64, requires_grad=True)
    taps = torch.randn(9, 3, dtype=torch.float64, requires_grad=True)
    mask = torch.tensor([[1.0] * 9, [1.0] * 6 + [0.0] * 3], dtype=torch.float64) if masked else None

    def convolve(a, k):
        return fft_convolve(a, k, 18, lag0=0, recompute=recompute, activate=True, mask=mask)

    activated = torch.nn.functional.silu(x) * (1 if mask is None else mask[..., None])
    torch.testing.assert_close(convolve(x, taps), direct_convolution(activated, taps, 0), atol=1e-12, rtol=0)
    assert torch.autograd.gradcheck(convolve, (x, taps))


@pytest.mark.parametrize("recompute", [False, True])
@pytest.mark.parametrize(("n", "fft_len", "step", "offset", "rows", "lag0"), CASES[1::2])
def test_channel_chunks_are_exact(monkeypatch, n, fft_len, step, offset, rows, lag0, recompute):
    """40 channels in chunks of 16, 16 and 8 (each staged contiguously before its transposed reads)."""
    monkeypatch.setattr(mixer_base, "CHUNK_ELEMENTS", 1)
    x = torch.randn(2, n, 40, dtype=torch.float64, requires_grad=True)
    taps = torch.randn(rows, 40, dtype=torch.float64, requires_grad=True)
    assert mixer_base._chunk_channels(x, 2 * fft_len) == 16

    def convolve(a, k):
        return fft_convolve(a, k, fft_len, step, offset, lag0=lag0, recompute=recompute)

    torch.testing.assert_close(convolve(x, taps), direct_convolution(x, taps, lag0), atol=1e-12, rtol=0)
    assert torch.autograd.gradcheck(convolve, (x, taps), fast_mode=True)
    spectrum = torch.fft.rfft(torch.randn(fft_len, 40, dtype=torch.float64), dim=0).requires_grad_()
    assert torch.autograd.gradcheck(lambda a, k: fft_convolve(a, k, fft_len, step, offset, recompute=recompute),
                                    (x, spectrum), fast_mode=True)
