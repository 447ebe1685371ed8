"""Model-written prompts (`posttrain prompts write --writer|--endpoint`): reading the
writer's replies, the faithfulness and near-duplicate filters on fixed writer outputs, the
journal that lets an interrupted run continue, and the command end to end with the
starter loaded here and with a writer behind an HTTP endpoint."""

from __future__ import annotations

import json
import re

import pytest
from chat_servers import ChatHandler, completion, serving

from posttrain.cli import main
from posttrain.data.writer import (
    WriterSettings,
    parse_versions,
    write_with_model,
    writer_messages,
)
from posttrain.envs import get_env
from posttrain.errors import PosttrainError


def test_versions_are_read_from_a_json_array_or_line_by_line():
    assert parse_versions('["Where is ORD-1?", "  ", "ORD-1: status please"]') == [
        "Where is ORD-1?", "ORD-1: status please"]
    assert parse_versions('Sure! Here they are:\n["One version here.", "Another one here."]\n'
                          "Hope this helps.") == ["One version here.", "Another one here."]
    assert parse_versions('1. "Where is my parcel ORD-1?"\n2. Has ORD-1 shipped yet, please?\n'
                          "- ok") == ["Where is my parcel ORD-1?", "Has ORD-1 shipped yet, please?"]
    assert parse_versions("") == [] and parse_versions("no") == []
    assert parse_versions("A customer wrote:\nToo short here\nWhere did my parcel go, "
                          "please?") == ["Where did my parcel go, please?"]


def test_the_request_keeps_identifiers_and_asks_for_json():
    messages = writer_messages("Refund ORD-4417 please, it cost 40 dollars.", "angry", 3)
    ask = messages[-1]["content"]
    assert "Keep 40, ORD-4417 exactly as written." in ask and "JSON array" in ask
    assert "angry customer" in ask and "Write 3 different versions" in ask
    assert "Do not add an order number" in writer_messages("Where is my order?", "plain",
                                                           2)[-1]["content"]


def seed_of(messages) -> str:
    return re.search(r"A customer wrote:\n\n(.*?)\n\nWrite", messages[-1]["content"],
                     re.S).group(1)


class FixedWriter:
    """A deterministic writer: for every seed, one faithful version, one with another
    order id (or one added), one off topic, one near duplicate of the seed. Counts what
    it was asked."""

    def __init__(self, fail_after: int | None = None):
        self.policy = {"agent": "fixed-writer"}
        self.sampling: dict = {}
        self.asked = 0
        self.fail_after = fail_after
        self.env = get_env("refund")

    def reply_batch(self, conversations, seeds):
        if self.fail_after is not None and self.asked >= self.fail_after:
            raise KeyboardInterrupt
        self.asked += len(conversations)
        replies = []
        for messages in conversations:
            seed = seed_of(messages)
            order_id = self.env.case_for(seed)["order_id"]
            # another id: the seed's id digits changed, or an id added where there was none
            other_id = (seed.replace(order_id.split("-")[1], "99999") if order_id
                        else seed + " It is order ORD-12345.")
            replies.append(json.dumps([
                f"Good day, I am writing to you about the following. {seed}",
                other_id,
                "Could you recommend a good pizza place near the station?",
                seed + " thanks",
            ]))
        return replies


def refund_seeds(count: int = 12):
    env = get_env("refund")
    return env, env.write_prompts(count, seed=0)


def test_the_filters_keep_faithful_versions_and_count_what_they_drop(tmp_path):
    env, seeds = refund_seeds()
    categories = [seed["category"] for seed in seeds]
    out = tmp_path / "written.jsonl"
    kept, report = write_with_model(env, seeds, FixedWriter(), out,
                                    WriterSettings(angles=("plain", "angry"), per_request=4))
    assert report.seeds == len(seeds) and report.requests == 2 * len(seeds)
    assert report.written == 4 * report.requests and report.unreadable_replies == 0
    # another order id: another ground truth for with-id seeds, another category for the rest
    with_id = categories.count("with_id")
    off_topic = categories.count("off_topic")
    assert report.dropped_ground_truth == 2 * with_id
    # the pizza question is off topic: dropped unless the seed is off topic too
    assert report.dropped_category == 2 * (len(seeds) - with_id) + 2 * (len(seeds) - off_topic)
    assert report.dropped_near_duplicate >= 2 * len(seeds)  # "seed + thanks"
    assert report.kept == len(kept) - len(seeds)
    assert (report.written == report.kept + report.dropped_category
            + report.dropped_ground_truth + report.dropped_near_duplicate)
    written = [record for record in kept if record["source"].startswith("writer:")]
    assert written, "the faithful versions are kept"
    by_prompt = {seed["prompt"]: seed for seed in seeds}
    for record in written:
        seed = by_prompt[record["seed"]]
        assert record["scenario_id"] == seed["scenario_id"]
        assert record["category"] == seed["category"] and record["case"] == seed["case"]
    lines = [json.loads(line) for line in out.read_text().splitlines()]
    assert [line["prompt"] for line in lines] == [record["prompt"] for record in kept]
    assert lines[0]["source"] == "template"
    assert not (tmp_path / "written.jsonl.journal.jsonl").exists()
    assert "kept" in report.describe() and report.to_dict()["acceptance"] == round(
        report.acceptance, 4)


