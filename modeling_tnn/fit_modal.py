"""A decaying dense kernel as an exact window plus a few complex modes, and a certified bound of what that costs.

For a causal dense kernel ``t_k = RPE(k) gamma**k`` (``gamma < 1``) the first ``W`` lags are kept exactly and the
tail ``k >= W`` is replaced by ``r`` complex modes per channel, ``t̂_k = Re(sum_j c_j z_j**(k - W))`` with every
``|z_j| < 1``: a diagonal SSM that is stable at any length. The tail is smooth (the RPE's first stage normalises
the lag's embedding, so ``RPE(k)`` converges, and ``gamma**k`` multiplies it), so a matrix pencil on the float64
kernel finds few modes that reproduce it.

The bound is computed from the weights, not sampled. Per channel,

    B = [sum_{W<=k<L} |t_k - t̂_k| + sum_{k>=L} (|t_k| + |t̂_k|)] / sum_{k<L} |t_k|

with the first sum computed in float64 on the modes *as stored* (rounded to complex64), and the sums beyond ``L``
in closed form: ``|RPE(k)| <= S`` for every lag, where ``S`` is the RPE's own bound
(:meth:`~modeling_tnn.rpe.Rpe.supremum_bound`, from its last stage), so ``sum_{k>=L} |t_k| <= S gamma**L /
(1 - gamma)``; and ``sum_{k>=L} |t̂_k| <= sum_j |c_j| |z_j|**(L - W) / (1 - |z_j|)``. The denominator is a lower bound
of ``||t||_1``. Since ``|y - ŷ| <= ||t - t̂||_1 ||x||_inf``, every mixer output then differs from the exact kernel's by
at most ``B ||t||_1 ||x||_inf``.

The mixer declares what is fitted: :meth:`~modeling_tnn.mixer_base.TokenMixer.modal_tail_rpe` (the RPE whose values
times ``decay**k`` are its causal taps) and :meth:`~modeling_tnn.mixer_base.TokenMixer.ssm_kernel_decay` (gamma).
"""

from __future__ import annotations

import math
import torch
from torch.func import functional_call

from .decoding_poles import power_grid
from .fit_store import ModalTail
from .mixer_base import TokenMixer
from .ops_fft_sizes import smooth_size
from .rpe import Rpe

# Columns of the randomised subspace iteration beyond the realisation's rank.
SKETCH_OVERSAMPLING = 16
# Beyond this lag the bound is closed-form whatever the decay (an upper limit on the float64 work).
MAX_EXACT_LAGS = 1 << 16
# The closed-form part of the bound is pushed below this fraction of the tolerance it serves.
TAIL_SHARE = 1e-3


def tail_rpe(mixer: TokenMixer) -> Rpe:
    """The RPE of the mixer's decaying kernel ``RPE(k) gamma**k`` (its declared :meth:`modal_tail_rpe`)."""
    rpe = mixer.modal_tail_rpe()
    if rpe is None:
        raise ValueError(f"{type(mixer).__name__} offers no modal tail: a compact state needs a causal kernel "
                         f"RPE(k) gamma**k that decays (decay_gamma < 1).")
    return rpe


def float64_taps(mixer: TokenMixer, lags: torch.Tensor) -> torch.Tensor:
    """The causal kernel ``RPE(k) gamma**k`` at ``lags`` (L,), evaluated in float64 whatever the weights' dtype."""
    rpe = tail_rpe(mixer)
    params = {name: p.detach().to(torch.float64) for name, p in rpe.named_parameters()}
    lags = lags.to(torch.float64)
    with torch.no_grad():
        values = functional_call(rpe, params, (lags,))
    return values * (mixer.ssm_kernel_decay() ** lags)[:, None]


def hankel_product(spectrum: torch.Tensor, rows: torch.Tensor, fft_len: int) -> torch.Tensor:
    """``(H x)^T`` for each channel's square Hankel matrix ``H[i, j] = f[i + j]`` (n x n) and the vectors ``x`` given
    as ``rows`` (c, k, n) or shared by every channel (k, n): the cross-correlation of ``f`` (given as its rfft
    ``spectrum`` (c, F) of length ``fft_len >= 2n - 1``) with ``x``, read at lags ``0 .. n-1`` (below the circular
    wrap). Returns (c, k, n): the FFTs run along contiguous rows."""
    n = rows.shape[-1]
    product = torch.fft.rfft(rows, n=fft_len, dim=-1).conj_physical_()
    if rows.dim() == 2:
        product = spectrum[:, None] * product
    else:
        product *= spectrum[:, None]
    return torch.fft.irfft(product, n=fft_len, dim=-1)[..., :n]


