"""ETSC conversion and the generation cache against the no-cache forward."""

from __future__ import annotations

import pytest
import torch

from modeling_tnn import TnnForCausalLM
from modeling_tnn.etsc_cache import TnnCache, decode_step, etsc_modes, prefill_state, ssm_kernel

from conftest import CAUSAL_MIXERS, tiny_config

# A short ETSC horizon (and FD kernel) keeps "within" and "beyond the horizon" cheap to test.
HORIZON = 16


def _model(mixer, **overrides):
    torch.manual_seed(0)
    overrides = {"etsc_length": HORIZON, "fd_kernel_length": HORIZON, **overrides}
    return TnnForCausalLM(tiny_config(mixer, eos_token_id=None, **overrides)).eval()


def _generate(model, ids, **kwargs):
    kwargs.setdefault("max_new_tokens", HORIZON - 6)  # callers use prompts of <= 6 tokens
    kwargs.setdefault("do_sample", False)
    return model.generate(ids, pad_token_id=0, return_dict_in_generate=True, output_logits=True, **kwargs)


@pytest.mark.parametrize("gamma", [1.0, 0.97])
def test_conversion_reproduces_the_kernel(gamma):
    torch.manual_seed(0)
    length = 100
    taps = torch.randn(length, 5, dtype=torch.float64)
    lam, b = etsc_modes(taps, gamma)
    assert lam.shape == (length,) and b.shape == (length, 5)
    expected = taps * gamma ** torch.arange(length, dtype=torch.float64)[:, None]
    implied = ssm_kernel(lam, b, 2 * (length + 1))
    relative = (implied[:length] - expected).abs().max() / expected.abs().max()
    assert relative < 1e-6
    # Past the horizon: lag L is -sum(t) gamma^L, then the kernel repeats with period L + 1, damped by gamma.
    torch.testing.assert_close(implied[length], -taps.sum(0) * gamma**length)
    torch.testing.assert_close(implied[length + 1 + 3], implied[3] * gamma ** (length + 1))


@pytest.mark.parametrize("mode", ["etsc", "exact"])
@pytest.mark.parametrize("mixer", CAUSAL_MIXERS)
def test_prefill_state_equals_stepping_from_an_empty_state(mixer, mode):
    model = _model(mixer)
    token_mixer = model.model.layers[0].gtu.token_mixer
    v = torch.randn(2, 9, token_mixer.channels)
    with torch.no_grad():
        direct = prefill_state(token_mixer, v, mode, HORIZON)
        state = prefill_state(token_mixer, v[:, :1], mode, HORIZON)
        for i in range(1, 9):
            _, state = decode_step(token_mixer, v[:, i:i + 1], state, mode, HORIZON)
    torch.testing.assert_close(direct, state.to(direct.dtype), atol=1e-5, rtol=1e-5)


def _assert_cache_matches_full_recompute(model, prompt, new_tokens, **kwargs):
    """Greedy generate with the cache gives the tokens of generate(use_cache=False), logits within 1e-4."""
    cached = _generate(model, prompt, max_new_tokens=new_tokens, **kwargs)
    full = _generate(model, prompt, max_new_tokens=new_tokens, use_cache=False)
    assert isinstance(cached.cache if hasattr(cached, "cache") else cached.past_key_values, TnnCache)
    assert torch.equal(cached.sequences, full.sequences)
    for a, b in zip(cached.logits, full.logits):
        torch.testing.assert_close(a, b, atol=1e-4, rtol=0)


@pytest.mark.parametrize("mode", ["etsc", "exact"])
@pytest.mark.parametrize("mixer", CAUSAL_MIXERS)
def test_greedy_with_cache_equals_no_cache_within_the_horizon(mixer, mode):
    _assert_cache_matches_full_recompute(_model(mixer, generation_cache=mode), torch.randint(1, 128, (1, 5)),
                                         HORIZON - 5)


@pytest.mark.parametrize("mixer", CAUSAL_MIXERS)
def test_exact_mode_stays_exact_beyond_the_horizon(mixer):
    prompt = torch.randint(1, 128, (1, 2 * HORIZON))  # the prompt alone crosses the horizon twice
    _assert_cache_matches_full_recompute(_model(mixer), prompt, 2 * HORIZON, generation_cache="exact")


