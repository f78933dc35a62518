"""GLUE finetuning (run_scripts/finetune_glue.py and run_glue_suite.py over modeling_tnn.recipes): tsv loading for
every task, the official metrics against hand-computed values, clear errors, and short end-to-end Trainer runs."""

from __future__ import annotations

import json
import math
from pathlib import Path

import numpy as np
import pytest
from transformers import EvalPrediction

from modeling_tnn import TnnForMaskedLM
from modeling_tnn.recipes.common import flag_checks
from modeling_tnn.recipes.common.run_files import BenchmarkRecord
from modeling_tnn.recipes.glue import data_files
from modeling_tnn.recipes.glue import finetuning as glue_finetuning
from modeling_tnn.recipes.glue import metrics as glue_metrics
from modeling_tnn.recipes.glue import suite as glue_suite
from modeling_tnn.recipes.glue import tasks as glue_tasks
from modeling_tnn.recipes.hub import upload as hub_upload

from tests.support import save_with_tokenizer, tiny_config

# ----------------------------------------------------------------------------------------------------------------
# Small tsv files in the official GLUE layout, written by hand (independently of the task table in glue/tasks.py).
# ----------------------------------------------------------------------------------------------------------------
PAIRS = [("A man is playing a flute .", 'He said " the witness " left .'),
         ("The cat sat on the mat.", "The cat did not sit on the mat."),
         ("Stocks rose 2 % today .", "Shares went up today ."),
         ("Who wrote it?", "It was written by a dog, apparently.")]
HEADERS = {
    "sst2": "sentence\tlabel",
    "mrpc": "\ufeffQuality\t#1 ID\t#2 ID\t#1 String\t#2 String",
    "qqp": "id\tqid1\tqid2\tquestion1\tquestion2\tis_duplicate",
    "stsb": "index\tgenre\tfilename\tyear\told_index\tsource1\tsource2\tsentence1\tsentence2\tscore",
    "mnli": "index\tpromptID\tpairID\tgenre\tsentence1_binary_parse\tsentence2_binary_parse\tsentence1_parse\t"
            "sentence2_parse\tsentence1\tsentence2\tlabel1\tgold_label",
    "qnli": "index\tquestion\tsentence\tlabel",
    "rte": "index\tsentence1\tsentence2\tlabel",
    "wnli": "index\tsentence1\tsentence2\tlabel",
}
# The raw label written in the file for rows 0..3, and the label id / score the loader must return.
RAW_LABELS = {"cola": ["1", "0", "1", "1"], "sst2": ["0", "1", "1", "0"], "mrpc": ["1", "0", "0", "1"],
              "qqp": ["0", "1", "0", "0"], "stsb": ["5.000", "0.5", "3.800", "2"],
              "mnli": ["neutral", "entailment", "contradiction", "neutral"],
              "qnli": ["entailment", "not_entailment", "not_entailment", "entailment"],
              "rte": ["not_entailment", "entailment", "entailment", "not_entailment"], "wnli": ["1", "0", "0", "1"]}
EXPECTED_LABELS = {"cola": [1, 0, 1, 1], "sst2": [0, 1, 1, 0], "mrpc": [1, 0, 0, 1], "qqp": [0, 1, 0, 0],
                   "stsb": [5.0, 0.5, 3.8, 2.0], "mnli": [1, 0, 2, 1], "qnli": [0, 1, 1, 0], "rte": [1, 0, 0, 1],
                   "wnli": [1, 0, 0, 1]}
FOLDERS = {"cola": "CoLA", "sst2": "SST-2", "mrpc": "MRPC", "qqp": "QQP", "stsb": "STS-B", "mnli": "MNLI",
           "qnli": "QNLI", "rte": "RTE", "wnli": "WNLI"}
FILES = {"mnli": ("train.tsv", "dev_matched.tsv", "dev_mismatched.tsv")}


def _row(task: str, i: int, a: str, b: str, label: str) -> str:
    if task == "cola":
        return f"gj04\t{label}\t{'' if label == '1' else '*'}\t{a}"
    if task == "sst2":
        return f"{a} \t{label}"  # the real file keeps a space before the tab
    if task == "mrpc":
        return f"{label}\t{100 + i}\t{200 + i}\t{a}\t{b}"
    if task == "qqp":
        return f"{i}\t{100 + i}\t{200 + i}\t{a}\t{b}\t{label}"
    if task == "stsb":
        return f"{i}\tmain-captions\tMSRvid\t2012test\t{i:04d}\tnone\tnone\t{a}\t{b}\t{label}"
    if task == "mnli":
        return f"{i}\t{i}\t{i}e\tfiction\t( {a} )\t( {b} )\t(ROOT {a})\t(ROOT {b})\t{a}\t{b}\t{label}\t{label}"
    return f"{i}\t{a}\t{b}\t{label}"


def write_task(root: Path, task: str, repeat: int = 1) -> Path:
    """Write every labelled split of ``task`` (4 * repeat rows each) under ``root`` in the official layout."""
    folder = root / FOLDERS[task]
    folder.mkdir(parents=True, exist_ok=True)
    for name in FILES.get(task, ("train.tsv", "dev.tsv")):
        lines = [] if task == "cola" else [HEADERS[task]]
        for r in range(repeat):
            for i, ((a, b), label) in enumerate(zip(PAIRS, RAW_LABELS[task])):
                lines.append(_row(task, 4 * r + i, a, b, label))
        (folder / name).write_text("\n".join(lines) + "\n", encoding="utf-8")
    return root


@pytest.mark.parametrize("task", list(FOLDERS))
def test_load_written_tsv_every_task(tmp_path, task):
    write_task(tmp_path, task)
    spec = glue_tasks.get_task(task)
    data = glue_tasks.load_glue_local(task, tmp_path)
    assert sorted(data) == sorted(spec.split_files())
    for split in data.values():
        assert split.column_names == [*spec.text_columns, "label", "idx"]
        assert len(split) == 4
        if spec.is_regression:
            assert list(split["label"]) == pytest.approx(EXPECTED_LABELS[task])
        else:
            assert list(split["label"]) == EXPECTED_LABELS[task]
            assert split.features["label"].num_classes == spec.num_labels
        first = split[0][spec.text_columns[0]]
        assert first == PAIRS[0][0]  # no BOM, no trailing space, no quote handling
        if len(spec.text_columns) == 2:
            assert split[0][spec.text_columns[1]] == PAIRS[0][1]  # the quotes are kept as text


