"""SimpleRMSNorm's operator, ``x / (rms(x) + eps)`` over the last dimension, with a hand-written backward that keeps
its output instead of its input (plain reference: naive.naive_rms_norm; the module is rpe.SimpleRMSNorm).

Why it exists: in a residual network the norm's input is the residual stream, which nothing else saves, while its
output is saved by the next Linear anyway: one activation fewer per norm (tests/ops/test_rms_norm.py checks what is
saved, and the gradients against the definition).
"""

from __future__ import annotations

import torch
from torch.autograd.function import once_differentiable


def _norm_and_scale(x: torch.Tensor, eps: float | torch.Tensor) -> tuple[torch.Tensor, torch.Tensor]:
    """``||x||`` and ``s = rms(x) + eps = ||x|| / sqrt(d) + eps`` over the last dimension (d entries), in three
    operations with no Python-scalar arithmetic (each scalar operand costs an operator or four to wrap); ``eps`` may
    be given as a 0-d tensor already, which saves the wrapping."""
    norm = torch.linalg.vector_norm(x, dim=-1, keepdim=True)
    eps = eps if isinstance(eps, torch.Tensor) else norm.new_full((), eps)
    return norm, torch.add(eps, norm, alpha=x.shape[-1] ** -0.5)


def rms_norm_forward(x: torch.Tensor, eps: float | torch.Tensor) -> tuple[torch.Tensor, torch.Tensor, torch.Tensor]:
    """:class:`_SimpleRMSNormFunction`'s forward: the output ``y = x / s``, and what its backward needs besides it,
    ``s = rms(x) + eps`` and ``s / ||x||`` (clamped where ``||x|| = 0``)."""
    norm, scale = _norm_and_scale(x, eps)
    y = x / scale
    return y, scale, scale / norm.clamp_min(torch.finfo(norm.dtype).tiny)


def rms_norm_backward(grad: torch.Tensor, y: torch.Tensor, scale: torch.Tensor, ratio: torch.Tensor,
                      factor: torch.Tensor | None = None) -> torch.Tensor:
    """The gradient of :class:`_SimpleRMSNormFunction`'s input from its output's ``grad``, output ``y``, ``scale``
    and ``ratio``; ``factor`` (the output itself where ``grad`` vanishes wherever it differs from ``y``, as behind a
    ReLU) may stand in for ``y`` in the projection."""
    projection = (grad * (y if factor is None else factor)).sum(dim=-1, keepdim=True).mul_(ratio)
    return torch.addcmul(grad, y, projection, value=-(y.shape[-1] ** -0.5)).div_(scale)


class _SimpleRMSNormFunction(torch.autograd.Function):
    """``y = x / s`` with ``s = rms(x) + eps``, saving the output, ``s`` and ``s / ||x||`` only (not the input).

    With ``r = rms(x) = ||x|| / sqrt(d)``: ``dL/dx = (g - y * sum(g * y) * s / (d * r)) / s`` over the last dimension,
    and ``s / (d r) = (s / ||x||) / sqrt(d)``, so the input need not stay alive for backward: in a residual network the
    norm's input is the residual stream, which nothing else saves, and its output is saved by the next Linear anyway.
    At ``||x|| = 0`` (an all-zero row) ``y`` and ``sum(g * y)`` vanish and the clamped ratio stays finite: the gradient
    is ``g / eps``, the limit the formula has there.
    """

    @staticmethod
    def forward(ctx, x: torch.Tensor, eps: float | torch.Tensor) -> torch.Tensor:
        y, scale, ratio = rms_norm_forward(x, eps)
        ctx.save_for_backward(y, scale, ratio)
        return y

    @staticmethod
    @once_differentiable
    def backward(ctx, grad: torch.Tensor):
        return rms_norm_backward(grad, *ctx.saved_tensors), None


def rms_norm(x: torch.Tensor, eps: float | torch.Tensor) -> torch.Tensor:
    """``x / (rms(x) + eps)`` keeping its output, not its input, for backward (:class:`_SimpleRMSNormFunction`)."""
    return _SimpleRMSNormFunction.apply(x, eps)
