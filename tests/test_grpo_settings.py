"""GRPO flags -> settings -> TRL config, and the settings refused before anything runs."""

import argparse
import dataclasses

import pytest

from posttrain.cli import build_parser
from posttrain.commands.dataclass_args import settings_from_args
from posttrain.errors import PosttrainError
from posttrain.train.grpo.settings import GRPOSettings, check_grpo_settings, grpo_config_kwargs
from posttrain.train.settings import default_learning_rate


def parse(*argv) -> GRPOSettings:
    args = build_parser().parse_args(["grpo", *argv])
    return settings_from_args(GRPOSettings, args)


def test_defaults_match_the_seed_knob_table():
    settings = parse()
    # the seed's table: steps 40, 8 generations, beta 0.04, bnpo, epsilon-high 0, holdout
    # 0.2, balance 0, seed 0, monitor every 10, run name refund-grpo-v1; 400 template
    # situations, not the seed's 200, so the holdout has ~78 scenarios (docs/statistics.md)
    assert (settings.steps, settings.num_generations, settings.beta) == (40, 8, 0.04)
    assert (settings.loss_type, settings.epsilon_high) == ("bnpo", 0.0)
    assert (settings.prompts, settings.holdout, settings.balance) == (400, 0.2, 0.0)
    assert (settings.data_seed, settings.seed, settings.eval_seed) == (0, 0, 0)
    assert settings.reward is None
    assert (settings.monitor_every, settings.run_name) == (10, "refund-grpo-v1")
    assert settings.base_model is None  # the environment's starter, resolved by the recipe
    assert (settings.eval_samples, settings.eval_repeats) == (4, 2)
    assert not settings.no_scale_rewards and not settings.mask_truncated
    assert (settings.temperature, settings.top_p) == (0.8, 0.95)


def test_every_flag_lands_in_the_settings_and_config():
    settings = parse(
        "--steps",
        "7",
        "--num-generations",
        "4",
        "--batch-size",
        "12",
        "--learning-rate",
        "1e-4",
        "--beta",
        "0",
        "--loss-type",
        "dr_grpo",
        "--epsilon-high",
        "0.28",
        "--no-scale-rewards",
        "--mask-truncated",
        "--monitor-every",
        "3",
        "--stop-on",
        "hack,length",
        "--reward",
        "mypackage.rewards:shaped",
        "--prompts",
        "50",
        "--prompts-file",
        "p.jsonl",
        "--holdout",
        "0.3",
        "--balance",
        "0.25",
        "--run-name",
        "x",
        "--base-model",
        "starter-2m",
        "--seed",
        "5",
        "--data-seed",
        "6",
        "--eval-seed",
        "7",
        "--eval-samples",
        "2",
        "--eval-repeats",
        "3",
        "--from-run",
        "y",
        "--overwrite",
    )
    config = settings.to_config()
    expected = {
        "steps": 7,
        "num_generations": 4,
        "batch_size": 12,
        "learning_rate": 1e-4,
        "beta": 0.0,
        "loss_type": "dr_grpo",
        "epsilon_high": 0.28,
        "no_scale_rewards": True,
        "mask_truncated": True,
        "monitor_every": 3,
        "stop_on": "hack,length",
        "reward": "mypackage.rewards:shaped",
        "prompts": 50,
        "prompts_file": "p.jsonl",
        "holdout": 0.3,
        "balance": 0.25,
        "run_name": "x",
        "base_model": "starter-2m",
        "seed": 5,
        "data_seed": 6,
        "eval_seed": 7,
        "eval_samples": 2,
        "eval_repeats": 3,
        "from_run": "y",
        "overwrite": True,
    }
    assert {key: config[key] for key in expected} == expected
    # every setting, and not the record of which the user set (``explicit``: not a flag)
    assert set(config) == {f.name for f in dataclasses.fields(GRPOSettings)
                           if "help" in f.metadata}
    assert "explicit" not in config


