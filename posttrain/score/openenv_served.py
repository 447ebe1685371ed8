"""A posttrain environment served as an OpenEnv environment (``posttrain env serve``), so
TRL's OpenEnv integration and any OpenEnv client can train or evaluate on posttrain's
rules.

``openenv_app(env, records)`` builds the app with OpenEnv's own ``create_app``:

- ``reset(seed=i)`` starts the episode of prompt record ``i`` (modulo their number), or of
  the record whose scenario is ``scenario_id=...``; its observation carries the prompt,
  the chat ``messages`` the policy answers (the rule's system prompt included), the
  scenario and, in its metadata, the category;
- ``step(ReplyAction(reply=...))`` grades the reply with the rule, exactly as ``posttrain
  eval`` does (``posttrain.score.rows.rule_score``): the observation's ``reward`` is the
  rule's score, ``done`` is True (one reply, one step), and its metadata holds the
  category, ``passed`` and the rule's markers;
- a multi-turn rule (refund-multiturn, say) plays its episode a turn a step, as
  ``posttrain eval`` does (``posttrain.score.episodes.take_turn``): each step's ``reply``
  is one policy turn; a turn with ``<tool_call>`` blocks runs them on the episode's desk
  and the observation's ``messages`` are the tool results (``done`` False, no reward
  yet); a plain turn, a done desk or the rule's ``max_turns`` ends the episode, and the
  reward is the rule's score of the turns joined (the row ``posttrain eval`` writes),
  with the episode's summary in the metadata (and the last turn's tool results, if any,
  in ``messages``);
- sessions are independent (one environment per WebSocket client), up to
  ``max_concurrent_envs`` at once; an HTTP session idle for ``idle_timeout_s`` is reaped
  (OpenEnv's reaper; the core closes idle WebSockets, ``posttrain.http_core``);
- a request the episode cannot take (a step before any reset, which is every HTTP
  ``/step``; a step after its end; an unknown scenario) is refused with a
  ``PosttrainError`` the core answers 400 (or 409), never a 500. Over HTTP each
  ``/reset`` and ``/step`` is an environment of its own (OpenEnv's design), so episodes
  are played over the WebSocket ``/ws``.

``posttrain env serve`` runs this app on posttrain's HTTP core (``HttpServer.mount``):
the body limit, read deadlines, Host/Origin guard and tokens of every posttrain server.
"""

from __future__ import annotations

from typing import Any
from uuid import uuid4

from posttrain.envs.base import Env, as_multi_turn, case_of, is_multi_turn, passes
from posttrain.envs.wire import join_turns
from posttrain.errors import PosttrainError
from posttrain.score.episodes import take_turn
from posttrain.score.rows import rule_score

#: the longest reply a step takes (a policy's reply is a few thousand characters at most)
MAX_REPLY_CHARS = 100_000


class EpisodeRefused(PosttrainError):
    """A reset or step this episode cannot take: bad input, answered 400 (409: the
    episode's state, not the request, is in the way)."""

    def __init__(self, message: str, http_status: int = 400) -> None:
        super().__init__(message)
        self.http_status = http_status


