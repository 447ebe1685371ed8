"""The engine wing: one base model, sessions, LoRA runs and their ordered operations.

The protocol wings (``posttrain.service.protocols``) hand it typed requests
(``requests``) and call its public methods (``engine.Engine``); nothing here knows a wire
format. ``runs`` and ``operations`` keep each run's order, ``lora_model`` holds a run's
tensors, ``losses`` the built-in losses, ``state`` what is on disk, ``compute`` the one
thread all torch work runs on.
"""

from __future__ import annotations

from posttrain.lazy_exports import lazy_face

# public name -> module that defines it. Imported when first asked for, never by this face
# itself: the engine's modules import one another by their own paths, so none of them
# waits on this file (tests/test_layers.py: no package face in an import loop)
_EXPORTS = {
    "PRIMITIVES": "posttrain.service.engine.capabilities",
    "Engine": "posttrain.service.engine.engine",
    "Limits": "posttrain.service.engine.requests",
}

__all__ = sorted(_EXPORTS)


__getattr__, __dir__ = lazy_face(__name__, _EXPORTS)
