"""Per-request decoding states in an engine's state slots: one padded shape for every layer, and the rows of a batch
read from and written back to their slots.

An engine that batches requests continuously (vLLM) keeps each layer's state as tensors ``(slots, *shape)``, one slot
per running request, and names each batch row's slot. Every layer there gets one shape per state tensor, so a model
whose layers keep states of different sizes (each layer's plan chooses its window and modes) pads every state to the
largest over the layers; a layer uses the leading corner of each padded state, ``state[:, :W, :c]``.
"""

from __future__ import annotations

from collections.abc import Sequence

import torch

Shapes = tuple[tuple[int, ...], ...]


def padded_shapes(per_layer: Sequence[Shapes]) -> Shapes:
    """The shape of each state tensor that holds every layer's: per state, the largest size of each dimension over
    the layers that keep that state. Raises ValueError where two layers' states of one position differ in rank (no
    common padded shape)."""
    padded: list[tuple[int, ...]] = []
    for shapes in per_layer:
        for position, shape in enumerate(shapes):
            if position == len(padded):
                padded.append(tuple(shape))
            elif len(padded[position]) != len(shape):
                raise ValueError(f"state {position} has rank {len(shape)} in one layer and {len(padded[position])} in "
                                 "another: the layers' states cannot share one padded shape")
            else:
                padded[position] = tuple(max(a, b) for a, b in zip(padded[position], shape))
    return tuple(padded)


def _corner(shape: tuple[int, ...]) -> tuple[slice, ...]:
    return tuple(slice(0, size) for size in shape)


def gather_rows(slots: Sequence[torch.Tensor], indices: torch.Tensor, shapes: Shapes) -> tuple[torch.Tensor, ...]:
    """The states of the slots ``indices`` (k,), each of its layer's ``shapes`` (the corner of the padded slot), as
    new contiguous tensors (k, *shape): a decoding step updates them in place, then :func:`scatter_rows` writes
    them back. (``index_select`` where the layer fills its slot, else a stack of the corners: both several times
    faster than advanced indexing of a corner, measured at 16 rows.)"""
    rows = []
    for slot, shape in zip(slots, shapes):
        if tuple(slot.shape[1:]) == tuple(shape):
            rows.append(slot.index_select(0, indices))
        else:
            rows.append(torch.stack([slot[i][_corner(shape)] for i in indices.tolist()]))
    return tuple(rows)


def scatter_rows(slots: Sequence[torch.Tensor], indices: torch.Tensor, rows: Sequence[torch.Tensor]) -> None:
    """Write ``rows`` (each (k, *shape)) into the corners of the slots ``indices``: one copy per row and state
    (measured 1.5-2x faster than ``index_copy_`` or advanced indexing at 16 rows)."""
    for row_index, slot_index in enumerate(indices.tolist()):
        for slot, row in zip(slots, rows):
            slot[slot_index][_corner(tuple(row.shape[1:]))].copy_(row[row_index])
