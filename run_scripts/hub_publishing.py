"""Turn a TNN training output folder into a Hub-ready model repository folder, write its model card, and upload it.

This module holds all the publishing logic; ``publish.py`` is its command line and the training scripts can call
:func:`publish_run` directly (for example behind their ``--push_to_hub`` flag). The steps:

1. :func:`inspect_run` reads and checks a run folder (``train_clm.py`` / ``train_mlm.py`` output with
   ``all_results.json``, or a ``finetune_glue.py`` Trainer output with ``eval_results.json``) and fails with a
   :class:`PublishError` naming the missing file before anything is built or uploaded.
2. :func:`build_hub_folder` copies only what a model repository needs, by name (never a glob over the run folder):
   ``config.json`` (with an ``auto_map`` of every Auto class the shipped code defines), the model code, ``model.safetensors``, the tokenizer files,
   ``generation_config.json`` for causal models, the run's plots under ``plots/``, and ``README.md``: a model card
   built with ``huggingface_hub.ModelCard``/``ModelCardData`` whose ``model-index`` is read from the run's results
   file. :func:`check_folder` then compares the folder's file list with :data:`ALLOWED_PATTERNS`.
3. :func:`upload_folder` creates the repository when needed and uploads the folder with ONE
   ``HfApi().upload_folder`` call. The token is never read, passed or printed here: huggingface_hub finds it itself
   (``HF_TOKEN`` or ``hf auth login``).
"""

from __future__ import annotations

import fnmatch
import json
import logging
import math
import re
import shutil
import sys
from collections.abc import Iterable, Sequence
from dataclasses import dataclass, field
from pathlib import Path, PurePosixPath
from typing import Any

HERE = Path(__file__).resolve().parent
sys.path.insert(0, str(HERE))
from modeling_tnn.modeling_tnn import AUTO_MAP  # noqa: E402  (every Auto class a TNN folder can expose)
import glue_data  # noqa: E402  (the GLUE task table: dataset names, splits, metrics, text columns)

logger = logging.getLogger(__name__)

# ----------------------------------------------------------------------------------------------------------------
# What a model repository may hold
# ----------------------------------------------------------------------------------------------------------------
TOKENIZER_FILES = ("tokenizer.json", "tokenizer_config.json", "special_tokens_map.json", "added_tokens.json",
                   "vocab.json", "merges.txt", "vocab.txt", "tokenizer.model", "spiece.model",
                   "sentencepiece.bpe.model", "chat_template.jinja")
WEIGHT_FILE = "model.safetensors"
WEIGHT_INDEX = "model.safetensors.index.json"
PLOTS_DIR = "plots"
# The allow-list: top-level file patterns, plus PNG plots one level down in plots/. Everything else (optimizer and
# scheduler states, RNG states, checkpoints, training_args.bin, trainer_state.json, metrics and logs, caches, ...)
# is refused by check_folder. "*.py" is narrowed further by build_hub_folder to the model code's import closure.
ALLOWED_PATTERNS = ("README.md", "config.json", "generation_config.json", WEIGHT_FILE, WEIGHT_INDEX,
                    "model-[0-9][0-9][0-9][0-9][0-9]-of-[0-9][0-9][0-9][0-9][0-9].safetensors", "*.py",
                    *TOKENIZER_FILES, f"{PLOTS_DIR}/*.png")

PIPELINE_TAGS = {"TnnForCausalLM": "text-generation", "TnnForMaskedLM": "fill-mask",
                 "TnnForSequenceClassification": "text-classification", "TnnModel": "feature-extraction"}
HEAD_AUTO_CLASS = {"TnnForCausalLM": "AutoModelForCausalLM", "TnnForMaskedLM": "AutoModelForMaskedLM",
                   "TnnForSequenceClassification": "AutoModelForSequenceClassification", "TnnModel": "AutoModel"}
MIXER_TAGS = {"dense": "tnn-dense", "fd": "fd-tnn", "ski": "ski-tnn"}
MIXER_TEXT = {
    "dense": "the original TNN token mixer (Qin et al., ICLR 2023, arXiv:2305.04749): a Toeplitz matrix whose "
             "entries come from a small relative-position MLP (RPE) times an exponential decay, applied by FFT in "
             "O(n log n)",
    "fd": "the FD-TNN token mixer (arXiv:2305.09028): the RPE gives the frequency response directly (causal kernels "
          "through a discrete Hilbert transform), sampled on a fixed grid of `2 * fd_kernel_length` points",
    "ski": "the SKI-TNN token mixer (arXiv:2305.09028): a short band convolution plus a low-rank structured kernel "
           "interpolation of the Toeplitz kernel, O(n) (bidirectional only)",
}
METRIC_NAMES = {"perplexity": "Perplexity", "loss": "Cross-entropy loss (nats per token)", "accuracy": "Accuracy",
                "f1": "F1", "matthews_correlation": "Matthews correlation", "pearson": "Pearson correlation",
                "spearmanr": "Spearman correlation", "combined_score": "Combined score"}
