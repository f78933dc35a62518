"""TnnConfig validation, causal resolution, presets and the paper's parameter count."""

from __future__ import annotations

import subprocess
import sys
import zipfile

import pytest

from modeling_tnn import (TnnConfig, TnnForCausalLM, TnnForMaskedLM, TnnForSequenceClassification, TnnModel,
                          list_presets, load_preset)

from conftest import PROJECT_ROOT, tiny_config


@pytest.mark.parametrize(
    "field, value",
    [
        ("token_mixer", "attention"),
        ("decay_gamma", 0.0),
        ("decay_gamma", 1.5),
        ("hidden_size", 0),
        ("num_hidden_layers", -1),
        ("vocab_size", 0),
        ("rpe_dim", 0),
        ("fd_kernel_length", 0),
        ("etsc_length", 0),
        ("ski_kernel_size", 16),
        ("ski_rank", 1),
        ("dropout", 1.0),
        ("generation_cache", "kv"),
        ("gtu_expand_ratio", 0),
    ],
)
def test_bad_values_raise_naming_the_field(field, value):
    with pytest.raises(ValueError, match=field):
        TnnConfig(**{field: value})


def test_token_mixer_error_lists_allowed_values():
    with pytest.raises(ValueError, match="dense.*fd.*ski"):
        TnnConfig(token_mixer="attention")


@pytest.mark.parametrize("cls, expected", [(TnnModel, True), (TnnForCausalLM, True), (TnnForMaskedLM, False),
                                           (TnnForSequenceClassification, False)])
def test_causal_none_is_resolved_by_the_class_and_saved(cls, expected, tmp_path):
    config = tiny_config()
    assert config.causal is None
    model = cls(config)
    assert model.config.causal is expected
    assert config.causal is None  # the caller's config is not mutated
    model.save_pretrained(tmp_path)
    assert TnnConfig.from_pretrained(tmp_path).causal is expected


@pytest.mark.parametrize("cls, causal", [(TnnForMaskedLM, True), (TnnForCausalLM, False)])
def test_head_contradicting_causal_raises(cls, causal):
    with pytest.raises(ValueError, match="causal"):
        cls(tiny_config(causal=causal))


@pytest.mark.parametrize("causal", [True, False])
def test_classification_accepts_both_directions(causal):
    assert TnnForSequenceClassification(tiny_config(causal=causal)).config.causal is causal


def test_causal_ski_is_refused_with_advice():
    with pytest.raises(ValueError, match="token_mixer.*fd.*dense"):
        TnnConfig(token_mixer="ski", causal=True)
    with pytest.raises(ValueError, match="'fd' or 'dense'"):
        TnnForCausalLM(tiny_config(token_mixer="ski"))


def test_presets_and_overrides():
    assert {"wikitext103_lm", "roberta_blm", "small", "tiny"} <= set(list_presets())
    config = load_preset("small", hidden_size=64)
    assert config.hidden_size == 64 and config.num_hidden_layers == 4
    with pytest.raises(ValueError, match="Unknown TNN preset 'nope'"):
        load_preset("nope")
    with pytest.raises(ValueError, match="not_a_field"):
        load_preset("tiny", not_a_field=1)
    # Standard transformers config kwargs are accepted too.
    labelled = load_preset("tiny", num_labels=3, finetuning_task="sst2", problem_type="single_label_classification")
    assert (labelled.num_labels, labelled.finetuning_task) == (3, "sst2")


def test_paper_presets():
    lm = load_preset("wikitext103_lm")
    assert (lm.num_hidden_layers, lm.hidden_size, lm.gtu_expand_ratio, lm.glu_expand_ratio) == (7, 512, 3, 1)
    assert (lm.rpe_dim, lm.rpe_layers, lm.decay_gamma, lm.causal) == (64, 6, 0.99, True)
    blm = load_preset("roberta_blm")
    assert (blm.num_hidden_layers, blm.hidden_size, blm.causal) == (12, 768, False)


def test_wikitext103_lm_parameter_count():
    # DESIGN.md: 48,666,624 trainable parameters (the paper's 48.68M also counts 7 x 1,536 fixed decay values).
    model = TnnForCausalLM(load_preset("wikitext103_lm", vocab_size=50264))
    assert sum(p.numel() for p in model.parameters() if p.requires_grad) == 48_666_624


def test_presets_ship_in_the_wheel(tmp_path):
    subprocess.run([sys.executable, "-m", "pip", "wheel", "--no-deps", "--no-build-isolation", "-q", "-w",
                    str(tmp_path), str(PROJECT_ROOT)], check=True, capture_output=True)
    wheel = next(tmp_path.glob("*.whl"))
    names = zipfile.ZipFile(wheel).namelist()
    for preset in list_presets():
        assert f"modeling_tnn/presets/{preset}.json" in names
