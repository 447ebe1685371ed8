"""The training reward as a TRL reward function, remembering what it scored.

TRL calls a reward function as ``fn(completions, **dataset_columns)``. With
conversational prompts each completion is ``[{"role": "assistant", "content": ...}]``.
By default the reward is the environment's raw rule score (0, 0.2, 0.3, ... 1.0):
finer than the 0/1 pass, so a group whose replies all fail can still carry signal
toward the right move. A recipe may train on another function of the reply instead
(``--reward module:function``, ``fn(reply, case) -> float``); the holdout is still
graded by the environment's rule, which is how the hack monitor sees a training
reward that pays for the wrong thing. The monitor scans the rows scored since its
previous look, which this object keeps.
"""

from __future__ import annotations

import json
from dataclasses import dataclass, field
from typing import Any

from posttrain.envs.base import Env, ScoresAhead, has_hook, is_multi_turn, passes
from posttrain.envs.wire import join_turns, render_tool_call
from posttrain.errors import PosttrainError
from posttrain.plugins import load_object
from posttrain.score.planted import is_planted, planted_hack
from posttrain.score.rubric import RewardFunction, Rubric, training_rubric

#: the ``--reward`` function: ``fn(reply, case) -> float`` (a rubric's reward function)
ScoreFn = RewardFunction


def load_reward_function(target: str, env: Env | None = None) -> ScoreFn:
    """``module:function`` or ``file.py:function`` -> the function; ``planted:KIND`` ->
    ``env``'s rule with that flaw planted (``posttrain.score.planted``); PosttrainError
    naming what is wrong."""
    if is_planted(target):
        if env is None:
            raise PosttrainError(f"--reward {target!r} plants a hack on a rule: it needs --env")
        return planted_hack(env, target)
    function = load_object(target, "--reward", "mypackage.rewards:shaped")
    if not callable(function):
        raise PosttrainError(f"--reward {target!r} is not a function of (reply, case)")
    return function


def _turn_text(message: dict[str, Any]) -> str:
    """An assistant message as the text the policy wrote: its content, then its parsed
    tool calls as ``<tool_call>`` blocks (TRL parses them out of the text)."""
    parts = [str(message.get("content") or "")]
    for call in message.get("tool_calls") or []:
        function = call.get("function", call) if isinstance(call, dict) else {}
        arguments = function.get("arguments")
        if isinstance(arguments, str):
            try:
                arguments = json.loads(arguments)
            except ValueError:
                arguments = {"_unparsed": arguments}
        parts.append(render_tool_call(str(function.get("name", "")), arguments or {}))
    return "\n".join(part for part in parts if part)


def completion_text(completion: Any, multi_turn: bool = False) -> str:
    """The reply text of one TRL completion (conversational or plain string). A
    multi-turn completion (assistant turns and tool results) becomes the policy's turns
    joined by ``wire.TURN_SEPARATOR``; the tool results are left out (the rule replays
    the calls)."""
    if isinstance(completion, str):
        return completion
    if multi_turn and isinstance(completion, list):
        return join_turns([_turn_text(message) for message in completion
                           if isinstance(message, dict) and message.get("role") == "assistant"])
    if isinstance(completion, list):
        return "".join(
            str(message.get("content") or "") for message in completion if isinstance(message, dict)
        )
    return str(completion)


@dataclass
class RuleReward:
    """Callable reward for TRL, scoring through a ``Rubric`` (``posttrain.score.rubric``):
    the environment's rule, or ``score`` (``--reward``) when given. ``last_batch`` holds the
    graded rows of the latest call, ``history`` every row scored so far (the monitor scans
    the part since its last look)."""

    env: Env
    score: ScoreFn | None = None
    last_batch: list[dict[str, Any]] = field(default_factory=list)
    history: list[dict[str, Any]] = field(default_factory=list)
    calls: int = 0
    rubric: Rubric = field(init=False)

    def __post_init__(self) -> None:
        self.rubric = training_rubric(self.env, self.score)

    @property
    def custom(self) -> bool:
        """Training on a reward other than the environment's rule (``--reward``)?"""
        return self.score is not None

    @property
    def __name__(self) -> str:  # TRL names the logged metric rewards/<__name__>/mean
        return self.rubric.name

    def score_reply(self, reply: str, case: dict[str, Any]) -> float:
        """The training reward of one reply (the rubric's score); PosttrainError when a
        reward function returns anything but a finite number."""
        return self.rubric.score(reply, case)

    def __call__(
        self,
        completions: list[Any],
        prompt_text: list[str],
        scenario_id: list[str],
        case: list[str] | None = None,
        **_: Any,
    ) -> list[float | None]:
        """TRL's call: one score per completion. ``case`` is the dataset's JSON column of
        ground truth, there when the environment reads prompt-file columns."""
        rows = []
        multi_turn = is_multi_turn(self.env)
        given = [json.loads(text) for text in case] if case else [None] * len(completions)
        replies = [completion_text(completion, multi_turn) for completion in completions]
        cases = [known if known is not None else self.env.case_for(prompt)
                 for known, prompt in zip(given, prompt_text, strict=True)]
        if has_hook(self.env, ScoresAhead):  # e.g. an OpenEnv server's episodes, at once
            self.env.score_ahead(list(zip(replies, cases, strict=True)))
        for reply, prompt, scenario, case_now in zip(replies, prompt_text, scenario_id, cases,
                                                     strict=True):
            score = self.score_reply(reply, case_now)
            row = {
                "prompt": prompt,
                "scenario_id": scenario,
                "category": self.env.category(case_now),
                "reply": reply,
                "score": score,
                "reward": 1 if passes(score) else 0,
                "markers": self.env.markers(reply, case_now),
            }
            if self.custom:  # the rule is the gold: the monitor compares the two
                row["rule_score"] = float(self.env.score(reply, case_now))
            rows.append(row)
        self.last_batch = rows
        self.history.extend(rows)
        self.calls += 1
        return [row["score"] for row in rows]
