"""No import circle among the model package's modules: transformers' remote-code loader copies every module a
relative import names (at module level, under ``TYPE_CHECKING`` or inside a function), so a circle is a real
dependency of each module on the others whichever way it is written."""

from __future__ import annotations

from tests.support import PROJECT_ROOT, import_cycles

MODEL_PACKAGE = PROJECT_ROOT / "modeling_tnn"


def _outside_scope(name: str) -> bool:
    """The recipes (never imported by the model; their groups have a test of their own)."""
    return name.split(".")[0] == "recipes"


def test_the_model_modules_import_each_other_in_no_circle():
    assert import_cycles(MODEL_PACKAGE, exclude=_outside_scope) == []


def test_a_circle_is_found_through_type_checking_and_function_imports(tmp_path):
    package = tmp_path / "package"
    (package / "inner").mkdir(parents=True)
    (package / "__init__.py").write_text("")
    (package / "a.py").write_text("from typing import TYPE_CHECKING\nif TYPE_CHECKING:\n    from .b import B\n")
    (package / "b.py").write_text("def load():\n    from .inner.c import C\n")
    (package / "inner" / "__init__.py").write_text("")
    (package / "inner" / "c.py").write_text("from .. import a\nfrom ..d import D\n")
    (package / "d.py").write_text("import os\nfrom . import b as _b\n")
    (package / "e.py").write_text("from .a import A\nfrom ..outside import X\n")
    assert import_cycles(package) == [["a", "b", "inner.c", "a"]]  # b and d close a second circle in the same group
    assert import_cycles(package, exclude=lambda name: name == "a") == [["b", "inner.c", "d", "b"]]
    assert import_cycles(package, exclude=lambda name: name in ("a", "d")) == []
