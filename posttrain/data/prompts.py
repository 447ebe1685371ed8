"""Prompt sets: JSONL files, holdout splits, category balance and filters.

A prompt record is ``{"prompt", "scenario_id", "category", "case"}`` plus an
optional ``seed`` (the template prompt it was written from) and ``source`` (what wrote
it: ``template`` or ``writer:<angle>``, kept in files for people, not read back). ``case`` and
``category`` are always re-derived from the text by the environment on load:
a file may carry them, but they are never trusted.

Splits are by scenario (a situation with several phrasings lands wholly on one
side), decided by SHA-256 of the scenario id, so they do not depend on the
sampling seed, on Python's ``hash()`` or on the order of the file.
"""

from __future__ import annotations

import hashlib
import json
import os
from collections import Counter
from collections.abc import Iterable
from pathlib import Path
from typing import Any

from posttrain.envs import get_env
from posttrain.envs.base import MAX_PROMPT_CHARS, Env, case_of, field_problem, record_fields
from posttrain.errors import InputFileError
from posttrain.jsonl import read_jsonl_objects, write_jsonl_atomic
from posttrain.text import jaccard, word_set


def _default_env() -> Env:
    return get_env()  # the default environment


def make_record(
    prompt: str,
    scenario_id: str | None = None,
    *,
    env: Env | None = None,
    seed: str | None = None,
    fields: dict[str, Any] | None = None,
) -> dict[str, Any]:
    """A prompt record with ``case`` and ``category`` derived by the environment (from the
    text, or from the text and ``fields`` for an environment that reads columns)."""
    env = env or _default_env()
    record: dict[str, Any] = {"prompt": prompt, "scenario_id": scenario_id or prompt}
    if fields:
        record["fields"] = dict(fields)
    case = case_of(env, record)
    record.update(category=env.category(case), case=case)
    if seed is not None:
        record["seed"] = seed
    return record




def prompt_text(value: Any) -> tuple[str | None, str | None]:
    """``(text, problem)`` of a ``prompt`` value: a string, or TRL's conversational form
    (a list of messages ending with the user's; a leading system message is allowed and
    replaced by the environment's system prompt)."""
    if isinstance(value, str):
        if len(value) > MAX_PROMPT_CHARS:
            return None, (f"{len(value):,} characters; a prompt may have at most "
                          f"{MAX_PROMPT_CHARS:,}")
        return (value, None) if value.strip() else (None, "expected a non-empty string")
    if not isinstance(value, list) or not value:
        return None, "expected a non-empty string or a list of messages"
    for message in value:
        if not isinstance(message, dict) or not isinstance(message.get("content"), str):
            return None, "each message must be an object with text 'role' and 'content'"
    roles = [message.get("role") for message in value]
    if roles[-1] != "user" or not value[-1]["content"].strip():
        return None, "the last message must be the user's, with text"
    if roles[:-1] not in ([], ["system"]):
        return None, ("only [system,] user is supported: earlier turns "
                      f"({', '.join(map(str, roles[:-1]))}) cannot be replayed yet")
    return prompt_text(value[-1]["content"])


def load_prompts(path: str | os.PathLike, *, env: Env | None = None) -> list[dict[str, Any]]:
    """Read a JSONL prompt file; every line is validated.

    Each line must be a JSON object with ``prompt``: a non-empty string, or TRL's
    conversational form (``[{"role": "user", "content": ...}]``, optionally after a
    system message, which the environment's system prompt replaces). ``scenario_id``
    (string or integer) defaults to the prompt text; ``seed`` is kept when it is a
    string. An environment that reads columns (``record_fields``) gets each one checked
    for presence and type. ``case`` and ``category`` are recomputed. Blank lines are
    skipped. Raises ``InputFileError`` naming the file, line and field.
    """
    env = env or _default_env()
    declared = record_fields(env)
    records = []
    for line_number, item in read_jsonl_objects(path):
        prompt, problem = prompt_text(item.get("prompt"))
        if problem or prompt is None:
            raise InputFileError(str(path), line_number, "prompt", problem or "missing")
        scenario_id = item.get("scenario_id", prompt)
        if isinstance(scenario_id, bool) or not isinstance(scenario_id, (str, int)):
            raise InputFileError(
                str(path), line_number, "scenario_id", "expected a string or an integer"
            )
        seed = item.get("seed")
        if seed is not None and not isinstance(seed, str):
            raise InputFileError(str(path), line_number, "seed", "expected a string")
        fields = {}
        for name, kind in declared.items():
            if name not in item:
                raise InputFileError(str(path), line_number, name,
                                     f"missing: the environment {env.name!r} reads it ({kind})")
            problem = field_problem(kind, item[name])
            if problem:
                raise InputFileError(str(path), line_number, name, problem)
            fields[name] = item[name]
        try:
            records.append(make_record(prompt, str(scenario_id), env=env, seed=seed,
                                       fields=fields or None))
        except (KeyError, TypeError, ValueError) as error:
            raise InputFileError(str(path), line_number, None,
                                 f"the environment could not read this record: {error}") from None
    if not records:
        raise InputFileError(str(path), None, None, "the file holds no prompts")
    return records


def save_prompts(path: str | os.PathLike, records: Iterable[dict[str, Any]]) -> Path:
    """Write prompt records as JSONL, keeping only the prompt-record keys; the columns an
    environment reads (``fields``) go back to the top level, where ``load_prompts``
    reads them."""
    keys = ("prompt", "scenario_id", "category", "case", "seed", "source")
    return write_jsonl_atomic(
        path, ({**{k: r[k] for k in keys if k in r}, **r.get("fields", {})} for r in records)
    )