# Trainer's bookkeeping numbers in eval_results.json: not scores.
NOT_SCORES = ("eval_loss", "eval_runtime", "eval_samples_per_second", "eval_steps_per_second", "eval_samples",
              "epoch", "eval_model_preparation_time")
DEFAULT_EXAMPLES = {"text-generation": "Once upon a time", "fill-mask": "The capital of France is {mask}.",
                    "text-classification": "This film was a delight from start to finish.",
                    "feature-extraction": "Toeplitz matrices are constant along each diagonal."}
DEFAULT_PAIR_EXAMPLE = ("The cat sat on the mat.", "A cat was sitting on the mat.")
REPO_ID_RE = re.compile(r"^[A-Za-z0-9][A-Za-z0-9._-]*/[A-Za-z0-9][A-Za-z0-9._-]*$")


class PublishError(ValueError):
    """A run folder or an option that cannot be published; the message names the file or flag."""


# ----------------------------------------------------------------------------------------------------------------
# Reading a run folder
# ----------------------------------------------------------------------------------------------------------------
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

    @property
    def glue_task(self) -> glue_data.GlueTask | None:
        """The GLUE task of a ``finetune_glue.py`` run (``config.finetuning_task``), else ``None``."""
        name = self.config.get("finetuning_task")
        if self.architecture != "TnnForSequenceClassification" or not name:
            return None
        try:
            return glue_data.get_task(name)
        except ValueError:
            return None


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
    config_file = path / "config.json"
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
        results_file = path / "eval_results.json"
        if not results_file.is_file() and (path / "all_results.json").is_file():
            results_file = path / "all_results.json"  # Trainer writes both; all_results.json also holds eval_*
        if not results_file.is_file():
            raise PublishError(f"no results file in {path}: expected eval_results.json (written by "
                               "finetune_glue.py --do_eval); the model-index is read from it, never typed by hand.")
    else:
        results_file = path / "all_results.json"
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
    if (path / "metrics.jsonl").is_file():
        info.metrics_log = read_metrics_log(path / "metrics.jsonl")
    if (path / "train_results.json").is_file():
        info.train_results = _read_json(path / "train_results.json")
    if (path / "trainer_state.json").is_file():
        info.trainer_state = _read_json(path / "trainer_state.json")
    eval_results_from_run(info, DatasetRef(name="check"))  # fail now, not after building, on a bad results file
    return info


# ----------------------------------------------------------------------------------------------------------------
# The model-index, read from the results file
# ----------------------------------------------------------------------------------------------------------------
def _number(value: Any, where: str) -> float:
    if isinstance(value, bool) or not isinstance(value, (int, float)) or not math.isfinite(value):
        raise PublishError(f"{where} should be a finite number, found {value!r}.")
    return value


def eval_results_from_run(info: RunInfo, dataset: DatasetRef) -> list[Any]:
    """The card's ``eval_results`` (``huggingface_hub.EvalResult``), every value read from ``info.results_file``.

    Language models: ``perplexity`` and ``eval_loss`` of ``all_results.json``, plus the perplexity at every length of
    its ``eval_lengths`` table. Classifiers: the task's metrics (``eval_accuracy``, ``eval_f1``, ...) of
    ``eval_results.json``; for a GLUE run the dataset is ``nyu-mll/glue`` and its task config.
    """
    from huggingface_hub import EvalResult

    results, source = info.results, info.results_file.name
    out: list[EvalResult] = []
    if info.architecture == "TnnForSequenceClassification":
        task = info.glue_task
        if task is not None:
            keys = [f"eval_{metric}" for metric in task.metrics]
            if "eval_combined_score" in results:
                keys.append("eval_combined_score")
            if task.name == "mnli":  # matched and mismatched dev sets; run_glue.py suffixes the latter with _mm
                keys += [f"{key}_mm" for key in keys]
        else:
            keys = [key for key in results if key.startswith("eval_") and key not in NOT_SCORES]
        missing = [key for key in keys if key not in results]
        if missing or not keys:
            raise PublishError(f"{info.results_file} lacks the evaluation metrics {missing or ['eval_*']}: was the "
                               "run finished with --do_eval?")
        for key in keys:
            metric = key[len("eval_"):].removesuffix("_mm")
            split = dataset.split
            if task is not None:
                ref_type, ref_name, ref_config = "nyu-mll/glue", f"GLUE {task.folder}", task.name
                split = ("validation_mismatched" if key.endswith("_mm") else task.eval_splits[0])
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


# ----------------------------------------------------------------------------------------------------------------
# The model card
# ----------------------------------------------------------------------------------------------------------------
@dataclass
class CardOptions:
    """What the run folder cannot tell and the publisher states (``publish.py`` flags)."""

    license: str = "apache-2.0"
    language: str | None = "en"
    dataset: DatasetRef = field(default_factory=DatasetRef)
    base_model: str | None = None
    hardware: str | None = None
    training_data: str | None = None  # when it differs from the evaluation data (dataset), e.g. another split
    example_text: str | None = None
    description: str | None = None
    extra_plots: list[Path] = field(default_factory=list)  # PNGs kept outside the run folder (e.g. a benchmark's)


