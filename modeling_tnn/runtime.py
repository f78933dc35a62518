"""How the model's code must behave at run time: the dtype its FFTs and kernels compute in, and whether it runs
under torch.compile / torch.export tracing."""

from __future__ import annotations

import torch


def compute_dtype(dtype: torch.dtype) -> torch.dtype:
    """FFTs run in at least float32: half precision is upcast, float64 stays float64."""
    return torch.float64 if dtype == torch.float64 else torch.float32


def as_dtype(x: torch.Tensor, dtype: torch.dtype) -> torch.Tensor:
    """``x.to(dtype)``, skipped where it would be a no-op (which still records an operator)."""
    return x if x.dtype == dtype else x.to(dtype)


def tracing() -> bool:
    """True under torch.compile or torch.export, where parameters may be fake tensors (no storage, no values)."""
    from torch._guards import detect_fake_mode

    return torch.compiler.is_compiling() or torch.compiler.is_exporting() or detect_fake_mode() is not None
