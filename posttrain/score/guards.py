"""Which guards a verdict checks: the default guard where it can fail, else a marker that can.

A guard is a 0/1 side measurement of each reply (one of the rule's markers) whose fall
fails a run whatever pass@1 did: a hole in the rule that the holdout, graded by the same
rule, cannot show. The default is ``well_formed`` (no broken tool-call block). A guard
that is constant on the baseline rows cannot show a fall there in the way the report
reads it: SmolLM2-135M never opens a tool call, so ``well_formed`` is 1.00 on every base
reply and read "degenerate: constant on both sides" after training (issue #48).

``choose_guards`` keeps each default guard that varies on the baseline rows, and one that
is constant above 0 (a fall from it is still caught; one at 0 cannot fall and is dropped).
For a constant one it says so and looks among the rule's other markers for one that can
fail in both directions: a
marker present on every row that varies on the baseline rows and that the rule scores the
same way in every category where it varies (replies with it score at least
``CLEAR_DIRECTION`` more, or less, on average than replies without it). One the rule
pays for is guarded as it is (a fall: fewer replies with it); one the rule punishes is
guarded as its absence, ``not:<marker>`` (a fall: more replies with it, such as the
refund rule's ``invented_id``). A marker scored one way in a category and the other way in
another (``tool_call``: right with an order id, wrong without) says nothing on its own and
is left out. When no marker qualifies the notes say that no guard can fail in this run.
"""

from __future__ import annotations

from collections.abc import Iterable, Sequence
from dataclasses import dataclass, field
from typing import Any

#: the mean score gap between replies with and without a marker that makes its direction
#: clear (a fifth of the score's range)
CLEAR_DIRECTION = 0.2
NEGATED = "not:"


@dataclass
class GuardChoice:
    """The guards a verdict checks, and what was said about the choice."""

    names: list[str]
    notes: list[str] = field(default_factory=list)


def guard_value(name: str, row: dict[str, Any]) -> float:
    """A guard's value on one row: the marker, or 1 minus it for ``not:<marker>``."""
    marker = name.removeprefix(NEGATED)
    value = float(row["markers"][marker])
    return 1.0 - value if name.startswith(NEGATED) else value


def guard_marker(name: str) -> str:
    """The marker a guard reads (``not:invented_id`` reads ``invented_id``)."""
    return name.removeprefix("marker:").removeprefix(NEGATED)


def _markers_on_every_row(rows: Sequence[dict[str, Any]]) -> list[str]:
    names: dict[str, None] = {}
    for row in rows:
        for name in row.get("markers") or {}:
            names.setdefault(name, None)
    return [name for name in names
            if all(isinstance((row.get("markers") or {}).get(name), (int, float))
                   for row in rows)]


def _varies(rows: Iterable[dict[str, Any]], name: str) -> bool:
    return len({float(row["markers"][name]) for row in rows}) > 1


def marker_direction(rows: Sequence[dict[str, Any]], name: str) -> int:
    """+1 when replies with the marker score clearly more (by ``CLEAR_DIRECTION``) in every
    category where it varies, -1 when clearly less in every such category, 0 otherwise
    (``tool_call`` on the refund rule's cold-started rows: clearly more with an id, no
    different without one, where not calling does not ask either)."""
    by_category: dict[str, list[dict[str, Any]]] = {}
    for row in rows:
        by_category.setdefault(str(row.get("category")), []).append(row)
    signs = set()
    for group in by_category.values():
        with_it = [float(r["score"]) for r in group if float(r["markers"][name]) >= 0.5]
        without = [float(r["score"]) for r in group if float(r["markers"][name]) < 0.5]
        if not with_it or not without:
            continue
        gap = sum(with_it) / len(with_it) - sum(without) / len(without)
        if abs(gap) < CLEAR_DIRECTION:  # unclear somewhere: no direction of its own
            return 0
        signs.add(1 if gap > 0 else -1)
    return signs.pop() if len(signs) == 1 else 0


def choose_guards(rows: Sequence[dict[str, Any]], defaults: Sequence[str]) -> GuardChoice:
    """The guards for a verdict whose "before" side is ``rows`` (module docstring)."""
    rows = [row for row in rows if isinstance(row.get("markers"), dict) and "score" in row]
    present = _markers_on_every_row(rows)
    kept: list[str] = []
    notes: list[str] = []
    constant = []
    for name in defaults:
        marker = guard_marker(name)
        if marker not in present:
            kept.append(name)  # not on these rows: the verdict says it was not checked
        elif _varies(rows, marker):
            kept.append(name)
        else:
            constant.append(marker)
            value = float(rows[0]["markers"][marker])
            if value > 0:  # it can still fall, and the verdict still checks it
                kept.append(name)
                notes.append(f"guard {marker} is {value:.2f} on every baseline reply: it "
                             "catches a fall, but shows nothing of the replies in between")
            else:
                notes.append(f"guard {marker} is 0 on every baseline reply and cannot fall: "
                             "not checked")
    if not constant:
        return GuardChoice(kept, notes)
    candidates = [name for name in present
                  if name not in constant and name not in kept and _varies(rows, name)]
    chosen = []
    for name in candidates:
        direction = marker_direction(rows, name)
        if direction > 0:
            chosen.append(name)
        elif direction < 0:
            chosen.append(f"{NEGATED}{name}")
    if chosen:
        notes.append(f"guarding also: {', '.join(chosen)} (markers that vary on the "
                     "baseline replies and that the rule scores the same way in every "
                     "category; not:X guards against more replies with X)")
    else:
        notes.append("no other marker of the rule varies on the baseline replies with a "
                     "clear direction: no guard can fail in this run")
    return GuardChoice(kept + chosen, notes)
