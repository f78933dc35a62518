"""torch.compile for training: the compiled model's loss and every gradient equal eager's within float32 noise,
on both of the dense and FD mixers' paths (the direct product at short lengths, the FFT beyond)."""

from __future__ import annotations

import pytest
import torch

from modeling_tnn import TnnForCausalLM, TnnForMaskedLM

from tests.support import tiny_config


def _loss_and_grads(model, ids, run=None):
    """Loss and gradients of ``model``'s parameters, the forward run by ``run`` (the model itself, or compiled)."""
    model.zero_grad(set_to_none=True)
    run = model if run is None else run
    kwargs = dict(use_cache=False) if isinstance(model, TnnForCausalLM) else {}
    loss = run(input_ids=ids, labels=ids, **kwargs).loss
    loss.backward()
    return loss.detach(), {n: p.grad.clone() for n, p in model.named_parameters() if p.grad is not None}


@pytest.mark.parametrize("cls, mixer", [(TnnForCausalLM, "dense"), (TnnForCausalLM, "fd"), (TnnForMaskedLM, "ski")])
def test_compiled_training_step_equals_eager(cls, mixer, mixer_path):
    """Backend aot_eager: the graph capture and autograd tracing torch.compile does (inductor's C++ build takes
    minutes on a small CPU; run_scripts/bench_training.py --compile checks inductor's results against eager)."""
    torch._dynamo.reset()
    model = cls(tiny_config(mixer)).train()
    ids = torch.randint(1, model.config.vocab_size, (2, 19))
    loss, grads = _loss_and_grads(model, ids)
    compiled_loss, compiled_grads = _loss_and_grads(model, ids, torch.compile(model, backend="aot_eager"))
    torch.testing.assert_close(compiled_loss, loss, rtol=1e-5, atol=1e-6)
    assert compiled_grads.keys() == grads.keys()
    for name, grad in grads.items():
        torch.testing.assert_close(compiled_grads[name], grad, rtol=1e-4, atol=1e-6, msg=name)
