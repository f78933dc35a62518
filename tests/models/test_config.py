"""TnnConfig validation, causal resolution, presets and the paper's parameter count."""

from __future__ import annotations

import copy
import pickle
import re
import subprocess
import sys
import traceback
import zipfile

import pytest

from modeling_tnn import (TnnConfig, TnnForCausalLM, TnnForMaskedLM, TnnForQuestionAnswering,
                          TnnForSequenceClassification, TnnForTokenClassification, TnnModel, list_presets, load_preset)

from tests.support import PROJECT_ROOT, tiny_config
from tests.remote_code import run_with_package_blocked


HEADS = [(TnnModel, True), (TnnForCausalLM, True), (TnnForMaskedLM, False), (TnnForSequenceClassification, False),
         (TnnForTokenClassification, False), (TnnForQuestionAnswering, False)]


@pytest.mark.parametrize("cls, expected", HEADS)
def test_causal_none_is_resolved_by_the_class_and_saved(cls, expected, tmp_path):
    config = tiny_config()
    assert config.causal is None
    model = cls(config)
    # The model holds its own resolved copy, shared by its backbone; the caller's config is left as it was.
    assert model.config.causal is expected and model.config is not config and config.causal is None
    assert getattr(model, "model", model).config is model.config
    model.save_pretrained(tmp_path)
    assert TnnConfig.from_pretrained(tmp_path).causal is expected


@pytest.mark.parametrize("cls, causal", [(TnnForMaskedLM, True), (TnnForCausalLM, False)])
def test_head_contradicting_causal_raises(cls, causal):
    with pytest.raises(ValueError, match="causal"):
        cls(tiny_config(causal=causal))


@pytest.mark.parametrize("causal", [True, False])
def test_classification_accepts_both_directions(causal):
    config = tiny_config(causal=causal)
    model = TnnForSequenceClassification(config)
    assert model.config is config and model.model.config is config and config.causal is causal


def test_one_config_builds_every_head_in_turn():
    # transformers' mixins build every head from one config: building one must not decide the direction of the next.
    config = tiny_config()
    before = config.to_dict()
    for cls, expected in HEADS:
        assert cls(config).config.causal is expected
    assert config.to_dict() == before


def test_a_model_s_resolved_config_keeps_its_direction():
    # The resolved copy is a config like any other: a head of the other direction built from it is refused, saying why.
    causal_lm = TnnForCausalLM(tiny_config())
    with pytest.raises(ValueError, match="causal=True contradicts TnnForMaskedLM.*causal=None to let the class"):
        TnnForMaskedLM(causal_lm.config)


def test_presets_and_overrides():
    assert {"wikitext103_lm", "roberta_blm", "lra_listops", "small", "tiny"} <= set(list_presets())
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
    assert (lm.norm_placement, lm.embedding_layer_norm, lm.scale_embeddings, lm.final_norm) == (
        "pre", False, True, "layernorm")
    blm = load_preset("roberta_blm")  # roberta_tnn_v2_decay_99
    assert (blm.num_hidden_layers, blm.hidden_size, blm.causal) == (12, 768, False)
    assert (blm.gtu_expand_ratio, blm.glu_expand_ratio, blm.rpe_dim, blm.rpe_layers, blm.decay_gamma) == (
        3, 1, 64, 6, 0.99)
    assert (blm.norm_placement, blm.embedding_layer_norm, blm.scale_embeddings, blm.final_norm,
            blm.classifier_pooling) == ("post", True, False, "none", "mean")
    listops = load_preset("lra_listops")  # tnn_lra_listops
    assert (listops.num_hidden_layers, listops.hidden_size, listops.vocab_size, listops.num_labels) == (6, 80, 20, 10)
    assert (listops.gtu_expand_ratio, listops.glu_expand_ratio, listops.rpe_dim, listops.rpe_layers,
            listops.decay_gamma, listops.causal) == (3, 1, 32, 1, 0.99, False)
    assert (listops.norm_placement, listops.embedding_layer_norm, listops.scale_embeddings, listops.final_norm,
            listops.classifier_pooling) == ("pre", False, False, "simplermsnorm", "mean")


@pytest.mark.parametrize("preset, cls, total", [
    ("wikitext103_lm", TnnForCausalLM, 48_666_624),  # the paper's 48.68M also counts 7 x 1,536 fixed decay values
    ("roberta_blm", TnnForMaskedLM, 126_372_441),
    ("lra_listops", TnnForSequenceClassification, 528_730),
    ("small", TnnForCausalLM, 2_101_632),
])
def test_preset_parameter_counts_match_their_descriptions(preset, cls, total):
    """Each preset builds the parameter count its _description field states."""
    import json
    import torch

    from modeling_tnn.preset_loading import _preset_dir

    with torch.device("meta"):
        model = cls(load_preset(preset))
    assert sum(p.numel() for p in model.parameters() if p.requires_grad) == total
    assert f"{total:,}" in json.loads((_preset_dir() / f"{preset}.json").read_text())["_description"]


