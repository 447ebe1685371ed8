"""SignalWatch: what share of each GRPO step's groups had no signal, and its one alarm."""

from types import SimpleNamespace

import pytest

pytest.importorskip("transformers")

from posttrain.train.grpo.signal_watch import SignalWatch


class Recorder:
    def __init__(self):
        self.alarms = []

    def alarm(self, kind, step, message, details):
        self.alarms.append((kind, step))


def feed(watch, shares, spread=0.2, rewards=None):
    for step, share in enumerate(shares, start=1):
        logs = {"frac_reward_zero_std": share, "reward_std": spread, "loss": 0.0}
        if rewards is not None:
            logs["reward"] = rewards[step - 1]
        watch.on_log(None, SimpleNamespace(global_step=step), None, logs=logs)


def test_dead_groups_for_five_steps_raise_one_no_signal_alarm():
    run = Recorder()
    watch = SignalWatch(run)
    feed(watch, [1.0] * 8, spread=0.0)
    assert run.alarms == [("no_signal", 5)]  # once, at the fifth dead step
    assert watch.summary() == {"steps": 8, "dead_group_share": 1.0, "reward_spread": 0.0,
                               "alarm": True}
    assert watch.describe().startswith("signal: 100% of groups had all-equal rewards")


def test_groups_that_agree_because_the_policy_learned_raise_no_alarm():
    # signal first, then every group passes: learned, not stuck
    run = Recorder()
    feed(SignalWatch(run), [0.4, 0.5] + [1.0] * 6, rewards=[0.5, 0.7] + [0.97] * 6)
    assert run.alarms == []
    # the same dead steps at a middling reward: stuck
    run = Recorder()
    feed(SignalWatch(run), [0.4, 0.5] + [1.0] * 6, rewards=[0.5, 0.7] + [0.5] * 6)
    assert run.alarms == [("no_signal", 7)]
    # a reward that pays everything from the start never had signal: still an alarm
    run = Recorder()
    feed(SignalWatch(run), [1.0] * 6, rewards=[1.0] * 6)
    assert run.alarms == [("no_signal", 5)]


def test_a_run_with_signal_is_summed_up_without_an_alarm():
    run = Recorder()
    watch = SignalWatch(run)
    feed(watch, [0.5, 0.25, 0.25, 0.0])
    watch.on_log(None, SimpleNamespace(global_step=4), None, logs={"train_runtime": 9.0})
    assert run.alarms == [] and watch.summary()["dead_group_share"] == 0.25
    assert watch.summary()["steps"] == 4  # the end-of-training log is not a step


REWARDS = '''
def flat_without_an_id(reply, case):
    """Constant on prompts that carry no order id: those groups can teach nothing."""
    if case.get("order_id") is None:
        return 0.5
    return 1.0 if "lookup_order" in reply else 0.0


def flat_everywhere(reply, case):
    return 0.0
'''


@pytest.mark.slow
def test_a_real_grpo_run_counts_dead_groups_and_alarms_when_all_are_dead(
        starter_2m_folder, tmp_path):
    import json

    from posttrain.cli import main

    (tmp_path / "rewards.py").write_text(REWARDS)
    common = ["--base-model", "starter-2m", "--prompts", "60", "--eval-samples", "1",
              "--eval-repeats", "1", "--monitor-every", "0", "--num-generations", "4",
              "--runs-dir", str(tmp_path / "runs")]
    main(["grpo", *common, "--steps", "2", "--run-name", "some-dead",
          "--reward", f"{tmp_path / 'rewards.py'}:flat_without_an_id"])
    some = json.loads((tmp_path / "runs" / "some-dead" / "summary.json").read_text())
    # the groups of prompts without an id are dead, the others mostly are not
    assert 0.0 < some["signal"]["dead_group_share"] < 1.0
    assert not [a for a in some["alarms"] if a["kind"] == "no_signal"]

    main(["grpo", *common, "--steps", "5", "--run-name", "all-dead",
          "--reward", f"{tmp_path / 'rewards.py'}:flat_everywhere"])
    dead = json.loads((tmp_path / "runs" / "all-dead" / "summary.json").read_text())
    assert dead["signal"]["dead_group_share"] == 1.0
    [alarm] = [a for a in dead["alarms"] if a["kind"] == "no_signal"]
    assert alarm["step"] == 5 and "teach nothing" in alarm["message"]
    assert "Learning signal" in (tmp_path / "runs" / "all-dead" / "report.md").read_text()


class Rows:
    """What SignalWatch reads of the reward: every row scored so far, in order."""

    def __init__(self):
        self.history = []

    def step(self, passed, failed=0, custom=False, category="a"):
        for ok in [True] * passed + [False] * failed:
            row = {"score": 1.0 if ok else 0.3, "category": category}
            if custom:  # trained on --reward: the rule's own score is the pass
                row = {"score": 0.5, "rule_score": row["score"]}
            self.history.append(row)


def stop_run(steps):
    """Feed (dead share, passed, failed) steps; the step training stopped after, or None."""
    reward = Rows()
    watch = SignalWatch(Recorder(), reward=reward, stop_when_solved=3)
    for number, (share, passed, failed) in enumerate(steps, start=1):
        reward.step(passed, failed)
        control = SimpleNamespace(should_training_stop=False)
        watch.on_log(None, SimpleNamespace(global_step=number), control,
                     logs={"frac_reward_zero_std": share, "reward": 1.0})
        if control.should_training_stop:
            return number, watch
    return None, watch


