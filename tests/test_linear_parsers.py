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


# -- JSON whose parsing costs more than its bytes ----------------------------------------

def padded_json(values: int) -> bytes:
    """A JSON list of ``values`` empty objects: 3 bytes a value, ~75 of memory parsed."""
    return b"[" + b"{}," * (values - 1) + b"{}]"


def test_an_eval_log_declaring_millions_of_values_is_refused_before_it_is_parsed(tmp_path):
    """The fourth probe's 233 KB `.eval` declared 240 MB of `{},` in its header.json: it
    passed the 256 MB size cap and `eval --compare` peaked at 6.2 GB. Its cost is now
    counted in a linear pass, a megabyte at a time, and it is refused with memory that
    does not grow with what it declares."""
    import tracemalloc
    import zipfile

    from posttrain.errors import InputFileError
    from posttrain.score.eval_logs import load_compared

    bomb = tmp_path / "bomb.eval"
    with zipfile.ZipFile(bomb, "w", zipfile.ZIP_DEFLATED) as archive:
        archive.writestr("header.json", padded_json(14_000_000))  # 42 MB, ~3 GB parsed
    assert bomb.stat().st_size < 1_000_000
    import inspect_ai.log
    import inspect_ai.scorer  # noqa: F401

    tracemalloc.start()
    try:
        with pytest.raises(InputFileError) as refused:
            load_compared(bomb)
        peak = tracemalloc.get_traced_memory()[1]
    finally:
        tracemalloc.stop()
    assert "GB of memory" in str(refused.value) and "compare fewer samples" in str(refused.value)
    assert peak < 16 * 2**20, peak  # a megabyte chunk or so, not the 42 MB, not gigabytes

    # the same values as an inspect `.json` log: refused the same way
    flat = tmp_path / "bomb.json"
    flat.write_bytes(b'{"eval": ' + padded_json(11_000_000) + b"}")
    with pytest.raises(InputFileError, match="GB of memory"):
        load_compared(flat)


def test_a_jsonl_file_is_refused_where_its_values_pass_the_budget(tmp_path):
    """The JSONL readers (prompts, pairs, graded rows, lm-eval samples) hold what they
    read: a line of 33 MB of `{},` would take ~2.5 GB. Refused at that line, before it is
    parsed, naming the file and line."""
    from posttrain.errors import InputFileError
    from posttrain.jsonl import read_jsonl_objects

    path = tmp_path / "prompts.jsonl"
    path.write_bytes(b'{"prompt": "hello"}\n{"pad": ' + padded_json(11_000_000) + b"}\n")
    with pytest.raises(InputFileError) as refused:
        list(read_jsonl_objects(path))
    assert refused.value.line == 2 and "GB of memory" in str(refused.value)


def test_a_json_body_within_the_byte_limit_but_of_millions_of_values_is_refused(tmp_path):
    """A run server's body limit is 32 MB; 17 MB of `{},` would parse into ~1.7 GB of
    Python objects. Answered 413 before it is parsed."""
    import urllib.error
    import urllib.request

    from posttrain.ui.app import dashboard_server

    server = dashboard_server(tmp_path / "runs.db", port=0, token="t" * 32)
    server.start()
    try:
        body = b'{"ops": ' + padded_json(5_700_000) + b"}"
        assert len(body) < server.rules.max_body_bytes
        request = urllib.request.Request(server.url + "/api/ingest", data=body, method="POST",
                                         headers={"Content-Type": "application/json",
                                                  "Authorization": "Bearer " + "t" * 32})
        started = time.perf_counter()
        with pytest.raises(urllib.error.HTTPError) as refused:
            urllib.request.urlopen(request, timeout=60)
        assert refused.value.code == 413
        assert b"too many JSON values" in refused.value.read()
        assert time.perf_counter() - started < 20
    finally:
        server.shutdown()
        server.server_close()
