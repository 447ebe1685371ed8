"""SignalWatch: what share of each GRPO step's groups had no signal, and its one alarm."""

from types import SimpleNamespace

import pytest

pytest.importorskip("transformers")

from posttrain.train.signal_watch import SignalWatch


class Recorder:
    def __init__(self):
        self.alarms = []

    def alarm(self, kind, step, message, details):
        self.alarms.append((kind, step))


def feed(watch, shares, spread=0.2):
    for step, share in enumerate(shares, start=1):
        watch.on_log(None, SimpleNamespace(global_step=step), None,
                     logs={"frac_reward_zero_std": share, "reward_std": spread, "loss": 0.0})


def test_dead_groups_for_five_steps_raise_one_no_signal_alarm():
    run = Recorder()
    watch = SignalWatch(run)
    feed(watch, [1.0] * 8, spread=0.0)
    assert run.alarms == [("no_signal", 5)]  # once, at the fifth dead step
    assert watch.summary() == {"steps": 8, "dead_group_share": 1.0, "reward_spread": 0.0,
                               "alarm": True}
    assert watch.describe().startswith("signal: 100% of groups had all-equal rewards")


def test_a_run_with_signal_is_summed_up_without_an_alarm():
    run = Recorder()
    watch = SignalWatch(run)
    feed(watch, [0.5, 0.25, 0.25, 0.0])
    watch.on_log(None, SimpleNamespace(global_step=4), None, logs={"train_runtime": 9.0})
    assert run.alarms == [] and watch.summary()["dead_group_share"] == 0.25
    assert watch.summary()["steps"] == 4  # the end-of-training log is not a step
