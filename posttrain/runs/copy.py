"""Copy runs from one store to another (``posttrain runs copy --to postgresql://...``).

A run is replayed as the ops that would have written it (create, metrics, progress,
notes, alarms, kept replies, finish), each with its original time, so the copy reads
back the same through every store: same curves at full resolution, notes and alarms in
order, same status and summary. Runs are copied one at a time, each in batches; a run the
target already has is skipped unless ``replace``.
"""

from __future__ import annotations

from collections.abc import Iterator
from dataclasses import dataclass
from typing import Any

from posttrain.runs.sql_store import SqlRunStore

BATCH_OPS = 500


@dataclass
class CopiedRun:
    """What happened to one run: ``copied`` (with how many ops) or ``skipped`` (why)."""

    name: str
    ops: int = 0
    skipped: str | None = None

    def describe(self) -> str:
        if self.skipped:
            return f"skipped {self.name}: {self.skipped}"
        return f"copied {self.name} ({self.ops} records)"


def run_ops(store: SqlRunStore, run: dict[str, Any]) -> Iterator[dict[str, Any]]:
    """The ops that write ``run`` (its ``get_run`` record in ``store``), in an order that
    replays it."""
    name = run["name"]
    yield {"op": "create", "run": name, "config": run["config"], "time": run["started"]}
    by_moment: dict[tuple[int, float | None], dict[str, float]] = {}
    for metric in run["metric_names"]:
        series = store.metric_series(name, metric)
        for step, value, moment in zip(series["steps"], series["values"], series["times"],
                                       strict=True):
            by_moment.setdefault((step, moment), {})[metric] = value
    for (step, moment), values in sorted(by_moment.items(),
                                         key=lambda item: (item[0][0], item[0][1] or 0.0)):
        yield {"op": "metrics", "run": name, "step": step, "metrics": values, "time": moment}
    for note in run["notes"]:
        yield {"op": "note", "run": name, "text": note["text"], "step": note["step"],
               "time": note["time"]}
    for alarm in run["alarms"]:
        yield {"op": "alarm", "run": name, "kind": alarm["kind"], "step": alarm["step"],
               "message": alarm["message"], "details": alarm["details"], "time": alarm["time"]}
    for check in run["sample_checks"]:
        rows = store.sample_rows(name, check["source"], check["step"])
        yield {"op": "samples", "run": name, "step": check["step"], "source": check["source"],
               "rows": rows or [], "time": check["time"]}
    progress = run["progress"]
    if progress["step"] is not None:
        yield {"op": "progress", "run": name, "step": progress["step"],
               "total": progress["total"], "eta": progress["eta"], "time": run["updated"]}
    if run["status"] in ("done", "failed", "stopped"):
        yield {"op": "finish", "run": name, "status": run["status"], "summary": run["summary"],
               "time": run["finished"]}


def copy_runs(source: SqlRunStore, target: SqlRunStore, names: list[str] | None = None, *,
              replace: bool = False) -> list[CopiedRun]:
    """Copy ``names`` (default: every run) from ``source`` into ``target``."""
    present = {run["name"] for run in target.list_runs()}
    wanted = names if names is not None else [run["name"] for run in source.list_runs()]
    results = []
    for name in wanted:
        if name in present and not replace:
            results.append(CopiedRun(name, skipped=f"{target.location} already has it "
                                                   f"(--replace to overwrite)"))
            continue
        record = source.get_run(name)
        if record is None:
            results.append(CopiedRun(name, skipped=f"no such run in {source.location}"))
            continue
        batch: list[dict[str, Any]] = []
        count = 0
        for op in run_ops(source, record):
            batch.append(op)
            if len(batch) >= BATCH_OPS:
                count += target.apply(batch, owner=record["owner"])  # who made it stays
                batch = []
        if batch:
            count += target.apply(batch, owner=record["owner"])
        results.append(CopiedRun(name, count))
    return results