def test_task_table_matches_hub_dataset_names():
    # Text columns and class names of the Hub dataset nyu-mll/glue, so both data sources give the same columns.
    assert glue_tasks.TASK_NAMES == ("cola", "sst2", "mrpc", "qqp", "stsb", "mnli", "qnli", "rte", "wnli")
    assert glue_tasks.get_task("mnli").text_columns == ("premise", "hypothesis")
    assert glue_tasks.get_task("mnli").eval_splits == ("validation_matched", "validation_mismatched")
    assert glue_tasks.get_task("qnli").text_columns == ("question", "sentence")
    assert glue_tasks.get_task("wnli").label_names == ("not_entailment", "entailment")
    assert glue_tasks.get_task("stsb").is_regression and glue_tasks.get_task("stsb").num_labels == 1
    assert glue_tasks.get_task("SST-2").name == "sst2" and glue_tasks.get_task("STS_B").name == "stsb"


# Row counts of the shared copy (see shared/data/SOURCES.md: MRPC train lacks one pair; QNLI has dev only).
SHARED_COUNTS = {"cola": {"train": 8551, "validation": 1043}, "sst2": {"train": 67349, "validation": 872},
                 "mrpc": {"train": 3667, "validation": 408}, "stsb": {"train": 5749, "validation": 1500},
                 "rte": {"train": 2490, "validation": 277}, "wnli": {"train": 635, "validation": 71},
                 "qnli": {"validation": 5463}}


def test_load_shared_glue(shared_data):
    glue_dir = shared_data / "glue"
    for task, counts in SHARED_COUNTS.items():
        assert glue_tasks.available_splits(task, glue_dir) == list(counts)
        data = glue_tasks.load_glue_local(task, glue_dir, list(counts))
        assert {split: len(ds) for split, ds in data.items()} == counts
    for task in ("mnli", "qqp"):
        assert glue_tasks.available_splits(task, glue_dir) == []
    mrpc = glue_tasks.load_glue_local("mrpc", glue_dir, ["train"])["train"]
    assert mrpc[0]["sentence1"].startswith("Amrozi accused his brother") and mrpc[0]["label"] == 1
    cola = glue_tasks.load_glue_local("cola", glue_dir, ["validation"])["validation"]
    assert cola[0] == {"sentence": "The sailors rode the breeze clear of the rocks.", "label": 1, "idx": 0}
    stsb = glue_tasks.load_glue_local("stsb", glue_dir, ["validation"])["validation"]
    assert stsb[1]["label"] == pytest.approx(4.75) and stsb[1]["sentence2"] == "A child is riding a horse."


# ----------------------------------------------------------------------------------------------------------------
# Metrics, against numbers computed by hand
# ----------------------------------------------------------------------------------------------------------------
BINARY_PRED, BINARY_REF = [1, 1, 0, 0, 1], [1, 0, 0, 1, 1]  # TP 2, TN 1, FP 1, FN 1
ACC = 3 / 5
F1 = 2 / 3  # precision 2/3, recall 2/3
MCC = (2 * 1 - 1 * 1) / math.sqrt(3 * 3 * 2 * 2)  # (TP TN - FP FN) / sqrt((TP+FP)(TP+FN)(TN+FP)(TN+FN)) = 1/6
PEARSON = 25 / math.sqrt(5 * 129)  # x = 1..4, y = x^2: sum dx dy = 25, sum dx^2 = 5, sum dy^2 = 129

HAND_METRICS = {
    "cola": (BINARY_PRED, BINARY_REF, {"matthews_correlation": MCC}),
    "sst2": (BINARY_PRED, BINARY_REF, {"accuracy": ACC}),
    "qnli": (BINARY_PRED, BINARY_REF, {"accuracy": ACC}),
    "rte": (BINARY_PRED, BINARY_REF, {"accuracy": ACC}),
    "wnli": (BINARY_PRED, BINARY_REF, {"accuracy": ACC}),
    "mrpc": (BINARY_PRED, BINARY_REF, {"accuracy": ACC, "f1": F1, "combined_score": (ACC + F1) / 2}),
    "qqp": (BINARY_PRED, BINARY_REF, {"accuracy": ACC, "f1": F1, "combined_score": (ACC + F1) / 2}),
    "mnli": ([0, 1, 2, 2], [0, 1, 1, 2], {"accuracy": 0.75}),
    "stsb": ([1.0, 2.0, 3.0, 4.0], [1.0, 4.0, 9.0, 16.0],
             {"pearson": PEARSON, "spearmanr": 1.0, "combined_score": (PEARSON + 1.0) / 2}),
}


@pytest.mark.parametrize("task", list(HAND_METRICS))
def test_metric_every_task_hand_computed(task):
    predictions, references, expected = HAND_METRICS[task]
    result = glue_metrics.glue_metrics(task, predictions, references)
    assert set(result) == set(expected)
    for key, value in expected.items():
        assert result[key] == pytest.approx(value, abs=1e-12), key


def test_compute_metrics_from_logits():
    logits = np.array([[2.0, -1.0], [0.1, 0.3], [5.0, 4.0], [-1.0, 1.0]])  # argmax 0, 1, 0, 1
    labels = np.array([0, 1, 1, 1])
    result = glue_metrics.make_compute_metrics("sst2")(EvalPrediction(predictions=logits, label_ids=labels))
    assert result == {"accuracy": 0.75}
    scores = np.array([[1.0], [2.0], [3.0], [4.0]])  # regression logits have a trailing axis of 1
    targets = np.array([1.0, 4.0, 9.0, 16.0])
    result = glue_metrics.make_compute_metrics("stsb")(EvalPrediction(predictions=scores, label_ids=targets))
    assert result["pearson"] == pytest.approx(PEARSON)


