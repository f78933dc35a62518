"""The compact state's fold as a few matrix products: K inputs entering the modes, and the modes' readout rows.

A fold (:mod:`~modeling_tnn.decoding_compact`) does ``g = z**K g + sum_k c z**(K-1-k) u_k`` for the K inputs ``u``
leaving the ring, then tables ``Re(sum_j z_j**e g_j)`` for the next ``e = 0 .. K-1`` positions. The powers these
need depend on the poles alone, so they are built once per plan (:func:`fold_tables`) and a fold is matrix products
with them: one per group of channels that share a pole set (``(b, n, K) @ (K, 2r)`` in, ``(b, n, 2r) @ (2r, K)``
out), one batched product for the channels with poles of their own. The modes are kept in group order (each group a
contiguous run of channels) as interleaved real and imaginary parts (b, c, r, 2), so that every run is a slice and
the complex modes are a view (``torch.view_as_complex``).
"""

from __future__ import annotations

import dataclasses

import torch

from .decoding_poles import pole_powers
from .fit_store import PoleGroups


@dataclasses.dataclass(eq=False)
class FoldRun:
    """``count`` channels from ``start`` of the group order: shared (``inputs`` (K, 2r), ``readout`` (2r, K),
    ``decay`` ``z**K`` (r,) complex, one row for every channel, and the run's ``residues`` (n, r) complex) or each
    with poles of its own (``inputs`` (n, K, 2r) with the residues applied, ``readout`` (n, 2r, K), ``decay``
    (n, r))."""

    start: int
    count: int
    shared: bool
    inputs: torch.Tensor
    readout: torch.Tensor
    decay: torch.Tensor
    residues: torch.Tensor | None = None


@dataclasses.dataclass(eq=False)
class FoldTables:
    """What a fold of ``fold_every`` inputs needs, built once from the poles: the runs, and the group order itself
    (``order``, its inverse ``rank``)."""

    fold_every: int
    order: torch.Tensor
    rank: torch.Tensor
    runs: list[FoldRun]
    identity: bool = False  # the group order is the channel order (one group, or none): no permutation to apply


def _interleaved(values: torch.Tensor) -> torch.Tensor:
    """Complex (..., r) as real (..., 2r): real and imaginary parts side by side per mode."""
    return torch.view_as_real(values).flatten(-2)


def fold_tables(poles: torch.Tensor, residues: torch.Tensor, groups: PoleGroups | None, fold_every: int) -> FoldTables:
    """The tables of a fold every ``fold_every`` positions for ``poles``, ``residues`` (c, r) complex."""
    c = poles.shape[0]
    if groups is None:
        groups = PoleGroups(torch.arange(c, device=poles.device), torch.arange(c, device=poles.device), ())
    poles, residues = poles.index_select(0, groups.order), residues.index_select(0, groups.order)
    ages = torch.arange(fold_every - 1, -1, -1, device=poles.device)  # z**(K-1-k) for the k-th oldest input
    ahead = torch.arange(fold_every, device=poles.device)             # z**e for the e-th position after a fold
    runs, start = [], 0
    for size in groups.sizes:
        shared = poles[start]
        conjugate_sign = torch.tensor([1.0, -1.0], device=poles.device)  # Re(P g) = Re P Re g - Im P Im g
        readout = (torch.view_as_real(pole_powers(shared, ahead)) * conjugate_sign).flatten(-2).t().contiguous()
        runs.append(FoldRun(start, size, True, _interleaved(pole_powers(shared, ages)).contiguous(), readout,
                            pole_powers(shared, fold_every), residues[start:start + size]))
        start += size
    if start < c:
        own, own_residues = poles[start:], residues[start:]
        inputs = _interleaved(own_residues[:, None] * pole_powers(own, ages).transpose(0, 1))  # (n, K, 2r)
        conjugate_sign = torch.tensor([1.0, -1.0], device=poles.device)
        readout = (torch.view_as_real(pole_powers(own, ahead).transpose(0, 1)) * conjugate_sign).flatten(-2)
        runs.append(FoldRun(start, c - start, False, inputs.contiguous(), readout.transpose(1, 2).contiguous(),
                            pole_powers(own, fold_every)))
    identity = groups.sizes in ((), (c,))  # pole_groups lists a lone group's (or no group's) channels in order
    return FoldTables(fold_every, groups.order, groups.rank, runs, identity)


def to_group_order(modes: torch.Tensor, tables: FoldTables) -> torch.Tensor:
    """Complex modes (b, c, r) in channel order as the state keeps them: (b, c, r, 2) real, in group order."""
    return torch.view_as_real(modes.index_select(1, tables.order)).contiguous()


def to_channel_order(modes: torch.Tensor, tables: FoldTables) -> torch.Tensor:
    """The state's modes (b, c, r, 2) as complex (b, c, r) in channel order."""
    return torch.view_as_complex(modes).index_select(1, tables.rank)


def fold_in(modes: torch.Tensor, inputs: torch.Tensor, tables: FoldTables) -> None:
    """In place: ``g = z**K g + sum_k c z**(K-1-k) inputs_k`` for the state's modes (b, c, r, 2) and ``inputs``
    (b, K, c) in channel order, oldest first."""
    g = torch.view_as_complex(modes)
    rows = inputs.transpose(1, 2)                                                          # (b, c, K)
    if not tables.identity:  # whole rows of K: a row copy each (a gather along the last dim is 5x slower)
        rows = rows.index_select(1, tables.order)
    for run in tables.runs:
        part, modes_of_run = rows[:, run.start:run.start + run.count], g[:, run.start:run.start + run.count]
        modes_of_run.mul_(run.decay)  # a shared run's one row of powers broadcast: (c, r) fewer values to read
        if run.shared:
            sums = torch.view_as_complex(torch.matmul(part, run.inputs).unflatten(-1, (-1, 2)))  # (b, n, r)
            modes_of_run.addcmul_(run.residues, sums)
        else:
            sums = torch.bmm(part.transpose(0, 1), run.inputs).transpose(0, 1)               # (b, n, 2r)
            modes_of_run.add_(torch.view_as_complex(sums.unflatten(-1, (-1, 2))))


def _group_rows(modes: torch.Tensor, tables: FoldTables) -> torch.Tensor:
    """``Re(sum_j z_j**e g_j)`` (b, c, K) in group order for the state's modes (b, c, r, 2)."""
    flat = modes.flatten(-2)                                                              # (b, c, 2r)
    parts = []
    for run in tables.runs:
        part = flat[:, run.start:run.start + run.count]
        if run.shared:
            parts.append(torch.matmul(part, run.readout))                                # (b, n, K)
        else:
            parts.append(torch.bmm(part.transpose(0, 1), run.readout).transpose(0, 1))
    return parts[0] if len(parts) == 1 else torch.cat(parts, dim=1)


def readout_rows(modes: torch.Tensor, tables: FoldTables) -> torch.Tensor:
    """``Re(sum_j z_j**e g_j)`` (b, K, c) in channel order for the state's modes (b, c, r, 2), ``e = 0 .. K-1``."""
    rows = _group_rows(modes, tables)
    return (rows if tables.identity else rows.index_select(1, tables.rank)).transpose(1, 2)


def write_readout(readout: torch.Tensor, modes: torch.Tensor, tables: FoldTables) -> None:
    """In place: ``readout`` (b, K, c) <- :func:`readout_rows`, scattered to channel order in the write itself."""
    rows = _group_rows(modes, tables).to(readout.dtype)
    if tables.identity:
        readout.copy_(rows.transpose(1, 2))
    else:
        readout.transpose(1, 2).index_copy_(1, tables.order, rows)
