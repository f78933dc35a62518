"""The projections' two weight layouts: fused (``uv_proj``, ``gate_up_proj``: one matmul each, what the model runs)
and split (two Linears each: what ``save_pretrained`` writes and earlier checkpoints hold), and the loading rule that
turns the split layout into the fused one."""

from __future__ import annotations

import torch

from .configuration_tnn import TnnConfig

# Checkpoints saved before the fused projections hold W_u / W_v and W1 / W2 as separate Linears: transformers
# concatenates them on load (and, saving in the original format as it does by default, splits them again).
_SPLIT_PROJECTIONS = {"gtu.uv_proj": ("gtu.u_proj", "gtu.v_proj"), "glu.gate_up_proj": ("glu.gate_proj", "glu.up_proj")}


def split_projections(state_dict: dict[str, torch.Tensor]) -> dict[str, torch.Tensor]:
    """``state_dict`` with each fused projection (``uv_proj``, ``gate_up_proj``) as its two halves under the split
    names: the layout ``save_pretrained`` writes and earlier versions of this model used."""
    out = {}
    for key, value in state_dict.items():
        fused = next((f for f in _SPLIT_PROJECTIONS if f".{f}." in f".{key}"), None)
        if fused is None:
            out[key] = value
            continue
        for name, half in zip(_SPLIT_PROJECTIONS[fused], value.chunk(2, dim=0)):
            out[key.replace(fused, name)] = half
    return out


def fuse_projections(state_dict: dict[str, torch.Tensor]) -> dict[str, torch.Tensor]:
    """The inverse of :func:`split_projections`: each pair of split projection tensors concatenated into the fused
    one (tensors of other names, and already fused ones, unchanged)."""
    out = dict(state_dict)
    for fused, (first, second) in _SPLIT_PROJECTIONS.items():
        for key in [k for k in out if f".{first}." in f".{k}"]:
            partner = key.replace(first, second)
            out[key.replace(first, fused)] = torch.cat([out.pop(key), out.pop(partner)], dim=0)
    return out


def register_split_projection_loading() -> None:
    """Register, for ``model_type="tnn"``, the conversion of split projection weights and biases into the fused
    Linears (transformers' dynamic weight loading: a ``WeightConverter`` with ``Concatenate(dim=0)``, reversed by
    ``save_pretrained``). The patterns are regular expressions and, reversed, replacement strings: plain names."""
    from transformers.conversion_mapping import get_checkpoint_conversion_mapping, register_checkpoint_conversion_mapping
    from transformers.core_model_loading import Concatenate, WeightConverter

    converters = [WeightConverter(source_patterns=[f"{first}.{kind}", f"{second}.{kind}"],
                                  target_patterns=f"{fused}.{kind}", operations=[Concatenate(dim=0)])
                  for fused, (first, second) in _SPLIT_PROJECTIONS.items() for kind in ("weight", "bias")]
    if get_checkpoint_conversion_mapping(TnnConfig.model_type) is None:  # a second copy of this module (remote code)
        register_checkpoint_conversion_mapping(TnnConfig.model_type, converters)
