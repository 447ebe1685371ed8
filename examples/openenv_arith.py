"""An OpenEnv environment, written with OpenEnv's own classes: "What is A + B?", the reply
is the Action's one text field (``answer``), reward 1.0 when it holds the sum; the
category (``small``, ``large``) rides in the first observation's metadata.

Serve it yourself (``uvicorn examples.openenv_arith:app``) and point posttrain at the URL,
or let posttrain start it for the run:

    posttrain eval --env openenv:examples/openenv_arith.py:app --env-arg prompts=40 \
        --base-model starter-2m --samples 2
"""

from __future__ import annotations

import random
from typing import Any
from uuid import uuid4

from openenv.core.env_server.http_server import create_app
from openenv.core.env_server.interfaces import Environment
from openenv.core.env_server.types import Action, Observation, State


def arith_question(seed: int) -> tuple[int, int]:
    draw = random.Random(seed)
    return draw.randint(1, 60), draw.randint(1, 60)


def arith_reward(seed: int, answer: str) -> float:
    """The arith environment's reward, written out so the tests can check rows by it."""
    a, b = arith_question(seed)
    return 1.0 if str(a + b) in answer else 0.0


class ArithAction(Action):
    answer: str


class ArithObservation(Observation):
    prompt: str = ""


class ArithEnv(Environment[ArithAction, ArithObservation, State]):
    SUPPORTS_CONCURRENT_SESSIONS = True

    def __init__(self) -> None:
        super().__init__()
        self._state = State(episode_id=str(uuid4()), step_count=0)
        self._seed = 0

    def reset(self, seed: int | None = None, episode_id: str | None = None,
              **kwargs: Any) -> ArithObservation:
        self._seed = seed or 0
        self._state = State(episode_id=episode_id or str(uuid4()), step_count=0)
        a, b = arith_question(self._seed)
        return ArithObservation(prompt=f"What is {a} + {b}?",
                                metadata={"category": "small" if a + b < 60 else "large"})

    def step(self, action: ArithAction, timeout_s: float | None = None,
             **kwargs: Any) -> ArithObservation:
        self._state.step_count += 1
        return self.finish(arith_reward(self._seed, action.answer))

    def finish(self, reward: float) -> ArithObservation:
        return ArithObservation(done=True, reward=reward)

    @property
    def state(self) -> State:
        return self._state


app = create_app(ArithEnv, ArithAction, ArithObservation, env_name="arith",
                 max_concurrent_envs=4)
