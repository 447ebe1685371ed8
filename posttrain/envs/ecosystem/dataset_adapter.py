"""The base every adapter over another library's dataset stands on (``DatasetAdapter``:
its samples as prompt records, the shared messages before the user's, a prompt's case),
and what the adapters' scoring shares: the default category, score clipping, a
reply-score cache and the ground-truth reference agent.
"""

from __future__ import annotations

import json
import random
from abc import ABC, abstractmethod
from collections.abc import Callable, Sequence
from dataclasses import dataclass
from typing import Any

from posttrain.envs.base import PASS_THRESHOLD, Case, Messages
from posttrain.errors import PosttrainError

#: the category of every prompt of an environment whose data names none
DEFAULT_CATEGORY = "default"


def clip(value: Any) -> float:
    """A library's score as a posttrain score: a number in [0, 1] (NaN and None are 0)."""
    number = float(value or 0.0)
    return min(1.0, max(0.0, number)) if number == number else 0.0


def shared_prefix(prefixes: Sequence[list[dict[str, str]]], where: str) -> list[dict[str, str]]:
    """The messages before the user's, which must be the same for every row: posttrain's
    prompts share one system prompt (``Env.system``) and prefix."""
    distinct = {json.dumps(prefix) for prefix in prefixes}
    if len(distinct) > 1:
        raise PosttrainError(
            f"{where}: its rows differ in the messages before the user's (a per-row system "
            "prompt, few-shot or history); posttrain's prompts share one system prompt and "
            "prefix")
    return list(json.loads(distinct.pop())) if distinct else []


def pick_indices(total: int, count: int, seed: int) -> list[int]:
    """``count`` of ``range(total)`` (all when there are fewer), chosen by ``seed``, in order."""
    order = list(range(total))
    random.Random(seed).shuffle(order)
    return sorted(order[:count])


class ScoreCache:
    """Scores of (reply, case) pairs: ``score()`` then ``markers()`` of one reply run the
    library's scorers once. Bounded, so a long run does not grow it without end."""

    def __init__(self, limit: int = 4096) -> None:
        self._limit = limit
        self._scores: dict[tuple[str, str], tuple[float, dict[str, float]]] = {}

    def get(self, reply: str, case: Case, compute: Callable[[], tuple[float, dict[str, float]]]
            ) -> tuple[float, dict[str, float]]:
        key = (reply, json.dumps(case, sort_keys=True, default=str))
        if key not in self._scores:
            if len(self._scores) >= self._limit:
                self._scores.clear()
            self._scores[key] = compute()
        return self._scores[key]


class GroundTruthAgent:
    """The reference agent of an environment another library wrote: it knows no policy,
    only each prompt's ground truth (a row's ``answer``, a sample's ``target``), and replies
    with the first of the adapter's candidate spellings of it (the bare answer, the
    answer in the tag the rubric parses, ...) that the environment's own reward passes.
    What ``posttrain sft --demos reference`` and a starter build learn from; a prompt
    whose ground truth is unknown or passes in no spelling gets the bare answer (or
    nothing), which the rule fails and the callers drop."""

    def __init__(self, env: Any, candidates: Callable[[Case], list[str]]) -> None:
        self.env = env
        self.candidates = candidates
        self.__name__ = "ground_truth"

    def __call__(self, messages: list[dict[str, str]]) -> str:
        prompt = next((m["content"] for m in reversed(messages) if m["role"] == "user"), "")
        try:
            case = self.env.case_for(prompt)
        except KeyError:
            return ""
        spellings = [text for text in self.candidates(case) if text]
        for text in spellings:
            if self.env.score(text, case) >= PASS_THRESHOLD:
                return text
        return spellings[0] if spellings else ""


def answer_spellings(answer: Any) -> list[str]:
    """The bare answer, then in the ``<answer>`` tag most rubrics parse."""
    if answer is None or answer == "":
        return []
    text = str(answer).strip()
    return [text, f"<answer>{text}</answer>"]


@dataclass(frozen=True)
class Sample:
    """One item of a library's dataset as posttrain reads it: the user's text, the id its
    scenario is grouped by, and the columns the library's scorers need (prompt-file
    fields)."""

    prompt: str
    scenario_id: str
    fields: dict[str, Any]


class DatasetAdapter(ABC):
    """What every adapter over a library's dataset does the same way: prompt records from
    its samples, the messages a prompt is sent with, and a prompt's case.

    A subclass's ``__init__`` sets ``_prefix`` (the messages before the user's, the same
    for every sample: ``shared_prefix``) and calls ``_keep_samples``; it defines
    ``category(case)`` and ``_unknown_prompt()`` (why a prompt has no case, and what to
    give instead), and overrides ``case_from_record`` when a case is more than the prompt
    and its fields."""

    _prefix: list[dict[str, str]]
    _samples: list[Sample]
    _fields_by_prompt: dict[str, dict[str, Any]]

    def _keep_samples(self, samples: list[Sample]) -> None:
        self._samples = samples
        self._fields_by_prompt = {sample.prompt: sample.fields for sample in samples}

    @abstractmethod
    def category(self, case: Case) -> str:
        """The prompt category of ``case`` (from the library's own columns)."""

    @abstractmethod
    def _unknown_prompt(self) -> str:
        """Why a prompt that is not one of the dataset's has no case, and what to give."""

    def write_prompts(self, count: int, seed: int = 0) -> list[dict[str, Any]]:
        """``count`` of the dataset's samples (all of them when it has fewer), chosen by
        ``seed``; each a prompt record with the sample's columns as fields."""
        records = []
        for index in pick_indices(len(self._samples), count, seed):
            sample = self._samples[index]
            case = self.case_from_record(sample.prompt, sample.fields)
            records.append({"prompt": sample.prompt, "scenario_id": sample.scenario_id,
                            "fields": dict(sample.fields), "case": case,
                            "category": self.category(case)})
        return records

    def messages_for(self, prompt: str) -> Messages:
        return [*(dict(m) for m in self._prefix), {"role": "user", "content": prompt}]

    def case_from_record(self, prompt: str, fields: dict[str, Any]) -> Case:
        return {"prompt": prompt, **fields}

    def case_for(self, prompt: str) -> Case:
        """The case of one of the dataset's prompts; ``KeyError`` (saying what to give
        instead) for a prompt that is not one of them."""
        fields = self._fields_by_prompt.get(prompt)
        if fields is None:
            raise KeyError(self._unknown_prompt())
        return self.case_from_record(prompt, fields)