def _fmt(value: Any) -> str:
    if isinstance(value, bool) or value is None:
        return str(value)
    if isinstance(value, int):
        return f"{value:,}"
    if isinstance(value, float):
        return f"{value:,.4g}" if abs(value) < 1e5 else f"{value:,.0f}"
    return str(value)


def _duration(seconds: float) -> str:
    if seconds < 120:
        return f"{seconds:.0f} s"
    if seconds < 7200:
        return f"{seconds / 60:.1f} min ({seconds:,.0f} s)"
    return f"{seconds / 3600:.2f} h ({seconds:,.0f} s)"


def _py(text: str) -> str:
    """A Python string literal in double quotes (JSON string syntax is valid Python)."""
    return json.dumps(text)


def usage_snippet(info: RunInfo, repo_id: str, example_text: str | None = None) -> str:
    """A Python snippet that loads the published model from ``repo_id`` with ``trust_remote_code=True`` and runs it.
    ``AutoTokenizer`` needs the flag too: it reads config.json, whose ``auto_map`` points at remote code."""
    tag = info.pipeline_tag
    text = example_text or DEFAULT_EXAMPLES[tag]
    if tag == "text-generation":
        return (
            "from transformers import AutoModelForCausalLM, AutoTokenizer\n\n"
            f"repo_id = {_py(repo_id)}\n"
            "tokenizer = AutoTokenizer.from_pretrained(repo_id, trust_remote_code=True)\n"
            "model = AutoModelForCausalLM.from_pretrained(repo_id, trust_remote_code=True)\n"
            f"inputs = tokenizer({_py(text)}, return_tensors=\"pt\")\n"
            "output = model.generate(**inputs, max_new_tokens=40, do_sample=True, top_k=50)\n"
            "print(tokenizer.decode(output[0], skip_special_tokens=True))\n"
        )
    if tag == "fill-mask":
        if "{mask}" not in text:
            raise PublishError(f"--example_text {text!r} must contain '{{mask}}' where the mask token goes.")
        return (
            "from transformers import pipeline\n\n"
            f"fill_mask = pipeline(\"fill-mask\", model={_py(repo_id)}, trust_remote_code=True)\n"
            f"text = {_py(text)}.replace(\"{{mask}}\", fill_mask.tokenizer.mask_token)\n"
            "for guess in fill_mask(text, top_k=5):\n"
            "    print(f\"{guess['score']:.3f}  {guess['sequence']}\")\n"
        )
    if tag == "text-classification":
        task = info.glue_task
        if example_text is None and task is not None and len(task.text_columns) == 2:
            first, second = DEFAULT_PAIR_EXAMPLE
            example = f"{{\"text\": {_py(first)}, \"text_pair\": {_py(second)}}}"
        else:
            example = _py(text)
        return (
            "from transformers import pipeline\n\n"
            f"classify = pipeline(\"text-classification\", model={_py(repo_id)}, trust_remote_code=True)\n"
            f"print(classify({example}))\n"
        )
    return (
        "import torch\nfrom transformers import AutoModel, AutoTokenizer\n\n"
        f"repo_id = {_py(repo_id)}\n"
        "tokenizer = AutoTokenizer.from_pretrained(repo_id, trust_remote_code=True)\n"
        "model = AutoModel.from_pretrained(repo_id, trust_remote_code=True)\n"
        "with torch.no_grad():\n"
        f"    hidden = model(**tokenizer({_py(text)}, return_tensors=\"pt\")).last_hidden_state\n"
        "print(hidden.shape)\n"
    )


def shipped_auto_map(code_files: Iterable[Path]) -> dict[str, str]:
    """The package's ``auto_map`` narrowed to the classes the shipped model code defines: a run saved by an older
    version ships code with fewer heads, and its folder must not advertise a class it does not contain."""
    sources = {p.stem: p.read_text() for p in code_files}
    return {auto: target for auto, target in AUTO_MAP.items()
            if f"class {target.split('.')[1]}(" in sources.get(target.split(".")[0], "")}


def applicable_auto_classes(info: RunInfo) -> list[str]:
    """The Auto classes that load this checkpoint: the base model, the LM head that fits its saved ``causal``
    value, and sequence classification (a new head on a pretrained backbone)."""
    head = "AutoModelForCausalLM" if info.causal else "AutoModelForMaskedLM"
    if info.architecture == "TnnForSequenceClassification":
        return ["AutoModel", "AutoModelForSequenceClassification"]
    return ["AutoModel", head, "AutoModelForSequenceClassification"]


def _code_has_generation_cache(code_files: Iterable[Path]) -> bool:
    # The ETSC cache reads config.etsc_length; code that only declares the field (the configuration) has no cache.
    return any("etsc_length" in p.read_text() for p in code_files if p.name != "configuration_tnn.py")


