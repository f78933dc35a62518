"""Training on LRA ListOps with ``transformers.Trainer``: the arguments, the models (a bidirectional
``TnnForSequenceClassification`` per mixer, or a ``BertForSequenceClassification`` of matched parameter count),
accuracy, the learning-curve plot and the summary table of several runs."""

from __future__ import annotations

import json
import os
from collections.abc import Sequence
from dataclasses import dataclass, field
from pathlib import Path

import numpy as np
from transformers import BertConfig, BertForSequenceClassification, EvalPrediction, PreTrainedModel

from ... import TnnForSequenceClassification, load_preset
from .data import MAX_LENGTH, NUM_CLASSES

MODEL_CHOICES: tuple[str, ...] = ("tnn-dense", "tnn-fd", "tnn-ski", "bert")
BERT_POSITIONS = 2048  # BERT's position table: LRA ListOps rows are < 2000 tokens, plus [CLS]


@dataclass
class ListOpsArguments:
    """The task's and the model's flags (TrainingArguments holds the optimisation ones)."""

    data_dir: str = field(metadata={"help": "folder holding basic_{train,val,test}.tsv (run_scripts/make_listops.py)"})
    model: str = field(default="tnn-dense", metadata={"help": f"one of {list(MODEL_CHOICES)}"})
    preset: str = field(default="lra_listops", metadata={
        "help": "TNN preset (name, JSON file or folder); BERT is sized to match the TNN built from it"})
    config_overrides: str | None = field(default=None, metadata={
        "help": "TnnConfig fields to override, e.g. 'hidden_size=64,num_hidden_layers=2' (applies to BERT's match)"})
    max_length: int = field(default=MAX_LENGTH, metadata={"help": "tokens per row at most, [CLS] included"})
    max_train_samples: int | None = field(default=None, metadata={"help": "use the first N training rows"})
    max_eval_samples: int | None = field(default=None, metadata={
        "help": "use the first N validation rows for the evaluations during training (the final one uses all)"})
    max_test_samples: int | None = field(default=None, metadata={"help": "use the first N test rows"})
    num_threads: int | None = field(default=None, metadata={"help": "torch.set_num_threads (default: torch's)"})
    bert_heads_dim: int = field(default=32, metadata={"help": "BERT's width per attention head"})

    def __post_init__(self) -> None:
        if self.model not in MODEL_CHOICES:
            raise ValueError(f"model must be one of {list(MODEL_CHOICES)}, got {self.model!r}")
        if not 2 <= self.max_length <= BERT_POSITIONS:
            raise ValueError(f"max_length must be in [2, {BERT_POSITIONS}], got {self.max_length}")
        for name in ("max_train_samples", "max_eval_samples", "max_test_samples", "num_threads"):
            value = getattr(self, name)
            if value is not None and value < 1:
                raise ValueError(f"{name} must be >= 1 or unset, got {value}")


def parameter_count(model: PreTrainedModel) -> int:
    """Trainable parameters."""
    return sum(p.numel() for p in model.parameters() if p.requires_grad)


def build_tnn(args: ListOpsArguments, vocab_size: int, pad_token_id: int, token_mixer: str = "dense"):
    """A bidirectional ``TnnForSequenceClassification`` with 10 classes from ``args.preset``."""
    config = load_preset(args.preset, token_mixer=token_mixer, vocab_size=vocab_size, pad_token_id=pad_token_id,
                         num_labels=NUM_CLASSES, causal=False)
    if args.config_overrides:
        config.update_from_string(args.config_overrides)
    return TnnForSequenceClassification(config)


def bert_parameter_count(hidden: int, layers: int, intermediate: int, vocab_size: int,
                         positions: int = BERT_POSITIONS, num_labels: int = NUM_CLASSES) -> int:
    """Trainable parameters of ``BertForSequenceClassification`` (one token type, pooler, linear classifier)."""
    embeddings = (vocab_size + positions + 1) * hidden + 2 * hidden
    layer = 4 * (hidden * hidden + hidden) + 2 * hidden + 2 * hidden * intermediate + intermediate + hidden + 2 * hidden
    return embeddings + layers * layer + hidden * hidden + hidden + hidden * num_labels + num_labels


