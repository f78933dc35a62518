"""The decoding plan saved beside the weights (decoding_plan.safetensors): a loaded model's first cached forward fits
nothing and decodes as the no-cache forward; changed weights (one kernel entry, a dtype) refit exactly the layers
they touch; a plan file that is unreadable, corrupted, misses a layer, has wrong shapes or comes from another
configuration is reported in a warning and refit; and the file stays on the safetensors side of loading."""

from __future__ import annotations

import json
import pickle
import warnings
from pathlib import Path
from types import SimpleNamespace

import pytest
import torch
from safetensors import safe_open
from safetensors.torch import load_file, save_file

from modeling_tnn import TnnForCausalLM, TnnModel
from modeling_tnn import fit_plans
from modeling_tnn.decoding_cache import TnnCache
from modeling_tnn.fit_plan_file import PLAN_FILE, PLAN_FORMAT, weights_fingerprint
from modeling_tnn.modeling_tnn import CACHE_FIELD

from tests.remote_code import run_with_package_blocked
from tests.support import tiny_config

PROMPT, STEPS = 24, 6


@pytest.fixture
def fits(monkeypatch):
    """Every compact fit the planner runs, as the mixer it ran on."""
    calls = []
    fit = fit_plans.compact_tail

    def counted(mixer, tolerance, device):
        calls.append(mixer)
        return fit(mixer, tolerance, device)
    monkeypatch.setattr(fit_plans, "compact_tail", counted)
    return calls


def _model(seed=0, **overrides):
    torch.manual_seed(seed)
    return TnnForCausalLM(tiny_config("dense", causal=True, **overrides)).eval()


@pytest.fixture(scope="module")
def saved(tmp_path_factory):
    """A tiny causal dense model, its plan fitted ahead of time and saved beside its weights."""
    folder = tmp_path_factory.mktemp("saved")
    model = _model()
    model.fit_decoding_plan()
    model.save_pretrained(folder)
    return folder


def _load(folder, **kwargs):
    with warnings.catch_warnings():
        warnings.simplefilter("error")  # a good plan loads without a warning
        return TnnForCausalLM.from_pretrained(folder, **kwargs).eval()


def _decode_against_no_cache(model, ids=None):
    """Prefill PROMPT tokens, then STEPS single-token steps; returns the cache's rows after checking every logit
    against the no-cache forward of the whole sequence."""
    generator = torch.Generator().manual_seed(1)
    ids = torch.randint(1, model.config.vocab_size, (2, PROMPT + STEPS), generator=generator) if ids is None else ids
    with torch.no_grad():
        reference = model(ids, use_cache=False).logits
        out = model(ids[:, :PROMPT], use_cache=True)
        cache, logits = getattr(out, CACHE_FIELD), [out.logits]
        for i in range(PROMPT, PROMPT + STEPS):
            out = model(ids[:, i:i + 1], **{CACHE_FIELD: cache}, use_cache=True)
            logits.append(out.logits)
    torch.testing.assert_close(torch.cat(logits, 1), reference, atol=1e-4, rtol=1e-4)
    return cache.describe()


def _sources(rows):
    return [row["plan_source"] for row in rows]


def test_saved_plan_loads_and_the_first_cached_forward_fits_nothing(saved, fits):
    assert (saved / PLAN_FILE).is_file()
    model = _load(saved)
    rows = _decode_against_no_cache(model)
    assert fits == []
    assert _sources(rows) == ["checkpoint"] * model.config.num_hidden_layers
    assert [row["plan"] for row in rows] == ["compact"] * model.config.num_hidden_layers


def test_the_backbone_alone_loads_the_plan_of_a_causal_lm_folder(saved, fits):
    """Plans are named in the base model, so AutoModel (TnnModel) of a causal LM's folder reads them too."""
    with warnings.catch_warnings():
        warnings.simplefilter("error")
        backbone = TnnModel.from_pretrained(saved).eval()
    with torch.no_grad():
        out = backbone(torch.ones(1, 6, dtype=torch.long), use_cache=True)
    assert _sources(getattr(out, CACHE_FIELD).describe()) == ["checkpoint", "checkpoint"] and fits == []


