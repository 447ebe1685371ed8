"""OpenEnv environments written for the tests (tests/test_openenv.py), served with
OpenEnv's own ``create_app``: what a user brings with ``--env openenv:...``.

- ``arith_app``: the example's arith environment (``examples/openenv_arith.py``): "What is
  A + B?", one text field (``answer``), reward 1.0 when the reply holds the sum,
  categories ``small`` and ``large`` in the observation's metadata;
- ``tool_app``: an Action of two fields (``tool``, ``argument``): reward 1.0 for
  ``upper`` of the word shown, 0.5 for the right tool with the wrong argument;
- ``nan_app``, ``none_app``, ``endless_app``: a reward of NaN, no reward, never done;
- ``two_step_app``: an episode of two steps (say hello, then bye), one session at a time;
- ``slow_arith_app``: arith whose step takes 50 ms and counts the steps in flight at once
  (``SlowArithEnv.peak``), on a server that allows two sessions (``slow_arith_app_b``:
  the same on a server of its own).
"""

from __future__ import annotations

import sys
import threading
import time
from pathlib import Path
from typing import Any
from uuid import uuid4

from openenv.core.env_server.http_server import create_app
from openenv.core.env_server.interfaces import Environment
from openenv.core.env_server.types import Action, Observation, State

sys.path.insert(0, str(Path(__file__).resolve().parents[1] / "examples"))
from openenv_arith import (
    ArithAction,
    ArithEnv,
    ArithObservation,
    arith_question,
    arith_reward,
)
from openenv_arith import (
    app as arith_app,
)

__all__ = ["arith_app", "arith_question", "arith_reward"]


class ToolAction(Action):
    tool: str
    argument: str


class WordObservation(Observation):
    word: str = ""


class ToolEnv(Environment[ToolAction, WordObservation, State]):
    SUPPORTS_CONCURRENT_SESSIONS = True
    WORDS = ("apple", "river", "stone", "cloud", "ember")

    def __init__(self) -> None:
        super().__init__()
        self._state = State(episode_id=str(uuid4()), step_count=0)
        self._word = ""

    def reset(self, seed: int | None = None, episode_id: str | None = None,
              **kwargs: Any) -> WordObservation:
        self._word = self.WORDS[(seed or 0) % len(self.WORDS)]
        self._state = State(episode_id=episode_id or str(uuid4()), step_count=0)
        return WordObservation(word=self._word)

    def step(self, action: ToolAction, timeout_s: float | None = None,
             **kwargs: Any) -> WordObservation:
        self._state.step_count += 1
        right_tool = action.tool == "upper"
        reward = 1.0 if right_tool and action.argument == self._word.upper() else (
            0.5 if right_tool else 0.0)
        return WordObservation(done=True, reward=reward)

    @property
    def state(self) -> State:
        return self._state


class NanEnv(ArithEnv):
    def finish(self, reward: float) -> ArithObservation:
        return ArithObservation(done=True, reward=float("nan"))


class NoRewardEnv(ArithEnv):
    def finish(self, reward: float) -> ArithObservation:
        return ArithObservation(done=True, reward=None)


class EndlessEnv(ArithEnv):
    def finish(self, reward: float) -> ArithObservation:
        return ArithObservation(done=False, reward=reward)


class SlowArithEnv(ArithEnv):
    """Arith whose step takes 50 ms, counting how many steps run at the same time."""

    SUPPORTS_CONCURRENT_SESSIONS = True
    lock = threading.Lock()
    in_flight = 0
    peak = 0

    def step(self, action: ArithAction, timeout_s: float | None = None,
             **kwargs: Any) -> ArithObservation:
        cls = type(self)
        with cls.lock:
            cls.in_flight += 1
            cls.peak = max(cls.peak, cls.in_flight)
        try:
            time.sleep(0.05)
            return super().step(action, timeout_s, **kwargs)
        finally:
            with cls.lock:
                cls.in_flight -= 1


class HangingArithEnv(ArithEnv):
    """Arith whose step never answers in time: it says it started (the file
    ``$HANG_MARKER`` names) and sleeps a minute, as a server stuck on an episode does."""

    SUPPORTS_CONCURRENT_SESSIONS = True

    def step(self, action: ArithAction, timeout_s: float | None = None,
             **kwargs: Any) -> ArithObservation:
        import os

        Path(os.environ["HANG_MARKER"]).write_text("stepping")
        time.sleep(60)
        return super().step(action, timeout_s, **kwargs)


class WordAction(Action):
    word: str


class TwoStepEnv(Environment[WordAction, ArithObservation, State]):
    """Say hello, then bye: 0.5 for the hello (not done), 1.0 for the bye (done); any other
    word ends the episode with 0.0."""

    SUPPORTS_CONCURRENT_SESSIONS = False  # one session at a time: the desks replay

    def __init__(self) -> None:
        super().__init__()
        self._state = State(episode_id=str(uuid4()), step_count=0)

    def reset(self, seed: int | None = None, episode_id: str | None = None,
              **kwargs: Any) -> ArithObservation:
        self._state = State(episode_id=episode_id or str(uuid4()), step_count=0)
        return ArithObservation(prompt=f"Visitor {seed}: say hello, then bye.",
                                metadata={"category": "even" if (seed or 0) % 2 == 0
                                          else "odd"})

    def step(self, action: WordAction, timeout_s: float | None = None,
             **kwargs: Any) -> ArithObservation:
        self._state.step_count += 1
        wanted = "hello" if self._state.step_count == 1 else "bye"
        if action.word.strip().lower() != wanted:
            return ArithObservation(prompt="That was not it.", done=True, reward=0.0)
        if wanted == "hello":
            return ArithObservation(prompt="Now say bye.", done=False, reward=0.5)
        return ArithObservation(prompt="Goodbye!", done=True, reward=1.0)

    @property
    def state(self) -> State:
        return self._state


def _app(env: type, action: type, observation: type, sessions: int = 4) -> Any:
    return create_app(env, action, observation, env_name=env.__name__.lower(),
                      max_concurrent_envs=sessions)


tool_app = _app(ToolEnv, ToolAction, WordObservation)
nan_app = _app(NanEnv, ArithAction, ArithObservation)
none_app = _app(NoRewardEnv, ArithAction, ArithObservation)
endless_app = _app(EndlessEnv, ArithAction, ArithObservation)
slow_arith_app = _app(SlowArithEnv, ArithAction, ArithObservation, sessions=2)
slow_arith_app_b = _app(SlowArithEnv, ArithAction, ArithObservation, sessions=2)
two_step_app = _app(TwoStepEnv, WordAction, ArithObservation, sessions=1)
hanging_app = _app(HangingArithEnv, ArithAction, ArithObservation, sessions=2)
