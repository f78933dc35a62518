"""One pole set for every channel of a layer: the compact fit's first rung, at a fraction of a per-channel fit.

A dense layer's causal taps are ``t_c(k) = gamma**k (w_c . h(k) + b_c)``: one decay and one RPE per layer, whose last
stage is linear in the shared features ``h(k)``. So the tails of all channels lie in a space of few dimensions (at
most the RPE's width plus one; numerically a handful, the features being smooth and alike beyond their kinks), and
modes that reproduce that space reproduce every channel. Kung's realisation is then run once per layer, on the block
Hankel matrix ``[H(b_1) ... H(b_m)]`` of a basis ``b_i`` of the span weighted by its singular values, which is the
block Hankel matrix of every channel scaled to unit l1 norm (the error each channel's certificate measures) up to an
orthogonal factor; and every channel's residues come from one least-squares factorisation with ``C`` right-hand
sides. Channels this leaves above the tolerance get the per-channel fits of
:data:`~modeling_tnn.fit_modal.FIT_LADDER`.
"""

from __future__ import annotations

import torch

from .decoding_poles import pole_powers
from .fit_modal import SKETCH_OVERSAMPLING, certified_bound, hankel_product, realisation_poles
from .fit_store import ModalTail
from .mixer_base import TokenMixer
from .ops_fft_sizes import smooth_size

# Columns of the range finder of the channels' tails: far above the numerical rank of the span (below 20 in the
# models measured, for an RPE of width 64), so one pass captures it.
SPAN_SKETCH = 64
# Directions of the span kept: singular values above this fraction of the largest (float64 rounding is ~1e-16).
SPAN_CUTOFF = 1e-13
# The realisation keeps the directions of the block Hankel matrix above this fraction of its largest singular value,
# at most ``rank`` of them (measured on the 48.7M and 125M presets: the rule that leaves fewest channels uncertified
# at the 1e-5 tolerance for a given number of modes).
HANKEL_CUTOFF = 1e-9


def span_basis(samples: torch.Tensor) -> torch.Tensor:
    """A basis (lags, m) of the span of ``samples`` (lags, channels), each direction scaled by its singular value:
    ``basis @ basis.T == samples @ samples.T`` up to the directions dropped (a randomised range finder)."""
    sketch = min(samples.shape[1], SPAN_SKETCH)
    generator = torch.Generator(device=samples.device).manual_seed(0)
    omega = torch.randn(samples.shape[1], sketch, dtype=samples.dtype, device=samples.device, generator=generator)
    range_basis = torch.linalg.qr(samples @ omega).Q
    left, values, _ = torch.linalg.svd(range_basis.mT @ samples, full_matrices=False)
    kept = values > values[0] * SPAN_CUTOFF
    return range_basis @ (left[:, kept] * values[kept])


def block_hankel_subspace(basis: torch.Tensor, rank: int) -> torch.Tensor:
    """The dominant left subspace (n, r), ``r <= rank``, of the block Hankel matrix ``[H(b_1) ... H(b_m)]`` (each
    ``H(b)[i, j] = b[i + j]``, n x n, from the basis columns (2n - 1 lags)): a randomised subspace iteration with one
    power step, every product an FFT (:func:`~modeling_tnn.fit_modal.hankel_product`)."""
    lags, width = basis.shape
    n = (lags + 1) // 2
    fft_len = smooth_size(2 * n - 1)
    spectrum = torch.fft.rfft(basis[: 2 * n - 1].mT, n=fft_len, dim=1)                   # (m, F)
    generator = torch.Generator(device=basis.device).manual_seed(0)
    sketch = torch.randn(width, rank + SKETCH_OVERSAMPLING, n, dtype=basis.dtype, device=basis.device,
                         generator=generator)
    rows = hankel_product(spectrum, sketch, fft_len).sum(0)                               # (k, n) = (H sketch)^T
    rows = torch.linalg.qr(rows.mT).Q.mT
    rows = hankel_product(spectrum, hankel_product(spectrum, rows, fft_len), fft_len).sum(0)  # (H H^T rows^T)^T
    rows = torch.linalg.qr(rows.mT).Q.mT                                                  # (k, n), orthonormal
    projected = hankel_product(spectrum, rows, fft_len).transpose(0, 1).reshape(rows.shape[0], -1)  # rows^T H
    left, values, _ = torch.linalg.svd(projected, full_matrices=False)
    kept = min(rank, int((values > values[0] * HANKEL_CUTOFF).sum()))
    return rows.mT @ left[:, :kept]