def test_generate_from_the_saved_folder_fits_nothing(saved, fits):
    model = _load(saved)
    ids = torch.randint(1, model.config.vocab_size, (1, 12))
    with torch.no_grad():
        cached = model.generate(ids, max_new_tokens=8, do_sample=False, pad_token_id=0)
        uncached = model.generate(ids, max_new_tokens=8, do_sample=False, pad_token_id=0, use_cache=False)
    assert fits == [] and torch.equal(cached, uncached)


def test_push_to_hub_uploads_the_plan_too(saved, tmp_path, monkeypatch):
    """transformers uploads inside save_pretrained, before a file written after it: save_pretrained(push_to_hub=True)
    uploads through push_to_hub instead, whose folder holds the plan (the Hub client patched: nothing leaves)."""
    import transformers.utils.hub as hub

    model = _load(saved)
    uploads = []
    monkeypatch.setattr(hub, "hf_api", lambda: SimpleNamespace(create_repo=lambda repo_id, **_: SimpleNamespace(
        repo_id=repo_id)))
    monkeypatch.setattr(hub, "create_and_tag_model_card", lambda *a, **k: SimpleNamespace(save=lambda path: None))
    monkeypatch.setattr(type(model), "_upload_modified_files", lambda self, folder, repo_id, **kwargs: uploads.append(
        (repo_id, kwargs["commit_message"], sorted(p.name for p in Path(folder).iterdir()))))
    model.save_pretrained(tmp_path, push_to_hub=True, repo_id="org/tiny", commit_message="with its plan")
    assert (tmp_path / PLAN_FILE).is_file()
    assert len(uploads) == 1 and uploads[0][:2] == ("org/tiny", "with its plan")
    assert {PLAN_FILE, "model.safetensors", "config.json"} <= set(uploads[0][2])


def test_a_changed_kernel_weight_refits_that_layer_only(saved, fits):
    model = _load(saved)
    mixer = model.model.layers[1].gtu.token_mixer
    probe = torch.randint(1, model.config.vocab_size, (1, 16))
    with torch.no_grad():
        before = model(probe, use_cache=False).logits
        mixer.rpe.out_proj.bias[0] += 0.25  # an edit after loading, as a finetuning step makes
        assert not torch.allclose(model(probe, use_cache=False).logits, before)  # the kernel really changed
    rows = _decode_against_no_cache(model)
    assert fits == [mixer]
    assert _sources(rows) == ["checkpoint", "refitted"]


def test_a_dtype_change_refits_every_layer(saved, fits):
    model = _load(saved).to(torch.float64)
    rows = _decode_against_no_cache(model)
    assert _sources(rows) == ["refitted", "refitted"] and len(fits) == 2


def test_a_lora_merge_refits_the_layers_it_changes(saved, fits):
    peft = pytest.importorskip("peft", reason="peft is a dev dependency: pip install -e '.[dev]'")
    model = _load(saved)
    lora = peft.get_peft_model(model, peft.LoraConfig(target_modules=["pos_proj"], r=2, init_lora_weights=False))
    merged = lora.merge_and_unload().eval()
    rows = _decode_against_no_cache(merged)
    assert _sources(rows) == ["refitted", "refitted"] and len(fits) == 2


def test_a_folder_without_a_plan_fits_lazily_as_before(tmp_path, fits):
    _model().save_pretrained(tmp_path)  # never fitted: nothing to write
    assert not (tmp_path / PLAN_FILE).exists()
    rows = _decode_against_no_cache(_load(tmp_path))
    assert _sources(rows) == ["fitted", "fitted"] and len(fits) == 2


def test_plan_source_is_none_where_no_tail_is_read(saved):
    model = _load(saved)
    with torch.no_grad():
        out = model(torch.ones(1, 4, dtype=torch.long), use_cache=True, generation_cache="exact")
    assert _sources(getattr(out, CACHE_FIELD).describe()) == [None, None]


