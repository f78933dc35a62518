"""The papers' architecture options (norm_placement, embedding_layer_norm, scale_embeddings, final_norm,
classifier_pooling): each against a forward written here from its definition, exact padding, the generation cache
of a post-norm causal model, saving and reloading, and old configs that lack the fields."""

from __future__ import annotations

import json
import math

import pytest
import torch
import torch.nn.functional as F
from transformers import AutoModelForSequenceClassification

from modeling_tnn import TnnConfig, TnnForCausalLM, TnnForMaskedLM, TnnForSequenceClassification, TnnModel
from modeling_tnn.modeling_tnn import CACHE_FIELD

from tests.support import CAUSAL_MIXERS, MIXERS, tiny_config
from tests.remote_code import run_with_package_blocked

NEW_FIELDS = ("norm_placement", "embedding_layer_norm", "scale_embeddings", "final_norm", "classifier_pooling")
# The two paper architectures and a mix that no preset uses, at tiny sizes.
BLM = dict(norm_placement="post", embedding_layer_norm=True, scale_embeddings=False, final_norm="none",
           classifier_pooling="mean")
LRA = dict(norm_placement="pre", embedding_layer_norm=False, scale_embeddings=False, final_norm="simplermsnorm",
           classifier_pooling="mean")
MIX = dict(norm_placement="post", embedding_layer_norm=True, scale_embeddings=True, final_norm="layernorm")
ARCHITECTURES = {"blm": BLM, "lra": LRA, "mix": MIX, "default": {}}


def srms(x: torch.Tensor) -> torch.Tensor:
    """SimpleRMSNorm from its definition: x / (sqrt(mean(x^2)) + 1e-8), no parameters."""
    return x / (x.pow(2).mean(-1, keepdim=True).sqrt() + 1e-8)


def _randomise_norms(model: torch.nn.Module) -> None:
    """LayerNorms start as the identity affine map; random weights and biases make a missed or misplaced one show."""
    g = torch.Generator().manual_seed(3)
    with torch.no_grad():
        for module in model.modules():
            if isinstance(module, torch.nn.LayerNorm):
                module.weight.copy_(1 + 0.5 * torch.randn(module.weight.shape, generator=g))
                module.bias.copy_(0.5 * torch.randn(module.bias.shape, generator=g))


def reference_backbone(model: TnnModel, ids: torch.Tensor, mask: torch.Tensor | None = None) -> torch.Tensor:
    """The backbone from the options' definitions, calling only the model's GTU and GLU (the branches f) and its
    embedding/LayerNorm weights; every norm, scale and residual written here."""
    config = model.config
    d = config.hidden_size
    x = model.embeddings.weight[ids]
    if config.scale_embeddings:
        x = x * math.sqrt(d)
    if config.embedding_layer_norm:
        x = F.layer_norm(x, (d,), model.embedding_norm.weight, model.embedding_norm.bias, eps=1e-5)
    for layer in model.layers:
        if config.norm_placement == "post":  # x = norm(x + f(x)) after each residual add
            x = srms(x + layer.gtu(x, mask))
            x = srms(x + layer.glu(x))
        else:  # x = x + f(norm(x))
            x = x + layer.gtu(srms(x), mask)
            x = x + layer.glu(srms(x))
    if config.final_norm == "layernorm":
        return F.layer_norm(x, (d,), model.final_norm.weight, model.final_norm.bias, eps=1e-5)
    if config.final_norm == "simplermsnorm":
        return srms(x)
    return x


# -- each option does what it says ---------------------------------------------------------------------------------


@pytest.mark.parametrize("mixer", MIXERS)
@pytest.mark.parametrize("arch", ARCHITECTURES)
def test_backbone_equals_the_forward_written_from_the_definitions(arch, mixer):
    model = TnnModel(tiny_config(mixer, causal=False, **ARCHITECTURES[arch])).eval()
    _randomise_norms(model)
    ids = torch.randint(1, 128, (2, 11))
    with torch.no_grad():
        ours = model(ids, use_cache=False).last_hidden_state
        expected = reference_backbone(model, ids)
    torch.testing.assert_close(ours, expected, atol=1e-5, rtol=1e-5)


@pytest.mark.parametrize("mixer", CAUSAL_MIXERS)
def test_post_norm_block_is_a_norm_after_each_residual_add(mixer):
    model = TnnModel(tiny_config(mixer, causal=True, norm_placement="post")).eval()
    block = model.layers[0]
    x = torch.randn(2, 9, 32) * 3
    with torch.no_grad():
        h = srms(x + block.gtu(x))
        expected = srms(h + block.glu(h))
        torch.testing.assert_close(block(x), expected, atol=1e-6, rtol=1e-6)
        # the same weights as pre-norm: only the placement differs, and it changes the output
        block.post_norm = False
        assert not torch.allclose(block(x), expected, atol=1e-3)
    out = expected.pow(2).mean(-1).sqrt()  # every position leaves a post-norm block with unit RMS
    torch.testing.assert_close(out, torch.ones_like(out), atol=1e-5, rtol=0)


