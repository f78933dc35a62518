"""The model card of a published run (``huggingface_hub.ModelCard``): metadata, usage snippet, architecture, training
and results tables, limitations, and its plots."""

from __future__ import annotations

import json
import shutil
from collections.abc import Iterable, Sequence
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

from modeling_tnn.modeling_tnn import AUTO_MAP  # noqa: E402  (every Auto class a TNN folder can expose)

from .run_inspection import HEAD_AUTO_CLASS, DatasetRef, PublishError, RunInfo, eval_results_from_run

PLOTS_DIR = "plots"
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
DEFAULT_EXAMPLES = {"text-generation": "Once upon a time", "fill-mask": "The capital of France is {mask}.",
                    "text-classification": "This film was a delight from start to finish.",
                    "feature-extraction": "Toeplitz matrices are constant along each diagonal.",
                    "token-classification": "Ada Lovelace wrote programs for Charles Babbage's Analytical Engine."}
DEFAULT_PAIR_EXAMPLE = ("The cat sat on the mat.", "A cat was sitting on the mat.")
DEFAULT_QUESTION_ANSWERING_EXAMPLE = ("What does the assert statement insert?",
                                      "The assert statement is a convenient way to insert debugging assertions "
                                      "into a program.")


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
    if tag == "question-answering":
        return _question_answering_snippet(repo_id, example_text)
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
        if example_text is None and info.benchmark is not None and info.benchmark.text_pair:
            first, second = DEFAULT_PAIR_EXAMPLE
            example = f"{{\"text\": {_py(first)}, \"text_pair\": {_py(second)}}}"
        else:
            example = _py(text)
        return (
            "from transformers import pipeline\n\n"
            f"classify = pipeline(\"text-classification\", model={_py(repo_id)}, trust_remote_code=True)\n"
            f"print(classify({example}))\n"
        )
    if tag == "token-classification":
        return (
            "from transformers import pipeline\n\n"
            f"tagger = pipeline(\"token-classification\", model={_py(repo_id)}, trust_remote_code=True,\n"
            "                  aggregation_strategy=\"simple\")\n"
            f"for entity in tagger({_py(text)}):\n"
            "    print(f\"{entity['entity_group']}  {entity['word']!r}  {entity['score']:.3f}\")\n"
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


def _question_answering_snippet(repo_id: str, example_text: str | None) -> str:
    """transformers 5 has no ``question-answering`` pipeline: the answer is the best span of the context, start then
    end, cut out of the text through the fast tokenizer's offsets."""
    if example_text is not None:
        raise PublishError("--example_text does not apply to a question-answering card: its example is a question "
                           "with a context; leave the flag out.")
    question, context = DEFAULT_QUESTION_ANSWERING_EXAMPLE
    return (
        "import torch\nfrom transformers import AutoModelForQuestionAnswering, AutoTokenizer\n\n"
        f"repo_id = {_py(repo_id)}\n"
        "tokenizer = AutoTokenizer.from_pretrained(repo_id, trust_remote_code=True)\n"
        "model = AutoModelForQuestionAnswering.from_pretrained(repo_id, trust_remote_code=True).eval()\n"
        f"question = {_py(question)}\n"
        f"context = {_py(context)}\n"
        "enc = tokenizer(question, context, return_offsets_mapping=True, return_tensors=\"pt\")\n"
        "offsets = enc.pop(\"offset_mapping\")[0]\n"
        "with torch.no_grad():\n"
        "    out = model(**enc)\n"
        "outside = torch.tensor([s != 1 for s in enc.sequence_ids(0)])  # question, special and pad tokens\n"
        "start = int(out.start_logits[0].masked_fill(outside, float(\"-inf\")).argmax())\n"
        "end = start + int(out.end_logits[0, start:].masked_fill(outside[start:], float(\"-inf\")).argmax())\n"
        "print(context[int(offsets[start, 0]):int(offsets[end, 1])])\n"
    )


def shipped_auto_map(code_files: Iterable[Path]) -> dict[str, str]:
    """The package's ``auto_map`` narrowed to the classes the shipped model code defines: a run saved by an older
    version ships code with fewer heads, and its folder must not advertise a class it does not contain."""
    sources = {p.stem: p.read_text() for p in code_files}
    return {auto: target for auto, target in AUTO_MAP.items()
            if f"class {target.split('.')[1]}(" in sources.get(target.split(".")[0], "")}


def applicable_auto_classes(info: RunInfo) -> list[str]:
    """The Auto classes that load this checkpoint: the base model and a finetuned head's own class; for a language
    model, the LM head that fits its saved ``causal`` value and sequence classification (a new head on a pretrained
    backbone)."""
    if info.finetuned:
        return ["AutoModel", HEAD_AUTO_CLASS[info.architecture]]
    head = "AutoModelForCausalLM" if info.causal else "AutoModelForMaskedLM"
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
    if info.architecture in ("TnnForSequenceClassification", "TnnForTokenClassification"):
        labels = [label for _, label in sorted((config.get("id2label") or {}).items(), key=lambda kv: int(kv[0]))]
        if config.get("problem_type") == "regression" or len(labels) == 1:
            rows.append(("output", "one regression score"))
        else:
            rows.append(("labels" if info.architecture == "TnnForSequenceClassification" else "token labels",
                         ", ".join(str(label) for label in labels)))
    if info.architecture == "TnnForQuestionAnswering":
        rows.append(("output", "a start and an end score for every token (the answer span)"))
    rows.append(("saved with transformers", config.get("transformers_version")))
    return "\n".join(["| | |", "|---|---|"] + [f"| {k} | {_fmt(v)} |" for k, v in rows if v is not None])


def _training_table(info: RunInfo, options: CardOptions) -> str:
    results, rows = info.results, []
    if info.finetuned:
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
    compact_aware = any("compact_tolerance" in p.read_text() for p in code_files)
    if decays and compact_aware and mode in ("auto", "compact"):
        tolerance = config.get("compact_tolerance", 1e-5)
        return ("`model.generate` decodes each layer from a compact state (a short exact window of past mixer inputs "
                "and a few complex modes per channel for the kernel's tail) where the layer's certified bound of the "
                f"relative l1 error of its kernel is at most `compact_tolerance` = {_fmt(tolerance)}, else from an "
                "exact window over the kernel's float32 support; constant time and memory per token. The first "
                "`generate` after loading fits the modes once (seconds to a minute on a CPU); load with "
                "`generation_cache=\"exact\"` to skip it and decode exactly.")
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
    if block and not info.finetuned:
        lengths = sorted(int(n) for n in (info.results.get("eval_lengths") or {}))
        extra = (f" The perplexity at {', '.join(f'{n:,}' for n in lengths)} tokens is in the results above."
                 if lengths else " Longer inputs run (there is no position table), but the run's results file holds "
                 "no evaluation at other lengths.")
        items.append(f"Trained on sequences of {block:,} tokens.{extra}")
    params = info.num_parameters
    size = f"{params:,} parameters" if params else "A research model"
    if info.finetuned:
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
    benchmark = info.benchmark
    dataset = options.dataset
    eval_results = eval_results_from_run(info, dataset)
    datasets = [benchmark.dataset] if benchmark is not None else ([dataset.hub_id] if dataset.hub_id else None)
    metrics = list(dict.fromkeys(result.metric_type for result in eval_results))
    tags = ["tnn", "toeplitz", "custom_code", MIXER_TAGS[mixer]]
    data = ModelCardData(license=options.license, language=options.language, library_name="transformers",
                         pipeline_tag=info.pipeline_tag, tags=tags, datasets=datasets,
                         metrics=metrics, base_model=options.base_model, model_name=name,
                         eval_results=eval_results)

    kind = {"TnnForCausalLM": "causal language model", "TnnForMaskedLM": "masked (bidirectional) language model",
            "TnnForSequenceClassification": "sequence classifier", "TnnModel": "Toeplitz Neural Network backbone",
            "TnnForTokenClassification": "token classifier",
            "TnnForQuestionAnswering": "extractive question-answering model"}
    if benchmark is not None:
        trained_on = f"finetuned on {benchmark.name} (`{benchmark.dataset}`, config `{benchmark.config}`)"
    else:
        data_name = options.training_data or dataset.name or dataset.hub_id
        verb = "finetuned" if info.finetuned else "trained"
        trained_on = f"{verb} on {data_name}" if data_name else verb
    if options.base_model:
        trained_on += f", starting from [`{options.base_model}`](https://huggingface.co/{options.base_model})"
    intro = options.description or (f"A Toeplitz Neural Network (TNN) {kind[info.architecture]} {trained_on}. "
                                     f"Its token mixer is {MIXER_TEXT[mixer]}.")
    auto = ", ".join(f"`{name}`" for name in applicable_auto_classes(info))
    also = ("The checkpoint also loads with `AutoModel` (the backbone without its head)." if info.finetuned else
            f"The checkpoint also loads with {auto} (a classification head is newly initialised).")
    sections = [
        f"# {name}", intro,
        "## Usage",
        "The model code ships in this repository, so `trust_remote_code=True` is required (also for "
        "`AutoTokenizer`, which reads `config.json`); the `modeling_tnn` package does not need to be installed.",
        f"```python\n{usage_snippet(info, repo_id, options.example_text)}```",
        also,
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