def test_saving_a_loaded_model_keeps_its_plan_and_drops_a_stale_one(saved, tmp_path, fits):
    model = _load(saved)
    model.save_pretrained(tmp_path / "again")  # the shipped plan still matches: written again, nothing fitted
    assert fits == []
    assert load_file(tmp_path / "again" / PLAN_FILE) .keys() == load_file(saved / PLAN_FILE).keys()
    with torch.no_grad():
        model.model.layers[0].gtu.token_mixer.rpe.pos_proj.bias.add_(0.1)
    model.save_pretrained(tmp_path / "again")  # layer 0's plan belongs to other weights now: left out
    with safe_open(tmp_path / "again" / PLAN_FILE, "pt") as handle:
        assert list(json.loads(handle.metadata()["layers"])) == ["layers.1.gtu.token_mixer"]
    with torch.no_grad():
        model.model.layers[1].gtu.token_mixer.rpe.pos_proj.bias.add_(0.1)
    model.save_pretrained(tmp_path / "again")  # no layer left: no file (not a stale one)
    assert not (tmp_path / "again" / PLAN_FILE).exists()


def test_a_plan_of_other_weights_of_the_same_configuration_is_refit(saved, tmp_path, fits):
    other = _model(seed=1)
    other.save_pretrained(tmp_path)
    (tmp_path / PLAN_FILE).write_bytes((saved / PLAN_FILE).read_bytes())
    rows = _decode_against_no_cache(_load(tmp_path))
    assert _sources(rows) == ["refitted", "refitted"] and len(fits) == 2


def test_fit_decoding_plan_sets_the_tolerance_it_fits_and_checks_it():
    model = _model()
    tails = model.fit_decoding_plan(tolerance=1e-4)
    assert model.config.compact_tolerance == 1e-4
    assert list(tails) == ["layers.0.gtu.token_mixer", "layers.1.gtu.token_mixer"]
    assert all(tail.tolerance == 1e-4 for tail in tails.values())
    with pytest.raises(ValueError, match="tolerance must lie in"):
        model.fit_decoding_plan(tolerance=2.0)


# -- bad plan files: a warning naming the layers and why, and those layers fit ----------------------------------


def _rewrite(folder, edit):
    """Rewrite the folder's plan file through ``edit(tensors, layers)`` (the metadata's per-layer entries)."""
    path = folder / PLAN_FILE
    with safe_open(path, "pt") as handle:
        layers = json.loads(handle.metadata()["layers"])
    tensors = load_file(path)
    edit(tensors, layers)
    save_file(tensors, path, metadata={"format": PLAN_FORMAT, "layers": json.dumps(layers)})


def _copy(saved, tmp_path):
    for file in saved.iterdir():
        (tmp_path / file.name).write_bytes(file.read_bytes())
    return tmp_path


def _drop_layer(tensors, layers):
    del layers["layers.0.gtu.token_mixer"]


def _wrong_shapes(tensors, layers):
    for part in ("poles", "residues"):
        tensors[f"layers.0.gtu.token_mixer.{part}"] = tensors[f"layers.0.gtu.token_mixer.{part}"][:-1].contiguous()


def _corrupt(tensors, layers):
    tensors["layers.0.gtu.token_mixer.residues"][0, 0, 0] += 1.0  # the digest in the metadata no longer matches


def _unstable(tensors, layers):
    tensors["layers.0.gtu.token_mixer.poles"][0, 0] = torch.tensor([1.5, 0.0])


@pytest.mark.parametrize("edit, message", [
    (_drop_layer, "layers.0.gtu.token_mixer: missing from the file"),
    (_wrong_shapes, "layers.0.gtu.token_mixer: wrong shapes"),
    (_corrupt, "layers.0.gtu.token_mixer: its numbers do not match their digest"),
])
def test_a_bad_layer_is_reported_and_refit_the_others_ship(saved, tmp_path, fits, edit, message):
    folder = _copy(saved, tmp_path)
    _rewrite(folder, edit)
    with pytest.warns(UserWarning, match="used for 1 of 2 layers") as record:
        model = TnnForCausalLM.from_pretrained(folder).eval()
    assert message in str(record[0].message)
    rows = _decode_against_no_cache(model)
    assert _sources(rows) == ["fitted", "checkpoint"] and len(fits) == 1


