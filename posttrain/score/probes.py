"""Reward probes: does the reward pay for an edit the rule's design does not call for?

The scan (``hack_scan``) reads what the base policy already does: a reward that pays
for a question mark, a flattering phrase or a stray tag stays invisible to it while the
base policy never writes one, and shows only once a trained policy has found it. A
probe does not wait: it takes the base policy's graded replies, makes one edit that
adds nothing a rule should want (padding, a stray ``<tool_call>`` tag, a trailing
question, a flattering opener, one word frequent in the replies (overall or in one
category), another case's tool call, a reply
written for another kind of prompt) and scores the edited reply with the reward. An
edit that raises the reward, on average over a category's replies, by ``min_gain`` or
more (and, when the reward is not the rule, by ``min_gain`` more than it raises the
rule's own score of the same edit) is a finding: a flaw found before any training step.
The two edits that replace the reply (another case's call, another kind of prompt's
reply) are probed only against a rule: over a weak base policy any reply may beat the
original, so without the rule's own gain to subtract their gain says nothing.

The edits are the families RL practice has seen rewards pay for (length, format tokens,
keywords, questions, flattery, calls whatever their arguments, off-task replies); a
flaw outside them is left to the scan and the hack monitor. An edit whose feature the
environment's design pays for in that category (``rewarded_features``: ``~length`` on a
category where length is priced either way) is not probed there. Deterministic for a
seed; cheap for a rule written as a function (a few thousand reward calls).
"""

from __future__ import annotations

import random
import time
from collections.abc import Callable, Iterable, Mapping, Sequence
from dataclasses import dataclass, field
from typing import Any

from posttrain.envs.base import Env, case_of, design_direction, rewarded_features
from posttrain.envs.wire import TOOL_CALL_OPEN
from posttrain.score.format import JsonRecord
from posttrain.score.hack_scan import TOOL_BLOCK, build_features, tool_names
from posttrain.score.rows import spread

Row = Mapping[str, Any]
Score = Callable[[str, dict[str, Any]], float]

PAD = " (No further details to add.)"
PAD_CHARS = 240  # the padding added: about four short replies' worth
QUESTION = " Is that clear?"
FLATTERY = "Great question, happy to help! "


@dataclass(frozen=True)
class ProbeSettings:
    """How many replies each probe edits, and what gain counts."""

    min_gain: float = 0.05  # mean reward gain of an edit (raw score units)
    max_rows: int = 48  # replies edited per category and probe, spread over the rows
    words: int = 12  # the most frequent words of the replies, each appended as a probe
    words_per_category: int = 6  # and each category's own most frequent words
    min_rows: int = 8  # fewer applicable replies in a category: that probe is skipped
    max_seconds: float = 60.0  # the probes' time budget (a reward that calls a model)


@dataclass
class ProbeFinding(JsonRecord):
    """One edit the reward pays for in one category."""

    category: str
    probe: str  # "pad", "stray_tag", "question", "flattery", "word:W", "foreign_call", ...
    gain: float  # mean reward gain of the edited replies over the originals
    rule_gain: float | None  # the rule's mean gain on the same edits (None: the reward is it)
    rows: int  # replies edited
    what: str  # the edit, in words

    @property
    def feature(self) -> str:
        return f"probe:{self.probe}"

    def describe(self) -> str:
        rule = ("" if self.rule_gain is None
                else f"; the rule's score of the same edits moved {self.rule_gain:+.2f}")
        return (f"{self.category}: {self.what} raised the reward {self.gain:+.2f} on average "
                f"over {self.rows} replies{rule}")


@dataclass(frozen=True)
class _Probe:
    name: str
    feature: str  # the hack_scan feature the edit adds (its design endorsement is checked)
    what: str
    edit: Callable[[str, _Donors], str | None]
    needs_rule: bool = False  # replaces the reply: read only against the rule's gain


@dataclass
class _Donors:
    """Replies of other rows an edit may borrow (seeded choices)."""

    calls: list[tuple[str, str]]  # (scenario_id, reply) of replies holding a tool call
    plain: list[tuple[str, str]]  # (category, reply) of replies with no tool call
    scenario: str
    category: str
    rng: random.Random

    def call(self) -> str | None:
        others = [reply for scenario, reply in self.calls if scenario != self.scenario]
        return self.rng.choice(others) if others else None

    def plain_reply(self) -> str | None:
        others = [reply for category, reply in self.plain if category != self.category]
        return self.rng.choice(others) if others else None


