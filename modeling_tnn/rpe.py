"""The parameter-free SimpleRMSNorm and the relative-position encoder (RPE) MLP of TNN."""

from __future__ import annotations

import torch
import torch.nn.functional as F
from torch import nn
from torch.func import functional_call

from .ops_fused_rpe import fused_rpe
from .ops_rms_norm import _norm_and_scale, rms_norm
from .runtime import compute_dtype, tracing


class SimpleRMSNorm(nn.Module):
    """``x / (rms(x) + eps)`` over the last dimension, with no learnable parameters (the eps is outside the sqrt).

    When gradients flow it keeps its output for backward instead of its input (ops_rms_norm.rms_norm)."""

    def __init__(self, eps: float = 1e-8):
        super().__init__()
        self.eps = eps
        self._eps_tensors: dict[tuple, torch.Tensor] = {}

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        if tracing():
            return x / _norm_and_scale(x, self.eps)[1]
        # eps as a 0-d tensor of x's dtype and device, made once (wrapping it costs four operators a call); looked up
        # here, not in a helper: a decoding step runs 2 norms a layer and is bound by its Python calls.
        key = (x.dtype, x.device, self.eps)
        eps = self._eps_tensors.get(key)
        if eps is None:
            eps = self._eps_tensors[key] = torch.tensor(self.eps, dtype=x.dtype, device=x.device)
        if torch.is_grad_enabled() and x.requires_grad:
            return rms_norm(x, eps)
        return x / _norm_and_scale(x, eps)[1]


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
                return fused_rpe(positions, scale, self.norm.eps, *params)
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
        """Whether ops_fused_rpe.fused_rpe computes exactly what the modules would: plain ``nn.Linear`` layers (no
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
