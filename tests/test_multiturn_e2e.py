"""refund-multiturn end to end: GRPO through TRL's tool loop, episode rows, the episode
starter build, and the commands that refuse a multi-turn environment."""

from __future__ import annotations

import json
import random
import shutil
from dataclasses import replace

import pytest

from posttrain.cli import main
from posttrain.envs import get_env

ENV = get_env("refund-multiturn")


@pytest.mark.slow
def test_grpo_trains_episodes_and_reports_them(starter_2m_folder, tmp_path):
    code = main(["grpo", "--env", "refund-multiturn", "--base-model", "starter-2m",
                 "--steps", "2", "--prompts", "40", "--eval-samples", "1", "--eval-repeats", "2",
                 "--monitor-every", "0", "--num-generations", "4", "--batch-size", "8",
                 "--runs-dir", str(tmp_path), "--run-name", "mt"])
    folder = tmp_path / "mt"
    summary = json.loads((folder / "summary.json").read_text())
    assert code == (0 if summary["ok"] else 1)
    assert summary["status"] == "done" and summary["base_model"] == "starter-2m"
    config = json.loads((folder / "config.json").read_text())
    assert config["settings"]["env"] == "refund-multiturn"
    rows = [json.loads(line) for line in (folder / "holdout_after.jsonl").open()]
    assert {row["category"] for row in rows} <= set(ENV.categories)
    for row in rows:
        assert set(row["episode"]) == {"turns", "tool_calls", "failed_calls", "ended"}
        assert 1 <= row["episode"]["turns"] <= ENV.max_turns
        assistant = [m for m in row["transcript"] if m["role"] == "assistant"]
        assert len(assistant) == row["episode"]["turns"]
        # the rule re-scores the stored reply to the stored score
        assert ENV.score(row["reply"], ENV.case_for(row["prompt"])) == row["score"]
    assert set(summary["episodes_before"]) == {"episodes", "turns", "tool_calls",
                                               "failed_calls", "turn_limit"}
    report = (folder / "report.md").read_text()
    assert "## Episodes" in report and "tool calls" in report
    metrics = [json.loads(line) for line in (folder / "metrics.jsonl").open()]
    # TRL's tool loop ran: it logs how often rollouts called a tool
    assert any("tools/call_frequency" in m["metrics"] for m in metrics)


@pytest.mark.slow
def test_tool_results_are_masked_out_of_the_loss(starter_2m, tmp_path):
    """One TRL rollout batch through posttrain's trainer: tool-result tokens get
    tool_mask 0 (no loss), the policy's own tokens 1."""
    from copy import deepcopy

    from posttrain.policy.models import Policy
    from posttrain.train.grpo.settings import GRPOSettings
    from posttrain.train.grpo.trainer import build_grpo_trainer, grpo_dataset
    from posttrain.train.rewards import RuleReward

    policy = Policy(model=deepcopy(starter_2m.model), tokenizer=deepcopy(starter_2m.tokenizer),
                    name="starter-2m", device="cpu", dtype="float32")
    records = [r for r in ENV.write_prompts(60, seed=5) if r["category"] == "eligible"][:4]
    settings = GRPOSettings(steps=1, num_generations=4, batch_size=16, monitor_every=0,
                            env="refund-multiturn")
    trainer = build_grpo_trainer(policy, ENV, records, settings, 3e-4, [], RuleReward(ENV),
                                 output_dir=str(tmp_path))
    batch = list(grpo_dataset(ENV, records))
    batch = [row for row in batch for _ in range(4)]  # 16 rollouts: some look an order up
    output = trainer._generate_and_score_completions(batch)
    mask, completion = output["tool_mask"], output["completion_mask"]
    tokenizer = policy.tokenizer
    with_results = 0
    for row in range(mask.shape[0]):
        ids = output["completion_ids"][row][completion[row].bool()].tolist()
        text = tokenizer.decode(ids)
        masked = [i for i, m in zip(ids, mask[row][completion[row].bool()].tolist(), strict=True)
                  if m == 0]
        if "<tool_response>" in text:
            with_results += 1
            assert "<tool_response>" in tokenizer.decode(masked)
            assert "<tool_call>" not in tokenizer.decode(masked)
        else:
            assert masked == []
    assert with_results > 0  # the starter calls lookup_order on a share of these prompts


