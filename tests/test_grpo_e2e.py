"""`posttrain grpo` end to end on the 2M starter model: the run folder, the summary, the split,
and Ctrl-C mid-training."""

import json
import os
import signal
import subprocess
import sys
import time

import pytest

from posttrain.cli import main
from posttrain.data.prepare import DataConfig, prepare_data
from posttrain.envs import get_env

pytestmark = pytest.mark.slow

FAST = [
    "--base-model", "starter-2m", "--prompts", "60", "--eval-samples", "1",
    "--eval-repeats", "2", "--monitor-every", "2", "--num-generations", "4",
]  # fmt: skip

SUMMARY_KEYS = {
    "recipe", "run_name", "status", "base_model", "learning_rate", "data", "before", "after",
    "noise", "delta", "verdict", "ok", "by_category_before", "by_category_after", "alarms",
    "monitor", "timings", "curves",
}  # fmt: skip


@pytest.fixture(scope="module")
def runs_root(tmp_path_factory):
    return tmp_path_factory.mktemp("runs")


@pytest.fixture(scope="module")
def finished_run(starter_2m_folder, runs_root):
    code = main(["grpo", *FAST, "--steps", "3", "--runs-dir", str(runs_root), "--run-name",
                 "e2e"])  # fmt: skip
    summary = json.loads((runs_root / "e2e" / "summary.json").read_text())
    assert code == (0 if summary["ok"] else 1)  # 1 only when a guard fell or DOWN
    return runs_root / "e2e"


@pytest.fixture(scope="module")
def other_seed_run(finished_run, runs_root):
    main(["grpo", *FAST, "--steps", "3", "--seed", "1", "--runs-dir", str(runs_root),
          "--run-name", "e2e-seed1"])  # fmt: skip
    return runs_root / "e2e-seed1"


def read_rows(path):
    return [json.loads(line) for line in path.open()]


def test_run_folder_has_every_documented_file(finished_run):
    names = {path.name for path in finished_run.iterdir()}
    assert {
        "config.json", "summary.json", "holdout_before.jsonl", "holdout_after.jsonl", "adapter",
        "report.md", "curves.png", "metrics.jsonl",
    } <= names  # fmt: skip
    assert (finished_run / "adapter" / "adapter_model.safetensors").is_file()
    assert not [name for name in names if name.startswith(".")]  # no temp files left


def test_summary_has_the_documented_keys(finished_run):
    summary = json.loads((finished_run / "summary.json").read_text())
    assert SUMMARY_KEYS <= set(summary)
    assert summary["status"] == "done"
    assert summary["delta"]["verdict"] == summary["verdict"]
    assert summary["reward_audit"]["scanned"]  # the audit ran on the base rows
    assert {g["name"] for g in summary["by_category_before"]} <= {"with_id", "no_id", "off_topic"}
    assert len(summary["noise"]["pass_at_1"]) == 2  # two base evaluations
    assert [check["step"] for check in summary["monitor"]["checks"]] == [2, 3]


def test_the_monitor_keeps_what_the_policy_said_at_each_check(finished_run, runs_root):
    from posttrain.runs.sqlite_store import SqliteRunStore

    with SqliteRunStore(runs_root / "posttrain.db") as store:
        checks = {(check["source"], check["step"]) for check in store.sample_checks("e2e")}
        assert checks == {("monitor", 2), ("rollouts", 2), ("monitor", 3), ("rollouts", 3)}
        holdout = store.sample_rows("e2e", "monitor", 3)
        rollouts = store.sample_rows("e2e", "rollouts", 2)
    assert 0 < len(holdout) <= 64 and 0 < len(rollouts) <= 64
    assert {"prompt", "reply", "score", "reward", "category"} <= set(holdout[0])


def test_every_flag_is_in_config(finished_run):
    config = json.loads((finished_run / "config.json").read_text())
    assert config["settings"]["steps"] == 3 and config["settings"]["num_generations"] == 4
    assert config["settings"]["base_model"] == "starter-2m"
    assert config["resolved"]["learning_rate"] == 3e-4
    assert {"torch", "transformers", "trl", "peft"} <= set(config["versions"])


def test_the_split_is_reproducible(finished_run):
    data = prepare_data(DataConfig(prompts=60, seed=0), get_env("refund"))  # data seed 0
    config = json.loads((finished_run / "config.json").read_text())
    assert config["data"]["holdout"] == data.counts()["holdout"]
    before = [json.loads(line) for line in (finished_run / "holdout_before.jsonl").open()]
    after = [json.loads(line) for line in (finished_run / "holdout_after.jsonl").open()]
    holdout_prompts = [record["prompt"] for record in data.holdout]
    assert [row["prompt"] for row in after] == holdout_prompts
    assert [row["prompt"] for row in before if row["eval_run"] == 0] == holdout_prompts
    assert {row["eval_run"] for row in before} == {0, 1}


