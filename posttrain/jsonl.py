"""JSONL files: atomic writes and line-by-line reads that name the bad line."""

from __future__ import annotations

import json
import os
from collections.abc import Iterable, Iterator
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


def read_jsonl_objects(path: str | os.PathLike) -> Iterator[tuple[int, dict[str, Any]]]:
    """Yield ``(line_number, object)`` for each non-blank line of a JSONL file.

    Raises ``InputFileError`` for a missing file, bad JSON, or a line that is
    not a JSON object, naming the file and line.
    """
    path = Path(path)
    if not path.is_file():
        raise InputFileError(str(path), None, None, "no such file")
    with path.open(encoding="utf-8") as handle:
        for line_number, line in enumerate(handle, start=1):
            if not line.strip():
                continue
            try:
                item = json.loads(line)
            except ValueError as error:
                raise InputFileError(
                    str(path), line_number, None, f"not valid JSON ({error})"
                ) from None
            if not isinstance(item, dict):
                raise InputFileError(str(path), line_number, None, "expected a JSON object")
            yield line_number, item
