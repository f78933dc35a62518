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
from .decoding_ssm import SsmState, ssm_constants
from .decoding_state import DecodingState
from .decoding_window import WindowState
from .fit_plans import modal_tail, tail_source
from .mixer_base import TokenMixer
from .ops_fft_sizes import smooth_size


@dataclass
class PlanSettings:
    """What a cache asks of every layer's plan: ETSC's length and the compact state's tolerance."""

    etsc_length: int
    tolerance: float = 1e-5


def plan_source(mode: str, mixer: TokenMixer, settings: PlanSettings, device: torch.device) -> str | None:
    """Where the tail a ``mode`` planner read for this layer came from: ``"checkpoint"``, ``"fitted"`` or
    ``"refitted"``; None where the planner reads no tail (``"exact"``, ``"etsc"``) or the mixer offers none."""
    if not PLANNERS[mode].reads_tail or mixer.modal_tail_rpe() is None:
        return None
    return tail_source(mixer, settings.tolerance, device)


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
