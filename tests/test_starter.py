"""The embedded starter model: recipe, dialogues, tokenizer, deterministic build."""

from __future__ import annotations

import json
from collections import Counter
from dataclasses import replace

import pytest

from posttrain.envs.refund import REFUND_ENV, SYSTEM, parse_tool_call
from posttrain.errors import PosttrainError
from posttrain.policy.starter import (
    RECIPES,
    Architecture,
    BehaviourMix,
    build_starter,
    recipe_for,
    render_chatml,
    starter_dialogues,
    starter_folder,
    weights_sha256,
)

# a recipe small enough to build twice in a few seconds
TINY = replace(
    RECIPES["starter-2m"],
    name="starter-tiny",
    architecture=Architecture(hidden_size=64, num_layers=2, intermediate_size=128),
    corpus_situations=300,
    sft_steps=6,
    warmup_steps=2,
)


def test_unknown_starter_name_lists_the_choices():
    with pytest.raises(PosttrainError, match="starter, starter-2m"):
        recipe_for("starter-10b")


def test_the_cache_key_changes_with_any_recipe_field():
    base = RECIPES["starter"]
    assert base.key() == replace(base).key()
    assert base.key() != replace(base, sft_steps=base.sft_steps + 1).key()
    assert base.key() != replace(base, mix=replace(base.mix, with_id_ask=0.5)).key()
    assert starter_folder("starter").name == f"starter-{base.key()}"


def test_every_category_mix_sums_to_one():
    mix = BehaviourMix()
    for category in REFUND_ENV.categories:
        assert sum(mix.shares(category).values()) == pytest.approx(1.0)


def test_dialogues_follow_the_mix_and_are_graded_as_intended():
    rows = starter_dialogues(TINY)
    assert rows == starter_dialogues(TINY)  # deterministic
    counts = Counter((row["category"], row["behaviour"]) for row in rows)
    with_id = sum(n for (category, _), n in counts.items() if category == "with_id")
    # 300 situations give ~230 with-id dialogues; shares within a loose binomial band
    share = counts[("with_id", "lookup")] / with_id
    assert abs(share - TINY.mix.with_id_lookup) < 0.1
    # only the right move passes, every mistake fails
    passing = {("with_id", "lookup"), ("no_id", "ask"), ("off_topic", "short")}
    for row in rows:
        case = REFUND_ENV.case_for(row["prompt"])
        passed = REFUND_ENV.score(row["reply"], case) >= 1.0
        assert passed == ((row["category"], row["behaviour"]) in passing), row
        if row["behaviour"] == "wrong_id":
            assert parse_tool_call(row["reply"])["arguments"]["order_id"] != case["order_id"]


def test_tiny_build_is_deterministic(monkeypatch, tmp_path):
    folders = []
    for attempt in ("first", "second"):
        monkeypatch.setenv("POSTTRAIN_MODELS", str(tmp_path / attempt))
        folders.append(build_starter(recipe=TINY, show_progress=False))
    first, second = folders
    assert first.name == second.name
    assert (first / "tokenizer.json").read_bytes() == (second / "tokenizer.json").read_bytes()
    assert weights_sha256(first) == weights_sha256(second)


def test_autotokenizer_reads_the_starter_tokenizer_as_built(starter_2m_folder):
    # guards the trap in new_model's docstring: a qwen2 folder would be re-tokenised
    # with Qwen's regex, ~5x more tokens and not what the model was trained on
    from tokenizers import Tokenizer
    from transformers import AutoTokenizer

    text = render_chatml(SYSTEM, "Refund ORD-4017 please, it broke.", "Could you tell me?")
    as_built = Tokenizer.from_file(str(starter_2m_folder / "tokenizer.json")).encode(text).ids
    loaded = AutoTokenizer.from_pretrained(starter_2m_folder)
    assert loaded(text, add_special_tokens=False)["input_ids"] == as_built
    assert len(as_built) < 80  # the ~700-character system prompt is a handful of tokens


def test_tool_tags_are_single_tokens_that_survive_decoding(starter_2m):
    tokenizer = starter_2m.tokenizer
    for tag in ("<tool_call>", "</tool_call>"):
        ids = tokenizer.encode(tag, add_special_tokens=False)
        assert len(ids) == 1
        assert tokenizer.decode(ids, skip_special_tokens=True) == tag
    for digit in "0123456789":  # ids are copied digit by digit
        assert len(tokenizer.encode(f"ORD-1{digit}", add_special_tokens=False)) >= 3


def test_chat_template_renders_chatml_with_the_generation_prompt(starter_2m):
    messages = REFUND_ENV.messages_for("Where is ORD-1234?")
    text = starter_2m.tokenizer.apply_chat_template(
        messages, add_generation_prompt=True, tokenize=False
    )
    assert text == (
        f"<|im_start|>system\n{SYSTEM}<|im_end|>\n<|im_start|>user\n"
        "Where is ORD-1234?<|im_end|>\n<|im_start|>assistant\n"
    )


def test_build_records_its_recipe_and_is_reused(starter_2m_folder):
    recipe = json.loads((starter_2m_folder / "recipe.json").read_text())
    build = json.loads((starter_2m_folder / "build.json").read_text())
    assert recipe["recipe"]["name"] == "starter-2m"
    assert build["key"] == RECIPES["starter-2m"].key()
    assert sum(build["behaviour_counts"].values()) == build["dialogues"]
    assert build_starter("starter-2m", show_progress=False) == starter_2m_folder
