"""The parameter-free SimpleRMSNorm and the relative-position encoder (RPE) MLP of TNN."""

from __future__ import annotations

import torch
import torch.nn.functional as F
from torch import nn
from torch.autograd.function import once_differentiable
from torch.func import functional_call

from .runtime import compute_dtype, tracing


def _norm_and_scale(x: torch.Tensor, eps: float | torch.Tensor) -> tuple[torch.Tensor, torch.Tensor]:
    """``||x||`` and ``s = rms(x) + eps = ||x|| / sqrt(d) + eps`` over the last dimension (d entries), in three
    operations with no Python-scalar arithmetic (each scalar operand costs an operator or four to wrap); ``eps`` may
    be given as a 0-d tensor already, which saves the wrapping."""
    norm = torch.linalg.vector_norm(x, dim=-1, keepdim=True)
    eps = eps if isinstance(eps, torch.Tensor) else norm.new_full((), eps)
    return norm, torch.add(eps, norm, alpha=x.shape[-1] ** -0.5)


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
        norm, scale = _norm_and_scale(x, eps)
        y = x / scale
        ctx.save_for_backward(y, scale, scale / norm.clamp_min(torch.finfo(norm.dtype).tiny))
        return y

    @staticmethod
    @once_differentiable
    def backward(ctx, grad: torch.Tensor):
        return _norm_backward(grad, *ctx.saved_tensors), None


def _norm_backward(grad: torch.Tensor, y: torch.Tensor, scale: torch.Tensor, ratio: torch.Tensor,
                   factor: torch.Tensor | None = None) -> torch.Tensor:
    """The gradient of :class:`_SimpleRMSNormFunction`'s input from its output's ``grad``, output ``y``, ``scale``
    and ``ratio``; ``factor`` (the output itself where ``grad`` vanishes wherever it differs from ``y``, as behind a
    ReLU) may stand in for ``y`` in the projection."""
    projection = (grad * (y if factor is None else factor)).sum(dim=-1, keepdim=True).mul_(ratio)
    return torch.addcmul(grad, y, projection, value=-(y.shape[-1] ** -0.5)).div_(scale)