def _results_table(eval_results: Sequence[Any], results_file: str) -> str:
    lines = [f"Read from the run's `{results_file}` (the same numbers as the `model-index` metadata above).", "",
             "| dataset | split | metric | value |", "|---|---|---|---|"]
    for result in eval_results:
        dataset = result.dataset_name + (f" ({result.dataset_config})" if result.dataset_config else "")
        lines.append(f"| {dataset} | {result.dataset_split or '-'} | {result.metric_name} | "
                     f"{result.metric_value:.4f} |")
    return "\n".join(lines)


def _architecture_table(info: RunInfo) -> str:
    config = info.config
    mixer = config.get("token_mixer", "dense")
    rows = [("architecture", info.architecture), ("token mixer", f"`{mixer}`"),
            ("causal", config.get("causal")), ("parameters", info.num_parameters),
            ("layers", config.get("num_hidden_layers")), ("width (`hidden_size`)", config.get("hidden_size")),
            ("GTU / GLU expansion", f"{config.get('gtu_expand_ratio')} / {config.get('glu_expand_ratio')}"),
            ("RPE width x layers", f"{config.get('rpe_dim')} x {config.get('rpe_layers')}"),
            ("vocabulary", config.get("vocab_size"))]
    if mixer == "dense":
        rows.append(("decay gamma", config.get("decay_gamma")))
    if mixer == "fd":
        rows.append(("`fd_kernel_length` (receptive field)", config.get("fd_kernel_length")))
    if mixer == "ski":
        rows += [("SKI rank / band width", f"{config.get('ski_rank')} / {config.get('ski_kernel_size')}")]
    if info.causal:
        rows += [("generation cache", f"`{config.get('generation_cache') or 'default'}`"),
                 ("`etsc_length`", config.get("etsc_length"))]
    rows += [("tied embeddings", config.get("tie_word_embeddings")), ("dropout", config.get("dropout"))]
    if info.architecture == "TnnForSequenceClassification":
        labels = [label for _, label in sorted((config.get("id2label") or {}).items(), key=lambda kv: int(kv[0]))]
        if config.get("problem_type") == "regression" or len(labels) == 1:
            rows.append(("output", "one regression score"))
        else:
            rows.append(("labels", ", ".join(str(label) for label in labels)))
    rows.append(("saved with transformers", config.get("transformers_version")))
    return "\n".join(["| | |", "|---|---|"] + [f"| {k} | {_fmt(v)} |" for k, v in rows if v is not None])


def _training_table(info: RunInfo, options: CardOptions) -> str:
    results, rows = info.results, []
    if info.architecture == "TnnForSequenceClassification":
        train, state = info.train_results or results, info.trainer_state
        rows += [("optimizer steps", state.get("global_step")), ("epochs", train.get("epoch")),
                 ("batch size per device", state.get("train_batch_size")),
                 ("training examples", train.get("train_samples")),
                 ("training loss (mean over the run)", train.get("train_loss")),
                 ("evaluation examples", results.get("eval_samples"))]
        runtime = train.get("train_runtime")
    else:
        steps, tokens = results.get("train_steps"), results.get("train_tokens")
        peak_lr = max((e["learning_rate"] for e in info.metrics_log if "learning_rate" in e), default=None)
        rows += [("training data", options.training_data), ("optimizer steps", steps), ("tokens seen", tokens),
                 ("last epoch (0-based index)", results.get("epoch")),
                 ("block size (tokens)", results.get("block_size")), ("peak learning rate (logged)", peak_lr),
                 ("training loss (mean over the run)", results.get("train_loss")),
                 ("throughput (tokens/s)", results.get("train_tokens_per_second")),
                 ("processes", results.get("num_processes"))]
        runtime = results.get("train_runtime")
    if isinstance(runtime, (int, float)):
        rows.append(("wall time (training loop)", _duration(float(runtime))))
    hardware = next((results[k] for k in ("hardware", "device", "devices") if results.get(k)), None)
    rows.append(("hardware", hardware or options.hardware or "not recorded by the run"))
    return "\n".join(["| | |", "|---|---|"] + [f"| {k} | {_fmt(v)} |" for k, v in rows if v is not None])


