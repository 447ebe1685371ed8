"""The DPO recipe: flags to TRL's DPOConfig, refused input, and `posttrain dpo` end to end
on the 2M starter model (round one, then round two from it)."""

from __future__ import annotations

import argparse
import json
from pathlib import Path
from types import SimpleNamespace

import pytest

from posttrain.commands import dpo as dpo_command
from posttrain.commands import pairs as pairs_command
from posttrain.commands.dataclass_args import settings_from_args
from posttrain.data.prepare import DataConfig, prepare_data
from posttrain.envs.refund import REFUND_ENV
from posttrain.envs.refund.agent import Behaviour, seeded_agent
from posttrain.errors import InputFileError, PosttrainError
from posttrain.train.dpo.run import run_dpo
from posttrain.train.dpo.settings import DPOSettings, check_dpo_settings, dpo_config_kwargs
from posttrain.train.training_data.pairs import build_preference_pairs, export_preference

WITH_ID = "Please refund order ORD-4017, it arrived broken."
LOOKUP = (
    '<tool_call>\n{"name": "lookup_order", "arguments": {"order_id": "ORD-4017"}}\n</tool_call>'
)


def parser() -> argparse.ArgumentParser:
    """`posttrain` with the dpo and pairs subcommands, built the way posttrain.cli builds it."""
    root = argparse.ArgumentParser(prog="posttrain")
    subparsers = root.add_subparsers(dest="command", required=True)
    dpo_command.register(subparsers)
    pairs_command.register(subparsers)
    return root


def settings_for(*flags: str) -> DPOSettings:
    return settings_from_args(DPOSettings, parser().parse_args(["dpo", *flags]))


# ---------------------------------------------------------------- flags and config


def test_defaults_are_the_seed_recipes_but_for_small_models_the_measured_ones():
    settings = settings_for()
    assert (settings.steps, settings.loss_type) == (60, "sigmoid")
    assert (settings.pair_samples, settings.constructed_share) == (8, 0.3)
    assert settings.run_name == "refund-dpo-v1"
    # the seed's beta above 50M parameters; 0.3 for the starters (docs/recipes/dpo.md)
    assert settings.resolved_beta(1_500_000_000) == 0.1
    assert settings.resolved_beta(9_000_000) == 0.3
    assert settings_for("--beta", "0.1").resolved_beta(9_000_000) == 0.1
    # constructed negatives: on for sampled pairs, off with a pairs file, flags both ways
    assert settings.pairs is None and settings.resolved_constructed_negatives()
    assert not settings_for("--pairs", "p.jsonl").resolved_constructed_negatives()
    assert not settings_for("--no-constructed-negatives").resolved_constructed_negatives()
    assert settings_for("--constructed-negatives").constructed_negatives is True


def test_every_seed_flag_reaches_the_settings():
    settings = settings_for(
        "--steps", "5", "--beta", "0.2", "--loss-type", "ipo", "--pair-samples", "4",
        "--learning-rate", "1e-3", "--pairs", "p.jsonl", "--prompts-file", "x.jsonl",
        "--balance", "0.25", "--holdout", "0.3", "--run-name", "r2", "--base-model",
        "starter-2m", "--seed", "3", "--from-run", "r1", "--constructed-negatives",
        "--constructed-share", "0.5",
    )  # fmt: skip
    assert (settings.steps, settings.beta, settings.loss_type) == (5, 0.2, "ipo")
    assert (settings.pair_samples, settings.learning_rate, settings.pairs) == (4, 1e-3, "p.jsonl")
    assert (settings.prompts_file, settings.balance, settings.holdout) == ("x.jsonl", 0.25, 0.3)
    assert (settings.run_name, settings.base_model, settings.seed) == ("r2", "starter-2m", 3)
    assert (settings.from_run, settings.constructed_negatives) == ("r1", True)
    assert settings.constructed_share == 0.5


def test_settings_map_onto_trl_dpo_config(tmp_path):
    from trl import DPOConfig

    settings = DPOSettings(steps=7, beta=0.2, loss_type="ipo", batch_size=4, max_length=256)
    config = DPOConfig(**dpo_config_kwargs(settings, 1e-3, str(tmp_path), "cpu"))
    assert config.loss_type == ["ipo", "sft"]  # TRL 1.16 takes a list of losses; sft by default
    assert (config.max_steps, config.beta, config.learning_rate) == (7, 0.2, 1e-3)
    assert (config.per_device_train_batch_size, config.max_length) == (4, 256)
    assert config.label_smoothing == 0.0
    # CPU-safe values, not TRL's GPU-minded defaults (reference/spike.md 9.2)
    assert config.use_cpu and not config.bf16 and not config.gradient_checkpointing
    assert config.logging_steps == 1


def test_the_default_learning_rate_is_dpos_own_and_scales_with_model_size():
    # starter sizes get 1e-4 (measured in docs/recipes/dpo.md)
    settings = DPOSettings()
    assert settings.default_learning_rate(2_000_000) == 1e-4
    assert settings.default_learning_rate(135_000_000) == 2e-5
    assert settings.default_learning_rate(1_500_000_000) == 5e-6  # the seed's, for 1.5B