def test_majority_baseline():
    # Train majority is class 1; on references [1, 0, 0, 1, 1] constant 1 gives accuracy 3/5 and F1 2*3/(2*3+2) = 3/4.
    result = glue_metrics.majority_baseline("mrpc", [1, 1, 0], BINARY_REF)
    assert result["accuracy"] == pytest.approx(0.6) and result["f1"] == pytest.approx(0.75)
    assert glue_metrics.majority_baseline("cola", [0, 0, 1], BINARY_REF) == {"matthews_correlation": 0.0}
    assert math.isnan(glue_metrics.majority_baseline("stsb", [1.0, 2.0], [1.0, 3.0])["pearson"])


# ----------------------------------------------------------------------------------------------------------------
# Errors
# ----------------------------------------------------------------------------------------------------------------
def test_unknown_task_is_named():
    with pytest.raises(ValueError, match=r"Unknown GLUE task 'sst3'.*cola, sst2, mrpc, qqp, stsb, mnli, qnli"):
        glue_tasks.get_task("sst3")
    with pytest.raises(ValueError, match="'mnli-x'"):
        glue_finetuning.parse_args(["--task_name", "mnli-x", "--output_dir", "unused"])


def test_missing_file_names_its_path(tmp_path):
    write_task(tmp_path, "rte")
    (tmp_path / "RTE" / "dev.tsv").unlink()
    with pytest.raises(FileNotFoundError, match=str(tmp_path / "RTE" / "dev.tsv")):
        glue_tasks.load_glue_local("rte", tmp_path)
    with pytest.raises(FileNotFoundError, match=str(tmp_path / "SST-2" / "train.tsv")):
        glue_tasks.load_glue_local("sst2", tmp_path)
    assert glue_tasks.available_splits("rte", tmp_path) == ["train"]


def test_header_that_does_not_match_the_task(tmp_path):
    write_task(tmp_path, "rte")
    # An RTE file read as MRPC: the header names the wrong columns.
    with pytest.raises(ValueError, match=r"header of .*RTE/train.tsv does not match GLUE task 'mrpc'.*Quality"):
        glue_tasks.read_glue_tsv("mrpc", tmp_path / "RTE" / "train.tsv")
    # A test-split file (no label column).
    test_file = tmp_path / "RTE" / "test.tsv"
    test_file.write_text("index\tsentence1\tsentence2\n0\ta\tb\n")
    with pytest.raises(ValueError, match=r"lacks \['label'\]"):
        glue_tasks.read_glue_tsv("rte", test_file)
    # CoLA has no header: a file with one (CoLA's test.tsv layout) is refused with its first line shown.
    cola = tmp_path / "cola.tsv"
    cola.write_text("index\tsentence\n0\tBill whistled past the house.\n")
    with pytest.raises(ValueError, match=r"no header and 4 tab-separated fields.*'index\\tsentence'"):
        glue_tasks.read_glue_tsv("cola", cola)


def test_malformed_rows(tmp_path, caplog):
    write_task(tmp_path, "sst2", repeat=50)  # 200 rows
    path = tmp_path / "SST-2" / "train.tsv"
    lines = path.read_text().splitlines()
    path.write_text("\n".join(lines[:10] + ["a row without a label"] + lines[10:]) + "\n")
    with caplog.at_level("WARNING"):
        assert len(glue_tasks.read_glue_tsv("sst2", path)["label"]) == 200  # 1 bad row of 201: skipped
    assert "Skipped 1 malformed row" in caplog.text and "line 11" in caplog.text
    path.write_text("\n".join(lines[:1] + [line.replace("\t0", "\tnegative") for line in lines[1:]]) + "\n")
    with pytest.raises(ValueError, match=r"100 of 200 rows .* malformed .*first at line 2"):
        glue_tasks.read_glue_tsv("sst2", path)


# ----------------------------------------------------------------------------------------------------------------
# The suite's task selection and table
# ----------------------------------------------------------------------------------------------------------------
def test_suite_selects_available_tasks_and_formats_table(tmp_path):
    for task in ("rte", "stsb", "mnli"):
        write_task(tmp_path, task)
    write_task(tmp_path, "qnli")
    (tmp_path / "QNLI" / "train.tsv").unlink()
    tasks, skipped = glue_suite.select_tasks(None, str(tmp_path))
    assert tasks == ["stsb", "mnli", "rte"]
    assert "no train" in skipped["qnli"] and set(skipped) == {"cola", "sst2", "mrpc", "qqp", "qnli", "wnli"}
    rows = {"m": {"rte": {"eval_accuracy": 0.5}, "stsb": {"eval_pearson": 0.8, "eval_spearmanr": 0.6,
                                                         "eval_combined_score": 0.7},
                  "mnli": {"eval_accuracy": 0.4, "eval_accuracy_mm": 0.3}}}
    table = glue_suite.markdown_table(tasks, rows).splitlines()
    assert table[0] == "| model | STS-B (Pearson / Spearman) | MNLI (acc) | RTE (acc) | mean |"
    assert table[2] == "| m | 80.0 / 60.0 | 40.0 / 30.0 | 50.0 | 53.3 |"  # mean of 70, 40, 50


# ----------------------------------------------------------------------------------------------------------------
# End-to-end Trainer runs
# ----------------------------------------------------------------------------------------------------------------
COMMON = ["--do_train", "--do_eval", "--save_strategy", "no", "--disable_tqdm", "true", "--report_to", "none",
          "--log_level", "warning", "--seed", "0", "--per_device_eval_batch_size", "64"]


@pytest.fixture
def tiny_mlm_checkpoint(tmp_path, tokenizer):
    """A tiny (untrained) masked-LM TNN saved with a tokenizer, as train_mlm.py would leave it."""
    folder = tmp_path / "mlm"
    save_with_tokenizer(TnnForMaskedLM(tiny_config(vocab_size=len(tokenizer), pad_token_id=tokenizer.pad_token_id)),
                        tokenizer, folder)
    return folder