def _generation_limitation(config: dict, code_files: Sequence[Path]) -> str:
    """What ``generate`` does with this config and the shipped code: the ETSC horizon where decoding is inexact."""
    mixer, horizon = config.get("token_mixer", "dense"), config.get("etsc_length")
    # Code that measures the kernel's float32 support decodes decaying kernels exactly ("auto" by default); older
    # code had "etsc" by default and one ETSC conversion of etsc_length taps for every kernel.
    support_aware = any("kernel_support" in p.read_text() for p in code_files)
    mode = config.get("generation_cache") or ("auto" if support_aware else "etsc")
    decays = mixer == "dense" and float(config.get("decay_gamma", 0.99)) < 1
    has_support = support_aware and (decays or mixer == "fd")
    if mode == "etsc" and not (support_aware and decays) or mode == "auto" and not has_support:
        return (
            f"`model.generate` decodes with the ETSC recurrent cache (constant time and memory per token). It "
            f"equals the full forward pass only for the first `etsc_length` = {_fmt(horizon)} positions; "
            f"beyond that the converted kernel repeats with period {_fmt(horizon + 1)}"
            + (" (damped by the decay)" if mixer == "dense" else "")
            + ", so long generations drift from what the full model computes"
            + (" (a warning says so once)" if support_aware else "") + ". Load with "
            "`generation_cache=\"exact\"` (a `from_pretrained` keyword) or a larger `etsc_length` when "
            "exactness at every length matters.")
    if mode == "etsc":
        return ("`model.generate` decodes with the ETSC recurrent cache over the decaying kernel's float32 support "
                "(the lags after which it falls below float32 resolution, computed from the weights): exact at every "
                "length, in constant time and memory per token.")
    if mixer == "fd":
        return ("`model.generate` keeps a ring buffer of the last `fd_kernel_length` + 1 mixer inputs per layer (FD's "
                "kernel support): exact at every length in constant memory.")
    if has_support:
        return ("`model.generate` keeps a window of past mixer inputs per layer over the decaying kernel's float32 "
                "support (the lags after which it falls below float32 resolution, computed from the weights): exact "
                "at every length in constant time and memory per token.")
    return ("The generation cache is `\"exact\"`: it keeps every past mixer input, so it is exact at every length "
            "but each new token costs time and memory that grow with the context.")


def _limitations(info: RunInfo, code_files: Sequence[Path]) -> str:
    config, items = info.config, []
    mixer = config.get("token_mixer", "dense")
    if info.causal:
        if _code_has_generation_cache(code_files):
            items.append(_generation_limitation(config, code_files))
        else:
            items.append("This code version has no recurrent generation cache: each generated token runs the "
                         "model again over the whole prefix, so generation cost grows with length.")
    if mixer == "fd":
        items.append(f"FD token mixing has a fixed receptive field of `fd_kernel_length` = "
                     f"{_fmt(config.get('fd_kernel_length'))} tokens per layer: tokens further apart do not interact "
                     "within one layer (stacked layers reach further). Raise it (and retrain) for longer contexts.")
    if mixer == "ski":
        items.append("SKI is bidirectional only; its low-rank part approximates the Toeplitz kernel with "
                     f"{_fmt(config.get('ski_rank'))} inducing points per sequence.")
    block = info.results.get("block_size")
    if block and info.architecture != "TnnForSequenceClassification":
        lengths = sorted(int(n) for n in (info.results.get("eval_lengths") or {}))
        extra = (f" The perplexity at {', '.join(f'{n:,}' for n in lengths)} tokens is in the results above."
                 if lengths else " Longer inputs run (there is no position table), but the run's results file holds "
                 "no evaluation at other lengths.")
        items.append(f"Trained on sequences of {block:,} tokens.{extra}")
    params = info.num_parameters
    size = f"{params:,} parameters" if params else "A research model"
    if info.architecture == "TnnForSequenceClassification":
        examples = (info.train_results or info.results).get("train_samples")
        seen = f" finetuned on {examples:,} examples" if isinstance(examples, int) else ""
        items.append(f"{size}{seen}: a small research model, not meant for production use; check its scores "
                     "against the task's baselines before relying on it.")
    else:
        tokens = info.results.get("train_tokens")
        seen = f" trained on {tokens:,} tokens" if isinstance(tokens, int) else ""
        items.append(f"{size}{seen}: a small research model. It reproduces the style of its training data, has "
                     "no safety tuning, and is not meant for production use.")
    items.append("Loading runs the Python files of this repository (`trust_remote_code=True`): read them first.")
    return "\n".join(f"- {item}" for item in items)


