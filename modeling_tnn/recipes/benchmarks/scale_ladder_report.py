"""The scale ladder's report (:mod:`.scale_ladder` measures): the targets of issue 29 part 5 evaluated per rung, the
tables, the log-log figure of cost against parameters, and the harness's folder (``results.json`` with the command,
``table.md``, ``ladder.png``).

Targets (ratio = Llama's time over TNN's: > 1 means TNN is faster):

* decode: >= 1.0x at a 256-token context and >= 1.5x at 2,048, batch 1 and 8;
* training at n = 512: >= 1.0x, or within 5% of the free-mixer bound B (ratio >= 0.95 B) where B < 1.05;
* training at n = 2,048: >= 1.3x where B >= 1.3 (attention takes that much of Llama's step), else >= 0.9 B;
* state: TNN's decoding state per sequence <= the matched Llama's KV cache at 256 tokens (part 3).

B is Llama's step over its step with attention costing nothing (:func:`.scale_ladder_training.free_attention`),
measured in the same interleaved rounds."""

from __future__ import annotations

from pathlib import Path

from .harness import pyplot, save_figure, write_report

DECODE_TARGETS = {256: 1.0, 2048: 1.5}
TARGET_BATCHES = (1, 8)


def _get(rows: list[dict], **keys):
    return next((r for r in rows if all(r.get(k) == v for k, v in keys.items())), None)


def training_target(n: int, bound: float) -> tuple[float, str] | None:
    """(the ratio TNN must reach, the rule) at training length ``n`` given the free-mixer bound, or None where part 5
    sets no target."""
    if n == 512:
        return (min(1.0, 0.95 * bound), "0.95 x bound (bound < 1.05)") if bound < 1.05 else (1.0, "1.0x")
    if n == 2048:
        return (1.3, "1.3x (bound >= 1.3)") if bound >= 1.3 else (0.9 * bound, "0.9 x bound (bound < 1.3)")
    return None


def targets(record: dict) -> list[dict]:
    """One row per target of part 5 that this rung's measurements cover: what, ratio, target, rule, passed."""
    rows = []
    for context, target in DECODE_TARGETS.items():
        for batch in TARGET_BATCHES:
            tnn = _get(record["decode"], model="tnn", batch=batch, context=context)
            llama = _get(record["decode"], model="llama", batch=batch, context=context)
            if tnn and llama:
                ratio = llama["ms_per_token"] / tnn["ms_per_token"]
                rows.append(dict(target=f"decode b{batch} @{context}", ratio=ratio, required=target,
                                 rule=f"{target:.1f}x", passed=ratio >= target))
    for n in sorted({r["n"] for r in record["training"]}):
        tnn, llama, free = (_get(record["training"], model=m, n=n) for m in ("tnn", "llama", "llama free mixer"))
        if not (tnn and llama and free):
            continue
        bound = llama["step_ms"] / free["step_ms"]
        goal = training_target(n, bound)
        if goal is not None:
            ratio = llama["step_ms"] / tnn["step_ms"]
            rows.append(dict(target=f"training n={n}", ratio=ratio, bound=bound, required=goal[0], rule=goal[1],
                             passed=ratio >= goal[0]))
    decode_tnn = [r for r in record["decode"] if r["model"] == "tnn"]
    if decode_tnn:
        state = max(r["state_bytes_per_sequence"] for r in decode_tnn)
        kv256 = record["llama_kv_bytes_per_sequence"]["256"]
        rows.append(dict(target="state <= Llama KV @256", ratio=kv256 / state, required=1.0, rule="1.0x",
                         passed=state <= kv256))
    return rows


# -- tables ----------------------------------------------------------------------------------------------------------


def _mb(value: float | None) -> str:
    return "—" if value is None else f"{value / 1e6:.2f}"


