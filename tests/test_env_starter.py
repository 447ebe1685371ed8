"""A starter for any environment, built from the rule's own hooks (posttrain.policy.
hook_starter_data): its data, the errors for an environment without the hooks, the
build with its gate, and its cache key."""

import json
import textwrap
from collections import Counter
from pathlib import Path

import pytest

from posttrain.cli import main
from posttrain.envs import get_env
from posttrain.errors import PosttrainError
from posttrain.policy.starters.hook_data import HookStarterData, RightShare, copied_spans
from posttrain.policy.starters.registry import recipe_for, starter_folder

EXAMPLES = Path(__file__).resolve().parents[1] / "examples"
LIBRARY = f"{EXAMPLES / 'library_env.py'}:ENV"
PARCEL = f"{EXAMPLES / 'parcel_env.py'}:ENV"


def test_copied_spans_are_arguments_the_prompt_holds_word_for_word():
    call = ('<tool_call>\n{"name": "quote_postage", "arguments": {"weight_kg": 12, '
            '"country": "Spain"}}\n</tool_call>')
    assert copied_spans("How much to send 12 kg to Spain?", call) == ["Spain", "12"]
    # a number that is only part of another number is not a copy; nor is a computed one
    assert copied_spans("How much to send 312 kg to France?", call) == []
    assert copied_spans("no call here", "plain text") == []


@pytest.mark.parametrize("flag", [LIBRARY, PARCEL])
def test_the_warm_start_data_is_partial_in_every_category(flag):
    env = get_env(flag)
    data = HookStarterData(env)
    rows = data.dialogues(RightShare(right=0.35), 1200, 7919)
    per_category = Counter(row["category"] for row in rows)
    assert set(per_category) == set(env.categories)
    # every category at least its share, whatever the writer's balance (a category with
    # few distinct prompts is cycled up to it)
    assert min(per_category.values()) >= 1200 // len(env.categories)
    for category in env.categories:
        group = [row for row in rows if row["category"] == category]
        right = [row for row in group if row["behaviour"] == "right"]
        assert 0.2 < len(right) / len(group) < 0.55, category
        case_of = env.case_for
        # the right replies pass the rule, the mistakes fail it
        assert all(env.score(row["reply"], case_of(row["prompt"])) >= 1.0 for row in right)
        wrong = [row for row in group if row["behaviour"] != "right"]
        assert wrong and all(env.score(row["reply"], case_of(row["prompt"])) < 1.0
                             for row in wrong)
    # the deterministic corpus and its digest
    again = data.dialogues(RightShare(right=0.35), 1200, 7919)
    assert data.digest(rows) == data.digest(again)
    assert data.digest(rows) != data.digest(data.dialogues(RightShare(right=0.5), 1200, 7919))


def test_copied_words_are_kept_whole_and_probed():
    data = HookStarterData(get_env(LIBRARY))
    rows = data.dialogues(RightShare(), 600, 1)
    words = data.isolated_words(rows)
    assert "Orchard" in words and "The" in words
    records = get_env(LIBRARY).write_prompts(30, 5)
    naming = data.copy_prompts(records)
    assert naming and all(r["category"] != "chitchat" for r in records if r["prompt"] in naming)
    forced, _, span = data.copy_probe(naming[0])
    assert span in naming[0] and forced.startswith("<tool_call>") and span not in forced


def write_env(folder: Path, body: str) -> str:
    path = folder / "my_rule.py"
    path.write_text(textwrap.dedent('''
        import sys
        sys.path.insert(0, %r)
        from dataclasses import dataclass
        import library_env as lib

        @dataclass(frozen=True)
        class Rule(lib.LibraryEnv):
            name: str = "my-rule"
        %s
        ENV = Rule()
    ''') % (str(EXAMPLES), textwrap.indent(textwrap.dedent(body), "    ")))
    return f"{path}:ENV"


def test_an_environment_without_a_reference_agent_gets_one_line_naming_the_hook(
        tmp_path, capsys):
    flag = write_env(tmp_path, "reference_agent = None")
    for command in (["model", "build", "--env", flag],
                    ["grpo", "--env", flag, "--runs-dir", str(tmp_path / "runs")]):
        assert main(command) == 2
        err = capsys.readouterr().err.strip()
        assert len(err.splitlines()) == 1 and "reference_agent" in err, err
    assert not (tmp_path / "runs" / "grpo").exists()
    with pytest.raises(PosttrainError, match="reference_agent"):
        recipe_for("starter", env=flag)


