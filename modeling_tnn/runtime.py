"""How the model's code must behave at run time: the dtype its FFTs and kernels compute in, and whether it runs
under torch.compile / torch.export tracing."""

from __future__ import annotations

import torch
from torch._guards import TracingContext, detect_fake_mode


def compute_dtype(dtype: torch.dtype) -> torch.dtype:
    """FFTs run in at least float32: half precision is upcast, float64 stays float64."""
    return torch.float64 if dtype == torch.float64 else torch.float32


def as_dtype(x: torch.Tensor, dtype: torch.dtype) -> torch.Tensor:
    """``x.to(dtype)``, skipped where it would be a no-op (which still records an operator)."""
    return x if x.dtype == dtype else x.to(dtype)


def tracing() -> bool:
    """True under torch.compile or torch.export, where parameters may be fake tensors (no storage, no values).

    Called by every norm of a decoding step, so the eager answer comes first: with no dispatch mode on the stack and
    no tracing context there is no fake mode (0.8 us, where ``detect_fake_mode`` alone costs 3.5 us). The import is
    at the top: torch loads ``torch._guards`` itself, and an import statement here cost 0.7 us a call."""
    if torch.compiler.is_compiling() or torch.compiler.is_exporting():
        return True
    if torch._C._len_torch_dispatch_stack() == 0 and TracingContext.try_get() is None:
        return False
    return detect_fake_mode() is not None