def openenv_app(env: Env, records: list[dict[str, Any]], max_concurrent_envs: int = 8,
                idle_timeout_s: float = 300.0) -> Any:
    """The FastAPI app serving ``env`` on ``records`` (module docstring)."""
    if not records:
        raise PosttrainError("posttrain env serve: no prompts to serve")
    try:
        from openenv.core.env_server.http_server import create_app
        from openenv.core.env_server.interfaces import Environment
        from openenv.core.env_server.types import Action, ConcurrencyConfig, Observation, State
        from pydantic import Field
    except ImportError:
        raise PosttrainError("posttrain env serve needs the openenv package: pip install "
                             "'posttrain[openenv]'") from None

    by_scenario = {str(record["scenario_id"]): index for index, record in enumerate(records)}
    episodes = is_multi_turn(env)
    max_turns = int(as_multi_turn(env).max_turns) if episodes else 1

    class ReplyAction(Action):  # type: ignore[misc,valid-type]
        """The policy's reply to the episode's prompt, or its next turn (bounded: grading is
        linear in it, and the bound is checked before any grading)."""

        reply: str = Field(max_length=MAX_REPLY_CHARS)

    class PromptObservation(Observation):  # type: ignore[misc,valid-type]
        """The prompt (and the chat messages the policy answers) on reset; a turn's tool
        results; the rule's grade (reward, done, metadata) when the episode ends."""

        prompt: str = ""
        messages: list[dict[str, str]] = Field(default_factory=list)
        scenario_id: str = ""

    class RuleEnvironment(Environment):  # type: ignore[misc,valid-type]
        """One episode of the rule: a prompt, one reply (or a turn a step, for a
        multi-turn rule), the rule's score."""

        SUPPORTS_CONCURRENT_SESSIONS = True

        def __init__(self) -> None:
            super().__init__()
            self._state = State(episode_id=str(uuid4()), step_count=0)
            self._record = records[0]
            self._case = case_of(env, self._record)
            self._desk: Any = None
            self._turns: list[str] = []
            self._done = False
            self._reset = False

        def reset(self, seed: int | None = None, episode_id: str | None = None,
                  **kwargs: Any) -> Any:
            scenario = kwargs.get("scenario_id")
            if scenario is not None and str(scenario) not in by_scenario:
                raise EpisodeRefused(f"no scenario {str(scenario)[:80]!r} among the served "
                                     "prompts")
            if seed is not None and (isinstance(seed, bool) or not isinstance(seed, int)):
                raise EpisodeRefused(f"seed must be a whole number, got {str(seed)[:40]}")
            index = by_scenario[str(scenario)] if scenario is not None else (seed or 0) % len(
                records)
            self._record = records[index]
            self._state = State(episode_id=episode_id or str(uuid4()), step_count=0)
            case = self._case = case_of(env, self._record)
            self._desk = as_multi_turn(env).new_desk(case) if episodes else None
            self._turns, self._done, self._reset = [], False, True
            prompt = self._record["prompt"]
            return PromptObservation(
                prompt=prompt, messages=env.messages_for(prompt),
                scenario_id=str(self._record["scenario_id"]),
                metadata={"category": env.category(case)})

        def step(self, action: Any, timeout_s: float | None = None, **kwargs: Any) -> Any:
            if self._done:
                raise EpisodeRefused("the episode is over: reset() starts the next one", 409)
            if not self._reset:
                raise EpisodeRefused(
                    "no episode: reset() first. Over HTTP every /step is an environment of "
                    "its own (OpenEnv's design), never reset; play episodes over the "
                    "WebSocket /ws", 409)
            self._state.step_count += 1
            record, case = self._record, self._case
            self._turns.append(action.reply)
            tool_messages: list[dict[str, Any]] = []
            if episodes:
                tool_messages, goes_on = take_turn(self._desk, action.reply)
                if goes_on and len(self._turns) < max_turns:
                    return PromptObservation(
                        done=False, prompt="\n".join(m["content"] for m in tool_messages),
                        messages=tool_messages, scenario_id=str(record["scenario_id"]),
                        metadata={"category": env.category(case), "turn": len(self._turns)})
            self._done = True
            reply = join_turns(self._turns)
            score = rule_score(env, reply, case, record)
            extra = ({"episode": as_multi_turn(env).episode_summary(reply, case)} if episodes
                     else {})
            return PromptObservation(
                done=True, reward=score, messages=tool_messages,
                scenario_id=str(record["scenario_id"]),
                metadata={"category": env.category(case), "passed": passes(score),
                          "markers": env.markers(reply, case), **extra})

        @property
        def state(self) -> Any:
            return self._state

    concurrency = ConcurrencyConfig(max_concurrent_envs=max_concurrent_envs,
                                    session_timeout=idle_timeout_s)
    return create_app(RuleEnvironment, ReplyAction, PromptObservation,
                      env_name=env.name.replace(" ", "_"), concurrency_config=concurrency)
