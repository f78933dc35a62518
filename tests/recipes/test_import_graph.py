"""The recipes' import graph: groups depend one way (glue -> pretraining, glue and pretraining -> hub -> common;
benchmarks -> common, which imports nothing; glue's comparison recipe pretrains its models with pretraining's corpus
and tokenizer), the Hub code takes what it knows about a task from the run folder, and pretraining's data code sees
neither checkpoints nor the Hub."""

from __future__ import annotations

import ast

from tests.support import PROJECT_ROOT

RECIPES = PROJECT_ROOT / "modeling_tnn" / "recipes"
# group -> the other groups it may import
ALLOWED = {"common": set(), "pretraining": {"common", "hub", "benchmarks"}, "glue": {"common", "hub", "pretraining"},
           "hub": {"common"}, "listops": set(), "fairseq": set(), "benchmarks": {"common"}, "docs": set()}


def _imported_modules(path) -> set[str]:
    """The ``modeling_tnn.recipes`` modules a file imports, as ``group.module`` (relative imports resolved)."""
    package = path.relative_to(RECIPES).parent.parts  # ("pretraining",)
    found = set()
    for node in ast.walk(ast.parse(path.read_text())):
        if not isinstance(node, ast.ImportFrom):
            continue
        if node.level > len(package) + 1:
            continue  # the model package above the recipes
        if node.level:
            base = list(package[: len(package) - node.level + 1])
            parts = base + (node.module.split(".") if node.module else [])
        elif node.module and node.module.startswith("modeling_tnn.recipes."):
            parts = node.module.split(".")[2:]
        else:
            continue
        if parts:
            found.add(".".join(parts))
    return found


def test_groups_import_one_way():
    assert set(ALLOWED) == {p.name for p in RECIPES.iterdir() if (p / "__init__.py").is_file()}
    wrong = []
    for path in sorted(RECIPES.rglob("*.py")):
        group = path.relative_to(RECIPES).parts[0]
        if group == "__init__.py":
            continue
        for module in _imported_modules(path):
            other = module.split(".")[0]
            if other != group and other not in ALLOWED[group]:
                wrong.append(f"{path.relative_to(RECIPES)} imports {module}")
    assert not wrong, wrong


def test_pretraining_data_sees_no_checkpoint_or_hub_code():
    imported = _imported_modules(RECIPES / "pretraining" / "data.py")
    assert imported and not {m for m in imported
                             if m.startswith(("hub", "pretraining.checkpoints", "pretraining.arguments"))}, imported
