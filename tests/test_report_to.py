"""`--report-to`: TRL's logs also go to the tracker users keep; posttrain's store stays on."""

from __future__ import annotations

import json

import pytest

from posttrain.cli import main


def test_an_uninstalled_tracker_is_refused_before_anything_is_written(tmp_path, capsys):
    runs = tmp_path / "runs"
    import importlib.util

    for tracker in ("wandb", "trackio", "mlflow"):
        if importlib.util.find_spec(tracker):
            continue  # installed here: nothing to refuse
        code = main(["sft", "--report-to", tracker, "--runs-dir", str(runs)])
        error = capsys.readouterr().err
        assert code == 2 and f"--report-to {tracker} needs the {tracker} package" in error
    assert not runs.exists()


@pytest.mark.slow
def test_tensorboard_gets_event_files_in_the_run_folder_and_the_store_stays_on(
        starter_2m_folder, tmp_path):
    runs = tmp_path / "runs"
    code = main(["sft", "--base-model", "starter-2m", "--prompts", "60", "--eval-samples", "1",
                 "--eval-repeats", "1", "--steps", "3", "--batch-size", "4",
                 "--report-to", "tensorboard", "--runs-dir", str(runs), "--run-name", "tb"])
    assert code in (0, 1)
    events = list((runs / "tb" / "trainer").rglob("events.out.tfevents.*"))
    assert events, "no tensorboard event file under the run folder"
    data = b"".join(path.read_bytes() for path in events)
    assert b"train/loss" in data  # the trainer's logged loss, as a scalar summary
    steps = [json.loads(line)["step"] for line in (runs / "tb" / "metrics.jsonl").open()]
    assert max(steps) == 3  # posttrain's own record is still written
    config = json.loads((runs / "tb" / "config.json").read_text())
    assert config["settings"]["report_to"] == "tensorboard"


@pytest.mark.parametrize(("repo", "environment", "fragment"), [
    ("not a repo", {}, "expected a Hub repo id OWNER/NAME"),
    ("me/adapter", {"HF_HUB_OFFLINE": "1"}, "HF_HUB_OFFLINE is set"),
    ("me/adapter", {"HF_HUB_OFFLINE": "", "TRANSFORMERS_OFFLINE": "",
                    "HF_TOKEN": "", "HF_HOME": "EMPTY"}, "no Hub token"),
])
def test_push_to_hub_is_refused_before_anything_runs_when_it_cannot_happen(
        tmp_path, capsys, monkeypatch, repo, environment, fragment):
    for name, value in environment.items():
        if value == "EMPTY":  # a Hub home with no stored token
            value = str(tmp_path / "hf-home")
        monkeypatch.setenv(name, value)
    runs = tmp_path / "runs"
    assert main(["sft", "--push-to-hub", repo, "--runs-dir", str(runs)]) == 2
    error = capsys.readouterr().err
    assert f"--push-to-hub {repo}:" in error and fragment in error
    assert not runs.exists()
