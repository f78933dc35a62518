"""The device-sensitive checks, on the device the ``device`` fixture names (``$TNN_TEST_DEVICE``, default cpu;
``run_scripts/accelerator_check.py --device cuda`` runs this module on a GPU): forward and gradients against float64
on CPU, cached decoding against the no-cache forward, and what autocast really runs in low precision."""

from __future__ import annotations

from collections import defaultdict

import pytest
import torch
from torch.utils._python_dispatch import TorchDispatchMode

from modeling_tnn import TnnForCausalLM, TnnForMaskedLM

from tests.support import CAUSAL_MIXERS, MIXERS, tiny_config

# 37 tokens: FFT sizes that are not powers of two (fft_length(37) = 75), which cuFFT cannot run in half precision.
LENGTH = 37
# The projections of each block: GTU's u/v/o and the GLU's; autocast should run them in low precision.
PROJECTIONS = ("uv_proj", "o_proj", "gate_up_proj", "down_proj")


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


def _model(mixer: str, **overrides) -> torch.nn.Module:
    torch.manual_seed(0)
    model_class = TnnForCausalLM if mixer in CAUSAL_MIXERS else TnnForMaskedLM
    return model_class(tiny_config(mixer, eos_token_id=None, **overrides))


class DtypeRecorder(TorchDispatchMode):
    """Records, for every aten op run inside it, the dtypes of its first tensor argument: what the kernels really
    received, after autocast's casts and the model's own."""

    def __init__(self):
        super().__init__()
        self.seen: dict[str, set[torch.dtype]] = defaultdict(set)

    def __torch_dispatch__(self, func, types, args=(), kwargs=None):
        first = next((arg for arg in args if isinstance(arg, torch.Tensor)), None)
        if first is not None:
            self.seen[func.overloadpacket.__name__].add(first.dtype)
        return func(*args, **(kwargs or {}))


def observed_dtypes(model: torch.nn.Module, inputs: dict, autocast_dtype: torch.dtype | None
                    ) -> tuple[dict[str, set[torch.dtype]], dict[str, set[torch.dtype]], torch.Tensor]:
    """One training step's forward (under autocast when ``autocast_dtype`` is given, as Accelerate runs it) and
    backward (outside autocast, as Accelerate runs it) of ``model``: the dtypes each aten op received, the output
    dtypes of the block projections, and the loss."""
    outputs: dict[str, set[torch.dtype]] = defaultdict(set)
    hooks = [module.register_forward_hook(lambda _m, _i, out, key=name.rsplit(".", 1)[-1]: outputs[key].add(out.dtype))
             for name, module in model.named_modules() if name.rsplit(".", 1)[-1] in PROJECTIONS]
    device_type = next(model.parameters()).device.type
    recorder = DtypeRecorder()
    try:
        with recorder:
            with torch.autocast(device_type, dtype=autocast_dtype or torch.float32, enabled=autocast_dtype is not None):
                loss = model(**inputs).loss
            loss.backward()
    finally:
        for hook in hooks:
            hook.remove()
    return recorder.seen, outputs, loss


def assert_low_precision_projections_and_float32_ffts(seen, outputs, low: torch.dtype, uses_fft: bool) -> None:
    assert set(outputs) == set(PROJECTIONS) and all(dtypes == {low} for dtypes in outputs.values()), outputs
    if uses_fft:  # forward and backward FFTs: real float32 in, complex64 back
        assert seen["_fft_r2c"] == {torch.float32} and seen["_fft_c2r"] == {torch.complex64}, dict(seen)
    else:
        assert not any(op.startswith("_fft") for op in seen)


def assert_float32_token_mixing(seen, path: str) -> None:
    """The mixer ran in float32 on the path it took: the FFTs, or the short-sequence Toeplitz product (the only
    ``bmm`` of a block: the projections are 2-D matrix products; FD's kernel is still built by FFTs there)."""
    if path == "direct":
        assert seen["bmm"] == {torch.float32}, dict(seen)
    if path == "fft" or "_fft_r2c" in seen:
        assert seen["_fft_r2c"] == {torch.float32} and seen["_fft_c2r"] == {torch.complex64}, dict(seen)


@pytest.mark.parametrize("mixer", MIXERS)
def test_forward_and_gradients_on_the_device_equal_float64_on_cpu(device, mixer):
    reference = _model(mixer).double()
    model = _model(mixer).to(device)
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
    model = _model(mixer, etsc_length=16, fd_kernel_length=16).to(device).eval()
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
    model = _model(mixer).to(device)
    ids = torch.randint(1, 128, (2, LENGTH), device=device)
    seen, outputs, loss = observed_dtypes(model, {"input_ids": ids, "labels": ids}, low)
    assert_low_precision_projections_and_float32_ffts(seen, outputs, low, uses_fft=mixer != "ski")
    assert loss.dtype == torch.float32
    assert all(torch.isfinite(p.grad).all() for p in model.parameters() if p.grad is not None)