@pytest.mark.parametrize("task", ["stsb", "mnli"])
@pytest.mark.slow
def test_finetune_from_checkpoint_regression_and_mnli(tmp_path, tiny_mlm_checkpoint, task):
    glue_dir = write_task(tmp_path / "glue", task, repeat=4)
    out = tmp_path / "out"
    results = glue_finetuning.main(["--model_name_or_path", str(tiny_mlm_checkpoint), "--task_name", task,
                                  "--glue_dir", str(glue_dir), "--output_dir", str(out), "--max_steps", "3",
                                  "--per_device_train_batch_size", "4", *COMMON])
    saved = json.loads((out / "eval_results.json").read_text())
    assert saved["eval_samples"] == 16
    expected = {"stsb": ["eval_pearson", "eval_spearmanr", "eval_combined_score"],
                "mnli": ["eval_accuracy", "eval_accuracy_mm", "eval_samples_mm"]}[task]
    assert all(key in saved and key in results for key in expected)
    config = json.loads((out / "config.json").read_text())
    assert config["problem_type"] == ("regression" if task == "stsb" else "single_label_classification")
    assert config["causal"] is False and config["finetuning_task"] == task
    assert json.loads((out / "benchmark.json").read_text())["config"] == task  # what publishing reads
    card = (out / "README.md").read_text()
    assert f"GLUE {task.upper()} dev results" in card and "local checkpoint `mlm`" in card
    assert "| eval_accuracy_mm |" in card if task == "mnli" else "| eval_pearson |" in card


@pytest.mark.slow
def test_finetune_sst2_beats_majority_baseline(tmp_path, shared_data):
    from modeling_tnn.recipes.pretraining.tokenizer import train_byte_level_bpe

    glue_dir = shared_data / "glue"
    train = glue_tasks.read_glue_tsv("sst2", glue_dir / "SST-2" / "train.tsv")
    tokenizer = train_byte_level_bpe(train["sentence"][:3000], vocab_size=600, add_bos_eos=True)
    tokenizer.save_pretrained(tmp_path / "tokenizer")
    results = glue_finetuning.main([
        "--config_name", "tiny", "--tokenizer_name", str(tmp_path / "tokenizer"), "--task_name", "sst2",
        "--glue_dir", str(glue_dir), "--output_dir", str(tmp_path / "out"), "--max_train_samples", "3000",
        "--max_seq_length", "48", "--per_device_train_batch_size", "32", "--learning_rate", "5e-3",
        "--warmup_steps", "10", "--num_train_epochs", "1", *COMMON])
    dev = glue_tasks.load_glue_local("sst2", glue_dir, ["train", "validation"])
    baseline = glue_metrics.majority_baseline("sst2", list(dev["train"]["label"])[:3000],
                                              list(dev["validation"]["label"]))
    assert results["eval_samples"] == 872
    assert results["eval_accuracy"] > baseline["accuracy"] + 0.04, (results, baseline)


def test_push_to_hub_goes_through_the_publishing_code(tmp_path, monkeypatch):
    """--push_to_hub publishes the allow-listed folder with a card (never training_args.bin or checkpoints)."""
    from transformers import TrainingArguments

    calls = []
    monkeypatch.setattr(hub_upload, "publish_run",
                        lambda run_dir, repo_id, out_dir, **kwargs: calls.append((run_dir, repo_id, kwargs)) or
                        ([], None))
    args = TrainingArguments(output_dir=str(tmp_path / "sst2-run"), hub_model_id="org/tnn-sst2",
                             hub_private_repo=True, report_to="none")
    glue_finetuning.push_to_hub(args, "sst2")
    (run_dir, repo_id, kwargs), = calls
    assert (run_dir, repo_id, kwargs["private"]) == (str(tmp_path / "sst2-run"), "org/tnn-sst2", True)
    dataset = kwargs["options"].dataset
    assert (dataset.hub_id, dataset.config, dataset.split) == ("nyu-mll/glue", "sst2", "validation")


# ----------------------------------------------------------------------------------------------------------------
# --do_predict: the GLUE submission files
# ----------------------------------------------------------------------------------------------------------------
# Headers of the official test files (every task has one, CoLA included; QQP's index column is "id").
TEST_HEADERS = {
    "cola": "index\tsentence", "sst2": "index\tsentence", "mrpc": "index\t#1 ID\t#2 ID\t#1 String\t#2 String",
    "qqp": "id\tquestion1\tquestion2",
    "stsb": "index\tgenre\tfilename\tyear\told_index\tsource1\tsource2\tsentence1\tsentence2",
    "mnli": "index\tpromptID\tpairID\tgenre\tsentence1_binary_parse\tsentence2_binary_parse\tsentence1_parse\t"
            "sentence2_parse\tsentence1\tsentence2",
    "qnli": "index\tquestion\tsentence", "rte": "index\tsentence1\tsentence2", "wnli": "index\tsentence1\tsentence2",
}
# What the GLUE submission expects: its file names and the label strings of each task.
SUBMISSION = {"cola": ("CoLA.tsv", {"0", "1"}), "sst2": ("SST-2.tsv", {"0", "1"}), "mrpc": ("MRPC.tsv", {"0", "1"}),
              "qqp": ("QQP.tsv", {"0", "1"}), "stsb": ("STS-B.tsv", None),
              "qnli": ("QNLI.tsv", {"entailment", "not_entailment"}),
              "rte": ("RTE.tsv", {"entailment", "not_entailment"}), "wnli": ("WNLI.tsv", {"0", "1"})}
NLI3 = {"entailment", "neutral", "contradiction"}


def _test_row(task: str, i: int, a: str, b: str) -> str:
    if task in ("cola", "sst2"):
        return f"{i}\t{a}"
    if task == "mrpc":
        return f"{i}\t{100 + i}\t{200 + i}\t{a}\t{b}"
    if task == "stsb":
        return f"{i}\tmain-captions\tMSRvid\t2012test\t{i:04d}\tnone\tnone\t{a}\t{b}"
    if task == "mnli":
        return f"{i}\t{i}\t{i}e\tfiction\t( {a} )\t( {b} )\t(ROOT {a})\t(ROOT {b})\t{a}\t{b}"
    return f"{i}\t{a}\t{b}"


