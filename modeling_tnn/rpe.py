"""The parameter-free SimpleRMSNorm and the relative-position encoder (RPE) MLP of TNN."""

from __future__ import annotations

import torch
import torch.nn.functional as F
from torch import nn


class SimpleRMSNorm(nn.Module):
    """``x / (rms(x) + eps)`` over the last dimension, with no learnable parameters (the eps is outside the sqrt)."""

    def __init__(self, eps: float = 1e-8):
        super().__init__()
        self.eps = eps

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        rms = x.pow(2).mean(dim=-1, keepdim=True).sqrt()
        return x / (rms + self.eps)


class Rpe(nn.Module):
    """Relative-position encoder: maps a scalar (a lag, or a frequency for FD) to ``out_dim`` kernel values.

    ``Linear(1, r)``, then ``layers`` x ``[SimpleRMSNorm, ReLU, Linear(r, r)]``, then
    ``[SimpleRMSNorm, ReLU, Linear(r, out_dim)]``. It always computes in at least float32: its inputs are raw
    integer lags up to the sequence length, which half precision cannot represent.
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
    def _linear(layer: nn.Linear, x: torch.Tensor, dtype: torch.dtype) -> torch.Tensor:
        return F.linear(x, layer.weight.to(dtype), layer.bias.to(dtype))