def test_metrics_streamed_into_the_store(finished_run):
    from posttrain.runs.sqlite_store import SqliteRunStore

    store = SqliteRunStore(finished_run.parent / "posttrain.db")
    run = store.get_run("e2e")
    assert run["status"] == "done"
    assert {"reward", "loss", "monitor/proxy_reward"} <= set(store.metric_names("e2e"))


def _ignore_sigint() -> None:
    signal.signal(signal.SIGINT, signal.SIG_IGN)  # what `cmd &` in a script starts with


@pytest.mark.parametrize("stop, code, reason, inherited_ignore", [
    (signal.SIGINT, 130, "Ctrl-C", False),
    (signal.SIGTERM, 143, "SIGTERM", False),
    (signal.SIGINT, 130, "Ctrl-C", True),
], ids=["ctrl-c", "sigterm", "ctrl-c-started-ignored"])
def test_a_stop_signal_marks_the_run_stopped_and_keeps_what_was_measured(
        starter_2m_folder, tmp_path, stop, code, reason, inherited_ignore):
    command = [
        sys.executable, "-m", "posttrain", "grpo", *FAST, "--steps", "400",
        "--monitor-every", "0", "--eval-repeats", "1",  # one base evaluation is enough here
        "--runs-dir", str(tmp_path), "--run-name", "interrupted",
    ]  # fmt: skip
    scratch = tmp_path / "tmp"  # the run's temp folder: the trainer's scratch goes there
    scratch.mkdir()
    process = subprocess.Popen(command, stdout=subprocess.PIPE, stderr=subprocess.STDOUT,
                               text=True, preexec_fn=_ignore_sigint if inherited_ignore else None,
                               env={**os.environ, "TMPDIR": str(scratch)})
    metrics = tmp_path / "interrupted" / "metrics.jsonl"
    # generous bounds, not expected durations: a loaded CI machine can be ~6x slower
    deadline = time.monotonic() + 900
    while time.monotonic() < deadline and process.poll() is None:
        if metrics.exists() and metrics.read_text().count("\n") >= 2:
            break
        time.sleep(0.5)
    assert process.poll() is None, process.stdout.read()
    os.kill(process.pid, stop)
    output, _ = process.communicate(timeout=900)
    assert process.returncode == code, output
    assert f"interrupted ({reason})" in output
    summary = json.loads((tmp_path / "interrupted" / "summary.json").read_text())
    assert summary["status"] == "stopped" and summary["stop_reason"] == reason
    assert summary["before"]["pass_at_1"] is not None
    assert (tmp_path / "interrupted" / "holdout_before.jsonl").exists()
    assert not list(scratch.glob("posttrain-*"))  # the stopped trainer's scratch went too


def test_runs_that_differ_in_training_seed_share_their_holdout(finished_run, other_seed_run):
    first = read_rows(finished_run / "holdout_before.jsonl")
    second = read_rows(other_seed_run / "holdout_before.jsonl")
    key = [(row["scenario_id"], row["prompt"], row["sample"], row["eval_run"]) for row in first]
    assert key == [(r["scenario_id"], r["prompt"], r["sample"], r["eval_run"]) for r in second]
    # same evaluation seed: the base policy's replies are the same draws, so the two runs'
    # deltas are paired against one before side
    assert [row["reply"] for row in first] == [row["reply"] for row in second]
    after = read_rows(other_seed_run / "holdout_after.jsonl")
    assert [row["prompt"] for row in after] == [
        row["prompt"] for row in read_rows(finished_run / "holdout_after.jsonl")
    ]
    config = json.loads((other_seed_run / "config.json").read_text())["settings"]
    assert (config["seed"], config["data_seed"], config["eval_seed"]) == (1, 0, 0)


def test_eval_compare_of_the_runs_own_files_gives_its_verdict(finished_run, capsys):
    summary = json.loads((finished_run / "summary.json").read_text())
    code = main(["eval", "--compare", str(finished_run / "holdout_before.jsonl"),
                 str(finished_run / "holdout_after.jsonl"), "--json"])  # fmt: skip
    report = json.loads(capsys.readouterr().out)
    assert code == (0 if summary["ok"] else 1)
    for key in ("delta", "ci95", "p_value", "verdict", "noise_band_used"):
        assert report[key] == summary["delta"][key], key