def write_test_files(root: Path, task: str, rows: int = 6, ax: bool = True) -> Path:
    """Write ``task``'s test file(s) (MNLI: matched, mismatched and, with ``ax``, the diagnostic set) under ``root``."""
    names = {"mnli": ["MNLI/test_matched.tsv", "MNLI/test_mismatched.tsv"] + (["diagnostic/diagnostic.tsv"] if ax
                                                                              else [])}
    for name in names.get(task, [f"{FOLDERS[task]}/test.tsv"]):
        path = root / name
        path.parent.mkdir(parents=True, exist_ok=True)
        header = "index\tsentence1\tsentence2" if name.startswith("diagnostic") else TEST_HEADERS[task]
        lines = [header] + [_test_row("rte" if name.startswith("diagnostic") else task, i, *PAIRS[i % 4])
                            for i in range(rows)]
        path.write_text("\n".join(lines) + "\n", encoding="utf-8")
    return root


def read_submission(path: Path) -> list[list[str]]:
    lines = path.read_text(encoding="utf-8").splitlines()
    assert lines[0] == "index\tprediction", lines[0]
    return [line.split("\t") for line in lines[1:]]


@pytest.mark.parametrize("task", list(FOLDERS))
def test_read_test_tsv_every_task(tmp_path, task):
    write_test_files(tmp_path, task, rows=5)
    spec = glue_tasks.get_task(task)
    data = glue_tasks.load_glue_local(task, tmp_path, spec.test_splits)
    assert list(data) == list(spec.test_splits)
    for split in data.values():
        assert split.column_names == [*spec.text_columns, "idx"]  # no label column
        assert list(split["idx"]) == [0, 1, 2, 3, 4]
        assert split[1][spec.text_columns[0]] == PAIRS[1][0]
        if len(spec.text_columns) == 2:
            assert split[0][spec.text_columns[1]] == PAIRS[0][1]
    assert [spec.submission_file(split) for split in spec.test_splits] == (
        ["MNLI-m.tsv", "MNLI-mm.tsv", "AX.tsv"] if task == "mnli" else [SUBMISSION[task][0]])


def test_test_tsv_errors_name_the_file(tmp_path):
    write_test_files(tmp_path, "rte", rows=3)
    path = tmp_path / "RTE" / "test.tsv"
    path.write_text(path.read_text().replace("1\tThe cat sat on the mat.\t", "1\tThe cat sat on the mat."))
    with pytest.raises(ValueError, match=r"RTE/test.tsv line 3 has 2 tab-separated fields where 3 are needed"):
        glue_tasks.read_glue_test_tsv("rte", path)
    path.write_text("index\tsentence\n0\ta\n")
    with pytest.raises(ValueError, match=r"RTE/test.tsv does not match GLUE task 'rte'.*lacks \['sentence1', "
                                         r"'sentence2'\]"):
        glue_tasks.read_glue_test_tsv("rte", path)


def test_write_predictions_format(tmp_path):
    path = glue_tasks.write_predictions(tmp_path / "STS-B.tsv", [0, 1, 2], np.array([4.12345, 0.0, -1.5]), None)
    assert path.read_text() == "index\tprediction\n0\t4.123\n1\t0.000\n2\t-1.500\n"
    task = glue_tasks.get_task("rte")
    path = glue_tasks.write_predictions(tmp_path / "RTE.tsv", [5, 6], [1, 0], task.file_labels)
    assert path.read_text() == "index\tprediction\n5\tnot_entailment\n6\tentailment\n"
    assert glue_tasks.get_task("cola").submission_label(1) == "1"
    assert glue_tasks.get_task("mnli").submission_label(2) == "contradiction"


PREDICT = ["--do_predict", "--report_to", "none", "--log_level", "warning", "--disable_tqdm", "true",
           "--per_device_eval_batch_size", "64"]


@pytest.mark.parametrize("task", ["cola", "stsb", "wnli"])
@pytest.mark.slow
def test_do_predict_shared_glue_test_sets(tmp_path, shared_data, tiny_mlm_checkpoint, task):
    """--do_predict alone on the real GLUE test files: the submission's file name, header, one row per test example
    (all 146 of WNLI; --max_predict_samples 7 for the others), indices in file order, labels as GLUE writes them."""
    out = tmp_path / "out"
    limit = [] if task == "wnli" else ["--max_predict_samples", "7"]
    results = glue_finetuning.main(["--model_name_or_path", str(tiny_mlm_checkpoint), "--task_name", task,
                                  "--glue_dir", str(shared_data / "glue"), "--output_dir", str(out), *limit, *PREDICT])
    assert results == {}
    name, labels = SUBMISSION[task]
    assert sorted(p.name for p in out.glob("*.tsv")) == [name]
    rows = read_submission(out / name)
    assert [int(index) for index, _ in rows] == list(range(146 if task == "wnli" else 7))
    if labels is None:
        assert all(math.isfinite(float(value)) and "." in value for _, value in rows)
    else:
        assert {value for _, value in rows} <= labels


@pytest.mark.slow
def test_do_predict_mnli_writes_matched_mismatched_and_ax(tmp_path, tiny_mlm_checkpoint):
    glue_dir = write_test_files(write_task(tmp_path / "glue", "mnli"), "mnli", rows=6)
    out = tmp_path / "out"
    glue_finetuning.main(["--model_name_or_path", str(tiny_mlm_checkpoint), "--task_name", "mnli", "--glue_dir",
                        str(glue_dir), "--output_dir", str(out), "--max_predict_samples", "4", *PREDICT])
    assert sorted(p.name for p in out.glob("*.tsv")) == ["AX.tsv", "MNLI-m.tsv", "MNLI-mm.tsv"]
    for name in ("AX.tsv", "MNLI-m.tsv", "MNLI-mm.tsv"):
        rows = read_submission(out / name)
        assert [index for index, _ in rows] == ["0", "1", "2", "3"] and {v for _, v in rows} <= NLI3
    # Without the diagnostic file the two MNLI files are still written.
    (glue_dir / "diagnostic" / "diagnostic.tsv").unlink()
    glue_finetuning.main(["--model_name_or_path", str(tiny_mlm_checkpoint), "--task_name", "mnli", "--glue_dir",
                        str(glue_dir), "--output_dir", str(tmp_path / "out2"), *PREDICT])
    assert sorted(p.name for p in (tmp_path / "out2").glob("*.tsv")) == ["MNLI-m.tsv", "MNLI-mm.tsv"]


