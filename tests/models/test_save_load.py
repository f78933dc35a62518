"""Hub-ready folders: Auto classes, safetensors, tied weights, and remote code without the package installed."""

from __future__ import annotations

import json
from pathlib import Path

import pytest
import torch
from transformers import (AutoConfig, AutoModel, AutoModelForCausalLM, AutoModelForMaskedLM,
                          AutoModelForQuestionAnswering, AutoModelForSequenceClassification,
                          AutoModelForTokenClassification)

from modeling_tnn import (TnnForCausalLM, TnnForMaskedLM, TnnForQuestionAnswering, TnnForSequenceClassification,
                          TnnForTokenClassification, TnnModel)

from tests.remote_code import run_with_package_blocked
from tests.support import PROJECT_ROOT, main_output, tiny_config, with_mixers

AUTO_CLASSES = {
    "AutoModel": AutoModel,
    "AutoModelForCausalLM": AutoModelForCausalLM,
    "AutoModelForMaskedLM": AutoModelForMaskedLM,
    "AutoModelForSequenceClassification": AutoModelForSequenceClassification,
    "AutoModelForTokenClassification": AutoModelForTokenClassification,
    "AutoModelForQuestionAnswering": AutoModelForQuestionAnswering,
}
# Auto classes that put a new task head on any saved backbone, causal or not (not loaded as remote code here:
# tests/models/test_task_heads.py loads the per-token ones that way).
NEW_HEADS = {"AutoModelForSequenceClassification": TnnForSequenceClassification,
             "AutoModelForTokenClassification": TnnForTokenClassification,
             "AutoModelForQuestionAnswering": TnnForQuestionAnswering}
# (model class, causal, the Auto classes that fit its saved causal value, the one that contradicts it)
CASES = [
    (TnnForCausalLM, True, ["AutoModel", "AutoModelForCausalLM", *NEW_HEADS], "AutoModelForMaskedLM"),
    (TnnForMaskedLM, False, ["AutoModel", "AutoModelForMaskedLM", *NEW_HEADS], "AutoModelForCausalLM"),
]


# Every case once per token mixer that supports its direction (SKI is bidirectional only).
CASES_BY_MIXER = with_mixers(CASES, causal_at=1)


@pytest.mark.parametrize("cls, causal, fitting, contradicting, mixer", CASES_BY_MIXER)
def test_save_load_through_every_auto_class(tmp_path, cls, causal, fitting, contradicting, mixer):
    model = cls(tiny_config(mixer, causal=causal, num_labels=2)).eval()
    model.save_pretrained(tmp_path)
    saved = json.loads((tmp_path / "config.json").read_text())
    assert set(saved["auto_map"]) == {"AutoConfig", *AUTO_CLASSES}
    assert (tmp_path / "model.safetensors").is_file()
    assert {"modeling_tnn.py", "configuration_tnn.py"} <= {p.name for p in tmp_path.glob("*.py")}
    assert isinstance(AutoConfig.from_pretrained(tmp_path), type(model.config))

    ids = torch.randint(1, 128, (2, 19))
    with torch.no_grad():
        reference = model(input_ids=ids)
        backbone = model.model(input_ids=ids).last_hidden_state
    for name in fitting:
        loaded = AUTO_CLASSES[name].from_pretrained(tmp_path).eval()
        with torch.no_grad():
            out = loaded(input_ids=ids)
        if isinstance(loaded, cls):
            torch.testing.assert_close(main_output(out), main_output(reference), atol=0, rtol=0)
        elif isinstance(loaded, TnnModel):
            torch.testing.assert_close(out.last_hidden_state, backbone, atol=0, rtol=0)
        else:  # a new task head on the saved backbone
            assert isinstance(loaded, NEW_HEADS[name]) and torch.isfinite(main_output(out)).all()
            torch.testing.assert_close(loaded.model(input_ids=ids).last_hidden_state, backbone, atol=0, rtol=0)
    with pytest.raises(ValueError, match="causal"):
        AUTO_CLASSES[contradicting].from_pretrained(tmp_path)


