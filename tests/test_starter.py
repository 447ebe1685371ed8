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
    id_copy_rate,
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
    skill_steps=2,
    mix_steps=2,
    warmup_steps=2,
)


def test_unknown_starter_name_lists_the_choices():
    with pytest.raises(PosttrainError, match="starter, starter-2m"):
        recipe_for("starter-10b")


def test_the_cache_key_changes_with_any_recipe_field():
    base = recipe_for("starter")
    assert base.key() == replace(base).key()
    assert base.key() != replace(base, mix_steps=base.mix_steps + 1).key()
    assert base.key() != replace(base, mix=replace(base.mix, with_id_ask=0.5)).key()
    assert starter_folder("starter").name == f"{base.name}-{base.key()}"


def test_starter_is_grown_from_the_2m_build_and_keyed_by_it(monkeypatch):
    starter, small = recipe_for("starter"), recipe_for("starter-2m")
    assert starter.grow_from == "starter-2m" and not small.grow_from
    assert starter.architecture.hidden_size == 2 * small.architecture.hidden_size
    assert starter.architecture.num_layers > small.architecture.num_layers
    assert starter_folder("starter") != starter_folder("starter-2m")
    before = starter.key()
    # a different 2M build means a different grown one
    monkeypatch.setitem(RECIPES, "starter-2m", replace(small, mix_steps=small.mix_steps + 1))
    assert starter.key() != before


def test_the_2m_key_did_not_change_when_growing_was_added():
    # recipes without grow_from hash as before, so existing caches stay valid
    assert recipe_for("starter-2m").key() == "5488042114a4"


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
    # ids split the same way wherever they appear: the prefix, then digit pairs
    for text in ("Refund ORD-4017 now", '{"order_id": "ORD-4017"}'):
        tokens = tokenizer.tokenize(text)
        assert tokens[tokens.index("ORD-") :][:3] == ["ORD-", "40", "17"]
    assert [t for t in tokenizer.tokenize("ord_20931?") if t.isdigit()] == ["20", "93", "1"]


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


def test_the_wired_copy_circuit_copies_order_ids_before_any_training(starter_2m):
    from posttrain.data.simulate import simulate
    from posttrain.policy.starter import new_model

    prompts = [r["prompt"] for r in simulate(60, seed=0) if r["category"] == "with_id"][:20]
    recipe = RECIPES["starter-2m"]
    tokenizer = starter_2m.tokenizer
    wired = new_model(tokenizer, recipe.architecture, recipe.seed, copy_circuit=True).eval()
    plain = new_model(tokenizer, recipe.architecture, recipe.seed, copy_circuit=False).eval()
    assert id_copy_rate(wired, tokenizer, prompts) >= 0.7
    assert id_copy_rate(plain, tokenizer, prompts) <= 0.05


def test_the_built_starter_2m_copies_most_order_ids(starter_2m):
    from posttrain.data.simulate import simulate

    prompts = [r["prompt"] for r in simulate(200, seed=0) if r["category"] == "with_id"][:30]
    assert id_copy_rate(starter_2m.model, starter_2m.tokenizer, prompts) >= 0.4


def test_fresh_ids_keep_the_spelling_and_the_grading():
    import random

    from posttrain.policy.starter import with_fresh_id

    rng = random.Random(3)
    rows = [row for row in starter_dialogues(TINY) if row["category"] == "with_id"][:40]
    for row in rows:
        fresh = with_fresh_id(row, rng)
        old_case, new_case = (
            REFUND_ENV.case_for(row["prompt"]),
            REFUND_ENV.case_for(fresh["prompt"]),
        )
        assert new_case["order_id"] != old_case["order_id"]
        assert len(new_case["order_id"]) == len(old_case["order_id"])
        # the same words around a new number, spelled the customer's way
        prefix = row["prompt"].split(old_case["order_id"][4:])[0]
        assert fresh["prompt"].startswith(prefix)
        for field in ("reply", "right_reply"):
            passed = REFUND_ENV.score(row[field], old_case) >= 1.0
            assert (REFUND_ENV.score(fresh[field], new_case) >= 1.0) == passed
