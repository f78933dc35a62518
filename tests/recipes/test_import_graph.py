"""The recipes' import graph: groups depend one way (glue -> pretraining, glue and pretraining -> hub -> common;
benchmarks -> pretraining, for the quality benchmark that trains through train_clm's code, and -> common, which
imports nothing; glue's comparison recipe pretrains its models with pretraining's corpus and tokenizer), no module of
a group takes part in an import cycle, the Hub code takes what it knows about a task from the run folder, and
pretraining's data code sees neither checkpoints nor the Hub."""

from __future__ import annotations

import ast
from pathlib import Path

import pytest

from tests.support import PROJECT_ROOT

RECIPES = PROJECT_ROOT / "modeling_tnn" / "recipes"
# group -> the other groups it may import. benchmarks -> pretraining: the quality benchmark drives train_clm's run
# (a benchmark measures the recipe, not the other way round); pretraining's --time_generation takes its timing loop
# from common, so pretraining imports no benchmark.
ALLOWED = {"common": set(), "pretraining": {"common", "hub"}, "glue": {"common", "hub", "pretraining"},
           "hub": {"common"}, "listops": set(), "fairseq": set(), "benchmarks": {"common", "pretraining"},
           "docs": set()}


def _resolve(parts: list[str], names: list[str]) -> set[str]:
    """``from PARTS import NAMES`` as ``modeling_tnn.recipes`` modules: ``PARTS.NAME`` for each name that is a module
    or a package there, ``PARTS`` itself for the other names (and for none)."""
    folder = RECIPES.joinpath(*parts)
    is_module = {name: (folder / f"{name}.py").is_file() or (folder / name / "__init__.py").is_file() for name in names}
    found = {".".join([*parts, name]) for name, module in is_module.items() if module}
    if parts and not all(is_module.values()):
        found.add(".".join(parts))
    return found


def _imported_modules(path: Path) -> set[str]:
    """The ``modeling_tnn.recipes`` modules a file imports anywhere in it (at module level, under ``TYPE_CHECKING``,
    inside functions), as ``group.module`` (relative imports resolved; a package as ``group``)."""
    package = list(path.relative_to(RECIPES).parent.parts)  # ["pretraining"]
    found: set[str] = set()
    for node in ast.walk(ast.parse(path.read_text())):
        if isinstance(node, ast.Import):
            for alias in node.names:
                if alias.name.startswith("modeling_tnn.recipes."):
                    found.add(alias.name.removeprefix("modeling_tnn.recipes."))
            continue
        if not isinstance(node, ast.ImportFrom):
            continue
        if node.level > len(package) + 1:
            continue  # the model package above the recipes
        if node.level:
            parts = package[: len(package) - node.level + 1] + (node.module.split(".") if node.module else [])
        elif node.module and (node.module + ".").startswith("modeling_tnn.recipes."):
            parts = node.module.split(".")[2:]
        else:
            continue
        found |= _resolve(parts, [alias.name for alias in node.names])
    found.discard("")
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


GROUPS = sorted(p.name for p in RECIPES.iterdir() if (p / "__init__.py").is_file())


def _group_graph(folder: Path) -> dict[str, set[str]]:
    """Within one group: each module (``__init__`` for the package itself) -> the group's modules it imports."""
    graph = {}
    for path in sorted(folder.glob("*.py")):
        edges = set()
        for module in _imported_modules(path):
            group, _, name = module.partition(".")
            if group == folder.name:
                edges.add(name or "__init__")
        graph[path.stem] = edges - {path.stem}
    return graph


def _cycles(graph: dict[str, set[str]]) -> list[list[str]]:
    """One import path per cycle of ``graph`` (``[a, b, a]``), found by a depth-first search."""
    cycles, state = [], {}  # state: 1 on the current path, 2 done

    def visit(node: str, path: list[str]) -> None:
        state[node] = 1
        for nxt in sorted(graph.get(node, ())):
            if state.get(nxt) == 1:
                cycles.append(path[path.index(nxt):] + [node, nxt] if nxt in path else [node, nxt])
            elif nxt not in state:
                visit(nxt, path + [node])
        state[node] = 2

    for node in sorted(graph):
        if node not in state:
            visit(node, [])
    return cycles


def test_the_groups_import_each_other_in_no_cycle():
    """The groups' allowed imports (which every module keeps to: test_groups_import_one_way) form no cycle."""
    assert not _cycles(ALLOWED), _cycles(ALLOWED)
    assert _cycles({"a": {"b"}, "b": {"c"}, "c": {"a"}, "d": {"a"}}) == [["a", "b", "c", "a"]]  # it finds one


@pytest.mark.parametrize("group", GROUPS)
def test_no_import_cycle_within_a_group(group):
    """No two modules of a group import each other, directly or through others: a shared name moves to a module
    both can import. Every relative or absolute import counts, also under TYPE_CHECKING and inside functions."""
    graph = _group_graph(RECIPES / group)
    assert graph, group
    assert not _cycles(graph), [" -> ".join(cycle) for cycle in _cycles(graph)]


def test_the_cycle_check_sees_imports_inside_functions_and_type_checking(tmp_path, monkeypatch):
    """The check fails on a planted cycle: a name imported under TYPE_CHECKING one way and inside a function the
    other, and a third module reached with ``from . import``."""
    folder = tmp_path / "group"
    folder.mkdir()
    (folder / "__init__.py").write_text("")
    (folder / "a.py").write_text("from typing import TYPE_CHECKING\nif TYPE_CHECKING:\n    from .b import B\n")
    (folder / "b.py").write_text("def f():\n    from . import c\n\nclass B:\n    pass\n")
    (folder / "c.py").write_text("from .a import A\n")
    monkeypatch.setattr(f"{__name__}.RECIPES", tmp_path)
    graph = _group_graph(folder)
    assert graph == {"__init__": set(), "a": {"b"}, "b": {"c"}, "c": {"a"}}
    assert _cycles(graph) == [["a", "b", "c", "a"]]
