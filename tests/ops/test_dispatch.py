"""The convolution dispatcher: which operator runs per policy, device and shape, and that every path it takes
computes the same convolution (against naive.py, with exact gradients)."""

from __future__ import annotations

import pytest
import torch

from modeling_tnn import ops_dispatch
from modeling_tnn.naive import naive_direct_convolve
from modeling_tnn.ops_dispatch import (ConvolutionKernel, ConvolutionPolicy, Path, convolution_policy, convolve,
                                       current_policy, plan_convolution, use_direct)
from modeling_tnn.tno_dense import DenseTno
from modeling_tnn.tno_fd import FdTno

from tests.support import saved_bytes, tiny_config

FFT_ONLY = ConvolutionPolicy().forcing_direct(False)


def kernel_of(full: torch.Tensor, causal: bool, support: int | None = None) -> ConvolutionKernel:
    """A kernel description over fixed taps ``full``: lags 0..rows-1 (causal) or -(rows-1)/2..(rows-1)/2."""
    middle = 0 if causal else full.shape[0] // 2

    def taps(reach: int) -> torch.Tensor:
        return full[: reach + 1] if causal else full[middle - reach: middle + reach + 1]

    def spectrum(reach: int, fft_len: int) -> torch.Tensor:
        rows = taps(reach)
        layout = torch.cat([rows, rows.new_zeros(fft_len - rows.shape[0], rows.shape[1])])
        return torch.fft.rfft(layout.roll(0 if causal else -reach, 0), dim=0)
    return ConvolutionKernel(taps=taps, causal=causal, spectrum=spectrum, support=support)


