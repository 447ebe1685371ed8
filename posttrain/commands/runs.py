"""``posttrain runs list|export|delete|restore|copy``: the runs recorded in a run store (the runs
folder's SQLite file, or the store ``--store`` / ``$POSTTRAIN_STORE`` names), from the
terminal."""

from __future__ import annotations

import argparse
import json
import sys
import time
from pathlib import Path
from typing import Any

from posttrain.atomic import check_output_path, write_text_atomic
from posttrain.errors import PosttrainError
from posttrain.runs import replaced
from posttrain.runs.copy import copy_runs
from posttrain.runs.export import export_run
from posttrain.runs.folder import runs_root
from posttrain.runs.postgres_store import PostgresRunStore, is_postgres_url
from posttrain.runs.removal import delete_run
from posttrain.runs.replaced import left_replaced
from posttrain.runs.sql_store import SqlRunStore
from posttrain.runs.sqlite_store import SqliteRunStore
from posttrain.runs.store import (
    DB_FILENAME,
    STORE_HELP,
    check_store_spec,
    describe_store,
    open_store,
    store_spec,
)
from posttrain.terminal import printable, raw_stream

RUNS_DIR_HELP = "folder holding posttrain.db and the run folders ($POSTTRAIN_RUNS or ./runs)"


def register(subparsers: argparse._SubParsersAction) -> None:
    parser = subparsers.add_parser(
        "runs",
        help="list the recorded runs; export, delete or copy them",
        description="The runs recorded in the run store the dashboard reads: <runs>/"
        "posttrain.db, or the PostgreSQL database or file --store (or $POSTTRAIN_STORE) names. "
        "A run still marked running whose process stopped sending heartbeats (killed, "
        "crashed, machine lost) is listed as 'lost'.",
    )
    actions = parser.add_subparsers(dest="action", metavar="ACTION")
    actions.required = True

    listing = actions.add_parser(
        "list", help="every run, newest first: status, progress, verdict",
        description="Every run in the store, newest first: status (running, done, failed, "
        "stopped or lost), steps, verdict and paired delta, base model, start time.",
    )
    listing.add_argument("--runs-dir", default=None, help=RUNS_DIR_HELP)
    listing.add_argument("--store", default=None, metavar="URL_OR_FILE", help=STORE_HELP)
    listing.add_argument("--json", action="store_true", help="print the list as JSON")
    listing.set_defaults(func=run_list)

    export = actions.add_parser(
        "export", help="a run's whole record as one JSON file",
        description="Write one run's whole record as one JSON document: its status, config, "
        "summary, progress, notes and alarms, every curve at full resolution (steps, values, "
        "times), and the graded holdout rows of its run folder when there are any.",
    )
    export.add_argument("name", metavar="NAME", help="the run to export")
    export.add_argument("--out", default=None, metavar="FILE",
                        help="where to write it (default: stdout)")
    export.add_argument("--runs-dir", default=None, help=RUNS_DIR_HELP)
    export.add_argument("--store", default=None, metavar="URL_OR_FILE", help=STORE_HELP)
    export.set_defaults(func=run_export)

    delete = actions.add_parser(
        "delete", help="delete a run's record and its run folder",
        description="Delete runs from the store and remove their folders under the runs "
        "folder. A run that is still running (fresh heartbeat) is refused unless --force: "
        "stop it first, or wait until it is listed as lost.",
    )
    delete.add_argument("names", nargs="+", metavar="NAME", help="run name(s) to delete")
    delete.add_argument("--runs-dir", default=None, help=RUNS_DIR_HELP)
    delete.add_argument("--store", default=None, metavar="URL_OR_FILE", help=STORE_HELP)
    delete.add_argument("--force", action="store_true",
                        help="delete even a run that still sends heartbeats")
    delete.set_defaults(func=run_delete)

    restore = actions.add_parser(
        "restore", help="put back the run an interrupted --overwrite was replacing",
        description="A run started with --overwrite keeps the run it replaces (folder and "
        "record) until it finishes; when its process ends first (killed, machine lost), the "
        "old run stays aside and 'runs list' names it. This puts it back under its name: "
        "the interrupted run's folder goes, the old folder returns and its record is "
        "written back into the store. --discard drops the old run instead.",
    )
    restore.add_argument("name", metavar="NAME", help="the run name to restore")
    restore.add_argument("--discard", action="store_true",
                         help="drop the kept run instead of restoring it")
    restore.add_argument("--runs-dir", default=None, help=RUNS_DIR_HELP)
    restore.add_argument("--store", default=None, metavar="URL_OR_FILE", help=STORE_HELP)
    restore.set_defaults(func=run_restore)

    copy = actions.add_parser(
        "copy", help="copy runs into another store (e.g. a team's PostgreSQL)",
        description="Copy runs from this store (the runs folder's posttrain.db, or --store) "
        "into the store --to names, with every curve at full resolution, notes, alarms, kept "
        "replies, status and summary as they were. Run folders stay where they are. A run "
        "the target already has is skipped unless --replace.",
    )
    copy.add_argument("names", nargs="*", metavar="NAME", help="runs to copy (default: all)")
    copy.add_argument("--to", required=True, metavar="URL_OR_FILE",
                      help="the target store: postgresql://user@host/db or a SQLite file")
    copy.add_argument("--runs-dir", default=None, help=RUNS_DIR_HELP)
    copy.add_argument("--store", default=None, metavar="URL_OR_FILE",
                      help="the source store (default: $POSTTRAIN_STORE, else "
                      "<runs folder>/posttrain.db)")
    copy.add_argument("--replace", action="store_true",
                      help="overwrite runs the target already has")
    copy.set_defaults(func=run_copy)


