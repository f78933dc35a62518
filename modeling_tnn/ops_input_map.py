"""The contract of an input map: an elementwise map an operator applies to its input inside its own autograd node,
so that only the pre-image is kept for backward (the GTU's ``silu(v_pre) * mask``, ops_fused_gating.SiluMask). A leaf
module: the convolutions, SKI's operator and the mixers name the type, and the maps implement it, without importing
each other."""

from __future__ import annotations

from typing import Protocol

import torch


class InputMap(Protocol):
    """An elementwise map an operator applies to its input inside its own autograd node (keeping only the
    pre-image for backward): ``map(pre)`` and the gradient back through it, ``map.backward(grad, pre)`` (which may
    overwrite ``grad``)."""

    def __call__(self, pre: torch.Tensor) -> torch.Tensor: ...

    def backward(self, grad: torch.Tensor, pre: torch.Tensor) -> torch.Tensor: ...