def hankel_poles(samples: torch.Tensor, rank: int, power_steps: int = 1) -> tuple[torch.Tensor, torch.Tensor]:
    """``(poles, used)`` (channels, modes): complex128 poles of ``samples[c, k] ~ Re(sum_j c_j z_j**k)`` and which of
    them a channel uses, from the float64 ``samples`` (channels, 2n - 1): the eigenvalues of the shift on the
    rank-``rank`` dominant subspace of each channel's square Hankel matrix (Kung's realisation; the Hankel matrix is
    symmetric, so a randomised subspace iteration with FFT products finds it without forming it; one Gaussian sketch
    serves every channel, so the first product transforms it once).

    A real signal's poles are real or come in conjugate pairs, and ``Re(c z**k)`` covers both of a pair: only the
    real and upper-half poles are kept (``modes`` = the most any channel keeps, at most ``rank``; a channel that keeps
    fewer has placeholders, ``used`` False, in its last slots). Poles on or outside the unit circle are pulled inside
    (the bound says what that costs)."""
    channels, length = samples.shape
    n = (length + 1) // 2
    fft_len = smooth_size(2 * n - 1)
    spectrum = torch.fft.rfft(samples[:, : 2 * n - 1], n=fft_len, dim=1)
    generator = torch.Generator(device=samples.device).manual_seed(0)
    rows = torch.randn(rank + SKETCH_OVERSAMPLING, n, dtype=samples.dtype, device=samples.device,
                       generator=generator)
    for _ in range(power_steps + 1):
        rows = torch.linalg.qr(hankel_product(spectrum, rows, fft_len).mT).Q.mT      # (c, k, n), orthonormal rows
    projected = rows @ hankel_product(spectrum, rows, fft_len).mT                     # (c, k, k), symmetric
    values, vectors = torch.linalg.eigh((projected + projected.mT) / 2)
    top = values.abs().argsort(dim=1, descending=True)[:, :rank]
    dominant = rows.mT @ vectors.gather(2, top[:, None, :].expand(-1, vectors.shape[1], -1))  # (c, n, rank)
    return realisation_poles(dominant)


def realisation_poles(dominant: torch.Tensor) -> tuple[torch.Tensor, torch.Tensor]:
    """``(poles, used)`` (..., modes) of the shift on each subspace ``dominant`` (..., n, r) with orthonormal
    columns (Kung: the eigenvalues of ``pinv(D[:-1]) D[1:]``), keeping the real and upper-half ones (see
    :func:`hankel_poles`)."""
    # D's columns are orthonormal, so D[:-1]^T D[:-1] = I - u u^T with u = D[-1] (small: the tail has decayed there),
    # inverted by Sherman-Morrison.
    last = dominant[..., -1:, :].mT                                                      # (..., rank, 1)
    shifted = dominant[..., :-1, :].mT @ dominant[..., 1:, :]
    shift = shifted + last @ (last.mT @ shifted) / (1 - last.mT @ last)
    poles = torch.linalg.eigvals(shift)
    poles = torch.where(poles.isfinite(), poles, torch.full_like(poles, 0.5))  # a degenerate shift: the bound says
    real = poles.imag.abs() <= 1e-9 * poles.abs().clamp(min=1e-300)
    poles = torch.where(real, poles.real.to(poles.dtype), poles)
    keep = real | (poles.imag > 0)
    order = (~keep).to(torch.int8).argsort(dim=-1, stable=True)   # kept poles first
    modes = int(keep.sum(-1).max())
    poles, keep = poles.gather(-1, order)[..., :modes], keep.gather(-1, order)[..., :modes]
    poles = torch.where(keep, poles, torch.full_like(poles, 0.5))  # placeholders: zero residues
    magnitude = poles.abs()
    poles = torch.where(magnitude < 1, poles, poles / magnitude * (1 - 1e-6))
    return poles, keep


