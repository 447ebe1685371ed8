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
