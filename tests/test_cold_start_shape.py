"""The cold start's shape (`--cold-start-shape auto|full|light`): chosen from the base
policy's rows, the user's own settings kept, and a run under the light shape that says so
and records what it set (posttrain.train.grpo.cold_start_shape)."""

from __future__ import annotations

import json

import pytest

from posttrain.cli import build_parser, main
from posttrain.commands.recipe_command import settings_for
from posttrain.commands.settings_file import load_settings_file
from posttrain.runs.sqlite_store import SqliteRunStore
from posttrain.train.grpo.cold_start_choice import choose_cold_start
from posttrain.train.grpo.cold_start_shape import (
    LIGHT_SHAPE,
    ColdStartShape,
    choose_cold_start_shape,
    shape_settings,
    shaped_train,
)
from posttrain.train.grpo.settings import GRPOSettings
from tests.test_cold_start import REFUND, rows

# the library example's base (RESULTS LA): the tool categories never pass and every group
# of theirs scored alike; chitchat passes
# (15 groups of 4: enough replies to show the pass rate low, enough groups to read "alike")
ABSENT = (rows("with_id", [[0.0] * 4] * 15) + rows("no_id", [[1.0, 0.0, 1.0, 1.0]] * 2))
# the refund base (RESULTS F, G, I): with_id never passes, but its replies score
# differently (asking for the id earns part of the reward) in some groups
PARTIAL = (rows("with_id", [[0.3] * 4, [0.0, 0.3, 0.3, 0.3], [0.3] * 4] * 5)
           + rows("no_id", [[1.0, 0.2, 1.0, 1.0]] * 2))


def grpo_settings(*flags: str) -> GRPOSettings:
    """GRPOSettings as the command builds them from these flags."""
    return settings_for(GRPOSettings, build_parser().parse_args(["grpo", *flags]), "grpo")


def test_auto_is_light_when_a_category_the_base_never_passes_scored_every_group_alike():
    name, reason = choose_cold_start_shape("auto", choose_cold_start("auto", REFUND, ABSENT))
    assert name == "light"
    assert "every group of with_id alike" in reason and "no_id" not in reason


def test_auto_is_full_when_the_base_s_replies_score_differently():
    choice = choose_cold_start("auto", REFUND, PARTIAL)
    assert choice.run  # with_id never passes: a cold start runs ...
    name, reason = choose_cold_start_shape("auto", choice)
    assert name == "full" and "score differently" in reason  # ... the full one
    # one sample a prompt: no groups to read, so nothing says the move is absent
    single = choose_cold_start("auto", REFUND, rows("with_id", [[0.0]] * 60))
    assert single.run and choose_cold_start_shape("auto", single)[0] == "full"


def test_the_flag_chooses_and_a_run_without_a_cold_start_is_full():
    absent, partial = (choose_cold_start("auto", REFUND, ABSENT),
                       choose_cold_start("auto", REFUND, PARTIAL))
    assert choose_cold_start_shape("full", absent)[0] == "full"
    assert choose_cold_start_shape("light", partial) == ("light", "--cold-start-shape light")
    none = choose_cold_start("none", REFUND, ABSENT)
    assert choose_cold_start_shape("light", none) == ("full", "no cold start")


def test_light_sets_the_defaults_and_keeps_what_the_user_gave():
    absent = choose_cold_start("auto", REFUND, ABSENT)
    # --temperature at its default value, but given: kept; --beta in the file: kept
    settings = grpo_settings("--temperature", "0.8", "--cold-start-steps", "12")
    shaped, shape = shape_settings("auto", absent, settings)
    assert shape.name == "light" and shaped is not settings
    assert shape.kept == ["cold_start_steps", "temperature"]
    assert shape.applied == {key: LIGHT_SHAPE[key] for key in
                             ("cold_start_until", "cold_start_balance", "balance", "beta")}
    assert (shaped.temperature, shaped.cold_start_steps, shaped.beta, shaped.balance) == (
        0.8, 12, 0.2, 0.33)
    assert shaped.cold_start_shape == "light"  # config.json says which shape ran
    assert settings.beta == 0.04  # the user's settings object is left as it was
    words = shape.words()
    assert words.startswith("cold start shape: light (auto: the base scored every group")
    assert "sets --cold-start-until 0.3, --cold-start-balance 0.33, --balance 0.33, " \
           "--beta 0.2" in words
    assert words.endswith("keeps your --cold-start-steps, --temperature")
    # settings built in Python: a value other than the default counts as given
    python, _ = shape_settings("light", absent, GRPOSettings(beta=0.1))
    assert (python.beta, python.temperature) == (0.1, 1.2)
    # full: the settings as they were
    same, full = shape_settings("full", absent, settings)
    assert same is settings and full.to_dict() == {
        "name": "full", "reason": "--cold-start-shape full", "applied": {}, "kept": []}


