"""GRPO's supervised cold start (`--cold-start none|auto|sft`): the decision read from the
base policy's rows, the refusals, and a run on the starter that cold-starts and reports each
phase (posttrain.train.grpo.cold_start, posttrain.train.grpo.cold_start_choice)."""

from __future__ import annotations

import json
from pathlib import Path

import pytest

from posttrain.cli import main
from posttrain.envs import get_env
from posttrain.errors import PosttrainError
from posttrain.train.grpo.cold_start_choice import (
    check_cold_start,
    choose_cold_start,
    read_signal,
)

REFUND = get_env("refund")

NO_REFERENCE_ENV = '''
from posttrain.envs.refund.env import RefundEnv


class NoReference(RefundEnv):
    reference_agent = None  # a hook that is not callable does not count


ENV = NoReference()
'''

NEVER_PASSES_ENV = '''
from posttrain.envs.refund.env import RefundEnv


class NeverPasses(RefundEnv):
    def score(self, reply, case):
        return 0.0  # no reply passes: a self cold start finds nothing


ENV = NeverPasses()
'''


def rows(category: str, scores_by_prompt: list[list[float]], eval_run: int = 0) -> list[dict]:
    """Holdout rows: one group of samples per prompt, a reply passes at score 1.0."""
    return [{"category": category, "eval_run": eval_run, "prompt": f"{category} {n}",
             "score": score, "reward": 1 if score == 1.0 else 0}
            for n, scores in enumerate(scores_by_prompt) for score in scores]


def test_the_signal_counts_passes_and_groups_scored_alike():
    signal = {s.name: s for s in read_signal(
        rows("with_id", [[0.3, 0.3], [0.0, 0.3]]) + rows("no_id", [[1.0, 0.2], [1.0, 1.0]])
        + rows("no_id", [[0.2, 0.2]], eval_run=1))}
    assert (signal["with_id"].replies, signal["with_id"].passed) == (4, 0)
    assert (signal["with_id"].groups, signal["with_id"].all_equal) == (2, 1)
    # the same prompt in another evaluation is another group
    assert (signal["no_id"].replies, signal["no_id"].passed) == (6, 3)
    assert (signal["no_id"].groups, signal["no_id"].all_equal) == (3, 2)
    assert signal["with_id"].words() == "with_id 0/4 passed, 1 of 2 groups all alike"
    # one sample per prompt: no groups to read, passes still count
    single = read_signal(rows("off_topic", [[1.0], [0.3]]))[0]
    assert (single.groups, single.passed, single.words()) == (0, 1, "off_topic 1/2 passed")


def test_auto_cold_starts_when_a_category_is_shown_to_pass_almost_never():
    # 60 replies, none passed: the pass rate's upper bound (0.049) is under the mark
    base = rows("with_id", [[0.3] * 4] * 15) + rows("no_id", [[1.0, 0.2, 0.2, 1.0]] * 2)
    choice = choose_cold_start("auto", REFUND, base)
    assert choice.run
    assert "with_id 0/60 passed, 15 of 15 groups all alike" in choice.reason
    assert "no_id" not in choice.reason  # it passes: not why
    recorded = choice.to_dict()
    assert recorded["run"] is True and {s["name"] for s in recorded["signal"]} == {
        "with_id", "no_id"}


def test_auto_trains_from_the_base_when_every_category_passes_sometimes():
    base = rows("with_id", [[0.3, 1.0]] * 2) + rows("no_id", [[1.0, 0.2]] * 2)
    choice = choose_cold_start("auto", REFUND, base)
    assert not choice.run and "passes on every category" in choice.reason


def test_the_flag_overrides_and_a_from_run_start_is_left_alone():
    never = rows("with_id", [[0.0, 0.0]] * 3)
    assert not choose_cold_start("none", REFUND, never).run
    assert choose_cold_start("sft", REFUND, rows("with_id", [[1.0, 1.0]])).run
    from_run = choose_cold_start("auto", REFUND, never, from_run="smol-sft")
    assert not from_run.run and "--from-run smol-sft" in from_run.reason