def test_trl_config_mapping():
    settings = parse(
        "--no-scale-rewards", "--mask-truncated", "--epsilon-high", "0.28", "--beta", "0"
    )
    kwargs = grpo_config_kwargs(settings, 2e-3, "/tmp/out", "cpu")
    assert kwargs["scale_rewards"] == "none"
    assert kwargs["mask_truncated_completions"] is True
    assert kwargs["epsilon_high"] == 0.28
    assert kwargs["beta"] == 0.0
    assert kwargs["per_device_train_batch_size"] == 32  # four prompts' groups of 8
    # rollouts sample like the evaluations
    assert (kwargs["temperature"], kwargs["top_p"]) == (0.8, 0.95)
    assert kwargs["num_generations"] == 8
    assert kwargs["learning_rate"] == 2e-3
    # CPU-safe values set explicitly (TRL's defaults are bf16 and gradient checkpointing)
    assert kwargs["use_cpu"] and not kwargs["bf16"] and not kwargs["gradient_checkpointing"]
    assert kwargs["logging_steps"] == 1
    plain = grpo_config_kwargs(parse(), 1e-3, "/tmp/out", "cuda")
    assert plain["scale_rewards"] == "group" and plain["epsilon_high"] is None
    assert plain["bf16"] and not plain["use_cpu"]


def test_trl_accepts_the_mapped_config(tmp_path):
    from trl import GRPOConfig

    config = GRPOConfig(
        **grpo_config_kwargs(parse("--loss-type", "dr_grpo"), 2e-3, str(tmp_path), "cpu")
    )
    assert config.loss_type == "dr_grpo" and config.beta == 0.04


@pytest.mark.parametrize(
    "argv, message",
    [
        (("--num-generations", "8", "--batch-size", "12"), "not a multiple of --num-generations 8"),
        (("--num-generations", "1"), "at least 2"),
        (("--steps", "0"), "--steps must be at least 1"),
        (("--stop-on", "hack,vibes"), "unknown alarm"),
        (("--beta", "-1"), "--beta must be a number >= 0"),
        (("--beta", "-0.5"), "--beta must be a number >= 0"),
        (("--temperature", "0"), "--temperature must be a number above 0"),
        (("--top-p", "1.5"), r"--top-p must be in \(0, 1\]"),
        (("--epsilon-high", "-0.1"), "--epsilon-high must be a number >= 0"),
        (("--max-completion-length", "0"), "--max-completion-length must be at least 1"),
    ],
)
def test_impossible_settings_are_refused(argv, message):
    with pytest.raises(PosttrainError, match=message):
        check_grpo_settings(parse(*argv))


def test_unknown_loss_type_is_a_usage_error(capsys):
    with pytest.raises(SystemExit):
        parse("--loss-type", "ppo2")
    assert "invalid choice: 'ppo2'" in capsys.readouterr().err


def test_unknown_loss_type_refused_by_the_library_too():
    settings = dataclasses.replace(GRPOSettings(), loss_type="ppo2")
    with pytest.raises(PosttrainError, match="not a GRPO loss"):
        check_grpo_settings(settings)


@pytest.mark.parametrize(
    "parameters, rate", [(2e6, 3e-4), (10e6, 3e-4), (135e6, 2e-4), (500e6, 2e-5), (1.5e9, 5e-6)]
)
def test_default_learning_rate_by_model_size(parameters, rate):
    assert default_learning_rate(int(parameters)) == rate


def test_help_documents_every_flag():
    parser = build_parser()
    subparsers = next(a for a in parser._actions if isinstance(a, argparse._SubParsersAction))
    grpo = subparsers.choices["grpo"]
    flags = {option for action in grpo._actions for option in action.option_strings}
    for field in dataclasses.fields(GRPOSettings):
        if field.name == "explicit":  # which fields the flags set: not a flag itself
            continue
        assert "--" + field.name.replace("_", "-") in flags


def test_the_training_seed_reaches_trl_and_the_data_seed_the_prompt_writer():
    settings = parse("--seed", "3", "--data-seed", "9")
    assert grpo_config_kwargs(settings, 1e-4, "/tmp/out", "cpu")["seed"] == 3
    assert settings.data_config().seed == 9


