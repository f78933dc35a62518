"""Reading a training output folder for publishing: what it holds (model, tokenizer, results, logs, plots) and the
model-index results its card reports."""

from __future__ import annotations

import json
import logging
import math
import re
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

from ..common.run_files import (
    BENCHMARK_FILE,
    CONFIG_FILE,
    EVAL_RESULTS_FILE,
    METRICS_FILE,
    RESULTS_FILE,
    TOKENIZER_FILES,
    TRAIN_RESULTS_FILE,
    TRAINER_STATE,
    WEIGHT_FILE,
    WEIGHT_INDEX,
    BenchmarkRecord,
    BenchmarkScore,
)

logger = logging.getLogger(__name__)
PIPELINE_TAGS = {"TnnForCausalLM": "text-generation", "TnnForMaskedLM": "fill-mask",
                 "TnnForSequenceClassification": "text-classification", "TnnModel": "feature-extraction"}
HEAD_AUTO_CLASS = {"TnnForCausalLM": "AutoModelForCausalLM", "TnnForMaskedLM": "AutoModelForMaskedLM",
                   "TnnForSequenceClassification": "AutoModelForSequenceClassification", "TnnModel": "AutoModel"}
METRIC_NAMES = {"perplexity": "Perplexity", "loss": "Cross-entropy loss (nats per token)", "accuracy": "Accuracy",
                "f1": "F1", "matthews_correlation": "Matthews correlation", "pearson": "Pearson correlation",
                "spearmanr": "Spearman correlation", "combined_score": "Combined score"}
# Trainer's bookkeeping numbers in eval_results.json: not scores.
NOT_SCORES = ("eval_loss", "eval_runtime", "eval_samples_per_second", "eval_steps_per_second", "eval_samples",
              "epoch", "eval_model_preparation_time")


class PublishError(ValueError):
    """A run folder or an option that cannot be published; the message names the file or flag."""


@dataclass
class DatasetRef:
    """The data the reported metrics were measured on. ``hub_id`` is a Hub dataset id (listed in the card's
    ``datasets`` metadata); ``name`` is what readers see; ``config``/``split`` describe the evaluation split."""

    hub_id: str | None = None
    name: str | None = None
    config: str | None = None
    split: str | None = None

    @property
    def model_index_type(self) -> str | None:
        """``dataset.type`` of the model-index: the Hub id, else a slug of the display name (local data)."""
        if self.hub_id:
            return self.hub_id
        return re.sub(r"[^a-z0-9]+", "-", self.name.lower()).strip("-") if self.name else None


@dataclass
class RunInfo:
    """What :func:`inspect_run` learnt about a run folder."""

    path: Path
    config: dict[str, Any]
    architecture: str
    results_file: Path
    results: dict[str, Any]
    metrics_log: list[dict[str, Any]] = field(default_factory=list)
    train_results: dict[str, Any] = field(default_factory=dict)
    trainer_state: dict[str, Any] = field(default_factory=dict)
    weight_files: list[str] = field(default_factory=list)
    tokenizer_files: list[str] = field(default_factory=list)
    plot_files: list[Path] = field(default_factory=list)
    benchmark: BenchmarkRecord | None = None  # the benchmark task of a classifier's run (benchmark.json)

    @property
    def causal(self) -> bool:
        return bool(self.config.get("causal"))

    @property
    def pipeline_tag(self) -> str:
        return PIPELINE_TAGS[self.architecture]

    @property
    def num_parameters(self) -> int | None:
        """From the results file when it records it (train_clm.py / train_mlm.py), else counted in the saved
        weights (tied weights are stored once, so they count once)."""
        recorded = self.results.get("num_parameters")
        if isinstance(recorded, int):
            return recorded
        from safetensors import safe_open

        total = 0
        for name in self.weight_files:
            if name.endswith(".safetensors"):
                with safe_open(str(self.path / name), "pt") as handle:
                    total += sum(math.prod(handle.get_slice(key).get_shape()) for key in handle.keys())
        return total or None


def _read_json(path: Path) -> dict[str, Any]:
    try:
        value = json.loads(path.read_text())
    except json.JSONDecodeError as error:
        raise PublishError(f"{path} is not valid JSON ({error}).") from None
    if not isinstance(value, dict):
        raise PublishError(f"{path} should hold a JSON object, found {type(value).__name__}.")
    return value


