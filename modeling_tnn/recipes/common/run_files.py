"""The names of what a run folder holds, written by one recipe group and read by another (the pretraining and GLUE
runs write them, the Hub code reads them), and the benchmark record a finetuning run leaves for its model card."""

from __future__ import annotations

import json
from dataclasses import asdict, dataclass
from pathlib import Path

CONFIG_FILE = "config.json"
WEIGHT_FILE = "model.safetensors"
WEIGHT_INDEX = "model.safetensors.index.json"
# Every file a tokenizer's save_pretrained may write.
TOKENIZER_FILES = ("tokenizer.json", "tokenizer_config.json", "special_tokens_map.json", "added_tokens.json",
                   "vocab.json", "merges.txt", "vocab.txt", "tokenizer.model", "spiece.model",
                   "sentencepiece.bpe.model", "chat_template.jinja")
METRICS_FILE = "metrics.jsonl"  # one JSON line per logged step (pretraining)
RESULTS_FILE = "all_results.json"  # the final results (pretraining; Trainer's all splits)
EVAL_RESULTS_FILE = "eval_results.json"  # Trainer's evaluation results
TRAIN_RESULTS_FILE = "train_results.json"
TRAINER_STATE = "trainer_state.json"  # Trainer's log history; in a pretraining checkpoint, written last
LENGTHS_PLOT = "eval_lengths.png"  # perplexity by evaluation length (pretraining)
PREDICTIONS_FILE = "predict_results.tsv"  # the predictions of a --test_file (GLUE test sets use the GLUE names)
BENCHMARK_FILE = "benchmark.json"  # a finetuning run's benchmark task: see BenchmarkRecord


@dataclass(frozen=True)
class BenchmarkScore:
    """One score of a benchmark run: the key in the results file, the metric it measures, the split it was
    measured on."""

    key: str
    metric: str
    split: str


@dataclass(frozen=True)
class BenchmarkRecord:
    """What a model card needs about the benchmark task a classifier was finetuned on, written into the run folder
    by the finetuning (``finetune_glue.py --task_name``) so that publishing needs no knowledge of the benchmark.

    ``dataset`` is the Hub dataset id (``nyu-mll/glue``), ``config`` its task config (``rte``), ``name`` what readers
    see (``GLUE RTE``); ``scores`` are the results a finished run must report; ``text_pair`` says whether an example
    is a pair of texts.
    """

    dataset: str
    config: str
    name: str
    scores: tuple[BenchmarkScore, ...]
    text_pair: bool = False

    def write(self, run_dir: str | Path) -> Path:
        """Write the record as ``run_dir/benchmark.json``; returns the file."""
        path = Path(run_dir) / BENCHMARK_FILE
        path.write_text(json.dumps(asdict(self), indent=2) + "\n")
        return path

    @classmethod
    def from_dict(cls, value: dict) -> BenchmarkRecord:
        """The record of a parsed ``benchmark.json``; ``KeyError`` / ``TypeError`` on a malformed one."""
        scores = tuple(BenchmarkScore(**score) for score in value["scores"])
        return cls(dataset=value["dataset"], config=value["config"], name=value["name"], scores=scores,
                   text_pair=bool(value.get("text_pair", False)))