def build_card(info: RunInfo, repo_id: str, options: CardOptions, code_files: Sequence[Path],
               plots: Sequence[str] = ()) -> Any:
    """The model card (``huggingface_hub.ModelCard``): metadata with license, library, pipeline tag, tags,
    datasets and a ``model-index`` read from the run's results file, then the usage, results, model, training,
    plots and limitations sections."""
    from huggingface_hub import ModelCard, ModelCardData

    name = repo_id.split("/")[-1]
    mixer = info.config.get("token_mixer", "dense")
    task = info.glue_task
    dataset = options.dataset
    eval_results = eval_results_from_run(info, dataset)
    datasets = ["nyu-mll/glue"] if task is not None else ([dataset.hub_id] if dataset.hub_id else None)
    metrics = list(dict.fromkeys(result.metric_type for result in eval_results))
    tags = ["tnn", "toeplitz", "custom_code", MIXER_TAGS[mixer]]
    data = ModelCardData(license=options.license, language=options.language, library_name="transformers",
                         pipeline_tag=info.pipeline_tag, tags=tags, datasets=datasets,
                         metrics=metrics, base_model=options.base_model, model_name=name,
                         eval_results=eval_results)

    kind = {"TnnForCausalLM": "causal language model", "TnnForMaskedLM": "masked (bidirectional) language model",
            "TnnForSequenceClassification": "sequence classifier", "TnnModel": "Toeplitz Neural Network backbone"}
    if task is not None:
        trained_on = f"finetuned on GLUE {task.folder} (`nyu-mll/glue`, config `{task.name}`)"
    else:
        data_name = options.training_data or dataset.name or dataset.hub_id
        trained_on = f"trained on {data_name}" if data_name else "trained"
    if options.base_model:
        trained_on += f", starting from [`{options.base_model}`](https://huggingface.co/{options.base_model})"
    intro = options.description or (f"A Toeplitz Neural Network (TNN) {kind[info.architecture]} {trained_on}. "
                                     f"Its token mixer is {MIXER_TEXT[mixer]}.")
    auto = ", ".join(f"`{name}`" for name in applicable_auto_classes(info))
    sections = [
        f"# {name}", intro,
        "## Usage",
        "The model code ships in this repository, so `trust_remote_code=True` is required (also for "
        "`AutoTokenizer`, which reads `config.json`); the `modeling_tnn` package does not need to be installed.",
        f"```python\n{usage_snippet(info, repo_id, options.example_text)}```",
        f"The checkpoint also loads with {auto} (a classification head is newly initialised).",
        "## Results", _results_table(eval_results, info.results_file.name),
        "## Model", _architecture_table(info),
        "## Training", _training_table(info, options),
    ]
    if plots:
        sections += ["## Plots", "\n\n".join(f"![{Path(p).stem.replace('_', ' ')}]({p})" for p in plots)]
    sections += ["## Limitations", _limitations(info, code_files),
                 "## Citation",
                 "Qin et al., *Toeplitz Neural Network for Sequence Modeling*, ICLR 2023 (arXiv:2305.04749). "
                 "FD and SKI token mixers: Moreno et al., *SKI to go Faster: Accelerating Toeplitz Neural Networks "
                 "via Asymmetric Kernels* (arXiv:2305.09028). ETSC: Qin and Zhong, *Accelerating Toeplitz Neural "
                 "Network with Constant-time Inference Complexity*, EMNLP 2023 (arXiv:2311.08756)."]
    return ModelCard(f"---\n{data.to_yaml()}\n---\n\n" + "\n\n".join(sections) + "\n")


# ----------------------------------------------------------------------------------------------------------------
# The folder
# ----------------------------------------------------------------------------------------------------------------
def is_allowed(relative_path: str) -> bool:
    """Whether a path (relative to the folder, ``/``-separated) is on the allow-list."""
    parts = PurePosixPath(relative_path).parts
    if len(parts) == 1:
        return any(fnmatch.fnmatchcase(parts[0], p) for p in ALLOWED_PATTERNS if "/" not in p)
    return len(parts) == 2 and parts[0] == PLOTS_DIR and fnmatch.fnmatchcase(parts[1], "*.png")


def list_folder(folder: str | Path) -> list[str]:
    """Every file under ``folder``, relative and ``/``-separated, sorted (hidden files included)."""
    root = Path(folder)
    return sorted(p.relative_to(root).as_posix() for p in root.rglob("*") if p.is_file() or p.is_symlink())


def _current_token() -> str | None:
    import huggingface_hub

    return huggingface_hub.get_token()


def check_folder(folder: str | Path) -> list[str]:
    """Check that ``folder`` holds only allow-listed files and that no text file contains the Hub token; return
    its file list. Raises :class:`PublishError` naming the offending files."""
    files = list_folder(folder)
    refused = [name for name in files if not is_allowed(name)]
    if refused:
        raise PublishError(f"{folder} holds files a model repository must not: {', '.join(refused)}.")
    token = _current_token()
    if token:
        leaking = [name for name in files if not name.endswith((".safetensors", ".png"))
                   and token in (Path(folder) / name).read_text(errors="ignore")]
        if leaking:
            raise PublishError(f"{folder}: the Hub token appears in {', '.join(leaking)}; nothing was uploaded.")
    for name in ("config.json", "README.md"):
        if name not in files:
            raise PublishError(f"{folder} has no {name}.")
    return files


def model_code_files(config: dict[str, Any], code_dir: Path) -> list[Path]:
    """The model code a checkpoint needs: the modules named in ``auto_map`` and everything they import
    relatively, found in ``code_dir``. Raises :class:`PublishError` when a file is missing."""
    from transformers.dynamic_module_utils import get_relative_import_files

    modules = sorted({ref.split("--")[-1].split(".")[0] for ref in AUTO_MAP.values()})
    roots = [code_dir / f"{module}.py" for module in modules]
    missing = [p.name for p in roots if not p.is_file()]
    if missing:
        raise PublishError(f"the model code {', '.join(missing)} is missing from {code_dir}; publish with "
                           "--code package to ship the installed modeling_tnn code instead.")
    files = {p.resolve() for p in roots}
    for root in roots:
        files.update(Path(f).resolve() for f in get_relative_import_files(str(root)))
    return sorted(files, key=lambda p: p.name)


