"""Counts of multi-turn episodes: turns, tool calls, failed calls, turn-limit endings.

Graded rows of a multi-turn environment carry ``episode`` (``posttrain.score.rows``).
These are the per-episode means a report shows beside pass@1: a policy that passes
more often by taking more turns or failing more calls first is visible here.
"""

from __future__ import annotations

from collections.abc import Iterable, Mapping
from typing import Any

FIELDS = ("turns", "tool_calls", "failed_calls", "turn_limit")
LABELS = {"turns": "turns", "tool_calls": "tool calls", "failed_calls": "failed calls",
          "turn_limit": "turn-limit share"}


def episode_stats(rows: Iterable[Mapping[str, Any]]) -> dict[str, float] | None:
    """Means per episode (``turns``, ``tool_calls``, ``failed_calls``) and the share
    ended by the turn limit; None when the rows are not episodes."""
    episodes = [row["episode"] for row in rows if isinstance(row.get("episode"), Mapping)]
    if not episodes:
        return None
    count = len(episodes)
    stats: dict[str, float] = {"episodes": count}
    for name in ("turns", "tool_calls", "failed_calls"):
        stats[name] = round(sum(float(e.get(name) or 0) for e in episodes) / count, 3)
    stats["turn_limit"] = round(sum(e.get("ended") == "turn_limit" for e in episodes) / count, 3)
    return stats


def format_episode_stats(stats: Mapping[str, float]) -> str:
    """One line: ``episodes  turns 2.10, tool calls 1.80, ...``."""
    parts = ", ".join(f"{LABELS[name]} {stats[name]:.2f}" for name in FIELDS)
    return f"episodes  {parts} (means over {int(stats['episodes'])} episodes)"


def format_episode_change(before: Mapping[str, float], after: Mapping[str, float]) -> str:
    """One line: ``episodes  turns 2.10 -> 2.40, tool calls ...`` (per-episode means)."""
    parts = ", ".join(f"{LABELS[name]} {before[name]:.2f} -> {after[name]:.2f}" for name in FIELDS)
    return f"episodes  {parts}"
