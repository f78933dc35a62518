"""The one way the benchmarks match parameter counts: count a model's parameters (each shared tensor once, position
tables optionally left out), and find the integer size knob (an MLP width, a hidden size) whose model comes closest
to a target count, building the candidates on the meta device (no memory, no initialisation)."""

from __future__ import annotations

from collections.abc import Callable

import torch

POSITION_TABLES = ("wpe", "position_embeddings", "token_type_embeddings")


def count_parameters(model: torch.nn.Module, skip: tuple[str, ...] = ()) -> int:
    """Parameters, each shared tensor once, leaving out those whose name contains one of ``skip``."""
    seen, total = set(), 0
    for name, p in model.named_parameters():
        if id(p) in seen or any(s in name for s in skip):
            continue
        seen.add(id(p))
        total += p.numel()
    return total


def closest_size(build: Callable[[int], torch.nn.Module], target: int, multiple: int = 1, low: int = 1,
                 high: int = 1 << 16, skip: tuple[str, ...] = ()) -> int:
    """The multiple of ``multiple`` in [low, high] whose ``build(size)`` has the parameter count (``skip`` left out)
    closest to ``target``; ``build`` must grow with its size. A bisection over sizes, each built on meta."""
    def params(units: int) -> int:
        with torch.device("meta"):
            return count_parameters(build(units * multiple), skip)

    lo, hi = max(1, -(-low // multiple)), max(1, high // multiple)
    while hi - lo > 1:
        middle = (lo + hi) // 2
        lo, hi = (middle, hi) if params(middle) <= target else (lo, middle)
    return multiple * min((lo, hi), key=lambda units: abs(params(units) - target))
