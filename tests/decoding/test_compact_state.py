"""The compact decoding state (a short exact window and complex modes for the tail of a decaying dense kernel): its
certified bound against measured errors, against the no-cache forward, its memory accounting, a rough kernel's
fallback, and a serialisable pytree context."""

from __future__ import annotations

import json

import pytest
import torch

from modeling_tnn import TnnConfig
from modeling_tnn.decoding_cache import TnnCache, mix_with_cache
from modeling_tnn.decoding_compact import FOLD_EVERY
from modeling_tnn.fit_modal import float64_taps, fit_modal_tail, modal_taps
from modeling_tnn.modeling_tnn import CACHE_FIELD

from tests.support import tiny_model

WINDOW = 32  # the ladder's window: the switch point where the modes take over


def _model(gamma, **overrides):
    return tiny_model("dense", decay_gamma=gamma, **overrides).eval()


def _mixer(model, layer=0):
    return model.model.layers[layer].gtu.token_mixer


def _relative_error(a, b):
    return ((a - b).abs().max() / b.abs().max()).item()


@pytest.mark.parametrize("gamma", [0.9, 0.99])
def test_bound_holds_at_the_mixer_output_in_float64_and_is_not_vacuous(gamma):
    """Over 4,096 lags (far past where the fit was made) the float64 output error of the window + modes kernel is at
    most bound * ||t||_1 * ||x||_inf in every channel, and the bound itself is small."""
    mixer = _mixer(_model(gamma))
    tail = fit_modal_tail(mixer, WINDOW, 32, 1e-5, torch.device("cpu"))
    assert tail.max_bound < 1e-5
    n = 4096
    taps = float64_taps(mixer, torch.arange(n))
    approx = taps.clone()
    approx[WINDOW:] = modal_taps(tail.poles.to(torch.complex128), tail.residues.to(torch.complex128),
                                 torch.arange(n - WINDOW))
    x = torch.randn(n, taps.shape[1], dtype=torch.float64).sign()  # |x| = 1: the worst case of the l1 bound's shape
    exact = torch.fft.irfft(torch.fft.rfft(taps, 2 * n, dim=0) * torch.fft.rfft(x, 2 * n, dim=0), 2 * n, dim=0)[:n]
    modal = torch.fft.irfft(torch.fft.rfft(approx, 2 * n, dim=0) * torch.fft.rfft(x, 2 * n, dim=0), 2 * n, dim=0)[:n]
    measured = (exact - modal).abs().amax(0)
    scale = taps.abs().sum(0) * x.abs().amax(0)
    assert (measured <= tail.bound * scale + 1e-12 * scale).all()
    assert measured.max() > 0  # an approximation, not the exact kernel


def test_float32_decoding_stays_within_the_bound_plus_the_windows_float32_error():
    """The cached mixer (float32 window and modes, updated in place over 600 steps) against the float64 exact
    kernel: within bound * ||t||_1 ||x||_inf plus what the exact window itself loses in float32."""
    model = _model(0.9)
    mixer = _mixer(model)
    cache = TnnCache(model.config, mode="compact")
    n, prompt = 600, 40
    torch.manual_seed(1)
    v = torch.rand(1, n, mixer.rpe.out_proj.out_features)
    with torch.no_grad():
        out = [mix_with_cache(mixer, v[:, :prompt], None, cache.layers[0], cache)]
        cache.advance(prompt)
        for i in range(prompt, n):
            out.append(mix_with_cache(mixer, v[:, i:i + 1], None, cache.layers[0], cache))
            cache.advance(1)
        window = TnnCache(model.config, mode="exact")
        exact32 = [mix_with_cache(mixer, v[:, :prompt], None, window.layers[0], window)]
        window.advance(prompt)
        for i in range(prompt, n):
            exact32.append(mix_with_cache(mixer, v[:, i:i + 1], None, window.layers[0], window))
            window.advance(1)
    got, exact32 = torch.cat(out, 1)[0].double(), torch.cat(exact32, 1)[0].double()
    taps = float64_taps(mixer, torch.arange(n))
    x = v[0].double()
    exact = torch.fft.irfft(torch.fft.rfft(taps, 2 * n, dim=0) * torch.fft.rfft(x, 2 * n, dim=0), 2 * n, dim=0)[:n]
    bound = cache.describe()[0]["error_bound"]
    scale = taps.abs().sum(0) * x.abs().amax(0)
    float32_window = (exact32 - exact).abs().amax(0)
    assert ((got - exact).abs().amax(0) <= bound * scale + 2 * float32_window + 1e-7 * scale).all()


