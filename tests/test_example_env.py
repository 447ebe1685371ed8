"""A user's environment (examples/library_env.py) through every command the built-in one
takes: prompts, eval, pairs, the reward audit, grpo, dpo and the primitives demo."""

import json
from pathlib import Path

import pytest

from posttrain.cli import main
from posttrain.envs import get_env, rewarded_features
from posttrain.score.audit import reward_audit

EXAMPLE = Path(__file__).resolve().parents[1] / "examples" / "library_env.py"
ENV_FLAG = f"{EXAMPLE}:ENV"
BARE_FLAG = f"{EXAMPLE}:BARE_ENV"
LIBRARY = get_env(ENV_FLAG)


def read_jsonl(path):
    return [json.loads(line) for line in Path(path).read_text().splitlines() if line.strip()]


def test_the_example_is_an_environment_with_its_own_categories_and_tools():
    assert LIBRARY.name == "library" and LIBRARY.categories == ("title", "loan", "chitchat")
    assert {tool["function"]["name"] for tool in LIBRARY.tools} == {"search_catalog",
                                                                    "renew_loan"}
    case = LIBRARY.case_for('Is "The Quiet Orchard" on the shelves today?')
    call = '<tool_call>\n{"name": "search_catalog", "arguments": {"title": "the quiet orchard"}}'
    assert LIBRARY.score(call + "\n</tool_call>", case) == 1.0
    assert LIBRARY.score(call, case) == 0.0  # a broken block


def test_prompt_commands_read_the_environments_categories(tmp_path, capsys):
    prompts = tmp_path / "library.jsonl"
    assert main(["prompts", "write", str(prompts), "--env", ENV_FLAG, "--prompts", "90"]) == 0
    written = capsys.readouterr().out
    records = read_jsonl(prompts)
    assert {r["category"] for r in records} == {"title", "loan", "chitchat"}
    counted = {c: sum(r["category"] == c for r in records) for c in LIBRARY.categories}
    assert (f"(title {counted['title']}, loan {counted['loan']}, "
            f"chitchat {counted['chitchat']})") in written  # the environment's order
    assert main(["prompts", "stats", str(prompts), "--env", ENV_FLAG, "--json"]) == 0
    counts = json.loads(capsys.readouterr().out)
    assert counts["prompts"] == len(records) and counts["title"] + counts["loan"] + counts[
        "chitchat"] == len(records)
    train, holdout = tmp_path / "train.jsonl", tmp_path / "holdout.jsonl"
    assert main(["prompts", "split", str(prompts), "--env", ENV_FLAG, "--stratified",
                 "--train-out", str(train), "--holdout-out", str(holdout)]) == 0
    assert {r["category"] for r in read_jsonl(holdout)} == {"title", "loan", "chitchat"}
    kept = tmp_path / "kept.jsonl"
    assert main(["prompts", "filter", str(prompts), str(kept), "--env", ENV_FLAG]) == 0
    assert "dropped 0 outside their seed's category" in capsys.readouterr().out


def test_eval_with_the_environments_scripted_agent(tmp_path, capsys):
    rows = tmp_path / "rows.jsonl"
    assert main(["eval", "--env", ENV_FLAG, "--prompts", "150", "--out", str(rows)]) == 0
    out = capsys.readouterr().out
    assert "by category" in out and "title" in out and "loan" in out
    graded = read_jsonl(rows)
    assert {row["category"] for row in graded} <= {"title", "loan", "chitchat"}
    assert graded[0]["policy"]["agent"] == "library-scripted"
    # its own moves, checked by the environment; the refund moves are not its
    assert main(["eval", "--env", ENV_FLAG, "--behaviour", "title=invent:0.5"]) == 2
    assert "unknown move 'invent'; use right, wrong_tool, chatter" in capsys.readouterr().err
    assert main(["eval", "--env", ENV_FLAG, "--behaviour", "with_id=right:0.5"]) == 2
    assert "use one of title, loan, chitchat" in capsys.readouterr().err


def test_an_environment_without_a_prompt_writer_asks_for_a_prompts_file(tmp_path, capsys):
    runs = tmp_path / "runs"
    for argv in (["eval", "--env", BARE_FLAG],
                 ["grpo", "--env", BARE_FLAG, "--base-model", "starter-2m", "--runs-dir",
                  str(runs)],
                 ["prompts", "write", str(tmp_path / "p.jsonl"), "--env", BARE_FLAG]):
        assert main(argv) == 2, argv
        err = capsys.readouterr().err
        assert "environment 'library' writes no prompts (no write_prompts hook)" in err, argv
    assert not runs.exists() and not (tmp_path / "p.jsonl").exists()
    prompts = tmp_path / "library.jsonl"
    main(["prompts", "write", str(prompts), "--env", ENV_FLAG, "--prompts", "90"])
    capsys.readouterr()
    assert main(["eval", "--env", BARE_FLAG, "--prompts-file", str(prompts)]) == 0
    assert "holdout pass@1" in capsys.readouterr().out