def _package_code_dir() -> Path:
    import modeling_tnn

    return Path(modeling_tnn.__file__).resolve().parent


def _check_weights_match_package(info: RunInfo) -> None:
    # Shipping the installed code beside older weights is only safe when the parameter names still match.
    from safetensors import safe_open

    import modeling_tnn

    model = getattr(modeling_tnn, info.architecture)(modeling_tnn.TnnConfig.from_dict(info.config))
    expected = set(model.state_dict())
    saved: set[str] = set()
    for name in info.weight_files:
        if name.endswith(".safetensors"):
            with safe_open(str(info.path / name), "pt") as handle:
                saved.update(handle.keys())
    tied = {key for key in expected - saved if key.endswith(("lm_head.weight", "decoder.weight"))}
    if (expected - saved - tied) or (saved - expected):
        raise PublishError(f"the weights in {info.path} do not match the installed modeling_tnn code (missing "
                           f"{sorted(expected - saved - tied)[:5]}, unexpected {sorted(saved - expected)[:5]}); "
                           "publish with --code run.")


def build_hub_folder(info: RunInfo, out_dir: str | Path, repo_id: str, options: CardOptions | None = None,
                     code: str = "run", overwrite: bool = False) -> list[str]:
    """Write the Hub-ready folder for ``info`` into ``out_dir`` and return its file list (checked against the
    allow-list). ``code="run"`` ships the model code saved in the run folder (the code the results were measured
    with); ``code="package"`` ships the installed ``modeling_tnn`` code instead."""
    options = options or CardOptions()
    validate_repo_id(repo_id)
    # Check what the card needs before touching out_dir, so that a bad flag leaves nothing half-built.
    eval_results_from_run(info, options.dataset)
    usage_snippet(info, repo_id, options.example_text)
    names = [p.name for p in [*info.plot_files, *options.extra_plots]]
    for png in options.extra_plots:
        if png.suffix != ".png" or not png.is_file():
            raise PublishError(f"--plot {png}: not a PNG file.")
    if len(set(names)) != len(names):
        raise PublishError(f"--plot: two plots share a file name ({', '.join(sorted(names))}).")
    out = Path(out_dir)
    run = info.path.resolve()
    if out.resolve() == run or run.is_relative_to(out.resolve()):
        raise PublishError(f"--output_dir {out} would hold (or be) the run folder {info.path}: choose another folder.")
    if out.exists() and any(out.iterdir()):
        if not overwrite:
            raise PublishError(f"--output_dir {out} is not empty: pass --overwrite to replace it.")
        shutil.rmtree(out)
    out.mkdir(parents=True, exist_ok=True)

    if code == "package":
        _check_weights_match_package(info)
        code_dir = _package_code_dir()
    elif code == "run":
        code_dir = info.path
    else:
        raise PublishError(f"--code must be 'run' or 'package', got {code!r}.")
    code_files = model_code_files(info.config, code_dir)
    for source in code_files:
        shutil.copyfile(source, out / source.name)

    config = dict(info.config)
    config["auto_map"] = shipped_auto_map(code_files)
    (out / "config.json").write_text(json.dumps(config, indent=2, sort_keys=True) + "\n")
    for name in [*info.weight_files, *info.tokenizer_files]:
        shutil.copyfile(info.path / name, out / name)
    if info.causal and info.architecture in ("TnnForCausalLM", "TnnModel"):
        if (info.path / "generation_config.json").is_file():
            shutil.copyfile(info.path / "generation_config.json", out / "generation_config.json")
        else:
            from transformers import GenerationConfig

            GenerationConfig(**{k: config[k] for k in ("bos_token_id", "eos_token_id", "pad_token_id")
                                if config.get(k) is not None}).save_pretrained(out)

    plots = write_plots(info, out / PLOTS_DIR, options.extra_plots)
    card = build_card(info, repo_id, options, code_files, plots)
    card.save(str(out / "README.md"))
    return check_folder(out)


# ----------------------------------------------------------------------------------------------------------------
# Plots
# ----------------------------------------------------------------------------------------------------------------
def _loss_curves(info: RunInfo) -> tuple[dict[int, float], dict[int, float]]:
    """(training loss, evaluation loss) by optimizer step, from metrics.jsonl or trainer_state.json."""
    train, evaluation = {}, {}
    for entry in [*info.metrics_log, *info.trainer_state.get("log_history", [])]:
        if "step" not in entry:
            continue
        loss = entry.get("train_loss", entry.get("loss"))  # metrics.jsonl / Trainer's log_history
        if isinstance(loss, (int, float)) and "train_runtime" not in entry:  # not Trainer's end-of-run summary
            train[entry["step"]] = loss
        if isinstance(entry.get("eval_loss"), (int, float)):
            evaluation[entry["step"]] = entry["eval_loss"]
    return train, evaluation


