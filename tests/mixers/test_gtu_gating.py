"""The GTU's gating, ``Gtu.gate``: silu(u) * mixer(silu(v) * mask) through the fused ops (less kept for backward)
around every mixer and path, with the values of the plain composition."""

from __future__ import annotations

import pytest
import torch
from modeling_tnn.tnn_block import Gtu, build_token_mixer
from modeling_tnn.naive import naive_gtu_gate
from modeling_tnn.ops_dispatch import ConvolutionPolicy, convolution_policy

from tests.support import saved_bytes, tiny_config

CASES = [("dense", True), ("dense", False), ("fd", True), ("fd", False), ("ski", False)]


def composed(mixer, u_pre, v_pre, mask):
    """The plain gating around the mixer, written from its definition."""
    return naive_gtu_gate(u_pre, v_pre, lambda v: mixer(v, mask), mask)


_GTU: list[Gtu] = []


def gated(mixer, u_pre, v_pre, mask):
    """What the GTU computes around ``mixer`` (one tiny GTU, built once, lends its gating)."""
    if not _GTU:
        _GTU.append(Gtu(tiny_config(), 0))
    _GTU[0].token_mixer = mixer
    return _GTU[0].gate(u_pre, v_pre, mask)


def _inputs(dtype, n=40, channels=6, masked=True):
    u_pre = torch.randn(2, n, channels, dtype=dtype, requires_grad=True)
    v_pre = torch.randn(2, n, channels, dtype=dtype, requires_grad=True)
    mask = None
    if masked:
        mask = torch.ones(2, n)
        mask[1, -7:] = 0
    return u_pre, v_pre, mask


@pytest.mark.parametrize("recompute", [False, True])
@pytest.mark.parametrize("masked", [False, True])
@pytest.mark.parametrize(("kind", "causal"), CASES)
def test_gating_equals_the_composition(kind, causal, masked, recompute, mixer_path):
    mixer = build_token_mixer(tiny_config(kind, causal=causal, fd_kernel_length=8), 6).double()
    mixer.recompute_spectra = recompute
    u_pre, v_pre, mask = _inputs(torch.float64, masked=masked)
    got = gated(mixer, u_pre, v_pre, mask)
    wanted = composed(mixer, u_pre, v_pre, mask)
    torch.testing.assert_close(got, wanted, atol=1e-12, rtol=0)
    grad = torch.randn_like(got)
    inputs = [u_pre, v_pre, *mixer.parameters()]
    for a, b in zip(torch.autograd.grad(got, inputs, grad), torch.autograd.grad(wanted, inputs, grad)):
        torch.testing.assert_close(a, b, atol=1e-10, rtol=1e-8)


@pytest.mark.parametrize(("kind", "causal"), [("dense", True), ("fd", False), ("ski", False)])
def test_gating_gradcheck(kind, causal, mixer_path):
    mixer = build_token_mixer(tiny_config(kind, causal=causal, fd_kernel_length=4), 3).double()
    mixer.recompute_spectra = True
    u_pre, v_pre, mask = _inputs(torch.float64, n=11, channels=3)
    assert torch.autograd.gradcheck(lambda u, v: gated(mixer, u, v, mask), (u_pre, v_pre))


@pytest.mark.parametrize("kind", ["dense", "fd"])
def test_gating_float32_is_bitwise_the_composition(kind):
    mixer = build_token_mixer(tiny_config(kind, causal=True, fd_kernel_length=8), 6)
    u_pre, v_pre, mask = _inputs(torch.float32)
    torch.testing.assert_close(gated(mixer, u_pre, v_pre, mask), composed(mixer, u_pre, v_pre, mask),
                               atol=0, rtol=0)



@pytest.mark.parametrize(("kind", "causal"), [("dense", True), ("fd", True), ("ski", False)])
def test_gating_keeps_two_activations_less(kind, causal):
    """Two activation-sized tensors fewer: silu(u_pre) and the mixer's input (on the FFT path, which long inputs
    take)."""
    mixer = build_token_mixer(tiny_config(kind, causal=causal, fd_kernel_length=8), 16)
    mixer.recompute_spectra = True
    u_pre, v_pre, _ = _inputs(torch.float32, n=256, channels=16, masked=False)
    activation = u_pre.numel() * 4
    with convolution_policy(ConvolutionPolicy().forcing_direct(False)):
        fused = saved_bytes(lambda: gated(mixer, u_pre, v_pre, None))
        plain = saved_bytes(lambda: composed(mixer, u_pre, v_pre, None))
    assert plain - fused == 2 * activation


def test_gating_without_grad_is_the_composition():
    mixer = build_token_mixer(tiny_config("dense", causal=True), 6).eval()
    u_pre, v_pre, mask = _inputs(torch.float32)
    with torch.no_grad():
        torch.testing.assert_close(gated(mixer, u_pre, v_pre, mask), composed(mixer, u_pre, v_pre, mask),
                                   atol=0, rtol=0)


@pytest.mark.parametrize("kind, causal", CASES)
def test_a_whole_model_trains_the_same_lean_or_not(kind, causal, mixer_path):
    """The GTU gates through the fused ops: with fft_recompute=True (the silus and spectra recomputed in backward) a
    whole model's loss and every gradient equal those of fft_recompute=False (everything kept)."""
    from modeling_tnn import TnnForCausalLM, TnnForMaskedLM

    cls = TnnForCausalLM if causal else TnnForMaskedLM
    ids = torch.randint(1, 128, (2, 37))
    mask = torch.ones_like(ids)
    mask[1, :5] = 0
    results = []
    for recompute in (False, True):
        torch.manual_seed(0)
        model = cls(tiny_config(kind, causal=causal, fft_recompute=recompute)).double().train()
        loss = model(input_ids=ids, attention_mask=mask, labels=ids).loss
        loss.backward()
        results.append((loss.detach(), {n: p.grad.clone() for n, p in model.named_parameters() if p.grad is not None}))
    (loss_kept, grads_kept), (loss_lean, grads_lean) = results
    torch.testing.assert_close(loss_lean, loss_kept, rtol=0, atol=1e-12)
    assert grads_kept.keys() == grads_lean.keys() and grads_kept
    for name in grads_kept:
        torch.testing.assert_close(grads_lean[name], grads_kept[name], rtol=1e-9, atol=1e-11, msg=name)
