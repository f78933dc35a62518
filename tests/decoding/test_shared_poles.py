"""The layer-wide fit (one pole set for every channel) against its definitions: the shared-pole modal values against
the per-channel ones, the span basis against the samples' Gram matrix, the realisation against known poles, the
one-QR residues against per-channel least squares, and a widened tail's bound against its error summed lag by lag."""

from __future__ import annotations

import math

import torch

from modeling_tnn import TnnForCausalLM
from modeling_tnn.fit_ladder import Rung, _widened, compact_tail
from modeling_tnn.fit_modal import float64_taps, modal_values, realisation_poles
from modeling_tnn.fit_shared_poles import block_hankel_subspace, shared_residues, span_basis

from tests.support import tiny_config


def _shared_poles() -> torch.Tensor:
    """Two real poles and two complex (upper-half) ones, as a decaying layer has."""
    return torch.tensor([0.97, 0.8, 0.95 * math.e ** 0.3j, 0.9 * math.e ** 1.1j], dtype=torch.complex128)


def _channels_of(poles: torch.Tensor, channels: int, lags: int, seed: int = 0) -> tuple[torch.Tensor, torch.Tensor]:
    """``samples`` (lags, channels) ``Re(sum_j c_j z_j**k)`` with random residues (real for real poles)."""
    generator = torch.Generator().manual_seed(seed)
    residues = torch.randn(channels, poles.shape[0], dtype=torch.complex128, generator=generator)
    residues = torch.where(poles.imag == 0, residues.real.to(residues.dtype), residues)
    powers = torch.exp(torch.arange(lags, dtype=torch.float64)[:, None] * torch.log(poles)[None])
    return (powers @ residues.t()).real, residues


def test_shared_modal_values_equal_the_per_channel_ones():
    poles = _shared_poles()
    residues = torch.randn(5, 4, dtype=torch.complex128, generator=torch.Generator().manual_seed(1))
    for start, count in [(0, 9), (3, 500)]:
        shared = modal_values(poles[None], residues, start, count)
        per_channel = modal_values(poles[None].expand(5, -1), residues, start, count)
        torch.testing.assert_close(shared, per_channel, rtol=0, atol=1e-12)


def test_span_basis_reproduces_the_samples_gram_matrix():
    generator = torch.Generator().manual_seed(0)
    samples = torch.randn(300, 6, dtype=torch.float64, generator=generator) @ torch.randn(
        6, 200, dtype=torch.float64, generator=generator)                                # rank 6
    basis = span_basis(samples)
    assert basis.shape == (300, 6)
    torch.testing.assert_close(basis @ basis.t(), samples @ samples.t(), rtol=1e-10, atol=1e-8)


def test_the_block_hankel_realisation_finds_the_poles_every_channel_shares():
    poles = _shared_poles()
    samples, _ = _channels_of(poles, channels=40, lags=401)
    found, kept = realisation_poles(block_hankel_subspace(span_basis(samples), rank=6))
    found = found[kept]
    assert found.shape == poles.shape  # the real ones and one of each conjugate pair
    distance = (found[:, None] - poles[None]).abs().min(dim=0).values
    assert distance.max() < 1e-8


def test_shared_residues_equal_each_channels_least_squares():
    poles = _shared_poles()
    samples, residues = _channels_of(poles, channels=7, lags=600, seed=3)
    noise = torch.randn(samples.shape, dtype=torch.float64, generator=torch.Generator().manual_seed(4))
    samples = samples + 1e-4 * noise
    fitted = shared_residues(samples, poles)
    assert (fitted[:, :2].imag == 0).all()
    powers = torch.exp(torch.arange(600, dtype=torch.float64)[:, None] * torch.log(poles)[None])
    basis = torch.cat([powers.real, -powers.imag[:, 2:]], dim=1)                          # Re(c z) columns
    solution = torch.linalg.lstsq(basis, samples, driver="gelsd").solution
    reference = torch.complex(solution[:4], torch.cat([torch.zeros(2, 7, dtype=torch.float64), solution[4:]]))
    torch.testing.assert_close(fitted, reference.t(), rtol=1e-8, atol=1e-10)


def test_a_widened_tail_keeps_a_certified_bound_with_its_rerounded_residues():
    """Widening moves lags into the exact window and rounds the shifted residues to complex64 again: the bound it
    reports (the fitted one plus that rounding's closed-form cost) covers the l1 error summed over 20,000 lags."""
    torch.manual_seed(0)
    model = TnnForCausalLM(tiny_config("dense", decay_gamma=0.99)).eval()
    mixer = model.model.layers[0].gtu.token_mixer
    tail = compact_tail(mixer, 1e-5, torch.device("cpu"), ladder=(Rung(32, 48, pole_span=800, shared=True),))
    n = 20_000
    taps = float64_taps(mixer, torch.arange(n))
    for window in (tail.window + 1, tail.window + 45):
        wide = _widened(tail, window, taps.abs().sum(0))
        powers = torch.exp(torch.arange(n - window, dtype=torch.float64)[:, None, None]
                           * torch.log(wide.poles.to(torch.complex128))[None])
        modal = (powers * wide.residues.to(torch.complex128)[None]).sum(-1).real
        error = (taps[window:] - modal).abs().sum(0) / taps.abs().sum(0)
        assert (error <= wide.bound).all() and (wide.bound >= tail.bound).all()


def test_channels_with_a_zero_kernel_certify_exactly_and_a_zero_layer_fits():
    torch.manual_seed(0)
    model = TnnForCausalLM(tiny_config("dense", decay_gamma=0.99)).eval()
    mixer = model.model.layers[0].gtu.token_mixer
    rpe = mixer.modal_tail_rpe()
    with torch.no_grad():
        rpe.out_proj.weight[:4] = 0
        rpe.out_proj.bias[:4] = 0
    tail = compact_tail(mixer, 1e-5, torch.device("cpu"))
    assert (tail.bound[:4] == 0).all() and (tail.bound <= 1e-5).all()
    with torch.no_grad():
        rpe.out_proj.weight.zero_()
        rpe.out_proj.bias.zero_()
    tail = compact_tail(mixer, 1e-5, torch.device("cpu"))
    assert (tail.bound == 0).all() and (tail.residues == 0).all()