def test_post_norm_keeps_the_weights_of_pre_norm():
    pre = TnnForMaskedLM(tiny_config())
    post = TnnForMaskedLM(tiny_config(norm_placement="post"))
    assert {k: v.shape for k, v in pre.state_dict().items()} == {k: v.shape for k, v in post.state_dict().items()}


def test_embedding_layer_norm_is_present_only_when_asked_and_applied():
    plain = TnnModel(tiny_config(causal=False))
    assert not any("embedding_norm" in name for name, _ in plain.named_parameters())
    model = TnnModel(tiny_config(causal=False, embedding_layer_norm=True)).eval()
    names = {name for name, _ in model.named_parameters()}
    assert {"embedding_norm.weight", "embedding_norm.bias"} <= names
    _randomise_norms(model)
    ids = torch.randint(1, 128, (1, 7))
    with torch.no_grad():
        first = model(ids, output_hidden_states=True).hidden_states[0]  # the input of the first block
        scaled = model.embeddings(ids) * math.sqrt(32)
        expected = F.layer_norm(scaled, (32,), model.embedding_norm.weight, model.embedding_norm.bias)
        torch.testing.assert_close(first, expected, atol=1e-6, rtol=1e-6)
        before = model(ids).last_hidden_state
        model.embedding_norm.bias.add_(1.0)  # the module is used: changing it changes the output
        after = model(ids).last_hidden_state
        assert not torch.allclose(after, before, atol=1e-3)
        torch.testing.assert_close(after, reference_backbone(model, ids), atol=1e-5, rtol=1e-5)


@pytest.mark.parametrize("scale", [True, False])
def test_scale_embeddings(scale):
    model = TnnModel(tiny_config(causal=False, scale_embeddings=scale)).eval()
    ids = torch.randint(1, 128, (1, 6))
    with torch.no_grad():
        first = model(ids, output_hidden_states=True).hidden_states[0]
    factor = math.sqrt(32) if scale else 1.0
    torch.testing.assert_close(first, model.embeddings.weight[ids] * factor, atol=0, rtol=0)
    assert model.embed_scale == factor


def test_final_norm_kinds():
    ids = torch.randint(1, 128, (2, 8))
    outputs = {}
    for kind in ("layernorm", "simplermsnorm", "none"):
        torch.manual_seed(0)
        model = TnnModel(tiny_config(causal=False, final_norm=kind)).eval()
        has_params = any(name.startswith("final_norm.") for name, _ in model.named_parameters())
        assert has_params == (kind == "layernorm")
        with torch.no_grad():
            out = model(ids, output_hidden_states=True)
        before = model.layers[-1](out.hidden_states[-2])  # the last block's output
        outputs[kind] = (out.last_hidden_state, before)
    last, before = outputs["none"]
    torch.testing.assert_close(last, before)  # no final norm
    last, before = outputs["simplermsnorm"]
    torch.testing.assert_close(last, srms(before), atol=1e-6, rtol=1e-6)
    rms = last.pow(2).mean(-1).sqrt()
    torch.testing.assert_close(rms, torch.ones_like(rms), atol=1e-5, rtol=0)
    last, before = outputs["layernorm"]
    torch.testing.assert_close(last, F.layer_norm(before, (32,)), atol=1e-5, rtol=1e-5)  # weight 1, bias 0 at init


def _head_logits(model: TnnForSequenceClassification, pooled: torch.Tensor) -> torch.Tensor:
    return model.score(torch.tanh(model.dense(pooled)))  # eval: dropout is the identity


@pytest.mark.parametrize("causal", [True, False])
@pytest.mark.parametrize("pooling", ["auto", "mean", "last"])
def test_classifier_pooling(pooling, causal):
    model = TnnForSequenceClassification(tiny_config(causal=causal, classifier_pooling=pooling, num_labels=3)).eval()
    ids = torch.randint(1, 128, (3, 10))
    mask = torch.ones_like(ids)
    mask[0, 6:] = 0  # right padding
    mask[1, :3] = 0  # left padding
    ids = ids * mask  # pad id 0
    with torch.no_grad():
        logits = model(ids, attention_mask=mask).logits
        hidden = model.model(ids, attention_mask=mask, use_cache=False).last_hidden_state
    mode = ("last" if causal else "mean") if pooling == "auto" else pooling
    pooled = []
    for row in range(3):
        real = [i for i in range(10) if mask[row, i]]
        if mode == "mean":
            pooled.append(sum(hidden[row, i] for i in real) / len(real))
        else:
            pooled.append(hidden[row, real[-1]])
    with torch.no_grad():
        expected = _head_logits(model, torch.stack(pooled))
    torch.testing.assert_close(logits, expected, atol=1e-5, rtol=1e-5)