@pytest.mark.slow
def test_presets_ship_in_the_wheel(tmp_path):
    subprocess.run([sys.executable, "-m", "pip", "wheel", "--no-deps", "--no-build-isolation", "-q", "-w",
                    str(tmp_path), str(PROJECT_ROOT)], check=True, capture_output=True)
    wheel = next(tmp_path.glob("*.whl"))
    names = zipfile.ZipFile(wheel).namelist()
    for preset in list_presets():
        assert f"modeling_tnn/presets/{preset}.json" in names


# -- validation on every path that builds or changes a config ---------------------------------------------------------
@pytest.fixture(scope="module")
def saved_lm(tmp_path_factory):
    folder = tmp_path_factory.mktemp("saved_lm")
    TnnForCausalLM(tiny_config()).save_pretrained(folder)
    return folder


# (field, bad value, message): every field with a rule beyond its type; the message names the field and what it allows.
# The values have the type of the saved value, so that update_from_string parses them as given.
BAD_FIELDS = [
    ("vocab_size", 0, r"TnnConfig.vocab_size must be a positive integer, got 0"),
    ("hidden_size", -5, r"TnnConfig.hidden_size must be a positive integer, got -5"),
    ("num_hidden_layers", 0, r"TnnConfig.num_hidden_layers must be a positive integer, got 0"),
    ("gtu_expand_ratio", 0, r"TnnConfig.gtu_expand_ratio must be a positive finite number, got 0"),
    ("glu_expand_ratio", -1, r"TnnConfig.glu_expand_ratio must be a positive finite number, got -1"),
    ("rpe_dim", 0, r"TnnConfig.rpe_dim must be a positive integer, got 0"),
    ("rpe_layers", -1, r"TnnConfig.rpe_layers must be a non-negative integer, got -1"),
    ("decay_gamma", 2.0, r"TnnConfig.decay_gamma must lie in \(0, 1\], got 2.0"),
    ("ski_rank", 1, r"TnnConfig.ski_rank must be an integer of at least 2 \(inducing points\), got 1"),
    ("ski_kernel_size", 4, r"TnnConfig.ski_kernel_size must be a positive odd integer \(a centred band\), got 4"),
    ("fd_kernel_length", 0, r"TnnConfig.fd_kernel_length must be a positive integer, got 0"),
    ("etsc_length", -3, r"TnnConfig.etsc_length must be a positive integer, got -3"),
    ("dropout", 1.0, r"TnnConfig.dropout must lie in \[0, 1\), got 1.0"),
    ("initializer_range", -1.0, r"TnnConfig.initializer_range must be a non-negative finite number, got -1.0"),
    ("generation_cache", "bogus", r"TnnConfig.generation_cache must be one of \(.*'etsc', 'exact'\), got 'bogus'"),
    ("token_mixer", "attention",
     r"TnnConfig.token_mixer must be one of \('dense', 'fd', 'ski'\), got 'attention'"),
    ("norm_placement", "middle", r"TnnConfig.norm_placement must be one of \('pre', 'post'\), got 'middle'"),
    ("final_norm", "rmsnorm",
     r"TnnConfig.final_norm must be one of \('layernorm', 'simplermsnorm', 'none'\), got 'rmsnorm'"),
    ("classifier_pooling", "cls",
     r"TnnConfig.classifier_pooling must be one of \('auto', 'mean', 'last'\), got 'cls'"),
]
# (field, value of the wrong type, what the message says is allowed): update_from_string cannot express these (it
# converts its text to the saved value's type), every other path can.
WRONG_TYPES = [
    ("dropout", True, "an int or a float"), ("hidden_size", 2.0, "an int"), ("causal", 1, "a bool or None"),
    ("embedding_layer_norm", "yes", "a bool"), ("scale_embeddings", 1, "a bool"),
    ("fft_recompute", "auto", "a bool or None"), ("norm_placement", None, r"one of \('pre', 'post'\)"),
    ("final_norm", ["none"], r"one of \('layernorm', 'simplermsnorm', 'none'\)"),
]


def _from_pretrained_model(folder, **kwargs):
    from transformers import AutoModelForCausalLM
    return AutoModelForCausalLM.from_pretrained(folder, **kwargs)