def test_the_library_example_without_its_reference_agent_takes_the_self_cold_start():
    """examples/library_env.py:NO_REFERENCE_ENV, the rule issue #69 measures `self` on."""
    example = Path(__file__).resolve().parents[1] / "examples" / "library_env.py"
    unguided = get_env(f"{example}:NO_REFERENCE_ENV")
    assert unguided.categories == ("title", "loan", "chitchat")
    choice = choose_cold_start("auto", unguided, rows("loan", [[0.0, 0.0]] * 30))
    assert choice.run and choice.source == "self"
    guided = choose_cold_start("auto", get_env(f"{example}:ENV"),
                               rows("loan", [[0.0, 0.0]] * 30))
    assert guided.run and guided.source == "reference"


def test_auto_without_a_reference_agent_cold_starts_from_the_policys_own_successes(
        tmp_path, monkeypatch):
    """Issue #69: without a reference agent `auto` said it could not cold-start and
    trained from a base that gave RL nothing; it now takes `self`."""
    (tmp_path / "noref_env.py").write_text(NO_REFERENCE_ENV)
    monkeypatch.syspath_prepend(str(tmp_path))
    env = get_env("noref_env:ENV")
    choice = choose_cold_start("auto", env, rows("with_id", [[0.0, 0.3]] * 30))
    assert choice.run and choice.source == "self" and choice.name == "self"
    assert "has no reference agent: a cold start from the policy's own passing replies" \
        in choice.reason
    assert choice.to_dict()["source"] == "self"
    # the reference agent is taken where there is one; an environment that plays episodes
    # gets no cold start, said
    assert choose_cold_start("auto", REFUND, rows("with_id", [[0.0, 0.3]] * 30)).name == "sft"
    episodes = choose_cold_start("auto", get_env("refund-multiturn"),
                                 rows("with_id", [[0.0, 0.3]] * 30))
    assert not episodes.run and "plays episodes" in episodes.reason
    asked = choose_cold_start("self", REFUND, rows("with_id", [[1.0, 1.0]]))
    assert asked.run and asked.source == "self" and asked.reason == "--cold-start self"
    with pytest.raises(PosttrainError, match="--cold-start self fine-tunes on single replies"):
        check_cold_start("self", get_env("refund-multiturn"))


def test_bad_values_and_sft_without_a_reference_agent_are_refused(tmp_path, monkeypatch,
                                                                  capsys):
    with pytest.raises(PosttrainError, match="--cold-start 'always': expected one of "
                                             "none, auto, sft, self"):
        check_cold_start("always", REFUND)
    with pytest.raises(PosttrainError, match="plays episodes"):
        check_cold_start("sft", get_env("refund-multiturn"))
    # through the command: argparse names the choices, the run folder is never made
    with pytest.raises(SystemExit):
        main(["grpo", "--cold-start", "always"])
    assert "--cold-start" in capsys.readouterr().err
    (tmp_path / "noref_env.py").write_text(NO_REFERENCE_ENV)
    monkeypatch.syspath_prepend(str(tmp_path))
    runs = tmp_path / "runs"
    code = main(["grpo", "--env", "noref_env:ENV", "--cold-start", "sft",
                 "--runs-dir", str(runs), "--run-name", "noref"])
    assert code == 2
    err = capsys.readouterr().err
    assert "has no reference agent to cold-start from" in err and "reference_agent" in err
    assert len(err.strip().splitlines()) == 1
    assert not (runs / "noref").exists()
    assert main(["grpo", "--cold-start-steps", "0", "--runs-dir", str(runs)]) == 2
    assert "--cold-start-steps must be at least 1" in capsys.readouterr().err


