"""The FFT convolutions (chunked / overlap-save and single block) with compact, circular and spectral kernels, in both
memory modes, against the direct sum of naive.py and numerical gradients."""

from __future__ import annotations

import pytest
import torch

from modeling_tnn.naive import naive_direct_convolve
from modeling_tnn.ops_fft_convolution import channels_per_chunk, fft_convolve, single_block_convolve

from tests.support import saved_bytes

# (n, fft_len, step, offset, rows, lag0): single blocks (causal and two-sided kernels) and overlap-save blocks whose
# kernels span the lags [offset + step - fft_len, offset] that a block covers exactly.
CASES = [(9, 18, None, 0, 9, 0), (9, 18, None, 0, 17, 8), (7, 15, None, 0, 3, 1), (13, 12, 5, 4, 5, 0),
         (13, 12, 5, 4, 8, 3), (16, 16, 8, 3, 9, 5), (2, 12, 5, 4, 5, 0)]
SINGLE_BLOCK_CASES = [case for case in CASES if case[2] is None]


@pytest.mark.parametrize("recompute", [False, True])
@pytest.mark.parametrize(("n", "fft_len", "step", "offset", "rows", "lag0"), CASES)
def test_compact_kernel_matches_the_direct_sum_with_exact_gradients(n, fft_len, step, offset, rows, lag0, recompute):
    """The windowed convolution: one block, or overlap-save blocks."""
    x = torch.randn(2, n, 3, dtype=torch.float64, requires_grad=True)
    taps = torch.randn(rows, 3, dtype=torch.float64, requires_grad=True)

    def convolve(a, k):
        return fft_convolve(a, k, fft_len, step, offset, lag0=lag0, recompute=recompute)

    torch.testing.assert_close(convolve(x, taps), naive_direct_convolve(x, taps, lag0), atol=1e-12, rtol=0)
    assert torch.autograd.gradcheck(convolve, (x, taps))


@pytest.mark.parametrize(("n", "fft_len", "step", "offset", "rows", "lag0"), SINGLE_BLOCK_CASES)
def test_single_block_matches_the_direct_sum_with_exact_gradients(n, fft_len, step, offset, rows, lag0):
    """One unchunked FFT of the whole sequence."""
    x = torch.randn(2, n, 3, dtype=torch.float64, requires_grad=True)
    taps = torch.randn(rows, 3, dtype=torch.float64, requires_grad=True)

    def convolve(a, k):
        return single_block_convolve(a, k, fft_len, lag0)

    assert type(convolve(x, taps).grad_fn).__name__ == "_SingleBlockConvolutionBackward"
    torch.testing.assert_close(convolve(x, taps), naive_direct_convolve(x, taps, lag0), atol=1e-12, rtol=0)
    assert torch.autograd.gradcheck(convolve, (x, taps))


@pytest.mark.parametrize(("n", "fft_len", "step", "offset"),
                         [(9, 18, None, 0), (7, 15, None, 0), (9, 16, 4, 2), (13, 12, 5, 4), (2, 12, 5, 4)])
def test_circular_layout_and_spectrum_gradients(n, fft_len, step, offset):
    """The hand-written backward (one block, or overlap-save blocks), for a kernel given as its time-domain circular
    layout or as its spectrum, against numerical derivatives in float64."""
    x = torch.randn(2, n, 3, dtype=torch.float64, requires_grad=True)
    layout = torch.randn(fft_len, 3, dtype=torch.float64, requires_grad=True)
    assert torch.autograd.gradcheck(lambda a, k: fft_convolve(a, k, fft_len, step, offset), (x, layout),
                                    fast_mode=True)
    spectrum = torch.fft.rfft(layout.detach(), dim=0).requires_grad_()
    assert torch.autograd.gradcheck(lambda a, k: fft_convolve(a, k, fft_len, step, offset), (x, spectrum),
                                    fast_mode=True)
    torch.testing.assert_close(fft_convolve(x, layout, fft_len, step, offset),
                               fft_convolve(x, spectrum, fft_len, step, offset), atol=1e-12, rtol=0)


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


def test_rebuild_keeps_no_copy_of_the_kernel():
    """With ``rebuild`` the recomputing convolution saves its input alone and calls it in backward."""
    x = torch.randn(2, 16, 4, dtype=torch.float64, requires_grad=True)
    taps = torch.randn(16, 4, dtype=torch.float64, requires_grad=True)
    calls = []
    rebuild = lambda: calls.append(1) or taps.detach()  # noqa: E731
    assert saved_bytes(lambda: fft_convolve(x, taps, 32, lag0=0, recompute=True, rebuild=rebuild)) == 2 * 16 * 4 * 8
    y = fft_convolve(x, taps, 32, lag0=0, recompute=True, rebuild=rebuild)
    grad = torch.randn_like(y)
    got = torch.autograd.grad(y, (x, taps), grad)
    assert calls == [1]
    wanted = torch.autograd.grad(naive_direct_convolve(x, taps, 0), (x, taps), grad)
    for a, b in zip(got, wanted):
        torch.testing.assert_close(a, b, atol=1e-12, rtol=0)


def test_bad_kernel_rows_are_refused():
    x = torch.randn(1, 8, 2)
    with pytest.raises(ValueError, match="lag0"):
        fft_convolve(x, torch.randn(20, 2), 16, lag0=0)
    with pytest.raises(ValueError, match="lag0"):
        fft_convolve(x, torch.randn(5, 2), 16, lag0=5)
    with pytest.raises(ValueError, match="kernel"):
        fft_convolve(x, torch.randn(5, 2), 16)
    with pytest.raises(ValueError, match="fft_len"):
        single_block_convolve(x, torch.randn(9, 2), 15, 0)


@pytest.mark.parametrize("recompute", [False, True])
@pytest.mark.parametrize(("n", "fft_len", "step", "offset", "rows", "lag0"), CASES[1::2])
def test_channel_chunks_are_exact(n, fft_len, step, offset, rows, lag0, recompute):
    """40 channels in chunks of 16, 16 and 8 (each staged contiguously before its transposed reads)."""
    x = torch.randn(2, n, 40, dtype=torch.float64, requires_grad=True)
    taps = torch.randn(rows, 40, dtype=torch.float64, requires_grad=True)
    assert channels_per_chunk(40, 2 * fft_len, 1) == 16
    assert channels_per_chunk(40, 2 * fft_len, None) == 40

    def convolve(a, k):
        return fft_convolve(a, k, fft_len, step, offset, lag0=lag0, recompute=recompute, chunk_elements=1)

    torch.testing.assert_close(convolve(x, taps), naive_direct_convolve(x, taps, lag0), atol=1e-12, rtol=0)
    assert torch.autograd.gradcheck(convolve, (x, taps), fast_mode=True)
    spectrum = torch.fft.rfft(torch.randn(fft_len, 40, dtype=torch.float64), dim=0).requires_grad_()
    assert torch.autograd.gradcheck(lambda a, k: fft_convolve(a, k, fft_len, step, offset, recompute=recompute,
                                                              chunk_elements=1), (x, spectrum), fast_mode=True)
