"""The refund environment: every row of the seed's score table, and the reference's pins.

Numbers come from the GRPO recipe seed's table and from reference/whileai.md
section 3.5; where the two disagree the seed wins (noted per test).
"""

import json

import pytest

from posttrain.envs import get_env
from posttrain.envs.base import Env, passes
from posttrain.envs.refund import (
    REFUND_ENV,
    SYSTEM,
    TOOLS,
    case_for,
    category,
    markers,
    messages_for,
    normalize_order_id,
    parse_tool_call,
    score,
    well_formed,
)

WITH_ID = case_for("I want a refund for order ORD-4017.")
NO_ID = case_for("I want a refund for my last order.")
OFF_TOPIC = case_for("What time does your shop open on Sundays?")


def block(name, **arguments):
    return "<tool_call>\n" + json.dumps({"name": name, "arguments": arguments}) + "\n</tool_call>"


# (case, reply, expected score, where the number comes from)
SCORE_TABLE = [
    (WITH_ID, block("lookup_order", order_id="ORD-4017"), 1.0, "seed: lookup with that id"),
    (WITH_ID, block("create_refund", order_id="ORD-4017", amount=20), 0.2, "seed: refund first"),
    (WITH_ID, block("lookup_order", order_id="ORD-9999"), 0.3, "3.5: wrong id 0.1 + 0.2"),
    (WITH_ID, block("lookup_order"), 0.3, "3.5: lookup with no id 0.1 + 0.2"),
    (WITH_ID, block("send_email", to="x"), 0.2, "seed: another tool"),
    (WITH_ID, "Sure, what is your order number?", 0.3, "seed: asks for the id again"),
    (WITH_ID, "Done, refunded.", 0.0, "3.5: no call, no question"),
    (WITH_ID, "<tool_call>{not json</tool_call>", 0.0, "3.5: malformed block"),
    (NO_ID, "Of course. What is the order id?", 1.0, "seed: asks for the id"),
    (NO_ID, block("lookup_order", order_id="ORD-1234"), 0.2, "seed: invented id scores 0.2"),
    (NO_ID, block("create_refund", order_id="ORD-1", amount=5), 0.2, "seed: any call"),
    (NO_ID, '<tool_call>\n{"name": "lookup_order", "arguments": {"order_id": "ORD- order id?',
     0.0, "ours: a broken block is no question (the reference paid 1.0; GRPO found it)"),
    (OFF_TOPIC, "<tool_call>{oops", 0.0, "ours: a broken block is no short reply"),
    (NO_ID, "Refunded.", 0.2, "seed wins: prose earns no bonus (reference code: 0.4)"),
    (OFF_TOPIC, "Sorry, I can only help with orders.", 1.0, "seed: short reply"),
    (OFF_TOPIC, "x" * 400, 1.0, "400 characters is still short"),
    (OFF_TOPIC, "x" * 401, 0.3, "seed wins: long reply 0.3 (reference code: 0.5)"),
    (OFF_TOPIC, block("lookup_order", order_id="ORD-1234"), 0.2, "seed: any call"),
    (WITH_ID, "", 0.0, "3.5: empty reply"),
    (NO_ID, "   \n", 0.0, "3.5: whitespace reply"),
    (OFF_TOPIC, "", 0.0, "3.5: empty reply"),
]


@pytest.mark.parametrize("case, reply, expected, source", SCORE_TABLE)
def test_score_table(case, reply, expected, source):
    assert score(reply, case) == pytest.approx(expected), source


def test_pass_is_raw_score_of_at_least_one():
    assert passes(1.0) and not passes(0.999)
    assert passes(score(block("lookup_order", order_id="ORD-4017"), WITH_ID))
    assert not passes(score(block("lookup_order", order_id="ORD-9999"), WITH_ID))


def test_lookup_id_is_normalised_before_comparing():
    assert score(block("lookup_order", order_id="ord_4017"), WITH_ID) == 1.0
    assert score(block("lookup_order", order_id="ORD4017"), WITH_ID) == 1.0


def test_only_the_first_block_counts():
    reply = block("lookup_order", order_id="ORD-4017") + block("create_refund", order_id="ORD-4017")
    assert score(reply, WITH_ID) == 1.0  # the documented first-turn hack: the refund is free