# ----------------------------------------------------------------------------------------------------------------
# --train_file / --validation_file / --test_file (csv and json, run_glue.py's column rules)
# ----------------------------------------------------------------------------------------------------------------
SENTIMENT = [("a fine and moving film", "pos"), ("dull , slow and far too long", "neg"),
             ("the best thing this year", "pos"), ("I want my money back", "neg")]


def write_rows(path: Path, rows: list[dict]) -> Path:
    """``rows`` as a csv file (header from the first row) or JSON lines, by ``path``'s extension."""
    if path.suffix == ".csv":
        import csv

        with path.open("w", newline="", encoding="utf-8") as handle:
            writer = csv.DictWriter(handle, fieldnames=list(rows[0]))
            writer.writeheader()
            writer.writerows(rows)
    else:
        path.write_text("".join(json.dumps(row) + "\n" for row in rows), encoding="utf-8")
    return path


def classification_rows(repeat: int = 4) -> list[dict]:
    # An integer "id" column first: run_glue.py would feed it to the tokenizer; here it is passed over.
    return [{"id": 10 * r + i, "sentence": text, "label": label}
            for r in range(repeat) for i, (text, label) in enumerate(SENTIMENT)]


@pytest.mark.parametrize("ext", ["csv", "json"])
@pytest.mark.slow
def test_train_validation_test_files_classification(tmp_path, tiny_mlm_checkpoint, ext):
    train = write_rows(tmp_path / f"train.{ext}", classification_rows())
    valid = write_rows(tmp_path / f"valid.{ext}", classification_rows(2))
    test = write_rows(tmp_path / f"test.{ext}", [{"id": i, "sentence": text} for i, (text, _) in enumerate(SENTIMENT)])
    out = tmp_path / "out"
    results = glue_finetuning.main(["--model_name_or_path", str(tiny_mlm_checkpoint), "--train_file", str(train),
                                  "--validation_file", str(valid), "--test_file", str(test), "--output_dir", str(out),
                                  "--max_steps", "2", "--per_device_train_batch_size", "4", *COMMON, "--do_predict"])
    assert results["eval_samples"] == 8 and 0.0 <= results["eval_accuracy"] <= 1.0
    assert set(json.loads((out / "eval_results.json").read_text())) >= {"eval_accuracy", "eval_samples"}
    config = json.loads((out / "config.json").read_text())
    assert config["id2label"] == {"0": "neg", "1": "pos"} and config["problem_type"] == "single_label_classification"
    rows = read_submission(out / "predict_results.tsv")
    assert [index for index, _ in rows] == ["0", "1", "2", "3"] and {v for _, v in rows} <= {"neg", "pos"}
    assert "Results on valid." in (out / "README.md").read_text()

    # The finetuned folder evaluates a validation file alone with its own classes: this file holds only "pos",
    # which on its own would be a single class.
    only_pos = write_rows(tmp_path / f"pos.{ext}", [{"sentence": t, "label": "pos"} for t, _ in SENTIMENT])
    again = glue_finetuning.main(["--model_name_or_path", str(out), "--validation_file", str(only_pos),
                                "--output_dir", str(tmp_path / "eval"), "--do_eval", "--report_to", "none",
                                "--log_level", "warning", "--disable_tqdm", "true"])
    assert again["eval_samples"] == 4
    predicted_pos = sum(value == "pos" for _, value in rows)  # the same model, the same texts
    assert again["eval_accuracy"] == pytest.approx(predicted_pos / 4)


@pytest.mark.slow
def test_files_regression_and_sentence_pairs(tmp_path, tiny_mlm_checkpoint):
    """A float label means regression (scored by mean squared error, as run_glue.py does); sentence1/sentence2 are
    taken as the pair wherever they are in the file."""
    rows = [{"genre": "news", "sentence2": b, "score_source": "x", "sentence1": a, "label": float(i) + 0.5}
            for i, (a, b) in enumerate(PAIRS * 2)]
    train = write_rows(tmp_path / "train.json", rows)
    out = tmp_path / "out"
    results = glue_finetuning.main(["--model_name_or_path", str(tiny_mlm_checkpoint), "--train_file", str(train),
                                  "--validation_file", str(train), "--output_dir", str(out), "--max_steps", "2",
                                  "--per_device_train_batch_size", "4", *COMMON])
    assert set(results) >= {"eval_mse", "eval_samples"} and "eval_accuracy" not in results
    assert json.loads((out / "config.json").read_text())["problem_type"] == "regression"
    data = data_files.load_data_files({"train": train})
    assert data.file_columns == ("sentence1", "sentence2") and data.label_names is None


def test_benchmark_record_of_a_glue_task(tmp_path):
    """The record a GLUE run leaves for its model card (the Hub code reads it instead of importing the task table):
    the task's metrics on each dev set, MNLI-mm's keys suffixed as run_glue.py does, and a lossless JSON file."""
    mnli = glue_tasks.get_task("mnli").benchmark_record()
    assert [(s.key, s.metric, s.split) for s in mnli.scores] == [
        ("eval_accuracy", "accuracy", "validation_matched"), ("eval_accuracy_mm", "accuracy", "validation_mismatched")]
    assert (mnli.dataset, mnli.config, mnli.name, mnli.text_pair) == ("nyu-mll/glue", "mnli", "GLUE MNLI", True)
    stsb = glue_tasks.get_task("stsb").benchmark_record()
    assert [s.key for s in stsb.scores] == ["eval_pearson", "eval_spearmanr", "eval_combined_score"]
    assert not glue_tasks.get_task("sst2").benchmark_record().text_pair
    assert BenchmarkRecord.from_dict(json.loads(mnli.write(tmp_path).read_text())) == mnli