def _store(args: argparse.Namespace) -> tuple[Path, SqlRunStore | None, str]:
    """The runs folder, its store and the store's name; None for the store when a SQLite
    file was never made (a listing must not create an empty database as a side effect)."""
    root = runs_root(args.runs_dir)
    spec = store_spec(getattr(args, "store", None))
    if spec is not None and is_postgres_url(check_store_spec(spec)):
        # a command does not hold records for later: it says the database is down
        return root, PostgresRunStore(spec, hold_when_down=False), describe_store(spec)
    path = root / DB_FILENAME if spec is None else Path(spec)
    return root, (SqliteRunStore(path) if path.is_file() else None), str(path)


def _existing_store(args: argparse.Namespace) -> tuple[Path, SqlRunStore]:
    """The runs folder and its store, which must exist (export and delete read it)."""
    root, store, where = _store(args)
    if store is None:
        raise PosttrainError(f"no run store at {where}: no run has been recorded there "
                             f"(pass --runs-dir or --store, or set $POSTTRAIN_RUNS or "
                             f"$POSTTRAIN_STORE)")
    return root, store


def run_list(args: argparse.Namespace) -> int:
    root, store, where = _store(args)
    runs = []
    if store is not None:
        with store:
            runs = store.list_runs()
    left = left_replaced(root)
    if args.json:
        print(json.dumps({"runs_dir": str(root), "store": where, "runs": runs,
                          "replaced_kept": [{"name": item.name, "folder": str(item.aside),
                                             "record": item.has_record} for item in left]},
                         indent=2, allow_nan=False))
        return 0
    for item in left:
        print(printable(item.describe()), file=sys.stderr)
    if not runs:
        print(f"no runs recorded in {where}")
        return 0
    from rich.console import Console
    from rich.table import Table
    from rich.text import Text

    table = Table(title=f"runs in {where}", title_justify="left")
    for column in ("run", "status", "steps", "verdict", "delta", "base model", "started"):
        table.add_column(column, justify="right" if column in ("steps", "delta") else "left")
    for run in runs:
        # a cell is data, never markup or a terminal code (a run name, a model id)
        table.add_row(*(Text(printable(str(cell))) for cell in (
            run["name"], _status_text(run), _steps(run), run["verdict"] or "–",
            _signed(run["headline_delta"]), run["base_model"] or "–", _when(run["started"]))))
    # drawn on the terminal itself (rich strips control characters from the cells)
    Console(file=raw_stream(sys.stdout)).print(table)
    return 0


def _status_text(run: dict[str, Any]) -> str:
    if run["status"] == "lost" and run["updated"] is not None:
        return f"lost (silent {_duration(time.time() - run['updated'])})"
    return run["status"]


def _steps(run: dict[str, Any]) -> str:
    step, total = run["last_step"], run["total_steps"]
    if step is None:
        return "–"
    return f"{step}/{total}" if total else str(step)


def _signed(value: float | None) -> str:
    return "–" if value is None else f"{value:+.3f}"


def _when(epoch: float | None) -> str:
    return "–" if epoch is None else time.strftime("%Y-%m-%d %H:%M", time.localtime(epoch))


def _duration(seconds: float) -> str:
    seconds = max(0, int(seconds))
    if seconds < 120:
        return f"{seconds} s"
    if seconds < 7200:
        return f"{seconds // 60} min"
    return f"{seconds // 3600} h"


def run_export(args: argparse.Namespace) -> int:
    root, store = _existing_store(args)
    if args.out is not None:  # before the store is read: the export must not replace it
        check_output_path(args.out, what="--out", not_same_as=[root / DB_FILENAME])
    with store:
        record = export_run(store, root, args.name)
    text = json.dumps(record, indent=1, allow_nan=False) + "\n"
    if args.out is None:
        print(text, end="")
    else:
        write_text_atomic(args.out, text)
        curves = len(record["metrics"])
        print(f"wrote run {args.name!r} ({curves} curves) to {args.out}", file=sys.stderr)
    return 0


def run_delete(args: argparse.Namespace) -> int:
    root, store = _existing_store(args)
    with store:
        for name in args.names:
            print(delete_run(store, root, name, force=args.force).describe())
    return 0


def run_restore(args: argparse.Namespace) -> int:
    root, store, where = _store(args)
    if args.discard:
        print(replaced.drop(root, args.name))
        return 0
    if store is None:  # no SQLite file yet: made now, for the record that goes back
        store = SqliteRunStore(Path(where))
    with store:
        print(replaced.restore(root, args.name, store))
    return 0


def run_copy(args: argparse.Namespace) -> int:
    _, source = _existing_store(args)
    target_spec = args.to.strip()
    if describe_store(target_spec) == source.location or (
            not is_postgres_url(target_spec) and getattr(source, "path", None) is not None
            and Path(target_spec).resolve() == source.path.resolve()):
        raise PosttrainError(f"--to {describe_store(target_spec)} is the store the runs come "
                             f"from; name another one")
    with source:
        if is_postgres_url(target_spec):
            target: SqlRunStore = PostgresRunStore(target_spec, hold_when_down=False)
        else:
            target = open_store(target_spec)
        with target:
            names = list(args.names) or None
            results = copy_runs(source, target, names, replace=args.replace)
    for result in results:
        print(result.describe())
    copied = sum(1 for result in results if not result.skipped)
    print(f"{copied} of {len(results)} runs copied from {source.location} to "
          f"{target.location}", file=sys.stderr)
    return 0 if copied or not results else 1