def _auto_config(folder, **kwargs):
    from transformers import AutoConfig
    return AutoConfig.from_pretrained(folder, **kwargs)


def _assign(folder, **kwargs):
    config = TnnConfig.from_pretrained(folder)
    for key, value in kwargs.items():
        setattr(config, key, value)


def _update(folder, **kwargs):
    TnnConfig.from_pretrained(folder).update(kwargs)


def _update_from_string(folder, **kwargs):
    TnnConfig.from_pretrained(folder).update_from_string(",".join(f"{k}={v}" for k, v in kwargs.items()))


PATHS = {
    "AutoModelForCausalLM.from_pretrained": _from_pretrained_model,
    "AutoConfig.from_pretrained": _auto_config,
    "TnnConfig.from_pretrained": lambda folder, **kwargs: TnnConfig.from_pretrained(folder, **kwargs),
    "TnnConfig.from_dict-kwargs": lambda folder, **kwargs: TnnConfig.from_dict(tiny_config().to_dict(), **kwargs),
    "TnnConfig.from_dict-dict": lambda folder, **kwargs: TnnConfig.from_dict({**tiny_config().to_dict(), **kwargs}),
    "TnnConfig": lambda folder, **kwargs: TnnConfig(**kwargs),
    "load_preset": lambda folder, **kwargs: load_preset("tiny", **kwargs),
    "setattr": _assign,
    "update": _update,
    "update_from_string": _update_from_string,
}


@pytest.mark.parametrize("path", PATHS)
@pytest.mark.parametrize("field, value, message", BAD_FIELDS, ids=[f"{f}={v}" for f, v, _ in BAD_FIELDS])
def test_every_config_path_validates(saved_lm, path, field, value, message):
    with pytest.raises(ValueError, match=message):
        PATHS[path](saved_lm, **{field: value})


@pytest.mark.parametrize("path", [path for path in PATHS if path != "update_from_string"])
@pytest.mark.parametrize("field, value, allowed", WRONG_TYPES, ids=[f"{f}={v!r}" for f, v, _ in WRONG_TYPES])
def test_every_config_path_refuses_a_wrong_type(saved_lm, path, field, value, allowed):
    with pytest.raises(ValueError, match=rf"TnnConfig.{field} must be {allowed}, got {re.escape(repr(value))}\."):
        PATHS[path](saved_lm, **{field: value})


@pytest.mark.parametrize("field, value", [("decay_gamma", float("nan")), ("gtu_expand_ratio", float("nan")),
                                          ("glu_expand_ratio", float("inf")), ("initializer_range", float("inf")),
                                          ("dropout", -0.1), ("gtu_expand_ratio", 0.001)])
def test_non_finite_and_too_small_numbers_are_refused(field, value):
    # gtu_expand_ratio=0.001 is positive, but 0.001 * hidden_size (512) rounds down to no channel at all.
    with pytest.raises(ValueError, match=f"TnnConfig.{field} must"):
        TnnConfig(**{field: value})
    config = TnnConfig()
    with pytest.raises(ValueError, match=f"TnnConfig.{field} must"):
        setattr(config, field, value)


CAUSAL_SKI_ROUTES = {
    "TnnConfig": lambda folder: TnnConfig(token_mixer="ski", causal=True),
    "from_pretrained-kwargs": lambda folder: TnnConfig.from_pretrained(folder, token_mixer="ski"),  # a causal save
    "from_dict-dict": lambda folder: TnnConfig.from_dict({**tiny_config().to_dict(), "token_mixer": "ski",
                                                          "causal": True}),
    "setattr": lambda folder: setattr(TnnConfig.from_pretrained(folder), "token_mixer", "ski"),
    "update": lambda folder: TnnConfig.from_pretrained(folder).update({"token_mixer": "ski"}),
    "update_from_string": lambda folder: TnnConfig.from_pretrained(folder).update_from_string("token_mixer=ski"),
    "TnnForCausalLM": lambda folder: TnnForCausalLM(tiny_config("ski")),
    "TnnModel": lambda folder: TnnModel(tiny_config("ski")),  # causal by default
    "AutoModelForCausalLM.from_pretrained": lambda folder: _from_pretrained_model(folder, token_mixer="ski"),
}


@pytest.mark.parametrize("route", CAUSAL_SKI_ROUTES)
def test_causal_ski_is_refused_in_one_place(saved_lm, route):
    """Every route to a causal SKI model ends in TnnConfig.validate_causal_token_mixer, with its advice."""
    with pytest.raises(ValueError, match="token_mixer='ski' is bidirectional only.*use token_mixer='fd' or 'dense'") \
            as refusal:
        CAUSAL_SKI_ROUTES[route](saved_lm)
    origin = refusal.value
    while origin.__cause__ is not None:
        origin = origin.__cause__
    assert traceback.extract_tb(origin.__traceback__)[-1].name == "validate_causal_token_mixer"