def test_an_sft_weight_adds_trls_sft_loss_beside_the_preference_loss(tmp_path):
    from trl import DPOConfig

    settings = DPOSettings(sft_weight=0.5)
    check_dpo_settings(settings)
    config = DPOConfig(**dpo_config_kwargs(settings, 1e-3, str(tmp_path), "cpu"))
    assert config.loss_type == ["sigmoid", "sft"] and config.loss_weights == [1.0, 0.5]
    default = DPOConfig(**dpo_config_kwargs(DPOSettings(), 1e-3, str(tmp_path), "cpu"))
    assert default.loss_type == ["sigmoid", "sft"] and default.loss_weights == [1.0, 1.0]
    seed = DPOConfig(**dpo_config_kwargs(DPOSettings(sft_weight=0.0), 1e-3, str(tmp_path), "cpu"))
    assert seed.loss_type == ["sigmoid"] and seed.loss_weights is None  # the seed recipe's


def test_the_sft_term_is_on_by_default_except_when_the_loss_is_sft_already():
    assert DPOSettings().resolved_sft_weight() == 1.0
    assert DPOSettings(loss_type="sft").resolved_sft_weight() == 0.0
    check_dpo_settings(DPOSettings(loss_type="sft"))  # no "leave --sft-weight at 0" error
    assert DPOSettings(sft_weight=0.0).resolved_defaults(9_000_000)["sft_weight"] == 0.0


def test_exo_pair_gets_the_label_smoothing_trl_requires(tmp_path):
    from trl import DPOConfig

    settings = DPOSettings(loss_type="exo_pair")
    config = DPOConfig(**dpo_config_kwargs(settings, 1e-3, str(tmp_path), "cpu"))
    assert config.label_smoothing == 1e-3  # the EXO paper's epsilon; TRL refuses 0
    check_dpo_settings(settings)
    with pytest.raises(PosttrainError, match="exo_pair needs --label-smoothing above 0"):
        check_dpo_settings(DPOSettings(loss_type="exo_pair", label_smoothing=0.0))


@pytest.mark.parametrize(
    ("changes", "message"),
    [
        ({"loss_type": "kto"}, "not a DPO loss this TRL accepts"),
        ({"steps": 0}, "--steps must be at least 1"),
        ({"beta": 0.0}, "--beta must be a number above 0"),
        ({"beta": float("nan")}, "--beta must be a number above 0, got nan"),
        ({"min_margin": float("inf")}, "--min-margin must be a number above 0"),
        ({"pair_samples": 1}, "--pair-samples must be at least 2"),
        ({"constructed_share": -0.1}, "--constructed-share must be >= 0"),
        ({"loss_type": "robust", "label_smoothing": 0.5}, "robust needs --label-smoothing"),
        ({"skip_invalid": True}, "--skip-invalid only applies to --pairs"),
        ({"sft_weight": -1.0}, "--sft-weight must be a number >= 0"),
        ({"sft_weight": float("nan")}, "--sft-weight must be a number >= 0"),
        ({"sft_weight": 1.0, "loss_type": "sft"}, "leave --sft-weight at 0"),
    ],
)
def test_impossible_settings_are_refused(changes, message):
    with pytest.raises(PosttrainError, match=message):
        check_dpo_settings(DPOSettings(**changes))


# ---------------------------------------------------------------- bad input


def good_pair() -> dict:
    rows = [
        {"prompt": WITH_ID, "reply": LOOKUP, "score": 1.0, "scenario_id": "a"},
        {"prompt": WITH_ID, "reply": "No.", "score": 0.0, "scenario_id": "a"},
    ]
    return build_preference_pairs(env=REFUND_ENV, rows=rows)[0][0]


@pytest.mark.parametrize(
    ("second_line", "message"),
    [
        (json.dumps({**good_pair(), "rejected": []}), "pairs.jsonl:2: field 'rejected': missing"),
        (json.dumps({**good_pair(), "rejected": good_pair()["chosen"]}), "identical to chosen"),
        ('{"prompt": [{"role": "user"', "pairs.jsonl:2: not valid JSON"),
    ],
)
def test_a_bad_pairs_file_stops_the_run_before_anything_is_written(tmp_path, second_line, message):
    path = tmp_path / "pairs.jsonl"
    path.write_text(json.dumps(good_pair()) + "\n" + second_line + "\n")
    runs = tmp_path / "runs"
    with pytest.raises(InputFileError, match=message):
        run_dpo(DPOSettings(pairs=str(path), runs_dir=str(runs)), say=lambda line: None)
    assert not runs.exists()


def test_skip_invalid_lets_a_run_use_the_good_lines(tmp_path):
    path = tmp_path / "pairs.jsonl"
    path.write_text(json.dumps(good_pair()) + "\nnot json\n")
    check_dpo_settings(DPOSettings(pairs=str(path), skip_invalid=True))


def test_constructed_negatives_cannot_be_added_to_a_pairs_file(tmp_path):
    path = export_preference([good_pair()], tmp_path / "pairs.jsonl")
    with pytest.raises(PosttrainError, match="posttrain pairs build --constructed-negatives"):
        check_dpo_settings(DPOSettings(pairs=str(path), constructed_negatives=True))