@pytest.mark.slow
def test_a_cold_started_run_reports_each_phase(starter_2m_folder, tmp_path, capsys):
    runs = tmp_path / "runs"
    code = main(["grpo", "--base-model", "starter-2m", "--prompts", "40", "--eval-samples", "2",
                 "--eval-repeats", "2", "--steps", "2", "--num-generations", "4",
                 "--monitor-every", "0", "--cold-start", "sft", "--cold-start-steps", "3",
                 "--cold-start-balance", "0.4", "--runs-dir", str(runs), "--run-name", "cold"])
    assert code in (0, 1)
    out = capsys.readouterr().out
    folder = runs / "cold"
    summary = json.loads((folder / "summary.json").read_text())
    config = json.loads((folder / "config.json").read_text())
    assert summary["status"] == "done"
    assert summary["cold_start"]["run"] and summary["cold_start"]["steps"] == 3
    assert config["settings"]["cold_start"] == "sft"
    assert config["cold_start"]["reason"] == "--cold-start sft"
    # the phases: base -> cold start, cold start -> after RL (the verdict), base -> after
    phases = summary["phases"]
    assert phases["rl"]["verdict"] == summary["verdict"]
    assert {"cold_start", "whole_run", "base"} <= set(phases)
    cold_rows = [json.loads(line) for line in (folder / "holdout_cold_start.jsonl").open()]
    # the base is evaluated once (the cold start decided on it), the cold-started policy,
    # RL's baseline, --eval-repeats times (its noise band is the RL verdict's)
    base_rows = [json.loads(line) for line in (folder / "holdout_before.jsonl").open()]
    assert {row["eval_run"] for row in base_rows} == {0}
    assert {row["eval_run"] for row in cold_rows} == {0, 1}
    assert summary["before"]["pass_at_1"] == pytest.approx(
        sum(row["reward"] for row in cold_rows) / len(cold_rows), abs=0.2)
    assert (folder / "merged" / "config.json").is_file()
    # --cold-start-balance: the minority categories' prompts repeated in the demonstrations
    # (each copy's demonstration kept), not in RL's train split
    demos = [json.loads(line) for line in (folder / "cold_start_demos.jsonl").open()]
    prompts = [demo["prompt"][-1]["content"] for demo in demos]
    assert len(prompts) > len(set(prompts))
    refund = get_env("refund")
    shares = {}
    for prompt in prompts:
        category = refund.category(refund.case_for(prompt))
        shares[category] = shares.get(category, 0) + 1 / len(prompts)
    assert min(shares.values()) >= 0.2, shares
    assert config["settings"]["cold_start_balance"] == 0.4
    assert "== cold start (base -> cold start)" in out
    assert "== RL (cold start -> after RL): the run's verdict" in out
    assert "whole run (base -> after RL):" in out
    report = (folder / "report.md").read_text()
    assert "## Cold start" in report and "Cold start (base -> cold start)" in report
    assert summary["timings"]["cold_start_s"] > 0
    # --from-run of a cold-started run stacks on its merged policy, without a new cold start
    code = main(["grpo", "--from-run", "cold", "--prompts", "40", "--eval-samples", "2",
                 "--eval-repeats", "1", "--steps", "1", "--num-generations", "4",
                 "--monitor-every", "0", "--runs-dir", str(runs), "--run-name", "after-cold"])
    assert code in (0, 1)
    again = json.loads((runs / "after-cold" / "summary.json").read_text())
    assert not again["cold_start"]["run"] and "phases" not in again


def test_the_cold_start_rate_follows_the_model_size_unless_given():
    from posttrain.train.grpo.cold_start import cold_start_learning_rate
    from posttrain.train.grpo.settings import GRPOSettings

    settings = GRPOSettings()
    assert cold_start_learning_rate(settings, 134_500_000) == 5e-4  # SmolLM2
    assert cold_start_learning_rate(settings, 9_100_000) == 1e-3  # the starter
    assert cold_start_learning_rate(settings, 7_000_000_000) == 2e-5
    settings.cold_start_learning_rate = 3e-4
    assert cold_start_learning_rate(settings, 134_500_000) == 3e-4
    assert main(["grpo", "--cold-start-learning-rate", "0"]) == 2
    with pytest.raises(SystemExit):  # not a number at all: argparse says so
        main(["grpo", "--cold-start-learning-rate", "nan"])


class _Lenient(type(REFUND)):
    """The refund rule, but every reply passes (or, with ``strict``, none does)."""

    def __init__(self, strict: bool = False) -> None:
        super().__init__()
        self.strict = strict

    def score(self, reply, case):
        return 0.0 if self.strict else 1.0


def _callback(policy, env, *, until=0.5, every=5, steps=40, said=None):
    from posttrain.data.prepare import DataConfig, prepare_data
    from posttrain.policy.sampler import SamplingParams
    from posttrain.train.grpo.cold_start_check import ColdStartCheck, check_prompts

    train = prepare_data(DataConfig(prompts=40, seed=0), REFUND).train
    return ColdStartCheck(env=env, prompts=check_prompts(env, train, seed=0, per_category=2),
                          policy=policy,
                          sampling=SamplingParams(temperature=0.8, top_p=0.95, max_new_tokens=24),
                          steps=steps, until=until, every=every,
                          say=(said.append if said is not None else lambda _line: None))


