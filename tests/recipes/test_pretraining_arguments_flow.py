"""The pretraining recipe's arguments flow one way: the whole parsed command line (``PretrainingArguments``) is taken
by ``setup`` and ``run`` alone (``parse_args`` makes it, or ``with_defaults`` in code); the loop and the finish get
the small ``Schedule`` and ``FinishSpec`` that ``setup`` builds, inside a ``Session`` that holds no argument
group."""

from __future__ import annotations

import ast
import dataclasses
import re
import typing
from pathlib import Path

import pytest

from modeling_tnn.recipes.pretraining import arguments, session
from tests.recipes.test_import_graph import RECIPES, _imported_modules
from tests.support import PROJECT_ROOT

WHOLE = "PretrainingArguments"
# The functions that may take the whole object (parse_args returns it).
TAKERS = {"modeling_tnn/recipes/pretraining/setup.py:setup", "modeling_tnn/recipes/pretraining/training.py:run"}
# Every argument group, and the object of all of them.
GROUP_NAMES = {WHOLE} | {cls.__name__ for _, cls, _ in arguments.ARGUMENT_GROUPS}


def _functions_taking(name: str, files: list[Path]) -> dict[str, list[str]]:
    """``{"path:function": [parameter, ...]}`` for every function of ``files`` with a parameter annotated with the
    class ``name`` (a string annotation included), or, in the pretraining package, a parameter called ``args``
    without an annotation; the methods of the class ``name`` itself are its own."""
    word = re.compile(rf"\b{name}\b")
    found: dict[str, list[str]] = {}
    for path in files:
        tree = ast.parse(path.read_text())
        own_methods = {id(node) for cls in ast.walk(tree) if isinstance(cls, ast.ClassDef) and cls.name == name
                       for node in cls.body}
        for node in ast.walk(tree):
            if not isinstance(node, (ast.FunctionDef, ast.AsyncFunctionDef)) or id(node) in own_methods:
                continue
            every = node.args.posonlyargs + node.args.args + node.args.kwonlyargs
            every += [a for a in (node.args.vararg, node.args.kwarg) if a is not None]
            taking = [a.arg for a in every
                      if (a.annotation is not None and word.search(ast.unparse(a.annotation)))
                      or (a.annotation is None and a.arg == "args" and "pretraining" in path.parts)]
            if taking:
                where = path.relative_to(PROJECT_ROOT).as_posix() if path.is_relative_to(PROJECT_ROOT) else path.name
                found[f"{where}:{node.name}"] = taking
    return found


def _project_files() -> list[Path]:
    return sorted([*(PROJECT_ROOT / "modeling_tnn").rglob("*.py"), *(PROJECT_ROOT / "run_scripts").glob("*.py")])


def test_only_setup_and_run_take_the_whole_arguments():
    found = _functions_taking(WHOLE, _project_files())
    assert set(found) <= TAKERS, {k: v for k, v in found.items() if k not in TAKERS}
    assert set(found) == TAKERS  # the rule's two takers still exist under these names


def test_the_rule_catches_a_function_that_takes_the_whole_arguments(tmp_path):
    """The scan above finds a taker however it is written: annotated, as a string, or as a bare ``args``."""
    module = tmp_path / "pretraining" / "extra.py"
    module.parent.mkdir()
    module.write_text("class PretrainingArguments:\n    def check(self, other: 'PretrainingArguments'): ...\n"
                      "def a(x: PretrainingArguments): ...\ndef b(y: 'PretrainingArguments | None' = None): ...\n"
                      "def c(args): ...\ndef d(args: int): ...\n")
    found = _functions_taking(WHOLE, [module])
    assert {k.split(":")[1]: v for k, v in found.items()} == {"a": ["x"], "b": ["y"], "c": ["args"]}


def test_the_session_and_what_it_hands_on_hold_no_argument_group():
    for cls in (session.Session, session.Schedule, session.FinishSpec, session.LoopResult, session.RunOutcome):
        hints = typing.get_type_hints(cls)
        for field in dataclasses.fields(cls):
            assert not GROUP_NAMES & set(re.findall(r"\w+", str(hints[field.name]))), (cls.__name__, field.name)


def test_the_loop_and_the_finish_see_neither_the_flags_nor_the_setup():
    for name in ("loop", "finish", "session"):
        imported = _imported_modules(RECIPES / "pretraining" / f"{name}.py")
        assert imported and not {m for m in imported
                                 if m in ("pretraining.arguments", "pretraining.setup", "pretraining.data")}, imported


def test_arguments_built_in_code_equal_the_parsed_command_line():
    """``with_defaults`` gives what ``parse_args`` gives, and ``argv()`` is the command line that parses back."""
    for task in arguments.TASKS:
        assert arguments.PretrainingArguments.with_defaults(task) == arguments.parse_args(task, [])
        assert (arguments.PretrainingArguments.with_defaults(task, run=arguments.RunArguments(logging_steps=3))
                == arguments.parse_args(task, ["--logging_steps", "3"]))
    argv = ["--config_name", "tiny", "--fsdp", "--learning_rate", "0.002", "--sample_prompt", "a b",
            "--sample_prompt", "c", "--output_dir", "somewhere", "--max_eval_samples", "3"]
    parsed = arguments.parse_args("clm", argv)
    assert parsed.argv() != [] and arguments.parse_args("clm", parsed.argv()) == parsed
    built = arguments.PretrainingArguments.with_defaults(
        "clm", model=arguments.ModelArguments(config_name="tiny"),
        training=arguments.TrainingLoopArguments(learning_rate=0.002, fsdp=True))
    built.run.output_dir = "somewhere"
    built.data.max_eval_samples, built.sampling.sample_prompt = 3, ["a b", "c"]
    assert built == parsed


def test_arguments_no_command_line_gives_are_refused():
    with pytest.raises(ValueError, match="sampling"):
        arguments.PretrainingArguments.with_defaults("mlm", sampling=arguments.SamplingArguments())
    with pytest.raises(ValueError, match="--block_size"):
        arguments.PretrainingArguments.with_defaults(
            "clm", training=arguments.TrainingLoopArguments(block_size=None)).argv()
