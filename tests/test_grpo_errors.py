"""Bad input to `posttrain grpo` is refused with a clear message before anything is written."""

import json
import subprocess
import sys

import pytest

from posttrain.cli import main


def run_grpo(capsys, tmp_path, *argv):
    code = main(["grpo", "--runs-dir", str(tmp_path / "runs"), *argv])
    return code, capsys.readouterr().err


def write_prompts(path, prompts):
    path.write_text("".join(json.dumps(p) + "\n" for p in prompts))
    return str(path)


def test_prompts_file_with_no_holdoutable_category(capsys, tmp_path):
    # one scenario per category: no category can give a scenario to the holdout
    prompts = write_prompts(
        tmp_path / "p.jsonl",
        [
            {"prompt": "Refund ORD-1234", "scenario_id": "a"},
            {"prompt": "Refund ORD-1234 now", "scenario_id": "a"},
            {"prompt": "Tell me a joke", "scenario_id": "b"},
        ],
    )
    code, err = run_grpo(capsys, tmp_path, "--prompts-file", prompts)
    assert code == 2
    assert "no category has two or more scenarios" in err
    assert not (tmp_path / "runs").exists()


def test_holdout_empty_after_the_split(capsys, tmp_path):
    code, err = run_grpo(capsys, tmp_path, "--prompts", "2", "--holdout", "0.01")
    assert code == 2
    assert "the holdout is empty" in err and "raise --holdout or --prompts" in err
    assert not (tmp_path / "runs").exists()


def test_batch_not_divisible_by_generations(capsys, tmp_path):
    code, err = run_grpo(capsys, tmp_path, "--num-generations", "8", "--batch-size", "20")
    assert code == 2 and "not a multiple of --num-generations 8" in err


def test_existing_run_name_is_refused_without_overwrite(capsys, tmp_path):
    (tmp_path / "runs" / "taken").mkdir(parents=True)
    (tmp_path / "runs" / "taken" / "config.json").write_text("{}")
    code, err = run_grpo(capsys, tmp_path, "--run-name", "taken")
    assert code == 2
    assert "run 'taken' already exists" in err and "--overwrite" in err
    assert (tmp_path / "runs" / "taken" / "config.json").read_text() == "{}"


def test_run_name_that_escapes_the_runs_folder(capsys, tmp_path):
    code, err = run_grpo(capsys, tmp_path, "--run-name", "../outside")
    assert code == 2 and "run name" in err
    assert not (tmp_path / "outside").exists()


def test_missing_from_run(capsys, tmp_path):
    code, err = run_grpo(capsys, tmp_path, "--from-run", "nope", "--base-model", "starter-2m")
    assert code == 2 and "no run 'nope'" in err


def test_rollout_sampling_settings_are_checked(capsys, tmp_path):
    code, err = run_grpo(capsys, tmp_path, "--temperature", "0")
    assert code == 2 and "--temperature must be a number above 0" in err
    code, err = run_grpo(capsys, tmp_path, "--top-p", "1.5")
    assert code == 2 and "--top-p must be in (0, 1]" in err
    assert not (tmp_path / "runs").exists()


@pytest.mark.parametrize("name", ["posttrain.db", "posttrain.db-wal", "posttrain.db-shm",
                                  "POSTTRAIN.DB-journal"])
def test_a_run_named_after_the_stores_own_files_is_refused(capsys, tmp_path, name):
    # a folder named posttrain.db-wal would sit where SQLite keeps the store's log
    code, err = run_grpo(capsys, tmp_path, "--run-name", name)
    assert code == 2 and "the run store's own file" in err
    assert len(err.strip().splitlines()) == 1
    assert not (tmp_path / "runs" / name).is_dir()  # no run folder in the store's place


