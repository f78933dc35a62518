"""The GTU's fused gating ops (ops_fused_gating) against the plain composition of naive.py: the gate that recomputes
its silu, and the silu * mask input map the convolutions apply inside their autograd node."""

from __future__ import annotations

import pytest
import torch
import torch.nn.functional as F

from modeling_tnn.naive import naive_direct_convolve, naive_gtu_gate, naive_silu_mask
from modeling_tnn.ops_dispatch import ConvolutionKernel, ConvolutionPolicy, convolve
from modeling_tnn.ops_fft_convolution import fft_convolve
from modeling_tnn.ops_fused_gating import SiluMask, silu_gate, silu_mask

from tests.support import saved_bytes


def test_silu_gate_is_the_plain_gate_with_exact_gradients_and_keeps_less():
    pre = torch.randn(2, 7, 3, dtype=torch.float64, requires_grad=True)
    mixed = torch.randn(2, 7, 3, dtype=torch.float64, requires_grad=True)
    plain = naive_gtu_gate(pre, torch.zeros_like(pre), lambda _: mixed)
    torch.testing.assert_close(silu_gate(pre, mixed), plain, atol=0, rtol=0)
    assert torch.autograd.gradcheck(silu_gate, (pre, mixed))
    activation = pre.numel() * 8
    assert saved_bytes(lambda: F.silu(pre) * mixed) - saved_bytes(lambda: silu_gate(pre, mixed)) == activation


@pytest.mark.parametrize("masked", [False, True])
def test_silu_mask_map_is_the_masked_silu(masked):
    pre = torch.randn(2, 6, 3, dtype=torch.float64, requires_grad=True)
    mask = torch.tensor([[1.0] * 6, [1.0] * 4 + [0.0] * 2], dtype=torch.float64) if masked else None
    torch.testing.assert_close(silu_mask(pre, mask), naive_silu_mask(pre, mask), atol=0, rtol=0)
    torch.testing.assert_close(SiluMask(mask)(pre), naive_silu_mask(pre, mask), atol=0, rtol=0)
    grad = torch.randn(2, 6, 3, dtype=torch.float64)
    (wanted,) = torch.autograd.grad(naive_silu_mask(pre, mask), pre, grad)
    torch.testing.assert_close(SiluMask(mask).backward(grad.clone(), pre.detach()), wanted, atol=1e-15, rtol=0)


@pytest.mark.parametrize("masked", [False, True])
@pytest.mark.parametrize("recompute", [False, True])
def test_activated_input_is_silu_then_mask(recompute, masked):
    """The convolution with an input map convolves silu(x) * mask, with exact gradients through the activation."""
    x = torch.randn(2, 9, 3, dtype=torch.float64, requires_grad=True)
    taps = torch.randn(9, 3, dtype=torch.float64, requires_grad=True)
    mask = torch.tensor([[1.0] * 9, [1.0] * 6 + [0.0] * 3], dtype=torch.float64) if masked else None

    def convolve_mapped(a, k):
        return fft_convolve(a, k, 18, lag0=0, recompute=recompute, input_map=SiluMask(mask))

    activated = naive_silu_mask(x, mask)
    torch.testing.assert_close(convolve_mapped(x, taps), naive_direct_convolve(activated, taps, 0), atol=1e-12, rtol=0)
    assert torch.autograd.gradcheck(convolve_mapped, (x, taps))


@pytest.mark.parametrize("direct", [True, False])
def test_the_dispatcher_keeps_only_the_pre_image_on_the_fft_path(direct):
    """On the FFT path the map runs inside the convolution (its input is not kept); the direct path runs it in front
    (short inputs keep little). Same values either way."""
    x = torch.randn(2, 64, 8, requires_grad=True)
    taps = torch.randn(64, 8, requires_grad=True)
    kernel = ConvolutionKernel(taps=lambda reach: taps[: reach + 1], causal=True)
    policy = ConvolutionPolicy().forcing_direct(direct)
    mapped = convolve(x, kernel, recompute=True, input_map=SiluMask(None), policy=policy)
    plain = convolve(F.silu(x), kernel, recompute=True, policy=policy)
    torch.testing.assert_close(mapped, plain, atol=0, rtol=0)
    mapped_bytes = saved_bytes(lambda: convolve(x, kernel, recompute=True, input_map=SiluMask(None), policy=policy))
    plain_bytes = saved_bytes(lambda: convolve(F.silu(x), kernel, recompute=True, policy=policy))
    assert (plain_bytes - mapped_bytes == x.numel() * 4) != direct