def test_a_settings_file_counts_as_given(tmp_path):
    path = tmp_path / "run.toml"
    path.write_text("beta = 0.04\n")
    settings = grpo_settings("--config", str(path))
    _, shape = shape_settings("light", choose_cold_start("sft", REFUND, ABSENT), settings)
    assert shape.kept == ["beta"] and "beta" not in shape.applied


def test_rl_prompts_are_balanced_only_when_the_shape_set_balance():
    train = ([{"category": "with_id", "prompt": str(n)} for n in range(8)]
             + [{"category": "no_id", "prompt": "a"}])
    balanced = shaped_train(train, ColdStartShape("light", "", {"balance": 0.33}))
    assert sum(r["category"] == "no_id" for r in balanced) / len(balanced) >= 0.33
    assert shaped_train(train, ColdStartShape("light", "", {}, ["balance"])) is train


def test_bad_shapes_are_refused(tmp_path, capsys):
    with pytest.raises(SystemExit):
        main(["grpo", "--cold-start-shape", "wide"])
    assert "--cold-start-shape" in capsys.readouterr().err
    path = tmp_path / "run.json"
    path.write_text(json.dumps({"cold_start_shape": "wide"}))
    assert main(["grpo", "--config", str(path), "--runs-dir", str(tmp_path / "runs")]) == 2
    assert "--cold-start-shape 'wide': expected one of auto, full, light" in \
        capsys.readouterr().err
    assert not (tmp_path / "runs").exists() or not any((tmp_path / "runs").iterdir())
    # a shape for a cold start that never runs
    assert main(["grpo", "--cold-start", "none", "--cold-start-shape", "light"]) == 2
    assert "--cold-start-shape light shapes a cold start and --cold-start none runs none" \
        in capsys.readouterr().err


@pytest.mark.slow
def test_a_light_run_says_its_shape_and_records_what_it_set(starter_2m_folder, tmp_path,
                                                             capsys):
    runs = tmp_path / "runs"
    code = main(["grpo", "--base-model", "starter-2m", "--prompts", "40", "--eval-samples", "2",
                 "--eval-repeats", "1", "--steps", "1", "--num-generations", "4",
                 "--monitor-every", "0", "--cold-start", "sft", "--cold-start-shape", "light",
                 "--cold-start-steps", "2", "--runs-dir", str(runs), "--run-name", "light"])
    assert code in (0, 1)
    out = capsys.readouterr().out
    folder = runs / "light"
    config = json.loads((folder / "config.json").read_text())
    summary = json.loads((folder / "summary.json").read_text())
    assert summary["status"] == "done" and summary["cold_start"]["steps"] == 2
    assert ("cold start shape: light (--cold-start-shape light); sets --cold-start-until "
            "0.3, --cold-start-balance 0.33, --balance 0.33, --beta 0.2, --temperature 1.2; "
            "keeps your --cold-start-steps") in out
    assert "RL's train prompts balanced to 0.33 a category:" in out
    assert "beta 0.2" in out  # the training line: RL runs with the shape's settings
    shape = config["cold_start"]["shape"]
    assert shape["name"] == "light" and shape["kept"] == ["cold_start_steps"]
    assert summary["cold_start"]["shape"] == shape
    # the run's notes in the store say it too (its record keeps the settings it opened with)
    with SqliteRunStore(runs / "posttrain.db") as store:
        notes = [note["text"] for note in store.get_run("light")["notes"]]
    assert any(text.startswith("plan: cold start shape: light") for text in notes), notes
    settings = config["settings"]
    assert (settings["temperature"], settings["beta"], settings["balance"],
            settings["cold_start_steps"], settings["cold_start_shape"]) == (
        1.2, 0.2, 0.33, 2, "light")
    # RL's train prompts as planned: balanced (minority categories repeated: none under a
    # fifth once the later ones are added in name order); the data phase's counts are
    # left as they were
    train = config["train_prompts"]
    assert config["data"]["train"]["prompts"] < train["prompts"]
    assert f" -> {train['prompts']} (no_id {train['no_id']}, off_topic {train['off_topic']}, " \
        f"with_id {train['with_id']})" in out
    assert min(train[name] for name in ("with_id", "no_id", "off_topic")) \
        >= 0.2 * train["prompts"]
    # --config on the folder's config.json reads back the settings the run used
    again = load_settings_file(folder / "config.json", GRPOSettings, "grpo")
    assert (again["temperature"], again["beta"], again["balance"]) == (1.2, 0.2, 0.33)
