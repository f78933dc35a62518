"""torch.compile for training: the compiled model's loss and every gradient equal eager's within float32 noise,
on both of the dense and FD mixers' paths (the direct product at short lengths, the FFT beyond)."""

from __future__ import annotations

import pytest
import torch

from modeling_tnn import TnnForCausalLM, TnnForMaskedLM

from tests.support import loss_and_grads, tiny_config


@pytest.mark.parametrize("cls, mixer", [(TnnForCausalLM, "dense"), (TnnForCausalLM, "fd"), (TnnForMaskedLM, "ski")])
def test_compiled_training_step_equals_eager(cls, mixer, mixer_path):
    """Backend aot_eager: the graph capture and autograd tracing torch.compile does (inductor's C++ build takes
    minutes on a small CPU; run_scripts/bench_training.py --compile checks inductor's results against eager)."""
    torch._dynamo.reset()
    model = cls(tiny_config(mixer)).train()
    ids = torch.randint(1, model.config.vocab_size, (2, 19))
    kwargs = {"use_cache": False} if isinstance(model, TnnForCausalLM) else {}
    loss, grads = loss_and_grads(model, ids, **kwargs)
    compiled_loss, compiled_grads = loss_and_grads(model, ids, torch.compile(model, backend="aot_eager"), **kwargs)
    torch.testing.assert_close(compiled_loss, loss, rtol=1e-5, atol=1e-6)
    assert compiled_grads.keys() == grads.keys()
    for name, grad in grads.items():
        torch.testing.assert_close(compiled_grads[name], grad, rtol=1e-4, atol=1e-6, msg=name)