def _step(callback, step):
    from types import SimpleNamespace

    control = SimpleNamespace(should_training_stop=False)
    callback.on_step_end(None, SimpleNamespace(global_step=step), control)
    return control.should_training_stop


def test_the_cold_start_checks_from_half_its_steps_and_stops_at_the_mark(starter_2m):
    import torch

    from posttrain.train.grpo.cold_start_check import first_check_step

    assert first_check_step(40, 5) == 20 and first_check_step(40, 3) == 21
    assert first_check_step(3, 5) == 5 and first_check_step(1, 1) == 1
    said: list[str] = []
    lenient = _callback(starter_2m, _Lenient(), said=said)
    # before half the steps, off the check's beat, or at the last step: no check
    assert not any(_step(lenient, step) for step in (5, 10, 19, 21, 40)) and not said
    state = torch.get_rng_state()
    assert _step(lenient, 20)  # every category passes: the cold start stops here
    assert torch.equal(torch.get_rng_state(), state)  # training's RNG is left as it was
    assert lenient.stopped_at == 20 and len(lenient.checks) == 1
    assert set(lenient.checks[0].by_category) == {"with_id", "no_id", "off_topic"}
    assert "step 20: train sample" in said[0] and "cold start stops here" in said[0]
    record = lenient.to_dict()
    assert record["stopped_at"] == 20 and record["checks"][0]["by_category"]["no_id"] == {
        "passed": 2, "replies": 2}
    strict = _callback(starter_2m, _Lenient(strict=True))
    assert not _step(strict, 20) and not _step(strict, 25) and strict.stopped_at is None
    assert len(strict.checks) == 2
    # until 0 or every 0: no check at all
    assert not _callback(starter_2m, _Lenient(), until=0).active
    assert not _step(_callback(starter_2m, _Lenient(), every=0), 20)


def test_cold_start_until_and_check_every_are_checked():
    assert main(["grpo", "--cold-start-until", "1.5"]) == 2
    assert main(["grpo", "--cold-start-balance", "1"]) == 2
    with pytest.raises(SystemExit):  # argparse refuses a share that is no finite number
        main(["grpo", "--cold-start-balance", "nan"])
    assert main(["grpo", "--cold-start-check-every", "-1"]) == 2