def plan_summary(plans: list[dict]) -> str:
    """``"7 compact"``, ``"11 compact + 1 window"``: the layers per plan."""
    counts: dict[str, int] = {}
    for layer in plans:
        counts[layer["plan"]] = counts.get(layer["plan"], 0) + 1
    return " + ".join(f"{count} {plan}" for plan, count in counts.items())


def _peak(row: dict) -> str:
    return "—" if row["step_peak_mb"] is None else f"{row['step_peak_mb']:,.0f}"


def _split(row: dict) -> str:
    """A step's forward + backward and optimizer medians, ms."""
    return f"{row['forward_backward_median_s'] * 1e3:.0f} / {row['optimizer_median_s'] * 1e3:.0f}"


def training_table(records: list[dict]) -> str:
    """Training step per rung and n: TNN, Llama, the free mixer, the ratio and the bound."""
    lines = ["Training step (forward with the loss + backward + AdamW step; median ms; batch = max(1, tokens per step "
             "// n)). Free mixer: Llama with its attention call costing nothing; bound = Llama / free mixer. Peak: "
             "MB over the resident set before one warm step.", "",
             "| rung | n | batch | TNN ms | Llama ms | free-mixer ms | Llama / TNN | bound | TNN fwd+bwd / opt ms | "
             "Llama fwd+bwd / opt ms | TNN peak MB | Llama peak MB |", "|---" * 12 + "|"]
    for r in records:
        for n in sorted({t["n"] for t in r["training"]}):
            tnn, llama, free = (_get(r["training"], model=m, n=n) for m in ("tnn", "llama", "llama free mixer"))
            lines.append(f"| {r['rung']} | {n} | {tnn['batch']} | {tnn['step_ms']:.0f} | {llama['step_ms']:.0f} | "
                         f"{free['step_ms']:.0f} | {llama['step_ms'] / tnn['step_ms']:.2f} | "
                         f"{llama['step_ms'] / free['step_ms']:.2f} | {_split(tnn)} | {_split(llama)} | {_peak(tnn)} | "
                         f"{_peak(llama)} |")
    return "\n".join(lines)


def decode_table(records: list[dict]) -> str:
    """Decode ms/token and state per sequence per rung, batch and context."""
    lines = ["Decode, ms per token (median of single steps after an untimed one; the prefill not timed) and state "
             "per sequence (MB; TNN: the cache's `memory_bytes()` at batch 1, Llama: its keys and values)", "",
             "| rung | batch | context | TNN ms | Llama ms | Llama / TNN | TNN state MB | Llama KV MB |",
             "|---|---|---|---|---|---|---|---|"]
    for r in records:
        for batch in sorted({d["batch"] for d in r["decode"]}):
            for context in sorted({d["context"] for d in r["decode"]}):
                tnn = _get(r["decode"], model="tnn", batch=batch, context=context)
                llama = _get(r["decode"], model="llama", batch=batch, context=context)
                if not tnn and not llama:
                    continue
                ratio = f"{llama['ms_per_token'] / tnn['ms_per_token']:.2f}" if tnn and llama else "—"
                lines.append(f"| {r['rung']} | {batch} | {context} | "
                             + (f"{tnn['ms_per_token']:.2f}" if tnn else "dropped") + " | "
                             + (f"{llama['ms_per_token']:.2f}" if llama else "dropped") + f" | {ratio} | "
                             f"{_mb(tnn['state_bytes_per_sequence'] if tnn else None)} | "
                             f"{_mb(r['llama_kv_bytes_per_sequence'][str(context)])} |")
    return "\n".join(lines)


def targets_table(records: list[dict]) -> str:
    """One row per rung, one column per target: PASS/FAIL, the ratio and the ratio required."""
    goals = {r["rung"]: {t["target"]: t for t in targets(r)} for r in records}
    names = list(dict.fromkeys(name for rows in goals.values() for name in rows))
    lines = ["Targets of issue 29 part 5 (and part 3's state): PASS/FAIL, the ratio, and the ratio required", "",
             "| rung | " + " | ".join(names) + " |", "|---" * (len(names) + 1) + "|"]
    for rung, rows in goals.items():
        cells = [("PASS" if rows[n]["passed"] else "FAIL") + f" {rows[n]['ratio']:.2f}x (>= {rows[n]['required']:.2f})"
                 if n in rows else "—" for n in names]
        lines.append(f"| {rung} | " + " | ".join(cells) + " |")
    return "\n".join(lines)


