"""Quality comparison: TNN (dense and fd token mixers) against GPT-2 at matched parameter count.

Every model trains through ``train_clm``'s code path (``recipes.pretraining.training.run``, given the arguments
object :func:`training_arguments` builds) with the same tokenizer, tokens, steps, batch, learning-rate schedule and
seed; only the model group (``--config_name``/``--config_overrides``) differs. GPT-2 is transformers'
``GPT2LMHeadModel`` with its width chosen to match TNN dense's parameter count and its position table sized to the
training length, as a user would train it.

Datasets (read from ``$TNN_DATA_DIR`` or ``../shared/data``; nothing is copied into the project):
- ``tinyshakespeare``: character level (byte-level tokenizer without merges), first 90% train, last 10% validation.
- ``wikitext2``: only valid.txt and test.txt exist here, so the models train on valid.txt and are evaluated on
  test.txt (byte-level BPE trained on valid.txt).

Then each model is evaluated at 1x, 2x, 4x and 8x the training length on the same validation tokens: GPT-2 with a
sliding window of the training length (stride half of it), TNN on full windows and with the same sliding window.
Training speed is measured separately, the way speed is compared on a shared machine: the models take turns for
several interleaved rounds of a few steps each, and the table reports the median tokens/s and the median per-round
ratio to GPT-2 (the training runs' own wall times are reported too, but other jobs on the machine move them).
Writes ``quality.json`` and one PNG per dataset into --out, and prints a markdown table.

The recipe behind ``run_scripts/bench_quality.py`` (results/quality; not part of ``make bench``: it trains).

    python run_scripts/bench_quality.py                       # the README numbers (about 25 minutes on 2 CPU cores)
    python run_scripts/bench_quality.py --steps 20 --datasets tinyshakespeare   # a smoke run
"""

from __future__ import annotations

import argparse
import json
import statistics
import time
from pathlib import Path
from typing import Any

import torch

from ..common.data_location import find_data_dir
from ..common.run_files import METRICS_FILE
from ..pretraining.arguments import ModelArguments, PretrainingArguments, RunArguments, TrainingLoopArguments
from ..pretraining.data import DataTrainingArguments
from ..pretraining.evaluation import evaluate_lengths
from ..pretraining.training import run
from .harness import command_line, interleaved, machine, pyplot, save_figure, source_state, workload
from .reference_models import closest_size, count_parameters

DATASETS = ("tinyshakespeare", "wikitext2")
MODELS = ("tnn_dense", "tnn_fd", "gpt2")
TARGET_LOSS_RATIO = 1.02  # TNN validation loss within 2% of GPT-2's, or better
TARGET_EXTRAPOLATION = 1.05  # TNN perplexity at 8x within 5% of its perplexity at 1x


def data_dir() -> Path:
    """``$TNN_DATA_DIR`` or ``../shared/data`` beside the project."""
    found = find_data_dir()
    if found:
        return found
    raise SystemExit("bench_quality.py: error: no data folder: set TNN_DATA_DIR or lay shared/data beside the project.")


def rows(text: str, chars: int = 4096) -> list[str]:
    """``text`` cut at line ends into rows of about ``chars`` characters (concatenating them gives ``text`` back)."""
    lines, out, size, current = text.splitlines(keepends=True), [], 0, []
    for line in lines:
        current.append(line)
        size += len(line)
        if size >= chars:
            out.append("".join(current))
            current, size = [], 0
    if current:
        out.append("".join(current))
    return out


def load_texts(name: str, folder: Path) -> tuple[str, str, str]:
    """``(train_text, validation_text, description)`` of a dataset."""
    if name == "tinyshakespeare":
        text = (folder / "tinyshakespeare" / "input.txt").read_text(encoding="utf-8")
        cut = int(len(text) * 0.9)
        return text[:cut], text[cut:], "Tiny Shakespeare, characters: first 90% train, last 10% validation"
    if name == "wikitext2":
        base = folder / "wikitext-2"
        return ((base / "valid.txt").read_text(encoding="utf-8"), (base / "test.txt").read_text(encoding="utf-8"),
                "WikiText-2 (tokenised version): trained on valid.txt, evaluated on test.txt (train.txt is absent)")
    raise ValueError(f"dataset must be one of {DATASETS}, got {name!r}.")