def test_a_missing_or_wrong_environment_is_named(capsys, tmp_path):
    assert main(["eval", "--env", f"{tmp_path}/nowhere.py:ENV"]) == 2
    assert "no such file" in capsys.readouterr().err
    assert main(["eval", "--env", f"{EXAMPLE}:TOOLS"]) == 2
    assert "is not an environment: it lacks name, categories" in capsys.readouterr().err


def test_pairs_from_the_scripted_agent_with_the_environments_negatives(tmp_path, capsys):
    out = tmp_path / "pairs.jsonl"
    assert main(["pairs", "build", "--out", str(out), "--env", ENV_FLAG, "--prompts", "150",
                 "--constructed-negatives", "--constructed-share", "1.0"]) == 0
    pairs = read_jsonl(out)
    constructed = [pair for pair in pairs if pair["constructed"]]
    assert pairs and constructed
    for pair in constructed:  # the library's negative: a search nobody asked for
        assert LIBRARY.category(LIBRARY.case_for(pair["prompt"][-1]["content"])) == "chitchat"
        assert '"search_catalog"' in pair["rejected"][0]["content"]


def test_the_reward_audit_reads_the_environments_design():
    agent = LIBRARY.scripted_agent(seed=0)
    records = LIBRARY.write_prompts(150, seed=0)
    rows = []
    for sample in range(6):
        replies = agent.reply_batch([LIBRARY.messages_for(r["prompt"]) for r in records],
                                    [sample] * len(records))
        for record, reply in zip(records, replies, strict=True):
            rows.append({**record, "reply": reply,
                         "score": LIBRARY.score(reply, record["case"])})
    audit = reward_audit(rows, lambda category: rewarded_features(LIBRARY, category))
    assert set(audit.scanned) == {"title", "loan", "chitchat"}
    assert "tool:search_catalog" in audit.endorsed["title"]
    # the rule pays for the right tool by design: no finding names it
    assert not [f for f in audit.findings if f.feature in ("tool:search_catalog",
                                                           "tool:renew_loan")]


@pytest.mark.slow
def test_grpo_and_dpo_train_on_the_example(library_starter_folder, tmp_path):
    # no --base-model: the example's own starter, built from its hooks (conftest); the
    # refund starters behave on this rule however float rounding makes them (issue #28)
    runs = tmp_path / "runs"
    fast = ["--env", ENV_FLAG, "--prompts", "60", "--eval-samples", "1",
            "--runs-dir", str(runs)]
    code = main(["grpo", *fast, "--steps", "3", "--num-generations", "4",
                 "--monitor-every", "1", "--run-name", "lib-grpo"])
    summary = json.loads((runs / "lib-grpo" / "summary.json").read_text())
    assert code == (0 if summary["ok"] else 1) and summary["status"] == "done"
    config = json.loads((runs / "lib-grpo" / "config.json").read_text())
    assert config["settings"]["base_model"] == "starter"
    assert {g["name"] for g in summary["by_category_before"]} <= {"title", "loan", "chitchat"}
    # a partial base policy: its groups disagree, so GRPO has advantages to follow
    assert summary["signal"]["dead_group_share"] < 0.9
    assert summary["reward_audit"]["endorsed"]["loan"][-2:] == ["tool:renew_loan", "tool_call"]
    assert len(summary["monitor"]["checks"]) == 3
    code = main(["dpo", *fast, "--steps", "2", "--pair-samples", "4", "--run-name", "lib-dpo"])
    summary = json.loads((runs / "lib-dpo" / "summary.json").read_text())
    # the starter's samples disagree: DPO finds pairs on its own samples
    assert summary["status"] == "done" and summary["recipe"] == "dpo"
    assert {g["name"] for g in summary["by_category_after"]} <= {"title", "loan", "chitchat"}


@pytest.mark.slow
def test_the_primitives_demo_runs_the_example(starter_2m_folder, tmp_path):
    from posttrain.service.demo import DemoSettings, run_demo

    settings = DemoSettings(base_model="starter-2m", env=ENV_FLAG, prompts=60, cycles=2,
                            groups_per_cycle=2, num_samples=4, max_tokens=16, eval_prompts=6,
                            eval_samples=2, out=str(tmp_path))
    summary = run_demo(settings, say=lambda line: None)
    assert summary["status"] == "finished"
    rows = read_jsonl(tmp_path / "holdout_after.jsonl")
    assert {row["category"] for row in rows} <= {"title", "loan", "chitchat"}
