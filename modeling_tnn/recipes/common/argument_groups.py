"""Dataclasses whose fields are command-line flags, as transformers' ``HfArgumentParser`` reads them (``--<field
name>``, the field's ``metadata`` passed to ``add_argument``), on a plain ``argparse`` parser: ``store_true``
switches, ``append`` lists and the help layout stay argparse's own. A flag is added by adding a field, a group by
adding a dataclass. :func:`to_argv` goes back from a group to the flags that give it."""

from __future__ import annotations

import argparse
import dataclasses
from typing import Any, TypeVar

T = TypeVar("T")


def flag(default: Any = None, help: str | None = None, **add_argument: Any) -> Any:
    """A dataclass field that is the flag ``--<field name>``: ``help`` and ``add_argument``'s other keywords
    (``type``, ``choices``, ``action``, ...) go to ``argparse.ArgumentParser.add_argument``."""
    return dataclasses.field(default=default, metadata={"help": help, **add_argument})


def add_dataclass_arguments(parser: argparse.ArgumentParser | argparse._ArgumentGroup, cls: type) -> None:
    """Add a flag for every field of the dataclass ``cls`` declared with :func:`flag`, in field order."""
    for field in dataclasses.fields(cls):
        if "help" in field.metadata:
            parser.add_argument(f"--{field.name}", default=field.default, **field.metadata)


def from_namespace(cls: type[T], namespace: argparse.Namespace) -> T:
    """An instance of the dataclass ``cls`` from the parsed flags of its fields."""
    return cls(**{field.name: getattr(namespace, field.name) for field in dataclasses.fields(cls)
                  if "help" in field.metadata})


def to_argv(group: Any) -> list[str]:
    """The flags that give the dataclass instance ``group`` (fields declared with :func:`flag`) when parsed: one per
    field whose value is not its default, in field order (``from_namespace(type(group), parser.parse_args(
    to_argv(group))) == group``). Raises ``ValueError`` for a value no flag can give (``None`` over a default, a
    ``store_true`` switch set to ``False``)."""
    argv: list[str] = []
    for field in dataclasses.fields(group):
        value = getattr(group, field.name)
        if "help" not in field.metadata or value == field.default:
            continue
        action = field.metadata.get("action")
        if action == "store_true" and value is True:
            argv.append(f"--{field.name}")
        elif action == "append" and isinstance(value, list):
            argv += [item for element in value for item in (f"--{field.name}", str(element))]
        elif action is None and value is not None:
            argv += [f"--{field.name}", str(value)]
        else:
            raise ValueError(f"--{field.name}: no command line gives {value!r} (its default is {field.default!r}).")
    return argv
