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
def finished_run(starter_2m_folder, tmp_path_factory):
    runs = tmp_path_factory.mktemp("runs")
    code = main(["grpo", *FAST, "--steps", "3", "--runs-dir", str(runs), "--run-name", "e2e"])
    assert code in (0, 1)  # 1 only if a guard fell, which the report then names
    return runs / "e2e"


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
    assert summary["verdict"] in ("moved", "flat", "flat (within noise)", "DOWN")
    assert {g["name"] for g in summary["by_category_before"]} <= {"with_id", "no_id", "off_topic"}
    assert len(summary["noise"]["pass_at_1"]) == 2  # two base evaluations
    assert [check["step"] for check in summary["monitor"]["checks"]] == [2, 3]


def test_every_flag_is_in_config(finished_run):
    config = json.loads((finished_run / "config.json").read_text())
    assert config["settings"]["steps"] == 3 and config["settings"]["num_generations"] == 4
    assert config["settings"]["base_model"] == "starter-2m"
    assert config["resolved"]["learning_rate"] == 3e-4
    assert {"torch", "transformers", "trl", "peft"} <= set(config["versions"])


def test_the_split_is_reproducible(finished_run):
    data = prepare_data(DataConfig(prompts=60, seed=0), get_env("refund"))
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


def test_ctrl_c_marks_the_run_stopped_and_keeps_what_was_measured(starter_2m_folder, tmp_path):
    command = [
        sys.executable, "-m", "posttrain.cli", "grpo", *FAST, "--steps", "400",
        "--monitor-every", "0", "--runs-dir", str(tmp_path), "--run-name", "interrupted",
    ]  # fmt: skip
    process = subprocess.Popen(command, stdout=subprocess.PIPE, stderr=subprocess.STDOUT, text=True)
    metrics = tmp_path / "interrupted" / "metrics.jsonl"
    deadline = time.monotonic() + 240
    while time.monotonic() < deadline and process.poll() is None:
        if metrics.exists() and metrics.read_text().count("\n") >= 2:
            break
        time.sleep(0.5)
    assert process.poll() is None, process.stdout.read()
    os.kill(process.pid, signal.SIGINT)
    output, _ = process.communicate(timeout=120)
    assert process.returncode == 130, output
    assert "interrupted" in output
    summary = json.loads((tmp_path / "interrupted" / "summary.json").read_text())
    assert summary["status"] == "stopped" and summary["stop_reason"] == "Ctrl-C"
    assert summary["before"]["pass_at_1"] is not None
    assert (tmp_path / "interrupted" / "holdout_before.jsonl").exists()