def channel_power_grid(poles: torch.Tensor, start: int, count: int) -> tuple[torch.Tensor, torch.Tensor]:
    """:func:`~modeling_tnn.decoding_state.power_grid` of ``poles`` (channels, modes), channels first: ``coarse``
    (channels, M, modes) and ``fine`` (channels, B, modes)."""
    coarse, fine = power_grid(poles, start, count)
    return coarse.transpose(0, 1), fine.transpose(0, 1)


def fit_residues(samples: torch.Tensor, poles: torch.Tensor, used: torch.Tensor | None = None) -> torch.Tensor:
    """The residues (channels, modes) complex128 minimising ``||samples - Re(sum_j c_j z_j**k)||_2`` per channel:
    real least squares on the columns ``Re z**k`` and ``Im z**k`` (``Re(c v) = Re c Re v - Im c Im v``); modes where
    ``used`` is False get zero residues.

    A real pole's ``Im z**k`` column is zero (as are both columns of an unused mode): for each such column one extra
    row pins its coefficient to zero, which changes nothing else (the column is zero on every other row) and leaves a
    full-rank problem for a plain QR solve (gels) instead of an SVD."""
    channels, count = samples.shape
    modes = poles.shape[1]
    coarse, fine = channel_power_grid(poles, 0, count)
    if used is not None:
        coarse = coarse * used[:, None, :]
    vandermonde = (coarse[:, :, None] * fine[:, None]).reshape(channels, -1, modes)[:, :count]      # (c, N, r)
    basis = torch.view_as_real(vandermonde).reshape(channels, count, 2 * modes)     # columns Re, Im per mode
    unused = torch.zeros_like(poles.real, dtype=torch.bool) if used is None else ~used
    zero = torch.stack([unused, unused | (poles.imag == 0)], dim=-1).reshape(channels, 2 * modes)
    basis = torch.cat([basis, torch.diag_embed(zero.to(basis.dtype))], dim=1)
    target = torch.nn.functional.pad(samples, (0, 2 * modes))[..., None]
    solution = torch.linalg.lstsq(basis, target, driver="gels").solution[..., 0]
    solution = solution.masked_fill(zero, 0).reshape(channels, modes, 2)  # pinned: zero up to rounding, made exact
    return torch.complex(solution[..., 0], -solution[..., 1])


def modal_values(poles: torch.Tensor, residues: torch.Tensor, start: int, count: int) -> torch.Tensor:
    """``Re(sum_j residues z_j**m)`` for ``m = start .. start + count - 1``, (channels, count), in the dtype of
    ``poles`` (channels, modes), or (1, modes) when every channel shares them: per channel one product of the
    residue-weighted coarse powers with the fine ones (:func:`channel_power_grid`); for shared poles one product of
    the powers with every channel's residues."""
    coarse, fine = channel_power_grid(poles, start, count)
    if poles.shape[0] == 1 < residues.shape[0]:
        powers = (coarse[0, :, None] * fine[0, None]).reshape(-1, poles.shape[1])[:count]   # (count, modes)
        return residues.real @ powers.real.mT - residues.imag @ powers.imag.mT  # (the real part alone)
    values = (coarse * residues[:, None]) @ fine.mT                                     # (c, M, B)
    return values.real.reshape(poles.shape[0], -1)[:, :count]


def modal_taps(poles: torch.Tensor, residues: torch.Tensor, offsets: torch.Tensor) -> torch.Tensor:
    """``Re(sum_j residues z_j**m)`` at non-negative integer offsets ``m`` (L,), (L, channels), in the dtype of
    ``poles``."""
    first, last = int(offsets.min()), int(offsets.max())
    return modal_values(poles, residues, first, last - first + 1)[:, offsets.to(torch.long) - first].t()


def exact_horizon(mixer: TokenMixer, supremum: torch.Tensor, l1_floor: torch.Tensor, tolerance: float) -> int:
    """The lag ``L`` after which the closed-form bound of the true kernel, ``S gamma**L / (1 - gamma)``, is below
    ``TAIL_SHARE * tolerance`` of the kernel's l1 norm in every channel (at most ``MAX_EXACT_LAGS``)."""
    gamma = mixer.ssm_kernel_decay()
    ratio = float(torch.where(supremum > 0, supremum / l1_floor, 0.0).max()) / (1 - gamma)  # a zero kernel: 0
    target = TAIL_SHARE * tolerance
    if ratio <= target:
        return 1
    return min(MAX_EXACT_LAGS, math.ceil(math.log(target / ratio) / math.log(gamma)))


