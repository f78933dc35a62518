"""Hub-ready folders: Auto classes, safetensors, tied weights, and remote code without the package installed."""

from __future__ import annotations

import json
import os
import subprocess
import sys
import textwrap

import pytest
import torch
from transformers import (AutoConfig, AutoModel, AutoModelForCausalLM, AutoModelForMaskedLM,
                          AutoModelForSequenceClassification)

from modeling_tnn import TnnForCausalLM, TnnForMaskedLM, TnnForSequenceClassification, TnnModel

from conftest import MIXERS, PROJECT_ROOT, tiny_config

AUTO_CLASSES = {
    "AutoModel": AutoModel,
    "AutoModelForCausalLM": AutoModelForCausalLM,
    "AutoModelForMaskedLM": AutoModelForMaskedLM,
    "AutoModelForSequenceClassification": AutoModelForSequenceClassification,
}
# (model class, causal, the Auto classes that fit its saved causal value, the one that contradicts it)
CASES = [
    (TnnForCausalLM, True, ["AutoModel", "AutoModelForCausalLM", "AutoModelForSequenceClassification"],
     "AutoModelForMaskedLM"),
    (TnnForMaskedLM, False, ["AutoModel", "AutoModelForMaskedLM", "AutoModelForSequenceClassification"],
     "AutoModelForCausalLM"),
]


def _main_output(out):
    return out.logits if hasattr(out, "logits") else out.last_hidden_state


def _mixer_config(mixer, causal):
    if causal and mixer == "ski":
        pytest.skip("SKI is bidirectional only")
    return tiny_config(mixer, causal=causal, num_labels=2)


@pytest.mark.parametrize("mixer", MIXERS)
@pytest.mark.parametrize("cls, causal, fitting, contradicting", CASES)
def test_save_load_through_every_auto_class(tmp_path, cls, causal, fitting, contradicting, mixer):
    model = cls(_mixer_config(mixer, causal)).eval()
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
            torch.testing.assert_close(_main_output(out), _main_output(reference), atol=0, rtol=0)
        elif isinstance(loaded, TnnModel):
            torch.testing.assert_close(out.last_hidden_state, backbone, atol=0, rtol=0)
        else:  # a new classification head on the saved backbone
            assert isinstance(loaded, TnnForSequenceClassification) and torch.isfinite(out.logits).all()
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


REMOTE_SCRIPT = textwrap.dedent("""
    import importlib.abc, sys
    class BlockTnn(importlib.abc.MetaPathFinder):
        def find_spec(self, name, path=None, target=None):
            if name == "modeling_tnn" or name.startswith("modeling_tnn."):
                raise ImportError("modeling_tnn is blocked in this test")
    sys.meta_path.insert(0, BlockTnn())
    sys.path = [p for p in sys.path if p not in ("", {root!r})]
    import torch, transformers
    try:
        import modeling_tnn
        raise SystemExit("modeling_tnn should not be importable here")
    except ImportError:
        pass
    ids = torch.load({ids!r})
    out = {{}}
    for name in {classes!r}:
        model = getattr(transformers, name).from_pretrained({folder!r}, trust_remote_code=True).eval()
        assert type(model).__module__.startswith("transformers_modules"), type(model).__module__
        with torch.no_grad():
            res = model(input_ids=ids)
        out[name] = res.logits if hasattr(res, "logits") else res.last_hidden_state
    torch.save(out, {result!r})
""")


@pytest.mark.parametrize("mixer", MIXERS)
@pytest.mark.parametrize("cls, causal, fitting, contradicting", CASES)
def test_remote_code_without_the_package(tmp_path, cls, causal, fitting, contradicting, mixer):
    model = cls(_mixer_config(mixer, causal)).eval()
    folder = tmp_path / "model"
    model.save_pretrained(folder)
    ids = torch.randint(1, 128, (2, 11))
    torch.save(ids, tmp_path / "ids.pt")
    classes = [name for name in fitting if name != "AutoModelForSequenceClassification"]
    script = REMOTE_SCRIPT.format(root=str(PROJECT_ROOT), ids=str(tmp_path / "ids.pt"), classes=classes,
                                  folder=str(folder), result=str(tmp_path / "out.pt"))
    env = {**os.environ, "HF_HUB_OFFLINE": "1", "HF_MODULES_CACHE": str(tmp_path / "modules"),
           "PYTHONPATH": ""}
    proc = subprocess.run([sys.executable, "-c", script], cwd=tmp_path, env=env, capture_output=True, text=True)
    assert proc.returncode == 0, proc.stderr[-3000:]
    out = torch.load(tmp_path / "out.pt")
    with torch.no_grad():
        torch.testing.assert_close(out[classes[1]], _main_output(model(input_ids=ids)), atol=0, rtol=0)
        torch.testing.assert_close(out["AutoModel"], model.model(input_ids=ids).last_hidden_state, atol=0, rtol=0)
