"""Step-range summaries of every curve, kept as it is written, so a long curve is thinned
for drawing by reading a few thousand rows instead of scanning all of its points.

A *tile* is ``TILE_STEPS`` consecutive steps of one metric of one run; its row holds the
step, value and time of the tile's smallest and of its largest value. Writing a new point
updates its tile in place (an upsert); overwriting a point (a value logged twice at one
step) rebuilds the tile from the points, so a tile is always exact. Reading a curve of
100,000 points thinned to 1,000 then reads its 1,563 tiles, groups them into the
requested buckets and keeps each bucket's lowest and highest point: the same spikes and
dips as scanning every point, without the scan.
"""

from __future__ import annotations

import sqlite3
from typing import Any

TILE_STEPS = 64

SCHEMA = """
CREATE TABLE IF NOT EXISTS metric_tiles (
    run TEXT NOT NULL, name TEXT NOT NULL, tile INTEGER NOT NULL,
    lo_step INTEGER NOT NULL, lo_value REAL NOT NULL, lo_time REAL,
    hi_step INTEGER NOT NULL, hi_value REAL NOT NULL, hi_time REAL,
    points INTEGER NOT NULL,
    PRIMARY KEY (run, name, tile)
) WITHOUT ROWID;
"""

_UPSERT = f"""
INSERT INTO metric_tiles (run, name, tile, lo_step, lo_value, lo_time, hi_step, hi_value,
                          hi_time, points)
VALUES (?1, ?2, ?3 / {TILE_STEPS}, ?3, ?4, ?5, ?3, ?4, ?5, 1)
ON CONFLICT (run, name, tile) DO UPDATE SET
    points = points + 1,
    lo_step = CASE WHEN excluded.lo_value < lo_value THEN excluded.lo_step ELSE lo_step END,
    lo_time = CASE WHEN excluded.lo_value < lo_value THEN excluded.lo_time ELSE lo_time END,
    lo_value = min(lo_value, excluded.lo_value),
    hi_step = CASE WHEN excluded.hi_value > hi_value THEN excluded.hi_step ELSE hi_step END,
    hi_time = CASE WHEN excluded.hi_value > hi_value THEN excluded.hi_time ELSE hi_time END,
    hi_value = max(hi_value, excluded.hi_value)
"""

# SQLite returns a bare column from the row that holds the min() or max() of its group:
# that is how a tile learns the step and time of its extremes
_SUMMARISE = f"""
SELECT lo.run, lo.name, lo.tile, lo.step, lo.value, lo.time, hi.step, hi.value, hi.time,
       lo.points
FROM (SELECT run, name, step / {TILE_STEPS} AS tile, step, min(value) AS value, time,
             count(*) AS points
      FROM metrics WHERE {{where}} GROUP BY run, name, step / {TILE_STEPS}) AS lo
JOIN (SELECT run, name, step / {TILE_STEPS} AS tile, step, max(value) AS value, time
      FROM metrics WHERE {{where}} GROUP BY run, name, step / {TILE_STEPS}) AS hi
USING (run, name, tile)
"""


def record_point(cursor: sqlite3.Cursor, run: str, name: str, step: int, value: float,
                 moment: float, replaced: bool) -> None:
    """Bring the point's tile up to date (call after the point itself is written);
    ``replaced``: the step already had a value, which may have been the tile's extreme."""
    if not replaced:
        cursor.execute(_UPSERT, (run, name, step, value, moment))
        return
    tile = step // TILE_STEPS
    cursor.execute("DELETE FROM metric_tiles WHERE run = ? AND name = ? AND tile = ?",
                   (run, name, tile))
    where = "run = ? AND name = ? AND step >= ? AND step < ?"
    bounds = (run, name, tile * TILE_STEPS, (tile + 1) * TILE_STEPS)
    cursor.execute("INSERT INTO metric_tiles " + _SUMMARISE.format(where=where),
                   bounds + bounds)


def backfill(cursor: sqlite3.Cursor) -> None:
    """Summarise every point already stored (a store written before tiles existed)."""
    cursor.execute("INSERT OR IGNORE INTO metric_tiles " + _SUMMARISE.format(where="1"))


def curve_extent(connection: sqlite3.Connection, run: str, name: str
                 ) -> tuple[int, int | None, int | None]:
    """(points, first step, last step) of a whole curve without scanning its points: the
    count from its tiles, the ends from the index."""
    (points,) = connection.execute(
        "SELECT coalesce(sum(points), 0) FROM metric_tiles WHERE run = ? AND name = ?",
        (run, name)).fetchone()
    if not points:
        return 0, None, None
    first = connection.execute("SELECT step FROM metrics WHERE run = ? AND name = ? "
                               "ORDER BY step LIMIT 1", (run, name)).fetchone()
    last = connection.execute("SELECT step FROM metrics WHERE run = ? AND name = ? "
                              "ORDER BY step DESC LIMIT 1", (run, name)).fetchone()
    return points, first[0], last[0]


def thinned_from_tiles(connection: sqlite3.Connection, run: str, name: str, low: int,
                       high: int, max_points: int) -> list[tuple[Any, ...]] | None:
    """At most ``max_points`` (step, value, time) rows of the whole curve from its tiles:
    the first and last points, and each bucket's lowest and highest. None when the buckets
    would be narrower than two tiles (the caller thins the points themselves then)."""
    buckets = (max_points - 2) // 2
    width = (high - low + 1) / max(1, buckets)
    if buckets < 1 or width < 2 * TILE_STEPS:
        return None
    tiles = connection.execute(
        "SELECT tile, lo_step, lo_value, lo_time, hi_step, hi_value, hi_time FROM metric_tiles"
        " WHERE run = ? AND name = ? ORDER BY tile", (run, name)).fetchall()
    if not tiles:
        return None
    lowest: dict[int, tuple[Any, ...]] = {}
    highest: dict[int, tuple[Any, ...]] = {}
    for tile, lo_step, lo_value, lo_time, hi_step, hi_value, hi_time in tiles:
        bucket = min(buckets - 1, max(0, int((tile * TILE_STEPS - low) / width)))
        if bucket not in lowest or lo_value < lowest[bucket][1]:
            lowest[bucket] = (lo_step, lo_value, lo_time)
        if bucket not in highest or hi_value > highest[bucket][1]:
            highest[bucket] = (hi_step, hi_value, hi_time)
    ends = connection.execute(
        "SELECT step, value, time FROM metrics WHERE run = ? AND name = ? AND step IN (?, ?)",
        (run, name, low, high)).fetchall()
    kept = {row[0]: row for row in [*lowest.values(), *highest.values(), *ends]}
    return [kept[step] for step in sorted(kept)]
