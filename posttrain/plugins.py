"""Loading a user's object named on the command line: ``module:attribute`` or ``file.py:attribute``.

``--env`` and ``--reward`` take either form. A module is looked up as ``python -m``
would, with the current folder first on the path (the ``posttrain`` script's own
folder would not find a user's ``my_env.py`` otherwise); a ``.py`` path is loaded
from that file, whatever the current folder.
"""

from __future__ import annotations

import importlib
import importlib.util
import os
import sys
from pathlib import Path
from typing import Any

from posttrain.errors import PosttrainError


def load_object(target: str, flag: str, example: str) -> Any:
    """The object ``target`` names; ``PosttrainError`` naming ``flag`` and what is wrong.

    ``example`` shows the expected form in the error (e.g. ``mypkg.rules:ENV``).
    """
    module_name, colon, attribute = target.rpartition(":")
    if not colon or not module_name or not attribute:
        raise PosttrainError(f"{flag} {target!r}: give module:attribute or file.py:attribute, "
                             f"e.g. {example}")
    try:
        module = _load_module(module_name)
    except FileNotFoundError:
        raise PosttrainError(f"{flag} {target!r}: no such file {module_name!r}") from None
    except SystemExit as leaving:  # sys.exit() at import: not a reason to end quietly
        raise PosttrainError(f"{flag} {target!r}: importing {module_name!r} called "
                             f"sys.exit({leaving.code!r}); a module that defines an "
                             "environment or a function must not exit when imported "
                             "(guard script code with if __name__ == '__main__')") from None
    except Exception as error:  # the user's module: any import-time error is theirs
        raise PosttrainError(f"{flag} {target!r}: cannot import {module_name!r}: "
                             f"{type(error).__name__}: {error}") from error
    try:
        return getattr(module, attribute)
    except AttributeError:
        raise PosttrainError(f"{flag} {target!r}: {module_name!r} has no {attribute!r}") from None


def _load_module(name: str) -> Any:
    if name.endswith(".py"):
        path = Path(name).expanduser().resolve()
        if not path.is_file():
            raise FileNotFoundError(name)
        module_name = f"posttrain_user_{path.stem}_{abs(hash(str(path))) % 10**8}"
        if module_name in sys.modules:
            return sys.modules[module_name]
        spec = importlib.util.spec_from_file_location(module_name, path)
        module = importlib.util.module_from_spec(spec)
        sys.modules[module_name] = module  # dataclasses look their module up while loading
        try:
            spec.loader.exec_module(module)
        except BaseException:
            del sys.modules[module_name]
            raise
        return module
    here = os.getcwd()
    if here not in sys.path:
        sys.path.insert(0, here)
    return importlib.import_module(name)