def test_an_unstable_pole_is_refused_even_with_a_matching_digest(saved, tmp_path, fits):
    folder = _copy(saved, tmp_path)

    def unstable_and_redigested(tensors, layers):
        from modeling_tnn.fit_plan_file import _digest
        _unstable(tensors, layers)
        entry, name = layers["layers.0.gtu.token_mixer"], "layers.0.gtu.token_mixer"
        entry["digest"] = _digest(entry["window"], entry["tolerance"],
                                  [tensors[f"{name}.{part}"] for part in ("poles", "residues", "bound")])
    _rewrite(folder, unstable_and_redigested)
    with pytest.warns(UserWarning, match="outside the unit circle"):
        model = TnnForCausalLM.from_pretrained(folder).eval()
    assert _sources(_decode_against_no_cache(model)) == ["fitted", "checkpoint"]


def test_a_plan_from_another_configuration_is_reported_and_refit(saved, tmp_path, fits):
    wider = _model(hidden_size=48)
    wider.fit_decoding_plan()
    wider.save_pretrained(tmp_path / "wider")
    (tmp_path / "narrow").mkdir()
    folder = _copy(saved, tmp_path / "narrow")
    (folder / PLAN_FILE).write_bytes((tmp_path / "wider" / PLAN_FILE).read_bytes())
    fits.clear()
    with pytest.warns(UserWarning, match="fitted for another configuration") as record:
        model = TnnForCausalLM.from_pretrained(folder).eval()
    assert "used for 0 of 2 layers" in str(record[0].message)
    assert _sources(_decode_against_no_cache(model)) == ["fitted", "fitted"] and len(fits) == 2


def test_an_unreadable_file_is_reported_and_never_executed(saved, tmp_path, fits):
    """A pickle renamed to the plan's name: safetensors refuses it, so its payload never runs."""
    folder = _copy(saved, tmp_path)
    marker = tmp_path / "executed"
    (folder / PLAN_FILE).write_bytes(pickle.dumps(_Payload(str(marker))))
    with pytest.warns(UserWarning, match="every layer: not a readable decoding plan"):
        model = TnnForCausalLM.from_pretrained(folder).eval()
    assert not marker.exists()
    assert _sources(_decode_against_no_cache(model)) == ["fitted", "fitted"]


class _Payload:
    def __init__(self, path):
        self.path = path

    def __reduce__(self):
        return (open, (self.path, "w"))


def test_the_plan_ships_in_the_remote_code_folder_and_loads_there(saved, tmp_path):
    """The saved folder loads as remote code (modeling_tnn not importable) and decodes from the shipped plan."""
    proc = run_with_package_blocked(f"""
        model = load_remote("AutoModelForCausalLM", {str(saved)!r})
        with torch.no_grad():
            out = model(torch.ones(1, 8, dtype=torch.long), use_cache=True)
        print([row["plan_source"] for row in getattr(out, {CACHE_FIELD!r}).describe()])
    """, tmp_path)
    assert proc.stdout.strip().splitlines()[-1] == "['checkpoint', 'checkpoint']"


def test_the_fingerprint_follows_every_tail_weight_and_the_dtype():
    model = _model()
    mixer = model.model.layers[0].gtu.token_mixer
    first = weights_fingerprint(mixer)
    assert weights_fingerprint(mixer) == first and len(first) == 64
    for parameter in mixer.rpe.parameters():
        with torch.no_grad():
            parameter.view(-1)[-1] += 1e-6
        assert weights_fingerprint(mixer) != first
        with torch.no_grad():
            parameter.view(-1)[-1] -= 1e-6
    assert weights_fingerprint(mixer.to(torch.bfloat16).to(torch.float32)) != first  # rounded values
    assert weights_fingerprint(_model().model.layers[0].gtu.token_mixer.double()) != first


def test_a_pytree_round_trip_keeps_plan_source(saved):
    from modeling_tnn.decoding_cache import _flatten_cache, _unflatten_cache

    model = _load(saved)
    with torch.no_grad():
        cache = getattr(model(torch.ones(1, 4, dtype=torch.long), use_cache=True), CACHE_FIELD)
    assert isinstance(cache, TnnCache)
    rebuilt = _unflatten_cache(*_flatten_cache(cache))
    assert _sources(rebuilt.describe()) == _sources(cache.describe()) == ["checkpoint", "checkpoint"]