@pytest.mark.slow
def test_an_episode_starter_builds_and_plays(starter_2m_folder, monkeypatch, tmp_path):
    # built in a models folder of the test's own, never reused; its base, starter-2m,
    # copied in beside it (the episode build continues the base it finds there)
    models = tmp_path / "models"
    shutil.copytree(starter_2m_folder, models / "starter" / starter_2m_folder.name)
    monkeypatch.setenv("POSTTRAIN_MODELS", str(models))
    from posttrain.policy.loading import load_policy
    from posttrain.policy.starters.build import build_starter
    from posttrain.policy.starters.registry import recipe_for
    from posttrain.policy.tool_turns import renders_tool_turns
    from posttrain.score.rows import grade

    tiny = replace(recipe_for("starter-multiturn"), name="starter-multiturn-tiny",
                   skill_steps=3, mix_steps=3, corpus_situations=40, build_attempts=1,
                   probe_prompts=30)
    folder = build_starter(recipe=tiny, show_progress=False)
    build = json.loads((folder / "build.json").read_text())
    assert build["base"] == "starter-2m" and build["env"] == "refund-multiturn"
    assert build["gate"] in ("passed", "failed")
    assert set(build["probe"]["pass_rate"]) <= set(ENV.categories)
    assert sum(build["behaviour_counts"].values()) == 6 * tiny.batch_size
    policy = load_policy(str(folder), show_progress=False)
    assert renders_tool_turns(policy.tokenizer)
    assert policy.tokenizer.response_template is not None  # saved for TRL's parser
    from posttrain.policy.model_agent import ModelAgent

    rows = grade(ENV, ENV.write_prompts(8, seed=2), ModelAgent(policy), 1)
    assert all("episode" in row for row in rows)


def test_warm_start_episodes_are_what_the_desk_returns():
    from posttrain.envs.wire import join_turns

    rng = random.Random(0)
    scores: dict[str, set[float]] = {}
    for record in ENV.write_prompts(200, seed=7919):
        prompt, move, turns = ENV.starter_dialogue(record["prompt"], False, rng)
        reply = join_turns([t["content"] for t in turns if t["role"] == "assistant"])
        scores.setdefault(move, set()).add(ENV.score(reply, ENV.case_for(prompt)))
        if move == "right":
            assert ENV.score(reply, ENV.case_for(prompt)) == 1.0
    assert scores["right"] == {1.0}
    assert max(scores["wrong_amount"]) < 1.0 and max(scores["prose_ask"]) < 1.0
    assert scores["ask"] == {0.0}  # off topic: asking for an order that does not exist


@pytest.mark.parametrize("command", [
    ["dpo", "--env", "refund-multiturn"],
    ["pairs", "build", "--env", "refund-multiturn", "--out", "x.jsonl"],
    ["primitives-demo", "--env", "refund-multiturn"],
])
def test_single_reply_commands_refuse_episodes(command, capsys, tmp_path, monkeypatch):
    monkeypatch.chdir(tmp_path)
    assert main(command) == 2
    assert "plays multi-turn episodes" in capsys.readouterr().err
    assert list(tmp_path.iterdir()) == []


def test_eval_with_the_scripted_agent_prints_episode_counts(capsys):
    assert main(["eval", "--env", "refund-multiturn", "--agent", "seeded", "--prompts", "60"]) == 0
    out = capsys.readouterr().out
    assert "episodes  turns" in out and "no_id" in out
    assert main(["eval", "--env", "refund-multiturn", "--agent", "seeded", "--prompts", "60",
                 "--json"]) == 0
    payload = json.loads(capsys.readouterr().out)
    assert payload["episodes"]["turns"] >= 1