def test_mean_pooling_changes_a_causal_classifier():
    torch.manual_seed(0)
    auto = TnnForSequenceClassification(tiny_config(causal=True, num_labels=2)).eval()
    mean = TnnForSequenceClassification(tiny_config(causal=True, num_labels=2, classifier_pooling="mean")).eval()
    mean.load_state_dict(auto.state_dict())
    ids = torch.randint(1, 128, (1, 9))
    with torch.no_grad():
        assert not torch.allclose(auto(ids).logits, mean(ids).logits, atol=1e-4)


# -- padding stays exact -------------------------------------------------------------------------------------------


@pytest.mark.parametrize("mixer", MIXERS)
@pytest.mark.parametrize("arch", ARCHITECTURES)
def test_a_padded_row_gets_what_it_gets_alone(arch, mixer):
    model = TnnForSequenceClassification(tiny_config(mixer, causal=False, num_labels=4,
                                                     **ARCHITECTURES[arch])).eval()
    _randomise_norms(model)
    rows = [torch.randint(1, 128, (n,)) for n in (12, 7, 3)]
    width = max(len(r) for r in rows)
    ids = torch.zeros(len(rows), width, dtype=torch.long)
    for i, r in enumerate(rows):
        ids[i, :len(r)] = r
    with torch.no_grad():
        batch = model(ids, output_hidden_states=True)  # the mask comes from pad_token_id
        for i, r in enumerate(rows):
            alone = model(r[None], output_hidden_states=True)
            torch.testing.assert_close(batch.logits[i], alone.logits[0], atol=1e-5, rtol=1e-5)
            torch.testing.assert_close(batch.hidden_states[-1][i, :len(r)], alone.hidden_states[-1][0],
                                       atol=1e-5, rtol=1e-5)


@pytest.mark.parametrize("mixer", CAUSAL_MIXERS)
@pytest.mark.parametrize("arch", ["blm", "mix"])
def test_a_left_padded_causal_row_gets_what_it_gets_alone(arch, mixer):
    model = TnnForCausalLM(tiny_config(mixer, **ARCHITECTURES[arch])).eval()
    _randomise_norms(model)
    rows = [torch.randint(1, 128, (n,)) for n in (9, 4)]
    ids = torch.zeros(2, 9, dtype=torch.long)
    mask = torch.zeros_like(ids)
    for i, r in enumerate(rows):
        ids[i, 9 - len(r):], mask[i, 9 - len(r):] = r, 1
    with torch.no_grad():
        batch = model(ids, attention_mask=mask, use_cache=False).logits
        for i, r in enumerate(rows):
            alone = model(r[None], use_cache=False).logits[0]
            torch.testing.assert_close(batch[i, 9 - len(r):], alone, atol=1e-5, rtol=1e-5)


# -- the generation cache of a post-norm causal model ---------------------------------------------------------------


@pytest.mark.parametrize("mode", ["auto", "exact", "etsc"])
@pytest.mark.parametrize("mixer,gamma", [("dense", 0.9), ("fd", 1.0)])
@pytest.mark.parametrize("arch", ["blm", "lra"])
def test_cached_decoding_of_the_paper_blocks_equals_the_no_cache_forward(arch, mixer, gamma, mode):
    torch.manual_seed(0)
    model = TnnForCausalLM(tiny_config(mixer, decay_gamma=gamma, etsc_length=16, fd_kernel_length=16,
                                       eos_token_id=None, **ARCHITECTURES[arch])).eval()
    _randomise_norms(model)
    ids = torch.randint(1, 128, (2, 14))
    mask = torch.ones_like(ids)
    mask[0, :3] = 0  # a left-padded row
    with torch.no_grad():
        full = model(input_ids=ids, attention_mask=mask, use_cache=False).logits
        out = model(input_ids=ids[:, :5], attention_mask=mask[:, :5], use_cache=True, generation_cache=mode)
        cache, logits = getattr(out, CACHE_FIELD), [out.logits]
        for i in range(5, ids.shape[1]):
            out = model(input_ids=ids[:, i:i + 1], attention_mask=mask[:, :i + 1], **{CACHE_FIELD: cache})
            logits.append(out.logits)
    torch.testing.assert_close(torch.cat(logits, dim=1), full, atol=1e-4, rtol=1e-4)


