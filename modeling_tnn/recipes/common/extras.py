"""The recipes' dependencies beyond the model's: the ``train`` extra. A recipe imported without them stops with one
error naming what is missing and the command that installs it, instead of a bare ``No module named ...``."""

from __future__ import annotations

import importlib.util
from collections.abc import Mapping, Sequence
from pathlib import Path

# From a source checkout (the package is on no index, so `pip install "modeling-tnn[train]"` finds nothing there).
INSTALL_COMMAND = 'pip install -e ".[train]"'
# The `train` extra of pyproject.toml: import name -> distribution name.
TRAIN_MODULES = {"accelerate": "accelerate", "datasets": "datasets", "evaluate": "evaluate", "numpy": "numpy",
                 "scipy": "scipy", "sklearn": "scikit-learn", "matplotlib": "matplotlib", "tqdm": "tqdm"}
# The checkout this package runs from, if it runs from one (a pyproject.toml of this project beside the package).
_CHECKOUT = Path(__file__).resolve().parents[3]


def install_command(distributions: Sequence[str]) -> str:
    """The command that installs the ``train`` extra where this package runs: from a source checkout (an editable
    install, or the checkout on ``PYTHONPATH``) :data:`INSTALL_COMMAND` in that folder; from an installed wheel the
    missing ``distributions`` by name."""
    pyproject = _CHECKOUT / "pyproject.toml"
    if pyproject.is_file() and 'name = "modeling-tnn"' in pyproject.read_text(encoding="utf-8"):
        return f"{INSTALL_COMMAND} in {_CHECKOUT}"
    return "pip install " + " ".join(distributions)


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
    """Raise ``ModuleNotFoundError`` naming the missing distributions and the command that installs them here
    (:func:`install_command`) when any of ``modules`` (import name -> distribution; default: the whole ``train``
    extra) is not installed."""
    missing = missing_modules(list(modules))
    if missing:
        distributions = [modules[name] for name in missing]
        raise ModuleNotFoundError(
            f"modeling_tnn.recipes needs {', '.join(distributions)}, which the model's own install leaves out: "
            f"install the training dependencies with `{install_command(distributions)}`.", name=missing[0])
