"""TrainerCallback driven by real transformers TrainingArguments, TrainerState, TrainerControl."""

from __future__ import annotations

import pytest

pytest.importorskip("transformers")

from transformers import TrainerControl, TrainerState, TrainingArguments

from posttrain.runs.store import NullRun, SqliteRunStore, open_run
from posttrain.train.callbacks import METRIC_NAMES, TrainerCallback, map_trainer_logs

# one on_log payload of TRL 1.16 GRPOTrainer, keys as listed in reference/spike.md section 4
GRPO_LOGS = {
    "loss": 0.0123, "grad_norm": 0.81, "learning_rate": 0.002, "num_tokens": 4096.0,
    "completions/mean_length": 27.5, "completions/min_length": 12.0,
    "completions/max_length": 48.0, "completions/clipped_ratio": 0.125,
    "completions/mean_terminated_length": 25.0, "completions/min_terminated_length": 12.0,
    "completions/max_terminated_length": 40.0, "rewards/rule_reward/mean": 0.41,
    "rewards/rule_reward/std": 0.3, "reward": 0.41, "reward_std": 0.3,
    "frac_reward_zero_std": 0.5, "kl": 0.0031, "entropy": 1.9, "clip_ratio/low_mean": 0.0,
    "clip_ratio/low_min": 0.0, "clip_ratio/high_mean": 0.01, "clip_ratio/high_max": 0.02,
    "clip_ratio/region_mean": 0.01, "step_time": 1.55, "epoch": 0.25,
}
# one on_log payload of TRL 1.16 DPOTrainer (reference/spike.md section 5)
DPO_LOGS = {
    "loss": 0.69, "grad_norm": 1.2, "learning_rate": 0.0005, "entropy": 2.0, "num_tokens": 900.0,
    "logits/chosen": -1.5, "logits/rejected": -1.7, "mean_token_accuracy": 0.3,
    "rewards/chosen": 0.12, "rewards/rejected": -0.05, "rewards/accuracies": 0.75,
    "rewards/margins": 0.17, "logps/chosen": -40.2, "logps/rejected": -44.9, "epoch": 0.5,
}
END_LOGS = {"train_runtime": 64.0, "train_samples_per_second": 10.0,
            "train_steps_per_second": 0.6, "total_flos": 0.0, "train_loss": 0.02, "epoch": 1.0}


@pytest.fixture(scope="module")
def args(tmp_path_factory):
    return TrainingArguments(output_dir=str(tmp_path_factory.mktemp("out")), report_to="none",
                             use_cpu=True, logging_steps=1, max_steps=40)


@pytest.fixture
def store(tmp_path):
    with SqliteRunStore(tmp_path / "posttrain.db") as opened:
        yield opened


def unfinished_run(name, store):
    """A run these tests leave unfinished, without a heartbeat thread: one would go on
    beating after the test closed its store and print "could not send a heartbeat" from
    the worker minutes later."""
    return open_run(name, {}, store=store, heartbeat_seconds=None)


def logged(store, run):
    return {name: store.metric_series(run, name)["values"] for name in store.metric_names(run)}


def test_grpo_metrics_arrive_under_stable_names(args, store):
    callback = TrainerCallback(unfinished_run("grpo", store))
    state = TrainerState(global_step=7, max_steps=40)
    callback.on_log(args, state, TrainerControl(), logs=GRPO_LOGS)
    metrics = logged(store, "grpo")
    # the names the dashboard draws (issue 6); values unchanged
    assert metrics["reward"] == [0.41] and metrics["reward_std"] == [0.3]
    assert metrics["kl"] == [0.0031] and metrics["completion_length"] == [27.5]
    assert metrics["loss"] == [0.0123] and metrics["grad_norm"] == [0.81]
    assert metrics["learning_rate"] == [0.002] and metrics["entropy"] == [1.9]
    assert metrics["frac_reward_zero_std"] == [0.5]
    assert metrics["clip_ratio_high"] == [0.01] and metrics["clip_ratio_region"] == [0.01]
    assert metrics["completion_clipped_ratio"] == [0.125]
    # a key missing from the table keeps its own name
    assert metrics["rewards/rule_reward/mean"] == [0.41]
    assert "completions/mean_length" not in metrics
    assert store.metric_series("grpo", "reward")["steps"] == [7]


