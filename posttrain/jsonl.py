"""JSON and JSONL: atomic writes, line-by-line reads that name the bad line, and
``to_jsonable`` (any record made safe for ``json.dumps``)."""

from __future__ import annotations

import dataclasses
import json
import math
import os
from collections.abc import Iterable, Iterator, Mapping
from pathlib import Path
from typing import Any

from posttrain.atomic import atomic_writer
from posttrain.errors import InputFileError


def write_jsonl_atomic(path: str | os.PathLike, rows: Iterable[dict[str, Any]]) -> Path:
    """Write rows as JSONL through a temp file and a rename: never half-written.

    If serialising any row fails, the previous file (if any) is left untouched
    and the temp file is removed.
    """
    with atomic_writer(path) as handle:
        for row in rows:
            handle.write(json.dumps(row, ensure_ascii=False, sort_keys=True) + "\n")
    return Path(path)


def _no_constant(name: str) -> Any:
    raise ValueError(f"{name} is not a number JSON allows")


def _finite_float(text: str) -> float:
    value = float(text)
    if not math.isfinite(value):
        raise ValueError(f"{text} does not fit a float")
    return value


#: What parsing JSON costs is not its length: Python holds every value (an object, a list,
#: a string, a number) in tens of bytes whatever its text, so ``[{},{},...]`` takes ~25
#: bytes of memory a byte of text (the fourth hostile probe: a .eval header of 240 MB of
#: ``{},`` peaked at 6.2 GB). A text's cost, known before it is parsed, is its length plus
#: this much for each mark that can start a value (``{``, ``[``, ``,``, ``:``; counted
#: inside strings too, which only overcounts).
VALUE_COST_BYTES = 100
#: the most one file of JSON or JSONL may cost to read (``parse_cost``)
MAX_PARSE_COST = 2 * 1024**3
_MARKS = ("{", "[", ",", ":")
_BYTE_MARKS = tuple(mark.encode() for mark in _MARKS)


def parse_cost(text: str | bytes) -> int:
    """An upper bound on the memory parsing ``text`` as JSON takes, in bytes (counted in
    C, linear in the text: no parse)."""
    marks = _BYTE_MARKS if isinstance(text, bytes) else _MARKS
    return len(text) + VALUE_COST_BYTES * sum(text.count(mark) for mark in marks)  # type: ignore[arg-type]


def stream_parse_cost(stream: Any) -> int:
    """``parse_cost`` of everything a binary ``stream`` holds, read a megabyte at a time
    (the marks are single bytes, so no chunk boundary splits one); the stream is closed."""
    cost = 0
    with stream:
        while chunk := stream.read(1 << 20):
            cost += parse_cost(chunk)
    return cost


def describe_cost(cost: int, limit: int) -> str:
    """Why a text is refused by its cost, for an error message."""
    return (f"reading it would take about {cost / 2**30:,.1f} GB of memory (its JSON "
            f"values, not its bytes, decide that), more than the {limit / 2**30:,.1f} GB "
            "posttrain allows one input")


def strict_json_loads(text: str) -> Any:
    """``json.loads`` that refuses NaN, Infinity and numbers too large for a float (1e400),
    which Python's parser would turn into non-finite floats."""
    return json.loads(text, parse_constant=_no_constant, parse_float=_finite_float)


def numbered_lines(path: Path) -> Iterator[tuple[int, str]]:
    """``(line_number, text)`` of a UTF-8 text file; ``InputFileError`` naming the line
    and column of a byte that is not UTF-8."""
    with path.open("rb") as handle:
        for line_number, raw in enumerate(handle, start=1):
            try:
                yield line_number, raw.decode("utf-8")
            except UnicodeDecodeError as error:
                raise InputFileError(
                    str(path), line_number, None,
                    f"not UTF-8 text (byte 0x{raw[error.start]:02x} at column {error.start + 1})",
                ) from None


def read_jsonl_objects(path: str | os.PathLike) -> Iterator[tuple[int, dict[str, Any]]]:
    """Yield ``(line_number, object)`` for each non-blank line of a JSONL file.

    Raises ``InputFileError`` for a missing file, bad JSON, or a line that is
    not a JSON object, naming the file and line.
    """
    path = Path(path)
    if not path.is_file():
        raise InputFileError(str(path), None, None, "no such file")
    spent = 0  # what the lines parsed so far may hold in memory (the caller keeps them)
    for line_number, line in numbered_lines(path):
        if not line.strip():
            continue
        spent += parse_cost(line)
        if spent > MAX_PARSE_COST:
            raise InputFileError(str(path), line_number, None,
                                 describe_cost(spent, MAX_PARSE_COST) + " (up to this line)")
        try:
            item = strict_json_loads(line)
        except (ValueError, RecursionError) as error:
            raise InputFileError(
                str(path), line_number, None, f"not valid JSON ({error})"
            ) from None
        if not isinstance(item, dict):
            raise InputFileError(str(path), line_number, None, "expected a JSON object")
        if "\\ud" in line.lower():  # an escaped UTF-16 surrogate: text only as a pair
            field = lone_surrogate_field(item)
            if field is not None:
                raise InputFileError(str(path), line_number, field,
                                     "holds a lone UTF-16 surrogate (an escape such as "
                                     "\\ud800 without its pair), which is not text")
        yield line_number, item


def lone_surrogate_field(item: dict[str, Any]) -> str | None:
    """The first field of ``item`` whose name or value holds a lone surrogate (JSON lets
    ``"\\ud800"`` through; no UTF-8 file can hold it, so writing it back would fail)."""
    for key, value in item.items():
        try:
            json.dumps({key: value}, ensure_ascii=False).encode("utf-8")
        except UnicodeEncodeError:
            return key.encode("utf-8", "backslashreplace").decode("ascii", "replace")
    return None

def to_jsonable(value: Any) -> Any:
    """A copy of ``value`` that ``json.dumps`` accepts without losing precision.

    Dataclasses and objects with ``to_dict`` become dicts, paths and other unknown
    objects their ``str``, tuples and sets lists, numpy scalars Python numbers, and
    non-finite floats None (JSON has no NaN).
    """
    if value is None or isinstance(value, (bool, str, int)):
        return value
    if isinstance(value, float):
        return value if math.isfinite(value) else None
    if hasattr(value, "to_dict"):
        return to_jsonable(value.to_dict())
    if dataclasses.is_dataclass(value) and not isinstance(value, type):
        return to_jsonable(dataclasses.asdict(value))
    if isinstance(value, Mapping):
        return {str(key): to_jsonable(item) for key, item in value.items()}
    if isinstance(value, (list, tuple, set, frozenset)):
        return [to_jsonable(item) for item in value]
    if isinstance(value, os.PathLike):
        return os.fspath(value)
    if hasattr(value, "item") and callable(value.item):  # numpy / torch scalars
        try:
            return to_jsonable(value.item())
        except (TypeError, ValueError, RuntimeError):
            pass
    return str(value)