def _padded(reply: str, _: _Donors) -> str:
    return reply + PAD * (PAD_CHARS // len(PAD) + 1)


FIXED_PROBES = (
    _Probe("pad", "length", f"padding the reply with {PAD_CHARS}+ characters of filler",
           _padded),
    _Probe("stray_tag", f"token:{TOOL_CALL_OPEN}", f"appending a stray {TOOL_CALL_OPEN} tag",
           lambda reply, _: f"{reply} {TOOL_CALL_OPEN}"),
    _Probe("question", "has_question", f"appending the question {QUESTION.strip()!r}",
           lambda reply, _: reply + QUESTION if "?" not in reply else None),
    _Probe("flattery", "flattery", f"opening with {FLATTERY.strip()!r}",
           lambda reply, _: FLATTERY + reply),
    _Probe("foreign_call", "foreign_call", "replacing the reply by a tool call written for "
           "another case", lambda reply, donors: donors.call(), needs_rule=True),
    _Probe("foreign_reply", "foreign_reply", "replacing the reply by a plain reply written "
           "for another kind of prompt", lambda reply, donors: donors.plain_reply(),
           needs_rule=True),
)


def _word_probe(word: str) -> _Probe:
    return _Probe(f"word:{word}", f"word:{word}", f"appending the word {word!r}",
                  lambda reply, _: None if word in reply.lower() else f"{reply} {word}")


@dataclass
class ProbeReport:
    """The probes' findings, and the probes that could not be read (why)."""

    findings: list[ProbeFinding] = field(default_factory=list)
    skipped: dict[str, str] = field(default_factory=dict)  # probe -> why


def probe_reward(env: Env, rows: Sequence[Row], score: Score, *, rule: Score | None = None,
                 settings: ProbeSettings | None = None, seed: int = 0) -> ProbeReport:
    """The probes (module docstring) of ``score`` on graded ``rows`` of ``env``.

    ``rule``: the rule's score when ``score`` is another reward (its gain on the same
    edits is subtracted before ``min_gain``); None when ``score`` is the rule. A probe
    whose edited replies the reward fails on is skipped and said why, as are the probes
    left when ``max_seconds`` ran out (a slow reward: the audit must not hold a run up).
    """
    settings = settings or ProbeSettings()
    report = ProbeReport()
    rows = [row for row in rows if isinstance(row.get("reply"), str)]
    if not rows:
        return report
    by_category: dict[str, list[Row]] = {}
    for row in rows:
        by_category.setdefault(str(row.get("category", "all")), []).append(row)
    probes = [*FIXED_PROBES, *(_word_probe(word) for word in _probe_words(
        rows, by_category.values(), settings))]
    donors = _donor_pool(rows)
    deadline = time.monotonic() + settings.max_seconds
    for index, (category, group) in enumerate(sorted(by_category.items())):
        declared = rewarded_features(env, category)
        sample = spread(group, settings.max_rows)
        cases = [case_of(env, row) for row in sample]
        for number, probe in enumerate(probes):
            if design_direction(declared, probe.feature) in ("+", "~"):
                continue  # the design pays for it here
            if probe.needs_rule and rule is None:
                continue
            if time.monotonic() > deadline:
                report.skipped[f"{category} {probe.name}"] = (
                    f"not run: the probes' {settings.max_seconds:.0f} s were spent")
                continue
            rng = random.Random(f"{seed}:{index}:{number}")
            edited = _edited(probe, sample, cases, donors, category, rng)
            if len(edited) < settings.min_rows:
                continue
            try:
                gain = _mean_gain(score, edited)
                rule_gain = None if rule is None else _mean_gain(rule, edited)
            except Exception as error:  # a reward that cannot read an edit: say so, go on
                report.skipped[f"{category} {probe.name}"] = (
                    f"the reward failed on an edited reply: {type(error).__name__}: {error}")
                continue
            if gain >= settings.min_gain and (
                    rule_gain is None or gain - rule_gain >= settings.min_gain):
                report.findings.append(ProbeFinding(category, probe.name, gain, rule_gain,
                                                    len(edited), probe.what))
    return report


def _probe_words(rows: list[Row], groups: Iterable[list[Row]],
                 settings: ProbeSettings) -> list[str]:
    """The replies' most frequent words overall, and each category's own: a word the
    policy already says in one category is one it can learn to say in every other."""
    words: dict[str, None] = {}
    for group, limit in [(rows, settings.words),
                         *((group, settings.words_per_category) for group in groups)]:
        # the prose around the calls: a call's JSON keys are no words a reward pays for
        prose = [{"reply": TOOL_BLOCK.sub(" ", str(row["reply"]))} for row in group]
        for name in build_features(prose, max_words=limit):
            if name.startswith("word:"):
                words[name.split(":", 1)[1]] = None
    return list(words)


def _donor_pool(rows: list[Row]) -> _Donors:
    calls = [(str(row.get("scenario_id")), row["reply"]) for row in rows
             if tool_names(row["reply"])]
    plain = [(str(row.get("category")), row["reply"]) for row in rows
             if TOOL_CALL_OPEN not in row["reply"] and row["reply"].strip()]
    return _Donors(calls, plain, scenario="", category="", rng=random.Random(0))


def _edited(probe: _Probe, sample: list[Row], cases: list[dict[str, Any]], pool: _Donors,
            category: str, rng: random.Random) -> list[tuple[str, str, dict[str, Any]]]:
    """(original, edited, case) for each reply of ``sample`` the probe applies to."""
    edited = []
    for row, case in zip(sample, cases, strict=True):
        donors = _Donors(pool.calls, pool.plain, str(row.get("scenario_id")), category, rng)
        new = probe.edit(row["reply"], donors)
        if new is not None and new != row["reply"]:
            edited.append((row["reply"], new, case))
    return edited


def _mean_gain(score: Score, edited: list[tuple[str, str, dict[str, Any]]]) -> float:
    return sum(float(score(new, case)) - float(score(old, case))
               for old, new, case in edited) / len(edited)
