"""Powers of complex poles, the one place decoding and the compact fit raise poles to powers."""

from __future__ import annotations

import math

import torch


def pole_powers(poles: torch.Tensor, exponents: int | torch.Tensor, dtype: torch.dtype | None = None) -> torch.Tensor:
    """``poles ** exponents`` for complex ``poles`` of any shape and integer ``exponents`` (an int, or a tensor of
    any shape): shape ``exponents.shape + poles.shape``, in ``dtype`` (default ``poles.dtype``).

    Every power is one ``exp(k log z)`` in complex128, whatever the poles' precision: as accurate as a product of
    float64 factors, at one evaluation per power, and stable for any ``k`` (no repeated multiplication whose rounding
    grows with ``k``). The one place decoding and the modal fit raise poles to powers."""
    log = torch.log(poles.to(torch.complex128))
    if isinstance(exponents, torch.Tensor):
        exponents = exponents.to(device=log.device, dtype=torch.float64).reshape(*exponents.shape, *[1] * log.dim())
    return torch.exp(exponents * log).to(poles.dtype if dtype is None else dtype)


def power_grid(poles: torch.Tensor, start: int, count: int,
               dtype: torch.dtype | None = None) -> tuple[torch.Tensor, torch.Tensor]:
    """``(coarse, fine)`` with ``z**(start + m B + b) = coarse[m] * fine[b]`` for the ``count`` powers from ``start``
    on: ``fine`` (B, *poles.shape) holds ``z**b`` for ``b < B``, ``coarse`` (M, *poles.shape) ``z**(start + m B)``,
    with ``B ~ sqrt(count)`` and ``M B >= count``. Every factor is one :func:`pole_powers` evaluation, so a range of
    ``count`` powers costs ``B + M`` exps per pole instead of ``count``, each product as exact as a direct power."""
    block = max(1, math.isqrt(count))
    blocks = -(-count // block)
    fine = pole_powers(poles, torch.arange(block, device=poles.device), dtype)
    coarse = pole_powers(poles, start + block * torch.arange(blocks, device=poles.device), dtype)
    return coarse, fine


def pole_power_range(poles: torch.Tensor, start: int, count: int, dtype: torch.dtype | None = None) -> torch.Tensor:
    """``poles ** (start + k)`` for ``k = 0 .. count - 1``, shape ``(count, *poles.shape)`` in ``dtype`` (default
    ``poles.dtype``): the products of :func:`power_grid`'s factors, each factor one exp in complex128 rounded to
    ``dtype`` (a complex64 power is then within a few float32 roundings of the exact one)."""
    coarse, fine = power_grid(poles, start, count, poles.dtype if dtype is None else dtype)
    return (coarse[:, None] * fine[None]).reshape(-1, *poles.shape)[:count]
