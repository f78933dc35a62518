"""The device-sensitive checks, on the device the ``device`` fixture names (``$TNN_TEST_DEVICE``, default cpu;
``run_scripts/accelerator_check.py --device cuda`` runs this module on a GPU): forward and gradients against float64
on CPU, cached decoding against the no-cache forward, and what autocast really runs in low precision."""

from __future__ import annotations

import pytest
import torch

from tests.support import (CAUSAL_MIXERS, MIXERS, assert_low_precision_projections_and_float32_ffts, observed_dtypes,
                           tiny_model)

# 37 tokens: FFT sizes that are not powers of two (fft_length(37) = 75), which cuFFT cannot run in half precision.
LENGTH = 37


@pytest.fixture(autouse=True)
def _exact_matmuls():
    # TF32 matmuls on Ampere+ GPUs would be compared against float64 at float32 tolerances.
    if torch.cuda.is_available():
        previous = torch.backends.cuda.matmul.allow_tf32, torch.backends.cudnn.allow_tf32
        torch.backends.cuda.matmul.allow_tf32 = torch.backends.cudnn.allow_tf32 = False
        yield
        torch.backends.cuda.matmul.allow_tf32, torch.backends.cudnn.allow_tf32 = previous
    else:
        yield


@pytest.mark.parametrize("mixer", MIXERS)
def test_forward_and_gradients_on_the_device_equal_float64_on_cpu(device, mixer):
    reference = tiny_model(mixer).double()
    model = tiny_model(mixer).to(device)
    ids = torch.randint(1, 128, (2, LENGTH))
    expected = reference(input_ids=ids, labels=ids)
    expected.loss.backward()
    got = model(input_ids=ids.to(device), labels=ids.to(device))
    got.loss.backward()
    torch.testing.assert_close(got.logits.cpu().double(), expected.logits, atol=1e-4, rtol=1e-4)
    for (name, p), q in zip(model.named_parameters(), reference.parameters()):
        torch.testing.assert_close(p.grad.cpu().double(), q.grad, atol=1e-4, rtol=1e-3, msg=f"{name}.grad")


@pytest.mark.parametrize("mixer", CAUSAL_MIXERS)
def test_cached_greedy_decoding_on_the_device_equals_the_no_cache_forward(device, mixer):
    model = tiny_model(mixer, etsc_length=16, fd_kernel_length=16).to(device).eval()
    prompt = torch.randint(1, 128, (1, 5), device=device)
    kwargs = {"max_new_tokens": 10, "do_sample": False, "pad_token_id": 0, "return_dict_in_generate": True,
              "output_logits": True}
    cached, full = model.generate(prompt, **kwargs), model.generate(prompt, use_cache=False, **kwargs)
    assert torch.equal(cached.sequences, full.sequences)
    for a, b in zip(cached.logits, full.logits):
        torch.testing.assert_close(a, b, atol=1e-4, rtol=0)


@pytest.mark.parametrize("low", [torch.bfloat16, torch.float16], ids=["bf16", "fp16"])
@pytest.mark.parametrize("mixer", MIXERS)
def test_autocast_runs_projections_in_low_precision_and_ffts_in_float32(device, mixer, low):
    """fp16 and bf16 autocast (CPU and CUDA alike): the projections in low precision, the FFTs of dense and fd in
    float32 (the model upcasts and turns autocast off around them), gradients finite; SKI has no FFT."""
    model = tiny_model(mixer).to(device)
    ids = torch.randint(1, 128, (2, LENGTH), device=device)
    seen, outputs, loss = observed_dtypes(model, {"input_ids": ids, "labels": ids}, low)
    assert_low_precision_projections_and_float32_ffts(seen, outputs, low, uses_fft=mixer != "ski")
    assert loss.dtype == torch.float32
    assert all(torch.isfinite(p.grad).all() for p in model.parameters() if p.grad is not None)