def test_a_missing_from_run_is_named_before_anything_is_written(tmp_path):
    runs = tmp_path / "runs"
    runs.mkdir()
    (runs / "round-one").mkdir()
    with pytest.raises(PosttrainError, match=r"no run 'round-on' in .*runs there: round-one"):
        run_dpo(DPOSettings(from_run="round-on", runs_dir=str(runs)), say=lambda line: None)
    assert [path.name for path in runs.iterdir()] == ["round-one"]


def test_no_prompt_with_contrast_says_to_raise_pair_samples():
    from posttrain.train.dpo.trainer import sample_pairs

    settings = DPOSettings(prompts=20, pair_samples=2)
    context = SimpleNamespace(
        settings=settings,
        env=REFUND_ENV,
        data=prepare_data(DataConfig(prompts=20), REFUND_ENV),
        say=lambda line: None,
    )
    always_right = seeded_agent(
        with_id=Behaviour(right=1.0), no_id=Behaviour(right=1.0), off_topic=Behaviour(right=1.0)
    )
    with pytest.raises(PosttrainError, match=r"no train prompt had contrast.*--pair-samples 4"):
        sample_pairs(context, always_right)


# ---------------------------------------------------------------- pairs command


def test_pairs_build_then_stats_on_the_scripted_agent(tmp_path, capsys):
    out = tmp_path / "pairs.jsonl"
    args = parser().parse_args(
        ["pairs", "build", "--out", str(out), "--prompts", "40", "--constructed-negatives"]
    )
    assert args.func(args) == 0
    printed = capsys.readouterr().out
    assert "prompts with contrast" in printed and "constructed (cap" in printed
    args = parser().parse_args(["pairs", "stats", str(out), "--json"])
    assert args.func(args) == 0
    stats = json.loads(capsys.readouterr().out)
    assert stats["pairs"] == len(out.read_text().splitlines())
    assert {row["category"] for row in stats["by_category"]} <= {"with_id", "no_id", "off_topic"}


# ---------------------------------------------------------------- end to end


FAST = [
    "--base-model", "starter-2m", "--prompts", "40", "--steps", "3", "--eval-samples", "1",
    "--eval-repeats", "2", "--pair-samples", "4",
]  # fmt: skip


@pytest.fixture(scope="module")
def round_one(starter_2m_folder, tmp_path_factory) -> Path:
    runs = tmp_path_factory.mktemp("runs")
    args = parser().parse_args(["dpo", *FAST, "--runs-dir", str(runs), "--run-name", "r1"])
    code = args.func(args)
    summary = json.loads((runs / "r1" / "summary.json").read_text())
    assert code == (0 if summary["ok"] else 1)  # 1 only if a guard fell or DOWN
    return runs / "r1"


@pytest.mark.slow
def test_round_one_writes_the_documented_run_folder(round_one):
    names = {path.name for path in round_one.iterdir()}
    assert {
        "config.json", "summary.json", "holdout_before.jsonl", "holdout_after.jsonl",
        "adapter", "pairs.jsonl", "report.md",
    } <= names  # fmt: skip
    assert (round_one / "adapter" / "adapter_config.json").is_file()
    assert "merged" not in names  # only a round two saves its merged start
    summary = json.loads((round_one / "summary.json").read_text())
    assert summary["recipe"] == "dpo" and summary["status"] == "done"
    report = summary["pair_report"]
    assert report["source"] == "on-policy" and report["pairs"] >= 1
    assert report["pairs"] == len((round_one / "pairs.jsonl").read_text().splitlines())
    assert report["prompts_with_contrast"] <= report["prompts_seen"]
    assert "## Preference pairs" in (round_one / "report.md").read_text()
    config = json.loads((round_one / "config.json").read_text())
    assert config["recipe"] == "dpo" and config["settings"]["pair_samples"] == 4
    assert config["resolved"]["learning_rate"] == summary["learning_rate"] == 1e-4
    assert (config["resolved"]["beta"], config["resolved"]["sft_weight"]) == (0.3, 1.0)
    assert config["resolved"]["constructed_negatives"] is True


@pytest.mark.slow
def test_round_two_starts_from_round_one_and_saves_the_merged_policy(round_one):
    runs = round_one.parent
    args = parser().parse_args(
        ["dpo", *FAST, "--steps", "2", "--runs-dir", str(runs), "--run-name", "r2",
         "--from-run", "r1"]
    )  # fmt: skip
    code = args.func(args)
    round_two = runs / "r2"
    assert code == (0 if json.loads((round_two / "summary.json").read_text())["ok"] else 1)
    assert (round_two / "merged" / "config.json").is_file()
    assert (round_two / "adapter" / "adapter_config.json").is_file()
    summary = json.loads((round_two / "summary.json").read_text())
    assert summary["from_run"] == "r1" and summary["status"] == "done"
    config = json.loads((round_two / "config.json").read_text())
    assert config["resolved"]["from_run"] == str(round_one)
