"""Model-written prompt sets: a chat model rewrites the environment's template prompts.

The seeds' recipe: a writer model, several angles, a category filter and a
near-duplicate filter. For every seed prompt (from the environment's ``write_prompts``)
and every angle, the writer is asked for ``per_request`` new versions of the message as
a JSON array (a reply that is not one is read line by line instead). Each version then
has to pass:

1. **the faithfulness filter**: the environment must read the same category *and* the
   same ground truth (``case``: for the refund rule, the exact order id, or none) from the
   written text as from its seed, so a with-id seed keeps its exact id and a no-id seed
   gains none;
2. **the near-duplicate filter**: its word set's Jaccard similarity with every prompt
   kept before it (the seeds included) stays under the threshold.

Kept prompts carry their seed's ``scenario_id`` (splits stay by scenario) and the seed
text. The work is journaled request by request next to the output file, so a rerun of
the same command continues where an interrupted one stopped; the output itself is written
once, atomically, at the end, with a report of how many were asked, written and dropped
by each filter.
"""

from __future__ import annotations

import json
import os
import re
from collections.abc import Callable
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

from posttrain.agents import stable_seed
from posttrain.data.prompts import make_record, save_prompts
from posttrain.envs.base import Env
from posttrain.errors import PosttrainError
from posttrain.progress import progress_bar
from posttrain.text import jaccard as similarity
from posttrain.text import word_set

#: how each angle asks for the message to be rewritten
ANGLES: dict[str, str] = {
    "plain": "as the same customer might have written it, in other words",
    "angry": "as an angry customer who wants it sorted out right now",
    "polite": "as a very polite, rather formal customer",
    "terse": "as a busy customer typing a few words on a phone",
    "rambling": "as a customer who tells a long story around the request",
    "second_language": "as a customer writing simple English as a second language",
}
DEFAULT_ANGLES = ("plain", "angry", "polite", "terse")
WRITER_SYSTEM = ("You write realistic messages that customers send to an online store's "
                 "support chat, for testing a support assistant. Answer with a JSON array of "
                 "strings and nothing else.")
# identifiers to carry over unchanged: anything with a digit (order ids, amounts, dates)
_IDENTIFIER = re.compile(r"\b[\w-]*\d[\w-]*\b")
_LIST_MARK = re.compile(r'^\s*(?:[-*\u2022]|\d+[.)]|"\s*)\s*')


@dataclass(frozen=True)
class WriterSettings:
    """How many to ask for, from which angles, and the filters' threshold."""

    angles: tuple[str, ...] = DEFAULT_ANGLES
    per_request: int = 3
    jaccard: float = 0.8
    seed: int = 0
    batch: int = 8  # requests handed to the writer at once

    def __post_init__(self) -> None:
        unknown = [angle for angle in self.angles if angle not in ANGLES]
        if unknown or not self.angles:
            raise PosttrainError(f"--angles: unknown angle(s) {', '.join(unknown) or '(none)'}; "
                                 f"choose from {', '.join(ANGLES)}")
        if not 1 <= self.per_request <= 10:
            raise PosttrainError(f"--per-request must be from 1 to 10, got {self.per_request}")
        if not 0 < self.jaccard <= 1:
            raise PosttrainError(f"--jaccard must be in (0, 1], got {self.jaccard}")


@dataclass
class WriteReport:
    """What happened to every version the writer was asked for."""

    seeds: int = 0
    requests: int = 0
    unreadable_replies: int = 0  # replies with no version in them at all
    written: int = 0  # versions parsed out of the replies
    dropped_category: int = 0  # the environment reads another category
    dropped_ground_truth: int = 0  # same category, another ground truth (another order id)
    dropped_near_duplicate: int = 0
    kept: int = 0  # written versions kept (the seeds come on top)
    by_category: dict[str, int] = field(default_factory=dict)

    @property
    def acceptance(self) -> float:
        return self.kept / self.written if self.written else 0.0

    def describe(self) -> str:
        categories = ", ".join(f"{name} {count}" for name, count in self.by_category.items())
        return (f"asked {self.requests} times for versions of {self.seeds} seed prompts: "
                f"{self.written} written ({self.unreadable_replies} replies held none), "
                f"{self.dropped_category} dropped for another category, "
                f"{self.dropped_ground_truth} for another ground truth, "
                f"{self.dropped_near_duplicate} as near duplicates; kept {self.kept} "
                f"({self.acceptance:.0%} of those written) + {self.seeds} seeds"
                + (f" = {self.kept + self.seeds} prompts ({categories})" if categories else ""))

    def to_dict(self) -> dict[str, Any]:
        from dataclasses import asdict

        return {**asdict(self), "acceptance": round(self.acceptance, 4)}


def writer_messages(seed_prompt: str, angle: str, count: int) -> list[dict[str, str]]:
    """The request for ``count`` versions of ``seed_prompt`` from ``angle``."""
    keep = sorted(set(_IDENTIFIER.findall(seed_prompt)))
    keep_line = (f" Keep {', '.join(keep)} exactly as written." if keep
                 else " Do not add an order number or any other number.")
    return [
        {"role": "system", "content": WRITER_SYSTEM},
        {"role": "user", "content": (
            f"A customer wrote:\n\n{seed_prompt}\n\nWrite {count} different versions of this "
            f"message {ANGLES[angle]}. Keep what the customer wants the same.{keep_line} "
            "Do not answer the message. Answer with a JSON array of strings.")},
    ]