class SimpleRMSNorm(nn.Module):
    """``x / (rms(x) + eps)`` over the last dimension, with no learnable parameters (the eps is outside the sqrt).

    When gradients flow it keeps its output for backward instead of its input (:class:`_SimpleRMSNormFunction`)."""

    def __init__(self, eps: float = 1e-8):
        super().__init__()
        self.eps = eps
        self._eps_tensors: dict[tuple, torch.Tensor] = {}

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        if tracing():
            return x / _norm_and_scale(x, self.eps)[1]
        eps = self._eps_tensor(x)
        if torch.is_grad_enabled() and x.requires_grad:
            return _SimpleRMSNormFunction.apply(x, eps)
        return x / _norm_and_scale(x, eps)[1]

    def _eps_tensor(self, x: torch.Tensor) -> torch.Tensor:
        """``eps`` as a 0-d tensor of ``x``'s dtype and device, made once (wrapping it costs four operators a call)."""
        key = (x.dtype, x.device, self.eps)
        if key not in self._eps_tensors:
            self._eps_tensors[key] = torch.tensor(self.eps, dtype=x.dtype, device=x.device)
        return self._eps_tensors[key]


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
        weights, biases = params[0::2], params[1::2]
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
        ctx.save_for_backward(positions, scale, *weights, *saved)
        ctx.layers = len(weights)
        return z

    @staticmethod
    @once_differentiable
    def backward(ctx, grad: torch.Tensor):
        saved = ctx.saved_tensors
        layers = ctx.layers
        positions, scale, weights = saved[0], saved[1], saved[2: 2 + layers]
        per_layer = saved[2 + layers:]
        needs = ctx.needs_input_grad[3:]
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
            grad = _norm_backward(grad_y, y, s, ratio, factor=inputs)  # grad_y = 0 where y <= 0: y == relu(y) elsewhere
        return None, None, None, *grads


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

    def forward(self, positions: torch.Tensor, scale: torch.Tensor | None = None) -> torch.Tensor:
        """``positions``: shape ``(L,)``; returns ``(L, out_dim)`` in float32, or float64 for float64 weights, each
        row multiplied by ``scale`` (L,) when given (the dense kernel's decay)."""
        dtype = compute_dtype(self.pos_proj.weight.dtype)  # (torch.promote_types is an operator call)
        with torch.autocast(device_type=positions.device.type, enabled=False):
            # (A no-op ``to`` is still an operator: skipped where the dtype already matches.)
            positions = positions if positions.dtype == dtype else positions.to(dtype)
            scale = scale if scale is None or scale.dtype == dtype else scale.to(dtype)
            if self._fusable(dtype) and (scale is None or not scale.requires_grad):
                params = [t for layer in self._linears() for t in (layer.weight, layer.bias)]
                return _RpeFunction.apply(positions, scale, self.norm.eps, *params)
            z = self._linear(self.pos_proj, positions[:, None], dtype)
            for layer in self.layers:
                z = self._linear(layer, F.relu(self.norm(z)), dtype)
            z = self._linear(self.out_proj, F.relu(self.norm(z)), dtype)
            return z if scale is None else z * scale[:, None]

    def supremum_bound(self) -> torch.Tensor:
        """Per output, an upper bound of ``|RPE(x)|`` over every input ``x`` (every lag, however large), (out_dim,)
        float64: what the compact decoding state's certificate assumes of the kernel beyond the lags it evaluates.

        The last stage is ``out_proj(relu(norm(z)))``; ``norm`` divides by the rms plus a positive eps, so
        ``||relu(norm(z))||_2 <= ||norm(z)||_2 < sqrt(d)`` and ``|RPE(x)_c| <= sqrt(d) ||w_c||_2 + |b_c|``. Kept
        here, beside the structure it reads: a change of the RPE's last stage must change this bound too."""
        import math  # (here, not at the top: this method is the bound's own hunk of the file)

        weight = self.out_proj.weight.detach().to(torch.float64)
        bias = self.out_proj.bias
        bias = weight.new_zeros(weight.shape[0]) if bias is None else bias.detach().to(torch.float64).abs()
        return math.sqrt(weight.shape[1]) * weight.norm(dim=1) + bias

    def _linears(self) -> list[nn.Module]:
        return [self.pos_proj, *self.layers, self.out_proj]

    def _fusable(self, dtype: torch.dtype) -> bool:
        """Whether :class:`_RpeFunction` computes exactly what the modules would: plain ``nn.Linear`` layers (no
        adapter has replaced one) with biases and parameters already in ``dtype``, the plain norm, and no hooks on any
        of them (nor global module hooks) that would expect to see each call; not under torch.compile or export,
        which trace the module path (and fuse it themselves)."""
        from torch.nn.modules import module as module_globals

        if tracing() or module_globals._global_forward_hooks or module_globals._global_forward_pre_hooks:
            return False
        modules = [self.norm, *self._linears()]
        if type(self.norm) is not SimpleRMSNorm or any(m._forward_hooks or m._forward_pre_hooks for m in modules):
            return False
        return all(type(layer) is nn.Linear and layer.bias is not None and layer.weight.dtype == dtype
                   and layer.bias.dtype == dtype for layer in self._linears())

    @staticmethod
    def _linear(layer: nn.Module, x: torch.Tensor, dtype: torch.dtype) -> torch.Tensor:
        """``layer(x)`` computed in ``dtype``: directly when its parameters already are in ``dtype`` (a float32
        model, or bfloat16 under autocast), else with its floating parameters cast to ``dtype`` for the call."""
        params = dict(layer.named_parameters())
        if all(p.dtype == dtype or not p.is_floating_point() for p in params.values()):
            return layer(x)
        upcast = {name: p.to(dtype) if p.is_floating_point() else p for name, p in params.items()}
        return functional_call(layer, upcast, (x,))