def shared_residues(samples: torch.Tensor, poles: torch.Tensor) -> torch.Tensor:
    """The residues (channels, modes) complex128 minimising each channel's ``||samples - Re(sum_j c_j z_j**k)||_2``
    for poles shared by every channel (modes,): real least squares on the columns ``Re z**k`` (every pole) and
    ``Im z**k`` (complex poles), one QR factorisation for all the channels (``samples``: (lags, channels))."""
    powers = pole_powers(poles, torch.arange(samples.shape[0], device=samples.device))     # (lags, modes)
    complex_pole = poles.imag != 0
    basis = torch.cat([powers.real, powers.imag[:, complex_pole]], dim=1)
    # One QR for every channel (a least-squares driver with C right-hand sides is several times slower on CPU).
    q, r = torch.linalg.qr(basis)
    solution = torch.linalg.solve_triangular(r, q.mT @ samples, upper=True)                # (columns, channels)
    modes = poles.shape[0]
    imaginary = solution.new_zeros(modes, samples.shape[1])
    imaginary[complex_pole] = solution[modes:]
    return torch.complex(solution[:modes], -imaginary).mT


def fit_shared_tail(mixer: TokenMixer, window: int, rank: int, tolerance: float, taps: torch.Tensor,
                    pole_span: int, residue_span: int, channels: torch.Tensor | None = None) -> ModalTail:
    """Fit the tail ``k >= window`` of every channel of ``mixer`` with one set of at most ``rank`` realisation
    poles (real and upper-half ones kept, as in :func:`~modeling_tnn.fit_modal.hankel_poles`), found on tail
    lags ``0 .. pole_span`` of the channels scaled to unit l1, residues per channel over tail lags
    ``0 .. residue_span``; rounded to complex64 and certified like every fit. ``taps``: the float64 kernel (lags,
    channels), at least ``window + max(pole_span, residue_span)`` lags; ``channels``: the channels to fit (all by
    default), which share the pole set."""
    if channels is not None:
        taps = taps[:, channels]
    samples = taps[window:window + max(pole_span, residue_span)]
    scale = taps[:window + pole_span].abs().sum(0).clamp_min(torch.finfo(taps.dtype).tiny)
    basis = span_basis(samples[:pole_span] / scale)                                      # channels at about unit l1
    if basis.shape[1] == 0:  # every tail is zero: one placeholder mode, whose residues come out zero
        poles = torch.full((1,), 0.5, dtype=torch.complex128, device=taps.device)
    else:
        poles, kept = realisation_poles(block_hankel_subspace(basis, rank))
        poles = poles[kept]                                                              # (modes,)
    residues = shared_residues(samples[:residue_span], poles)
    poles64 = poles.to(torch.complex64)
    inside = poles64.abs() < 1
    poles64 = torch.where(inside, poles64, poles64 * (1 - 2.0**-20))  # rounding put a pole on the circle
    residues64 = residues.to(torch.complex64)
    bound = certified_bound(mixer, poles64[None].to(torch.complex128), residues64.to(torch.complex128), window,
                            tolerance, taps, channels)
    return ModalTail(window=window, poles=poles64[None].expand(taps.shape[1], -1).contiguous(), residues=residues64,
                     bound=bound, tolerance=tolerance)
