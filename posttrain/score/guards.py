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
is left out of that search; then each category is searched alone: a marker the rule scores
clearly one way within a category (``tool_call`` on the library rule: paid on loans and
titles, a failure on chitchat) is guarded on that category's rows only,
``<marker>@<category>`` or ``not:<marker>@<category>`` (a policy that spreads the tool call
to chitchat fails ``not:tool_call@chitchat``). When no marker qualifies either way the
notes say that no guard can fail in this run.
"""

from __future__ import annotations

from collections.abc import Iterable, Sequence
from dataclasses import dataclass, field
from typing import Any

#: the mean score gap between replies with and without a marker that makes its direction
#: clear (a fifth of the score's range)
CLEAR_DIRECTION = 0.2
NEGATED = "not:"
#: ``<guard>@<category>``: a guard read on one category's rows only
SCOPED = "@"


@dataclass
class GuardChoice:
    """The guards a verdict checks, and what was said about the choice."""

    names: list[str]
    notes: list[str] = field(default_factory=list)


def guard_value(name: str, row: dict[str, Any]) -> float:
    """A guard's value on one row: the marker, or 1 minus it for ``not:<marker>``."""
    value = float(row["markers"][guard_marker(name)])
    return 1.0 - value if name.startswith(NEGATED) else value


def guard_marker(name: str) -> str:
    """The marker a guard reads (``not:invented_id`` reads ``invented_id``,
    ``not:tool_call@chitchat`` reads ``tool_call``)."""
    return name.removeprefix("marker:").removeprefix(NEGATED).split(SCOPED, 1)[0]


def guard_rows(name: str, rows: Sequence[dict[str, Any]]) -> list[dict[str, Any]]:
    """The rows a guard reads: all of them, or its category's (``<guard>@<category>``)."""
    _, scoped, category = name.partition(SCOPED)
    return [row for row in rows if not scoped or str(row.get("category")) == category]


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


def _gap(group: Sequence[dict[str, Any]], name: str) -> float | None:
    """Mean score of replies with the marker minus those without (None: not both)."""
    with_it = [float(r["score"]) for r in group if float(r["markers"][name]) >= 0.5]
    without = [float(r["score"]) for r in group if float(r["markers"][name]) < 0.5]
    if not with_it or not without:
        return None
    return sum(with_it) / len(with_it) - sum(without) / len(without)


def _by_category(rows: Sequence[dict[str, Any]]) -> dict[str, list[dict[str, Any]]]:
    groups: dict[str, list[dict[str, Any]]] = {}
    for row in rows:
        groups.setdefault(str(row.get("category")), []).append(row)
    return groups


def category_guards(rows: Sequence[dict[str, Any]], names: Sequence[str]) -> list[str]:
    """Guards read within one category: each marker the rule scores clearly one way in
    that category (``tool_call`` on the library rule: paid with a loan or a title, a
    failure on chitchat), as ``<marker>@<category>`` or ``not:<marker>@<category>``."""
    chosen = []
    for category, group in _by_category(rows).items():
        for name in names:
            gap = _gap(group, name)
            if gap is not None and abs(gap) >= CLEAR_DIRECTION:
                chosen.append(f"{'' if gap > 0 else NEGATED}{name}{SCOPED}{category}")
    return chosen


def marker_direction(rows: Sequence[dict[str, Any]], name: str) -> int:
    """+1 when replies with the marker score clearly more (by ``CLEAR_DIRECTION``) in every
    category where it varies, -1 when clearly less in every such category, 0 otherwise
    (``tool_call`` on the refund rule's cold-started rows: clearly more with an id, no
    different without one, where not calling does not ask either)."""
    signs = set()
    for group in _by_category(rows).values():
        gap = _gap(group, name)
        if gap is None:
            continue
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
        return GuardChoice(kept + chosen, notes)
    scoped = category_guards(rows, candidates)
    if scoped:
        notes.append(f"guarding per category: {', '.join(scoped)} (no marker is scored one "
                     "way in every category; these are, within the category after the @; "
                     "not:X guards against more replies with X there)")
    else:
        notes.append("no other marker of the rule varies on the baseline replies with a "
                     "clear direction, in every category or in one: no guard can fail in "
                     "this run")
    return GuardChoice(kept + scoped, notes)