@pytest.mark.slow
def test_files_with_a_glue_task(tmp_path, tiny_mlm_checkpoint):
    """With --task_name, files take the task's labels (class ids, Hub names or tsv spellings), its metrics and its
    column names; a --test_file replaces the task's test set and is written with the GLUE label strings."""
    rows = [{"premise": a, "hypothesis": b, "label": label}
            for (a, b), label in zip(PAIRS, ["entailment", 2, "neutral", 0])]
    valid = write_rows(tmp_path / "valid.csv", rows)
    test = write_rows(tmp_path / "test.csv", [{"premise": a, "hypothesis": b} for a, b in PAIRS])
    data = data_files.load_data_files({"validation": valid}, "mnli")
    assert list(data.datasets["validation"]["label"]) == [0, 2, 1, 0]
    out = tmp_path / "out"
    results = glue_finetuning.main(["--model_name_or_path", str(tiny_mlm_checkpoint), "--task_name", "mnli",
                                  "--validation_file", str(valid), "--test_file", str(test), "--output_dir", str(out),
                                  "--do_eval", *PREDICT])
    assert "eval_accuracy" in results and "eval_accuracy_mm" not in results  # one validation file, one dev set
    assert {v for _, v in read_submission(out / "predict_results.tsv")} <= NLI3


@pytest.mark.slow
def test_max_predict_samples_on_a_test_file(tmp_path, tiny_mlm_checkpoint):
    train = write_rows(tmp_path / "train.csv", classification_rows())
    test = write_rows(tmp_path / "test.csv", [{"sentence": f"row {i}"} for i in range(9)])
    out = tmp_path / "out"
    glue_finetuning.main(["--model_name_or_path", str(tiny_mlm_checkpoint), "--train_file", str(train), "--test_file",
                        str(test), "--output_dir", str(out), "--max_predict_samples", "3", "--do_train",
                        "--max_steps", "1", "--save_strategy", "no", *PREDICT])
    assert [index for index, _ in read_submission(out / "predict_results.tsv")] == ["0", "1", "2"]
    with pytest.raises(ValueError, match="--max_predict_samples must be positive"):
        glue_finetuning.parse_args(["--task_name", "rte", "--max_predict_samples", "0", "--output_dir", "unused"])


# Bad data files: (file name, content, flags, expected fragment of the one-line error).
BAD_FILES = [
    ("empty.csv", "", "--train_file", r"--train_file .*empty.csv is empty"),
    ("header.csv", "sentence,label\n", "--train_file", r"--train_file .*header.csv has no data rows"),
    ("empty.json", "[]\n", "--train_file", r"empty.json has no data rows"),
    ("ids.csv", "id,label\n1,0\n2,1\n", "--train_file",
     r"ids.csv has no text column \(string values\) besides 'label'.*\['id'\] hold no text"),
    ("nolabel.csv", "sentence,score\na,1\nb,0\n", "--train_file", r"nolabel.csv lacks the column 'label'"),
    ("notes.txt", "a\n", "--train_file", r"--train_file .*notes.txt: a csv or json file is needed"),
    ("missing.csv", None, "--validation_file", r"--validation_file .*missing.csv: no such file"),
    ("other.csv", "text,label\nx,pos\n", "--validation_file",
     r"--validation_file .*other.csv lacks the text column 'sentence' \(taken from --train_file .*good.csv\)"),
    ("unseen.csv", "sentence,label\nx,maybe\n", "--validation_file",
     r"unseen.csv: column 'label' of data row 1 is 'maybe', not one of the labels \['neg', 'pos'\]"),
]


@pytest.mark.parametrize("name,content,flag,expected", BAD_FILES, ids=[row[0] for row in BAD_FILES])
def test_bad_data_files_give_one_line(tmp_path, tiny_mlm_checkpoint, capsys, name, content, flag, expected):
    good = write_rows(tmp_path / "good.csv", classification_rows(1))
    path = tmp_path / name
    if content is not None:
        path.write_text(content, encoding="utf-8")
    files = [flag, str(path)] + (["--train_file", str(good), "--do_eval"] if flag != "--train_file" else [])
    with pytest.raises(SystemExit) as exit_info:
        glue_finetuning.cli(["--model_name_or_path", str(tiny_mlm_checkpoint), *files, "--do_train",
                           "--output_dir", str(tmp_path / "out"), "--report_to", "none"])
    assert exit_info.value.code == 2
    err = capsys.readouterr().err.strip().splitlines()
    assert len(err) == 1 and err[0].startswith("finetune_glue.py: error: "), err
    import re

    assert re.search(expected, err[0]), err[0]
    assert not (tmp_path / "out").exists()  # refused before anything was written


# ----------------------------------------------------------------------------------------------------------------
# A mistyped local folder: one line naming it, no Hub error
# ----------------------------------------------------------------------------------------------------------------
def test_missing_local_model_folder(tmp_path, tiny_mlm_checkpoint, capsys, monkeypatch):
    glue_dir = write_task(tmp_path / "glue", "rte")
    args = ["--task_name", "rte", "--glue_dir", str(glue_dir), "--do_eval", "--output_dir", str(tmp_path / "out")]
    typo = str(tiny_mlm_checkpoint) + "m"
    with pytest.raises(SystemExit) as exit_info:
        glue_finetuning.cli(["--model_name_or_path", typo, *args])
    assert exit_info.value.code == 2
    err = capsys.readouterr().err.strip().splitlines()
    assert err == [f"finetune_glue.py: error: --model_name_or_path {typo!r}: no such local folder (did you mean "
                   f"{str(tiny_mlm_checkpoint)!r}?)."]
    # Relative paths, the tokenizer and the config flags, and a folder without config.json.
    monkeypatch.chdir(tmp_path)
    for flags, fragment in [(["--model_name_or_path", "mlm/sub/folder"], "'mlm/sub/folder': no such local folder"),
                            (["--model_name_or_path", "./mlmm"], "'./mlmm': no such local folder (did you mean 'mlm'"),
                            (["--model_name_or_path", "glue"], "'glue' is a folder without config.json"),
                            (["--config_name", "tiny.json", "--tokenizer_name", "mlm"], "--config_name 'tiny.json': "
                             "no such local folder"),
                            (["--config_name", "tiny", "--tokenizer_name", "./tok"], "--tokenizer_name './tok': no "
                             "such local folder")]:
        with pytest.raises(flag_checks.UsageError) as error:
            glue_finetuning.main([*flags, *args])
        assert fragment in str(error.value) and "\n" not in str(error.value)


