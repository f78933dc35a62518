"""The Hub-ready folder of a run: an allow-list of what a model repository may hold, the model code it ships, and the
checks (allow-list, token leaks, repository id, token present) before any upload."""

from __future__ import annotations

import fnmatch
import json
import shutil
from pathlib import Path, PurePosixPath
from typing import Any

from modeling_tnn.fit_plan_file import PLAN_FILE
from modeling_tnn.modeling_tnn import AUTO_MAP  # noqa: E402  (every Auto class a TNN folder can expose)

from ..common.run_files import TOKENIZER_FILES, WEIGHT_FILE, WEIGHT_INDEX
from .model_card import PLOTS_DIR, CardOptions, build_card, shipped_auto_map, usage_snippet, write_plots
from .run_inspection import PublishError, RunInfo, eval_results_from_run

# The allow-list: top-level file patterns, plus PNG plots one level down in plots/. Everything else (optimizer and
# scheduler states, RNG states, checkpoints, training_args.bin, trainer_state.json, metrics and logs, caches, ...)
# is refused by check_folder. "*.py" is narrowed further by build_hub_folder to the model code's import closure.
ALLOWED_PATTERNS = ("README.md", "config.json", "generation_config.json", WEIGHT_FILE, WEIGHT_INDEX, PLAN_FILE,
                    "model-[0-9][0-9][0-9][0-9][0-9]-of-[0-9][0-9][0-9][0-9][0-9].safetensors", "*.py",
                    *TOKENIZER_FILES, f"{PLOTS_DIR}/*.png")


def validate_repo_id(repo_id: str, flag: str = "--repo_id") -> None:
    """``repo_id`` must be ``ORG/NAME`` and pass ``huggingface_hub.utils.validate_repo_id`` (the check the Hub
    client applies before any request: letters, digits, ``-``, ``_``, ``.``, no ``--`` or ``..``, no ``.git``
    ending, at most 96 characters a part); the :class:`PublishError` names ``flag``, the option the id came from."""
    from huggingface_hub.errors import HFValidationError
    from huggingface_hub.utils import validate_repo_id as hub_validate_repo_id

    refused = PublishError(f"{flag} {repo_id!r} is not a Hub model id of the form ORG/NAME.")
    if not isinstance(repo_id, str) or repo_id.count("/") != 1:  # a bare NAME would go to the token's namespace
        raise refused
    try:
        hub_validate_repo_id(repo_id)
    except HFValidationError:
        raise refused from None


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


def require_token() -> None:
    """Fail before building or uploading when huggingface_hub finds no token (``HF_TOKEN`` or ``hf auth login``).
    The token itself is never returned, passed on or printed."""
    if not _current_token():
        raise PublishError("no Hugging Face token found: run `hf auth login` or set HF_TOKEN (or use --dry-run).")


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

    from modeling_tnn.checkpoint_layout import split_projections

    model = getattr(modeling_tnn, info.architecture)(modeling_tnn.TnnConfig.from_dict(info.config))
    saved: set[str] = set()
    for name in info.weight_files:
        if name.endswith(".safetensors"):
            with safe_open(str(info.path / name), "pt") as handle:
                saved.update(handle.keys())
    # Weights load in either layout: the fused projections, or split as save_pretrained writes them.
    layouts = [set(model.state_dict()), set(split_projections(model.state_dict()))]
    expected = min(layouts, key=lambda keys: len(keys ^ saved))
    tied = {key for key in expected - saved if key.endswith(("lm_head.weight", "decoder.weight"))}
    if (expected - saved - tied) or (saved - expected):
        raise PublishError(f"the weights in {info.path} do not match the installed modeling_tnn code (missing "
                           f"{sorted(expected - saved - tied)[:5]}, unexpected {sorted(saved - expected)[:5]}); "
                           "publish with --code run.")


def write_decoding_plan(info: RunInfo, out_dir: Path) -> bool:
    """Fit a causal run's decoding plan with the installed ``modeling_tnn`` (or take the run's own
    ``decoding_plan.safetensors`` where it matches the weights) and write it into ``out_dir``, so that the published
    model's first ``generate`` fits nothing. Returns whether a plan was written (not for a model whose mixers offer
    no compact state: FD, a kernel that does not decay, a bidirectional model)."""
    import modeling_tnn
    from modeling_tnn.fit_plan_file import plan_mixers, write_plan_file

    if not info.causal or info.architecture not in ("TnnForCausalLM", "TnnModel"):
        return False
    model = getattr(modeling_tnn, info.architecture).from_pretrained(info.path).eval()
    if not plan_mixers(model):
        return False
    model.fit_decoding_plan()
    return write_plan_file(model, out_dir) is not None


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
    write_decoding_plan(info, out)
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
