"""The TNN block: a Gated Toeplitz Unit (token mixing) and a GLU (channel mixing), each on a residual branch with
a parameter-free norm; the token mixer each config names; the norm after the last block."""

from __future__ import annotations

import torch
import torch.nn.functional as F
from torch import nn
from transformers.modeling_layers import GradientCheckpointingLayer

from .configuration_tnn import TnnConfig
from .decoding_cache import TnnCache, mix_with_cache
from .mixer_base import TokenMixer
from .ops_dispatch import fuses_gating
from .ops_documents import DocumentLayout
from .ops_fused_gating import SiluMask, apply_mask, silu_gate, silu_mask
from .rpe import SimpleRMSNorm
from .runtime import as_dtype, compute_dtype
from .tno_dense import DenseTno
from .tno_fd import FdTno
from .tno_ski import SkiTno

TOKEN_MIXER_CLASSES: dict[str, type[TokenMixer]] = {"dense": DenseTno, "fd": FdTno, "ski": SkiTno}


def build_token_mixer(config: TnnConfig, channels: int) -> TokenMixer:
    """The token mixer named by ``config.token_mixer`` (validated by the config)."""
    return TOKEN_MIXER_CLASSES[config.token_mixer](config, channels)


class Gtu(nn.Module):
    """Gated Toeplitz Unit: ``W_o(silu(W_u x) * TokenMixer(silu(W_v x)))``; pad positions of the mixer input are
    zeroed so that padding never reaches a real token. ``W_u`` and ``W_v`` are one Linear, ``uv_proj`` (``W_u``'s
    rows first): one matmul instead of two, forward and backward."""

    def __init__(self, config: TnnConfig, layer_idx: int = 0):
        super().__init__()
        self.layer_idx = layer_idx
        width = config.gtu_dim
        self.uv_proj = nn.Linear(config.hidden_size, 2 * width)
        self.o_proj = nn.Linear(width, config.hidden_size)
        self.token_mixer = build_token_mixer(config, width)

    def forward(self, x: torch.Tensor, attention_mask: torch.Tensor | None = None,
                cache: TnnCache | None = None, documents: DocumentLayout | None = None) -> torch.Tensor:
        if cache is not None:  # decoding: both halves through one silu (a step is bound by its operator calls)
            u, v = F.silu(self.uv_proj(x)).chunk(2, dim=-1)
            mixed = mix_with_cache(self.token_mixer, apply_mask(v, attention_mask), attention_mask,
                                   cache.layers[self.layer_idx], cache)
            return self.o_proj(u * as_dtype(mixed, u.dtype))
        u_pre, v_pre = self.uv_proj(x).chunk(2, dim=-1)
        return self.o_proj(self.gate(u_pre, v_pre, attention_mask, documents))

    def gate(self, u_pre: torch.Tensor, v_pre: torch.Tensor, attention_mask: torch.Tensor | None = None,
             documents: DocumentLayout | None = None) -> torch.Tensor:
        """``silu(u_pre) * token_mixer(silu(v_pre) * mask)`` without a cache: through the fused ops where
        ops_dispatch.fuses_gating says so, else the plain composition; the same values either way. With
        ``documents`` (a packed batch) each document is mixed alone."""
        lean = fuses_gating(u_pre, v_pre, self.token_mixer.recompute_spectra)
        if lean and v_pre.dtype == compute_dtype(v_pre.dtype):  # silu * mask inside the mixer's operator
            mixed = self.token_mixer(v_pre, attention_mask, SiluMask(attention_mask), documents)
        else:
            mixed = self.token_mixer(silu_mask(v_pre, attention_mask), attention_mask, documents=documents)
        mixed = as_dtype(mixed, u_pre.dtype)
        return silu_gate(u_pre, mixed) if lean else F.silu(u_pre) * mixed


class Glu(nn.Module):
    """Channel mixer ``W3(silu(W1 x) * W2 x)``, ``W1`` and ``W2`` one Linear (``gate_up_proj``, ``W1``'s rows
    first)."""

    def __init__(self, config: TnnConfig):
        super().__init__()
        self.gate_up_proj = nn.Linear(config.hidden_size, 2 * config.glu_dim)
        self.down_proj = nn.Linear(config.glu_dim, config.hidden_size)

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        gate, up = self.gate_up_proj(x).chunk(2, dim=-1)
        return self.down_proj(F.silu(gate) * up)


class Dropout(nn.Dropout):
    """``nn.Dropout`` that calls nothing where it is the identity (``p == 0`` or eval mode): ``nn.Dropout`` still
    records an operator there, one per residual branch and step (on an accelerator, a launch)."""

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        return F.dropout(x, self.p, True, self.inplace) if self.training and self.p > 0 else x


class TnnBlock(GradientCheckpointingLayer):
    """A GTU and a GLU, each on a residual branch with a SimpleRMSNorm. ``config.norm_placement="pre"`` (default):
    ``x += drop(GTU(norm(x)))``, ``x += drop(GLU(norm(x)))``; ``"post"``: ``x = norm(x + drop(GTU(x)))``,
    ``x = norm(x + drop(GLU(x)))``. The norms are parameter-free, so both placements have the same weights."""

    def __init__(self, config: TnnConfig, layer_idx: int):
        super().__init__()
        self.layer_idx = layer_idx
        self.post_norm = config.norm_placement == "post"
        self.token_norm = SimpleRMSNorm()
        self.gtu = Gtu(config, layer_idx)
        self.channel_norm = SimpleRMSNorm()
        self.glu = Glu(config)
        self.dropout = Dropout(config.dropout)

    def forward(self, hidden_states: torch.Tensor, attention_mask: torch.Tensor | None = None,
                cache: TnnCache | None = None, documents: DocumentLayout | None = None) -> torch.Tensor:
        if self.post_norm:
            hidden_states = self.token_norm(
                hidden_states + self._drop(self.gtu(hidden_states, attention_mask, cache, documents)))
            return self.channel_norm(hidden_states + self._drop(self.glu(hidden_states)))
        hidden_states = hidden_states + self._drop(
            self.gtu(self.token_norm(hidden_states), attention_mask, cache, documents))
        return hidden_states + self._drop(self.glu(self.channel_norm(hidden_states)))

    def _drop(self, x: torch.Tensor) -> torch.Tensor:
        """The branch's dropout, not called in eval mode (where it is the identity): a module call is a few us of a
        decoding step."""
        return self.dropout(x) if self.training else x


def build_final_norm(config: TnnConfig) -> nn.Module:
    """The norm after the last block named by ``config.final_norm`` (validated by the config)."""
    if config.final_norm == "layernorm":
        return nn.LayerNorm(config.hidden_size)
    if config.final_norm == "simplermsnorm":
        return SimpleRMSNorm()
    return nn.Identity()
