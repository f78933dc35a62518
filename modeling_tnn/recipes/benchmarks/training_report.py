"""The training benchmark's report (:mod:`.training` measures): the markdown tables of throughput, memory, speed
ratios and operator counts, and the figures."""

from __future__ import annotations

import argparse
from pathlib import Path

from .harness import pyplot, save_figure
from .training_models import COMPILED, jobs_of


def plot_ops(rows: list[dict], path: Path) -> None:
    """Bars of the forward + backward operator counts (this machine's path and the accelerator's) per job."""
    plt = pyplot()

    labels = [f"{r['family']} {r['model']} n={r['n']}" for r in rows]
    fig, ax = plt.subplots(figsize=(max(5.0, 0.8 * len(rows) + 2), 4))
    positions = range(len(rows))
    ax.bar([i - 0.2 for i in positions], [r["forward_backward"] for r in rows], width=0.4, label="this CPU's path")
    ax.bar([i + 0.2 for i in positions], [r["forward_backward_one_chunk"] for r in rows], width=0.4,
           label="one channel chunk (as an accelerator)")
    ax.set_xticks(list(positions), labels, rotation=45, ha="right", fontsize=8)
    ax.set_ylabel("aten events, forward + backward")
    ax.legend(fontsize=8)
    ax.grid(True, axis="y", alpha=0.3)
    save_figure(fig, path)


def ops_table(rows: list[dict]) -> str:
    lines = ["| family | model | n | batch | aten ops fwd + bwd | same, one channel chunk (as off CPU) | optimizer | "
             "parameter tensors | most frequent |", "|---|---|---|---|---|---|---|---|---|"]
    for r in rows:
        top = ", ".join(f"{k.removeprefix('aten::')} {v}" for k, v in list(r["top"].items())[:6])
        lines.append(f"| {r['family']} | {r['model']} | {r['n']} | {r['batch']} | {r['forward_backward']:,} | "
                     f"{r['forward_backward_one_chunk']:,} | {r['optimizer']:,} | {r['parameter_tensors']} | {top} |")
    return "\n".join(lines) + "\n"


RATIOS = {
    "lm": [("causal", "tnn-dense", "llama"), ("causal", "tnn-fd", "llama"), ("causal", "tnn-dense", "gpt2"),
           ("causal", "tnn-fd", "gpt2"), ("causal", "tnn-fd", "tnn-dense"), ("masked", "tnn-ski", "bert"),
           ("masked", "tnn-dense", "bert"), ("masked", "tnn-fd", "bert"), ("masked", "tnn-ski", "tnn-dense"),
           ("masked", "tnn-fd", "tnn-dense")],
    "small_gpt": [("causal", "tnn-dense", "gpt2"), ("causal", "tnn-fd", "gpt2"), ("causal", "tnn-dense", "mingpt"),
                  ("causal", "tnn-fd", "mingpt"), ("causal", "tnn-fd", "tnn-dense")],
    "lra": [("classify", "tnn-dense", "bert"), ("classify", "tnn-fd", "bert"), ("classify", "tnn-ski", "bert"),
            ("classify", "tnn-fd", "tnn-dense"), ("classify", "tnn-ski", "tnn-dense")],
}


def ratios(args: argparse.Namespace) -> list[tuple[str, str, str]]:
    """The suite's ratios; with ``--compile`` also compiled against compiled and each model compiled against eager."""
    pairs = list(RATIOS[args.suite])
    if args.compile:
        pairs += [(f, a + COMPILED, b + COMPILED) for f, a, b in RATIOS[args.suite]]
        pairs += [(f, m + COMPILED, m) for f, m in dict.fromkeys((f, m) for f, m in jobs_of(args)
                                                                  if not m.endswith(COMPILED))]
    return pairs


def model_rows(counts, lengths: list[int], rows: list[dict], cell) -> list[str]:
    """Table rows ``| family | model | cell(n) ... |``: one per job, one cell per length (— where not measured)."""
    lines = []
    for family, name in counts:
        cells = []
        for n in lengths:
            row = next((r for r in rows if (r["family"], r["model"], r["n"]) == (family, name, n)), None)
            cells.append("—" if row is None else cell(row))
        lines.append(f"| {family} | {name} | " + " | ".join(cells) + " |")
    return lines


