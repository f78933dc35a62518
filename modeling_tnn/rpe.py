"""The parameter-free SimpleRMSNorm and the relative-position encoder (RPE) MLP of TNN."""

from __future__ import annotations

import torch
import torch.nn.functional as F
from torch import nn
from torch.autograd.function import once_differentiable
from torch.func import functional_call

from .mixer_base import tracing


def _norm_and_scale(x: torch.Tensor, eps: float) -> tuple[torch.Tensor, torch.Tensor]:
    """``||x||`` and ``s = rms(x) + eps = ||x|| / sqrt(d) + eps`` over the last dimension (d entries), in three
    operations with no Python-scalar arithmetic (each scalar operand costs an operator or four to wrap)."""
    norm = torch.linalg.vector_norm(x, dim=-1, keepdim=True)
    return norm, torch.add(norm.new_full((), eps), norm, alpha=x.shape[-1] ** -0.5)


class _SimpleRMSNormFunction(torch.autograd.Function):
    """``y = x / s`` with ``s = rms(x) + eps``, saving the output, ``s`` and ``s / ||x||`` only (not the input).

    With ``r = rms(x) = ||x|| / sqrt(d)``: ``dL/dx = (g - y * sum(g * y) * s / (d * r)) / s`` over the last dimension,
    and ``s / (d r) = (s / ||x||) / sqrt(d)``, so the input need not stay alive for backward: in a residual network the
    norm's input is the residual stream, which nothing else saves, and its output is saved by the next Linear anyway.
    At ``||x|| = 0`` (an all-zero row) ``y`` and ``sum(g * y)`` vanish and the clamped ratio stays finite: the gradient
    is ``g / eps``, the limit the formula has there.
    """

    @staticmethod
    def forward(ctx, x: torch.Tensor, eps: float) -> torch.Tensor:
        norm, scale = _norm_and_scale(x, eps)
        y = x / scale
        ctx.save_for_backward(y, scale, scale / norm.clamp_min(torch.finfo(norm.dtype).tiny))
        return y

    @staticmethod
    @once_differentiable
    def backward(ctx, grad: torch.Tensor):
        y, scale, ratio = ctx.saved_tensors
        projection = (grad * y).sum(dim=-1, keepdim=True).mul_(ratio)
        return torch.addcmul(grad, y, projection, value=-(y.shape[-1] ** -0.5)).div_(scale), None


class SimpleRMSNorm(nn.Module):
    """``x / (rms(x) + eps)`` over the last dimension, with no learnable parameters (the eps is outside the sqrt).

    When gradients flow it keeps its output for backward instead of its input (:class:`_SimpleRMSNormFunction`)."""

    def __init__(self, eps: float = 1e-8):
        super().__init__()
        self.eps = eps

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        if torch.is_grad_enabled() and x.requires_grad and not tracing():
            return _SimpleRMSNormFunction.apply(x, self.eps)
        return x / _norm_and_scale(x, self.eps)[1]


class Rpe(nn.Module):
    """Relative-position encoder: maps a scalar (a lag, or a frequency for FD) to ``out_dim`` kernel values.

    ``Linear(1, r)``, then ``layers`` x ``[SimpleRMSNorm, ReLU, Linear(r, r)]``, then
    ``[SimpleRMSNorm, ReLU, Linear(r, out_dim)]``. It always computes in at least float32: its inputs are raw
    integer lags up to the sequence length, which half precision cannot represent. Every Linear runs through its
    module (``layer(x)``), so hooks and adapters (peft LoRA on ``"all-linear"``) see it; autocast is disabled and,
    when a layer's parameters are in half precision (a model cast with ``.to(torch.bfloat16)``), the layer runs with
    float32 copies of them (``torch.func.functional_call``; gradients flow back to the half-precision parameters).
    """

    def __init__(self, dim: int, layers: int, out_dim: int):
        super().__init__()
        self.pos_proj = nn.Linear(1, dim)
        self.layers = nn.ModuleList(nn.Linear(dim, dim) for _ in range(layers))
        self.out_proj = nn.Linear(dim, out_dim)
        self.norm = SimpleRMSNorm()

    def forward(self, positions: torch.Tensor) -> torch.Tensor:
        """``positions``: shape ``(L,)``; returns ``(L, out_dim)`` in float32, or float64 for float64 weights."""
        dtype = torch.promote_types(self.pos_proj.weight.dtype, torch.float32)
        with torch.autocast(device_type=positions.device.type, enabled=False):
            z = self._linear(self.pos_proj, positions.to(dtype)[:, None], dtype)
            for layer in self.layers:
                z = self._linear(layer, F.relu(self.norm(z)), dtype)
            return self._linear(self.out_proj, F.relu(self.norm(z)), dtype)

    @staticmethod
    def _linear(layer: nn.Module, x: torch.Tensor, dtype: torch.dtype) -> torch.Tensor:
        """``layer(x)`` computed in ``dtype``: directly when its parameters already are in ``dtype`` (a float32
        model, or bfloat16 under autocast), else with its floating parameters cast to ``dtype`` for the call."""
        params = dict(layer.named_parameters())
        if all(p.dtype == dtype or not p.is_floating_point() for p in params.values()):
            return layer(x)
        upcast = {name: p.to(dtype) if p.is_floating_point() else p for name, p in params.items()}
        return functional_call(layer, upcast, (x,))