def _bucket(text: str) -> float:
    """A number in [0, 1] from SHA-256 of the text: stable everywhere."""
    return int(hashlib.sha256(text.encode()).hexdigest()[:8], 16) / 0xFFFFFFFF


def split_holdout(
    records: list[dict[str, Any]], fraction: float = 0.2
) -> tuple[list[dict[str, Any]], list[dict[str, Any]]]:
    """Split into ``(train, holdout)`` by a hash of each scenario id.

    A scenario goes to the holdout when its bucket is below ``fraction``;
    order is preserved on both sides. Seed-independent by design.
    """
    _check_fraction(fraction)
    train: list[dict[str, Any]] = []
    holdout: list[dict[str, Any]] = []
    for record in records:
        (holdout if _bucket(str(record["scenario_id"])) < fraction else train).append(record)
    return train, holdout


def split_holdout_stratified(
    records: list[dict[str, Any]], fraction: float = 0.2, *, min_scenarios: int = 2
) -> tuple[list[dict[str, Any]], list[dict[str, Any]]]:
    """Split by scenario within each category, so every category is measured.

    Per category with S scenarios, ranked by SHA-256 of ``category:scenario_id``,
    the first ``max(min(min_scenarios, S-1), round(S*fraction))`` go to the
    holdout, never all of them: every category with two or more scenarios is
    represented on both sides. Order is preserved.
    """
    _check_fraction(fraction)
    # dicts as ordered sets: membership in a list made a 200,000-prompt file quadratic
    scenarios_by_category: dict[str, dict[str, None]] = {}
    for record in records:
        scenarios_by_category.setdefault(record["category"], {})[str(record["scenario_id"])] = None
    held: set[tuple[str, str]] = set()
    for name in sorted(scenarios_by_category):
        ids = sorted(
            scenarios_by_category[name],
            key=lambda sid: hashlib.sha256(f"{name}:{sid}".encode()).hexdigest(),
        )
        count = len(ids)
        n_held = min(max(min(min_scenarios, count - 1), round(count * fraction)), max(0, count - 1))
        held.update((name, sid) for sid in ids[:n_held])
    train: list[dict[str, Any]] = []
    holdout: list[dict[str, Any]] = []
    for record in records:
        key = (record["category"], str(record["scenario_id"]))
        (holdout if key in held else train).append(record)
    return train, holdout


def _check_fraction(fraction: float) -> None:
    if not 0.0 < fraction < 1.0:
        raise ValueError(f"holdout fraction must be between 0 and 1 (exclusive), got {fraction}")


def balance(
    records: list[dict[str, Any]], share: float = 0.25, *, max_repeat: int = 6
) -> list[dict[str, Any]]:
    """Repeat minority-category rows until each category reaches ``share`` of the set.

    Categories are visited in name order; while one is below ``share`` of the
    (growing) list and its rows have fewer than ``max_repeat`` copies, all its
    original rows are appended once more. Originals keep their order, repeats
    follow. ``share <= 0`` returns a copy. Apply it to the train side only.
    """
    if share >= 1.0:
        raise ValueError(f"balance share must be below 1, got {share}")
    out = list(records)
    if share <= 0 or not records:
        return out
    by_category: dict[str, list[dict[str, Any]]] = {}
    for record in records:
        by_category.setdefault(record["category"], []).append(record)
    for name in sorted(by_category):
        originals = by_category[name]
        copies = 1
        while copies < max_repeat and _share(out, name) < share:
            out.extend(originals)
            copies += 1
    return out


def _share(records: list[dict[str, Any]], name: str) -> float:
    return sum(1 for r in records if r["category"] == name) / len(records)


def drop_near_duplicates(
    records: list[dict[str, Any]], threshold: float = 0.8
) -> tuple[list[dict[str, Any]], int]:
    """Drop records whose word set has Jaccard >= ``threshold`` with an earlier kept one.

    Returns ``(kept, dropped_count)``. Quadratic in the number kept: fine for
    the thousands of prompts a model-written set holds.
    """
    kept: list[dict[str, Any]] = []
    kept_words: list[frozenset[str]] = []
    for record in records:
        words = word_set(record["prompt"])
        if any(jaccard(words, other) >= threshold for other in kept_words):
            continue
        kept.append(record)
        kept_words.append(words)
    return kept, len(records) - len(kept)


def keep_category(
    records: list[dict[str, Any]], wanted: dict[str, str]
) -> tuple[list[dict[str, Any]], int]:
    """Keep records whose category equals the one wanted for their scenario.

    ``wanted`` maps scenario id to category (e.g. the seed prompt's category
    for a model-written set); scenarios it does not name are kept. Returns
    ``(kept, dropped_count)``.
    """
    kept = [r for r in records if wanted.get(str(r["scenario_id"]), r["category"]) == r["category"]]
    return kept, len(records) - len(kept)


def summary(records: list[dict[str, Any]]) -> dict[str, int]:
    """Counts: prompts, scenarios, and prompts per category."""
    counts = Counter(r["category"] for r in records)
    out = {"prompts": len(records), "scenarios": len({str(r["scenario_id"]) for r in records})}
    out.update({name: counts[name] for name in sorted(counts)})
    return out


def prompt_set_sha256(records: list[dict[str, Any]]) -> str:
    """SHA-256 of a prompt set's canonical JSONL (key order sorted), for pinning."""
    digest = hashlib.sha256()
    for record in records:
        digest.update(json.dumps(record, sort_keys=True, ensure_ascii=False).encode())
        digest.update(b"\n")
    return digest.hexdigest()