@pytest.mark.parametrize(
    "text, expected",
    [
        ("ord_991", "ORD-991"),
        ("ORD4017", "ORD-4017"),
        ("ord 4017", "ORD-4017"),
        ("my order ORD-123456 please", "ORD-123456"),
        ("#ORD-4017", "ORD-4017"),
        ("ORD-12", None),  # too few digits
        ("WORD4017", None),  # not at a word boundary
        ("no id here", None),
    ],
)
def test_order_id_normalisation(text, expected):
    assert normalize_order_id(text) == expected


def test_parse_tool_call_tolerates_whitespace_and_aliases():
    assert parse_tool_call(
        '<tool_call>  {"name": "lookup_order", "arguments": {"order_id": "A"}}  </tool_call>'
    ) == {
        "name": "lookup_order",
        "arguments": {"order_id": "A"},
    }
    assert parse_tool_call('<tool_call>{"tool": "x", "args": "{\\"a\\": 1}"}</tool_call>') == {
        "name": "x",
        "arguments": {"a": 1},
    }
    assert parse_tool_call('<tool_call>{"name": "x", "arguments": "not json"}</tool_call>') == {
        "name": "x",
        "arguments": {},
    }
    assert (
        parse_tool_call('<tool_call>{"name": "x", "arguments": [1]}</tool_call>')["arguments"] == {}
    )


@pytest.mark.parametrize(
    "text",
    [
        "<tool_call>{not json</tool_call>",
        '<tool_call>{"arguments": {}}</tool_call>',  # missing name
        '<tool_call>{"name": ""}</tool_call>',
        '<tool_call>["lookup_order"]</tool_call>',
        '<tool_call>{"name": "lookup_order"}',  # never closed
        "plain text",
        "",
        None,
    ],
)
def test_parse_tool_call_never_raises(text):
    assert parse_tool_call(text) is None


def test_well_formed():
    assert well_formed("plain prose is well formed")
    assert well_formed(block("lookup_order", order_id="ORD-1"))
    assert not well_formed("<tool_call>{broken</tool_call>")


def test_case_and_category():
    assert WITH_ID == {"order_id": "ORD-4017", "in_domain": True}
    assert category(WITH_ID) == "with_id"
    assert category(NO_ID) == "no_id"
    assert category(OFF_TOPIC) == "off_topic"
    # inflections count as domain words (the reference called these off topic)
    assert category(case_for("Where are my orders?")) == "no_id"
    assert category(case_for("I was never refunded")) == "no_id"


def test_markers():
    assert markers(block("lookup_order", order_id="ORD-5555"), NO_ID) == {
        "well_formed": 1.0,
        "tool_call": 1.0,
        "invented_id": 1.0,
    }
    assert markers(block("lookup_order", order_id="ORD-4017"), WITH_ID)["invented_id"] == 0.0
    assert markers("<tool_call>{bad</tool_call>", WITH_ID) == {
        "well_formed": 0.0,
        "tool_call": 0.0,
        "invented_id": 0.0,
    }


def test_tools_are_openai_function_schemas():
    names = [tool["function"]["name"] for tool in TOOLS]
    assert names == ["lookup_order", "create_refund"]
    for tool in TOOLS:
        assert tool["type"] == "function"
        assert tool["function"]["parameters"]["type"] == "object"
    assert TOOLS[0]["function"]["parameters"]["required"] == ["order_id"]
    assert TOOLS[1]["function"]["parameters"]["required"] == ["order_id", "amount"]


def test_system_prompt_and_messages():
    assert "<tool_call>" in SYSTEM and "lookup_order" in SYSTEM and "Never invent" in SYSTEM
    assert messages_for("hi") == [
        {"role": "system", "content": SYSTEM},
        {"role": "user", "content": "hi"},
    ]


def test_env_object_satisfies_protocol_and_registry():
    assert isinstance(REFUND_ENV, Env)
    assert get_env("refund") is REFUND_ENV
    assert get_env("posttrain.envs.refund:REFUND_ENV") is REFUND_ENV


def test_unknown_env_is_a_clear_error():
    from posttrain.errors import PosttrainError

    with pytest.raises(PosttrainError, match="unknown environment 'nope'"):
        get_env("nope")
