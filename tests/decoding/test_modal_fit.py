"""The compact fit's fast pieces against their straightforward definitions: the grid of powers and the modal taps
against one exp per lag, the FFT Hankel product against the explicit Hankel matrix, the pinned-row QR residues
against gelsd's minimum-norm least squares, and the certified bound against the l1 error summed lag by lag."""

from __future__ import annotations

import math

import torch

from modeling_tnn import TnnForCausalLM
from modeling_tnn.fit_ladder import compact_tail
from modeling_tnn.fit_modal import (certified_bound, fit_residues, float64_taps,
                                             hankel_product, modal_taps, modal_values)
from modeling_tnn.decoding_poles import pole_power_range, pole_powers
from modeling_tnn.ops_fft_sizes import smooth_size
from modeling_tnn.rpe import Rpe

from tests.support import tiny_config


def _poles_and_residues(channels=3, modes=5, seed=0):
    generator = torch.Generator().manual_seed(seed)
    radius = 0.9 + 0.099 * torch.rand(channels, modes, generator=generator, dtype=torch.float64)
    angle = math.pi * torch.rand(channels, modes, generator=generator, dtype=torch.float64)
    poles = torch.polar(radius, angle)
    poles[:, 0] = poles[:, 0].abs()  # one real pole per channel
    residues = torch.randn(channels, modes, generator=generator, dtype=torch.complex128)
    return poles, residues


def _exp_sum(poles, residues, offsets):
    """``Re(sum_j c_j z_j**m)``, one complex exp per (lag, mode): the definition the fast paths must equal."""
    powers = torch.exp(offsets.to(torch.float64)[:, None, None] * torch.log(poles)[None])
    return (powers * residues[None]).sum(-1).real


def test_modal_values_and_taps_equal_one_exp_per_lag():
    poles, residues = _poles_and_residues()
    for start, count in [(0, 1), (0, 7), (5, 300), (1000, 1031)]:
        offsets = torch.arange(start, start + count)
        reference = _exp_sum(poles, residues, offsets)
        scale = residues.abs().sum(-1)[None]
        assert ((modal_values(poles, residues, start, count).t() - reference).abs() <= 1e-12 * scale).all()
    scattered = torch.tensor([3, 0, 17, 17, 250])
    torch.testing.assert_close(modal_taps(poles, residues, scattered), _exp_sum(poles, residues, scattered),
                               rtol=0, atol=1e-12)


def test_pole_power_range_equals_one_exp_per_power_in_either_precision():
    poles, _ = _poles_and_residues(channels=4, modes=6)
    for start, count in [(0, 1), (0, 128), (7, 300)]:
        reference = pole_powers(poles, torch.arange(start, start + count))
        torch.testing.assert_close(pole_power_range(poles, start, count), reference, rtol=1e-13, atol=1e-15)
        rounded = poles.to(torch.complex64)  # the decoder's poles: the powers of the rounded values, to float32 rounding
        single = pole_power_range(rounded, start, count)
        exact = pole_powers(rounded, torch.arange(start, start + count), torch.complex128)
        assert single.dtype == torch.complex64
        assert ((single.to(torch.complex128) - exact).abs() <= 4e-7 * exact.abs() + 1e-30).all()


def test_hankel_product_equals_the_explicit_hankel_matrix():
    torch.manual_seed(0)
    channels, n = 4, 37
    samples = torch.randn(channels, 2 * n - 1, dtype=torch.float64)
    fft_len = smooth_size(2 * n - 1)
    spectrum = torch.fft.rfft(samples, n=fft_len, dim=1)
    hankel = samples[:, torch.arange(n)[:, None] + torch.arange(n)[None]]             # (c, n, n)
    rows = torch.randn(channels, 6, n, dtype=torch.float64)
    torch.testing.assert_close(hankel_product(spectrum, rows, fft_len), (hankel @ rows.mT).mT, rtol=0, atol=1e-12)
    shared = rows[0]  # one set of vectors for every channel
    torch.testing.assert_close(hankel_product(spectrum, shared, fft_len), (hankel @ shared.t()).mT, rtol=0,
                               atol=1e-12)


