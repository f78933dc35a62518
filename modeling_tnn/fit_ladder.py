"""The compact fit of a layer: which fits run, in what order, on which channels (the fit ladder).

The first rung fits every channel of the layer with one pole set (:mod:`~modeling_tnn.fit_shared_poles`): a
single realisation and one least-squares factorisation for the whole layer. The channels it leaves above the
tolerance get per-channel realisations (:func:`~modeling_tnn.fit_modal.fit_modal_tail`) of growing size;
every channel keeps its smallest certified bound.
"""

from __future__ import annotations

from dataclasses import dataclass

import torch

from .decoding_poles import pole_powers
from .fit_modal import exact_horizon, fit_modal_tail, float64_taps, residue_reach, tail_rpe
from .fit_shared_poles import fit_shared_tail
from .fit_store import ModalTail
from .mixer_base import TokenMixer


@dataclass(frozen=True)
class Rung:
    """One fit of the ladder: its window, realisation rank, and the effort of the fit (tail lags for the poles, for
    the residues (None: the default reach), power steps); ``shared``: one pole set for every channel
    (:func:`~modeling_tnn.fit_shared_poles.fit_shared_tail`) instead of one realisation per channel
    (:func:`~modeling_tnn.fit_modal.fit_modal_tail`)."""

    window: int
    rank: int
    pole_span: int = 1200
    residue_span: int | None = None
    power_steps: int = 1
    shared: bool = False


# The fits tried, in order, on the channels whose bound still exceeds the tolerance, chosen by measurement on the
# 48.7M and 125M presets (docs/compact-decoding.md). The shared rungs cost a few per-channel fits each, whatever the
# width: the first certifies most channels; the channels it leaves have structure early in their tail (the RPE's
# late ReLU kinks), which a longer exact window takes in; the last few get realisations of their own. The shared
# rungs read 1,600 tail lags: on trained weights some channels keep a slow mode that 800 lags do not identify (one
# layer of the trained 125M model: 289 channels uncertified at 800 lags, none at 1,600, for the same cost).
FIT_LADDER = (Rung(32, 48, pole_span=1600, shared=True), Rung(64, 48, pole_span=1600, shared=True), Rung(64, 48),
              Rung(96, 64, pole_span=1600, shared=True), Rung(96, 64))


def compact_tail(mixer: TokenMixer, tolerance: float, device: torch.device,
                 ladder: tuple[Rung, ...] = FIT_LADDER) -> ModalTail:
    """The modal tail decoding uses: the fits of ``ladder`` in turn, each on the channels not yet certified (a
    ``shared`` rung fits them with one pole set), every channel keeping its smallest bound, until all meet
    ``tolerance`` or the ladder ends."""
    reach = residue_reach(mixer)
    longest = max(rung.window + max(rung.pole_span, rung.residue_span or reach) for rung in ladder)
    taps = float64_taps(mixer, torch.arange(longest, device=device))  # every rung's samples, once
    kernel_l1 = taps.abs().sum(0)  # a lower bound of each channel's l1 norm
    horizon = exact_horizon(mixer, tail_rpe(mixer).supremum_bound().to(device), kernel_l1, tolerance)
    if horizon > longest:  # and every lag the certificates evaluate
        taps = torch.cat([taps, float64_taps(mixer, torch.arange(longest, horizon, device=device))])
    best = None
    for rung in ladder:
        failing = None if best is None else (best.bound > tolerance).nonzero()[:, 0]
        if failing is not None and len(failing) == 0:
            break
        if rung.shared:
            fit = fit_shared_tail(mixer, rung.window, rung.rank, tolerance, taps, rung.pole_span,
                                  rung.residue_span or reach, channels=failing)
        else:
            fit = fit_modal_tail(mixer, rung.window, rung.rank, tolerance, device, channels=failing, taps=taps,
                                 pole_span=rung.pole_span, residue_span=rung.residue_span,
                                 power_steps=rung.power_steps)
        best = fit if best is None else _merged(best, fit, failing, kernel_l1)
    return best


def _widened(tail: ModalTail, window: int, kernel_l1: torch.Tensor) -> ModalTail:
    """The same kernel with a longer exact window: lags ``tail.window .. window - 1`` move from the modes to the
    window (exact: the bound still holds) and the modes start ``window - tail.window`` lags later
    (``c z**k`` -> ``c z**shift z**(k - shift)``). The new residues are rounded to complex64 again; the rounding
    ``d_j`` changes the tail by at most ``sum_j |d_j| / (1 - |z_j|)`` over all its lags, which is added to the bound
    (relative to ``kernel_l1``, a lower bound of each channel's l1 norm), so it stays a certificate."""
    shift = window - tail.window
    if shift == 0:
        return tail
    exact = tail.residues.to(torch.complex128) * pole_powers(tail.poles, shift, torch.complex128)
    residues = exact.to(torch.complex64)
    rounding = (residues.to(torch.complex128) - exact).abs() / (1 - tail.poles.abs().to(torch.float64))
    return ModalTail(window=window, poles=tail.poles, residues=residues,
                     bound=tail.bound + rounding.sum(-1) / kernel_l1, tolerance=tail.tolerance)


def _merged(best: ModalTail, refit: ModalTail, channels: torch.Tensor, kernel_l1: torch.Tensor) -> ModalTail:
    """``best`` with ``channels`` taken from ``refit`` where that certifies them, or lowers their bound without
    enlarging the layer; one window (the longer taken) and one mode count (the larger; padding modes have zero
    residues) for the whole layer. A rung that helps no channel leaves the layer as it was."""
    better = refit.bound < best.bound[channels]
    if refit.window > best.window or refit.modes > best.modes:
        better &= refit.bound <= best.tolerance
    if not bool(better.any()):
        return best
    window = max(best.window, refit.window)
    best, refit = _widened(best, window, kernel_l1), _widened(refit, window, kernel_l1[channels])
    modes = max(best.modes, refit.modes)
    pad = torch.nn.functional.pad
    poles = pad(best.poles, (0, modes - best.modes), value=0.5)
    residues = pad(best.residues, (0, modes - best.modes))
    bound = best.bound.clone()
    chosen = channels[better]
    poles[chosen] = pad(refit.poles, (0, modes - refit.modes), value=0.5)[better]
    residues[chosen] = pad(refit.residues, (0, modes - refit.modes))[better]
    bound[chosen] = refit.bound[better]
    return ModalTail(window=window, poles=poles, residues=residues, bound=bound, tolerance=best.tolerance)