def read_metrics_log(path: Path) -> list[dict[str, Any]]:
    """The entries of a ``metrics.jsonl`` file; a line cut short by a crash is skipped with a warning."""
    entries = []
    for number, line in enumerate(path.read_text().splitlines(), 1):
        if not line.strip():
            continue
        try:
            entries.append(json.loads(line))
        except json.JSONDecodeError:
            logger.warning("%s:%d is not valid JSON; skipped.", path, number)
    return entries


def inspect_run(run_dir: str | Path) -> RunInfo:
    """Read and check a training output folder. Raises :class:`PublishError` naming the problem when the folder,
    ``config.json``, the weights, the results file or the tokenizer is missing, or when the model is not a TNN."""
    path = Path(run_dir)
    if not path.is_dir():
        raise PublishError(f"RUN_DIR {path} is not a folder.")
    config_file = path / CONFIG_FILE
    if not config_file.is_file():
        raise PublishError(f"{config_file} not found: RUN_DIR must be a saved model folder (the --output_dir of "
                           "train_clm.py, train_mlm.py or finetune_glue.py).")
    config = _read_json(config_file)
    if config.get("model_type") != "tnn":
        raise PublishError(f"{config_file} has model_type {config.get('model_type')!r}: publish.py publishes TNN "
                           "models (model_type 'tnn') only.")
    architectures = config.get("architectures") or []
    if len(architectures) != 1 or architectures[0] not in PIPELINE_TAGS:
        raise PublishError(f"{config_file}: 'architectures' should name one of {sorted(PIPELINE_TAGS)}, "
                           f"found {architectures!r}.")
    architecture = architectures[0]

    if (path / WEIGHT_FILE).is_file():
        weight_files = [WEIGHT_FILE]
    elif (path / WEIGHT_INDEX).is_file():
        shards = sorted(set(_read_json(path / WEIGHT_INDEX).get("weight_map", {}).values()))
        missing = [name for name in shards if not (path / name).is_file()]
        if not shards or missing:
            raise PublishError(f"{path / WEIGHT_INDEX} lists missing weight shards: {missing or 'none listed'}.")
        weight_files = [WEIGHT_INDEX, *shards]
    else:
        found = sorted(p.name for p in path.glob("*.bin")) + sorted(p.name for p in path.glob("*.pt"))
        hint = f" (found {', '.join(found)}: save with safetensors)" if found else ""
        raise PublishError(f"no weights in {path}: expected {WEIGHT_FILE} or {WEIGHT_INDEX}{hint}.")

    if architecture == "TnnForSequenceClassification":
        results_file = path / EVAL_RESULTS_FILE
        if not results_file.is_file() and (path / RESULTS_FILE).is_file():
            results_file = path / RESULTS_FILE  # Trainer writes both; all_results.json also holds eval_*
        if not results_file.is_file():
            raise PublishError(f"no results file in {path}: expected eval_results.json (written by "
                               "finetune_glue.py --do_eval); the model-index is read from it, never typed by hand.")
    else:
        results_file = path / RESULTS_FILE
        if not results_file.is_file():
            raise PublishError(f"no results file in {path}: expected all_results.json (written by train_clm.py / "
                               "train_mlm.py at the end of training); the model-index is read from it.")
    results = _read_json(results_file)

    tokenizer_files = [name for name in TOKENIZER_FILES if (path / name).is_file()]
    if "tokenizer_config.json" not in tokenizer_files:
        raise PublishError(f"no tokenizer in {path}: expected tokenizer_config.json (and tokenizer.json); save the "
                           "tokenizer beside the model so that Hub users can load both.")

    info = RunInfo(path=path, config=config, architecture=architecture, results_file=results_file, results=results,
                   weight_files=weight_files, tokenizer_files=tokenizer_files,
                   plot_files=sorted(path.glob("*.png")))
    if (path / METRICS_FILE).is_file():
        info.metrics_log = read_metrics_log(path / METRICS_FILE)
    if (path / TRAIN_RESULTS_FILE).is_file():
        info.train_results = _read_json(path / TRAIN_RESULTS_FILE)
    if (path / TRAINER_STATE).is_file():
        info.trainer_state = _read_json(path / TRAINER_STATE)
    if architecture == "TnnForSequenceClassification" and (path / BENCHMARK_FILE).is_file():
        try:
            info.benchmark = BenchmarkRecord.from_dict(_read_json(path / BENCHMARK_FILE))
        except (KeyError, TypeError) as error:
            raise PublishError(f"{path / BENCHMARK_FILE} is not a benchmark record ({error!r}).") from None
    eval_results_from_run(info, DatasetRef(name="check"))  # fail now, not after building, on a bad results file
    return info