@pytest.mark.parametrize("offline", [False, True], ids=["no-network", "HF_HUB_OFFLINE"])
def test_bare_model_id_is_looked_up_once_or_in_the_cache(tmp_path, monkeypatch, offline):
    """A bare name could be a Hub id: it is looked up once (no download retries), or not at all with HF_HUB_OFFLINE.
    When the Hub cannot answer, the local Hub cache decides; the refusal keeps the did-you-mean hint either way."""
    import huggingface_hub
    from huggingface_hub import constants

    def no_network(*args, **kwargs):
        raise OSError("[Errno -2] Name or service not known")

    monkeypatch.setattr(huggingface_hub, "model_info", no_network)
    monkeypatch.setattr(constants, "HF_HUB_OFFLINE", offline)
    monkeypatch.setattr(constants, "HF_HUB_CACHE", str(tmp_path / "hub_cache"))
    monkeypatch.chdir(tmp_path)
    (tmp_path / "mlm").mkdir()
    reason = "HF_HUB_OFFLINE is set" if offline else "Name or service not known"
    with pytest.raises(flag_checks.UsageError, match=rf"^--model_name_or_path 'mlmm' is not a local folder \(did you "
                                                   rf"mean 'mlm'\?\), and the Hub cannot be reached to look it up as "
                                                   rf"a model id \(.*{reason}"):
        flag_checks.check_local_source("mlmm", "--model_name_or_path")
    # Laid out as huggingface_hub's cache holds a downloaded model: accepted, transformers loads it from there.
    snapshot = tmp_path / "hub_cache" / "models--mlmm" / "snapshots" / ("0" * 40)
    snapshot.mkdir(parents=True)
    (snapshot / "config.json").write_text("{}")
    (tmp_path / "hub_cache" / "models--mlmm" / "refs").mkdir()
    (tmp_path / "hub_cache" / "models--mlmm" / "refs" / "main").write_text("0" * 40)
    flag_checks.check_local_source("mlmm", "--model_name_or_path")


def test_suite_refuses_missing_folder_and_bad_file_in_one_line(tmp_path, capsys):
    glue_dir = write_task(tmp_path / "glue", "rte")
    model = tmp_path / "model"
    model.mkdir()
    (model / "config.json").write_text("{}")
    base = ["--glue_dir", str(glue_dir), "--output_dir", str(tmp_path / "suite")]
    cases = [(["--model", f"tnn={model}x"], f"--model tnn= {str(model) + 'x'!r}: no such local folder (did you mean "
              f"{str(model)!r}?)."),
             (["--model", f"tnn={model}", "--glue_dir", str(tmp_path / "nope")], "--glue_dir"),
             (["--model", f"tnn={model}", "--tasks", "sst3"], "Unknown GLUE task 'sst3'")]
    for argv, fragment in cases:
        with pytest.raises(SystemExit) as exit_info:
            glue_suite.cli([*base, *argv])
        err = capsys.readouterr().err.strip().splitlines()
        assert exit_info.value.code == 2 and len(err) == 1 and fragment in err[0], err
        assert err[0].startswith("run_glue_suite.py: error: ")
    (glue_dir / "RTE" / "dev.tsv").write_text("index\tsentence1\tsentence2\n0\ta\tb\n")  # a test file in dev's place
    with pytest.raises(SystemExit):
        glue_suite.cli([*base, "--model", f"tnn={model}"])
    err = capsys.readouterr().err.strip().splitlines()
    assert len(err) == 1 and "RTE/dev.tsv does not match GLUE task 'rte'" in err[0] and "lacks ['label']" in err[0]


# ----------------------------------------------------------------------------------------------------------------
# Metrics of data files without a GLUE task (run_glue.py: accuracy, or mse for a float label)
# ----------------------------------------------------------------------------------------------------------------
def test_file_metrics_hand_computed():
    classify = glue_metrics.make_compute_metrics(None)
    logits = np.array([[2.0, -1.0], [0.1, 0.3], [5.0, 4.0]])  # argmax 0, 1, 0
    assert classify(EvalPrediction(predictions=logits, label_ids=np.array([0, 1, 1]))) == {"accuracy": 2 / 3}
    regress = glue_metrics.make_compute_metrics(None, regression=True)
    result = regress(EvalPrediction(predictions=np.array([[1.0], [2.0], [4.0]]), label_ids=np.array([1.0, 3.0, 2.0])))
    assert result == {"mse": pytest.approx((0 + 1 + 4) / 3)}
    # A GLUE task keeps its own metrics whatever ``regression`` says.
    assert set(glue_metrics.make_compute_metrics("stsb")(EvalPrediction(
        predictions=np.array([[1.0], [2.0], [4.0]]), label_ids=np.array([1.0, 3.0, 2.0])))) == {
        "pearson", "spearmanr", "combined_score"}


def test_hub_dataset_unreachable_is_one_line(tmp_path, tiny_mlm_checkpoint, monkeypatch):
    import datasets

    def offline(*args, **kwargs):
        raise ConnectionError("Couldn't reach 'nyu-mll/glue' on the Hub (LocalEntryNotFoundError)")

    monkeypatch.setattr(datasets, "load_dataset", offline)
    with pytest.raises(flag_checks.UsageError, match=r"--dataset_name 'nyu-mll/glue' \(config 'rte'\) could not be "
                                                   r"loaded: Couldn't reach .*give --glue_dir"):
        glue_finetuning.main(["--model_name_or_path", str(tiny_mlm_checkpoint), "--task_name", "rte", "--do_eval",
                            "--output_dir", str(tmp_path / "out"), "--report_to", "none"])
