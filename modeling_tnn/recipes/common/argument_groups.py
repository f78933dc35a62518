"""Dataclasses whose fields are command-line flags, as transformers' ``HfArgumentParser`` reads them (``--<field
name>``, the field's ``metadata`` passed to ``add_argument``), on a plain ``argparse`` parser: ``store_true``
switches, ``append`` lists and the help layout stay argparse's own. A flag is added by adding a field, a group by
adding a dataclass."""

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