def render(args, records: list[dict], dropped: list[dict]) -> str:
    parts = [f"TNN (initial weights, dropout 0, `generation_cache=\"auto\"`) against Llama of matched parameter count "
             f"(the TNN's width, depth and vocabulary, heads of 64, sdpa, tied embeddings, MLP width solved for the "
             f"count), float32, one torch thread, each rung in its own process. Medians of {args.rounds} interleaved "
             f"rounds (prefill: {args.prefill_rounds}). Ratio = Llama's time / TNN's (> 1: TNN faster)."]
    lines = ["| rung | TNN parameters | Llama parameters | Llama (hidden x layers, heads, MLP) | TNN plan (compact "
             "fit, s) | fit ms per channel | largest bound | rung process peak RSS (MB) | rung wall (s) |",
             "|---|---|---|---|---|---|---|---|---|"]
    for r in records:
        lc, fit = r["llama_config"], r["fit"]
        if fit is None:
            plan = per_channel = bound = "not measured"
        else:
            plan = f"{plan_summary(fit['plans'])} ({fit['fit_s']:.1f})"
            per_channel = f"{1e3 * fit['fit_s'] / fit['channels']:.2f}"
            bound = "exact" if fit["max_error_bound"] is None else f"{fit['max_error_bound']:.1e}"
        lines.append(f"| {r['rung']} | {r['parameters']['tnn']:,} | {r['parameters']['llama']:,} | "
                     f"{lc['hidden_size']} x {lc['layers']}, {lc['heads']}, {lc['intermediate_size']:,} | "
                     f"{plan} | {per_channel} | {bound} | {r['process_peak_rss_mb']:,.0f} | {r['seconds']:.0f} |")
    parts.append("\n".join(lines))

    if any(r["decode"] for r in records):
        parts.append(decode_table(records))
    if any(r["training"] for r in records):
        parts.append(training_table(records))
    if any(r["prefill"] for r in records):
        lines = [f"Prefill of {args.prefill_length} tokens, batch 1 (median s; the forward that returns the decoding "
                 "state)", "", "| rung | TNN s | Llama s | Llama / TNN |", "|---|---|---|---|"]
        for r in records:
            tnn, llama = _get(r["prefill"], model="tnn"), _get(r["prefill"], model="llama")
            if tnn and llama:
                lines.append(f"| {r['rung']} | {tnn['seconds']:.2f} | {llama['seconds']:.2f} | "
                             f"{llama['seconds'] / tnn['seconds']:.2f} |")
        parts.append("\n".join(lines))

    if any(targets(r) for r in records):
        parts.append(targets_table(records))

    profiled = [(r["rung"], p) for r in records for p in r.get("profile", [])]
    if profiled:
        lines = ["Where the time goes (`--profile`): top operators by self CPU time of one profiled step (ms)", "",
                 "| rung | model | step | profiled s | top operators |", "|---|---|---|---|---|"]
        lines += [f"| {rung} | {p['model']} | {p['what']} | {p['seconds']:.3f} | "
                  + ", ".join(f"{k.removeprefix('aten::')} {v:.1f}" for k, v in p["top_self_cpu_ms"].items()) + " |"
                  for rung, p in profiled]
        parts.append("\n".join(lines))

    if dropped:
        lines = ["Rows dropped", "", "| rung | row | why |", "|---|---|---|"]
        lines += [f"| {d['rung']} | {d['row']} | {d['reason']} |" for d in dropped]
        parts.append("\n".join(lines))
    return "\n\n".join(parts)