@pytest.mark.parametrize("mixer", CAUSAL_MIXERS)
def test_left_padded_batch_generates_what_each_prompt_generates_alone(mixer):
    model = _model(mixer)
    prompts = [torch.randint(1, 128, (n,)) for n in (5, 13, 9)]
    width = max(len(p) for p in prompts)
    ids = torch.zeros(3, width, dtype=torch.long)
    mask = torch.zeros(3, width, dtype=torch.long)
    for i, p in enumerate(prompts):
        ids[i, width - len(p):] = p
        mask[i, width - len(p):] = 1
    batch = model.generate(ids, attention_mask=mask, max_new_tokens=10, do_sample=False, pad_token_id=0)
    for i, p in enumerate(prompts):
        alone = model.generate(p[None], max_new_tokens=10, do_sample=False, pad_token_id=0)
        assert torch.equal(batch[i, width:], alone[0, len(p):])


@pytest.mark.parametrize("mixer", CAUSAL_MIXERS)
def test_beam_search_with_cache_equals_without(mixer):
    model = _model(mixer)
    prompt = torch.randint(1, 128, (2, 7))
    kwargs = dict(max_new_tokens=8, num_beams=3, num_return_sequences=2, do_sample=False, pad_token_id=0)
    with_cache = model.generate(prompt, **kwargs)
    without = model.generate(prompt, use_cache=False, **kwargs)
    assert with_cache.shape == (4, 15)
    assert torch.equal(with_cache, without)


def test_sampling_with_a_fixed_seed_is_reproducible_and_matches_no_cache():
    model = _model("dense")
    prompt = torch.randint(1, 128, (1, 4))  # 4 + 12 tokens: within the ETSC horizon
    runs = []
    for use_cache in (True, True, False):
        torch.manual_seed(123)
        runs.append(model.generate(prompt, do_sample=True, top_k=20, max_new_tokens=12, num_return_sequences=3,
                                   use_cache=use_cache, pad_token_id=0))
    assert runs[0].shape == (3, 16)
    assert torch.equal(runs[0], runs[1]) and torch.equal(runs[0], runs[2])


@pytest.mark.parametrize("mixer", CAUSAL_MIXERS)
def test_continuing_from_a_returned_cache_equals_one_long_generate(mixer):
    model = _model(mixer)
    prompt = torch.randint(1, 128, (1, 8))
    first = model.generate(prompt, max_new_tokens=6, do_sample=False, pad_token_id=0, return_dict_in_generate=True)
    cache = first.cache if hasattr(first, "cache") else first.past_key_values
    cache_kwarg = "cache" if hasattr(first, "cache") else "past_key_values"
    second = model.generate(first.sequences, max_new_tokens=6, do_sample=False, pad_token_id=0,
                            **{cache_kwarg: cache})
    long = model.generate(prompt, max_new_tokens=12, do_sample=False, pad_token_id=0)
    assert torch.equal(second, long)


@pytest.mark.parametrize("mode", ["etsc", "exact"])
def test_cache_memory_is_constant_in_context_length(mode):
    model = _model("fd")  # FD's exact mode keeps a fixed window; dense's exact mode grows by design
    memory = []
    for new_tokens in (5, 2 * HORIZON, 4 * HORIZON):
        out = _generate(model, torch.randint(1, 128, (1, 6)), max_new_tokens=new_tokens, generation_cache=mode)
        memory.append((out.cache if hasattr(out, "cache") else out.past_key_values).memory_bytes())
    assert memory[0] == memory[1] == memory[2] > 0


def test_bfloat16_model_generates_with_the_cache():
    model = _model("dense").to(torch.bfloat16)
    out = model.generate(torch.randint(1, 128, (2, 6)), max_new_tokens=8, do_sample=False, pad_token_id=0)
    assert out.shape == (2, 14)
    assert all(not p.is_complex() and p.dtype == torch.bfloat16 for p in model.parameters())


def test_conversion_is_recomputed_when_weights_change():
    model = _model("dense")
    prompt = torch.randint(1, 128, (1, 6))
    _generate(model, prompt)
    with torch.no_grad():
        for layer in model.model.layers:
            layer.gtu.token_mixer.rpe.out_proj.bias.mul_(-3.0)
    _assert_cache_matches_full_recompute(model, prompt, HORIZON - 6)


def test_bad_generation_cache_mode_raises():
    model = _model("dense")
    with pytest.raises(ValueError, match="generation_cache"):
        model(input_ids=torch.ones(1, 3, dtype=torch.long), use_cache=True, generation_cache="kv")
