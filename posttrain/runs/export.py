"""A run's whole record as one JSON-ready dict (``posttrain runs export``)."""

from __future__ import annotations

from pathlib import Path
from typing import Any

from posttrain.runs.ops import RunStoreError, check_run_name
from posttrain.runs.sql_store import SqlRunStore
from posttrain.score.rows import load_rows

EXPORT_FORMAT = 1
ROW_FILES = ("holdout_before.jsonl", "holdout_after.jsonl")


def export_run(store: SqlRunStore, runs_root: Path, name: str) -> dict[str, Any]:
    """Status, config, summary, progress, notes, alarms, every curve at full resolution,
    and the run folder's graded holdout rows (when the folder is there).

    Raises ``RunStoreError`` for an unsafe name or a run the store does not hold."""
    check_run_name(name)
    run = store.get_run(name)
    if run is None:
        raise RunStoreError(f"no run named {name!r} in {store.location}")
    metrics = {}
    for metric in run["metric_names"]:
        series = store.metric_series(name, metric)
        metrics[metric] = {key: series[key] for key in ("steps", "values", "times")}
    folder = Path(runs_root) / name
    rows = {file: load_rows(folder / file) for file in ROW_FILES if (folder / file).is_file()}
    return {"format": EXPORT_FORMAT, "run": run, "metrics": metrics, "rows": rows}
