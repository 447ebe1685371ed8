"""The self cold start's hint (issue #69): where a category's plain samples find nothing,
replies opened by a call of one of the environment's declared tools, kept as replies to the
plain prompt (posttrain.train.grpo.cold_start_hint, cold_start_self.keep_passing)."""

from __future__ import annotations

import json
from pathlib import Path
from types import SimpleNamespace

import pytest

from posttrain.cli import main
from posttrain.envs import get_env
from posttrain.envs.wire import parse_tool_call
from posttrain.policy.sampler import SamplingParams
from posttrain.train.grpo.cold_start_hint import OpenedReplyAgent, tool_openings
from posttrain.train.grpo.cold_start_self import (
    CategoryFind,
    anchor_categories,
    anchored,
    keep_passing,
    unfound,
)
from tests.test_cold_start import NEVER_PASSES_ENV

EXAMPLES = Path(__file__).resolve().parents[1] / "examples"
LIBRARY = get_env(f"{EXAMPLES / 'library_env.py'}:NO_REFERENCE_ENV")


def test_each_declared_tool_opens_a_call_up_to_its_first_required_value():
    assert tool_openings(LIBRARY) == [
        '<tool_call>\n{"name": "search_catalog", "arguments": {"title": "',
        '<tool_call>\n{"name": "renew_loan", "arguments": {"loan": "',
    ]
    bare = SimpleNamespace(tools=[
        {"type": "function", "function": {"name": "ping", "parameters": {}}},
        {"type": "function", "function": {"name": "look", "parameters": {
            "type": "object", "properties": {"where": {"type": "string"}}}}},
        {"type": "function", "function": {"description": "no name: not a tool"}},
        "not a schema"])
    # no argument: the whole call; no required one: the first property
    assert tool_openings(bare) == ['<tool_call>\n{"name": "ping", "arguments": {}}\n</tool_call>',
                                   '<tool_call>\n{"name": "look", "arguments": {"where": "']
    assert tool_openings(SimpleNamespace()) == [] == tool_openings(SimpleNamespace(tools=None))
    # an opening finished with the value parses as the rule's own call
    call = parse_tool_call(tool_openings(LIBRARY)[1] + 'LN-1234"}}\n</tool_call>')
    assert call is not None and call["name"] == "renew_loan"


def rows_of(category: str, prompt: str, replies: list[tuple[str, int]], opened: bool) -> list:
    return [{"category": category, "prompt": prompt, "scenario_id": f"s-{prompt}",
             "reply": reply, "reward": reward, **({"opened": True} if opened else {})}
            for reply, reward in replies]


def test_an_opened_reply_that_passes_is_kept_for_the_plain_prompt_and_counted_apart():
    prompt = 'Could you find "The Last Garden" for me?'
    call = ('<tool_call>\n{"name": "search_catalog", "arguments": {"title": "The Last Garden"}}'
            '\n</tool_call>')
    rows = (rows_of("title", prompt, [("I cannot.", 0), ("Sure!", 0)], opened=False)
            + rows_of("title", prompt, [(call, 1), (call, 1), ("<tool_call>\n{", 0)],
                      opened=True)
            + rows_of("loan", "Renew LN-0001", [("ok", 0)], opened=False))
    assert unfound(rows[:2], ["title", "loan"]) == ["title", "loan"]
    assert unfound(rows, ["title", "loan"]) == ["loan"]
    context = SimpleNamespace(env=LIBRARY)
    demos: list = []
    seen: set = set()
    finds = keep_passing(context, rows, ["title", "loan"], seen, demos)  # type: ignore[arg-type]
    title, loan = finds
    assert (title.samples, title.passed, title.opened_samples, title.opened_passed) == (2, 0, 3, 2)
    assert title.new == 1 and (title.prompts, title.prompts_passed) == (1, 1)
    assert title.words() == ("title 0 passing of 2 samples, 2 of 3 with the reply opened by a "
                             "tool call (1 new; on 1 of 1 prompts)")
    assert loan.words() == "loan 0 passing of 1 samples"
    # the demonstration is the plain prompt's conversation (no opening in it) and the
    # whole reply: fine-tuning teaches the policy to open the call itself
    assert demos == [{"prompt": LIBRARY.messages_for(prompt),
                      "completion": [{"role": "assistant", "content": call}],
                      "scenario_id": f"s-{prompt}", "category": "title"}]
    assert CategoryFind("x", opened_passed=1).found() == 1
    # the same reply found again in a later round is not kept twice
    again = keep_passing(context, rows, ["title", "loan"], seen, demos)  # type: ignore[arg-type]
    assert again[0].new == 0 and len(demos) == 1


