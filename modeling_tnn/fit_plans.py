"""Where a layer's compact plan comes from: its mixer's store, the plan shipped with the weights, or a fit.

:func:`modal_tail` is the one place a layer's tail is resolved (what :mod:`~modeling_tnn.decoding_plan` builds the
compact state from); :func:`fit_plan` resolves every layer of a model at once (what ``save_pretrained`` then ships).
"""

from __future__ import annotations

import torch

from .fit_ladder import compact_tail
from .fit_plan_file import plan_mixers, weights_fingerprint
from .fit_store import LayerPlan, ModalTail
from .mixer_base import TokenMixer
from .runtime import tracing


def _on_device(tail: ModalTail, device: torch.device) -> ModalTail:
    return ModalTail(window=tail.window, poles=tail.poles.to(device), residues=tail.residues.to(device),
                     bound=tail.bound.to(device), tolerance=tail.tolerance)


def _resolved(mixer: TokenMixer, tolerance: float, device: torch.device) -> LayerPlan:
    """The shipped plan where it was fitted for ``tolerance`` on the current weights (source ``"checkpoint"``), else a
    fit (``"refitted"`` where a shipped plan for ``tolerance`` exists but the weights changed, else ``"fitted"``)."""
    fingerprint = weights_fingerprint(mixer)
    shipped = mixer.decoding_plans.shipped
    applies = shipped is not None and shipped.tail.tolerance == tolerance
    if applies and shipped.fingerprint == fingerprint:
        return LayerPlan(_on_device(shipped.tail, device), fingerprint, "checkpoint")
    with torch.no_grad():
        tail = compact_tail(mixer, tolerance, device)
    return LayerPlan(tail, fingerprint, "refitted" if applies else "fitted")


def modal_tail(mixer: TokenMixer, tolerance: float, device: torch.device) -> ModalTail | None:
    """The mixer's tail for ``tolerance`` on ``device``, resolved once per set of weights and kept in its
    :class:`~modeling_tnn.fit_store.PlanStore`; under tracing (fake parameters: nothing to fit) the last one resolved
    eagerly; None where the mixer offers no modal tail, or (traced) none was resolved."""
    if mixer.modal_tail_rpe() is None:
        return None
    store = mixer.decoding_plans
    if tracing():
        plan = store.latest(tolerance, device)
        return None if plan is None else plan.tail
    version = mixer.parameter_version()
    plan = store.resolved(tolerance, device, version)
    if plan is None:
        plan = _resolved(mixer, tolerance, device)
        plan.tail.pole_groups()  # found now, eagerly: a traced decode reads this tail
        store.remember(tolerance, device, version, plan)
    return plan.tail


def tail_source(mixer: TokenMixer, tolerance: float, device: torch.device) -> str | None:
    """Where the mixer's last resolved tail for ``tolerance`` on ``device`` came from (``"checkpoint"``, ``"fitted"``
    or ``"refitted"``), None where none was resolved."""
    plan = mixer.decoding_plans.latest(tolerance, device)
    return None if plan is None else plan.source


def fit_plan(model: torch.nn.Module, tolerance: float | None = None) -> dict[str, ModalTail]:
    """Every layer's tail for ``tolerance`` (given: it becomes the config's ``compact_tolerance``, what caches
    use; default that field) on its mixer's device, now (a shipped plan that matches the weights is taken as it
    is), with a progress bar over the layers: what ``save_pretrained`` then writes beside the weights. Returns the
    tails by mixer name."""
    from transformers.utils import logging

    if tolerance is not None:
        if not 0 < tolerance < 1:
            raise ValueError(f"tolerance must lie in (0, 1), got {tolerance!r}.")
        model.config.compact_tolerance = tolerance  # the caches' tolerance, saved with the plan in config.json
    tolerance = getattr(model.config, "compact_tolerance", 1e-5)
    mixers = plan_mixers(model)
    with torch.no_grad():
        return {name: modal_tail(mixer, tolerance, next(mixer.parameters()).device)
                for name, mixer in logging.tqdm(mixers.items(), desc="decoding plan", unit="layer")}
