"""The recipes' dependencies beyond the model's: the ``train`` extra. A recipe imported without them stops with one
error naming what is missing and the command that installs it, instead of a bare ``No module named ...``."""

from __future__ import annotations

import importlib.util
from collections.abc import Mapping, Sequence

INSTALL_COMMAND = 'pip install "modeling-tnn[train]"'
# The `train` extra of pyproject.toml: import name -> distribution name.
TRAIN_MODULES = {"accelerate": "accelerate", "datasets": "datasets", "numpy": "numpy", "scipy": "scipy",
                 "sklearn": "scikit-learn", "matplotlib": "matplotlib", "tqdm": "tqdm"}


def missing_modules(modules: Sequence[str]) -> list[str]:
    """The names in ``modules`` that cannot be imported here (found without importing them)."""
    missing = []
    for name in modules:
        try:
            found = importlib.util.find_spec(name) is not None
        except (ImportError, ValueError):  # a parent package that fails, or a module set to None in sys.modules
            found = False
        if not found:
            missing.append(name)
    return missing


def require_train_extra(modules: Mapping[str, str] = TRAIN_MODULES) -> None:
    """Raise ``ModuleNotFoundError`` naming the missing distributions and :data:`INSTALL_COMMAND` when any of
    ``modules`` (import name -> distribution; default: the whole ``train`` extra) is not installed."""
    missing = missing_modules(list(modules))
    if missing:
        names = ", ".join(modules[name] for name in missing)
        raise ModuleNotFoundError(
            f"modeling_tnn.recipes needs {names}, which the model's own install (`pip install modeling-tnn`) leaves "
            f"out: install the training dependencies with `{INSTALL_COMMAND}`.", name=missing[0])
