"""The decoding plan shipped with a checkpoint, end to end on a preset (default the paper's language model,
``wikitext103_lm``, 48.7M parameters, initial weights):

1. this process: the model, ``fit_decoding_plan()`` (timed) and ``save_pretrained`` (timed) into a folder;
2. a fresh process (``--load FOLDER``): ``from_pretrained`` plus the first cached forward of 64 tokens (timed, loading
   included; the interpreter's start and imports timed apart), every layer's ``plan_source``; then ``--new_tokens``
   greedy tokens after a ``--prompt``-token prompt, every logit against the no-cache forward of the whole sequence;
   then one kernel parameter of the middle layer changed (its RPE's output bias of channel 0, which moves the
   logits): that layer must report ``"refitted"``, the others ``"checkpoint"``, and decoding must still match.

A layer whose ``plan_source`` is ``"checkpoint"`` ran no fit (the planner fits only otherwise), so the fits of a
forward are its rows of another source. Pass: load + first forward under ``--target_seconds``, every layer
``"checkpoint"``, the decode errors within ``--atol``, exactly the edited layer ``"refitted"``.

    python run_scripts/check_shipped_plan.py --output_dir results/shipped_plan
"""

from __future__ import annotations

import argparse
import json
import subprocess
import sys
import tempfile
import time
from pathlib import Path

import torch

from modeling_tnn import TnnForCausalLM, load_preset
from modeling_tnn.modeling_tnn import CACHE_FIELD

from .harness import CLOCK, command_line, pyplot, save_figure, set_threads, write_report

SCRIPT = "run_scripts/check_shipped_plan.py"
FIRST_FORWARD_TOKENS = 64


def parse_args(argv: list[str]) -> argparse.Namespace:
    parser = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("--preset", default="wikitext103_lm", help="a load_preset name (default: %(default)s)")
    parser.add_argument("--prompt", type=int, default=1024, help="prompt tokens before decoding")
    parser.add_argument("--new_tokens", type=int, default=16, help="greedy tokens decoded and checked")
    parser.add_argument("--atol", type=float, default=1e-4, help="largest logit difference allowed")
    parser.add_argument("--target_seconds", type=float, default=3.0, help="load + first cached forward target")
    parser.add_argument("--threads", type=int, default=1)
    parser.add_argument("--output_dir", default="results/shipped_plan")
    parser.add_argument("--load", help=argparse.SUPPRESS)  # the fresh process's part: the saved folder
    parser.add_argument("--spawned_at", type=float, help=argparse.SUPPRESS)
    args = parser.parse_args(argv)
    if args.prompt < FIRST_FORWARD_TOKENS or args.new_tokens < 1 or args.threads < 1:
        raise ValueError(f"--prompt must be at least {FIRST_FORWARD_TOKENS}, --new_tokens and --threads at least 1; "
                         f"got {args.prompt}, {args.new_tokens}, {args.threads}.")
    return args


def sources(cache) -> list[str | None]:
    return [row["plan_source"] for row in cache.describe()]


def decode_check(model: TnnForCausalLM, prompt: int, new_tokens: int) -> dict:
    """Greedy decoding after a random prompt against the no-cache forward of the whole sequence: the largest logit
    difference over the prompt's last position and every decoded token, its relative size, the plan sources, and
    the time of the cached prefill (which fits what is not shipped)."""
    generator = torch.Generator().manual_seed(1)
    ids = torch.randint(3, model.config.vocab_size, (1, prompt), generator=generator)
    with torch.no_grad():
        start = CLOCK()
        out = model(ids, use_cache=True)
        prefill = CLOCK() - start
        cache, logits = getattr(out, CACHE_FIELD), [out.logits[:, -1]]
        for _ in range(new_tokens):
            token = logits[-1].argmax(-1, keepdim=True)
            ids = torch.cat([ids, token], dim=1)
            logits.append(model(token, **{CACHE_FIELD: cache}, use_cache=True).logits[:, -1])
        reference = model(ids, use_cache=False).logits[0, prompt - 1:]
    difference = (torch.stack(logits, 1)[0] - reference).abs().max().item()
    return dict(max_abs_logit_difference=difference, relative=difference / reference.abs().max().item(),
                plan_source=sources(cache), prefill_seconds=round(prefill, 3))


def measure_loaded(args: argparse.Namespace) -> dict:
    """The fresh process's part (``--load``): load, first forward, decode check, one weight changed, check again."""
    started = time.time()
    set_threads(args.threads)
    start = CLOCK()
    model = TnnForCausalLM.from_pretrained(args.load).eval()
    loaded = CLOCK() - start
    with torch.no_grad():
        out = model(torch.randint(3, model.config.vocab_size, (1, FIRST_FORWARD_TOKENS)), use_cache=True)
    first = CLOCK() - start
    result = dict(startup_seconds=round(started - args.spawned_at, 3), load_seconds=round(loaded, 3),
                  load_and_first_forward_seconds=round(first, 3),
                  first_forward_sources=sources(getattr(out, CACHE_FIELD)),
                  shipped=decode_check(model, args.prompt, args.new_tokens))
    layer = model.config.num_hidden_layers // 2
    probe = torch.randint(3, model.config.vocab_size, (1, FIRST_FORWARD_TOKENS))
    with torch.no_grad():  # one kernel parameter, as a finetuning step would change it
        before = model(probe, use_cache=False).logits
        # The RPE's output bias of channel 0: it moves that channel's kernel at every lag (an output weight may meet
        # a hidden unit the ReLU keeps at zero, and change nothing).
        model.model.layers[layer].gtu.token_mixer.rpe.out_proj.bias[0] += 0.05
        moved = (model(probe, use_cache=False).logits - before).abs().max().item()
    result.update(edited_layer=layer, edit_moved_logits_by=moved,
                  edited=decode_check(model, args.prompt, args.new_tokens))
    return result