def test_dpo_margins_accuracies_and_log_probabilities_are_all_kept(args, store):
    callback = TrainerCallback(unfinished_run("dpo", store))
    callback.on_log(args, TrainerState(global_step=3, max_steps=10), TrainerControl(),
                    logs=DPO_LOGS)
    metrics = logged(store, "dpo")
    for name in ("rewards/chosen", "rewards/rejected", "rewards/margins", "rewards/accuracies",
                 "logits/chosen", "logits/rejected"):
        assert metrics[name] == [DPO_LOGS[name]]
    # the reference SDK dropped these two (reference/whileai.md section 19, item 9)
    assert metrics["logps/chosen"] == [-40.2] and metrics["logps/rejected"] == [-44.9]
    assert metrics["token_accuracy"] == [0.3]


def test_the_name_table_pins_every_trl_key_the_recipes_rely_on():
    assert METRIC_NAMES["completions/mean_length"] == "completion_length"
    assert {METRIC_NAMES[key] for key in ("reward", "reward_std", "kl", "loss", "grad_norm",
                                          "learning_rate")} == {
        "reward", "reward_std", "kl", "loss", "grad_norm", "learning_rate"}
    every_key = set(GRPO_LOGS) | set(DPO_LOGS)
    unmapped = every_key - set(METRIC_NAMES)
    assert unmapped == {"rewards/rule_reward/mean", "rewards/rule_reward/std"}  # per reward fn
    assert all(name and " " not in name for name in METRIC_NAMES.values())


def test_end_of_training_numbers_go_to_the_summary_not_the_curves(args, store):
    callback = TrainerCallback(open_run("ending", {}, store=store))
    callback.on_log(args, TrainerState(global_step=40, max_steps=40), TrainerControl(),
                    logs=END_LOGS)
    assert store.metric_names("ending") == ["epoch"]
    callback.finish({"delta": {"delta": 0.1}}, status="done")
    detail = store.get_run("ending")
    assert detail["status"] == "done"
    assert detail["summary"]["trainer"]["train_runtime"] == 64.0
    assert detail["summary"]["delta"] == {"delta": 0.1}


def test_non_numeric_and_non_finite_logs_are_left_out():
    assert map_trainer_logs({"loss": float("nan"), "note": "x", "reward": 1, "ok": True}) == {
        "reward": 1.0}


class FakeClock:
    def __init__(self):
        self.now = 0.0

    def __call__(self):
        return self.now


def test_progress_reports_an_eta_from_the_step_time_after_warm_up(args, store):
    clock = FakeClock()
    callback = TrainerCallback(unfinished_run("eta", store), clock=clock)
    state, control = TrainerState(global_step=0, max_steps=10), TrainerControl()
    callback.on_train_begin(args, state, control)
    for step, moment in ((1, 10.0), (2, 12.0), (3, 14.0)):  # step 1 is slow (warm-up)
        clock.now, state.global_step = moment, step
        callback.on_step_end(args, state, control)
    progress = store.get_run("eta")["progress"]
    # 2 s per step since the first step ended, 7 steps left -> 14 s (warm-up excluded)
    assert progress == {"step": 3, "total": 10, "eta": pytest.approx(14.0)}


def test_total_steps_given_to_the_callback_wins_over_max_steps(args, store):
    callback = TrainerCallback(unfinished_run("total", store), total_steps=25)
    callback.on_step_end(args, TrainerState(global_step=1, max_steps=999), TrainerControl())
    assert store.get_run("total")["progress"]["total"] == 25


def test_only_the_main_process_writes(args, store):
    callback = TrainerCallback(unfinished_run("worker", store))
    state = TrainerState(global_step=2, max_steps=10, is_world_process_zero=False)
    callback.on_log(args, state, TrainerControl(), logs=GRPO_LOGS)
    callback.on_step_end(args, state, TrainerControl())
    assert store.metric_names("worker") == []
    assert store.get_run("worker")["progress"]["step"] is None


def test_the_callback_works_with_a_null_run(args):
    callback = TrainerCallback(NullRun())
    state, control = TrainerState(global_step=1, max_steps=2), TrainerControl()
    callback.on_train_begin(args, state, control)
    callback.on_log(args, state, control, logs=GRPO_LOGS)
    callback.on_step_end(args, state, control)
    callback.finish({"x": 1})
