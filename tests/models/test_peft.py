"""Every nn.Linear runs through its module (the RPE's included), so peft LoRA on "all-linear" trains every adapter
and hooks see every layer, while the RPE still computes in float32 for half-precision models."""

from __future__ import annotations

import pytest
import torch

from modeling_tnn import TnnForCausalLM, TnnForMaskedLM
from modeling_tnn.rpe import Rpe

from tests.support import tiny_config

peft = pytest.importorskip("peft", reason="peft is a dev dependency: pip install -e '.[dev]'")


@pytest.mark.parametrize(
    "cls, mixer, dtype",
    [(TnnForCausalLM, "dense", torch.float32), (TnnForCausalLM, "fd", torch.float32),
     (TnnForMaskedLM, "ski", torch.float32), (TnnForCausalLM, "dense", torch.bfloat16)],
)
def test_lora_all_linear_trains_every_adapter(cls, mixer, dtype):
    model = cls(tiny_config(mixer)).to(dtype)
    rpe_linears = sum(isinstance(m, torch.nn.Linear) for r in model.modules() if isinstance(r, Rpe)
                      for m in r.modules())
    # init_lora_weights=False: B starts non-zero too, so A also gets a non-zero gradient at the first step.
    lora = peft.get_peft_model(model, peft.LoraConfig(target_modules="all-linear", r=2, init_lora_weights=False))
    adapters = {name: p for name, p in lora.named_parameters() if "lora_" in name}
    assert sum(".rpe." in name for name in adapters) == 2 * rpe_linears > 0  # A and B of every RPE Linear
    assert all(p.requires_grad for p in adapters.values())

    lora.train()
    input_ids = torch.randint(1, model.config.vocab_size, (2, 12))
    optimizer = torch.optim.SGD([p for p in lora.parameters() if p.requires_grad], lr=1e-2)
    loss = lora(input_ids=input_ids, labels=input_ids).loss
    loss.backward()
    missing = sorted(name for name, p in adapters.items() if p.grad is None)
    zero = sorted(name for name, p in adapters.items() if p.grad is not None and not p.grad.abs().sum() > 0)
    assert not missing, f"adapters that never ran: {missing}"
    assert not zero, f"adapters with a zero gradient: {zero}"
    assert torch.isfinite(loss)
    optimizer.step()
    rpe = next(m for m in lora.modules() if isinstance(m, Rpe))
    assert rpe(torch.arange(4)).dtype == torch.float32  # at least float32, bfloat16 model and adapters included


@pytest.mark.parametrize("dtype", [torch.bfloat16, torch.float16])
def test_half_precision_rpe_runs_its_modules_in_float32(dtype):
    rpe = Rpe(8, 2, 4)
    half = Rpe(8, 2, 4)
    half.load_state_dict(rpe.state_dict())
    half.to(dtype)
    seen = []
    for layer in half.modules():
        if isinstance(layer, torch.nn.Linear):
            layer.register_forward_hook(lambda module, args, out: seen.append((args[0].dtype, out.dtype)))
    lags = torch.arange(-30, 30)
    out = half(lags)
    assert len(seen) == 4 and set(seen) == {(torch.float32, torch.float32)}  # every Linear, in float32
    # The same values as a float32 RPE holding the half-precision-rounded weights.
    rpe.load_state_dict({k: v.to(dtype).float() for k, v in rpe.state_dict().items()})
    torch.testing.assert_close(out, rpe(lags), rtol=0, atol=0)
    out.sum().backward()
    assert all(p.grad is not None and p.grad.dtype == dtype for p in half.parameters())
