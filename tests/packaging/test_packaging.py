"""Packaging: every runtime dependency is used, the license file matches pyproject, and `make install` takes torch
from the CPU wheel index unless told otherwise."""

from __future__ import annotations

import re
import shutil
import subprocess
import tomllib

import pytest

from tests.support import PROJECT_ROOT

from modeling_tnn.recipes.common.extras import TRAIN_MODULES

# Distribution name -> import name, where they differ.
IMPORT_NAMES = {"scikit-learn": "sklearn", "huggingface-hub": "huggingface_hub"}
CPU_INDEX = "https://download.pytorch.org/whl/cpu"


def _pyproject() -> dict:
    return tomllib.loads((PROJECT_ROOT / "pyproject.toml").read_text())


def test_every_runtime_dependency_is_imported():
    """A dependency that nothing imports (as `evaluate` was: the GLUE metrics are scikit-learn/scipy) only makes the
    install longer."""
    sources = "\n".join(path.read_text() for folder in ("modeling_tnn", "run_scripts")
                        for path in sorted((PROJECT_ROOT / folder).rglob("*.py")))
    project, unused = _pyproject()["project"], []
    for requirement in [*project["dependencies"], *project["optional-dependencies"]["train"]]:
        name = re.match(r"[A-Za-z0-9_.-]+", requirement).group(0)
        module = IMPORT_NAMES.get(name.lower(), name.lower().replace("-", "_"))
        if not re.search(rf"^\s*(import|from)\s+{re.escape(module)}\b", sources, flags=re.MULTILINE):
            unused.append(name)
    assert not unused, f"dependencies that modeling_tnn/ and run_scripts/ never import: {unused}"


def _names(requirements: list[str]) -> list[str]:
    return [re.match(r"[A-Za-z0-9_.-]+", requirement).group(0).lower() for requirement in requirements]


def test_required_dependencies_are_the_models_and_the_train_extra_the_recipes():
    """`pip install modeling-tnn` brings what the model needs; the recipes' stack is the `train` extra, which
    recipes/common/extras.py checks for (and `dev` includes)."""
    project = _pyproject()["project"]
    extras = project["optional-dependencies"]
    assert _names(project["dependencies"]) == ["torch", "transformers", "safetensors", "huggingface-hub", "tokenizers"]
    assert sorted(_names(extras["train"])) == sorted(TRAIN_MODULES.values())
    assert "modeling-tnn[train]" in extras["dev"]


def test_every_package_folder_ships():
    """pyproject lists the packages (packages.find cannot also map the presets): every folder under modeling_tnn/
    with an __init__.py is listed."""
    listed = set(_pyproject()["tool"]["setuptools"]["packages"])
    found = {".".join(path.parent.relative_to(PROJECT_ROOT).parts)
             for path in (PROJECT_ROOT / "modeling_tnn").rglob("__init__.py")}
    assert found <= listed, sorted(found - listed)


def test_license_file_is_apache_2():
    assert _pyproject()["project"]["license"] == "Apache-2.0"  # an SPDX expression (setuptools >= 77)
    assert _pyproject()["project"]["license-files"] == ["LICENSE"]
    assert "setuptools>=77" in _pyproject()["build-system"]["requires"]
    text = (PROJECT_ROOT / "LICENSE").read_text()
    assert text.lstrip().startswith("Apache License\n                           Version 2.0, January 2004")
    for clause in ("1. Definitions.", "2. Grant of Copyright License.", "3. Grant of Patent License.",
                   "4. Redistribution.", "9. Accepting Warranty or Additional Liability.",
                   "END OF TERMS AND CONDITIONS", "APPENDIX: How to apply the Apache License to your work."):
        assert clause in text, clause


def _dry_run_install(*overrides: str) -> list[str]:
    if shutil.which("make") is None:
        pytest.skip("make is not installed")
    result = subprocess.run(["make", "-n", "-B", "install", "VENV=venv-that-is-never-made", *overrides],
                            cwd=PROJECT_ROOT, capture_output=True, text=True, check=True)
    return [line for line in result.stdout.splitlines() if "pip install" in line and "torch==" in line]


def test_make_install_takes_torch_from_the_cpu_index_by_default():
    (line,) = _dry_run_install()
    assert f"--extra-index-url {CPU_INDEX}" in line and "--retries 1" in line
    (line,) = _dry_run_install("TORCH_INDEX_URL=https://download.pytorch.org/whl/cu128")
    assert "--extra-index-url https://download.pytorch.org/whl/cu128" in line and CPU_INDEX not in line
    (line,) = _dry_run_install("TORCH_INDEX_URL=")  # empty: pip's configured indexes alone
    assert "--extra-index-url" not in line and "--retries" not in line