def match_bert_sizes(target: int, hidden: int, layers: int, vocab_size: int, heads_dim: int = 32
                     ) -> tuple[int, int, int]:
    """BERT (hidden, layers, intermediate) with about ``target`` parameters: the TNN's depth and width if an
    intermediate size between 1x and 4x the width fits, otherwise the nearest depth / narrower width that does
    (BERT's 2048-row position table and attention weights cost more than a small TNN's layers)."""
    best = None
    for width in range(hidden, heads_dim - 1, -heads_dim):
        for depth in range(layers, 0, -1):
            fixed = bert_parameter_count(width, depth, 0, vocab_size)
            per_unit = depth * (2 * width + 1)
            intermediate = round((target - fixed) / per_unit)
            if width <= intermediate <= 4 * width:
                # nearest to the TNN's shape: depth first, then width
                key = (layers - depth, hidden - width)
                if best is None or key < best[0]:
                    best = (key, (width, depth, intermediate))
    if best is None:
        raise ValueError(f"no BERT of width <= {hidden} (multiples of {heads_dim}) and depth <= {layers} matches "
                         f"{target} parameters with an intermediate size of 1x to 4x its width")
    return best[1]


def build_matched_bert(target_parameters: int, args: ListOpsArguments, tnn_config, vocab_size: int,
                       pad_token_id: int) -> BertForSequenceClassification:
    """A ``BertForSequenceClassification`` (sdpa attention, 2048 positions) sized to ``target_parameters``."""
    hidden, layers, intermediate = match_bert_sizes(target_parameters, tnn_config.hidden_size,
                                                    tnn_config.num_hidden_layers, vocab_size, args.bert_heads_dim)
    config = BertConfig(
        vocab_size=vocab_size, hidden_size=hidden, num_hidden_layers=layers,
        num_attention_heads=max(1, hidden // args.bert_heads_dim), intermediate_size=intermediate,
        max_position_embeddings=BERT_POSITIONS, type_vocab_size=1, pad_token_id=pad_token_id,
        hidden_dropout_prob=tnn_config.dropout, attention_probs_dropout_prob=tnn_config.dropout,
        num_labels=NUM_CLASSES, attn_implementation="sdpa")
    model = BertForSequenceClassification(config)
    assert parameter_count(model) == bert_parameter_count(hidden, layers, intermediate, vocab_size)
    return model


def build_model(args: ListOpsArguments, vocab_size: int, pad_token_id: int) -> tuple[PreTrainedModel, dict]:
    """The model ``args.model`` names and a dict of sizes: its parameter count and the TNN's it is matched to."""
    if args.model.startswith("tnn-"):
        model = build_tnn(args, vocab_size, pad_token_id, args.model.removeprefix("tnn-"))
        count = parameter_count(model)
        return model, {"parameters": count, "tnn_parameters": count}
    tnn = build_tnn(args, vocab_size, pad_token_id, "dense")  # every mixer of a preset has nearly the same count
    target = parameter_count(tnn)
    model = build_matched_bert(target, args, tnn.config, vocab_size, pad_token_id)
    count = parameter_count(model)
    return model, {"parameters": count, "tnn_parameters": target, "bert_vs_tnn": count / target,
                   "bert_sizes": {k: getattr(model.config, k) for k in (
                       "hidden_size", "num_hidden_layers", "num_attention_heads", "intermediate_size")}}


def preprocess_logits_for_metrics(logits, labels):
    """Keep the predicted class only (the Trainer then gathers ids, not logits)."""
    if isinstance(logits, tuple):
        logits = logits[0]
    return logits.argmax(dim=-1)


def compute_metrics(prediction: EvalPrediction) -> dict[str, float]:
    """Accuracy of predicted class ids against the labels."""
    predictions = np.asarray(prediction.predictions).reshape(-1)
    labels = np.asarray(prediction.label_ids).reshape(-1)
    return {"accuracy": float((predictions == labels).mean()) if labels.size else float("nan")}


def curves(log_history: Sequence[dict]) -> dict[str, list]:
    """Train loss and validation accuracy against the step, from ``Trainer.state.log_history``."""
    loss = [(e["step"], e["loss"]) for e in log_history if "loss" in e and "eval_loss" not in e]
    accuracy = [(e["step"], e["eval_accuracy"]) for e in log_history if "eval_accuracy" in e]
    return {"loss_steps": [s for s, _ in loss], "loss": [v for _, v in loss],
            "accuracy_steps": [s for s, _ in accuracy], "accuracy": [v for _, v in accuracy]}


def plot_learning_curves(runs: dict[str, dict[str, list]], path: str | Path, title: str = "ListOps") -> None:
    """One PNG: train loss (left) and validation accuracy (right) against the step, a line per run."""
    import matplotlib

    matplotlib.use("Agg")
    import matplotlib.pyplot as plt

    figure, (left, right) = plt.subplots(1, 2, figsize=(11, 4))
    for name, curve in runs.items():
        left.plot(curve["loss_steps"], curve["loss"], label=name)
        right.plot(curve["accuracy_steps"], curve["accuracy"], marker="o", label=name)
    right.axhline(0.1, color="grey", linestyle=":", label="chance (0.1)")
    left.set(xlabel="step", ylabel="train loss", title=f"{title}: train loss")
    right.set(xlabel="step", ylabel="validation accuracy", title=f"{title}: validation accuracy")
    for axis in (left, right):
        axis.grid(alpha=0.3)
        axis.legend()
    figure.tight_layout()
    figure.savefig(path, dpi=110)
    plt.close(figure)


def machine_load() -> dict[str, float]:
    """1-minute load average and the CPU count (what other work shared the machine)."""
    return {"load_avg_1min": os.getloadavg()[0], "cpu_count": os.cpu_count() or 0}


def majority_class_accuracy(data_dir: str | Path, train_rows: int | None = None) -> float:
    """Test accuracy of always predicting the most common class of the (first ``train_rows``) training rows: what a
    model that learned only the label prior scores."""
    from collections import Counter

    from .data import read_tsv, split_file

    train = read_tsv(split_file(data_dir, "train"))[:train_rows]
    test = read_tsv(split_file(data_dir, "test"))
    majority = Counter(target for _, target in train).most_common(1)[0][0]
    return sum(target == majority for _, target in test) / len(test)


def summarize_runs(run_dirs: Sequence[str | Path], output_dir: str | Path, data_dir: str | Path | None = None
                   ) -> dict:
    """Collect ``all_results.json`` and the learning curves of several runs into ``listops_results.{json,md}``
    and ``learning_curves.png`` under ``output_dir``; with ``data_dir``, a last row gives the majority-class
    accuracy on its test split (the training rows' most common class, the first run's row count)."""
    output_dir = Path(output_dir)
    output_dir.mkdir(parents=True, exist_ok=True)
    rows, plots = [], {}
    for run_dir in map(Path, run_dirs):
        results = json.loads((run_dir / "all_results.json").read_text())
        state = json.loads((run_dir / "trainer_state.json").read_text())
        name = results.get("run_model", run_dir.name)
        plots[name] = curves(state["log_history"])
        rows.append({"model": name, "results": results, "curves": plots[name]})
    lines = ["| model | parameters | test accuracy | best val accuracy (step) | steps | batch | train wall time "
             "(of it periodic val) | load avg (1 min) at start / end |", "|---|---|---|---|---|---|---|---|"]
    for row in rows:
        r, c = row["results"], row["curves"]
        best = max(zip(c["accuracy"], [-step for step in c["accuracy_steps"]]), default=(float("nan"), 0))
        best = (best[0], -best[1])  # the first step that reached the best accuracy
        lines.append(
            f"| {row['model']} | {r['run_parameters']:,} | {100 * r['test_accuracy']:.2f} | {100 * best[0]:.2f} "
            f"({best[1]}) | {r['run_steps']} | {r['run_batch']} | {r['train_runtime'] / 60:.1f} min "
            f"({r['run_periodic_eval_seconds'] / 60:.1f} min) | {r['run_load_start']:.2f} / {r['run_load_end']:.2f} |")
    summary: dict = {"runs": rows}
    if data_dir is not None and rows:
        majority = majority_class_accuracy(data_dir, rows[0]["results"].get("run_train_rows"))
        summary["majority_class_test_accuracy"] = majority
        lines.append(f"| majority class (no model) | 0 | {100 * majority:.2f} | | | | | |")
    table = "\n".join(lines) + "\n"
    (output_dir / "listops_results.md").write_text(table)
    (output_dir / "listops_results.json").write_text(json.dumps(summary, indent=2) + "\n")
    plot_learning_curves(plots, output_dir / "learning_curves.png")
    return {"table": table, **summary}
