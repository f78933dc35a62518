"""The RPE's fused autograd node against its module path (the Linears, norm and ReLU one by one) and the plain
reference of naive.py, and when the module falls back to that path."""

from __future__ import annotations

import pytest
import torch
import torch.nn.functional as F
from torch import nn

from modeling_tnn.naive import naive_fused_rpe
from modeling_tnn.ops_fused_rpe import fused_rpe
from modeling_tnn.rpe import Rpe


def module_path(rpe: Rpe, positions: torch.Tensor, scale: torch.Tensor | None) -> torch.Tensor:
    """The RPE written out from its definition: Linear(1, r), layers x [norm, ReLU, Linear], [norm, ReLU, Linear]."""
    z = rpe.pos_proj(positions[:, None])
    for layer in [*rpe.layers, rpe.out_proj]:
        z = layer(F.relu(rpe.norm(z)))
    return z if scale is None else z * scale[:, None]


def node(rpe: Rpe, positions: torch.Tensor, scale: torch.Tensor | None = None) -> str:
    return type(rpe(positions, scale).grad_fn).__name__


@pytest.mark.parametrize("layers", [0, 2])
@pytest.mark.parametrize("with_scale", [False, True])
def test_fused_rpe_equals_the_module_path_with_exact_gradients(layers, with_scale):
    torch.manual_seed(0)
    rpe = Rpe(6, layers, 5).double()
    positions = torch.arange(-7, 8, dtype=torch.float64)
    scale = 0.9 ** positions.abs() if with_scale else None
    assert node(rpe, positions, scale) == "_RpeFunctionBackward"
    fused = rpe(positions, scale)
    reference = module_path(rpe, positions, scale)
    torch.testing.assert_close(fused, reference, atol=1e-13, rtol=0)
    grads = torch.autograd.grad(fused.square().sum(), list(rpe.parameters()))
    expected = torch.autograd.grad(reference.square().sum(), list(rpe.parameters()))
    for got, want in zip(grads, expected):
        torch.testing.assert_close(got, want, atol=1e-12, rtol=1e-10)
    params = tuple(p.detach().clone().requires_grad_() for p in rpe.parameters())
    names = [name for name, _ in rpe.named_parameters()]

    def evaluate(*values):
        return torch.func.functional_call(rpe, dict(zip(names, values)), (positions, scale))
    assert torch.autograd.gradcheck(evaluate, params)


def test_fused_rpe_skips_frozen_layers_gradients():
    rpe = Rpe(4, 1, 3)
    rpe.pos_proj.requires_grad_(False)
    rpe(torch.arange(5.0)).sum().backward()
    assert rpe.pos_proj.weight.grad is None and rpe.layers[0].weight.grad is not None


def test_fallback_to_the_module_path():
    """Hooks, a replaced Linear, half-precision parameters or a scale that needs a gradient: every Linear then runs
    through its module, with the same values."""
    torch.manual_seed(0)
    positions = torch.arange(6.0)
    rpe = Rpe(4, 1, 3)
    seen = []
    handle = rpe.layers[0].register_forward_hook(lambda *_: seen.append(1))
    assert node(rpe, positions) != "_RpeFunctionBackward" and seen
    handle.remove()
    assert node(rpe, positions) == "_RpeFunctionBackward"

    class Adapted(nn.Linear):
        pass
    adapted = Adapted(4, 3)
    adapted.load_state_dict(rpe.out_proj.state_dict())
    expected = rpe(positions)
    rpe.out_proj = adapted
    assert node(rpe, positions) != "_RpeFunctionBackward"
    torch.testing.assert_close(rpe(positions), expected)

    scale = torch.rand(6, requires_grad=True)
    assert node(rpe, positions, scale) != "_RpeFunctionBackward"

    half = Rpe(4, 1, 3).to(torch.bfloat16)
    assert half(positions).dtype == torch.float32 and node(half, positions) != "_RpeFunctionBackward"


@pytest.mark.parametrize("with_scale", [False, True])
def test_fused_rpe_op_is_the_plain_mlp_with_exact_gradients(with_scale):
    positions = torch.linspace(-3, 3, 9, dtype=torch.float64)
    scale = 0.9 ** positions.abs() if with_scale else None
    shapes = [(5, 1), (5, 5), (5, 5), (4, 5)]
    params = [t for out_in in shapes for t in (torch.randn(*out_in, dtype=torch.float64, requires_grad=True),
                                               torch.randn(out_in[0], dtype=torch.float64, requires_grad=True))]

    def plain(*values):
        return naive_fused_rpe(positions, list(values[0::2]), list(values[1::2]), 1e-8, scale)

    def fused(*values):
        return fused_rpe(positions, scale, 1e-8, *values)

    torch.testing.assert_close(fused(*params), plain(*params), atol=1e-13, rtol=0)
    assert torch.autograd.gradcheck(fused, tuple(params))