def gpt2_matching(target: int, vocab: int, n_positions: int, n_layer: int, n_head: int = 4) -> tuple[dict, int]:
    """The GPT-2 config (width a multiple of ``n_head``, tied embeddings, position table counted) whose parameter
    count is closest to ``target``, and that count."""
    from transformers import GPT2Config, GPT2LMHeadModel

    def config_of(width: int) -> dict:
        return {"model_type": "gpt2", "vocab_size": vocab, "n_positions": n_positions, "n_embd": width,
                "n_layer": n_layer, "n_head": n_head, "resid_pdrop": 0.0, "embd_pdrop": 0.0, "attn_pdrop": 0.0,
                "tie_word_embeddings": True}

    def build(width: int) -> GPT2LMHeadModel:
        return GPT2LMHeadModel(GPT2Config(**{k: v for k, v in config_of(width).items() if k != "model_type"}))

    width = closest_size(build, target, multiple=n_head, low=n_head * 4, high=1024)
    with torch.device("meta"):
        exact = count_parameters(build(width))
    return config_of(width), exact


def read_curve(output_dir: Path) -> dict[str, float]:
    """``{"step": train_loss}`` from a run's metrics.jsonl (string keys, as JSON stores them)."""
    curve = {}
    for line in (output_dir / METRICS_FILE).read_text().splitlines():
        entry = json.loads(line)
        if "train_loss" in entry:
            curve[str(entry["step"])] = entry["train_loss"]
    return curve


def measure_throughput(builders: dict[str, Any], batch_size: int, block_size: int, vocab: int, rounds: int,
                       steps: int = 3) -> dict[str, dict[str, float]]:
    """Training throughput measured the way the project compares speed on a shared machine: the models take turns
    (interleaved, the order rotating each round), each timing ``steps`` AdamW steps on the same random batch; the
    result is each model's median tokens/s and the median of its per-round ratio to GPT-2."""
    torch.manual_seed(0)
    batch = torch.randint(vocab, (batch_size, block_size))
    models = {name: build() for name, build in builders.items()}
    optimizers = {name: torch.optim.AdamW(model.parameters(), lr=1e-4) for name, model in models.items()}

    def step(name: str) -> None:
        loss = models[name](input_ids=batch, labels=batch).loss
        loss.backward()
        optimizers[name].step()
        optimizers[name].zero_grad()

    def steps_of(name: str):
        def run_steps() -> None:
            for _ in range(steps):
                step(name)
        return workload(run_steps)

    # The harness's interleaved rounds, the order rotating each round, after a warm-up (allocations, FFT plans).
    timings = interleaved({name: steps_of(name) for name in models}, rounds=rounds, warmup=1, rotate=True)
    speeds = {name: [steps * batch.numel() / seconds for seconds in timing.samples]
              for name, timing in timings.items()}
    out = {}
    for name, values in speeds.items():
        out[name] = {"tokens_per_second_median": statistics.median(values)}
        if "gpt2" in speeds:
            out[name]["speed_vs_gpt2"] = statistics.median(v / g for v, g in zip(values, speeds["gpt2"]))
    return out


def model_arguments(model_name: str, settings: argparse.Namespace, work: Path) -> ModelArguments:
    """The model group of one compared model: the small TNN preset at the width and depth asked for, dropout off,
    with its token mixer, or the parameter-matched GPT-2 config written into ``work``; all read ``work``'s
    tokenizer."""
    tokenizer = str(work / "tokenizer")
    if model_name == "gpt2":
        return ModelArguments(config_name=str(work / "gpt2_config.json"), tokenizer_name=tokenizer)
    overrides = (f"dropout=0.0,hidden_size={settings.hidden_size},num_hidden_layers={settings.layers},"
                 f"token_mixer={model_name.removeprefix('tnn_')}")
    return ModelArguments(config_name="small", config_overrides=overrides, tokenizer_name=tokenizer)