@pytest.mark.parametrize("gamma", [0.9, 0.99])
def test_compact_decoding_equals_the_no_cache_forward_across_the_switch_points(gamma):
    """Prefill inside the window, single steps past the window filling (the modes taking over), a chunk, then a
    continuation from the returned cache: logits within 1e-5 relative of the no-cache forward."""
    model = _model(gamma)
    ids = torch.randint(1, 128, (2, 3 * WINDOW))
    mask = torch.ones_like(ids)
    mask[0, :3] = 0  # a left-padded row
    with torch.no_grad():
        full = model(input_ids=ids, attention_mask=mask, use_cache=False).logits
        out = model(input_ids=ids[:, :5], attention_mask=mask[:, :5], use_cache=True, generation_cache="compact")
        cache, logits = getattr(out, CACHE_FIELD), [out.logits]
        assert [layer["plan"] for layer in cache.describe()] == ["compact"] * model.config.num_hidden_layers
        first = cache.memory_bytes()
        for i in range(5, WINDOW + 8):
            logits.append(model(input_ids=ids[:, i:i + 1], attention_mask=mask[:, :i + 1],
                                **{CACHE_FIELD: cache}).logits)
        assert cache.memory_bytes() == first  # allocated whole at prefill
        logits.append(model(input_ids=ids[:, WINDOW + 8: 2 * WINDOW], attention_mask=mask[:, :2 * WINDOW],
                            **{CACHE_FIELD: cache}).logits)
        for i in range(2 * WINDOW, 3 * WINDOW):
            logits.append(model(input_ids=ids[:, i:i + 1], attention_mask=mask[:, :i + 1],
                                **{CACHE_FIELD: cache}).logits)
    assert _relative_error(torch.cat(logits, 1), full) < 1e-5


def test_a_long_prompt_builds_the_modes_in_parallel():
    """A prompt of many blocks (the modal state from one parallel pass), then steps: the no-cache logits."""
    model = _model(0.99)
    ids = torch.randint(1, 128, (1, 700))
    with torch.no_grad():
        full = model(input_ids=ids, use_cache=False).logits[:, -20:]
        out = model(input_ids=ids[:, :680], use_cache=True, generation_cache="compact")
        cache = getattr(out, CACHE_FIELD)
        steps = [model(input_ids=ids[:, i:i + 1], **{CACHE_FIELD: cache}).logits for i in range(680, 700)]
    assert _relative_error(torch.cat(steps, 1), full) < 1e-5


def test_describe_and_memory_count_the_whole_batch():
    model = _model(0.9)
    states = []
    for batch in (1, 2):
        with torch.no_grad():
            out = model(input_ids=torch.randint(1, 128, (batch, 6)), use_cache=True, generation_cache="compact")
        cache = getattr(out, CACHE_FIELD)
        rows = cache.describe()
        assert cache.memory_bytes() == sum(row["state_bytes"] for row in rows)
        assert all(row["plan"] == "compact" and 0 < row["error_bound"] < 1e-5 for row in rows)
        states.append(cache.memory_bytes())
    channels = model.config.gtu_dim
    modes = sum(row["modes"] for row in rows)
    rows_per_layer = WINDOW + 2 * FOLD_EVERY  # the ring (W + K slots), then the readout rows (K)
    per_sequence = model.config.num_hidden_layers * channels * rows_per_layer * 4 + channels * modes * 8  # re, im
    assert states[1] - states[0] == per_sequence and states[0] == per_sequence


def test_a_rough_kernel_falls_back_or_stays_within_its_tolerance():
    """RPE weights redrawn from a wide normal: "auto" certifies the compact state or falls back to the exact window,
    and decodes within its tolerance either way."""
    model = _model(0.99)
    torch.manual_seed(3)
    with torch.no_grad():
        for layer in model.model.layers:
            for p in layer.gtu.token_mixer.rpe.parameters():
                p.normal_(0, 3.0)
    _auto_decodes_within_tolerance(model, 3 * WINDOW)


def _auto_decodes_within_tolerance(model, length):
    ids = torch.randint(1, 128, (1, length))
    with torch.no_grad():
        full = model(input_ids=ids, use_cache=False).logits
        out = model(input_ids=ids[:, :4], use_cache=True, generation_cache="auto")
        cache, logits = getattr(out, CACHE_FIELD), [out.logits]
        for i in range(4, length):
            logits.append(model(input_ids=ids[:, i:i + 1], **{CACHE_FIELD: cache}).logits)
    for row in cache.describe():
        assert row["plan"] == "window" or row["error_bound"] <= model.config.compact_tolerance
    assert _relative_error(torch.cat(logits, 1), full) < 1e-5
    return cache