def test_an_interrupted_run_continues_where_it_stopped(tmp_path):
    env, seeds = refund_seeds()
    out = tmp_path / "written.jsonl"
    settings = WriterSettings(angles=("plain", "terse"), per_request=4, batch=5)
    with pytest.raises(KeyboardInterrupt):
        write_with_model(env, seeds, FixedWriter(fail_after=10), out, settings)
    journal = tmp_path / "written.jsonl.journal.jsonl"
    assert not out.exists() and len(journal.read_text().splitlines()) == 10
    again = FixedWriter()
    kept, _ = write_with_model(env, seeds, again, out, settings)
    assert again.asked == 2 * len(seeds) - 10  # only what was not answered yet
    whole, _ = write_with_model(env, seeds, FixedWriter(), tmp_path / "whole.jsonl", settings)
    assert [r["prompt"] for r in kept] == [r["prompt"] for r in whole]
    assert not journal.exists()


def test_bad_writer_settings_are_refused():
    with pytest.raises(PosttrainError, match="unknown angle"):
        WriterSettings(angles=("plain", "sarcastic"))
    with pytest.raises(PosttrainError, match="--per-request"):
        WriterSettings(per_request=0)
    with pytest.raises(PosttrainError, match="--jaccard"):
        WriterSettings(jaccard=0)


def test_the_command_refuses_two_writers_and_bad_flags(tmp_path, capsys):
    out = str(tmp_path / "p.jsonl")
    assert main(["prompts", "write", out, "--writer", "smollm2", "--endpoint",
                 "http://127.0.0.1:9/v1"]) == 2
    assert "give one" in capsys.readouterr().err
    assert main(["prompts", "write", out, "--writer", "starter-2m", "--angles", "shouty"]) == 2
    assert "unknown angle" in capsys.readouterr().err
    assert not (tmp_path / "p.jsonl").exists()


class WriterEndpoint(ChatHandler):
    """An OpenAI-compatible writer: answers each request with two versions of its seed."""

    model = "writer"

    def do_POST(self):
        seed = seed_of(self.body()["messages"])
        self.send_json(completion("writer", json.dumps([
            f"Hello, quick question from me. {seed}",
            "I would like to know the opening hours of your shop."])))


def test_a_writer_behind_an_endpoint(tmp_path, capsys):
    out = tmp_path / "endpoint.jsonl"
    with serving(WriterEndpoint) as url:
        assert main(["prompts", "write", str(out), "--prompts", "10", "--endpoint", url,
                     "--angles", "plain", "--per-request", "2"]) == 0
    printed = capsys.readouterr().out
    assert "written" in printed and f"wrote {out}" in printed
    records = [json.loads(line) for line in out.read_text().splitlines()]
    assert any(record["source"] == "writer:plain" for record in records)


@pytest.mark.slow
def test_the_starter_as_a_writer_end_to_end(starter_2m_folder, tmp_path, capsys):
    """The starter is a refund agent, not a writer: most of what it writes is dropped,
    and the report says so; the command runs through and writes the seeds."""
    out = tmp_path / "starter.jsonl"
    assert main(["prompts", "write", str(out), "--prompts", "6", "--writer", "starter-2m",
                 "--angles", "plain,terse", "--per-request", "2",
                 "--max-new-tokens", "48"]) == 0
    printed = capsys.readouterr().out
    match = re.search(r"asked (\d+) times for versions of (\d+) seed prompts: (\d+) written",
                      printed)
    assert match and int(match.group(1)) == 2 * int(match.group(2))
    records = [json.loads(line) for line in out.read_text().splitlines()]
    assert sum(record["source"] == "template" for record in records) == int(match.group(2))
    kept = int(re.search(r"kept (\d+) \(", printed).group(1))
    assert len(records) == kept + int(match.group(2))
