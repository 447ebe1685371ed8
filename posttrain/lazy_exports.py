"""A package face that imports each public name only when it is first asked for.

``posttrain``, ``posttrain.service`` and ``posttrain.service.engine`` re-export names from
their modules this way, so that importing a package (or any module under it, which runs
the package's ``__init__`` first) loads nothing it did not ask for: ``import posttrain``
never pulls in torch, and the service's client never loads the server. The name -> module
tables are strings import-linter cannot see; tests/test_layers.py checks every entry
resolves.
"""

from __future__ import annotations

import importlib
import sys
from collections.abc import Callable, Mapping
from typing import Any


def lazy_face(package: str, exports: Mapping[str, str]) -> tuple[Callable[[str], Any],
                                                                  Callable[[], list[str]]]:
    """``(__getattr__, __dir__)`` for the ``__init__`` of ``package``: ``exports`` maps
    each public name to the module that defines it; a name is imported on first use and
    kept in the package's namespace (later lookups skip ``__getattr__``)."""

    def __getattr__(name: str) -> Any:
        module_name = exports.get(name)
        if module_name is None:
            raise AttributeError(f"module {package!r} has no attribute {name!r}")
        value = getattr(importlib.import_module(module_name), name)
        setattr(sys.modules[package], name, value)
        return value

    def __dir__() -> list[str]:
        return sorted(set(vars(sys.modules[package])) | set(exports))

    return __getattr__, __dir__
