"""The engine wing: one base model, sessions, LoRA runs and their ordered operations.

The protocol wings (``posttrain.service.protocols``) hand it typed requests
(``requests``) and call its public methods (``engine.Engine``); nothing here knows a wire
format. ``runs`` and ``operations`` keep each run's order, ``lora_model`` holds a run's
tensors, ``losses`` the built-in losses, ``state`` what is on disk, ``compute`` the one
thread all torch work runs on.
"""

from __future__ import annotations

from posttrain.service.engine.capabilities import PRIMITIVES
from posttrain.service.engine.engine import Engine
from posttrain.service.engine.requests import Limits

__all__ = ["PRIMITIVES", "Engine", "Limits"]
