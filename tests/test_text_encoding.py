"""Client text at a bounded cost (issue #49, severe finding 4: a 1 MB chat message without
spaces held a core for hours, tokenised before any length check): the length refused
first, long unbroken runs tokenised in linear time, ordinary text exactly as the tokenizer
would, through the engine's tokenize and chat routes; and the per-call limits the operator
sets on ``posttrain serve``."""

from __future__ import annotations

import json
import time
import urllib.error
import urllib.request

import pytest

pytest.importorskip("torch")

from posttrain.cli import main
from posttrain.service.engine.errors import TooLarge
from posttrain.service.engine.text_encoding import UNBROKEN_PIECE, Encoder, pieces

CHAT = [{"role": "system", "content": "You are a refund desk. Be brief."},
        {"role": "user", "content": "Order 4417 never arrived, can I get my money back?"}]


def test_pieces_cut_only_inside_long_unbroken_runs():
    plain = "ordinary words, " * 200
    assert pieces(plain) == [plain]
    run = "x" * (UNBROKEN_PIECE * 3 + 5)
    cut = pieces("before " + run + " after")
    assert "".join(cut) == "before " + run + " after"
    assert [len(piece) for piece in cut] == [7 + UNBROKEN_PIECE, UNBROKEN_PIECE,
                                             UNBROKEN_PIECE, 5 + 6]


def test_ordinary_text_and_chats_encode_as_the_tokenizer_does(starter_2m):
    tokenizer = starter_2m.tokenizer
    encoder = Encoder.for_tokenizer(tokenizer, 1024)
    assert encoder.cuts_safely
    text = "Order 4417 never arrived. " * 20
    assert encoder.encode(text) == tokenizer.encode(text, add_special_tokens=False)
    assert encoder.encode_chat(CHAT) == list(tokenizer.apply_chat_template(
        CHAT, add_generation_prompt=True, tokenize=True, return_dict=False))


def test_a_huge_unbroken_text_is_refused_before_tokenising_and_a_long_one_is_linear(
        starter_2m):
    tokenizer = starter_2m.tokenizer
    encoder = Encoder.for_tokenizer(tokenizer, 1024)
    started = time.monotonic()
    with pytest.raises(TooLarge, match=r"1,000,000 characters; at most [\d,]+ can fit"):
        encoder.encode("a" * 1_000_000)
    assert time.monotonic() - started < 1.0
    wide = Encoder.for_tokenizer(tokenizer, 100_000)  # a budget that lets long runs through
    # each length's least of three tries, taken in turn: a try the machine's other work
    # preempted reads long (a single try each read 0.08 s and 0.70 s, 8.7 times, in a suite
    # run on three workers)
    tries: dict[int, list[float]] = {40_000: [], 160_000: []}
    for _ in range(3):
        for length, seconds in tries.items():
            text = "q" * length
            started = time.monotonic()
            ids = wide.encode(text)
            seconds.append(time.monotonic() - started)
            assert tokenizer.decode(ids) == text  # still an encoding of the same text
    timings = {length: min(seconds) for length, seconds in tries.items()}
    # four times the text takes about four times as long (quadratic would be sixteen)
    assert timings[160_000] < 8 * max(timings[40_000], 0.01), tries
    assert timings[160_000] < 5.0, tries


def post(url: str, path: str, body: dict) -> tuple[int, dict, float]:
    request = urllib.request.Request(url + path, json.dumps(body).encode(),
                                     {"Content-Type": "application/json"}, method="POST")
    started = time.monotonic()
    try:
        with urllib.request.urlopen(request, timeout=60) as answer:
            return answer.status, json.loads(answer.read()), time.monotonic() - started
    except urllib.error.HTTPError as error:
        return error.code, json.loads(error.read() or b"{}"), time.monotonic() - started


def test_the_routes_refuse_a_megabyte_without_spaces_at_once(policy, tmp_path,
                                                             one_torch_thread):
    from posttrain.service.engine import Engine
    from posttrain.service.server import start_server

    server = start_server(Engine("starter-2m", tmp_path, policy=policy,
                                 torch_threads=one_torch_thread), port=0, journal=False)
    try:
        huge = "z" * 1_000_000
        for path, body in (
                ("/v1/training/tokenize", {"text": huge}),
                ("/v1/training/tokenize", {"messages": [{"role": "user", "content": huge}]}),
                ("/v1/chat/completions", {"model": "starter-2m", "max_tokens": 1,
                                          "messages": [{"role": "user", "content": huge}]})):
            status, answer, seconds = post(server.url, path, body)
            assert status == 413, (path, answer)
            assert "refused before tokenising" in answer["error"]["message"]
            assert seconds < 5.0, (path, seconds)
        status, answer, _ = post(server.url, "/v1/training/tokenize", {"text": "hello there"})
        assert status == 200 and answer["token_ids"]
    finally:
        server.stop()


def test_serve_takes_lower_per_call_limits_and_refuses_nonsense(capsys):
    from posttrain.commands.serve import ServeSettings

    assert ServeSettings().max_tokens_per_call == 32_768
    for flag in ("--max-tokens-per-call", "--max-sequence-tokens"):
        assert main(["serve", flag, "0"]) == 2
        assert flag in capsys.readouterr().err


from hypothesis import HealthCheck, given, settings  # noqa: E402
from hypothesis import strategies as st  # noqa: E402

TEXTS = st.text(alphabet=st.sampled_from("ab9 .,\n\tZé漢-"), max_size=1500) | st.text(
    max_size=300)


@settings(max_examples=60, deadline=None,
          suppress_health_check=[HealthCheck.function_scoped_fixture])
@given(text=TEXTS)
def test_any_text_cut_into_pieces_still_encodes_the_same_text(starter_2m, text):
    """Property (class 4): whatever a client sends, the pieces put together are the text,
    its encoding decodes back to it, and text without a long unbroken run is encoded
    exactly as the tokenizer would."""
    tokenizer = starter_2m.tokenizer
    encoder = Encoder.for_tokenizer(tokenizer, 100_000)
    assert "".join(pieces(text)) == text
    ids = encoder.encode(text)
    assert tokenizer.decode(ids) == tokenizer.decode(
        tokenizer.encode(text, add_special_tokens=False))
    if len(pieces(text)) == 1:
        assert ids == tokenizer.encode(text, add_special_tokens=False)


@settings(max_examples=300, deadline=None)
@given(run_id=st.text(max_size=80))
def test_a_run_id_is_a_name_inside_the_state_folder_or_refused(run_id):
    """Property (class 3): any value read back as a run id either names a folder directly
    under ``<state>/runs`` or is refused; it never reaches anywhere else."""
    from pathlib import Path

    from posttrain.service.engine import state
    from posttrain.service.engine.errors import BadRequest

    root = Path("/state")
    try:
        folder = state.run_folder(root, run_id)
    except BadRequest:
        return
    assert folder.parent == root / "runs" and folder.name == run_id
    assert ".." not in run_id and "/" not in run_id and "\\" not in run_id
