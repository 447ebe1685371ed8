"""The embedded starter model: recipe, dialogues, tokenizer, deterministic build."""

from __future__ import annotations

import json
from collections import Counter
from dataclasses import replace

import pytest

from posttrain.envs.refund import CATEGORIES, REFUND_ENV, SYSTEM, parse_tool_call
from posttrain.envs.refund.starter_data import (
    STARTER_DATA,
    BehaviourMix,
    render_chatml,
    starter_dialogues,
    with_fresh_id,
)
from posttrain.errors import PosttrainError
from posttrain.policy.starter_names import is_starter_name
from posttrain.policy.starters.build import build_starter
from posttrain.policy.starters.copy_circuit import id_copy_rate
from posttrain.policy.starters.gate import CategoryRange, StarterProbe, StarterSpec
from posttrain.policy.starters.recipes import RECIPES, Architecture
from posttrain.policy.starters.registry import recipe_for, starter_folder
from posttrain.policy.starters.scratch import weights_sha256

# a recipe small enough to build twice in a few seconds
TINY = replace(
    RECIPES["starter-2m"],
    name="starter-tiny",
    architecture=Architecture(hidden_size=64, num_layers=2, intermediate_size=128),
    corpus_situations=300,
    skill_steps=2,
    mix_steps=2,
    warmup_steps=2,
    build_attempts=1,  # a model this small is far outside the spec; one try is enough here
)


def tiny_dialogues():
    return starter_dialogues(TINY.mix, TINY.corpus_situations, TINY.data_seed)


def test_unknown_starter_name_lists_the_choices():
    with pytest.raises(PosttrainError, match="starter, starter-2m"):
        recipe_for("starter-10b")


def test_the_cache_key_changes_with_any_recipe_field():
    base = recipe_for("starter")
    assert base.key() == replace(base).key()
    assert base.key() != replace(base, mix_steps=base.mix_steps + 1).key()
    assert base.key() != replace(base, mix=replace(base.mix, with_id_ask=0.45)).key()
    assert base.key() != replace(base, spec=replace(base.spec, min_copy_rate=0.5)).key()
    assert starter_folder("starter").name == f"{base.name}-{base.key()}"


def test_a_seeded_name_is_the_same_recipe_from_another_build_seed():
    assert is_starter_name("starter@3") and is_starter_name("starter-2m@12")
    assert not is_starter_name("starter@") and not is_starter_name("smollm2")
    seeded = recipe_for("starter@3")
    assert seeded == replace(recipe_for("starter"), seed=3)
    assert starter_folder("starter@3") != starter_folder("starter")


def test_a_recipe_needs_at_least_one_build_attempt():
    with pytest.raises(ValueError, match="build_attempts"):
        replace(TINY, build_attempts=0)


def test_every_category_mix_sums_to_one():
    mix = BehaviourMix()
    for category in REFUND_ENV.categories:
        assert sum(mix.shares(category).values()) == pytest.approx(1.0)


def test_dialogues_follow_the_mix_and_are_graded_as_intended():
    rows = tiny_dialogues()
    assert rows == tiny_dialogues()  # deterministic
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
    from posttrain.envs.refund.prompts import simulate
    from posttrain.policy.starters.scratch import new_model

    prompts = [r["prompt"] for r in simulate(60, seed=0) if r["category"] == "with_id"][:20]
    recipe = RECIPES["starter-2m"]
    tokenizer = starter_2m.tokenizer
    wired, circuit = new_model(tokenizer, recipe.architecture, recipe.seed, copy_circuit=True)
    plain, none = new_model(tokenizer, recipe.architecture, recipe.seed, copy_circuit=False)
    assert none is None and circuit is not None
    assert id_copy_rate(wired.eval(), tokenizer, prompts, STARTER_DATA) >= 0.7
    assert id_copy_rate(plain.eval(), tokenizer, prompts, STARTER_DATA) <= 0.05