def test_fit_residues_equals_minimum_norm_least_squares_with_real_and_unused_modes():
    poles, residues = _poles_and_residues(channels=3, modes=5, seed=1)
    used = torch.ones_like(poles.real, dtype=torch.bool)
    used[1, -2:] = False
    lags = torch.arange(400)
    samples = _exp_sum(poles, residues * used, lags).t().contiguous()
    samples += 1e-3 * torch.randn(samples.shape, dtype=torch.float64, generator=torch.Generator().manual_seed(2))
    fitted = fit_residues(samples, poles, used)
    assert (fitted[~used] == 0).all() and (fitted[:, 0].imag == 0).all()
    # gelsd on the plain columns Re z**k, -Im z**k (zero where unused or real): its minimum-norm solution
    powers = torch.exp(lags.to(torch.float64)[None, :, None] * torch.log(poles)[:, None, :]) * used[:, None, :]
    basis = torch.cat([powers.real, -powers.imag], dim=-1)
    solution = torch.linalg.lstsq(basis, samples[..., None], driver="gelsd").solution[..., 0]
    reference = torch.complex(solution[:, :5], solution[:, 5:])
    torch.testing.assert_close(fitted, reference, rtol=1e-8, atol=1e-10)


def test_certified_bound_covers_the_l1_error_summed_lag_by_lag():
    """The bound's exact part is one batched product and its tail a closed form: over 20,000 lags (far past the
    horizon) the l1 error, summed lag by lag with one exp per lag, stays below it."""
    torch.manual_seed(0)
    model = TnnForCausalLM(tiny_config("dense", decay_gamma=0.99)).eval()
    mixer = model.model.layers[0].gtu.token_mixer
    tail = compact_tail(mixer, 1e-5, torch.device("cpu"))
    n = 20_000
    taps = float64_taps(mixer, torch.arange(n))
    poles, residues = tail.poles.to(torch.complex128), tail.residues.to(torch.complex128)
    modal = _exp_sum(poles, residues, torch.arange(n - tail.window))
    error = (taps[tail.window:] - modal).abs().sum(0) / taps.abs().sum(0)
    assert (error <= tail.bound).all() and error.max() > 0
    # from only the window's taps (the rest evaluated inside, a longer horizon from a smaller l1 floor): still a bound
    again = certified_bound(mixer, poles, residues, tail.window, 1e-5, taps[: tail.window + 1])
    assert (error <= again).all()


def _trained_like_rpe() -> Rpe:
    """An RPE fitted (a few hundred Adam steps) to smooth, decaying, oscillating kernels with offsets: weights that
    have moved from their initialisation the way training moves them."""
    torch.manual_seed(0)
    rpe = Rpe(32, 3, 64)
    optimizer = torch.optim.Adam(rpe.parameters(), lr=3e-3)
    lags = torch.arange(512.0)
    target = (torch.cos(lags[:, None] / (5 + torch.arange(64.0))) * torch.exp(-lags[:, None] / 200)
              + 0.1 * torch.randn(64))
    for _ in range(200):
        loss = (rpe(lags) - target).pow(2).mean()
        optimizer.zero_grad()
        loss.backward()
        optimizer.step()
    return rpe


def test_the_rpe_bound_holds_at_every_lag_and_is_within_a_stated_factor_of_the_sampled_maximum():
    """``Rpe.supremum_bound`` (what the certificate assumes beyond the lags it evaluates) is never exceeded by the
    forward at sampled lags (dense up to 8,192, then out to 1e12), and it is not vacuous: per channel within
    16 sqrt(d) of the sampled maximum, and within 3 sqrt(d) for the median channel (d: the RPE's width; the slack is
    Cauchy-Schwarz's, ``|w . h| <= ||w|| ||h||`` with ``||h|| < sqrt(d)``), on the tiny model's initial RPE, a wider
    random one and a trained-like one."""
    torch.manual_seed(0)
    tiny = TnnForCausalLM(tiny_config("dense", decay_gamma=0.99)).model.layers[0].gtu.token_mixer.rpe
    lags = torch.cat([torch.arange(8192.0), torch.logspace(4, 12, 200)])
    for rpe in (tiny, Rpe(64, 6, 256), _trained_like_rpe()):
        bound = rpe.supremum_bound()
        assert bound.dtype == torch.float64 and bound.shape == (rpe.out_proj.out_features,)
        with torch.no_grad():
            sampled = rpe(lags).abs().amax(0).to(torch.float64)
        assert (sampled <= bound).all()
        ratio = bound / sampled / math.sqrt(rpe.out_proj.in_features)
        assert ratio.max() <= 16 and ratio.median() <= 3, (ratio.max(), ratio.median())