# -- figure ----------------------------------------------------------------------------------------------------------


def plot(records: list[dict], path: Path) -> None:
    """Log-log: training step time, decode ms/token and state bytes per sequence against parameters."""
    plt = pyplot()
    fig, axes = plt.subplots(1, 3, figsize=(16, 4.8))
    params = {r["rung"]: r["parameters"]["tnn"] for r in records}

    def series(ax, label, points, **style):
        points = [(x, y) for x, y in points if y]
        if points:
            ax.plot(*zip(*points), label=label, **{"marker": "o", **style})

    colours = {"tnn": "C0", "llama": "C1", "llama free mixer": "C2"}
    styles, markers = ("-", "--", ":", "-."), ("o", "s", "^", "v", "D")
    lengths = sorted({t["n"] for r in records for t in r["training"]})
    for index, n in enumerate(lengths):
        for model, colour in colours.items():
            series(axes[0], f"{model} n={n}", [(params[r["rung"]], (_get(r["training"], model=model, n=n) or {})
                                                .get("step_ms")) for r in records], color=colour,
                   linestyle=styles[index % len(styles)])
    axes[0].set_ylabel("training step, ms (median)")
    contexts = sorted({d["context"] for r in records for d in r["decode"]})
    batches = sorted({d["batch"] for r in records for d in r["decode"]})
    for index, batch in enumerate(batches):
        for model in ("tnn", "llama"):
            for where, context in enumerate(contexts):
                series(axes[1], f"{model} b{batch} @{context}",
                       [(params[r["rung"]], (_get(r["decode"], model=model, batch=batch, context=context) or {})
                         .get("ms_per_token")) for r in records], color=colours[model],
                       linestyle=styles[index % len(styles)], marker=markers[where % len(markers)])
    axes[1].set_ylabel("decode, ms per token (median)")
    series(axes[2], "tnn state", [(params[r["rung"]], max((d["state_bytes_per_sequence"] for d in r["decode"]
                                                           if d["model"] == "tnn"), default=None)) for r in records],
           color=colours["tnn"])
    for where, context in enumerate(sorted({256, *contexts})):
        series(axes[2], f"llama KV @{context}", [(params[r["rung"]], r["llama_kv_bytes_per_sequence"].get(str(context)))
                                                 for r in records], color=colours["llama"], linestyle="--",
               marker=markers[where % len(markers)])
    axes[2].set_ylabel("decoding state per sequence, bytes")
    axes[1].set_title("decode (line: batch, marker: context)", fontsize=9)
    for ax in axes:
        ax.set_xscale("log")
        ax.set_yscale("log")
        ax.set_xlabel("parameters (TNN; Llama matched)")
        ax.grid(True, which="both", alpha=0.3)
        if ax.get_legend_handles_labels()[0]:
            ax.legend(fontsize=7)
    fig.suptitle("Scale ladder: TNN against Llama of matched size, one thread")
    save_figure(fig, path)


def report(args, command: str, records: list[dict], started: float, failed: list[dict] = ()) -> Path:
    """Write the ladder's folder (``failed``: rows for the rungs whose process failed); returns it."""
    dropped = [d for r in records for d in r["dropped"]] + list(failed)
    table = render(args, records, dropped)
    print(table)
    settings = {k: v for k, v in vars(args).items() if k not in ("rung_worker", "rung_list")}
    settings["rungs"] = [dict(name=r.name, preset=r.preset, overrides=r.overrides, tokens_per_step=r.tokens,
                              drops=r.drops) for r in args.rung_list]
    results = dict(rungs=records, targets={r["rung"]: targets(r) for r in records}, dropped=dropped)
    folder = write_report(args.output_dir, "scale ladder", command, settings, results, table, figure="ladder.png",
                          plot=lambda path: plot(records, path), started=started)
    print(f"wrote {folder}/results.json, table.md, ladder.png")
    return folder
