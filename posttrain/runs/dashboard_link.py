"""Where a running local dashboard can be found, so a recipe can print its run page (the
link comes from the runs folder: a recipe never imports the dashboard to find it).

``posttrain ui`` writes ``<runs>/dashboard.json`` (its URL and process id) while
it serves that runs folder and removes it when it stops. A recipe started on the
same runs folder reads it and prints ``<url>runs/<name>`` on its start line. A
file left by a dashboard that was killed is ignored: its process is gone.
"""

from __future__ import annotations

import json
import os
from collections.abc import Iterator
from contextlib import contextmanager
from pathlib import Path

from posttrain.atomic import write_text_atomic

ANNOUNCE_FILENAME = "dashboard.json"


@contextmanager
def announce_dashboard(runs_root: Path, url: str) -> Iterator[Path]:
    """Publish ``url`` for ``runs_root`` while the block runs; yields the file's path."""
    path = Path(runs_root) / ANNOUNCE_FILENAME
    path.parent.mkdir(parents=True, exist_ok=True)
    write_text_atomic(path, json.dumps({"url": url, "pid": os.getpid()}) + "\n")
    try:
        yield path
    finally:
        try:
            if json.loads(path.read_text()).get("pid") == os.getpid():
                path.unlink()
        except (OSError, ValueError):
            pass  # already gone, or another dashboard took over the file


def local_dashboard_url(runs_root: Path) -> str | None:
    """The URL of a live dashboard serving ``runs_root`` (ends in ``/``), else None."""
    path = Path(runs_root) / ANNOUNCE_FILENAME
    try:
        facts = json.loads(path.read_text())
        url, pid = str(facts["url"]), int(facts["pid"])
    except (OSError, ValueError, KeyError, TypeError):
        return None
    if not _process_alive(pid):
        return None
    return url if url.endswith("/") else url + "/"


def _process_alive(pid: int) -> bool:
    try:
        os.kill(pid, 0)
    except ProcessLookupError:
        return False
    except PermissionError:
        return True  # someone else's process: alive
    return True