def _number(value: Any, where: str) -> float:
    if isinstance(value, bool) or not isinstance(value, (int, float)) or not math.isfinite(value):
        raise PublishError(f"{where} should be a finite number, found {value!r}.")
    return value


def eval_results_from_run(info: RunInfo, dataset: DatasetRef) -> list[Any]:
    """The card's ``eval_results`` (``huggingface_hub.EvalResult``), every value read from ``info.results_file``.

    Language models: ``perplexity`` and ``eval_loss`` of ``all_results.json``, plus the perplexity at every length of
    its ``eval_lengths`` table. Classifiers: the task's metrics (``eval_accuracy``, ``eval_f1``, ...) of
    ``eval_results.json``; for a benchmark run (a ``benchmark.json`` in the folder, e.g. GLUE's) the record's dataset,
    config, scores and splits.
    """
    from huggingface_hub import EvalResult

    results, source = info.results, info.results_file.name
    out: list[EvalResult] = []
    if info.architecture == "TnnForSequenceClassification":
        benchmark = info.benchmark
        if benchmark is not None:
            scores = list(benchmark.scores)
        else:
            scores = [BenchmarkScore(key=key, metric=key[len("eval_"):], split=dataset.split)
                      for key in results if key.startswith("eval_") and key not in NOT_SCORES]
        keys = [score.key for score in scores]
        missing = [key for key in keys if key not in results]
        if missing or not keys:
            raise PublishError(f"{info.results_file} lacks the evaluation metrics {missing or ['eval_*']}: was the "
                               "run finished with --do_eval?")
        for score in scores:
            key, metric, split = score.key, score.metric, score.split
            if benchmark is not None:
                ref_type, ref_name, ref_config = benchmark.dataset, benchmark.name, benchmark.config
            else:
                ref_type, ref_name, ref_config = dataset.model_index_type, dataset.name, dataset.config
            if not ref_type:
                raise PublishError("the model-index needs a dataset: pass --dataset (a Hub dataset id) and/or "
                                   "--dataset_name for a classifier that is not a GLUE run.")
            out.append(EvalResult(task_type="text-classification", task_name="Text classification",
                                  dataset_type=ref_type, dataset_name=ref_name, dataset_config=ref_config,
                                  dataset_split=split, metric_type=metric,
                                  metric_name=METRIC_NAMES.get(metric, metric),
                                  metric_value=_number(results[key], f"{source}: {key}")))
        return out

    for key in ("perplexity", "eval_loss"):
        if key not in results:
            raise PublishError(f"{info.results_file} has no {key!r}: was the run finished (train_clm.py / "
                               "train_mlm.py write it after the final evaluation)?")
    if not dataset.model_index_type:
        raise PublishError("the model-index needs the evaluation data's name: pass --dataset (a Hub dataset id, "
                           "e.g. Salesforce/wikitext) and/or --dataset_name (e.g. 'Tiny Shakespeare').")
    task_type, task_name = (("text-generation", "Causal language modeling") if info.causal
                            else ("fill-mask", "Masked language modeling"))
    common = dict(task_type=task_type, task_name=task_name, dataset_type=dataset.model_index_type,
                  dataset_name=dataset.name or dataset.hub_id, dataset_config=dataset.config,
                  dataset_split=dataset.split)
    scored = "" if info.causal else " (masked tokens)"  # an MLM scores only its masked positions
    out.append(EvalResult(metric_type="perplexity", metric_name=METRIC_NAMES["perplexity"] + scored,
                          metric_value=_number(results["perplexity"], f"{source}: perplexity"), **common))
    out.append(EvalResult(metric_type="loss", metric_name=METRIC_NAMES["loss"] + scored,
                          metric_value=_number(results["eval_loss"], f"{source}: eval_loss"), **common))
    for length, values in sorted((results.get("eval_lengths") or {}).items(), key=lambda item: int(item[0])):
        out.append(EvalResult(metric_type="perplexity", metric_name=f"Perplexity at {int(length):,} tokens",
                              metric_config=f"length_{int(length)}",
                              metric_value=_number(values.get("perplexity"), f"{source}: eval_lengths.{length}"),
                              **common))
    return out