def test_three_solved_steps_in_a_row_end_training_after_the_third():
    stopped, watch = stop_run([(0.5, 6, 2), (1.0, 8, 0), (1.0, 8, 0), (0.75, 7, 1),
                               (1.0, 8, 0), (1.0, 8, 0), (1.0, 8, 0), (1.0, 8, 0)])
    assert stopped == 7  # the streak broken at step 4 starts again at 5
    assert watch.summary()["solved_at"] == 7
    line = watch.stop_line(40)
    assert line.startswith("training: stopped after step 7 of 40: every completion of the "
                           "last 3 steps passed the rule")
    assert "every category" not in line  # none named: no category condition
    assert watch.stop_line(7) is None  # the run's last step anyway: nothing to say


def test_dead_groups_that_fail_or_a_step_with_no_rows_do_not_count_as_solved():
    # every group alike, but alike at failing: stuck, not solved (the no-signal alarm's case)
    assert stop_run([(1.0, 0, 8)] * 6)[0] is None
    # one failing completion in an otherwise dead step breaks the streak
    assert stop_run([(1.0, 8, 0), (1.0, 8, 0), (1.0, 7, 1), (1.0, 8, 0), (1.0, 8, 0)])[0] \
        is None
    # a step that scored nothing here neither counts nor breaks the streak
    stopped, _ = stop_run([(1.0, 8, 0), (1.0, 0, 0), (1.0, 8, 0), (1.0, 8, 0)])
    assert stopped == 4


def test_under_another_reward_the_rules_own_score_says_solved_and_zero_turns_it_off():
    reward = Rows()
    watch = SignalWatch(Recorder(), reward=reward, stop_when_solved=2)
    stops = []
    for number in (1, 2):
        reward.step(8, custom=True)
        control = SimpleNamespace(should_training_stop=False)
        watch.on_log(None, SimpleNamespace(global_step=number), control,
                     logs={"frac_reward_zero_std": 1.0})
        stops.append(control.should_training_stop)
    assert stops == [False, True]
    off = SignalWatch(Recorder(), reward=reward, stop_when_solved=0)
    control = SimpleNamespace(should_training_stop=False)
    for number in range(1, 6):
        reward.step(8)
        off.on_log(None, SimpleNamespace(global_step=number), control,
                   logs={"frac_reward_zero_std": 1.0})
    assert not control.should_training_stop and off.stopped_at is None


LENIENT_ENV = '''
from posttrain.envs.refund.env import RefundEnv


class Lenient(RefundEnv):
    """Every reply passes: from the first step there is nothing left to learn."""

    name = "lenient"

    def score(self, reply, case):
        return 1.0


ENV = Lenient()
'''


@pytest.mark.slow
def test_a_run_whose_every_reply_passes_stops_when_solved(starter_2m_folder, tmp_path,
                                                          monkeypatch, capsys):
    import json

    from posttrain.cli import main

    (tmp_path / "lenient_env.py").write_text(LENIENT_ENV)
    monkeypatch.syspath_prepend(str(tmp_path))
    runs = tmp_path / "runs"
    code = main(["grpo", "--env", "lenient_env:ENV", "--base-model", "starter-2m",
                 "--prompts", "40", "--eval-samples", "1", "--eval-repeats", "1",
                 "--monitor-every", "0", "--num-generations", "4", "--steps", "12",
                 "--stop-when-solved", "2", "--runs-dir", str(runs), "--run-name", "solved"])
    assert code in (0, 1)
    out = capsys.readouterr().out
    summary = json.loads((runs / "solved" / "summary.json").read_text())
    assert summary["status"] == "done"
    # two solved steps at least, and as many more as it takes to draw all three categories
    solved_at = summary["signal"]["solved_at"]
    assert 2 <= solved_at < 12 and summary["signal"]["steps"] == solved_at
    assert f"training: stopped after step {solved_at} of 12" in out
    assert "prompts of every category among them" in out
    config = json.loads((runs / "solved" / "config.json").read_text())
    assert config["settings"]["stop_when_solved"] == 2


def test_a_policy_trained_before_rl_that_passes_everything_raises_no_alarm():
    # a cold start (or --from-run) that already solved the rule: dead because it learned
    run = Recorder()
    feed(SignalWatch(run, trained_before=True), [1.0] * 6, rewards=[1.0] * 6)
    assert run.alarms == []
    # stuck at a middling reward after one: still an alarm
    run = Recorder()
    feed(SignalWatch(run, trained_before=True), [1.0] * 6, rewards=[0.4] * 6)
    assert run.alarms == [("no_signal", 5)]


def test_a_solved_streak_must_have_drawn_every_category():
    """The library example stopped at step 6 with its chitchat prompts never drawn in the
    streak, and failing: a streak counts only once it has seen every train category."""
    reward = Rows()
    watch = SignalWatch(Recorder(), reward=reward, stop_when_solved=2,
                        categories=frozenset({"loan", "chitchat"}))
    stops = []
    for number, category in enumerate(["loan", "loan", "loan", "chitchat", "loan"], 1):
        reward.step(8, category=category)
        control = SimpleNamespace(should_training_stop=False)
        watch.on_log(None, SimpleNamespace(global_step=number), control,
                     logs={"frac_reward_zero_std": 1.0})
        stops.append(control.should_training_stop)
    assert stops == [False, False, False, True, False][:len(stops)]
    assert watch.stopped_at == 4
    assert "last 4 steps passed the rule and every group scored alike, prompts of every " \
        "category among them" in watch.stop_line(40)
