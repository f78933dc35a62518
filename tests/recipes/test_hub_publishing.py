"""Publishing to the Hub (run_scripts/publish.py over modeling_tnn.recipes): the dry-run folder's file list against the
allow-list, the model card's metadata against the run's results files, loading the folder as remote code offline
(by path and by repo id from a Hugging Face cache layout) where modeling_tnn is not importable, the upload path with
the huggingface_hub boundary patched, and the errors that stop before anything is uploaded."""

from __future__ import annotations

import base64
import contextlib
import io
import json
import math
import re
import shutil
from pathlib import Path
from types import SimpleNamespace
from unittest import mock

import pytest
import torch
from tests.support import PROJECT_ROOT, extract_answer, main_output, save_with_tokenizer, tiny_config_for
from huggingface_hub import HfApi, ModelCard
from transformers import pipeline
from tests.remote_code import run_with_package_blocked

from modeling_tnn import (
    TnnForCausalLM,
    TnnForMaskedLM,
    TnnForQuestionAnswering,
    TnnForSequenceClassification,
    TnnForTokenClassification,
)
from modeling_tnn.modeling_tnn import AUTO_MAP, CACHE_FIELD
from modeling_tnn.recipes.glue import tasks as glue_tasks
from modeling_tnn.recipes.hub import command as publish_command
from modeling_tnn.recipes.hub import folder as hub_folder
from modeling_tnn.recipes.hub import model_card
from modeling_tnn.recipes.hub import run_inspection

FAKE_TOKEN = "hf_FakeTokenThatMustNeverBePrinted0123456789"
REPOS = {"clm": "tnn-test/tiny-clm", "mlm": "tnn-test/tiny-mlm-fd", "rte": "tnn-test/tiny-rte-ski",
         "ner": "tnn-test/tiny-ner", "qa": "tnn-test/tiny-qa-fd"}
PIPELINE_TAGS = {"clm": "text-generation", "mlm": "fill-mask", "rte": "text-classification",
                 "ner": "token-classification", "qa": "question-answering"}
# A valid 1x1 PNG: stands for the eval_lengths.png plot train_clm.py draws.
PNG = base64.b64decode("iVBORw0KGgoAAAANSUhEUgAAAAEAAAABCAYAAAAfFcSJAAAADUlEQVR42mNkYPhfDwAChwGA60e6kg"
                       "AAAABJRU5ErkJggg==")
# Files of a training output that a model repository must never hold.
EXCLUDED = ["optimizer.pt", "scheduler.pt", "random_states_0.pkl", "training_args.bin", "trainer_state.json",
            "metrics.jsonl", "all_results.json", "eval_results.json", "train_results.json", "train.log", ".env"]


def _write_json(path: Path, value) -> None:
    path.write_text(json.dumps(value, indent=2))


