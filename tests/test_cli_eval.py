"""`posttrain eval` and `posttrain prompts` through the command-line entry point."""

import json
import subprocess
import sys

import pytest

from posttrain.cli import main


def run_cli(capsys, *argv):
    code = main(list(argv))
    captured = capsys.readouterr()
    return code, captured.out, captured.err


def test_eval_seeded_prints_pass_at_1_and_category_table(capsys):
    code, out, err = run_cli(capsys, "eval", "--agent", "seeded")
    assert code == 0
    # the seeded agent on the default holdout (400 situations, data seed 0), as printed
    assert "holdout pass@1 0.55 [0.47, 0.62] (n=75 scenarios, 99 prompts x 4)" in out
    assert "with_id" in out and "no_id" in out and "off_topic" in out
    assert "holdout    99 prompts,   75 scenarios" in err


def test_eval_of_the_seeded_agent_needs_no_torch():
    # the base install is numpy and rich: the seeded evaluation must not import torch
    code = (
        "import sys; from posttrain.cli import main; main(['eval', '--agent', 'seeded']); "
        "sys.exit(3 if 'torch' in sys.modules else 0)"
    )
    done = subprocess.run([sys.executable, "-c", code], capture_output=True, text=True)
    assert done.returncode == 0, done.stderr


def test_eval_is_reproducible_and_writes_rows(capsys, tmp_path):
    first = tmp_path / "a.jsonl"
    second = tmp_path / "b.jsonl"
    run_cli(capsys, "eval", "--out", str(first))
    run_cli(capsys, "eval", "--out", str(second))
    assert first.read_bytes() == second.read_bytes()
    rows = [json.loads(line) for line in first.read_text().splitlines()]
    assert len(rows) == 99 * 4 and {row["eval_run"] for row in rows} == {0}


def test_behaviour_knobs_change_the_result(capsys):
    _, out, _ = run_cli(
        capsys, "eval", "--json", "--behaviour", "with_id=right:1.0", "--split", "all"
    )
    with_id_right = json.loads(out)["pass_at"]["pass_at_1"]
    _, out, _ = run_cli(capsys, "eval", "--json", "--split", "all")
    assert with_id_right > json.loads(out)["pass_at"]["pass_at_1"]


def test_bad_behaviour_flag_is_a_usage_error(capsys, tmp_path):
    out = tmp_path / "rows.jsonl"
    assert main(["eval", "--behaviour", "with_id=fly:0.5", "--out", str(out)]) == 2
    assert "unknown move 'fly'; use right, invent" in capsys.readouterr().err
    assert main(["eval", "--behaviour", "sideways=right:0.5", "--out", str(out)]) == 2
    assert "unknown category; use one of with_id, no_id, off_topic" in capsys.readouterr().err
    with pytest.raises(SystemExit) as exit_info:  # the shape is checked by argparse
        main(["eval", "--behaviour", "with_id=right:lots"])
    assert exit_info.value.code == 2
    assert not out.exists()


def test_compare_prints_paired_delta_and_verdict(capsys, tmp_path):
    before, after = tmp_path / "before.jsonl", tmp_path / "after.jsonl"
    noise = [tmp_path / f"noise{i}.jsonl" for i in range(2)]
    run_cli(capsys, "eval", "--split", "all", "--out", str(before))
    run_cli(capsys, "eval", "--split", "all", "--eval-seed", "1", "--out", str(noise[0]))
    run_cli(capsys, "eval", "--split", "all", "--eval-seed", "2", "--out", str(noise[1]))
    run_cli(
        capsys, "eval", "--split", "all", "--behaviour", "with_id=right:0.9", "--out", str(after)
    )
    code, out, _ = run_cli(
        capsys, "eval", "--compare", str(before), str(after), "--noise-from", *map(str, noise)
    )
    assert code == 0
    assert "moved" in out and "by category" in out and "well_formed" in out


def test_compare_names_the_bad_line(capsys, tmp_path):
    bad = tmp_path / "bad.jsonl"
    bad.write_text('{"prompt": "x", "scenario_id": "s", "reward": 3, "markers": {}}\n')
    code, _, err = run_cli(capsys, "eval", "--compare", str(bad), str(bad))
    assert code == 2
    assert f"{bad}:1: field 'reward': expected 0 or 1" in err


def test_missing_prompts_file_is_a_clear_error(capsys, tmp_path):
    code, _, err = run_cli(capsys, "eval", "--prompts-file", str(tmp_path / "none.jsonl"))
    assert code == 2 and "none.jsonl: no such file" in err


def test_prompts_write_stats_split_filter(capsys, tmp_path):
    path = tmp_path / "p.jsonl"
    code, out, _ = run_cli(capsys, "prompts", "write", str(path))
    # the default set: 400 template situations, data seed 0 (README, "The template prompt set")
    assert code == 0 and "515 prompts, 389 scenarios" in out
    _, out, _ = run_cli(capsys, "prompts", "stats", str(path), "--json")
    assert json.loads(out) == {
        "prompts": 515,
        "scenarios": 389,
        "with_id": 279,
        "no_id": 147,
        "off_topic": 89,
    }
    _, out, _ = run_cli(
        capsys,
        "prompts",
        "split",
        str(path),
        "--stratified",
        "--train-out",
        str(tmp_path / "t.jsonl"),
        "--holdout-out",
        str(tmp_path / "h.jsonl"),
    )
    assert "holdout" in out and (tmp_path / "h.jsonl").exists()
    code, out, _ = run_cli(capsys, "prompts", "filter", str(path), str(tmp_path / "f.jsonl"))
    assert code == 0 and "kept" in out


def test_console_script_help_lists_commands():
    result = subprocess.run(
        [sys.executable, "-m", "posttrain.cli", "--help"],
        capture_output=True,
        text=True,
        check=True,
    )
    assert "eval" in result.stdout and "prompts" in result.stdout
