"""A fitted decoding plan and the store each token mixer keeps its plans in.

A layer's compact plan is its kernel's tail as modes (:class:`ModalTail`), fitted for a tolerance on a set of weights
(:mod:`~modeling_tnn.fit_ladder`) or loaded with them (:mod:`~modeling_tnn.fit_plan_file`). Each mixer holds one
:class:`PlanStore` (``TokenMixer.decoding_plans``): the plan shipped with the weights, and the plans resolved since,
each under what invalidates it (the parameters' version, the tolerance, the device). This module imports nothing
else of the package, so the mixer, the fit and the decoding states can all use it.
"""

from __future__ import annotations

from collections.abc import Hashable
from dataclasses import dataclass

import torch


@dataclass
class ModalTail:
    """A kernel's tail ``k >= window`` as modes: ``t̂_k = Re(sum_j residues[c, j] * poles[c, j]**(k - window))``.

    ``poles`` and ``residues`` are (channels, modes) complex64, as decoding uses them; ``bound`` (channels,) float64
    is each channel's certified relative l1 error of the whole kernel (see the module docstring), fitted for
    ``tolerance``. A plain object of tensors and numbers: a layer's fitted plan, which
    :meth:`~modeling_tnn.decoding_compact.CompactState.from_tail` turns into its decoding state."""

    window: int
    poles: torch.Tensor
    residues: torch.Tensor
    bound: torch.Tensor
    tolerance: float | None = None

    @property
    def modes(self) -> int:
        return self.poles.shape[1]

    def __post_init__(self):
        # A Python float, read once when fitted: traced code must not read tensor values.
        self.max_bound = float(self.bound.max())


@dataclass
class LayerPlan:
    """A layer's tail, the fingerprint of the weights it belongs to, and where it came from (``"checkpoint"``: the
    plan shipped with the weights, ``"fitted"``, or ``"refitted"``: a shipped plan whose weights have changed)."""

    tail: ModalTail
    fingerprint: str
    source: str


class PlanStore:
    """One mixer's decoding plans: ``shipped`` (loaded with the weights, None without one) and the plans resolved
    since, one per (tolerance, device), each kept with the parameters' version it was resolved for."""

    def __init__(self) -> None:
        self.shipped: LayerPlan | None = None
        self._resolved: dict[tuple[float, torch.device], tuple[Hashable, LayerPlan]] = {}

    def resolved(self, tolerance: float, device: torch.device, version: Hashable) -> LayerPlan | None:
        """The plan resolved for ``tolerance`` on ``device`` while the parameters were at ``version``, or None."""
        entry = self._resolved.get((tolerance, device))
        return entry[1] if entry is not None and entry[0] == version else None

    def latest(self, tolerance: float, device: torch.device) -> LayerPlan | None:
        """The plan resolved last for ``tolerance`` on ``device``, whatever the weights since: what traced code
        (torch.compile / export, whose parameters are fake) decodes with."""
        entry = self._resolved.get((tolerance, device))
        return None if entry is None else entry[1]

    def remember(self, tolerance: float, device: torch.device, version: Hashable, plan: LayerPlan) -> None:
        """Keep ``plan`` as the one for ``tolerance`` on ``device`` at parameter ``version``."""
        self._resolved[(tolerance, device)] = (version, plan)

    def for_tolerance(self, tolerance: float) -> list[LayerPlan]:
        """Every plan held for ``tolerance`` (resolved on any device, then the shipped one)."""
        plans = [plan for (held, _), (_, plan) in self._resolved.items() if held == tolerance]
        if self.shipped is not None and self.shipped.tail.tolerance == tolerance:
            plans.append(self.shipped)
        return plans

    def forget_resolved(self) -> None:
        """Drop every resolved plan (the next cached forward resolves again; a shipped plan stays)."""
        self._resolved.clear()
