"""The RPE MLP as one autograd node, beside its plain composition (the modules of rpe.Rpe one by one, which
rpe.Rpe falls back to; reference: naive.naive_fused_rpe). The operator count it saves, measured, is in its docstring."""

from __future__ import annotations

from collections.abc import Sequence

import torch
from torch.autograd.function import once_differentiable

from .ops_rms_norm import _norm_and_scale, rms_norm_backward


def fused_rpe_forward(positions: torch.Tensor, scale: torch.Tensor | None, eps: float,
                      weights: Sequence[torch.Tensor], biases: Sequence[torch.Tensor]
                      ) -> tuple[torch.Tensor, list[torch.Tensor | None]]:
    """:class:`_RpeFunction`'s forward: the output and what :func:`fused_rpe_backward` needs, ``positions`` and
    ``scale`` as (L, 1) columns, then per layer after the first the norm's output ``y``, the ReLU's ``relu(y)``, and
    the norm's ``s`` and ``s / ||z||``."""
    positions, scale = positions[:, None], None if scale is None else scale[:, None]  # (L, 1) columns
    # The first Linear maps a scalar: an outer product, one addcmul (a mm, its transposes and a bias add record
    # twice as many operators); mm then add_ for the others (addmm's broadcast of the bias is a copy, and more).
    z = torch.addcmul(biases[0], positions, weights[0].view(-1))
    saved = []
    eps_tensor = z.new_full((), eps)  # one 0-d tensor for every norm's eps
    for weight, bias in zip(weights[1:], biases[1:]):
        norm, s = _norm_and_scale(z, eps_tensor)
        y = z / s
        hidden = y.clamp_min(0)  # relu: one operator where relu() records two
        saved += [y, hidden, s, s / norm.clamp_min(torch.finfo(norm.dtype).tiny)]
        z = torch.mm(hidden, weight.t()).add_(bias)
    if scale is not None:
        z = z.mul_(scale)
    return z, [positions, scale, *saved]


def fused_rpe_backward(grad: torch.Tensor, weights: Sequence[torch.Tensor], saved: Sequence[torch.Tensor | None],
                       needs: Sequence[bool]) -> list[torch.Tensor | None]:
    """The gradients of :class:`_RpeFunction`'s parameters (weight, bias of each Linear in order; None where
    ``needs`` says no) from that of its output, with the Linears' ``weights`` and what :func:`fused_rpe_forward`
    ``saved``."""
    layers = len(weights)
    positions, scale, per_layer = saved[0], saved[1], saved[2:]
    grads: list[torch.Tensor | None] = [None] * (2 * layers)
    if scale is not None:
        grad = grad * scale
    for i in range(layers - 1, -1, -1):
        if i == 0:
            inputs = positions
        else:
            y, inputs, s, ratio = per_layer[4 * (i - 1): 4 * i]
        if needs[2 * i]:
            grads[2 * i] = torch.mm(grad.t(), inputs)
        if needs[2 * i + 1]:
            grads[2 * i + 1] = grad.sum(0)
        if i == 0 or not any(needs[: 2 * i]):
            break
        # Back through the Linear, the ReLU (relu(y) > 0 where y > 0) and the norm (closed form, as
        # _SimpleRMSNormFunction: dz = (g - y sum(g y) (s / ||z||) / sqrt(r)) / s).
        grad_y = torch.ops.aten.threshold_backward(torch.mm(grad, weights[i]), inputs, 0)
        grad = rms_norm_backward(grad_y, y, s, ratio, factor=inputs)  # grad_y = 0 where y <= 0: y == relu(y) elsewhere
    return grads


class _RpeFunction(torch.autograd.Function):
    """The whole RPE MLP (and an optional per-row factor, the dense kernel's decay) as one autograd node:
    ``z_0 = p w_0^T + b_0``, ``z_{i+1} = relu(norm(z_i)) w_{i+1}^T + b_{i+1}``, output ``z_last * scale[:, None]``.

    The module path records about 270 operators forward and backward for a 3-layer RPE (every Linear, norm and
    ReLU its own node, each with its views and Python-scalar wrappers); here the forward is an mm, a bias add, a norm, a
    divide and a ReLU per layer, and the backward the matching mm / sum / closed-form norm gradient
    (:class:`_SimpleRMSNormFunction`'s). Saves per layer the norm's output ``y``, the ReLU's ``relu(y)`` (the next
    Linear's input) and the norm's ``s`` and ``s / ||z||``: (L, r) tensors, small next to the activations.
    """

    @staticmethod
    def forward(ctx, positions: torch.Tensor, scale: torch.Tensor | None, eps: float, *params: torch.Tensor):
        weights = params[0::2]
        z, saved = fused_rpe_forward(positions, scale, eps, weights, params[1::2])
        ctx.save_for_backward(*weights, *saved)
        ctx.layers = len(weights)
        return z

    @staticmethod
    @once_differentiable
    def backward(ctx, grad: torch.Tensor):
        saved = ctx.saved_tensors  # unpacked once: activation checkpointing allows no second unpacking
        grads = fused_rpe_backward(grad, saved[: ctx.layers], saved[ctx.layers:], ctx.needs_input_grad[3:])
        return None, None, None, *grads


def fused_rpe(positions: torch.Tensor, scale: torch.Tensor | None, eps: float, *params: torch.Tensor) -> torch.Tensor:
    """The RPE MLP at ``positions`` (L,) with ``params`` = weight, bias of each Linear in order (first maps a
    scalar), the norm's ``eps``, each output row times ``scale`` (L,) when given (no gradient to it): (L, out)."""
    return _RpeFunction.apply(positions, scale, eps, *params)
