"""Where the real datasets (GLUE, WikiText-2, Tiny Shakespeare) are found: ``$TNN_DATA_DIR``, else a ``shared/data``
folder laid beside the project checkout."""

from __future__ import annotations

import os
from pathlib import Path

PROJECT_ROOT = Path(__file__).resolve().parents[3]  # the checkout holding modeling_tnn/ (an editable install)


def find_data_dir() -> Path | None:
    """``$TNN_DATA_DIR``, else ``shared/data`` beside the project, when that folder exists; otherwise ``None``."""
    for candidate in (os.environ.get("TNN_DATA_DIR"), PROJECT_ROOT.parent / "shared" / "data"):
        if candidate and Path(candidate).is_dir():
            return Path(candidate)
    return None
