"""`--config FILE`: recipe flags from TOML, YAML or JSON (a run's own config.json re-runs
it); the command line wins over the file, the file over the defaults; bad files are named."""

from __future__ import annotations

import dataclasses
import json
import time

import pytest

from posttrain.cli import build_parser, main
from posttrain.commands.recipe_command import settings_for
from posttrain.errors import PosttrainError
from posttrain.train.dpo.settings import DPOSettings
from posttrain.train.grpo.settings import GRPOSettings


def settings(command, settings_class, *argv):
    args = build_parser().parse_args([command, *argv])
    return settings_for(settings_class, args, command)


def test_a_toml_file_sets_flags_and_the_command_line_wins(tmp_path):
    path = tmp_path / "grid.toml"
    path.write_text('steps = 3\nlearning-rate = 1e-4\nbase_model = "starter-2m"\n'
                    "mask_truncated = true\n")
    chosen = settings("grpo", GRPOSettings, "--config", str(path), "--steps", "7")
    assert chosen.steps == 7  # the flag
    assert chosen.learning_rate == 1e-4 and chosen.base_model == "starter-2m"  # the file
    assert chosen.mask_truncated is True
    assert chosen.num_generations == GRPOSettings().num_generations  # the default
    # an explicit flag equal to the default still wins over the file
    assert settings("grpo", GRPOSettings, "--config", str(path), "--steps", "40").steps == 40


def test_yaml_and_a_runs_own_config_json_are_read(tmp_path):
    (tmp_path / "dpo.yaml").write_text("beta: 0.2\nloss_type: ipo\npair_samples: 4\n")
    chosen = settings("dpo", DPOSettings, "--config", str(tmp_path / "dpo.yaml"))
    assert (chosen.beta, chosen.loss_type, chosen.pair_samples) == (0.2, "ipo", 4)

    earlier = dataclasses.replace(GRPOSettings(), steps=12, seed=3, learning_rate=2e-4,
                                  base_model="starter-2m", run_name="first")
    config = {"recipe": "grpo", "settings": earlier.to_config(), "resolved": {}}
    (tmp_path / "config.json").write_text(json.dumps(config))
    again = settings("grpo", GRPOSettings, "--config", str(tmp_path / "config.json"),
                     "--run-name", "again")
    assert again == dataclasses.replace(earlier, run_name="again")


@pytest.mark.parametrize(("name", "text", "fragment"), [
    ("a.toml", "stepz = 3\n", "stepz: not a setting of posttrain grpo; did you mean steps?"),
    ("a.toml", 'steps = "three"\n', "steps: expected int, got 'three'"),
    ("a.toml", "steps = true\n", "steps: expected int, got True"),
    ("a.toml", "learning_rate = [1]\n", "learning_rate: expected float or nothing"),
    ("a.toml", "steps = \n", "not valid TOML"),
    ("a.yaml", "- 1\n- 2\n", "expected a table of settings"),
    ("a.json", '{"steps": NaN}', "not valid JSON"),
    ("a.ini", "steps=3", "must end in .toml, .yaml, .yml or .json"),
])
def test_a_bad_settings_file_is_refused_with_its_name_before_anything_runs(tmp_path, capsys,
                                                                          name, text,
                                                                          fragment):
    path = tmp_path / name
    path.write_text(text)
    runs = tmp_path / "runs"
    assert main(["grpo", "--config", str(path), "--runs-dir", str(runs)]) == 2
    error = capsys.readouterr().err
    assert str(path) in error and fragment in error
    assert not runs.exists()


def test_a_missing_settings_file_is_named(tmp_path):
    with pytest.raises(PosttrainError, match="no such file"):
        settings("grpo", GRPOSettings, "--config", str(tmp_path / "nope.toml"))


def test_yaml_numbers_written_as_text_are_read_as_numbers(tmp_path):
    # YAML 1.1 reads 1e-4 (no dot) as a string; it is how people write a learning rate
    (tmp_path / "a.yaml").write_text("learning_rate: 1e-4\nbeta: '0.05'\n")
    chosen = settings("grpo", GRPOSettings, "--config", str(tmp_path / "a.yaml"))
    assert chosen.learning_rate == 1e-4 and chosen.beta == 0.05
    (tmp_path / "b.yaml").write_text("learning_rate: nan\n")
    with pytest.raises(PosttrainError, match="learning_rate: expected float"):
        settings("grpo", GRPOSettings, "--config", str(tmp_path / "b.yaml"))


def test_a_file_that_is_not_utf8_is_named_not_a_traceback(tmp_path, capsys):
    path = tmp_path / "a.yaml"
    path.write_bytes(b"\xff\xfesteps: 3\n")
    assert main(["grpo", "--config", str(path), "--runs-dir", str(tmp_path / "runs")]) == 2
    error = capsys.readouterr().err
    assert "a.yaml: not UTF-8 text (byte 0xff at offset 0)" in error


def test_a_yaml_alias_bomb_is_refused_quickly_and_its_error_stays_short(tmp_path, capsys):
    # every level an anchor inside the value itself: 9**9 strings once expanded as text,
    # a few hundred bytes on disk
    levels = ["&a [x, x, x, x, x, x, x, x, x]"] + [
        f"&{chr(98 + n)} [{', '.join(['*' + chr(97 + n)] * 9)}]" for n in range(8)]
    path = tmp_path / "bomb.yaml"
    path.write_text(f"run_name: [{', '.join(levels)}]\n")
    assert len(path.read_bytes()) < 600
    started = time.monotonic()
    assert main(["grpo", "--config", str(path), "--runs-dir", str(tmp_path / "runs")]) == 2
    error = capsys.readouterr().err
    assert "run_name: expected str" in error
    assert len(error.split("run_name: ", 1)[1]) < 200  # the value, cut short
    assert time.monotonic() - started < 30  # it ran for minutes and gigabytes before
