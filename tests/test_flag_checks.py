"""Flags that name an impossible port or a file as the runs folder are refused with a
clear error before anything loads or is written (they were tracebacks)."""

from __future__ import annotations

import pytest

from posttrain.cli import main


@pytest.mark.parametrize("port", ["99999", "-1"])
def test_serve_refuses_a_port_out_of_range(port, capsys):
    assert main(["serve", "--port", port]) == 2
    assert "--port must be between 0 and 65535" in capsys.readouterr().err


def test_serve_refuses_zero_torch_threads(capsys):
    assert main(["serve", "--torch-threads", "0"]) == 2
    assert "--torch-threads must be at least 1" in capsys.readouterr().err


def test_serve_refuses_a_state_store_that_is_not_postgresql(capsys):
    assert main(["serve", "--state-store", "mysql://me:secret@db/x"]) == 2
    err = capsys.readouterr().err
    assert "--state-store: expected a postgresql://" in err and "secret" not in err
    assert main(["serve", "--state-store", "postgresql://db/x", "--no-journal"]) == 2
    assert "cannot go with --no-journal" in capsys.readouterr().err


@pytest.mark.parametrize("command", [
    ["ui"],
    ["grpo", "--steps", "1"],
    ["dpo", "--steps", "1"],
])
def test_a_file_named_as_the_runs_folder_is_refused(command, tmp_path, capsys):
    a_file = tmp_path / "runs.txt"
    a_file.write_text("not a folder\n")
    assert main([*command, "--runs-dir", str(a_file)]) == 2
    err = capsys.readouterr().err
    assert f"--runs-dir '{a_file}' is a file, not a folder" in err
    assert a_file.read_text() == "not a folder\n"
    assert sorted(p.name for p in tmp_path.iterdir()) == ["runs.txt"]


def test_the_runs_environment_variable_is_named_when_it_names_a_file(tmp_path, capsys,
                                                                    monkeypatch):
    a_file = tmp_path / "runs.txt"
    a_file.write_text("x")
    monkeypatch.setenv("POSTTRAIN_RUNS", str(a_file))
    assert main(["grpo", "--steps", "1"]) == 2
    assert "$POSTTRAIN_RUNS" in capsys.readouterr().err
