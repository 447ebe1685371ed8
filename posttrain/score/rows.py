"""Grading: sample k replies per prompt from an agent and score them into rows.

A graded row (one per sample) is the record every statistic, report and
trainer reads::

    {"prompt", "scenario_id", "category", "sample", "reply", "score", "reward",
     "markers", "policy", "sampling", "eval_run"}

``score`` is the environment's raw rule score (or a judge's), ``reward`` is 1
when it passes (score >= 1.0) and 0 otherwise. A multi-turn environment's row is one
episode: ``reply`` holds the policy's turns (``wire.TURN_SEPARATOR`` between them),
``transcript`` the conversation after the prompt (turns and tool results) and
``episode`` its counts (``turns``, ``tool_calls``, ``failed_calls``, ``ended``).

Each sample gets its own seed, derived from (seed, eval_run, scenario, prompt, sample
index) with SHA-256, so a seeded evaluation is reproducible and two ``eval_run``
values of the same policy are independent re-evaluations (what the noise band is made of).
"""

from __future__ import annotations

import math
import os
from collections.abc import Callable, Sequence
from pathlib import Path
from typing import Any

from posttrain.agents import BatchAgent, agent_identity, agent_sampling, stable_seed
from posttrain.envs.base import (
    Env,
    ScoresAhead,
    case_of,
    env_label,
    has_hook,
    is_multi_turn,
    passes,
    reads_records,
)
from posttrain.errors import InputFileError, PosttrainError
from posttrain.jsonl import read_jsonl_objects, write_jsonl_atomic
from posttrain.score.episodes import play_episodes
from posttrain.text import echo, short_line

Judge = Callable[[str, dict[str, Any]], Any]
Progress = Callable[[int, int], None]

DEFAULT_CHUNK = 64


def sample_seed(seed: int, eval_run: int, record: dict[str, Any], sample: int) -> int:
    """The sampling seed of one sample of one prompt in one evaluation run."""
    return stable_seed("grade", seed, eval_run, record["scenario_id"], record["prompt"], sample)


def _judge_score(judge: Judge, reply: str, record: dict[str, Any]) -> float:
    """A judge may return a bool, a number in [0, 1], or a dict with ``score``/``reward``."""
    verdict = judge(reply, record)
    if isinstance(verdict, dict):
        verdict = verdict.get("score", verdict.get("reward"))
    if isinstance(verdict, bool):
        return 1.0 if verdict else 0.0
    if not isinstance(verdict, (int, float)) or not 0.0 <= float(verdict) <= 1.0:
        raise ValueError(
            f"the judge returned {verdict!r} for scenario {record['scenario_id']}: "
            "expected a bool, a number in [0, 1], or a dict with 'score'"
        )
    return float(verdict)


def rule_score(env: Env, reply: str, case: dict[str, Any], record: dict[str, Any]) -> float:
    """The environment's score of one reply, checked: a finite number, or a
    ``PosttrainError`` in one line naming the environment, the scenario and what came back
    (a hook that returns None, a string or NaN, or raises, is the environment's bug, not a
    reason for a traceback or a silent pass or fail)."""
    where = f"the score of environment {env_label(env)} on scenario {record.get('scenario_id')!r}"
    try:
        value = env.score(reply, case)
    except Exception as error:  # the user's hook: say which, in one line
        raise PosttrainError(f"{where}, raised {type(error).__name__}: "
                             f"{short_line(error)}") from None
    if isinstance(value, bool) or not isinstance(value, (int, float)) or not math.isfinite(
            value):
        raise PosttrainError(f"{where}, returned {echo(value)}: a score must be a finite "
                             "number (1.0 or more passes)")
    return float(value)


def grade_replies(
    env: Env,
    requests: Sequence[tuple[dict[str, Any], int, int]],
    replies: Sequence[str],
    *,
    policy: dict[str, Any] | None = None,
    sampling: dict[str, Any] | None = None,
    eval_run: int = 0,
    judge: Judge | None = None,
    transcripts: Sequence[list[dict[str, Any]]] | None = None,
) -> list[dict[str, Any]]:
    """Score replies already sampled: ``requests[i] = (record, sample_index, seed)``;
    ``transcripts[i]``, for a multi-turn environment, is episode ``i``'s conversation."""
    rows = []
    columns = reads_records(env)
    episodes = is_multi_turn(env)
    cases = [case_of(env, record) for record, _, _ in requests]
    if judge is None and has_hook(env, ScoresAhead):  # e.g. an OpenEnv server's episodes
        env.score_ahead(list(zip(replies, cases, strict=True)))
    for index, ((record, sample, seed), reply, case) in enumerate(
            zip(requests, replies, cases, strict=True)):
        raw = _judge_score(judge, reply, record) if judge else rule_score(env, reply, case,
                                                                           record)
        rows.append(
            {
                "prompt": record["prompt"],
                "scenario_id": str(record["scenario_id"]),
                "category": env.category(case),
                "sample": sample,
                "reply": reply,
                "score": raw,
                "reward": 1 if passes(raw) else 0,
                "markers": env.markers(reply, case),
                "policy": dict(policy or {}),
                "sampling": {**(sampling or {}), "seed": seed},
                "eval_run": eval_run,
                # the columns' ground truth travels with the row for re-scoring
                **({"case": case} if columns else {}),
            }
        )
        if episodes:
            rows[-1]["episode"] = (env.episode_summary(reply, case) if is_multi_turn(env)
                                   else {})
            rows[-1]["transcript"] = list(transcripts[index]) if transcripts else []
    return rows


