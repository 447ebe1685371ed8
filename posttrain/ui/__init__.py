"""The dashboard: the run list and run pages served on a run server (``app``:
``add_dashboard``, ``dashboard_server``), each name imported on first use, so that a
module under ``posttrain.ui`` loads no more than it asks for."""

from __future__ import annotations

from posttrain.lazy_exports import lazy_face

_EXPORTS = {
    "add_dashboard": "posttrain.ui.app",
    "dashboard_server": "posttrain.ui.app",
}

__getattr__, __dir__ = lazy_face(__name__, _EXPORTS)
__all__ = sorted(_EXPORTS)