@pytest.mark.parametrize("mixer", CAUSAL_MIXERS)
def test_greedy_generate_of_a_post_norm_model_with_and_without_cache(mixer):
    model = TnnForCausalLM(tiny_config(mixer, eos_token_id=None, fd_kernel_length=16, **BLM)).eval()
    _randomise_norms(model)
    prompt = torch.randint(1, 128, (1, 5))
    kwargs = dict(max_new_tokens=10, do_sample=False, pad_token_id=0, return_dict_in_generate=True,
                  output_logits=True)
    cached = model.generate(prompt, **kwargs)
    full = model.generate(prompt, use_cache=False, **kwargs)
    assert torch.equal(cached.sequences, full.sequences)
    for a, b in zip(cached.logits, full.logits):
        torch.testing.assert_close(a, b, atol=1e-4, rtol=0)


# -- saving, reloading, and configs from before the options ------------------------------------------------------


@pytest.mark.parametrize("arch", ["blm", "lra"])
def test_save_and_reload_keep_the_options(arch, tmp_path):
    model = TnnForSequenceClassification(tiny_config(causal=False, num_labels=3, **ARCHITECTURES[arch])).eval()
    _randomise_norms(model)
    model.save_pretrained(tmp_path)
    saved = json.loads((tmp_path / "config.json").read_text())
    for field in NEW_FIELDS:
        assert saved[field] == getattr(model.config, field)
    ids = torch.randint(1, 128, (2, 9))
    for trust in (False, True):
        loaded = AutoModelForSequenceClassification.from_pretrained(tmp_path, trust_remote_code=trust).eval()
        assert {f: getattr(loaded.config, f) for f in NEW_FIELDS} == {f: getattr(model.config, f) for f in NEW_FIELDS}
        with torch.no_grad():
            torch.testing.assert_close(loaded(ids).logits, model(ids).logits, atol=0, rtol=0)


def test_an_old_config_without_the_fields_loads_with_todays_behaviour(tmp_path):
    model = TnnForCausalLM(tiny_config()).eval()
    model.save_pretrained(tmp_path)
    config_path = tmp_path / "config.json"
    saved = json.loads(config_path.read_text())
    old = {k: v for k, v in saved.items() if k not in NEW_FIELDS}  # a config.json written before the options
    config_path.write_text(json.dumps(old))
    loaded = TnnForCausalLM.from_pretrained(tmp_path).eval()
    assert (loaded.config.norm_placement, loaded.config.embedding_layer_norm, loaded.config.scale_embeddings,
            loaded.config.final_norm, loaded.config.classifier_pooling) == ("pre", False, True, "layernorm", "auto")
    assert set(loaded.state_dict()) == set(model.state_dict())
    assert "model.final_norm.weight" in loaded.state_dict()
    ids = torch.randint(1, 128, (1, 8))
    with torch.no_grad():
        logits = loaded(ids, use_cache=False).logits
        torch.testing.assert_close(logits, model(ids, use_cache=False).logits, atol=0, rtol=0)
        # and today's forward is the pre-norm reference: scaled embeddings, x + f(norm x), final LayerNorm
        expected = reference_backbone(loaded.model, ids) @ loaded.lm_head.weight.T
    torch.testing.assert_close(logits, expected, atol=1e-5, rtol=1e-5)


def test_default_config_dict_holds_the_default_options():
    values = TnnConfig().to_dict()
    assert {f: values[f] for f in NEW_FIELDS} == {"norm_placement": "pre", "embedding_layer_norm": False,
                                                  "scale_embeddings": True, "final_norm": "layernorm",
                                                  "classifier_pooling": "auto"}


REMOTE_SCRIPT = """
    from transformers import AutoConfig
    folder = {folder!r}
    try:
        AutoConfig.from_pretrained(folder, trust_remote_code=True, norm_placement="middle")
        raise SystemExit("accepted norm_placement='middle'")
    except ValueError as error:
        assert "TnnConfig.norm_placement must be one of ('pre', 'post')" in str(error), error
    model = transformers.AutoModelForSequenceClassification.from_pretrained(folder, trust_remote_code=True).eval()
    assert type(model).__module__.startswith("transformers_modules"), type(model).__module__
    assert model.config.norm_placement == "post" and model.config.final_norm == "none"
    with torch.no_grad():
        torch.save(model(torch.load({ids!r})).logits, {out!r})
"""


@pytest.mark.slow
def test_remote_code_builds_the_paper_architecture(tmp_path):
    model = TnnForSequenceClassification(tiny_config(causal=False, num_labels=2, **BLM)).eval()
    _randomise_norms(model)
    model.save_pretrained(tmp_path / "model")
    ids = torch.randint(1, 128, (2, 7))
    torch.save(ids, tmp_path / "ids.pt")
    run_with_package_blocked(REMOTE_SCRIPT.format(folder=str(tmp_path / "model"), ids=str(tmp_path / "ids.pt"),
                                                  out=str(tmp_path / "out.pt")), tmp_path)
    with torch.no_grad():
        torch.testing.assert_close(torch.load(tmp_path / "out.pt"), model(ids).logits, atol=0, rtol=0)