@pytest.mark.slow
def test_a_self_cold_start_finds_trains_on_and_records_the_policys_passing_replies(
        starter_2m_folder, tmp_path, capsys):
    """Issue #69, item 1: `--cold-start self` samples the train prompts of the categories
    the base does not pass, keeps the replies the rule passes, fine-tunes on them, and
    repeats while rounds find more; it says per category what it found in how many
    samples. (The environment's reference agent is never asked.)"""
    runs = tmp_path / "runs"
    code = main(["grpo", "--base-model", "starter-2m", "--prompts", "40", "--eval-samples", "1",
                 "--eval-repeats", "1", "--steps", "1", "--num-generations", "2",
                 "--monitor-every", "0", "--cold-start", "self", "--cold-start-prompts", "6",
                 "--cold-start-samples", "6", "--cold-start-rounds", "3",
                 "--runs-dir", str(runs), "--run-name", "self"])
    assert code in (0, 1)
    out = capsys.readouterr().out
    folder = runs / "self"
    summary = json.loads((folder / "summary.json").read_text())
    assert summary["status"] == "done"
    mining = summary["cold_start"]["self"]
    assert summary["cold_start"]["source"] == "self"
    rounds = mining["rounds"]
    assert 1 <= len(rounds) <= 3
    assert "  cold start: self (--cold-start self)" in out
    for entry in rounds:
        for find in entry["categories"]:
            assert find["samples"] == find["prompts"] * 6 and find["prompts"] <= 6
            assert find["passed"] <= find["samples"]
            assert find["opened_passed"] <= find["opened_samples"]
            # a category the plain samples found nothing in is sampled again, opened by
            # a tool call (tests/test_cold_start_hint.py)
            assert find["opened_samples"] in (0, find["samples"])
            assert find["opened_samples"] == 0 or find["passed"] == 0
            assert find["new"] <= find["passed"] + find["opened_passed"]
        assert f"cold start (self): round {entry['round']}: " in out
    # the rounds end when one finds nothing new (or at the third)
    assert len(rounds) == 3 or not any(find["new"] for find in rounds[-1]["categories"])
    demos = [json.loads(line) for line in (folder / "cold_start_demos.jsonl").open()]
    found = sum(find["new"] for entry in rounds for find in entry["categories"])
    # the anchors: the categories the base passes, sampled once (2 a prompt), their
    # passing replies joined to the mined ones, up to a mined category's mean
    anchors = mining["anchors"]
    assert anchors and {find["name"] for find in anchors} <= set(REFUND.categories) - set(
        mining["categories"])  # those of the base's evaluation (40 prompts: not all)
    assert all(find["samples"] == find["prompts"] * 2 for find in anchors)
    mined = [demo for demo in demos if demo["category"] in mining["categories"]]
    anchored = [demo for demo in demos if demo["category"] not in mining["categories"]]
    assert len(mined) == found and len(demos) == summary["cold_start"]["demos"]
    each = -(-found // len(mining["categories"])) if found else 0
    for find in anchors:
        used = sum(demo["category"] == find["name"] for demo in anchored)
        assert used == min(each, find["new"])
    if anchors:
        assert "cold start (self): anchors, to hold what the base passes: " in out
    # seeded, on the suite's pinned kernels: the same find on every CPU with AVX2
    assert found >= 1
    # every reply trained on passes the rule, and none is of a holdout scenario
    refund = get_env("refund")
    holdout = {json.loads(line)["scenario_id"] for line in (folder / "holdout_before.jsonl").open()}
    for demo in demos:
        prompt = demo["prompt"][-1]["content"]
        assert refund.score(demo["completion"][0]["content"], refund.case_for(prompt)) == 1.0
        assert demo["scenario_id"] not in holdout
    if demos:
        assert (folder / "merged" / "config.json").is_file()
        assert summary["cold_start"]["steps"] == sum(entry["steps"] for entry in rounds)
    assert "== cold start (base -> cold start)" in out


@pytest.mark.slow
def test_a_self_cold_start_that_keeps_nothing_reuses_the_bases_evaluation(
        starter_2m_folder, tmp_path, capsys):
    """Issue #69: when no reply passes, the policy is unchanged: nothing is saved as
    merged/, and the base's evaluation stands for the cold start's first (only the repeat
    the base did not take is sampled). Before, the unchanged policy was saved and
    evaluated again in full (ten minutes of SmolLM2)."""
    (tmp_path / "never_env.py").write_text(NEVER_PASSES_ENV)
    runs = tmp_path / "runs"
    code = main(["grpo", "--env", f"{tmp_path / 'never_env.py'}:ENV",
                 "--base-model", "starter-2m", "--prompts", "40", "--eval-samples", "1",
                 "--eval-repeats", "2", "--steps", "1", "--num-generations", "2",
                 "--monitor-every", "0", "--cold-start", "self", "--cold-start-prompts", "2",
                 "--cold-start-samples", "2", "--runs-dir", str(runs), "--run-name", "never"])
    assert code in (0, 1)
    out = capsys.readouterr().out
    folder = runs / "never"
    summary = json.loads((folder / "summary.json").read_text())
    assert summary["status"] == "done" and summary["cold_start"]["demos"] == 0
    [round_one] = summary["cold_start"]["self"]["rounds"]
    assert "no reply passed in any category: the policy is unchanged" in out
    # the plain samples found nothing, so each category was sampled again with the reply
    # opened by a tool call (the hint's own tests: tests/test_cold_start_hint.py)
    assert round_one["categories"] and all(
        find["opened_samples"] == find["samples"] > 0 and find["opened_passed"] == 0
        for find in round_one["categories"])
    assert "with the reply opened by a call of one of its" in out
    assert not (folder / "merged").exists()
    before = [json.loads(line) for line in (folder / "holdout_before.jsonl").open()]
    cold = [json.loads(line) for line in (folder / "holdout_cold_start.jsonl").open()]
    # the plan took one base evaluation; the cold start's two are that one and repeat 1
    assert {row["eval_run"] for row in before} == {0}
    assert [row for row in cold if row["eval_run"] == 0] == before
    later = [row for row in cold if row["eval_run"] == 1]
    assert len(later) == len(before)
    assert [row["prompt"] for row in later] == [row["prompt"] for row in before]
    assert summary["timings"]["cold_start_s"] > 0