def grade(
    env: Env,
    prompts: Sequence[dict[str, Any]],
    agent: Any,
    k: int = 4,
    *,
    seed: int = 0,
    eval_run: int = 0,
    judge: Judge | None = None,
    progress: Progress | None = None,
    chunk_size: int = DEFAULT_CHUNK,
) -> list[dict[str, Any]]:
    """Sample ``k`` replies per prompt from ``agent`` and return graded rows.

    ``agent`` is a plain callable ``messages -> reply`` or a batch agent (see
    ``posttrain.agents``). ``judge``, when given, replaces the
    environment's score: ``judge(reply, prompt_record)`` returning a bool, a
    number in [0, 1] or a dict with ``score``. ``progress(done, total)`` is
    called after each chunk. Rows come out in prompt order, samples in order.
    """
    if k < 1:
        raise ValueError(f"k (samples per prompt) must be at least 1, got {k}")
    requests = [
        (record, sample, sample_seed(seed, eval_run, record, sample))
        for record in prompts
        for sample in range(k)
    ]
    is_batch = isinstance(agent, BatchAgent)
    policy = agent_identity(agent)
    sampling = agent_sampling(agent)
    if is_multi_turn(env):
        return _grade_episodes(env, requests, agent, policy, sampling, eval_run, judge,
                               progress, chunk_size)
    replies: list[str] = []
    for start in range(0, len(requests), chunk_size):
        chunk = requests[start : start + chunk_size]
        conversations = [env.messages_for(record["prompt"]) for record, _, _ in chunk]
        if is_batch:
            replies.extend(agent.reply_batch(conversations, [s for _, _, s in chunk]))
        else:
            replies.extend(agent(messages) for messages in conversations)
        if progress is not None:
            progress(len(replies), len(requests))
    for reply in replies:
        if not isinstance(reply, str):
            raise TypeError(f"the agent returned {type(reply).__name__}, expected str")
    return grade_replies(
        env, requests, replies, policy=policy, sampling=sampling, eval_run=eval_run, judge=judge
    )


def _grade_episodes(env: Env, requests: list[tuple[dict[str, Any], int, int]], agent: Any,
                    policy: dict[str, Any], sampling: dict[str, Any], eval_run: int,
                    judge: Judge | None, progress: Progress | None,
                    chunk_size: int) -> list[dict[str, Any]]:
    """``grade`` for a multi-turn environment: one played episode per request."""
    played = []
    for start in range(0, len(requests), chunk_size):
        chunk = requests[start : start + chunk_size]
        played.extend(play_episodes(
            env, [(env.messages_for(record["prompt"]), case_of(env, record), seed)
                  for record, _, seed in chunk], agent))
        if progress is not None:
            progress(len(played), len(requests))
    return grade_replies(env, requests, [episode.reply for episode in played], policy=policy,
                         sampling=sampling, eval_run=eval_run, judge=judge,
                         transcripts=[episode.transcript for episode in played])


_REQUIRED_ROW_FIELDS: dict[str, type | tuple[type, ...]] = {
    "prompt": str,
    "scenario_id": (str, int),
    "reward": (int, float),
    "markers": dict,
}


def load_rows(path: str | os.PathLike) -> list[dict[str, Any]]:
    """Read graded rows from JSONL, checking the fields the statistics need.

    Raises ``InputFileError`` naming the file, line and field.
    """
    rows = []
    for line_number, row in read_jsonl_objects(path):
        for name, kinds in _REQUIRED_ROW_FIELDS.items():
            value = row.get(name)
            if value is None or isinstance(value, bool) or not isinstance(value, kinds):
                raise InputFileError(
                    str(path), line_number, name, "missing or of the wrong type for a graded row"
                )
        if row["reward"] not in (0, 1):
            raise InputFileError(str(path), line_number, "reward", "expected 0 or 1")
        row["scenario_id"] = str(row["scenario_id"])
        row.setdefault("category", "all")
        row.setdefault("eval_run", 0)
        rows.append(row)
    if not rows:
        raise InputFileError(str(path), None, None, "the file holds no graded rows")
    return rows


def save_rows(path: str | os.PathLike, rows: Sequence[dict[str, Any]]) -> Path:
    """Write graded rows as JSONL atomically (temp file, then rename)."""
    return write_jsonl_atomic(path, rows)


def spread(items: list[Any], limit: int) -> list[Any]:
    """At most ``limit`` items, evenly spaced through ``items`` (order kept), so a
    subset of a shuffled holdout keeps its mix of categories."""
    if limit <= 0 or len(items) <= limit:
        return items
    return [items[index * len(items) // limit] for index in range(limit)]