def render(args, counts, speed, peaks) -> str:
    lines = [f"Suite {args.suite}, preset {args.preset}" + (f", hidden {args.hidden_size}" if args.hidden_size else "")
             + f", one torch thread, tokens per step {args.tokens} (batch = max(1, {args.tokens} // n)), "
             f"median of {args.rounds} interleaved rounds.", "", "Parameters (position tables not counted):", ""]
    for (family, name), (total, ratio) in counts.items():
        lines.append(f"- {family} {name}: {total:,} ({ratio:+.2%} vs TNN dense)")
    lengths = sorted({r["n"] for r in speed})
    if speed:
        lines += ["", "Training steps per second (tokens/s in brackets):", "",
                  "| family | model | " + " | ".join(f"n={n}" for n in lengths) + " |",
                  "|---|---|" + "---|" * len(lengths)]
        lines += model_rows(counts, lengths, speed, lambda r: f"{1 / r['median_s']:.3f} ({r['tokens_per_s']:.0f})")
        lines += ["", "Where a step's time goes (median ms: forward with the loss + backward, and the optimizer's step "
                  "+ zero_grad, timed separately within each step; spread: the steps' interquartile range over "
                  "their median):", "",
                  "| family | model | n | step | forward + backward | optimizer | spread |", "|---|---|---|---|---|---|---|"]
        for row in speed:
            lines.append(f"| {row['family']} | {row['model']} | {row['n']} | {row['median_s'] * 1e3:.1f} | "
                         f"{row['forward_backward_median_s'] * 1e3:.1f} | {row['optimizer_median_s'] * 1e3:.1f} | "
                         f"{row['spread']:.1%} |")
        lines += ["", "Speed ratios (a / b = time of b over time of a):", "",
                  "| ratio | " + " | ".join(f"n={n}" for n in lengths) + " |", "|---|" + "---|" * len(lengths)]
        for family, a, b in ratios(args):
            cells = []
            for n in lengths:
                ta = next((r["median_s"] for r in speed if (r["family"], r["model"], r["n"]) == (family, a, n)), None)
                tb = next((r["median_s"] for r in speed if (r["family"], r["model"], r["n"]) == (family, b, n)), None)
                cells.append("—" if ta is None or tb is None else f"{tb / ta:.2f}x")
            if any(c != "—" for c in cells):
                lines.append(f"| {family} {a} / {b} | " + " | ".join(cells) + " |")
    if peaks:
        mem_lengths = sorted({r["n"] for r in peaks})
        lines += ["", f"Peak memory of one training step, MB over the process's resident set after building model, "
                  f"optimizer and batch ({peaks[0].get('method', '')}; fresh process each):", "",
                  "| family | model | " + " | ".join(f"n={n}" for n in mem_lengths) + " |",
                  "|---|---|" + "---|" * len(mem_lengths)]
        lines += model_rows(counts, mem_lengths, peaks,
                            lambda r: "failed" if "failed" in r else f"{r['step_peak_mb']:.0f}")
    return "\n".join(lines) + "\n"


REFERENCE = {"causal": "llama", "masked": "bert", "classify": "bert"}


def plot(args, speed, peaks, path: Path) -> None:
    plt = pyplot()

    panels = [(f, "speed") for f in args.families if any(r["family"] == f for r in speed)]
    panels += [(f, "memory") for f in args.families if any(r["family"] == f and "failed" not in r for r in peaks)]
    if not panels:
        return
    fig, axes = plt.subplots(1, len(panels), figsize=(5 * len(panels), 4), squeeze=False)
    for ax, (family, what) in zip(axes[0], panels):
        rows = [r for r in (speed if what == "speed" else peaks) if r["family"] == family and "failed" not in r]
        # Speed as a ratio to the family's attention baseline, measured within the same interleaved rounds (the
        # absolute rate follows the load of a shared machine from one length to the next; the ratio does not).
        reference = "gpt2" if args.suite == "small_gpt" else REFERENCE[family]
        base = {r["n"]: r["median_s"] for r in rows if r["model"] == reference} if what == "speed" else {}
        relative = bool(base)  # without the baseline in the run: absolute tokens/s
        for name in dict.fromkeys(r["model"] for r in rows):
            mine = sorted((r for r in rows if r["model"] == name and (not relative or r["n"] in base)),
                          key=lambda r: r["n"])
            values = [(base[r["n"]] / r["median_s"] if relative else r["tokens_per_s"]) if what == "speed"
                      else r["step_peak_mb"] for r in mine]
            ax.plot([r["n"] for r in mine], values, marker="o", label=name)
        ax.set_xscale("log", base=2)
        ax.set_yscale("log")
        ax.set_xlabel("sequence length n")
        speed_label = f"training speed / {reference}'s" if relative else "training tokens / s"
        ax.set_ylabel(speed_label if what == "speed" else "peak MB of one step")
        ax.set_title(f"{family}: {'speed' if what == 'speed' else 'peak memory'}")
        ax.grid(True, which="both", alpha=0.3)
        ax.legend()
    fig.suptitle(f"Training step (fwd + bwd + AdamW), one thread, {args.tokens} tokens per step")
    save_figure(fig, path, dpi=120)