def test_the_opened_agent_begins_each_reply_with_the_opening_its_seed_chooses(starter_2m):
    refund = get_env("refund")
    openings = tool_openings(refund)
    assert openings and all(opening.startswith("<tool_call>\n") for opening in openings)
    agent = OpenedReplyAgent(starter_2m, SamplingParams(temperature=1.0, max_new_tokens=24),
                             [*openings, "Well, "])
    conversation = refund.messages_for("Please refund order A-1234.")
    seeds = list(range(6))
    replies = agent.reply_batch([conversation] * len(seeds), seeds)
    for seed, reply in zip(seeds, replies, strict=True):
        opening = agent.openings[seed % len(agent.openings)]
        assert reply.startswith(opening)
        assert reply[len(opening):] == agent.last_completions[seed].text
    # seeded: the same seeds give the same replies
    assert agent.reply_batch([conversation] * len(seeds), seeds) == replies
    with pytest.raises(ValueError, match="at least one opening"):
        OpenedReplyAgent(starter_2m, SamplingParams(), [])


@pytest.mark.slow
def test_no_hint_samples_plain_only_and_a_bad_hint_is_refused(starter_2m_folder, tmp_path,
                                                               capsys):
    """Through the CLI, on a rule no reply passes: `--cold-start-hint none` samples plain
    only. (With the default, `tools`, the same run samples each category again with the
    reply opened: tests/test_cold_start.py, the self cold start that keeps nothing.)"""
    rule = tmp_path / "never_env.py"
    rule.write_text(NEVER_PASSES_ENV)
    code = main(["grpo", "--env", f"{rule}:ENV", "--base-model", "starter-2m",
                 "--prompts", "40", "--eval-samples", "1", "--eval-repeats", "1",
                 "--steps", "1", "--num-generations", "2", "--monitor-every", "0",
                 "--cold-start", "self", "--cold-start-prompts", "2",
                 "--cold-start-samples", "2", "--cold-start-hint", "none",
                 "--runs-dir", str(tmp_path / "runs"), "--run-name", "none"])
    assert code in (0, 1)
    summary = json.loads((tmp_path / "runs" / "none" / "summary.json").read_text())
    plain = summary["cold_start"]["self"]["rounds"][0]["categories"]
    assert plain and all(find["opened_samples"] == 0 < find["samples"] for find in plain)
    assert "with the reply opened" not in capsys.readouterr().out
    with pytest.raises(SystemExit) as refused:
        main(["grpo", "--cold-start-hint", "sometimes"])
    assert refused.value.code == 2


def test_anchors_join_the_mined_replies_up_to_a_mined_categorys_mean():
    signal = [SimpleNamespace(name=name) for name in ("loan", "title", "chitchat")]
    assert anchor_categories(signal, ["loan", "title"]) == ["chitchat"]
    mined = [{"category": "loan", "n": n} for n in range(5)] + [{"category": "title"}] * 2
    held = [{"category": "chitchat", "n": n} for n in range(9)]
    # 7 mined replies over 2 mined categories: up to 4 of each anchor category
    assert anchored(mined, held, 2) == [*mined, *held[:4]]
    assert anchored([], held, 2) == []  # nothing mined: nothing to hold against
    assert anchored(mined, [], 2) == mined


def test_anchor_samples_out_of_range_are_refused(capsys):
    assert main(["grpo", "--cold-start-anchor-samples", "-1"]) == 2
    assert "--cold-start-anchor-samples must be at least 0, got -1" in capsys.readouterr().err
    assert main(["grpo", "--cold-start-anchor-samples", "65"]) == 2
    assert "--cold-start-anchor-samples" in capsys.readouterr().err
