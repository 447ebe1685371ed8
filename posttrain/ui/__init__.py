"""The dashboard: the run list and run pages served on a run server (see ``app``)."""

from posttrain.ui.app import add_dashboard, dashboard_server

__all__ = ["add_dashboard", "dashboard_server"]