def test_an_environment_without_prompts_is_told_the_hook_and_the_flag(tmp_path, capsys):
    bare = f"{EXAMPLES / 'library_env.py'}:BARE_ENV"
    assert main(["model", "build", "--env", bare]) == 2
    err = capsys.readouterr().err.strip()
    assert len(err.splitlines()) == 1
    assert "write_prompts" in err and "--prompts-file" in err


def test_the_build_key_names_the_environment_and_its_data_not_its_spelling(tmp_path,
                                                                          monkeypatch):
    recipe = recipe_for("starter", env=LIBRARY)
    assert recipe.name == "starter-library" and recipe.data_digest
    monkeypatch.chdir(EXAMPLES.parent)
    relative = recipe_for("starter", env="examples/library_env.py:ENV")
    assert relative.key() == recipe.key()
    assert recipe_for("starter@3", env=LIBRARY).key() != recipe.key()
    # another rule is another starter; the refund rules keep theirs
    assert recipe_for("starter", env=PARCEL).key() != recipe.key()
    changed = write_env(tmp_path, 'system: str = "You are a terse library assistant."')
    assert recipe_for("starter", env=changed).key() != recipe.key()
    assert recipe_for("starter", env="refund").key() == recipe_for("starter").key()
    assert recipe_for("starter", env="refund-multiturn").name == "starter"


@pytest.mark.slow
def test_the_library_starter_passes_its_gate_and_is_partial(library_starter_folder, capsys):
    build = json.loads((library_starter_folder / "build.json").read_text())
    assert build["name"] == "starter-library" and build["gate"] == "passed"
    probe = build["probe"]
    assert probe["copy_rate"] >= 0.8  # titles and loan numbers copied into the call
    for category, rate in probe["pass_rate"].items():
        assert 0.15 <= rate <= 0.80, (category, rate)
    recipe = json.loads((library_starter_folder / "recipe.json").read_text())["recipe"]
    assert recipe["env"] == LIBRARY and recipe["data_digest"]
    assert starter_folder(recipe=recipe_for("starter", env=LIBRARY)) == library_starter_folder
    # built once: the command finds it in the cache
    assert main(["model", "build", "--env", LIBRARY]) == 0
    out = capsys.readouterr().out
    assert "starter-library: already built" in out and "quality gate: passed" in out


def test_a_mix_outside_the_gate_is_steered_toward_it():
    ranges = (("a", 0.15, 0.80), ("b", 0.15, 0.80), ("c", 0.15, 0.80))
    mix = RightShare(right=0.35)
    steered = mix.steered({"a": 0.90, "b": 0.05, "c": 0.40}, ranges)
    assert steered.share("a") < 0.35 < steered.share("b")  # too easy down, too hard up
    assert steered.share("c") == 0.35  # inside its range: left alone
    assert 0.05 <= steered.share("a") and steered.share("b") <= 0.95
    assert mix.steered({"a": 0.5, "b": 0.5, "c": 0.5}, ranges) == mix


def test_a_copied_span_is_the_same_tokens_in_the_prompt_and_in_the_call():
    from posttrain.policy.starters.scratch import train_tokenizer

    data = HookStarterData(get_env(PARCEL))
    rows = data.dialogues(RightShare(), 400, 3)
    tokenizer = train_tokenizer([data.render(row) for row in rows], 1024,
                                data.isolated_words(rows))
    for row in rows:
        for span in row["spans"]:
            span_ids = tokenizer.encode(span, add_special_tokens=False)
            for text in (row["prompt"], row["right_reply"]):
                ids = tokenizer.encode(text, add_special_tokens=False)
                windows = [ids[i:i + len(span_ids)] for i in range(len(ids))]
                assert span_ids in windows, (span, text)


@pytest.mark.slow
def test_eval_with_starter_on_an_environment_reads_its_own_starter(library_starter_folder,
                                                                    tmp_path, capsys):
    out = tmp_path / "rows.jsonl"
    assert main(["eval", "--env", LIBRARY, "--base-model", "starter", "--prompts", "30",
                 "--samples", "2", "--out", str(out)]) == 0
    rows = [json.loads(line) for line in out.read_text().splitlines()]
    assert {row["category"] for row in rows} <= {"title", "loan", "chitchat"}
    # the library's own starter, partial: it passes some replies and fails others
    assert 0 < sum(row["reward"] for row in rows) < len(rows)
    text = capsys.readouterr().out
    assert "title" in text and "loan" in text