@pytest.mark.parametrize(
    "argv, message",
    [
        (("--learning-rate", "0"), "--learning-rate must be a number above 0"),
        (("--learning-rate", "-1"), "--learning-rate must be a number above 0"),
        (("--learning-rate", "-0.0"), "--learning-rate must be a number above 0"),
        (("--learning-rate", "1e-400"), "--learning-rate must be a number above 0"),
        (("--lora-rank", "0"), "--lora-rank must be at least 1"),
        (("--eval-temperature", "0"), "--eval-temperature must be a number above 0"),
        (("--eval-top-p", "0"), r"--eval-top-p must be in \(0, 1\]"),
        (("--eval-samples", "0"), "--eval-samples must be at least 1"),
        (("--lora-alpha", "-5"), "--lora-alpha must be above 0"),
    ],
)
def test_shared_settings_no_recipe_can_run_with_are_refused(argv, message):
    from posttrain.train.settings import check_recipe_settings

    with pytest.raises(PosttrainError, match=message):
        check_recipe_settings(parse(*argv))


def test_each_recipe_resolves_its_own_default_rate_in_one_place():
    from posttrain.train.dpo.settings import DPOSettings

    # the rate config.json, the console and the trainer all use (one resolution)
    assert parse().resolved_learning_rate(9_000_000) == (3e-4, "default for model size")
    assert DPOSettings().resolved_learning_rate(9_000_000) == (1e-4, "default for model size")
    assert parse("--learning-rate", "1e-5").resolved_learning_rate(9_000_000) == (1e-5, "flag")


@pytest.mark.parametrize("balance", ["-1", "1", "2.5"])
def test_a_balance_outside_a_share_is_refused_before_anything_is_written(balance, tmp_path,
                                                                         capsys):
    from posttrain.cli import main

    runs = tmp_path / "runs"
    assert main(["grpo", "--balance", balance, "--runs-dir", str(runs)]) == 2
    assert "--balance must be a share in [0, 1)" in capsys.readouterr().err
    assert not runs.exists()


def test_a_step_larger_than_the_train_side_is_refused_before_the_model_loads(tmp_path,
                                                                            capsys):
    # TRL would run 0 optimizer steps and the run would read "done"
    from posttrain.cli import main

    runs = tmp_path / "runs"
    code = main(["grpo", "--batch-size", "800000", "--num-generations", "8",
                 "--base-model", "no-such-model-is-loaded", "--runs-dir", str(runs)])
    assert code == 2
    assert "needs 100000 train prompts a step" in capsys.readouterr().err
    assert not runs.exists()


@pytest.mark.parametrize(("flag", "value"), [
    ("--seed", "-1"), ("--seed", "4294967296"), ("--eval-seed", "-3"), ("--data-seed", "-1"),
])
def test_a_seed_numpy_cannot_take_is_refused_before_anything_is_written(flag, value, tmp_path,
                                                                        capsys):
    # transformers' set_seed would raise inside the trainer, after the model loaded
    from posttrain.cli import main

    runs = tmp_path / "runs"
    assert main(["grpo", flag, value, "--runs-dir", str(runs)]) == 2
    assert f"{flag} must be an integer from 0 to 2**32 - 1, got {value}" in (
        capsys.readouterr().err)
    assert not runs.exists()


@pytest.mark.parametrize(("flag", "value", "message"), [
    ("--beta", "nan", "expected a finite number"), ("--learning-rate", "inf", "finite"),
    ("--top-p", "-inf", "finite"), ("--steps", "9" * 30, "must fit a 64-bit integer"),
    ("--steps", "1e3", "expected a whole number"), ("--steps", "20000000", "at most 10000000"),
    ("--prompts", "99999999", "--prompts must be at most"),
])
def test_numbers_no_run_can_use_are_refused_as_they_are_read(flag, value, message, capsys):
    """Non-finite reals, integers past int64 and work no run could finish are refused
    when the flag is read, with one line naming the flag (a --config file: the same)."""
    from posttrain.cli import main

    try:
        code = main(["grpo", f"{flag}={value}", "--base-model", "no-such-model"])
    except SystemExit as stop:  # argparse's refusal of the flag's text
        code = stop.code
    assert code == 2
    error = capsys.readouterr().err.strip().splitlines()[-1]
    assert message in error and flag in error and "\n" not in error, error