def verdicts(args: argparse.Namespace, loaded: dict) -> dict[str, bool]:
    layers = len(loaded["first_forward_sources"])
    expected_edit = ["refitted" if i == loaded["edited_layer"] else "checkpoint" for i in range(layers)]
    return {
        f"load + first forward under {args.target_seconds} s": loaded["load_and_first_forward_seconds"]
        < args.target_seconds,
        "every layer 'checkpoint' (no fit)": loaded["first_forward_sources"] == ["checkpoint"] * layers
        and loaded["shipped"]["plan_source"] == ["checkpoint"] * layers,
        f"decoding within {args.atol:g} (shipped plan)": loaded["shipped"]["max_abs_logit_difference"] <= args.atol,
        "only the edited layer 'refitted'": loaded["edited"]["plan_source"] == expected_edit
        and loaded["edit_moved_logits_by"] > 0,
        f"decoding within {args.atol:g} (after the edit)": loaded["edited"]["max_abs_logit_difference"] <= args.atol,
    }


def render(saved: dict, loaded: dict, passed: dict[str, bool]) -> str:
    rows = [("fit_decoding_plan (this process)", f"{saved['fit_seconds']:.1f} s"),
            ("save_pretrained with the plan", f"{saved['save_seconds']:.2f} s, plan file "
                                              f"{saved['plan_bytes']:,} bytes"),
            ("fresh process: interpreter start and imports", f"{loaded['startup_seconds']:.2f} s"),
            ("from_pretrained", f"{loaded['load_seconds']:.2f} s"),
            (f"from_pretrained + first cached forward ({FIRST_FORWARD_TOKENS} tokens)",
             f"{loaded['load_and_first_forward_seconds']:.2f} s"),
            ("plan_source after loading", ", ".join(map(str, loaded["first_forward_sources"]))),
            ("decode vs no-cache forward, largest logit difference",
             f"{loaded['shipped']['max_abs_logit_difference']:.2e} (relative {loaded['shipped']['relative']:.1e})"),
            (f"layer {loaded['edited_layer']} edited (no-cache logits moved by "
             f"{loaded['edit_moved_logits_by']:.1e}): plan_source",
             ", ".join(map(str, loaded["edited"]["plan_source"]))),
            ("after the edit: prefill (refits that layer)", f"{loaded['edited']['prefill_seconds']:.2f} s"),
            ("after the edit: largest logit difference",
             f"{loaded['edited']['max_abs_logit_difference']:.2e} (relative {loaded['edited']['relative']:.1e})")]
    rows += [(check, "pass" if ok else "FAIL") for check, ok in passed.items()]
    return "\n".join(["| step | result |", "|---|---|", *(f"| {a} | {b} |" for a, b in rows)])


def plot(saved: dict, loaded: dict, path: Path) -> None:
    plt = pyplot()
    labels = ["fit (once,\nbefore saving)", "save", "load", "load + first\ncached forward"]
    values = [saved["fit_seconds"], saved["save_seconds"], loaded["load_seconds"],
              loaded["load_and_first_forward_seconds"]]
    fig, ax = plt.subplots(figsize=(6, 3.5))
    ax.bar(labels, values)
    ax.set_ylabel("seconds")
    ax.set_yscale("log")
    ax.set_title("decoding plan shipped with the checkpoint")
    save_figure(fig, path)


def main(argv: list[str] | None = None) -> int:
    argv = sys.argv[1:] if argv is None else list(argv)
    args = parse_args(argv)
    if args.load:
        print(json.dumps(measure_loaded(args)))
        return 0
    started = CLOCK()
    set_threads(args.threads)
    torch.manual_seed(0)
    model = TnnForCausalLM(load_preset(args.preset)).eval()
    with tempfile.TemporaryDirectory(prefix="tnn-shipped-plan-") as folder:
        start = CLOCK()
        model.fit_decoding_plan()
        fit = CLOCK() - start
        start = CLOCK()
        model.save_pretrained(folder)
        saved = dict(parameters=model.num_parameters(), fit_seconds=round(fit, 2),
                     save_seconds=round(CLOCK() - start, 3),
                     plan_bytes=(Path(folder) / "decoding_plan.safetensors").stat().st_size)
        del model
        child = subprocess.run([sys.executable, "-m", __name__, *argv, "--load", folder, "--spawned_at",
                                repr(time.time())], capture_output=True, text=True)
    if child.returncode != 0:
        raise RuntimeError(f"the fresh process failed:\n{child.stderr[-4000:]}")
    loaded = json.loads(child.stdout.strip().splitlines()[-1])
    passed = verdicts(args, loaded)
    table = render(saved, loaded, passed)
    print(table)
    write_report(args.output_dir, "shipped decoding plan", command_line(SCRIPT, argv), vars(args),
                 dict(saved=saved, loaded=loaded, passed=passed), table, figure="timings.png",
                 plot=lambda path: plot(saved, loaded, path), started=started)
    return 0 if all(passed.values()) else 1


if __name__ == "__main__":
    raise SystemExit(main())
