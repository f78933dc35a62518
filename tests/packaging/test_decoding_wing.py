"""The decoding wing's shape: the decoding states are functions of tensors that never see the cache layer (only the
cache module takes one), and nothing in the model package sets attributes around the module system."""

from __future__ import annotations

import ast

from tests.support import PROJECT_ROOT

MODEL_PACKAGE = PROJECT_ROOT / "modeling_tnn"


def _functions_taking(path, parameter: str) -> list[str]:
    found = []
    for node in ast.walk(ast.parse(path.read_text())):
        if isinstance(node, (ast.FunctionDef, ast.AsyncFunctionDef)):
            arguments = node.args
            names = [a.arg for a in (*arguments.posonlyargs, *arguments.args, *arguments.kwonlyargs)]
            if parameter in names:
                found.append(f"{path.name}:{node.lineno} {node.name}")
    return found


def test_no_decoding_function_but_the_caches_takes_the_cache_layer():
    modules = sorted(MODEL_PACKAGE.glob("decoding_*.py"))
    assert len(modules) >= 6
    offenders = [hit for path in modules if path.name != "decoding_cache.py" for hit in _functions_taking(path, "layer")]
    assert offenders == []
    assert _functions_taking(MODEL_PACKAGE / "decoding_cache.py", "layer")  # the check sees the cache's own


def test_no_attribute_is_set_around_the_module_system():
    offenders = [f"{path.name}:{number}" for path in sorted(MODEL_PACKAGE.rglob("*.py"))
                 for number, line in enumerate(path.read_text().splitlines(), 1) if "object.__setattr__" in line]
    assert offenders == []