def test_a_head_refused_for_causal_ski_leaves_the_config_as_it_was():
    config = tiny_config("ski")
    with pytest.raises(ValueError, match="bidirectional only"):
        TnnForCausalLM(config)
    assert config.causal is None
    assert TnnForMaskedLM(config).config.causal is False


def test_a_refused_assignment_or_update_leaves_the_config_unchanged():
    config = tiny_config()
    before = config.to_dict()
    with pytest.raises(ValueError, match="dropout"):
        config.dropout = 1.0
    with pytest.raises(ValueError, match="decay_gamma"):
        config.update({"hidden_size": 64, "decay_gamma": 3.0})  # all or nothing: hidden_size is not kept either
    with pytest.raises(ValueError, match="ski_kernel_size"):
        config.update_from_string("rpe_dim=8,ski_kernel_size=4")
    assert config.to_dict() == before
    config.dropout = 0.25  # a good value is still accepted
    assert config.dropout == 0.25


def test_a_batch_is_validated_as_a_whole(saved_lm):
    # token_mixer="ski" alone would be a causal SKI model; with causal=False in the same batch it is valid.
    assert _auto_config(saved_lm, token_mixer="ski", causal=False).token_mixer == "ski"
    config = TnnConfig.from_pretrained(saved_lm)
    assert config.causal is True
    config.update({"token_mixer": "ski", "causal": False})
    assert (config.token_mixer, config.causal) == ("ski", False)
    config = TnnConfig.from_pretrained(saved_lm)
    with pytest.raises(ValueError, match="'fd' or 'dense'"):
        config.token_mixer = "ski"  # one assignment at a time: causal SKI is refused, with advice
    assert config.token_mixer == "dense"


def test_good_kwargs_and_transformers_own_assignments_still_work(saved_lm):
    from transformers import AutoModelForSequenceClassification

    model = _from_pretrained_model(saved_lm, decay_gamma=0.9, generation_cache="exact")
    assert (model.config.decay_gamma, model.config.generation_cache) == (0.9, "exact")
    model.resize_token_embeddings(200)  # transformers sets config.vocab_size
    assert model.config.vocab_size == 200
    classifier = AutoModelForSequenceClassification.from_pretrained(saved_lm, num_labels=3)
    assert classifier.config.num_labels == 3
    copied = copy.deepcopy(classifier.config)
    assert pickle.loads(pickle.dumps(copied)).to_dict() == classifier.config.to_dict()


REMOTE_VALIDATION = """
    from transformers import AutoConfig, AutoModelForCausalLM
    folder = {folder!r}
    for load, kwargs, fragment in [
            (AutoConfig.from_pretrained, dict(hidden_size=-5), "TnnConfig.hidden_size must be a positive integer"),
            (AutoModelForCausalLM.from_pretrained, dict(decay_gamma=2.0), "TnnConfig.decay_gamma must lie in"),
            (AutoModelForCausalLM.from_pretrained, dict(generation_cache="bogus"), "generation_cache must be one of")]:
        try:
            load(folder, trust_remote_code=True, **kwargs)
            raise SystemExit(f"accepted {{kwargs}}")
        except ValueError as error:
            assert fragment in str(error), error
    model = AutoModelForCausalLM.from_pretrained(folder, trust_remote_code=True)
    assert type(model).__module__.startswith("transformers_modules"), type(model).__module__
    try:
        model(torch.zeros(1, 0, dtype=torch.long))
        raise SystemExit("accepted an empty sequence")
    except ValueError as error:  # input_validation.py was copied beside the weights and runs as remote code
        assert "input_ids has no tokens" in str(error), error
    print("ok")
"""


@pytest.mark.slow
def test_remote_code_validates_configs_and_inputs(saved_lm, tmp_path):
    proc = run_with_package_blocked(REMOTE_VALIDATION.format(folder=str(saved_lm)), tmp_path)
    assert proc.stdout.strip().endswith("ok"), proc.stdout[-3000:]


@pytest.mark.parametrize("value", [None, True, False])
def test_fft_recompute_reaches_every_mixer(value):
    """config.fft_recompute sets what each mixer's FFT convolution keeps for backward (None: by size)."""
    for mixer in ("dense", "fd", "ski"):
        model = TnnModel(tiny_config(mixer, causal=False, fft_recompute=value))
        assert {layer.gtu.token_mixer.recompute_spectra for layer in model.layers} == {value}