@pytest.mark.slow
def test_a_full_disk_during_the_adapter_save_is_one_line_and_a_failed_run(
        starter_2m_folder, tmp_path, monkeypatch, capsys):
    """Issue #49, class 6: a full disk during a save gave a library's traceback. The
    command says so in one line (exit 2) and the run is marked failed in its summary."""
    import errno
    import json
    import tempfile

    import peft

    def full(self, path, *args, **kwargs):
        raise OSError(errno.ENOSPC, "No space left on device", str(path))

    monkeypatch.setattr(peft.PeftModel, "save_pretrained", full)
    scratch = tmp_path / "tmp"
    scratch.mkdir()
    monkeypatch.setattr(tempfile, "tempdir", str(scratch))  # where the trainer's scratch goes
    runs = tmp_path / "runs"
    code = main(["grpo", "--base-model", "starter-2m", "--prompts", "40", "--steps", "1",
                 "--num-generations", "2", "--eval-samples", "1", "--eval-repeats", "1",
                 "--monitor-every", "0", "--runs-dir", str(runs), "--run-name", "full"])
    err = capsys.readouterr().err
    assert code == 2
    [said] = [line for line in err.splitlines() if line.startswith("posttrain grpo:")]
    assert "Traceback" not in err and said.startswith("posttrain grpo: error: no space left "
                                                      "on the device while writing")
    assert "adapter" in said
    summary = json.loads((runs / "full" / "summary.json").read_text())
    assert summary["status"] == "failed" and "No space left" in summary["error"]
    assert not list(scratch.glob("posttrain-*"))  # the failed trainer's scratch went too


@pytest.mark.slow
def test_overwrite_keeps_the_old_run_until_the_new_one_is_done(starter_2m_folder, tmp_path,
                                                               monkeypatch, capsys):
    """Issue #49, class 7: `--overwrite` removed the old complete run before the new one
    succeeded. Now the old one is moved aside; a new run that fails puts it back (folder
    byte for byte, and its record in the store); one that ends done removes it."""
    import errno
    import hashlib

    import peft

    from posttrain.runs.sqlite_store import SqliteRunStore

    runs = tmp_path / "runs"
    common = ["grpo", "--base-model", "starter-2m", "--prompts", "40", "--steps", "1",
              "--num-generations", "2", "--eval-samples", "1", "--eval-repeats", "1",
              "--monitor-every", "0", "--runs-dir", str(runs), "--run-name", "kept"]

    def contents() -> dict:
        return {str(path.relative_to(runs / "kept")): hashlib.sha256(path.read_bytes())
                .hexdigest() for path in sorted((runs / "kept").rglob("*")) if path.is_file()}

    def record() -> dict:
        with SqliteRunStore(runs / "posttrain.db") as store:
            run = store.get_run("kept")
            return {key: run[key] for key in ("status", "config", "summary", "metric_names")}

    assert main(common) in (0, 1)
    old_files, old_record = contents(), record()
    assert old_record["status"] == "done"

    def full(self, path, *args, **kwargs):
        raise OSError(errno.ENOSPC, "No space left on device", str(path))

    with monkeypatch.context() as patch:
        patch.setattr(peft.PeftModel, "save_pretrained", full)
        assert main([*common, "--overwrite", "--seed", "1"]) == 2
    out = capsys.readouterr().out
    assert "run 'kept' is back as it was before --overwrite (its folder and its record)" in out
    assert contents() == old_files and record() == old_record
    assert sorted(path.name for path in runs.iterdir()) == ["kept", "posttrain.db"]

    assert main([*common, "--overwrite", "--seed", "1"]) in (0, 1)
    new_record = record()
    assert new_record["status"] == "done"
    assert new_record["config"]["settings"]["seed"] == 1 and contents() != old_files
    assert sorted(path.name for path in runs.iterdir()) == ["kept", "posttrain.db"]


@pytest.mark.parametrize("recipe, flag", [("grpo", "--steps=0"), ("dpo", "--batch-size=0"),
                                          ("sft", "--learning-rate=-1")])
def test_a_bad_flag_is_refused_before_the_trainers_libraries_load(recipe, flag, tmp_path):
    # the refusal used to come after ~4 s of imports (torch, transformers, peft, TRL)
    script = ("import sys; from posttrain.cli import main; code = main(sys.argv[1:]); "
              "print(code, sorted(m for m in ('torch', 'transformers', 'peft', 'trl') "
              "if m in sys.modules))")
    done = subprocess.run([sys.executable, "-c", script, recipe, flag, "--runs-dir",
                           str(tmp_path / "runs")], capture_output=True, text=True, timeout=120)
    assert done.stdout.split(maxsplit=1) == ["2", "[]\n"], done.stdout + done.stderr
    assert f"posttrain {recipe}: error: {flag.split('=')[0]}" in done.stderr
    assert not (tmp_path / "runs").exists()


