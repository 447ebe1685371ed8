"""Command-line flags generated from a settings dataclass, so flags and config never drift.

Each dataclass field becomes ``--field-name`` with the field's ``metadata["help"]``
(and its default shown). Booleans that default to False become switches; a
field's ``metadata["choices"]`` limits its values; ``metadata["flag"]`` renames the
flag. ``settings_from_args`` builds the dataclass back from the parsed namespace.

Every number is bounded before any work starts, from a flag or a settings file alike:
a whole number must fit int64 (what torch, SQLite and numpy hold), a real number must be
finite, and a field's ``metadata["range"]`` (``(low, high)``, None for open) bounds the
work a value asks for (``--steps``, ``--prompts``, ...). The recipes' own checks then say
what each value means.
"""

from __future__ import annotations

import argparse
import dataclasses
import math
import types
import typing
from typing import Any, TypeVar

from posttrain.errors import PosttrainError
from posttrain.text import echo

T = TypeVar("T")

INT64 = (-(2**63), 2**63 - 1)
_MAX_NUMBER_TEXT = 40  # longer number text is refused before int() reads it


def _read_number(text: str, convert: typing.Callable[[str], Any], what: str) -> Any:
    """``convert(text)`` for an argparse ``type=``: bounded text, a clear message."""
    stripped = text.strip()
    try:
        if len(stripped) > _MAX_NUMBER_TEXT:
            raise ValueError
        return convert(stripped)
    except ValueError:
        raise argparse.ArgumentTypeError(f"expected {what}, got {echo(text)}") from None


def _bounds_problem(value: float, low: float | None, high: float | None) -> str | None:
    if low is not None and value < low:
        return f"must be at least {low}, got {value}"
    if high is not None and value > high:
        return f"must be at most {high}, got {value}"
    return None


def whole_number(text: str) -> int:
    """argparse ``type=`` for a whole-number flag that fits int64."""
    value = _read_number(text, int, "a whole number")
    if not INT64[0] <= value <= INT64[1]:
        raise argparse.ArgumentTypeError(f"must fit a 64-bit integer, got {echo(text)}")
    return int(value)


def whole_in(low: int | None = None, high: int | None = None) -> typing.Callable[[str], int]:
    """argparse ``type=`` for a whole number in ``[low, high]`` (None: open; int64 always)."""
    def parse(text: str) -> int:
        value = whole_number(text)
        problem = _bounds_problem(value, low, high)
        if problem:
            raise argparse.ArgumentTypeError(problem)
        return value
    return parse


def real_number(text: str) -> float:
    """argparse ``type=`` for a real-number flag that is finite."""
    value = _read_number(text, float, "a number")
    if not math.isfinite(value):
        raise argparse.ArgumentTypeError(f"expected a finite number, got {echo(text)}")
    return float(value)


def number_problem(field: dataclasses.Field, value: Any) -> str | None:
    """What is wrong with a field's numeric ``value`` (None: nothing, or not a number)."""
    if isinstance(value, bool) or not isinstance(value, (int, float)):
        return None
    if isinstance(value, float) and not math.isfinite(value):
        return f"must be a finite number, got {value}"
    if isinstance(value, int) and not INT64[0] <= value <= INT64[1]:
        return f"must fit a 64-bit integer, got a number of {len(str(abs(value)))} digits"
    low, high = field.metadata.get("range", (None, None))
    return _bounds_problem(value, low, high)


def check_numbers(settings: Any) -> None:
    """Refuse a settings dataclass whose numbers are out of bounds (see module docstring),
    naming the flag; the settings file's keys are the same names with underscores."""
    for field in dataclasses.fields(settings):
        problem = number_problem(field, getattr(settings, field.name))
        if problem:
            raise PosttrainError(f"{_flag(field)} {problem}")


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
        parse = {int: whole_number, float: real_number}.get(kind, kind)
        parser.add_argument(
            *flags,
            dest=field.name,
            type=parse,
            default=Unset(default),
            choices=field.metadata.get("choices"),
            metavar=field.metadata.get("metavar"),
            help=help_text + shown,
        )


def settings_from_args(cls: type[T], args: argparse.Namespace,
                       file_values: dict[str, Any] | None = None, **overrides: Any) -> T:
    """An instance of ``cls`` from the parsed flags: a flag given on the command line, else
    ``file_values`` (a settings file), else the field's default; ``overrides`` win. A class
    with an ``explicit`` field gets the names of the fields set by a flag or the file."""
    values = {}
    explicit = []
    for field in dataclasses.fields(cls):
        if not hasattr(args, field.name):
            continue
        value = getattr(args, field.name)
        if isinstance(value, Unset):
            if field.name in (file_values or {}):
                explicit.append(field.name)
            value = (file_values or {}).get(field.name, value.value)
        else:
            explicit.append(field.name)
        values[field.name] = value
    values.update(overrides)
    # settings that keep a record of what the user set (``RecipeSettings.explicit``)
    if "explicit" in {field.name for field in dataclasses.fields(cls)}:
        values["explicit"] = tuple(explicit)
    settings = cls(**values)
    check_numbers(settings)
    return settings