def test_every_numeric_flag_refuses_nan_infinity_and_negatives_before_the_model_loads():
    """The audit: every float flag of every recipe refuses nan, inf and -1, and every
    integer flag refuses -1, in the recipe's one check (nothing loads first)."""
    import dataclasses
    import typing

    from posttrain.errors import PosttrainError
    from posttrain.train.dpo.settings import DPOSettings, check_dpo_settings
    from posttrain.train.grpo.settings import GRPOSettings, check_grpo_settings
    from posttrain.train.settings import check_recipe_settings
    from posttrain.train.sft.settings import SFTSettings, check_sft_settings

    for settings_class, check in ((GRPOSettings, check_grpo_settings),
                                  (DPOSettings, check_dpo_settings),
                                  (SFTSettings, check_sft_settings)):
        hints = typing.get_type_hints(settings_class)
        checked = 0
        for field in dataclasses.fields(settings_class):
            kind = hints[field.name]
            if kind in (float, float | None):
                bad = [float("nan"), float("inf"), -1.0]
            elif kind in (int, int | None):
                bad = [-1]
            else:
                continue
            for value in bad:
                settings = dataclasses.replace(settings_class(), **{field.name: value})
                with pytest.raises(PosttrainError, match=field.name.replace("_", "-")):
                    check_recipe_settings(settings)
                    check(settings)
                checked += 1
        assert checked >= 15, f"{settings_class.__name__}: only {checked} flag values checked"


def test_use_vllm_is_refused_here_with_what_is_missing_before_anything_is_written(tmp_path,
                                                                                 capsys):
    from posttrain.cli import main
    from posttrain.train.grpo.settings import vllm_problem

    if vllm_problem() is None:
        pytest.skip("vLLM and a CUDA GPU are here: nothing to refuse")
    runs = tmp_path / "runs"
    assert main(["grpo", "--use-vllm", "--vllm-mode", "server", "--runs-dir", str(runs)]) == 2
    error = capsys.readouterr().err
    assert "--use-vllm:" in error and "leave --use-vllm out" in error
    assert ("vllm package is not installed" in error) or ("no CUDA GPU" in error)
    assert not runs.exists()
    assert main(["grpo", "--vllm-server-url", "http://x:8000", "--runs-dir", str(runs)]) == 2
    assert "only applies with --use-vllm" in capsys.readouterr().err


def test_use_vllm_passes_through_to_trls_config():
    import dataclasses

    from posttrain.train.grpo.settings import GRPOSettings, grpo_config_kwargs

    settings = dataclasses.replace(GRPOSettings(), use_vllm=True, vllm_mode="server",
                                   vllm_server_url="http://gpu-box:8000")
    kwargs = grpo_config_kwargs(settings, 1e-5, "/tmp/out", "cuda:0")
    assert (kwargs["use_vllm"], kwargs["vllm_mode"]) == (True, "server")
    assert kwargs["vllm_server_base_url"] == "http://gpu-box:8000"
    assert "use_vllm" not in grpo_config_kwargs(GRPOSettings(), 1e-5, "/tmp/out", "cpu")


def test_a_default_run_name_names_the_environment_it_trains_on():
    from posttrain.train.dpo.settings import DPOSettings
    from posttrain.train.sft.settings import SFTSettings

    for settings_class, recipe in ((GRPOSettings, "grpo"), (DPOSettings, "dpo"),
                                   (SFTSettings, "sft")):
        settings = settings_class()
        settings.name_run_for("library")
        assert settings.run_name == f"library-{recipe}-v1"
    chosen = GRPOSettings(run_name="mine")
    chosen.name_run_for("library")
    assert chosen.run_name == "mine"  # a name the user gave stays
    refund = GRPOSettings()
    refund.name_run_for("refund")
    assert refund.run_name == "refund-grpo-v1"
    odd = GRPOSettings()
    odd.name_run_for("my rule/v2")
    assert odd.run_name == "my-rule-v2-grpo-v1"  # a folder name, whatever the env's name
