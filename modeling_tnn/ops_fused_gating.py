"""The GTU's gating, ``silu(u_pre) * mixer(silu(v_pre) * mask)``, in two hand-fused pieces beside their plain
composition (:func:`silu_mask` and ``F.silu(u_pre) * mixed``, checked equal in tests/ops/test_fused_gating.py).

Why they exist (measured: tests/mixers/test_gtu_gating.py::test_gating_keeps_two_activations_less, and
docs/training-speed.md): the plain composition keeps ``silu(u_pre)`` and the mixer's input ``silu(v_pre) * mask``
for backward on top of ``u_pre``, ``v_pre`` and the mixer's output; the fused pieces recompute both silus in
backward instead, two activation-sized tensors fewer per layer. Recomputing costs time (up to 15% of a mixer's
forward + backward), so the GTU takes them only where memory matters (ops_dispatch.fuses_gating, beside the
convolution's own recompute rule).
"""

from __future__ import annotations

import torch
import torch.nn.functional as F
from torch.autograd.function import once_differentiable


def apply_mask(x: torch.Tensor, mask: torch.Tensor | None) -> torch.Tensor:
    """``x * mask[..., None]`` (``mask`` (b, n) or None: ``x`` itself)."""
    return x if mask is None else x * mask[..., None].to(x.dtype)


def silu_mask(pre: torch.Tensor, mask: torch.Tensor | None) -> torch.Tensor:
    """``silu(pre) * mask[..., None]`` (``mask`` (b, n) or None), the GTU's mixer input: the plain composition."""
    return apply_mask(F.silu(pre), mask)


class SiluMask:
    """:func:`silu_mask` as an ops_input_map.InputMap, for the convolutions to apply inside their autograd node."""

    def __init__(self, mask: torch.Tensor | None):
        self.mask = mask

    def __call__(self, pre: torch.Tensor) -> torch.Tensor:
        return silu_mask(pre, self.mask)

    def backward(self, grad: torch.Tensor, pre: torch.Tensor) -> torch.Tensor:
        """The gradient of ``pre`` from that of ``silu(pre) * mask`` (``grad`` is scaled in place)."""
        if self.mask is not None:
            grad.mul_(self.mask[..., None].to(grad.dtype))
        return torch.ops.aten.silu_backward(grad, pre)


def silu_gate_forward(pre: torch.Tensor, mixed: torch.Tensor) -> torch.Tensor:
    """:class:`_SiluGate`'s forward, ``silu(pre) * mixed`` (its backward needs ``pre`` and ``mixed`` alone)."""
    return F.silu(pre) * mixed


def silu_gate_backward(grad: torch.Tensor, pre: torch.Tensor, mixed: torch.Tensor, need_pre: bool, need_mixed: bool
                       ) -> tuple[torch.Tensor | None, torch.Tensor | None]:
    """The gradients of :class:`_SiluGate`'s ``pre`` and ``mixed`` (None where not needed) from that of its output,
    ``silu(pre)`` recomputed."""
    grad_pre = torch.ops.aten.silu_backward(grad * mixed, pre) if need_pre else None
    grad_mixed = grad * F.silu(pre) if need_mixed else None
    return grad_pre, grad_mixed


class _SiluGate(torch.autograd.Function):
    """``silu(pre) * mixed``, keeping ``pre`` and ``mixed`` for backward (``silu(pre)`` is recomputed there), where
    a separate silu and product would keep ``pre``, ``silu(pre)`` and ``mixed``."""

    @staticmethod
    def forward(ctx, pre: torch.Tensor, mixed: torch.Tensor) -> torch.Tensor:
        ctx.save_for_backward(pre, mixed)
        return silu_gate_forward(pre, mixed)

    @staticmethod
    @once_differentiable
    def backward(ctx, grad: torch.Tensor):
        return silu_gate_backward(grad, *ctx.saved_tensors, *ctx.needs_input_grad[:2])


def silu_gate(pre: torch.Tensor, mixed: torch.Tensor) -> torch.Tensor:
    """``F.silu(pre) * mixed`` keeping one activation less for backward (:class:`_SiluGate`)."""
    return _SiluGate.apply(pre, mixed)