def _write_trainer_files(run: Path, eval_results: dict, train_results: dict, steps: int) -> None:
    """What Trainer leaves after --do_train --do_eval: eval/train/all results and its state with a loss history."""
    _write_json(run / "eval_results.json", eval_results)
    _write_json(run / "train_results.json", train_results)
    _write_json(run / "all_results.json", {**train_results, **eval_results})
    _write_json(run / "trainer_state.json", {"global_step": steps, "train_batch_size": 32, "log_history": [
        {"step": steps // 3, "loss": 0.71}, {"step": 2 * steps // 3, "loss": 0.70}, {"step": steps, "loss": 0.69}]})


def _add_training_debris(run: Path) -> None:
    """What a real output folder also holds: checkpoints with optimizer states, logs, TensorBoard runs, caches and
    an environment file with a token. None of it may reach the Hub folder."""
    torch.save({"state": {}}, run / "optimizer.pt")
    torch.save({"last_epoch": 3}, run / "scheduler.pt")
    for checkpoint in ("step_10", "checkpoint-10", ".tmp-step_20"):
        (run / checkpoint).mkdir()
        shutil.copyfile(run / "model.safetensors", run / checkpoint / "model.safetensors")
        torch.save({"state": {}}, run / checkpoint / "optimizer.pt")
    (run / "runs").mkdir()
    (run / "runs" / "events.out.tfevents.1.host").write_bytes(b"\0")
    (run / ".cache").mkdir()
    (run / ".cache" / "token").write_text(FAKE_TOKEN)
    (run / ".env").write_text(f"HF_TOKEN={FAKE_TOKEN}\n")
    (run / "train.log").write_text("step 10 loss 5.0\n")


@pytest.fixture(scope="module")
def runs(tmp_path_factory, tokenizer):
    """Three tiny training outputs laid out as the training scripts write them: a causal LM (train_clm.py, dense
    mixer), a masked LM (train_mlm.py, FD mixer) and a GLUE RTE classifier (finetune_glue.py, SKI mixer)."""
    root = tmp_path_factory.mktemp("runs")
    torch.manual_seed(0)
    models = {"clm": TnnForCausalLM(tiny_config_for(tokenizer, "dense")),
              "mlm": TnnForMaskedLM(tiny_config_for(tokenizer, "fd")),
              "rte": TnnForSequenceClassification(tiny_config_for(tokenizer, "ski", num_labels=2)),
              "ner": TnnForTokenClassification(tiny_config_for(tokenizer, "dense", num_labels=3)),
              "qa": TnnForQuestionAnswering(tiny_config_for(tokenizer, "fd"))}
    models["ner"].config.id2label = {0: "O", 1: "B-KW", 2: "I-KW"}
    models["ner"].config.label2id = {"O": 0, "B-KW": 1, "I-KW": 2}
    with torch.no_grad():  # every token a B-KW: the card's snippet then prints entities
        models["ner"].classifier.bias.copy_(torch.tensor([0.0, 4.0, 0.0]))
    models["rte"].config.finetuning_task = "rte"
    models["rte"].config.id2label, models["rte"].config.label2id = ({0: "entailment", 1: "not_entailment"},
                                                                    {"entailment": 0, "not_entailment": 1})
    paths = {}
    for name, model in models.items():
        paths[name] = root / name
        save_with_tokenizer(model.eval(), tokenizer, paths[name])

    clm, mlm, rte = paths["clm"], paths["mlm"], paths["rte"]
    _write_json(clm / "all_results.json", {
        "eval_loss": 5.123456789, "perplexity": math.exp(5.123456789), "train_loss": 5.9, "train_runtime": 12.5,
        "train_steps": 20, "train_tokens": 5120, "train_tokens_per_second": 409.6, "epoch": 1,
        "num_parameters": models["clm"].num_parameters(), "num_processes": 1, "block_size": 16,
        "eval_lengths": {"16": {"perplexity": 171.25, "tokens": 256, "mode": "full"},
                         "64": {"perplexity": 180.5, "tokens": 256, "mode": "full"}}})
    (clm / "metrics.jsonl").write_text("".join(
        json.dumps({"step": s, "epoch": 0, "train_loss": 6.0 - 0.05 * s, "learning_rate": 1e-3 * s / 20,
                    "tokens_per_second": 400.0, "tokens_seen": 256 * s}) + "\n" for s in (5, 10, 15, 20))
        + json.dumps({"step": 20, "epoch": 0, "eval_loss": 5.123456789, "perplexity": 167.9}) + "\n"
        + json.dumps({"note": "an entry without a step"}) + "\n" + '{"step": 25, "train_lo')  # cut by a crash
    (clm / "eval_lengths.png").write_bytes(PNG)
    (root / "quality_tiny.png").write_bytes(PNG)  # a benchmark's plot kept outside the run folder (--plot)
    _add_training_debris(clm)

    _write_json(mlm / "all_results.json", {
        "eval_loss": 4.5, "perplexity": math.exp(4.5), "train_loss": 5.0, "train_runtime": 8.0, "train_steps": 10,
        "train_tokens": 2560, "train_tokens_per_second": 320.0, "epoch": 0,
        "num_parameters": models["mlm"].num_parameters(), "num_processes": 1, "block_size": 16,
        "hardware": "2 test CPU cores"})

    eval_results = {"epoch": 3.0, "eval_accuracy": 0.5342960288808665, "eval_loss": 0.69, "eval_runtime": 1.5,
                    "eval_samples": 277, "eval_samples_per_second": 184.6, "eval_steps_per_second": 6.0}
    train_results = {"epoch": 3.0, "train_loss": 0.7, "train_runtime": 30.25, "train_samples": 640}
    _write_trainer_files(rte, eval_results, train_results, steps=60)
    glue_tasks.get_task("rte").benchmark_record().write(rte)  # as finetune_glue.py --task_name rte leaves it
    (rte / "training_args.bin").write_bytes(b"pickled arguments")
    (rte / "README.md").write_text("# Trainer's own card, to be replaced\n")
    _add_training_debris(rte)
    _write_trainer_files(paths["ner"], {"epoch": 2.0, "eval_accuracy": 0.91, "eval_f1": 0.625, "eval_precision": 0.6,
                                        "eval_recall": 0.65, "eval_loss": 0.3, "eval_runtime": 0.5, "eval_samples": 50},
                         {"epoch": 2.0, "train_loss": 0.4, "train_runtime": 9.5, "train_samples": 400}, steps=30)
    _write_trainer_files(paths["qa"], {"epoch": 1.0, "eval_exact_match": 12.5, "eval_f1": 20.25, "eval_samples": 64},
                         {"epoch": 1.0, "train_loss": 3.1, "train_runtime": 20.0, "train_samples": 800}, steps=24)
    return paths, models


DATASET_FLAGS = {"clm": ["--dataset", "Salesforce/wikitext", "--dataset_config", "wikitext-2-raw-v1",
                         "--example_text", "def main"],
                 "mlm": ["--dataset_name", "Tiny test text", "--training_data", "the tiny training text"],
                 "rte": [],
                 "ner": ["--dataset_name", "Tiny tagged text"],
                 "qa": ["--dataset", "rajpurkar/squad", "--dataset_config", "plain_text"]}


def _run_main(argv: list[str]) -> tuple[int | None, str]:
    """Run publish.py's main in-process; returns (exit code or None, stdout + stderr)."""
    out, err = io.StringIO(), io.StringIO()
    code = None
    with contextlib.redirect_stdout(out), contextlib.redirect_stderr(err):
        try:
            publish_command.main(argv)
        except SystemExit as stop:
            code = stop.code
    return code, out.getvalue() + err.getvalue()


@pytest.fixture(scope="module")
def published(runs, tmp_path_factory):
    """publish.py --dry-run on every run (the Hub methods patched to fail if called); {name: (folder, output)}."""
    paths, _ = runs
    root = tmp_path_factory.mktemp("hub")
    built = {}
    with mock.patch.object(HfApi, "create_repo", side_effect=AssertionError("dry run called create_repo")), \
            mock.patch.object(HfApi, "upload_folder", side_effect=AssertionError("dry run uploaded")):
        for name, run in paths.items():
            folder = root / name
            argv = [str(run), "--repo_id", REPOS[name], "--dry-run", "--output_dir", str(folder),
                    "--card_dir", str(root / "cards" / name), *DATASET_FLAGS[name]]
            if name == "clm":
                argv += ["--plot", str(run.parent / "quality_tiny.png")]
            code, output = _run_main(argv)
            assert code is None, output
            built[name] = (folder, output)
    return built


def _expected_files(run: Path, name: str) -> set[str]:
    code = {p.name for p in run.glob("*.py")}  # save_pretrained wrote exactly the model code's import closure
    common = {"README.md", "config.json", "model.safetensors", "tokenizer.json", "tokenizer_config.json", *code}
    extra = {"clm": {"generation_config.json", "plots/eval_lengths.png", "plots/quality_tiny.png",
                     "plots/training_loss.png", "decoding_plan.safetensors"},
             "mlm": set(), "rte": {"plots/training_loss.png"}, "ner": {"plots/training_loss.png"},
             "qa": {"plots/training_loss.png"}}
    return common | extra[name]


def test_allow_list():
    for allowed in ("README.md", "config.json", "model.safetensors", "model-00001-of-00002.safetensors",
                    "tokenizer.json", "modeling_tnn.py", "plots/loss.png", "generation_config.json",
                    "decoding_plan.safetensors"):
        assert hub_folder.is_allowed(allowed), allowed
    for refused in [*EXCLUDED, "step_10/model.safetensors", "checkpoint-10/optimizer.pt", "runs/events.out",
                    ".cache/token", "plots/sub/a.png", "plots/notes.txt", "pytorch_model.bin", "sub/modeling_tnn.py"]:
        assert not hub_folder.is_allowed(refused), refused



def test_repo_id_is_org_slash_name_as_the_hub_client_checks_it():
    """ORG/NAME, checked by huggingface_hub's own validator (so an id the upload would refuse is refused first), with
    one message naming the flag it came from."""
    for valid in ("org/name", "Org-1/Name_2.x", "o/" + "n" * 96):
        hub_folder.validate_repo_id(valid)
    for invalid in ("no-slash", "a/b/c", "/name", "org/", "org/na..me", "org/na--me", "org/name.git", "org/-name",
                    "org/name-", "org/na me", "org/name\n", "o/" + "n" * 97, None):
        with pytest.raises(run_inspection.PublishError) as error:
            hub_folder.validate_repo_id(invalid, flag="--hub_model_id")
        assert str(error.value) == f"--hub_model_id {invalid!r} is not a Hub model id of the form ORG/NAME."


@pytest.mark.parametrize("name", list(REPOS))
def test_dry_run_folder_holds_only_the_allow_list(runs, published, name):
    paths, _ = runs
    folder, output = published[name]
    files = hub_folder.list_folder(folder)
    assert set(files) == _expected_files(paths[name], name)
    assert all(hub_folder.is_allowed(f) for f in files)
    assert not set(files) & set(EXCLUDED)
    assert str(folder) in output and all(f in output for f in files) and "nothing uploaded" in output
    assert not any(FAKE_TOKEN in (folder / f).read_text(errors="ignore") for f in files if not f.endswith(".png"))
    config = json.loads((folder / "config.json").read_text())
    assert config["auto_map"] == AUTO_MAP and len(config["auto_map"]) == 7
    # weights and tokenizer are byte copies of the run's
    for same in ("model.safetensors", "tokenizer.json"):
        assert (folder / same).read_bytes() == (paths[name] / same).read_bytes()
    # --card_dir got the card and its plots, never weights or code
    card_dir = folder.parent / "cards" / name
    assert set(hub_folder.list_folder(card_dir)) == {f for f in files if f == "README.md" or f.startswith("plots/")}


def test_the_causal_folder_ships_the_decoding_plan_of_its_weights(published):
    """publish.py fits the causal LM's plan (the run folder has none) and ships it: loaded from the Hub folder, its
    first cached forward reads every layer's plan from the file; the FD masked LM offers none and ships none."""
    folder, _ = published["clm"]
    model = TnnForCausalLM.from_pretrained(folder).eval()
    with torch.no_grad():
        out = model(input_ids=torch.ones(1, 4, dtype=torch.long), use_cache=True)
    rows = getattr(out, CACHE_FIELD).describe()
    assert rows and [row["plan_source"] for row in rows] == ["checkpoint"] * len(rows)
    assert not (published["mlm"][0] / "decoding_plan.safetensors").exists()


def _metrics_by_key(card: ModelCard) -> dict[tuple[str, str | None], float]:
    return {(r.metric_type, r.metric_config): r.metric_value for r in card.data.eval_results}


@pytest.mark.parametrize("name", list(REPOS))
def test_card_parses_back_and_its_model_index_equals_the_results_file(runs, published, name):
    paths, _ = runs
    folder, _ = published[name]
    card = ModelCard.load(folder / "README.md")
    data = card.data
    assert data.license == "apache-2.0" and data.library_name == "transformers"
    assert data.pipeline_tag == PIPELINE_TAGS[name]
    assert {"tnn", "toeplitz", "custom_code"} <= set(data.tags)
    assert model_card.MIXER_TAGS[runs[1][name].config.token_mixer] in data.tags
    assert data.model_name == REPOS[name].split("/")[1]
    if name == "rte":
        results = json.loads((paths[name] / "eval_results.json").read_text())
        assert _metrics_by_key(card) == {("accuracy", None): results["eval_accuracy"]}
        (result,) = data.eval_results
        assert (result.dataset_type, result.dataset_config, result.dataset_split) == ("nyu-mll/glue", "rte",
                                                                                      "validation")
        assert data.datasets == ["nyu-mll/glue"]
        assert "Trainer's own card" not in card.text
        # Trainer records no parameter count: the card counts the saved weights
        assert f"| parameters | {runs[1]['rte'].num_parameters():,} |" in card.text
        assert "| labels | entailment, not_entailment |" in card.text
    elif name in ("ner", "qa"):  # every score of Trainer's eval_results.json, on the data the flags name
        results = json.loads((paths[name] / "eval_results.json").read_text())
        assert _metrics_by_key(card) == {(key.removeprefix("eval_"), None): value for key, value in results.items()
                                         if key.startswith("eval_") and key not in run_inspection.NOT_SCORES}
        assert {r.task_type for r in data.eval_results} == {PIPELINE_TAGS[name]}
        assert {(r.dataset_type, r.dataset_config) for r in data.eval_results} == (
            {("tiny-tagged-text", None)} if name == "ner" else {("rajpurkar/squad", "plain_text")})
        assert data.datasets == (None if name == "ner" else ["rajpurkar/squad"])
        steps = json.loads((paths[name] / "trainer_state.json").read_text())["global_step"]
        assert f"| optimizer steps | {steps} |" in card.text
        assert ("| token labels | O, B-KW, I-KW |" if name == "ner" else
                "| output | a start and an end score for every token (the answer span) |") in card.text
        assert "The checkpoint also loads with `AutoModel` (the backbone without its head)." in card.text
        assert f"finetuned on {'Tiny tagged text' if name == 'ner' else 'rajpurkar/squad'}. " in card.text
    else:
        results = json.loads((paths[name] / "all_results.json").read_text())
        expected = {("perplexity", None): results["perplexity"], ("loss", None): results["eval_loss"]}
        for length, values in results.get("eval_lengths", {}).items():
            expected[("perplexity", f"length_{length}")] = values["perplexity"]
        assert _metrics_by_key(card) == expected
        assert {r.task_type for r in data.eval_results} == {"text-generation" if name == "clm" else "fill-mask"}
    if name == "clm":
        assert data.datasets == ["Salesforce/wikitext"]
        assert {r.dataset_config for r in data.eval_results} == {"wikitext-2-raw-v1"}
        # the generation limitation follows the shipped code and config: a decaying dense kernel decodes with the
        # certified compact state or the exact window under the default cache (no ETSC horizon to warn about)
        has_cache = any("etsc_length" in p.read_text() for p in paths[name].glob("*.py")
                        if p.name != "configuration_tnn.py")
        assert has_cache
        assert "compact state" in card.text and "`compact_tolerance` = 1e-05" in card.text
        assert "exact window over the kernel's float32 support" in card.text
        assert "repeats with period" not in card.text
        assert "no recurrent generation cache" not in card.text
    if name == "mlm":
        assert data.datasets is None  # local data: named in the model-index, not claimed as a Hub dataset
        assert "`fd_kernel_length` = 64" in card.text and "2 test CPU cores" in card.text
        assert "language model trained on the tiny training text" in card.text
        assert "| training data | the tiny training text |" in card.text
    # every plot in the folder is shown in the card, and the card shows no plot that is missing
    plots = {f for f in hub_folder.list_folder(folder) if f.startswith("plots/")}
    assert set(re.findall(r"\]\((plots/[^)]+)\)", card.text)) == plots
    assert "trust_remote_code=True" in card.text


REMOTE_SCRIPT = """
    import io, json, re, contextlib
    jobs = json.loads({jobs!r})
    ids = torch.load({ids!r})
    out = {{}}
    for job in jobs:
        source = job["source"]
        config = transformers.AutoConfig.from_pretrained(source, trust_remote_code=True)
        assert type(config).__module__.startswith("transformers_modules"), type(config).__module__
        tokenizer = transformers.AutoTokenizer.from_pretrained(source, trust_remote_code=True)
        assert len(tokenizer) == config.vocab_size
        for name in job["classes"]:
            model = load_remote(name, source)
            with torch.no_grad():
                out[f"{{source}}|{{name}}"] = main_output(model(input_ids=ids))
                backbone = model.model if hasattr(model, "model") else model
                out[f"{{source}}|{{name}}|backbone"] = backbone(input_ids=ids).last_hidden_state
        if job.get("snippet"):  # the card's usage snippet, verbatim
            printed = io.StringIO()
            with contextlib.redirect_stdout(printed):
                exec(job["snippet"], {{}})
            out[f"{{source}}|snippet"] = printed.getvalue()
    torch.save(out, {result!r})
"""


def _cache_layout(folder: Path, repo_id: str, cache: Path) -> None:
    """Lay ``folder`` out as huggingface_hub's cache holds a downloaded repository."""
    revision = "0123456789abcdef0123456789abcdef01234567"
    repo = cache / f"models--{repo_id.replace('/', '--')}"
    shutil.copytree(folder, repo / "snapshots" / revision)
    (repo / "refs").mkdir(parents=True)
    (repo / "refs" / "main").write_text(revision)


@pytest.fixture(scope="module")
def remote_loads(runs, published, tmp_path_factory):
    """Load every published folder, by path and by repo id, with every applicable Auto class and run each card's
    snippet, all in ONE offline subprocess where modeling_tnn cannot be imported."""
    paths, models = runs
    root = tmp_path_factory.mktemp("remote")
    cache = root / "hub_cache"
    ids = torch.randint(5, models["clm"].config.vocab_size, (2, 9))
    torch.save(ids, root / "ids.pt")
    jobs, expected_classes = [], {}
    for name, (folder, _) in published.items():
        info = run_inspection.inspect_run(paths[name])
        classes = model_card.applicable_auto_classes(info)
        expected_classes[name] = classes
        _cache_layout(folder, REPOS[name], cache)
        snippet = re.search(r"```python\n(.*?)```", ModelCard.load(folder / "README.md").text, re.S).group(1)
        jobs.append({"source": str(folder), "classes": classes, "name": name})
        jobs.append({"source": REPOS[name], "classes": classes, "name": name, "snippet": snippet})
    script = REMOTE_SCRIPT.format(jobs=json.dumps(jobs), ids=str(root / "ids.pt"), result=str(root / "out.pt"))
    run_with_package_blocked(script, root, extra_env={"HF_HUB_CACHE": str(cache), "HF_HOME": str(root / "hf_home"),
                                                      "TRANSFORMERS_VERBOSITY": "error"})
    return ids, jobs, expected_classes, torch.load(root / "out.pt")


@pytest.mark.slow
@pytest.mark.parametrize("name", list(REPOS))
def test_published_folder_loads_as_remote_code_offline_by_path_and_repo_id(runs, remote_loads, tokenizer, name):
    _, models = runs
    ids, jobs, expected_classes, out = remote_loads
    model = models[name]
    head = run_inspection.HEAD_AUTO_CLASS[type(model).__name__]
    assert head in expected_classes[name] and "AutoModel" in expected_classes[name]
    assert ("AutoModelForMaskedLM" in expected_classes[name]) == (name == "mlm")
    assert ("AutoModelForCausalLM" in expected_classes[name]) == (name == "clm")
    threads = torch.get_num_threads()
    torch.set_num_threads(1)  # tiny models: threads only add contention on a shared machine
    try:
        with torch.no_grad():
            reference = main_output(model(input_ids=ids))
            backbone = model.model(input_ids=ids).last_hidden_state
    finally:
        torch.set_num_threads(threads)
    sources = [job["source"] for job in jobs if job["name"] == name]
    assert sources == [str(Path(sources[0])), REPOS[name]]  # once by path, once by repo id from the cache
    for source in sources:
        torch.testing.assert_close(out[f"{source}|{head}"], reference, atol=0, rtol=0)
        for auto_class in expected_classes[name]:  # every class, even a new head, shares the saved backbone
            torch.testing.assert_close(out[f"{source}|{auto_class}|backbone"], backbone, atol=0, rtol=0)
    printed = out[f"{REPOS[name]}|snippet"]
    if name == "clm":
        assert printed.startswith("def main")
    elif name == "mlm":
        assert len(printed.strip().splitlines()) == 5  # top_k=5 guesses
    elif name == "ner":  # what the package's own model tags in the card's example
        tagger = pipeline("token-classification", model=model, tokenizer=tokenizer, aggregation_strategy="simple")
        entities = tagger(model_card.DEFAULT_EXAMPLES["token-classification"])
        assert entities and all(entity["entity_group"] == "KW" for entity in entities)
        assert printed.splitlines() == [f"{e['entity_group']}  {e['word']!r}  {e['score']:.3f}" for e in entities]
    elif name == "qa":  # the package's own model's answer to the card's question
        question, context = model_card.DEFAULT_QUESTION_ANSWERING_EXAMPLE
        answer = extract_answer(model, tokenizer, question, context)
        assert answer and answer in context and printed == answer + "\n"
    else:
        assert "'label': '" in printed and ("entailment" in printed)


class _Commit(SimpleNamespace):
    pass


def test_upload_creates_the_repo_and_uploads_the_folder_once(runs, published, monkeypatch, capsys, caplog):
    paths, _ = runs
    monkeypatch.setenv("HF_TOKEN", FAKE_TOKEN)
    seen = {}

    def fake_upload(self, **kwargs):
        folder = Path(kwargs["folder_path"])
        seen["files"] = hub_folder.list_folder(folder)
        seen["leak"] = any(FAKE_TOKEN in (folder / f).read_text(errors="ignore") for f in seen["files"]
                           if not f.endswith((".png", ".safetensors")))
        seen["folder"] = folder
        return _Commit(commit_url="https://huggingface.co/tnn-test/tiny-clm/commit/abc",
                       pr_url="https://huggingface.co/tnn-test/tiny-clm/discussions/1")

    with mock.patch.object(HfApi, "create_repo", autospec=True) as create_repo, \
            mock.patch.object(HfApi, "upload_folder", autospec=True, side_effect=fake_upload) as upload:
        code, output = _run_main([str(paths["clm"]), "--repo_id", REPOS["clm"], "--private", "--create_pr",
                                  *DATASET_FLAGS["clm"], "--plot", str(paths["clm"].parent / "quality_tiny.png")])
    assert code is None, output
    create_repo.assert_called_once()
    assert create_repo.call_args.args[1:] == (REPOS["clm"],)
    assert create_repo.call_args.kwargs == {"repo_type": "model", "private": True, "exist_ok": True}
    upload.assert_called_once()
    kwargs = upload.call_args.kwargs
    assert kwargs["repo_id"] == REPOS["clm"] and kwargs["repo_type"] == "model" and kwargs["create_pr"] is True
    assert kwargs["commit_message"] == "Upload TnnForCausalLM (step 20)"
    assert "token" not in kwargs  # huggingface_hub finds the token itself
    assert set(seen["files"]) == set(hub_folder.list_folder(published["clm"][0]))
    assert not seen["leak"]
    assert not seen["folder"].exists()  # the temporary folder is removed after the upload
    assert "discussions/1" in output
    captured = capsys.readouterr()
    assert FAKE_TOKEN not in output + captured.out + captured.err + caplog.text


@pytest.mark.parametrize("name, missing, message", [
    ("clm", "all_results.json", "all_results.json"),
    ("clm", "model.safetensors", "no weights"),
    ("rte", "eval_results.json", "eval_results.json (written by finetune_glue.py --do_eval)"),
    ("qa", "eval_results.json", "eval_results.json (written by a Trainer script with --do_eval"),
    ("clm", "tokenizer_config.json", "no tokenizer"),
])
def test_missing_results_or_weights_stop_before_upload(runs, tmp_path, monkeypatch, name, missing, message):
    paths, _ = runs
    run = tmp_path / name
    shutil.copytree(paths[name], run, ignore=shutil.ignore_patterns("step_*", "checkpoint-*", ".tmp-*", "runs"))
    (run / missing).unlink()
    if missing == "eval_results.json":
        (run / "all_results.json").unlink()  # Trainer's all_results.json would stand in for it
    monkeypatch.setenv("HF_TOKEN", FAKE_TOKEN)
    with mock.patch.object(HfApi, "create_repo") as create_repo, mock.patch.object(HfApi, "upload_folder") as upload:
        code, output = _run_main([str(run), "--repo_id", REPOS[name], *DATASET_FLAGS[name]])
    assert code == 2
    assert output.startswith("publish.py: error:") and message in output and str(run) in output
    create_repo.assert_not_called()
    upload.assert_not_called()
    assert FAKE_TOKEN not in output


def test_no_token_and_bad_flags_stop_before_upload(runs, tmp_path):
    paths, _ = runs
    with mock.patch("huggingface_hub.get_token", return_value=None), \
            mock.patch.object(HfApi, "create_repo") as create_repo, mock.patch.object(HfApi, "upload_folder") as upload:
        code, output = _run_main([str(paths["rte"]), "--repo_id", REPOS["rte"]])
        assert code == 2 and "hf auth login" in output and "HF_TOKEN" in output
        code, output = _run_main([str(paths["rte"]), "--repo_id", "no-slash", "--dry-run"])
        assert code == 2 and "--repo_id 'no-slash'" in output
        # an output folder that holds the run would be wiped by --overwrite: refused
        code, output = _run_main([str(paths["rte"]), "--repo_id", REPOS["rte"], "--dry-run", "--overwrite",
                                  "--output_dir", str(paths["rte"].parent)])
        assert code == 2 and "--output_dir" in output
        assert paths["rte"].joinpath("model.safetensors").is_file()
        code, output = _run_main([str(paths["mlm"]), "--repo_id", REPOS["mlm"], "--dry-run",
                                  "--output_dir", str(tmp_path / "x")])  # a language model needs its dataset named
        assert code == 2 and "--dataset" in output
        code, output = _run_main([str(paths["mlm"]), "--repo_id", REPOS["mlm"], "--dry-run", "--dataset_name", "x",
                                  "--example_text", "no mask here", "--output_dir", str(tmp_path / "y")])
        assert code == 2 and "{mask}" in output
        code, output = _run_main([str(paths["qa"]), "--repo_id", REPOS["qa"], "--dry-run", *DATASET_FLAGS["qa"],
                                  "--example_text", "a question", "--output_dir", str(tmp_path / "z")])
        assert code == 2 and "--example_text does not apply to a question-answering card" in output
    create_repo.assert_not_called()
    upload.assert_not_called()


def test_code_from_the_installed_package(runs, tmp_path):
    paths, _ = runs
    code, output = _run_main([str(paths["rte"]), "--repo_id", REPOS["rte"], "--dry-run", "--code", "package",
                              "--output_dir", str(tmp_path / "hub")])
    assert code is None, output
    package = PROJECT_ROOT / "modeling_tnn"
    shipped = sorted((tmp_path / "hub").glob("*.py"))
    assert {p.name for p in shipped} >= {"configuration_tnn.py", "modeling_tnn.py"}
    assert "__init__.py" not in {p.name for p in shipped}
    for path in shipped:
        assert path.read_bytes() == (package / path.name).read_bytes()


COMMITTED_CARDS = sorted((PROJECT_ROOT / "model_cards").glob("*/README.md"))


@pytest.mark.skipif(not COMMITTED_CARDS, reason="no model cards committed under model_cards/")
@pytest.mark.parametrize("card_file", COMMITTED_CARDS, ids=lambda p: p.parent.name)
def test_committed_model_cards_are_well_formed(card_file):
    card = ModelCard.load(card_file)
    data = card.data
    assert data.library_name == "transformers" and data.license
    assert data.pipeline_tag in {"text-generation", "fill-mask", "text-classification"}
    assert {"tnn", "toeplitz", "custom_code"} <= set(data.tags)
    assert data.eval_results and all(math.isfinite(r.metric_value) for r in data.eval_results)
    assert data.model_name == card_file.parent.name
    assert "trust_remote_code=True" in card.text and "## Limitations" in card.text
    # the card shows exactly the plots kept beside it
    shown = set(re.findall(r"\]\((plots/[^)]+)\)", card.text))
    kept = {p.relative_to(card_file.parent).as_posix() for p in (card_file.parent / "plots").glob("*")}
    assert shown == kept
    assert set(hub_folder.list_folder(card_file.parent)) == {"README.md", *kept}  # never weights or code


@pytest.mark.parametrize("config,support_aware,expected", [
    ({"token_mixer": "dense", "decay_gamma": 0.99, "generation_cache": "auto"}, True, "window of past mixer inputs"),
    ({"token_mixer": "dense", "decay_gamma": 1.0, "generation_cache": "auto"}, True, "a warning says so once"),
    ({"token_mixer": "dense", "decay_gamma": 0.99, "generation_cache": "etsc"}, True, "exact at every length, in"),
    ({"token_mixer": "fd", "generation_cache": "etsc"}, True, "repeats with period 513"),
    ({"token_mixer": "fd", "generation_cache": "auto"}, True, "ring buffer"),
    ({"token_mixer": "dense", "decay_gamma": 1.0, "generation_cache": "exact"}, True, "keeps every past mixer input"),
    ({"token_mixer": "dense", "decay_gamma": 0.99}, False, "repeats with period 513 (damped by the decay)"),
])
def test_generation_limitation_follows_the_mode_the_kernel_and_the_shipped_code(tmp_path, config, support_aware,
                                                                              expected):
    code = tmp_path / "decoding_plan.py"
    code.write_text("etsc_length" + (" kernel_support" if support_aware else ""))
    text = model_card._generation_limitation({"etsc_length": 512, **config}, [code])
    assert expected in text


def test_auto_map_names_only_the_classes_the_shipped_code_defines(tmp_path):
    """A run saved by an older version ships code without the token-classification and QA heads: its folder must
    not advertise them (loading them would fail), while the package's code advertises all seven."""
    package = hub_folder.model_code_files({"token_mixer": "dense"}, PROJECT_ROOT / "modeling_tnn")
    assert model_card.shipped_auto_map(package) == AUTO_MAP
    older = tmp_path / "modeling_tnn.py"
    older.write_text("\n".join(line for line in (PROJECT_ROOT / "modeling_tnn" / "modeling_tnn.py").read_text()
                               .splitlines() if not line.startswith(("class TnnForTokenClassification(",
                                                                      "class TnnForQuestionAnswering("))))
    narrowed = model_card.shipped_auto_map([*(p for p in package if p.name != "modeling_tnn.py"), older])
    assert set(AUTO_MAP) - set(narrowed) == {"AutoModelForTokenClassification", "AutoModelForQuestionAnswering"}