def parse_versions(reply: str) -> list[str]:
    """The versions in a writer's reply: its JSON array of strings (also inside other
    text), else its lines of four words or more that do not end in a colon, with list
    marks and quotes stripped."""
    start, end = reply.find("["), reply.rfind("]")
    if 0 <= start < end:
        try:
            values = json.loads(reply[start : end + 1])
        except ValueError:
            values = None
        if isinstance(values, list):
            texts = [value.strip() for value in values if isinstance(value, str)]
            return [text for text in texts if text]
    versions = []
    for line in reply.splitlines():
        text = _LIST_MARK.sub("", line).strip().strip('",').strip()
        # a message, not a heading ("A customer wrote:"), a fragment or a bracket
        if (len(text.split()) >= 4 and not text.endswith(":")
                and not text.startswith(("[", "]", "{", "}"))):
            versions.append(text)
    return versions


class Journal:
    """The versions already written, one JSON line per answered request, so an
    interrupted run continues; ``path`` is removed once the output is written."""

    def __init__(self, path: Path) -> None:
        self.path = path
        self.done: dict[str, list[str]] = {}
        if path.is_file():
            for line in path.read_text(encoding="utf-8").splitlines():
                try:
                    entry = json.loads(line)
                    self.done[str(entry["job"])] = [str(text) for text in entry["versions"]]
                except (ValueError, KeyError, TypeError):
                    continue  # a line cut short by the interruption: asked again

    def add(self, job: str, versions: list[str]) -> None:
        with self.path.open("a", encoding="utf-8") as handle:
            handle.write(json.dumps({"job": job, "versions": versions}) + "\n")
        self.done[job] = versions


def ask_writer(agent: Any, jobs: list[tuple[str, list[dict[str, str]]]], journal: Journal,
               batch: int, seed: int, progress: Callable[[int], None]) -> None:
    """Ask for every job not in the journal yet, ``batch`` at a time."""
    waiting = [(job, messages) for job, messages in jobs if job not in journal.done]
    progress(len(jobs) - len(waiting))
    for start in range(0, len(waiting), batch):
        chunk = waiting[start : start + batch]
        replies = agent.reply_batch([messages for _, messages in chunk],
                                    [stable_seed("writer", seed, job) for job, _ in chunk])
        for (job, _), reply in zip(chunk, replies, strict=True):
            journal.add(job, parse_versions(reply))
        progress(len(jobs) - len(waiting) + start + len(chunk))


def filter_versions(env: Env, seeds: list[dict[str, Any]], answers: dict[str, list[str]],
                    angles: tuple[str, ...], jaccard: float, report: WriteReport
                    ) -> list[dict[str, Any]]:
    """The seeds, then every written version that passes both filters (module docstring)."""
    kept = [dict(seed, source="template") for seed in seeds]
    kept_words = [word_set(seed["prompt"]) for seed in seeds]
    for index, seed in enumerate(seeds):
        for angle in angles:
            versions = answers.get(job_key(index, angle), [])
            report.unreadable_replies += not versions
            for text in versions:
                report.written += 1
                record = make_record(text, seed["scenario_id"], env=env, seed=seed["prompt"])
                if record["category"] != seed["category"]:
                    report.dropped_category += 1
                    continue
                if record["case"] != seed["case"]:
                    report.dropped_ground_truth += 1
                    continue
                words = word_set(text)
                if any(similarity(words, other) >= jaccard for other in kept_words):
                    report.dropped_near_duplicate += 1
                    continue
                kept.append({**record, "source": f"writer:{angle}"})
                kept_words.append(words)
                report.kept += 1
    counts: dict[str, int] = {}
    for record in kept:
        counts[record["category"]] = counts.get(record["category"], 0) + 1
    report.by_category = {name: counts[name] for name in env.categories if name in counts}
    return kept


def job_key(index: int, angle: str) -> str:
    return f"{index}:{angle}"


def journal_path(out: Path) -> Path:
    """Where the journal for ``out`` lives: beside the file it is written to (a
    symlink's target), or in the current folder when the output is a device or FIFO
    (nothing may be created beside ``/dev/stdout``)."""
    target = Path(os.path.realpath(out))
    if target.exists() and not target.is_file():
        return Path.cwd() / f".{target.name}.journal.jsonl"
    return target.with_name(target.name + ".journal.jsonl")


def write_with_model(env: Env, seeds: list[dict[str, Any]], agent: Any, out: Path,
                     settings: WriterSettings, *, label: str = "writing prompts"
                     ) -> tuple[list[dict[str, Any]], WriteReport]:
    """Ask ``agent`` (a batch agent: an in-process model or an endpoint) for versions of
    every seed from every angle, filter them, and write ``out`` (atomically)."""
    if not seeds:
        raise PosttrainError("no seed prompts to rewrite: raise --prompts")
    journal = Journal(journal_path(out))
    jobs = [(job_key(index, angle), writer_messages(seed["prompt"], angle,
                                                    settings.per_request))
            for index, seed in enumerate(seeds) for angle in settings.angles]
    report = WriteReport(seeds=len(seeds), requests=len(jobs))
    with progress_bar(label, len(jobs)) as update:
        ask_writer(agent, jobs, journal, settings.batch, settings.seed, update)
    kept = filter_versions(env, seeds, journal.done, settings.angles, settings.jaccard, report)
    save_prompts(out, kept)
    journal.path.unlink(missing_ok=True)
    return kept, report