def training_arguments(settings: argparse.Namespace, model: ModelArguments, output_dir: Path) -> PretrainingArguments:
    """The ``train_clm`` run of one model: the same sequence length, batch, schedule, steps, evaluation and seed for
    every model; only ``model`` differs. A rerun retrains from scratch into the same folder (train_clm refuses a
    used --output_dir without --overwrite_output_dir)."""
    steps = settings.steps
    return PretrainingArguments.with_defaults(
        "clm", model=model,
        data=DataTrainingArguments(max_eval_samples=settings.max_eval_tokens // settings.block_size),
        training=TrainingLoopArguments(block_size=settings.block_size, per_device_train_batch_size=settings.batch_size,
                                       per_device_eval_batch_size=8, learning_rate=settings.learning_rate,
                                       weight_decay=0.01, lr_scheduler_type="cosine",
                                       num_warmup_steps=max(1, steps // 10), max_train_steps=steps,
                                       seed=settings.seed),
        run=RunArguments(output_dir=str(output_dir), overwrite_output_dir=True, eval_steps=steps,
                         logging_steps=max(1, steps // 30), report_to="none"))


def bench_dataset(name: str, settings: argparse.Namespace, folder: Path) -> dict[str, Any]:
    """Train and evaluate every model on one dataset; returns its JSON section."""
    from datasets import Dataset, DatasetDict

    from modeling_tnn import TnnForCausalLM, load_preset
    from ..pretraining.tokenizer import train_byte_level_bpe

    train_text, valid_text, description = load_texts(name, folder)
    raw = DatasetDict({"train": Dataset.from_dict({"text": rows(train_text)}),
                       "validation": Dataset.from_dict({"text": rows(valid_text)})})
    work = Path(settings.work_dir) / name
    work.mkdir(parents=True, exist_ok=True)
    vocab_size = 261 if name == "tinyshakespeare" else settings.wikitext_vocab_size
    tokenizer = train_byte_level_bpe(raw["train"]["text"], vocab_size=vocab_size)
    tokenizer.save_pretrained(work / "tokenizer")
    stream = torch.tensor([i for text in raw["validation"]["text"] for i in tokenizer(text).input_ids])
    vocab = len(tokenizer)

    tnn_params = TnnForCausalLM(load_preset("small", vocab_size=vocab, dropout=0.0,
                                            hidden_size=settings.hidden_size,
                                            num_hidden_layers=settings.layers)).num_parameters()
    gpt2_config, gpt2_params = gpt2_matching(tnn_params, vocab, settings.block_size, settings.layers)
    (work / "gpt2_config.json").write_text(json.dumps(gpt2_config, indent=2))
    lengths = [settings.block_size * k for k in (1, 2, 4, 8)]
    section: dict[str, Any] = {"description": description, "vocab_size": vocab, "train_characters": len(train_text),
                               "validation_tokens_total": len(stream), "lengths": lengths, "models": {}}
    for model_name in settings.models:
        print(f"\n=== {name}: {model_name} ===", flush=True)
        output_dir = work / model_name
        arguments = training_arguments(settings, model_arguments(model_name, settings, work), output_dir)
        outcome = run(arguments, "clm", raw_datasets=raw)
        model = outcome.model.eval()
        entry = {key: outcome.results[key] for key in ("eval_loss", "perplexity", "train_loss", "train_runtime",
                                                       "train_tokens", "train_tokens_per_second", "num_parameters")}
        entry["argv"] = arguments.argv()  # the train_clm.py flags of this run
        entry["train_curve"] = read_curve(output_dir)
        eval_start = time.time()
        sliding = evaluate_lengths(model, stream, lengths, window=settings.block_size, batch_size=8,
                                      max_tokens=settings.max_eval_tokens)
        entry["sliding"] = {str(k): v for k, v in sliding.items()}
        if model_name != "gpt2":  # GPT-2's position table stops at the training length
            full = evaluate_lengths(model, stream, lengths, batch_size=8, max_tokens=settings.max_eval_tokens)
            entry["full"] = {str(k): v for k, v in full.items()}
        entry["eval_lengths_seconds"] = time.time() - eval_start
        section["models"][model_name] = entry
    section["gpt2_config"] = gpt2_config
    section["parameters"] = {"tnn": tnn_params, "gpt2": gpt2_params}
    if settings.throughput_rounds:
        from transformers import GPT2Config, GPT2LMHeadModel

        tnn = {"vocab_size": vocab, "dropout": 0.0, "hidden_size": settings.hidden_size,
               "num_hidden_layers": settings.layers}
        builders = {
            "tnn_dense": lambda: TnnForCausalLM(load_preset("small", token_mixer="dense", **tnn)),
            "tnn_fd": lambda: TnnForCausalLM(load_preset("small", token_mixer="fd", **tnn)),
            "gpt2": lambda: GPT2LMHeadModel(GPT2Config(**{k: v for k, v in gpt2_config.items() if k != "model_type"})),
        }
        print(f"\n=== {name}: throughput, {settings.throughput_rounds} interleaved rounds ===", flush=True)
        section["throughput"] = measure_throughput({m: builders[m] for m in settings.models}, settings.batch_size,
                                                   settings.block_size, vocab, settings.throughput_rounds)
    return section


def targets(section: dict[str, Any]) -> list[dict[str, Any]]:
    """The issue's two targets for each TNN model of a dataset, measured."""
    models, found = section["models"], []
    gpt2 = models.get("gpt2", {})
    for name in ("tnn_dense", "tnn_fd"):
        entry = models.get(name, {})
        if "full" not in entry:
            continue
        if "sliding" in gpt2:
            first = str(section["lengths"][0])
            ratio = entry["full"][first]["loss"] / gpt2["sliding"][first]["loss"]
            found.append({"model": name, "target": f"validation loss / GPT-2's <= {TARGET_LOSS_RATIO}",
                          "value": ratio, "met": ratio <= TARGET_LOSS_RATIO})
        at_1x, at_8x = (entry["full"][str(n)]["perplexity"] for n in (section["lengths"][0], section["lengths"][-1]))
        found.append({"model": name, "target": f"perplexity at 8x / at 1x (full windows) <= {TARGET_EXTRAPOLATION}",
                      "value": at_8x / at_1x, "met": at_8x / at_1x <= TARGET_EXTRAPOLATION})
    return found


def markdown(report: dict[str, Any]) -> str:
    """The README tables."""
    out = []
    for name, section in report["datasets"].items():
        lengths = section["lengths"]
        out.append(f"**{section['description']}** (vocabulary {section['vocab_size']}, training length "
                   f"{lengths[0]}; perplexities on the same {section['models_eval_tokens']} validation tokens; "
                   "train s = wall time of the training run; tokens/s and speed vs GPT-2 = medians of interleaved "
                   "rounds)\n")
        header = (["model", "params", "val loss (1x)"] + [f"ppl {n // lengths[0]}x" for n in lengths]
                  + ["train s", "tokens/s", "speed vs GPT-2"])
        out.append("| " + " | ".join(header) + " |")
        out.append("|" + "---|" * len(header))
        for model_name, entry in section["models"].items():
            rows_ = [("full", "full window")] if "full" in entry else []
            rows_.append(("sliding", f"sliding {lengths[0]}/{lengths[0] // 2}"))
            for key, label in rows_:
                speed = section.get("throughput", {}).get(model_name, {})
                cells = [f"{model_name} ({label})", f"{entry['num_parameters'] / 1e6:.3f}M",
                         f"{entry[key][str(lengths[0])]['loss']:.4f}"]
                cells += [f"{entry[key][str(n)]['perplexity']:.3f}" for n in lengths]
                cells += [f"{entry['train_runtime']:.0f}",
                          f"{speed['tokens_per_second_median']:.0f}" if speed else "-",
                          f"{speed['speed_vs_gpt2']:.2f}x" if "speed_vs_gpt2" in speed else "-"]
                out.append("| " + " | ".join(cells) + " |")
        out.append("")
        for target in section["targets"]:
            out.append(f"- {target['model']}: {target['target']}: **{target['value']:.4f}** "
                       f"({'met' if target['met'] else 'missed'})")
        out.append("")
    return "\n".join(out)


def plot(section: dict[str, Any], path: Path, title: str) -> None:
    """Two panels: perplexity vs evaluation length, training loss vs step."""
    plt = pyplot()
    fig, (left, right) = plt.subplots(1, 2, figsize=(11, 4.2))
    lengths = section["lengths"]
    colors = {"tnn_dense": "tab:blue", "tnn_fd": "tab:orange", "gpt2": "tab:green"}
    for model_name, entry in section["models"].items():
        for key, style in (("full", "-"), ("sliding", "--")):  # one colour per model, one line style per window
            if key in entry:
                left.plot(lengths, [entry[key][str(n)]["perplexity"] for n in lengths], style, marker="o",
                          color=colors[model_name], label=f"{model_name} ({key})")
        steps = sorted(entry["train_curve"], key=int)
        right.plot([int(s) for s in steps], [entry["train_curve"][s] for s in steps], color=colors[model_name],
                   label=model_name)
    left.set_xscale("log", base=2)
    left.set_xticks(lengths, [str(n) for n in lengths])
    left.set_xlabel("evaluation length (tokens)")
    left.set_ylabel("validation perplexity")
    left.set_title("extrapolation (training length %d)" % lengths[0])
    right.set_xlabel("step")
    right.set_ylabel("training loss")
    right.set_title("training")
    for axis in (left, right):
        axis.grid(True, alpha=0.3)
        axis.legend(fontsize=8)
    fig.suptitle(title)
    save_figure(fig, path)


def parse_settings(argv: list[str] | None = None) -> argparse.Namespace:
    """The benchmark's own flags (``--datasets`` and ``--models`` as lists); an unknown dataset or model is a usage
    error."""
    parser = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("--datasets", default=",".join(DATASETS), help=f"comma-separated, from {DATASETS}")
    parser.add_argument("--models", default=",".join(MODELS), help=f"comma-separated, from {MODELS}")
    parser.add_argument("--steps", type=int, default=250)
    parser.add_argument("--block_size", type=int, default=128, help="the training length")
    parser.add_argument("--batch_size", type=int, default=8)
    parser.add_argument("--learning_rate", type=float, default=2e-3)
    parser.add_argument("--hidden_size", type=int, default=128, help="TNN width (the small preset otherwise)")
    parser.add_argument("--layers", type=int, default=4, help="TNN and GPT-2 depth")
    parser.add_argument("--wikitext_vocab_size", type=int, default=2048)
    parser.add_argument("--max_eval_tokens", type=int, default=32768,
                        help="validation tokens scored (rounded to whole segments of 8x the training length)")
    parser.add_argument("--threads", type=int, default=1,
                        help="torch threads (1: on shared 2-core machines more threads only contend)")
    parser.add_argument("--throughput_rounds", type=int, default=7,
                        help="interleaved rounds of the speed comparison (0 skips it)")
    parser.add_argument("--seed", type=int, default=0)
    parser.add_argument("--out", default="results/quality", help="where quality.json and the PNGs go")
    parser.add_argument("--work_dir", default="outputs/bench_quality", help="model folders (not committed)")
    settings = parser.parse_args(argv)
    settings.datasets = [d.strip() for d in settings.datasets.split(",") if d.strip()]
    settings.models = [m.strip() for m in settings.models.split(",") if m.strip()]
    for value, allowed, flag in ((settings.datasets, DATASETS, "--datasets"), (settings.models, MODELS, "--models")):
        bad = sorted(set(value) - set(allowed))
        if bad:
            parser.error(f"{flag}: unknown {bad}; choose from {allowed}")
    return settings


def main(argv: list[str] | None = None) -> dict[str, Any]:
    settings = parse_settings(argv)
    torch.set_num_threads(settings.threads)
    folder = data_dir()
    out = Path(settings.out)
    out.mkdir(parents=True, exist_ok=True)
    command = command_line("run_scripts/bench_quality.py", argv)
    report: dict[str, Any] = {
        "command": command,
        "source": source_state(),
        "environment": {**machine(), "threads": settings.threads},
        "settings": {k: v for k, v in vars(settings).items() if k not in ("out", "work_dir")},
        "datasets": {},
    }
    start = time.time()
    for name in settings.datasets:
        section = bench_dataset(name, settings, folder)
        section["models_eval_tokens"] = next((e["sliding"][str(section["lengths"][0])]["tokens"]
                                              for e in section["models"].values() if "sliding" in e), 0)
        section["targets"] = targets(section)
        report["datasets"][name] = section
        plot(section, out / f"quality_{name}.png", section["description"])
    report["wall_seconds"] = time.time() - start
    (out / "quality.json").write_text(json.dumps(report, indent=1))
    print("\n" + markdown(report))
    print(f"command: {command}\nwall time: {report['wall_seconds'] / 60:.1f} min; wrote {out / 'quality.json'}")
    return report


if __name__ == "__main__":
    main()