def certified_bound(mixer: TokenMixer, poles: torch.Tensor, residues: torch.Tensor, window: int,
                    tolerance: float, taps: torch.Tensor, channels: torch.Tensor | None = None) -> torch.Tensor:
    """Each channel's certified relative l1 error (channels,) float64 of the kernel made of the exact window and
    the modes ``poles``/``residues`` (complex128, the values decoding uses). ``taps`` holds the float64 kernel of
    ``channels`` (all by default) on lags ``0 .. n-1`` already evaluated (more are evaluated as needed)."""
    device = taps.device
    supremum = tail_rpe(mixer).supremum_bound().to(device)
    if channels is not None:
        supremum = supremum[channels]
    absolute = taps.abs()
    horizon = exact_horizon(mixer, supremum, absolute.sum(0), tolerance)
    if horizon > taps.shape[0]:
        more = float64_taps(mixer, torch.arange(taps.shape[0], horizon, device=device))
        taps = torch.cat([taps, more if channels is None else more[:, channels]])
        absolute = taps.abs()
    horizon = max(horizon, window)
    error = (modal_values(poles, residues, 0, horizon - window) - taps[window:horizon].t()).abs_().sum(1)
    l1 = absolute[:horizon].sum(0)
    gamma = mixer.ssm_kernel_decay()
    kernel_beyond = supremum * gamma**horizon / (1 - gamma)
    magnitude = poles.abs()
    modes_beyond = (residues.abs() * magnitude ** (horizon - window) / (1 - magnitude)).sum(-1)
    total = error + kernel_beyond + modes_beyond
    # A channel whose kernel is zero everywhere (S = 0) is exact when its modes are zero too.
    return torch.where(l1 > 0, total / l1, torch.where(total > 0, math.inf, 0.0))


def fit_modal_tail(mixer: TokenMixer, window: int, rank: int, tolerance: float, device: torch.device,
                   channels: torch.Tensor | None = None, taps: torch.Tensor | None = None, pole_span: int = 1200,
                   residue_span: int | None = None, power_steps: int = 1) -> ModalTail:
    """Fit the tail ``k >= window`` of ``mixer``'s causal kernel (its ``channels``, all by default) with the real and
    upper-half poles of a rank-``rank`` realisation (:func:`hankel_poles` with ``power_steps``, float64, tail lags
    ``0 .. pole_span``), residues by least squares over tail lags ``0 .. residue_span`` (by default the lags where
    ``gamma**k`` exceeds 2**-30), round them to complex64 and certify them over every lag
    (:func:`certified_bound`). ``taps``: the float64 kernel of all channels on lags ``0 .. n-1`` if already
    evaluated (more are evaluated as needed)."""
    tail_rpe(mixer)  # raises where the mixer offers none
    if residue_span is None:
        residue_span = residue_reach(mixer)
    needed = window + max(pole_span, residue_span)
    if taps is None or taps.shape[0] < needed:
        taps = float64_taps(mixer, torch.arange(needed, device=device))
    if channels is not None:
        taps = taps[:, channels]
    samples = taps[window:needed].t().contiguous()
    poles, used = hankel_poles(samples[:, :pole_span], rank, power_steps)
    residues = fit_residues(samples[:, :residue_span], poles, used)
    poles, residues = poles.to(torch.complex64), residues.to(torch.complex64)
    inside = poles.abs() < 1
    if not bool(inside.all()):  # rounding put a pole on the circle: pull it back inside
        poles = torch.where(inside, poles, poles * (1 - 2.0**-20))
    bound = certified_bound(mixer, poles.to(torch.complex128), residues.to(torch.complex128), window, tolerance, taps,
                            channels)
    return ModalTail(window=window, poles=poles, residues=residues, bound=bound, tolerance=tolerance)


def residue_reach(mixer: TokenMixer) -> int:
    """The tail lags over which the residues are fitted by default: those where ``gamma**k`` exceeds 2**-30."""
    return min(MAX_EXACT_LAGS, math.ceil(math.log(2.0**-30) / math.log(mixer.ssm_kernel_decay())))
