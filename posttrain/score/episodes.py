"""The episode runner: plays a multi-turn environment against an agent.

Each episode starts from the environment's messages for a prompt. Every round, the
agent answers all unfinished episodes at once (one batch); a turn with
``<tool_call>`` blocks is executed on the episode's desk (``env.new_desk(case)``) and
each result goes back as a ``role: tool`` message; a plain turn, a broken block, a
desk that is ``done`` or ``env.max_turns`` turns end the episode. An episode keeps
its sampling seed for every turn (a scripted agent plays one behaviour throughout;
a model's draws differ turn to turn because its context does).

A model agent's tokenizer gets a template that renders tool turns first (the agent's
``prepare_for_episodes()``, see ``posttrain.policy.model_agent``). Turns are re-rendered
through the chat template each round; TRL's training loop instead appends the tool-result
tokens to the sampled ids, so a turn whose tokens are not the tokenizer's canonical split of its
text can read differently here (rare; the text is the same).
"""

from __future__ import annotations

from collections.abc import Callable, Sequence
from dataclasses import dataclass, field
from typing import Any

from posttrain.agents import BatchAgent, Messages
from posttrain.envs.base import Desk, Env, as_multi_turn
from posttrain.envs.wire import join_turns, parse_tool_calls


@dataclass
class PlayedEpisode:
    """One episode: the policy's turns and the conversation after the prompt."""

    turns: list[str] = field(default_factory=list)
    transcript: list[dict[str, Any]] = field(default_factory=list)

    @property
    def reply(self) -> str:
        """The turns as one text (``wire.TURN_SEPARATOR``): a graded row's ``reply``."""
        return join_turns(self.turns)


def _prepare(agent: Any) -> None:
    # an agent with a chat template to ready (a model: ``ModelAgent``) says so by having
    # this method; a scripted agent or a plain callable has nothing to prepare
    prepare = getattr(agent, "prepare_for_episodes", None)
    if prepare is not None:
        prepare()


def _answer(agent: Any, conversations: list[Messages], seeds: list[int]) -> list[str]:
    if isinstance(agent, BatchAgent):
        replies = agent.reply_batch(conversations, seeds)
    else:
        replies = [agent(messages) for messages in conversations]
    for reply in replies:
        if not isinstance(reply, str):
            raise TypeError(f"the agent returned {type(reply).__name__}, expected str")
    return replies


def take_turn(desk: Desk, reply: str) -> tuple[list[dict[str, Any]], bool]:
    """One policy turn on its episode's desk: the ``role: tool`` messages its calls give
    back, and whether the episode goes on (not after a plain turn, a broken block or a
    desk that is ``done``; the turn budget is the caller's). ``posttrain env serve`` plays
    a served episode's turns with it too."""
    calls = parse_tool_calls(reply)
    if not calls:  # plain prose or a broken block: the episode's last turn
        return [], False
    messages = []
    for call in calls:
        result = desk.call(call["name"], call["arguments"])
        messages.append({"role": "tool", "name": call["name"], "content": result})
        if desk.done:
            break
    return messages, not desk.done


def play_episodes(
    env: Env,
    starts: Sequence[tuple[Messages, dict[str, Any], int]],
    agent: Any,
    *,
    on_turn: Callable[[int], None] | None = None,
) -> list[PlayedEpisode]:
    """Play one episode per ``(messages, case, seed)``; results in the same order.
    ``on_turn(finished)`` is called after each round with the episodes finished so far."""
    episodes = as_multi_turn(env)
    _prepare(agent)
    desks = [episodes.new_desk(case) for _, case, _ in starts]
    conversations = [list(messages) for messages, _, _ in starts]
    played = [PlayedEpisode() for _ in starts]
    active = list(range(len(starts)))
    max_turns = int(episodes.max_turns)
    for _round in range(max_turns):
        if not active:
            break
        replies = _answer(agent, [conversations[i] for i in active], [starts[i][2] for i in active])
        still = []
        for index, reply in zip(active, replies, strict=True):
            message = {"role": "assistant", "content": reply}
            conversations[index].append(message)
            played[index].turns.append(reply)
            played[index].transcript.append(message)
            tool_messages, goes_on = take_turn(desks[index], reply)
            conversations[index].extend(tool_messages)
            played[index].transcript.extend(tool_messages)
            if goes_on:
                still.append(index)
        active = still
        if on_turn is not None:
            on_turn(len(starts) - len(active))
    return played