def test_a_trained_kernel_certifies_or_falls_back():
    """Forty AdamW steps of next-token training on a repeating sequence move the RPE off its initialisation; the
    refit (the weights changed) certifies each layer or falls back, within the tolerance."""
    model = _model(0.99).train()
    optimizer = torch.optim.AdamW(model.parameters(), lr=3e-3)
    data = torch.arange(1, 65).repeat(2, 2)
    for _ in range(40):
        loss = model(input_ids=data, labels=data, use_cache=False).loss
        loss.backward()
        optimizer.step()
        optimizer.zero_grad()
    _auto_decodes_within_tolerance(model.eval(), 2 * WINDOW)


def test_beam_search_with_the_compact_cache_equals_without():
    model = _model(0.9, generation_cache="compact")
    prompt = torch.randint(1, 128, (2, 7))
    kwargs = dict(max_new_tokens=WINDOW, num_beams=3, num_return_sequences=2, do_sample=False, pad_token_id=0)
    assert torch.equal(model.generate(prompt, **kwargs), model.generate(prompt, use_cache=False, **kwargs))


def test_generate_from_inputs_embeds_with_the_compact_cache():
    model = _model(0.9, generation_cache="compact")
    ids = torch.randint(1, 128, (1, 6))
    embeds = model.get_input_embeddings()(ids).detach()
    kwargs = dict(max_new_tokens=WINDOW, do_sample=False, pad_token_id=0)
    assert torch.equal(model.generate(inputs_embeds=embeds, **kwargs),
                       model.generate(inputs_embeds=embeds, use_cache=False, **kwargs))


def test_the_cache_pytree_context_serialises():
    model = _model(0.9)
    with torch.no_grad():
        cache = getattr(model(input_ids=torch.randint(1, 128, (1, 5)), use_cache=True, generation_cache="compact"),
                        CACHE_FIELD)
    leaves, spec = torch.utils._pytree.tree_flatten(cache)
    assert all(leaf is None or isinstance(leaf, torch.Tensor) for leaf in leaves)
    dumped = torch.utils._pytree.treespec_dumps(spec)
    json.loads(dumped)
    rebuilt = torch.utils._pytree.tree_unflatten(leaves, torch.utils._pytree.treespec_loads(dumped))
    assert rebuilt.describe() == cache.describe()


@pytest.mark.parametrize("value", [0, 1, -1e-5, "1e-5", None])
def test_bad_compact_tolerance_raises_naming_the_field(value):
    with pytest.raises(ValueError, match="compact_tolerance"):
        TnnConfig(compact_tolerance=value)


@pytest.mark.parametrize("full_product_share", [0.25, 1.0])  # the groups' products over every channel, or gathered
def test_channels_that_share_poles_give_the_per_channel_modes_and_contributions(full_product_share, monkeypatch):
    """A layer's channels in shared pole groups (one matrix product each) and channels with poles of their own build
    the same modes, and the modes contribute the same outputs, as the per-channel path and a float64 brute force."""
    from modeling_tnn import decoding_modal_sums
    from modeling_tnn.decoding_modal_sums import (channel_contribution, channel_modal_state, modal_contribution,
                                                  modal_state)
    from modeling_tnn.fit_store import pole_groups

    monkeypatch.setattr(decoding_modal_sums, "FULL_PRODUCT_SHARE", full_product_share)

    generator = torch.Generator().manual_seed(0)
    shared = torch.polar(0.5 + 0.45 * torch.rand(6, generator=generator), 3 * torch.rand(6, generator=generator))
    own = torch.polar(0.5 + 0.45 * torch.rand(5, 6, generator=generator), 3 * torch.rand(5, 6, generator=generator))
    other = shared.flip(0) * 0.9
    poles = torch.cat([shared.expand(9, -1), own, other.expand(10, -1), shared.expand(3, -1)])[
        torch.randperm(27, generator=generator)].to(torch.complex64)
    residues = torch.randn(27, 6, dtype=torch.complex64, generator=generator)
    groups = pole_groups(poles)
    assert sorted(groups.sizes) == [10, 12] and torch.equal(groups.order[groups.rank], torch.arange(27))
    inputs = torch.randn(2, 300, 27, generator=generator)
    exponents = torch.arange(299, -1, -1, dtype=torch.float64)
    powers = poles.to(torch.complex128)[None] ** exponents[:, None, None]                   # (T, c, r)
    brute = residues.to(torch.complex128) * torch.einsum("tcr,btc->bcr", powers, inputs.to(torch.complex128))
    grouped = modal_state(inputs, poles, residues, groups)
    torch.testing.assert_close(grouped, channel_modal_state(inputs, poles, residues), atol=1e-4, rtol=1e-4)
    torch.testing.assert_close(grouped.to(torch.complex128), brute, atol=1e-4, rtol=1e-4)
    contribution = modal_contribution(grouped, poles, 40, groups)
    torch.testing.assert_close(contribution, channel_contribution(grouped, poles, 40), atol=1e-4, rtol=1e-4)
