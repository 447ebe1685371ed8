"""Parsers of untrusted text run in time linear in it (the fourth hostile probe: one
100,000-character reply of unclosed `<tool_call>` openings cost 24 s of CPU to grade).

Work is counted, not timed, where it can be: the tool-call scanner's `str.find` calls are
counted through a wrapper string, and must grow with the number of openings, not with
their square. Where a whole rule grades the reply, the check is a ratio of times (a reply
ten times longer may cost at most about ten times as much, with a generous margin), each
length's least of three tries, so the machine's other work cannot fake a quadratic."""

from __future__ import annotations

import time

import pytest
from hypothesis import given, settings
from hypothesis import strategies as st

from posttrain.envs import get_env
from posttrain.envs.wire import (
    TOOL_CALL_CLOSE,
    TOOL_CALL_OPEN,
    parse_tool_call,
    parse_tool_calls,
    tool_call_blocks,
)


class CountingText(str):
    """A string that counts the ``find`` calls made on it."""

    finds = 0

    def find(self, *args, **kwargs):  # type: ignore[override]
        CountingText.finds += 1
        return super().find(*args, **kwargs)


def finds_for(text: str) -> int:
    CountingText.finds = 0
    tool_call_blocks(CountingText(text))
    return CountingText.finds


ADVERSARIAL = {
    "unclosed openings": lambda n: TOOL_CALL_OPEN * n,
    "openings then one close": lambda n: TOOL_CALL_OPEN * n + TOOL_CALL_CLOSE,
    "closed blocks": lambda n: (TOOL_CALL_OPEN + "{}" + TOOL_CALL_CLOSE) * n,
    "closings only": lambda n: TOOL_CALL_CLOSE * n,
    "prose": lambda n: "word " * n,
}


@pytest.mark.parametrize("shape", sorted(ADVERSARIAL))
def test_the_scanner_makes_at_most_two_finds_a_block(shape):
    make = ADVERSARIAL[shape]
    for n in (10, 1_000, 10_000):
        blocks = tool_call_blocks(make(n))
        # one find for each opening it reads, one for its closing, one that ends the scan
        assert finds_for(make(n)) <= 2 * len(blocks) + 2, (shape, n)


@settings(max_examples=300, deadline=None)
@given(st.lists(st.sampled_from([TOOL_CALL_OPEN, TOOL_CALL_CLOSE, "{}", '{"name": "x"}', "a",
                                 "\n"]), max_size=40))
def test_the_scanner_finds_what_the_old_pattern_found(parts):
    import re

    text = "".join(parts)
    pattern = re.compile(r"<tool_call>(.*?)</tool_call>", re.DOTALL)
    assert tool_call_blocks(text) == pattern.findall(text)
    first = pattern.search(text)
    assert tool_call_blocks(text, first_only=True) == ([first.group(1)] if first else [])


def _least_seconds(work, tries: int = 3) -> float:
    best = float("inf")
    for _ in range(tries):
        started = time.perf_counter()
        work()
        best = min(best, time.perf_counter() - started)
    return best


@pytest.mark.parametrize("env_name", ["refund", "refund-multiturn"])
def test_grading_a_hostile_reply_is_linear(env_name):
    env = get_env(env_name)
    records = env.write_prompts(4, seed=0)
    case = env.case_for(records[0]["prompt"])

    def grade(n: int):
        reply = TOOL_CALL_OPEN * n
        return lambda: (env.score(reply, case), parse_tool_call(reply), parse_tool_calls(reply))

    small, large = _least_seconds(grade(1_000)), _least_seconds(grade(10_000))
    # linear: 10x the text, about 10x the time; quadratic would be about 100x. A floor of
    # 2 ms keeps a tiny small-side time from inflating the ratio
    assert large <= 30 * max(small, 0.002), (small, large)
    # and the probe's 100,000 characters (8,333 openings) grade in well under a second
    assert _least_seconds(grade(8_334), tries=1) < 5.0