KILL_AT_PHASE = """
import os, signal, sys
import posttrain.train.grpo.run as grpo_run
from posttrain.cli import main
from posttrain.runs.folder import NewRun
from posttrain.train import recipe

def die(*args, **kwargs):
    os.kill(os.getpid(), signal.SIGKILL)

def then_die(function):
    def wrapped(*args, **kwargs):
        result = function(*args, **kwargs)
        die()
        return result
    return wrapped

phase = sys.argv[1]
if phase == "claimed":      # the name is taken, nothing moved yet
    recipe.check_new_run = then_die(recipe.check_new_run)
elif phase == "aside":      # the old folder moved aside, the new one made
    recipe.create_run_folder = then_die(recipe.create_run_folder)
elif phase == "recorded":   # the new record has replaced the old one in the store
    recipe.open_run = then_die(recipe.open_run)
elif phase == "training":   # inside the training step
    grpo_run.train_grpo = die
elif phase == "finishing":  # the new run marked done, the old folder not yet dropped
    NewRun.finish = die
sys.exit(main(sys.argv[2:]))
"""


@pytest.mark.slow
def test_overwrite_killed_at_any_phase_loses_nothing(starter_2m_folder, tmp_path, capsys):
    """Issue #68, class 5: `--overwrite` killed mid-run (SIGKILL) lost the old run's
    record, and its folder sat in `.kept.replaced-<id>`, which nothing listed or restored.
    Killed at each phase now, the old run is readable under its name or named by `runs
    list` and by a new start, and `runs restore` gives back its folder and record."""
    import hashlib
    import signal
    import subprocess
    import sys

    from posttrain.runs.sqlite_store import SqliteRunStore

    runs = tmp_path / "runs"
    common = ["grpo", "--base-model", "starter-2m", "--prompts", "40", "--steps", "1",
              "--num-generations", "2", "--eval-samples", "1", "--eval-repeats", "1",
              "--monitor-every", "0", "--runs-dir", str(runs), "--run-name", "kept"]

    def contents() -> dict:
        return {str(path.relative_to(runs / "kept")): hashlib.sha256(path.read_bytes())
                .hexdigest() for path in sorted((runs / "kept").rglob("*"))
                # an empty lock file a killed process held says nothing: no one holds it
                if path.is_file() and path.name != "run.lock"}

    def record() -> dict:
        with SqliteRunStore(runs / "posttrain.db") as store:
            run = store.get_run("kept")
            return {key: run[key] for key in ("status", "config", "summary", "metric_names",
                                              "notes", "owner")}

    assert main(common) in (0, 1)
    old_files, old_record = contents(), record()
    capsys.readouterr()
    for phase in ("claimed", "aside", "recorded", "training", "finishing"):
        killed = subprocess.run([sys.executable, "-c", KILL_AT_PHASE, phase, *common,
                                 "--overwrite", "--seed", "1"], capture_output=True, text=True,
                                timeout=300)
        assert killed.returncode == -signal.SIGKILL, (phase, killed.stderr[-2000:])
        if phase == "claimed":  # nothing was moved or replaced
            assert contents() == old_files and record() == old_record
            continue
        assert main(["runs", "list", "--runs-dir", str(runs)]) == 0
        listed = capsys.readouterr().err
        assert "run 'kept': the run --overwrite was replacing is kept in" in listed, phase
        assert "posttrain runs restore kept" in listed
        # a new start would bury it: refused, saying how to restore it
        assert main([*common, "--overwrite"]) == 2
        assert "posttrain runs restore kept" in capsys.readouterr().err
        assert main(["runs", "restore", "kept", "--runs-dir", str(runs)]) == 0
        # before the new record is made, the old one is still the store's
        what = "its folder" if phase == "aside" else "its folder and record"
        assert f"restored run 'kept' ({what})" in capsys.readouterr().out
        assert contents() == old_files, phase
        assert record() == old_record, phase
        assert sorted(path.name for path in runs.iterdir()) == ["kept", "posttrain.db"]
    # --discard drops the kept run and the interrupted one stays (a replace whose
    # process lets go of its locks without finishing is one that was killed)
    from posttrain.runs.folder import check_new_run, create_run_folder

    taken = check_new_run(runs, "kept", overwrite=True)
    create_run_folder(taken)
    taken.claim.release()
    assert main(["runs", "restore", "kept", "--discard", "--runs-dir", str(runs)]) == 0
    assert (runs / "kept").is_dir()
    assert not [path for path in runs.iterdir() if path.name.startswith(".")]
    assert main(["runs", "restore", "kept", "--runs-dir", str(runs)]) == 2
    assert "no replaced run of 'kept' is kept" in capsys.readouterr().err
