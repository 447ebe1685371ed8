"""``--config FILE``: a recipe's flags from a TOML, YAML or JSON file.

Keys are the flag names with ``_`` or ``-`` (``learning_rate`` or ``learning-rate``).
A run's own ``config.json`` works as is (its ``settings`` are taken), so
``posttrain grpo --config runs/NAME/config.json --run-name NAME-again`` re-runs a finished
run with the same settings. Flags given on the command line win over the file; the file
wins over the defaults. Every key and value is checked against the recipe's settings
before anything loads: an unknown key names the closest flag, a wrong type says which.
"""

from __future__ import annotations

import dataclasses
import difflib
import re
import typing
from pathlib import Path
from typing import Any

from posttrain.commands.dataclass_args import base_type
from posttrain.errors import PosttrainError
from posttrain.jsonl import strict_json_loads
from posttrain.text import echo

#: a number written as text (YAML 1.1 reads ``1e-4`` as a string; users write it so)
_NUMBER_TEXT = re.compile(r"[+-]?(\d+\.?\d*|\.\d+)([eE][+-]?\d+)?")


def _read_mapping(path: Path) -> dict[str, Any]:
    suffix = path.suffix.lower()
    try:
        text = path.read_text(encoding="utf-8")
    except UnicodeDecodeError as error:
        raise PosttrainError(f"{path}: not UTF-8 text (byte {error.object[error.start]:#04x} "
                             f"at offset {error.start}); save the settings as UTF-8") from None
    except OSError as error:
        raise PosttrainError(f"--config {str(path)!r}: cannot read it ({error.strerror})"
                             ) from None
    try:
        if suffix == ".json":
            value = strict_json_loads(text)
        elif suffix == ".toml":
            try:
                import tomllib
            except ImportError:  # Python 3.10
                raise PosttrainError(f"{path}: reading TOML needs Python 3.11 or later; "
                                     "write the settings as YAML or JSON") from None
            value = tomllib.loads(text)
        elif suffix in (".yaml", ".yml"):
            try:
                import yaml
            except ImportError:
                raise PosttrainError(
                    f"{path}: reading YAML needs PyYAML (pip install pyyaml); or write the "
                    "settings as TOML or JSON") from None
            value = yaml.safe_load(text)
        else:
            raise PosttrainError(f"{path}: a settings file must end in .toml, .yaml, .yml or "
                                 ".json, got {suffix or 'no extension'!r}")
    except PosttrainError:
        raise
    except Exception as error:  # each parser has its own error class; all mean "bad file"
        # parsers' messages run over several lines (YAML's marks): one line, cut short
        said = " ".join(str(error).split())
        said = said if len(said) <= 300 else said[:297] + "..."
        raise PosttrainError(f"{path}: not valid {suffix.lstrip('.').upper()}: {said}") from None
    if not isinstance(value, dict):
        raise PosttrainError(f"{path}: expected a table of settings (key = value), got "
                             f"{type(value).__name__}")
    # a run's config.json: {"recipe": ..., "settings": {...}, "resolved": ...}
    if isinstance(value.get("settings"), dict) and "recipe" in value:
        return value["settings"]
    return value


def _check_value(path: Path, key: str, value: Any, annotation: Any) -> Any:
    optional = type(None) in typing.get_args(annotation)
    kind = base_type(annotation)
    if value is None:
        if optional:
            return None
        raise PosttrainError(f"{path}: {key}: may not be empty (expected {kind.__name__})")
    if kind is bool:
        ok = isinstance(value, bool)
    elif kind is int:
        ok = isinstance(value, int) and not isinstance(value, bool)
    elif kind is float:
        if isinstance(value, str) and _NUMBER_TEXT.fullmatch(value.strip()):
            value = float(value)
        ok = isinstance(value, (int, float)) and not isinstance(value, bool)
        value = float(value) if ok else value
    else:
        ok = isinstance(value, str)
    if not ok:  # echo: a YAML alias bomb is small on disk and huge as text
        raise PosttrainError(f"{path}: {key}: expected {kind.__name__}"
                             f"{' or nothing' if optional else ''}, got {echo(value)}")
    return value


def load_settings_file(path: str | Path, settings_class: type, command: str) -> dict[str, Any]:
    """The checked settings of ``path`` for ``settings_class`` (field name -> value)."""
    path = Path(path)
    if not path.is_file():
        raise PosttrainError(f"--config {str(path)!r}: no such file")
    raw = _read_mapping(path)
    hints = typing.get_type_hints(settings_class)
    fields = {field.name for field in dataclasses.fields(settings_class)
              if "help" in field.metadata}
    values: dict[str, Any] = {}
    for key, value in raw.items():
        name = str(key).replace("-", "_")
        if name not in fields:
            close = difflib.get_close_matches(name, sorted(fields), n=1)
            hint = f"; did you mean {close[0].replace('_', '-')}?" if close else ""
            raise PosttrainError(f"{path}: {key}: not a setting of posttrain {command}{hint}")
        values[name] = _check_value(path, str(key), value, hints[name])
    return values
