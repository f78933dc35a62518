"""Named configuration presets (the JSON files of the project's ``configuration/`` folder, shipped as package data)."""

from __future__ import annotations

import dataclasses
import json
from pathlib import Path

from .configuration_tnn import TnnConfig

_HERE = Path(__file__).resolve().parent
# Installed wheel: modeling_tnn/presets/*.json. Source checkout: configuration/*.json beside the package.
_PRESET_DIRS = (_HERE / "presets", _HERE.parent / "configuration")


def _preset_dir() -> Path:
    for folder in _PRESET_DIRS:
        if folder.is_dir() and any(folder.glob("*.json")):
            return folder
    raise FileNotFoundError(f"No TNN preset folder found (looked in {', '.join(map(str, _PRESET_DIRS))}).")


def list_presets() -> list[str]:
    """Names of the shipped presets, e.g. ``["lra_listops", "roberta_blm", "small", "tiny", "wikitext103_lm"]``."""
    return sorted(p.stem for p in _preset_dir().glob("*.json"))


def load_preset(name_or_path: str | Path, **overrides) -> TnnConfig:
    """A :class:`TnnConfig` from a preset name, a JSON file, or a folder holding ``config.json``.

    Keyword ``overrides`` replace preset fields; a name that is not a ``TnnConfig`` field raises ``ValueError``.
    """
    path = Path(name_or_path)
    if path.is_dir():
        path = path / "config.json"
    if not path.is_file():
        names = list_presets()
        if str(name_or_path) not in names:
            raise ValueError(f"Unknown TNN preset {str(name_or_path)!r}: use one of {names}, a JSON file or a folder.")
        path = _preset_dir() / f"{name_or_path}.json"
    values = {k: v for k, v in json.loads(path.read_text()).items() if not k.startswith("_")}
    # TnnConfig's fields (with the base config's: labels, problem_type, ...) and the usual extras transformers keeps.
    known = set(TnnConfig().to_dict()) | set(values) | {f.name for f in dataclasses.fields(TnnConfig)} | {
        "num_labels", "finetuning_task", "auto_map"}
    unknown = sorted(set(overrides) - known)
    if unknown:
        raise ValueError(f"Unknown TnnConfig field(s) {unknown} in overrides; known fields: {sorted(known)}.")
    values.update(overrides)
    return TnnConfig(**values)
