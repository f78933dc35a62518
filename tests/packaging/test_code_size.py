"""The size caps of the team's rules: every ``run_scripts/*.py`` is a thin entry point of at most 40 lines over a
recipe module; every module of the package at most 450 lines, except ``modeling_tnn/modeling_tnn.py`` (600) and the
recipes' modules (500). A file over its cap is named with its length, so the fix (a split, or logic moved out of a
script) starts from the failure."""

from __future__ import annotations

from pathlib import Path

from tests.support import PROJECT_ROOT

PACKAGE = PROJECT_ROOT / "modeling_tnn"
SCRIPT_CAP = 40
MODULE_CAP = 450
RECIPE_CAP = 500
OWN_CAPS = {PACKAGE / "modeling_tnn.py": 600}


def line_count(path: Path) -> int:
    return len(path.read_text(encoding="utf-8").splitlines())


def cap_of(path: Path) -> int:
    """The most lines the module ``path`` may have."""
    if path in OWN_CAPS:
        return OWN_CAPS[path]
    return RECIPE_CAP if path.is_relative_to(PACKAGE / "recipes") else MODULE_CAP


def test_run_scripts_are_thin_entry_points():
    scripts = sorted((PROJECT_ROOT / "run_scripts").glob("*.py"))
    assert scripts
    over = {path.name: line_count(path) for path in scripts if line_count(path) > SCRIPT_CAP}
    assert not over, f"run_scripts over {SCRIPT_CAP} lines (move the logic into a recipe module): {over}"


def test_modules_keep_their_caps():
    modules = sorted(PACKAGE.rglob("*.py"))
    assert len(modules) > 50 and PACKAGE / "recipes" / "glue" / "suite.py" in modules
    over = {str(path.relative_to(PROJECT_ROOT)): f"{line_count(path)} > {cap_of(path)}" for path in modules
            if line_count(path) > cap_of(path)}
    assert not over, over


def test_the_caps_are_the_rules():
    assert cap_of(PACKAGE / "modeling_tnn.py") == 600
    assert cap_of(PACKAGE / "tnn_block.py") == 450
    assert cap_of(PACKAGE / "recipes" / "benchmarks" / "training.py") == 500