def write_plots(info: RunInfo, plot_dir: Path, extra: Sequence[Path] = ()) -> list[str]:
    """Copy the run's PNG plots (and ``extra`` ones) into ``plot_dir`` and draw ``training_loss.png`` from its logs
    (when they hold at least two points). Returns the plots' paths relative to the folder (``plots/NAME.png``)."""
    written: list[str] = []
    for png in [*info.plot_files, *extra]:
        plot_dir.mkdir(parents=True, exist_ok=True)
        shutil.copyfile(png, plot_dir / png.name)
        written.append(f"{PLOTS_DIR}/{png.name}")
    train, evaluation = _loss_curves(info)
    if len(train) >= 2 and "training_loss.png" not in {p.name for p in info.plot_files}:
        import matplotlib

        matplotlib.use("Agg")
        import matplotlib.pyplot as plt

        fig, ax = plt.subplots(figsize=(6, 3.6))
        ax.plot(list(train), list(train.values()), label="training loss (logged window mean)")
        if evaluation:
            ax.plot(list(evaluation), list(evaluation.values()), "o-", label="validation loss")
        ax.set_xlabel("optimizer step")
        ax.set_ylabel("cross-entropy (nats)")
        ax.set_title(f"{info.architecture}: loss during training")
        ax.grid(alpha=0.3)
        ax.legend()
        fig.tight_layout()
        plot_dir.mkdir(parents=True, exist_ok=True)
        fig.savefig(plot_dir / "training_loss.png", dpi=90)
        plt.close(fig)
        written.append(f"{PLOTS_DIR}/training_loss.png")
    return written


# ----------------------------------------------------------------------------------------------------------------
# Upload
# ----------------------------------------------------------------------------------------------------------------
def validate_repo_id(repo_id: str) -> None:
    """``repo_id`` must be ``ORG/NAME`` (letters, digits, ``-``, ``_``, ``.``; at most 96 characters)."""
    if not isinstance(repo_id, str) or not REPO_ID_RE.match(repo_id) or len(repo_id) > 96 or ".." in repo_id:
        raise PublishError(f"--repo_id {repo_id!r} is not a Hub model id of the form ORG/NAME.")


def require_token() -> None:
    """Fail before building or uploading when huggingface_hub finds no token (``HF_TOKEN`` or ``hf auth login``).
    The token itself is never returned, passed on or printed."""
    if not _current_token():
        raise PublishError("no Hugging Face token found: run `hf auth login` or set HF_TOKEN (or use --dry-run).")


def upload_folder(folder: str | Path, repo_id: str, *, private: bool = False, create_pr: bool = False,
                  commit_message: str = "Upload TNN model") -> Any:
    """Create ``repo_id`` when needed (``exist_ok=True``; ``private`` only applies to a new repository) and upload
    ``folder`` with one ``HfApi().upload_folder`` call. Returns the ``CommitInfo``."""
    from huggingface_hub import HfApi

    files = check_folder(folder)  # once more, right before the upload
    api = HfApi()
    api.create_repo(repo_id, repo_type="model", private=private, exist_ok=True)
    logger.info("uploading %d files to %s", len(files), repo_id)
    return api.upload_folder(repo_id=repo_id, folder_path=str(folder), repo_type="model",
                             commit_message=commit_message, create_pr=create_pr)


def publish_run(run_dir: str | Path, repo_id: str, out_dir: str | Path, *, options: CardOptions | None = None,
                dry_run: bool = False, private: bool = False, create_pr: bool = False, code: str = "run",
                overwrite: bool = False, commit_message: str | None = None) -> tuple[list[str], Any]:
    """Inspect ``run_dir``, build the Hub folder in ``out_dir`` and (unless ``dry_run``) upload it. Every check
    (run folder, results, weights, token, allow-list) runs before the upload. Returns (file list, CommitInfo or
    ``None``)."""
    validate_repo_id(repo_id)
    if not dry_run:
        require_token()
    info = inspect_run(run_dir)
    files = build_hub_folder(info, out_dir, repo_id, options, code=code, overwrite=overwrite)
    if dry_run:
        return files, None
    steps = info.results.get("train_steps") or info.trainer_state.get("global_step")
    message = commit_message or f"Upload {info.architecture}" + (f" (step {steps})" if steps else "")
    return files, upload_folder(out_dir, repo_id, private=private, create_pr=create_pr, commit_message=message)


def write_card_dir(folder: str | Path, card_dir: str | Path) -> list[str]:
    """Copy a built folder's ``README.md`` and ``plots/`` (never weights or code) into ``card_dir`` (for example
    ``model_cards/NAME``), replacing what an earlier card left there. Returns the files written."""
    source, target = Path(folder), Path(card_dir)
    target.mkdir(parents=True, exist_ok=True)
    if (target / PLOTS_DIR).is_dir():
        shutil.rmtree(target / PLOTS_DIR)
    written = ["README.md"]
    shutil.copyfile(source / "README.md", target / "README.md")
    for png in sorted((source / PLOTS_DIR).glob("*.png")):
        (target / PLOTS_DIR).mkdir(exist_ok=True)
        shutil.copyfile(png, target / PLOTS_DIR / png.name)
        written.append(f"{PLOTS_DIR}/{png.name}")
    return written
