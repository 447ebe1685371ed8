"""Agents: anything that turns a conversation into a reply.

The simplest agent is a plain callable ``agent(messages) -> str``. An agent that
can do better in bulk (a model) implements the batch protocol instead:

    reply_batch(conversations, seeds) -> list[str]
    policy: dict     # what answered (model, adapter, step), stamped on graded rows
    sampling: dict   # how (temperature, top_p, max_new_tokens, ...)

``seeds`` holds one integer per conversation so a seeded evaluation is
reproducible whatever else shares the batch. An agent that must get ready for
multi-turn episodes (a model whose chat template has to render tool turns) also has
``prepare_for_episodes()``, which the episode runner calls before the first turn.

This contract sits on the ground floor of the package: environments (their scripted
and reference agents), the data writers, grading and the models all speak it.

A scripted agent (no model: a fixed mix of right and wrong moves per category)
belongs to its environment, which knows what the right move is: the
``scripted_agent`` hook (``posttrain.envs.base``); the refund environment's is
``posttrain.envs.refund.agent``.
"""

from __future__ import annotations

import hashlib
from collections.abc import Callable
from typing import Any, Protocol, runtime_checkable

Messages = list[dict[str, str]]


@runtime_checkable
class BatchAgent(Protocol):
    """An agent that answers many conversations at once (see module docstring)."""

    policy: dict[str, Any]
    sampling: dict[str, Any]

    def reply_batch(self, conversations: list[Messages], seeds: list[int]) -> list[str]: ...


Agent = Callable[[Messages], str] | BatchAgent


def agent_identity(agent: Agent) -> dict[str, Any]:
    """What answered, as graded rows and reports record it: a batch agent's ``policy``, or
    ``{"agent": <the callable's name>}`` for a plain callable."""
    policy = getattr(agent, "policy", None)
    if isinstance(policy, dict):
        return policy
    return {"agent": getattr(agent, "__name__", type(agent).__name__)}


def agent_sampling(agent: Agent) -> dict[str, Any]:
    """How the agent samples (temperature, top_p, ...), or {} for a plain callable."""
    sampling = getattr(agent, "sampling", None)
    return sampling if isinstance(sampling, dict) else {}


def stable_seed(*parts: object) -> int:
    """A 31-bit seed from the parts' text, identical on every Python and platform.

    ``hash()`` is salted per process, so it must never decide sampling.
    """
    digest = hashlib.sha256("\x1f".join(str(part) for part in parts).encode()).digest()
    return int.from_bytes(digest[:4], "big") & 0x7FFFFFFF