def test_the_built_starter_2m_copies_order_ids(starter_2m):
    from posttrain.envs.refund.prompts import simulate

    # the spec's floor is 0.8 on the probe set; these are other prompts (evaluation seed 0)
    prompts = [r["prompt"] for r in simulate(200, seed=0) if r["category"] == "with_id"][:30]
    assert id_copy_rate(starter_2m.model, starter_2m.tokenizer, prompts, STARTER_DATA) >= 0.7


def test_fresh_ids_keep_the_spelling_and_the_grading():
    import random

    rng = random.Random(3)
    rows = [row for row in tiny_dialogues() if row["category"] == "with_id"][:40]
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


def test_the_built_starter_2m_passed_its_gate_on_its_recorded_probe(starter_2m_folder):
    build = json.loads((starter_2m_folder / "build.json").read_text())
    spec = RECIPES["starter-2m"].spec
    assert build["gate"] == "passed"
    kept = next(a for a in build["attempts"] if a["seed"] == build["build_seed"])
    assert kept["failures"] == [] and kept["probe"] == build["probe"]
    assert spec.failures(StarterProbe(**build["probe"])) == []


def test_a_build_outside_the_spec_is_retried_from_the_next_seed(monkeypatch, tmp_path, capsys):
    monkeypatch.setenv("POSTTRAIN_MODELS", str(tmp_path))
    impossible = replace(TINY, build_attempts=2, spec=replace(TINY.spec, min_copy_rate=1.01))
    folder = build_starter(recipe=impossible, show_progress=False)
    build = json.loads((folder / "build.json").read_text())
    assert [attempt["seed"] for attempt in build["attempts"]] == [0, 1]
    assert all("copy rate" in attempt["failures"][0] for attempt in build["attempts"])
    assert build["gate"] == "failed"
    distances = {a["seed"]: impossible.spec.distance(StarterProbe(**a["probe"]))
                 for a in build["attempts"]}  # fmt: skip
    assert distances[build["build_seed"]] == min(distances.values())  # the nearest is kept
    logged = capsys.readouterr().err
    assert "build seed 0 is outside the spec" in logged and "rebuilding from build seed 1" in logged
    assert "no build seed in 0-1 met the spec" in logged


def test_a_build_inside_the_spec_stops_at_the_first_seed(monkeypatch, tmp_path):
    monkeypatch.setenv("POSTTRAIN_MODELS", str(tmp_path))
    anything = StarterSpec(
        min_copy_rate=0.0, pass_rates=tuple(CategoryRange(c, 0.0, 1.0) for c in CATEGORIES)
    )
    folder = build_starter(recipe=replace(TINY, build_attempts=3, spec=anything),
                           show_progress=False)  # fmt: skip
    build = json.loads((folder / "build.json").read_text())
    assert build["gate"] == "passed" and [a["seed"] for a in build["attempts"]] == [0]


def test_spec_failures_name_each_bound_that_is_missed():
    ranges = (CategoryRange("with_id", 0.2, 0.5), CategoryRange("no_id", 0.6, 0.9))
    spec = StarterSpec(min_copy_rate=0.8, pass_rates=ranges)
    inside = StarterProbe(0.9, {"with_id": 0.3, "no_id": 0.7}, {}, {})
    assert spec.failures(inside) == [] and spec.distance(inside) == 0.0
    outside = StarterProbe(0.5, {"with_id": 0.6, "no_id": 0.5}, {}, {})
    assert spec.failures(outside) == [
        "copy rate 0.50 < 0.80", "with_id pass rate 0.60 > 0.50", "no_id pass rate 0.50 < 0.60",
    ]  # fmt: skip
    assert spec.distance(outside) == pytest.approx(0.3 + 0.1 + 0.1)
    assert spec.failures(StarterProbe(0.9, {"with_id": 0.3}, {}, {})) == [
        "no no_id prompts in the probe"
    ]
