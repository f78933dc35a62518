"""The recipes' import graph: groups depend one way (pretraining, glue -> hub -> common; benchmarks -> pretraining, for
the quality benchmark that trains through train_clm's code; common imports nothing), no module of a group takes part
in an import cycle, the Hub code takes what it knows about a task from the run folder, and pretraining's data code
sees neither checkpoints nor the Hub."""

from __future__ import annotations

import ast

from tests.support import PROJECT_ROOT

RECIPES = PROJECT_ROOT / "modeling_tnn" / "recipes"
# group -> the other groups it may import. benchmarks -> pretraining: the quality benchmark drives train_clm's run
# (a benchmark measures the recipe, not the other way round); pretraining's --time_generation takes its timing loop
# from common, so pretraining imports no benchmark.
ALLOWED = {"common": set(), "pretraining": {"common", "hub"}, "glue": {"common", "hub"},
           "hub": {"common"}, "listops": set(), "fairseq": set(), "benchmarks": {"common", "pretraining"}}


def _imported_modules(path, at_run_time: bool = False) -> set[str]:
    """The ``modeling_tnn.recipes`` modules a file imports, as ``group.module`` (relative imports resolved);
    ``at_run_time`` leaves out the imports under ``if TYPE_CHECKING:``, which never run."""
    package = path.relative_to(RECIPES).parent.parts  # ("pretraining",)
    tree = ast.parse(path.read_text())
    type_only = {id(node) for block in ast.walk(tree) if isinstance(block, ast.If)
                 and ast.unparse(block.test).endswith("TYPE_CHECKING") for inner in block.body
                 for node in ast.walk(inner)} if at_run_time else set()
    found = set()
    for node in ast.walk(tree):
        if not isinstance(node, ast.ImportFrom) or id(node) in type_only:
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


def _module_name(path) -> str:
    return ".".join(path.relative_to(RECIPES).with_suffix("").parts)


def _import_graph() -> dict[str, set[str]]:
    """``{"group.module": {"group.module", ...}}``: what each of the recipes' modules imports when it runs (a
    package's ``__init__`` as the package's name; an imported name, e.g. ``from .harness import CLOCK``, as its
    module)."""
    modules = {_module_name(path).removesuffix(".__init__"): path for path in RECIPES.rglob("*.py")
               if path.parent != RECIPES}
    graph = {}
    for name, path in modules.items():
        graph[name] = set()
        for imported in _imported_modules(path, at_run_time=True):
            while imported and imported not in modules:  # "group.module.Name" -> "group.module"
                imported = imported.rpartition(".")[0]
            if imported and imported != name:
                graph[name].add(imported)
    return graph


def _cycle(graph: dict[str, set[str]]) -> list[str] | None:
    """One cycle of ``graph`` as the path that closes it, or None (depth-first, iterative)."""
    state: dict[str, int] = {}  # 1: on the current path, 2: done
    for root in sorted(graph):
        if root in state:
            continue
        path, stack = [root], [iter(sorted(graph[root]))]
        state[root] = 1
        while stack:
            following = next(stack[-1], None)
            if following is None:
                state[path.pop()] = 2
                stack.pop()
            elif state.get(following) == 1:
                return path[path.index(following):] + [following]
            elif following not in state:
                state[following] = 1
                path.append(following)
                stack.append(iter(sorted(graph.get(following, ()))))
    return None


def test_no_import_cycles_between_modules_or_groups():
    """No module imports itself through others when it runs (a type-only import under ``TYPE_CHECKING`` is left out:
    scale_ladder and scale_ladder_training name each other's types that way), and no group through other groups."""
    graph = _import_graph()
    assert _cycle(graph) is None, _cycle(graph)
    groups: dict[str, set[str]] = {}
    for module, imported in graph.items():
        groups.setdefault(module.split(".")[0], set()).update(
            other.split(".")[0] for other in imported if other.split(".")[0] != module.split(".")[0])
    assert _cycle(groups) is None, _cycle(groups)
    assert _cycle({"a": {"b"}, "b": {"c"}, "c": {"a"}, "d": {"a"}}) == ["a", "b", "c", "a"]  # the check finds one


def test_pretraining_data_sees_no_checkpoint_or_hub_code():
    imported = _imported_modules(RECIPES / "pretraining" / "data.py")
    assert imported and not {m for m in imported
                             if m.startswith(("hub", "pretraining.checkpoints", "pretraining.arguments"))}, imported