@pytest.mark.parametrize("cls", [TnnForCausalLM, TnnForMaskedLM])
def test_tied_weights_stay_tied(tmp_path, cls):
    model = cls(tiny_config())
    assert model.get_output_embeddings().weight is model.get_input_embeddings().weight
    model.save_pretrained(tmp_path)
    loaded = cls.from_pretrained(tmp_path)
    assert loaded.get_output_embeddings().weight is loaded.get_input_embeddings().weight
    torch.testing.assert_close(loaded.get_input_embeddings().weight, model.get_input_embeddings().weight)


REMOTE_SCRIPT = """
    import json
    ids = torch.load({ids!r})
    out = {{}}
    for folder, classes in json.loads({jobs!r}).items():
        for name in classes:
            model = load_remote(name, folder)
            with torch.no_grad():
                out[folder + "|" + name] = main_output(model(input_ids=ids))
            if name == "AutoModelForCausalLM":  # generate with the ETSC cache from the remote code
                out[folder + "|generate"] = model.generate(ids, max_new_tokens=6, do_sample=False, pad_token_id=0)
    torch.save(out, {result!r})
"""


@pytest.fixture(scope="module")
def remote_code_run(tmp_path_factory):
    """Save every case, then load them all as remote code in ONE subprocess where modeling_tnn is blocked."""
    root = tmp_path_factory.mktemp("remote")
    ids = torch.randint(1, 128, (2, 11))
    torch.save(ids, root / "ids.pt")
    models, jobs = {}, {}
    for i, (cls, causal, fitting, _, mixer) in enumerate(CASES_BY_MIXER):
        folder = str(root / f"model{i}")
        model = cls(tiny_config(mixer, causal=causal, num_labels=2)).eval()
        model.save_pretrained(folder)
        models[(cls, mixer)] = (folder, model)
        jobs[folder] = [name for name in fitting if name not in NEW_HEADS]
    run_with_package_blocked(REMOTE_SCRIPT.format(ids=str(root / "ids.pt"), jobs=json.dumps(jobs),
                                                  result=str(root / "out.pt")), root)
    return ids, models, jobs, torch.load(root / "out.pt")


@pytest.mark.slow
@pytest.mark.parametrize("cls, causal, fitting, contradicting, mixer", CASES_BY_MIXER)
def test_remote_code_without_the_package(remote_code_run, cls, causal, fitting, contradicting, mixer):
    ids, models, jobs, out = remote_code_run
    folder, model = models[(cls, mixer)]
    head_name = cls.__name__.replace("Tnn", "AutoModel")  # TnnForCausalLM -> AutoModelForCausalLM
    assert jobs[folder] == ["AutoModel", head_name]
    with torch.no_grad():
        torch.testing.assert_close(out[f"{folder}|{head_name}"], main_output(model(input_ids=ids)), atol=0, rtol=0)
        torch.testing.assert_close(out[f"{folder}|AutoModel"], model.model(input_ids=ids).last_hidden_state,
                                   atol=0, rtol=0)
    if cls is TnnForCausalLM:
        no_cache = model.generate(ids, max_new_tokens=6, do_sample=False, pad_token_id=0, use_cache=False)
        assert torch.equal(out[f"{folder}|generate"], no_cache)


def test_a_saved_folder_holds_the_model_code_alone(tmp_path):
    """The training and publishing machinery (modeling_tnn.recipes) stays out of what save_pretrained copies (and
    so out of the Hub): the saved .py files are the import closure of the model and config modules, none of which
    imports the recipes."""
    from transformers.dynamic_module_utils import get_relative_import_files

    package = PROJECT_ROOT / "modeling_tnn"
    TnnForCausalLM(tiny_config("dense")).save_pretrained(tmp_path)
    saved = {p.name for p in tmp_path.glob("*.py")}
    closure = {Path(f).name for root in ("modeling_tnn.py", "configuration_tnn.py")
               for f in [package / root, *get_relative_import_files(str(package / root))]}
    assert saved == closure
    recipes = {p.name for p in (package / "recipes").rglob("*.py")}
    assert not saved & recipes and "corpus.py" not in saved and "preset_loading.py" not in saved
    for name in saved:
        assert "recipes" not in (package / name).read_text(), f"{name} mentions the recipes"
