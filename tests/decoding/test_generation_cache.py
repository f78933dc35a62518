"""The generation cache against the no-cache forward in every mode (window, ETSC's SSM, compact), and the ETSC
conversion."""

from __future__ import annotations

import warnings

import pytest
import torch

from modeling_tnn import TnnForCausalLM
from modeling_tnn.decoding_cache import TnnCache
from modeling_tnn.decoding_ssm import dft_modes, etsc_modes, half_spectrum, ssm_kernel
from modeling_tnn.modeling_tnn import CACHE_FIELD

from tests.support import CAUSAL_MIXERS, tiny_model

# A short ETSC horizon (and FD kernel) keeps "within" and "beyond the horizon" cheap to test.
HORIZON = 16


def _model(mixer, **overrides):
    overrides = {"etsc_length": HORIZON, "fd_kernel_length": HORIZON, **overrides}
    return tiny_model(mixer, TnnForCausalLM, **overrides).eval()


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


def test_decayed_dft_basis_is_exact_and_the_half_spectrum_keeps_the_kernel():
    torch.manual_seed(0)
    length, gamma = 64, 0.9
    taps = torch.randn(length, 3, dtype=torch.float64)
    lam, b = dft_modes(taps, gamma)
    half_lam, half_b = half_spectrum(lam, b)
    assert half_lam.shape == (length // 2 + 1,)
    implied = ssm_kernel(half_lam, half_b, 3 * length)
    k = torch.arange(3 * length, dtype=torch.float64)[:, None]
    # Period m, damped by gamma: t_k = taps[k mod m] gamma^k at every lag, with no closing tap.
    torch.testing.assert_close(implied, taps.repeat(3, 1) * gamma**k)


def _stepped_logits(model, ids, prompt, mode, chunk=1, attention_mask=None):
    """Logits of a prefill of ``prompt`` tokens, then ``chunk`` tokens per call on the returned cache."""
    mask = attention_mask if attention_mask is not None else torch.ones_like(ids)
    with torch.no_grad():
        out = model(input_ids=ids[:, :prompt], attention_mask=mask[:, :prompt], use_cache=True, generation_cache=mode)
        cache, logits = getattr(out, CACHE_FIELD), [out.logits]
        for i in range(prompt, ids.shape[1], chunk):
            out = model(input_ids=ids[:, i:i + chunk], attention_mask=mask[:, :i + chunk], **{CACHE_FIELD: cache})
            logits.append(out.logits)
    return torch.cat(logits, dim=1), cache


def _relative_error(a, b):
    return ((a - b).abs().max() / b.abs().max()).item()


@pytest.mark.parametrize("chunk", [1, 5])
@pytest.mark.parametrize("mode", ["auto", "compact", "etsc", "exact"])
@pytest.mark.parametrize("mixer,gamma", [("dense", 0.9), ("dense", 1.0), ("fd", 1.0)])
def test_cached_decoding_equals_the_no_cache_forward(mixer, gamma, mode, chunk):
    """Prefill + single tokens (or chunks) on the cache give the full forward's logits across every change of state:
    the window filling and wrapping (or growing), the switch from the window to the SSM, and the SSM straight from
    a long prompt. Only ETSC of a kernel that does not decay stops at its horizon."""
    model = _model(mixer, decay_gamma=gamma)
    with torch.no_grad():
        _, cache = _stepped_logits(model, torch.ones(1, 2, dtype=torch.long), 1, mode)
    plan = cache.describe()[0]
    span = plan["window"] or 64  # where the state changes: the window, the SSM's period (64: the history grows)
    ids = torch.randint(1, 128, (2, span + 12))
    mask = torch.ones_like(ids)
    mask[0, :4] = 0  # a left-padded row
    full = model(input_ids=ids, attention_mask=mask, use_cache=False).logits
    inexact = cache.layers[0].state.horizon is not None
    for prompt in (span - 4, span + 2):
        with warnings.catch_warnings():
            warnings.simplefilter("ignore" if inexact else "error")
            logits, _ = _stepped_logits(model, ids, prompt, mode, chunk, mask)
        if inexact:
            assert _relative_error(logits[:, :HORIZON], full[:, :HORIZON]) < 1e-5
            assert _relative_error(logits, full) > 1e-3  # the repeating kernel, which the warning announces
        else:
            assert _relative_error(logits, full) < 1e-5


def test_auto_mode_is_compact_where_certified_else_exact():
    plans = {}
    for mixer, gamma, mode in (("dense", 0.9, "auto"), ("dense", 0.9, "exact"), ("dense", 1.0, "auto"),
                               ("fd", 1.0, "auto")):
        with torch.no_grad():
            _, cache = _stepped_logits(_model(mixer, decay_gamma=gamma), torch.ones(1, 2, dtype=torch.long), 1, mode)
        plans[mixer, gamma, mode] = cache.describe()[0] | {"horizon": cache.layers[0].state.horizon}
    plans["dense", 0.9] = plans["dense", 0.9, "exact"]
    plans["fd", 1.0], plans["dense", 1.0] = plans["fd", 1.0, "auto"], plans["dense", 1.0, "auto"]
    compact = plans["dense", 0.9, "auto"]
    assert compact["plan"] == "compact" and compact["error_bound"] <= 1e-5  # the default compact_tolerance
    support = _model("dense", decay_gamma=0.9).model.layers[0].gtu.token_mixer.kernel_support(torch.device("cpu"))
    assert 0.9**support < 2**-24 < 0.9 ** (support - 30)  # past gamma's float32 horizon, by less than 30 lags here
    assert plans["dense", 0.9]["plan"] == "window" and plans["dense", 0.9]["window"] == support
    assert plans["fd", 1.0]["plan"] == "window" and plans["fd", 1.0]["window"] == HORIZON + 1
    assert plans["dense", 1.0]["plan"] == "ssm" and plans["dense", 1.0]["horizon"] == HORIZON  # ETSC, warned past it


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


def _cache_of(output):
    return getattr(output, CACHE_FIELD)


def _left_padded_prompts(lengths=(5, 9)):
    width = max(lengths)
    ids = torch.randint(1, 128, (len(lengths), width))
    mask = torch.ones_like(ids)
    for row, length in enumerate(lengths):
        mask[row, : width - length] = 0
        ids[row, : width - length] = 0
    return ids, mask


def _assert_states_equal(cache_a, cache_b):
    assert cache_a.get_seq_length() == cache_b.get_seq_length()
    for layer_a, layer_b in zip(cache_a.layers, cache_b.layers):
        torch.testing.assert_close(layer_a.recurrent_states[0], layer_b.recurrent_states[0], atol=1e-5, rtol=1e-5)


@pytest.mark.parametrize("mode", ["auto", "etsc", "exact"])
@pytest.mark.parametrize("mixer", CAUSAL_MIXERS)
def test_continuing_generate_from_a_returned_cache_equals_one_long_forward(mixer, mode):
    """generate, then generate again from its sequences and cache: the logits of the continuation equal a plain
    forward over the same tokens (1e-4), for a left-padded batch, and the state equals that of one long generate."""
    model = _model(mixer, generation_cache=mode)
    ids, mask = _left_padded_prompts()
    kwargs = dict(do_sample=False, pad_token_id=0, return_dict_in_generate=True, output_logits=True)
    first = model.generate(ids, attention_mask=mask, max_new_tokens=3, **kwargs)
    assert _cache_of(first).get_seq_length() == ids.shape[1] + 2  # the last token is not fed yet
    grown = torch.nn.functional.pad(mask, (0, first.sequences.shape[1] - mask.shape[1]), value=1)
    second = model.generate(first.sequences, attention_mask=grown, max_new_tokens=3,
                            **{CACHE_FIELD: _cache_of(first)}, **kwargs)
    assert _cache_of(second).get_seq_length() == second.sequences.shape[1] - 1
    full_mask = torch.nn.functional.pad(mask, (0, second.sequences.shape[1] - mask.shape[1]), value=1)
    reference = model(input_ids=second.sequences, attention_mask=full_mask, use_cache=False).logits
    start = first.sequences.shape[1] - 1  # the position whose logits the continuation produces first
    for step, logits in enumerate(second.logits):
        torch.testing.assert_close(logits, reference[:, start + step], atol=1e-4, rtol=0)
    long = model.generate(ids, attention_mask=mask, max_new_tokens=6, **kwargs)
    assert torch.equal(long.sequences, second.sequences)
    _assert_states_equal(_cache_of(long), _cache_of(second))


@pytest.mark.parametrize("mixer", CAUSAL_MIXERS)
def test_continuing_generate_from_inputs_embeds(mixer):
    """transformers' continuation from ``inputs_embeds``: the full embeddings plus the returned cache give the
    tokens and state of one long generate."""
    model = _model(mixer)
    ids = torch.randint(1, 128, (2, 7))
    embeds = model.get_input_embeddings()(ids).detach()
    kwargs = dict(do_sample=False, pad_token_id=0, return_dict_in_generate=True)
    long = model.generate(inputs_embeds=embeds, max_new_tokens=4, **kwargs)
    first = model.generate(inputs_embeds=embeds, max_new_tokens=3, **kwargs)
    continued = torch.cat([embeds, model.get_input_embeddings()(first.sequences).detach()], dim=1)
    last = model.generate(inputs_embeds=continued, max_new_tokens=1, **{CACHE_FIELD: _cache_of(first)}, **kwargs)
    assert torch.equal(long.sequences, torch.cat([first.sequences, last.sequences], dim=1))
    _assert_states_equal(_cache_of(long), _cache_of(last))


def test_plain_eval_forward_returns_a_cache_unless_told_not_to():
    model = _model("dense")
    ids = torch.randint(1, 128, (1, 5))
    with torch.no_grad():
        assert isinstance(_cache_of(model(input_ids=ids)), TnnCache)
        assert _cache_of(model(input_ids=ids, use_cache=False)) is None
        model.config.use_cache = False
        assert _cache_of(model(input_ids=ids)) is None
    model.config.use_cache = True
    model.train()
    assert _cache_of(model(input_ids=ids)) is None  # training keeps no decoding state


@pytest.mark.parametrize("mixer", CAUSAL_MIXERS)
def test_default_mode_is_exact_up_to_32x_the_conversion_length(mixer):
    """The default cache against the no-cache forward at 1x .. 32x etsc_length (dense with gamma < 1 and FD: the
    window of the kernel's float32 support, which 32x passes): relative max logit error <= 1e-4."""
    model = _model(mixer, etsc_length=64, fd_kernel_length=64)  # the tiny preset: gamma 0.99, a support of ~1660
    for multiple in (1, 2, 8, 32):
        total = multiple * 64
        ids = torch.randint(1, 128, (1, total))
        with warnings.catch_warnings():
            warnings.simplefilter("error")  # and no horizon warning
            logits, cache = _stepped_logits(model, ids, total - 8, "auto")
        full = model(input_ids=ids, use_cache=False).logits
        assert _relative_error(logits[:, -8:], full[:, -8:]) <= 1e-4
    assert cache.describe()[0]["window"] < total - 8  # 32x is past the window's span


@pytest.mark.parametrize("mixer,mode", [("dense", "auto"), ("dense", "etsc"), ("fd", "etsc")])
def test_an_inexact_mode_warns_once_past_its_horizon(mixer, mode):
    model = _model(mixer, decay_gamma=1.0)
    ids = torch.randint(1, 128, (1, 2 * HORIZON))
    with warnings.catch_warnings(record=True) as caught:
        warnings.simplefilter("always")
        _stepped_logits(model, ids, HORIZON - 2, mode)  # 2 steps within the horizon, then past it
    messages = [str(w.message) for w in caught if "ETSC horizon" in str(w.message)]
    assert len(messages) == 1
    assert f"horizon of {HORIZON} tokens" in messages[0] and "generation_cache='exact'" in messages[0]


def test_exact_modes_never_warn():
    with warnings.catch_warnings():
        warnings.simplefilter("error")
        _stepped_logits(_model("dense", decay_gamma=1.0), torch.randint(1, 128, (1, 3 * HORIZON)), 4, "exact")
        _stepped_logits(_model("fd"), torch.randint(1, 128, (1, 3 * HORIZON)), 4, "auto")


@pytest.mark.parametrize("mode", ["auto", "etsc", "exact"])
@pytest.mark.parametrize("mixer", CAUSAL_MIXERS)
def test_cache_memory_is_bounded_in_context_length(mixer, mode):
    """The state never outgrows the kernel's support (dense: the SSM of its float32 support, FD: its window)."""
    model = _model(mixer, decay_gamma=0.9)
    memory = []
    with warnings.catch_warnings():
        warnings.simplefilter("ignore")  # fd under "etsc" passes its horizon
        for total in (8, 400, 800):
            _, cache = _stepped_logits(model, torch.randint(1, 128, (1, total)), total - 2, mode)
            memory.append(cache.memory_bytes())
    assert 0 < memory[0] <= memory[1] == memory[2]


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
