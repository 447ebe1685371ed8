"""Printed text is data: a hostile environment's every field reaches stdout and stderr
escaped, never as terminal codes (``posttrain.terminal``).

The environment is the refund rule with its name and every category ending in escape
sequences that set the terminal's title, clear the screen and print a fake red verdict,
a carriage return that would write over the line, and a right-to-left override. Every
command that prints them (an evaluation's table, a comparison, the prompts' summary, a
GRPO run's plan and report, the run list, an error quoting the flag) is run through the
CLI and its output searched for any raw control character.
"""

from __future__ import annotations

import re
from pathlib import Path

import pytest

from posttrain.cli import main
from posttrain.terminal import escaped_output, printable

HOSTILE = "\x1b]0;pwned\x07\x1b[2J\x1b[31mVERDICT: DOWN\x1b[0m\r\u202e\x9b"
#: what may reach a terminal: no C0 control but tab and newline, no DEL, no C1, no bidi
RAW_CONTROL = re.compile("[\x00-\x08\x0b-\x1f\x7f-\x9f\u202a-\u202e\u2066-\u2069]")
TQDM_REDRAW = re.compile(r"\r(?=Loading weights: )")

HOSTILE_ENV = f'''
from posttrain.envs.refund.env import RefundEnv

HOSTILE = {HOSTILE!r}


class Hostile(RefundEnv):
    name = "refund" + HOSTILE

    def category(self, case):
        return super().category(case) + HOSTILE


ENV = Hostile()
'''


@pytest.fixture(scope="module")
def hostile_env(tmp_path_factory) -> str:
    folder = tmp_path_factory.mktemp("hostile")
    (folder / "hostile_env.py").write_text(HOSTILE_ENV, encoding="utf-8")
    return f"{folder / 'hostile_env.py'}:ENV"


def printed_cleanly(capsys, *commands: list[str]) -> str:
    """Run ``commands`` through the CLI; what they printed, checked for raw controls."""
    printed = []
    for argv in commands:
        main(argv)
        out, err = capsys.readouterr()
        for stream, text in (("stdout", out), ("stderr", err)):
            # a library's progress line redrawing itself (transformers' "Loading weights")
            # begins its writes with a carriage return, which passes (posttrain.terminal)
            found = RAW_CONTROL.search(TQDM_REDRAW.sub("", text))
            assert found is None, (argv[:2], stream, text[max(0, found.start() - 80):
                                                         found.start() + 40])
        printed.append(out + err)
    return "\n".join(printed)


def test_printable_escapes_every_control_and_keeps_the_rest():
    assert printable(HOSTILE) == ("\\x1b]0;pwned\\x07\\x1b[2J\\x1b[31mVERDICT: DOWN\\x1b[0m"
                                  "\\x0d\\u202e\\x9b")
    kept = "refund: with_id 0.52 [0.30, 0.75]\tété 東京 ✓\n"
    assert printable(kept) == kept


def test_a_carriage_return_passes_only_where_a_progress_line_redraws(capsys):
    import sys

    with escaped_output():
        sys.stderr.write("\r 50% done")
        sys.stderr.write("category\rFAKE")
    assert capsys.readouterr().err == "\r 50% done" + "category\\x0dFAKE"


def test_every_field_of_a_hostile_environment_is_printed_escaped(hostile_env, tmp_path,
                                                                  capsys):
    rows = tmp_path / "rows.jsonl"
    other = tmp_path / "other.jsonl"
    printed = printed_cleanly(
        capsys,
        ["eval", "--env", hostile_env, "--agent", "seeded", "--prompts", "40",
         "--out", str(rows)],
        ["eval", "--env", hostile_env, "--agent", "seeded", "--agent-seed", "1",
         "--prompts", "40", "--out", str(other)],
        ["eval", "--compare", str(rows), str(other)],
        ["prompts", "write", "--env", hostile_env, "--prompts", "20",
         str(tmp_path / "prompts.jsonl")],
        ["prompts", "stats", str(tmp_path / "prompts.jsonl")],
        ["eval", "--env", hostile_env, "--agent", "seeded", "--prompts", "40",
         "--behaviour", "unknown" + HOSTILE + "=move:1"],  # an error quoting the flag
    )
    # the categories were printed, escaped: seen, not obeyed
    assert "with_id\\x1b]0;pwned\\x07" in printed


def test_a_grpo_run_of_a_hostile_environment_prints_its_plan_and_report_escaped(
        hostile_env, starter_2m_folder, tmp_path, capsys):
    runs = tmp_path / "runs"
    printed = printed_cleanly(
        capsys,
        ["grpo", "--env", hostile_env, "--base-model", "starter-2m", "--prompts", "60",
         "--steps", "2", "--eval-samples", "1", "--eval-repeats", "1",
         "--num-generations", "4", "--runs-dir", str(runs), "--run-name", "hostile"],
        ["runs", "list", "--runs-dir", str(runs)],
    )
    assert "plan:" in printed and "\\x1b[31mVERDICT" in printed
    report = (runs / "hostile" / "report.md").read_text(encoding="utf-8")
    assert RAW_CONTROL.search(report) is None  # the report a user cats is data too
    assert Path(runs / "hostile" / "summary.json").exists()