def test_the_direct_path_is_chosen_by_length_batch_and_size():
    policy = ConvolutionPolicy()
    n = policy.direct_max_length
    assert use_direct(n, n, 8)
    assert not use_direct(n + 1, n + 1, 8)
    assert use_direct(n // 2, n, 8)
    assert not use_direct(n // 2 - 1, n, 8)  # fewer rows than half the matrices' side
    assert not use_direct(n, n, policy.direct_max_entries // (n * n) + 1)  # too many matrix entries
    assert use_direct(n + 1, n + 1, 8, policy.forcing_direct(True))
    assert not use_direct(n, n, 8, policy.forcing_direct(False))


def test_single_block_form_is_chosen_by_size_and_mode():
    """The unchunked FFT serves single blocks of a real kernel that keep their spectra and fit
    ``single_block_chunks`` channel chunks (none on CPU by default); recomputing, mapped or overlap-save inputs take
    the chunked convolution."""
    x = torch.randn(2, 9, 3, requires_grad=True)
    kernel = kernel_of(torch.randn(9, 3, requires_grad=True), causal=True)

    def node(policy: ConvolutionPolicy, **options) -> str:
        return type(convolve(x, kernel, policy=policy, **options).grad_fn).__name__

    assert node(FFT_ONLY, recompute=False) == "_BlockConvolutionBackward"  # CPU's default
    single = ConvolutionPolicy(single_block_chunks=4).forcing_direct(False)
    assert plan_convolution(x, kernel, False, policy=single).path is Path.SINGLE_BLOCK
    assert node(single, recompute=False) == "_SingleBlockConvolutionBackward"
    assert node(single, recompute=True) == "_BlockConvolutionBackward"
    assert plan_convolution(x, kernel, False, mapped=True, policy=single).path is Path.CHUNKED
    few = ConvolutionPolicy(single_block_chunks=4, chunk_elements=2 * 18 * 3 // 4 - 1).forcing_direct(False)
    assert node(few, recompute=False) == "_BlockConvolutionBackward"
    assert plan_convolution(x, kernel, False, policy=FFT_ONLY.as_on_accelerator()).path is Path.SINGLE_BLOCK
    long = torch.randn(2, 40, 3)
    narrow = kernel_of(torch.randn(3, 3), causal=True, support=2)
    assert plan_convolution(long, narrow, False, policy=single).path is Path.OVERLAP_SAVE


def test_recompute_is_chosen_by_size():
    """``recompute=None`` leaves it to ``recompute_bytes``: kept spectra at this size by default, only the real
    inputs saved above a zero threshold."""
    x = torch.randn(2, 64, 8, requires_grad=True)
    taps = torch.randn(64, 8, requires_grad=True)
    kernel = kernel_of(taps, causal=True)
    keep = saved_bytes(lambda: convolve(x, kernel, recompute=False, policy=FFT_ONLY))
    assert saved_bytes(lambda: convolve(x, kernel, policy=FFT_ONLY)) == keep
    with convolution_policy(FFT_ONLY, recompute_bytes=0):
        assert saved_bytes(lambda: convolve(x, kernel)) == (2 * 64 * 8 + 64 * 8) * 4 < keep


CASES = [(True, None, 11), (False, None, 11), (True, 3, 40), (False, 3, 40), (False, 8, 5)]
POLICIES = {"direct": ConvolutionPolicy().forcing_direct(True), "chunked": FFT_ONLY,
            "single block": ConvolutionPolicy(single_block_chunks=1 << 20).forcing_direct(False)}


@pytest.mark.parametrize("policy", POLICIES, ids=list(POLICIES))
@pytest.mark.parametrize(("causal", "support", "n"), CASES)
def test_every_path_is_the_direct_sum_with_exact_gradients(causal, support, n, policy):
    """Kernels as long as the input and of fixed support (overlap-save blocks on the FFT paths at n = 40), causal
    and two-sided, with taps or with a memoised spectrum."""
    rows = (n if support is None else support + 1) if causal else 2 * (n - 1 if support is None else support) + 1
    full = torch.randn(rows, 3, dtype=torch.float64, requires_grad=True)
    x = torch.randn(2, n, 3, dtype=torch.float64, requires_grad=True)
    kernel = kernel_of(full, causal, support)
    plan = plan_convolution(x, kernel, policy=POLICIES[policy])
    reach = plan.reach
    expected = naive_direct_convolve(x, kernel.taps(reach), 0 if causal else reach)
    torch.testing.assert_close(convolve(x, kernel, policy=POLICIES[policy]), expected, atol=1e-12, rtol=0)
    assert torch.autograd.gradcheck(lambda a, k: convolve(a, kernel_of(k, causal, support), policy=POLICIES[policy]),
                                    (x, full), fast_mode=True)
    cached = ConvolutionKernel(kernel.taps, causal, kernel.spectrum, support, spectrum_cached=True)
    torch.testing.assert_close(convolve(x, cached, policy=POLICIES[policy]), expected, atol=1e-12, rtol=0)


def test_fft_geometry_of_dense_and_fd_kernels():
    """A kernel as long as the input is one block of fft_length(n) points; FD's fixed support one block of at least
    n + reach points, or overlap-save blocks once that is twice the block size."""
    x = torch.randn(2, 80, 3)
    dense = DenseTno(tiny_config(causal=True), 3).convolution_kernel(x.device, x.dtype)
    plan = plan_convolution(x, dense, policy=FFT_ONLY)
    assert (plan.path, plan.reach, plan.lag0, plan.fft_len, plan.step) == (Path.CHUNKED, 79, 0, 160, None)
    fd = FdTno(tiny_config("fd", causal=False, fd_kernel_length=4), 3).convolution_kernel(x.device, x.dtype)
    plan = plan_convolution(x, fd, policy=FFT_ONLY)
    assert (plan.path, plan.reach, plan.lag0, plan.fft_len, plan.step, plan.offset) == (Path.OVERLAP_SAVE, 4, 4, 32,
                                                                                         24, 4)
    plan = plan_convolution(x[:, :6], fd, policy=FFT_ONLY)
    assert (plan.path, plan.reach, plan.fft_len) == (Path.CHUNKED, 4, 10)


@pytest.mark.parametrize("mixer_class, kind", [(DenseTno, "dense"), (FdTno, "fd")])
def test_mixers_take_the_direct_path_at_short_lengths(monkeypatch, mixer_class, kind):
    calls = []
    original = ops_dispatch.direct_convolve
    monkeypatch.setattr(ops_dispatch, "direct_convolve", lambda x, *a: calls.append(x.shape[1]) or original(x, *a))
    mixer = mixer_class(tiny_config(kind, causal=True, fd_kernel_length=8), 4)
    n = current_policy().direct_max_length
    mixer(torch.randn(n, n, 4))
    mixer(torch.randn(n + 1, n + 1, 4))
    mixer(torch.randn(n // 2 - 1, n, 4))
    assert calls == [n]


def test_policies_scope_and_refuse_bad_fields():
    default = current_policy()
    with convolution_policy(direct_max_length=0) as scoped:
        assert current_policy() is scoped and scoped.direct_max_length == 0
        with convolution_policy(chunk_elements=7):
            assert current_policy().direct_max_length == 0 and current_policy().chunk_elements == 7
        assert current_policy() is scoped
    assert current_policy() == default == ConvolutionPolicy()
    with pytest.raises(ValueError, match="direct_max_length"):
        ConvolutionPolicy(direct_max_length=-1)
    with pytest.raises(ValueError, match="block_multiple"):
        ConvolutionPolicy(block_multiple=1)
    assert ConvolutionPolicy().chunk_budget(torch.device("cpu")) == 1 << 19
    assert ConvolutionPolicy().chunk_budget(torch.device("meta")) is None
