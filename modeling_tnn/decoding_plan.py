"""Which decoding state a layer gets, in each ``generation_cache`` mode, from what its mixer declares.

The mixer declares (the decoding hooks of :class:`~modeling_tnn.mixer_base.TokenMixer`): its causal taps, its
``kernel_support`` (the lags that reach an output to float32 resolution, or None) and whether it has one at all
(``has_kernel_support``), its decay (``ssm_kernel_decay``), and whether it offers the compact state
(``modal_tail_rpe``: the RPE of a decaying kernel, which the modal fit reads and bounds). The modes:

- ``"exact"``: a :class:`~modeling_tnn.decoding_window.WindowState` of the support (the whole history without one).
- ``"etsc"``: an :class:`~modeling_tnn.decoding_ssm.SsmState`: the decayed DFT basis over the support where the
  kernel decays and has one (exact), else ETSC's closing tap over ``etsc_length`` lags (exact up to there).
- ``"auto"``: the :class:`~modeling_tnn.decoding_compact.CompactState` where the mixer offers one and its certified
  bound is at most the tolerance; else the exact window wherever the kernel has a float32 support (it reads each
  input once per token, where the SSM of the same span updates twice as many reals in place: 1.4-1.8x slower);
  ETSC where nothing exact runs in constant memory (a kernel that does not decay).
- ``"compact"``: the compact state where the mixer offers one, whatever its bound; elsewhere as ``"auto"``.
"""

from __future__ import annotations

from collections.abc import Callable
from dataclasses import dataclass

import torch

from .decoding_compact import CompactState
from .decoding_fit_ladder import compact_tail
from .decoding_modal_fit import ModalTail
from .decoding_plan_file import plan_mixers, shipped_or_fitted
from .decoding_ssm import SsmState, ssm_constants
from .decoding_state import DecodingState
from .decoding_window import WindowState
from .mixer_base import TokenMixer
from .ops_fft_sizes import smooth_size
from .runtime import tracing

# The last tail fitted eagerly is kept on the mixer (this attribute): under torch.export / torch.compile the parameters
# are fake (nothing to fit), so a traced decode uses that fit, or the exact window when there is none. An attribute of
# the module, not a module-level weak dictionary: dynamo guards on what it reads, and a guard on a weak dictionary's
# keys breaks once another model is garbage-collected.
EAGER_TAILS_ATTRIBUTE = "_eager_modal_tails"
# Where each (tolerance, device)'s tail came from (decoding_plan_file.PLAN_SOURCES), for TnnCache.describe().
PLAN_SOURCES_ATTRIBUTE = "_modal_tail_sources"


@dataclass
class PlanSettings:
    """What a cache asks of every layer's plan: ETSC's length and the compact state's tolerance."""

    etsc_length: int
    tolerance: float = 1e-5


def modal_tail(mixer: TokenMixer, tolerance: float, device: torch.device) -> ModalTail | None:
    """The mixer's tail, once per set of weights (memoised like its kernel constants): the plan shipped with the
    weights where its fingerprint matches them, else fitted (see :mod:`~modeling_tnn.decoding_plan_file`); under
    tracing the last eager one; None where the mixer offers no modal tail. The one place a layer's tail comes from."""
    if mixer.modal_tail_rpe() is None:
        return None
    if tracing():
        return getattr(mixer, EAGER_TAILS_ATTRIBUTE, {}).get((tolerance, device))
    plan = mixer.cached(("modal tail", tolerance, device), lambda: shipped_or_fitted(
        mixer, tolerance, device, lambda: compact_tail(mixer, tolerance, device)))
    for attribute, value in ((EAGER_TAILS_ATTRIBUTE, plan.tail), (PLAN_SOURCES_ATTRIBUTE, plan.source)):
        if not hasattr(mixer, attribute):
            object.__setattr__(mixer, attribute, {})  # plain attribute: not a submodule, not state
        getattr(mixer, attribute)[(tolerance, device)] = value
    return plan.tail


def plan_source(mode: str, mixer: TokenMixer, settings: PlanSettings, device: torch.device) -> str | None:
    """Where the tail a ``mode`` planner read for this layer came from: ``"checkpoint"``, ``"fitted"`` or
    ``"refitted"``; None where the planner reads no tail (``"exact"``, ``"etsc"``) or the mixer offers none."""
    if not PLANNERS[mode].reads_tail or mixer.modal_tail_rpe() is None:
        return None
    return getattr(mixer, PLAN_SOURCES_ATTRIBUTE, {}).get((settings.tolerance, device))


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


def exact_state(mixer: TokenMixer, settings: PlanSettings, device: torch.device, dtype: torch.dtype) -> WindowState:
    """A window of the kernel's support, or the growing history where it has none."""
    return WindowState(capacity=mixer.kernel_support(device))


def etsc_state(mixer: TokenMixer, settings: PlanSettings, device: torch.device, dtype: torch.dtype) -> SsmState:
    """ETSC's SSM: over the support where the kernel decays and has one (exact at every length), else with the
    closing tap over ``etsc_length`` lags (exact up to there)."""
    support = mixer.kernel_support(device)
    if support is not None and mixer.ssm_kernel_decay() < 1:
        state = SsmState(period=smooth_size(max(settings.etsc_length, support)))
    else:
        state = SsmState(period=settings.etsc_length + 1, is_closed=True, horizon=settings.etsc_length)
    state.lam, state.coef = ssm_constants(mixer, state.period, state.is_closed, device, dtype)
    return state


def _compact_or(certified_only: bool) -> Callable[..., DecodingState]:
    def choose(mixer: TokenMixer, settings: PlanSettings, device: torch.device, dtype: torch.dtype) -> DecodingState:
        support = mixer.kernel_support(device)  # (measured eagerly before any trace reads it)
        tail = modal_tail(mixer, settings.tolerance, device)
        if tail is not None and (not certified_only or tail.max_bound <= settings.tolerance):
            return CompactState.from_tail(tail, mixer, device, dtype)
        return (exact_state if support is not None else etsc_state)(mixer, settings, device, dtype)
    return choose


def _fixed_unless_etsc(mixer: TokenMixer) -> bool:
    return mixer.causal and mixer.has_kernel_support()


@dataclass
class Planner:
    """One ``generation_cache`` mode: ``choose(mixer, settings, device, dtype)`` gives a layer's state, and
    ``keeps_shapes(mixer)`` says, before any weight is read, whether that state keeps its shapes from the prefill
    on (what :attr:`~modeling_tnn.decoding_cache.TnnCache.is_compileable` reports)."""

    choose: Callable[[TokenMixer, PlanSettings, torch.device, torch.dtype], DecodingState]
    keeps_shapes: Callable[[TokenMixer], bool]
    reads_tail: bool = False  # whether ``choose`` reads the modal tail (its plan_source is then reported)


PLANNERS: dict[str, Planner] = {
    "auto": Planner(_compact_or(certified_only=True), _fixed_unless_etsc, reads_tail=True),
    "compact": Planner(_compact_or(certified_only=False), _fixed_unless_etsc, reads_tail=True),
    "exact": Planner(exact_state, _fixed_unless_etsc),
    "etsc": Planner(etsc_state, lambda mixer: False),  # a window until the period fills, then a complex state
}
