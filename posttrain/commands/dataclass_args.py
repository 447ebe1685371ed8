"""Command-line flags generated from a settings dataclass, so flags and config never drift.

Each dataclass field becomes ``--field-name`` with the field's ``metadata["help"]``
(and its default shown). Booleans that default to False become switches; a
field's ``metadata["choices"]`` limits its values; ``metadata["flag"]`` renames the
flag. ``settings_from_args`` builds the dataclass back from the parsed namespace.
"""

from __future__ import annotations

import argparse
import dataclasses
import types
import typing
from typing import Any, TypeVar

T = TypeVar("T")


def _flag(field: dataclasses.Field) -> str:
    return field.metadata.get("flag", "--" + field.name.replace("_", "-"))


class Unset:
    """A flag left off the command line: its default, which a settings file may replace
    (``settings_from_args``). Explicit flags always win."""

    def __init__(self, value: Any) -> None:
        self.value = value

    def __repr__(self) -> str:
        return f"Unset({self.value!r})"


def base_type(annotation: Any) -> Any:
    """``int | None`` -> int; plain types pass through."""
    origin = typing.get_origin(annotation)
    if origin in (typing.Union, types.UnionType):
        options = [arg for arg in typing.get_args(annotation) if arg is not type(None)]
        return options[0] if len(options) == 1 else str
    return annotation


def add_dataclass_args(
    parser: argparse.ArgumentParser | argparse._ArgumentGroup,
    cls: type,
    *,
    skip: tuple = (),
    only: tuple | None = None,
    aliases: dict[str, tuple[str, ...]] | None = None,
) -> None:
    """Add one flag per field of ``cls``: those in ``only`` (all by default) minus ``skip``;
    fields without ``help`` metadata are skipped. ``aliases`` gives a field more flag
    names in this one command (``{"data_seed": ("--seed",)}``)."""
    hints = typing.get_type_hints(cls)
    for field in dataclasses.fields(cls):
        if field.name in skip or (only is not None and field.name not in only):
            continue
        if "help" not in field.metadata:
            continue
        kind = base_type(hints[field.name])
        default = field.default
        help_text = field.metadata["help"]
        flags = (_flag(field), *(aliases or {}).get(field.name, ()))
        if kind is bool and default is False:
            parser.add_argument(*flags, dest=field.name, action="store_true",
                                default=Unset(False), help=help_text)
            continue
        if kind is bool:  # on by default, or decided by other settings: --x / --no-x
            parser.add_argument(*flags, dest=field.name, default=Unset(default),
                                action=argparse.BooleanOptionalAction, help=help_text)
            continue
        shown = "" if default in (None, "") else f" (default {default})"
        parser.add_argument(
            *flags,
            dest=field.name,
            type=kind,
            default=Unset(default),
            choices=field.metadata.get("choices"),
            metavar=field.metadata.get("metavar"),
            help=help_text + shown,
        )


def settings_from_args(cls: type[T], args: argparse.Namespace,
                       file_values: dict[str, Any] | None = None, **overrides: Any) -> T:
    """An instance of ``cls`` from the parsed flags: a flag given on the command line, else
    ``file_values`` (a settings file), else the field's default; ``overrides`` win."""
    values = {}
    for field in dataclasses.fields(cls):
        if not hasattr(args, field.name):
            continue
        value = getattr(args, field.name)
        if isinstance(value, Unset):
            value = (file_values or {}).get(field.name, value.value)
        values[field.name] = value
    values.update(overrides)
    return cls(**values)
