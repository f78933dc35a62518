"""Metric logging of the pretraining scripts: ``metrics.jsonl`` plus Accelerate's trackers, and the silencing of a
save-time warning that tied embeddings make meaningless."""

from __future__ import annotations

import json
import logging
import re
from pathlib import Path
from typing import Any

import torch
from accelerate import Accelerator

from ..common.flag_checks import UsageError
from ..common.run_files import METRICS_FILE

logger = logging.getLogger(__name__)


class MetricsLog:
    """Appends one JSON object per line to ``output_dir/metrics.jsonl`` (main process) and forwards the values to
    Accelerate's trackers (TensorBoard, ...) when any is active."""

    def __init__(self, accelerator: Accelerator, output_dir: Path, trackers: bool):
        self.accelerator, self.path, self.trackers = accelerator, output_dir / METRICS_FILE, trackers

    def log(self, values: dict[str, Any], step: int) -> None:
        if self.accelerator.is_main_process:
            with open(self.path, "a") as handle:
                handle.write(json.dumps({"step": step, **values}) + "\n")
        if self.trackers:
            self.accelerator.log({k: v for k, v in values.items() if isinstance(v, (int, float))}, step=step)


class TiedWeightSaveFilter(logging.Filter):
    """Drops the warning Accelerate logs at every ``save_state`` of a model with tied embeddings, ``Removed shared
    tensor {'lm_head.weight'} while saving. ...``, when every name it lists is a tied weight registered in
    :attr:`names` (``from_pretrained`` and ``load_state`` re-tie those). Any other shared tensor still warns."""

    PATTERN = re.compile(r"Removed shared tensor \{(.*)\} while saving")

    def __init__(self) -> None:
        super().__init__()
        self.names: set[str] = set()

    def filter(self, record: logging.LogRecord) -> bool:
        match = self.PATTERN.search(record.getMessage())
        if match is None:
            return True
        listed = set(re.findall(r"'([^']*)'", match.group(1)))
        return not (listed and listed <= self.names)


TIED_WEIGHT_FILTER = TiedWeightSaveFilter()


def silence_tied_weight_warning(model: torch.nn.Module | None = None) -> None:
    """Install :data:`TIED_WEIGHT_FILTER` on Accelerate's logger (once) and register ``model``'s tied weights
    (the keys of its ``_tied_weights_keys``, e.g. ``lm_head.weight``)."""
    target = logging.getLogger("accelerate.utils.other")  # where clean_state_dict_for_safetensors logs
    if TIED_WEIGHT_FILTER not in target.filters:
        target.addFilter(TIED_WEIGHT_FILTER)
    tied = getattr(model, "_tied_weights_keys", None) if model is not None else None
    if isinstance(tied, dict):
        TIED_WEIGHT_FILTER.names.update(tied)
    elif isinstance(tied, (list, tuple, set)):
        TIED_WEIGHT_FILTER.names.update(tied)


def available_trackers(report_to: str) -> list[str]:
    """The trackers of ``--report_to`` whose packages are installed (missing ones are skipped with a warning)."""
    if report_to in ("none", ""):
        return []
    from accelerate.tracking import LOGGER_TYPE_TO_CLASS

    wanted = list(LOGGER_TYPE_TO_CLASS) if report_to == "all" else [x.strip() for x in report_to.split(",")]
    found = []
    for name in wanted:
        tracker = LOGGER_TYPE_TO_CLASS.get(name)
        if tracker is None:
            raise UsageError(f"--report_to {name!r} is not a tracker; use one of {sorted(LOGGER_TYPE_TO_CLASS)}, "
                             "'all' or 'none'.")
        if _tracker_installed(name):
            found.append(name)
        elif report_to != "all":
            logger.info("--report_to %s: the package is not installed, logging to %s only.", name, METRICS_FILE)
    return found


def _tracker_installed(name: str) -> bool:
    import accelerate.utils as utils

    check = getattr(utils, f"is_{name}_available", None)
    return bool(check and check())
