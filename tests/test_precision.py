"""The trainer's precision (`--precision auto|fp32|bf16`): what auto picks where, the TRL
configs it sets, and real runs under bf16 autocast on a CPU: an SFT run on the starter, and
GRPO on SmolLM2 whose trainer logprobs stay within a stated distance of the float32
sampler's."""

from __future__ import annotations

import json
import math

import pytest

from posttrain.cli import main
from posttrain.errors import PosttrainError
from posttrain.train.precision import choose_precision
from tests.float_bounds import difference_bound, needs_native_bf16
from tests.grpo_rollouts import float32_logprobs, logprob_gaps, rollout_batch, trainer_logprobs

# bf16 autocast against float32. A worst-case bound on bfloat16's rounding through 30
# layers (tests/float_bounds.py, u = 2**-8) is larger than the logprobs themselves, so the
# bf16 trainer is held to two things derived instead of read off one CPU: (1) with
# autocast off, the same trainer scores the sampler's tokens within the float32 grouping
# bound (so bf16 is the only difference: same tokens, same positions); (2) under bf16 the
# mean per-token gap stays inside GRPO's clip range, log(1 + epsilon): a wider one would
# clip the update by rounding alone. Measured here (AMD EPYC) over 8 SmolLM2 completions of
# 12 tokens: largest gap 0.13, mean 0.026, against log(1.2) = 0.18.


def test_auto_picks_bf16_only_where_it_pays():
    def auto(**where):
        return choose_precision("auto", **where)

    assert auto(on_gpu=True, large_model=False, native_bf16=False).bf16
    assert auto(on_gpu=False, large_model=True, native_bf16=True).bf16
    cpu = auto(on_gpu=False, large_model=True, native_bf16=False)
    assert not cpu.bf16 and "no native bf16" in cpu.reason
    small = auto(on_gpu=False, large_model=False, native_bf16=True)
    assert not small.bf16 and "under 50M" in small.reason
    assert not choose_precision("fp32", on_gpu=True, large_model=True, native_bf16=True).bf16
    emulated = choose_precision("bf16", on_gpu=False, large_model=True, native_bf16=False)
    assert emulated.bf16 and "emulated" in emulated.reason
    with pytest.raises(PosttrainError, match="expected one of"):
        choose_precision("fp16", on_gpu=False, large_model=True, native_bf16=True)


def test_the_trl_configs_take_the_choice():
    from posttrain.train.dpo.settings import DPOSettings, dpo_config_kwargs
    from posttrain.train.grpo.settings import GRPOSettings, grpo_config_kwargs
    from posttrain.train.sft.settings import SFTSettings, sft_config_kwargs

    for bf16 in (True, False):
        assert sft_config_kwargs(SFTSettings(), 1e-4, "/tmp/o", "cpu", bf16=bf16)["bf16"] is bf16
        assert dpo_config_kwargs(DPOSettings(), 1e-4, "/tmp/o", "cpu", bf16=bf16)["bf16"] is bf16
        assert grpo_config_kwargs(GRPOSettings(), 1e-4, "/tmp/o", "cpu",
                                  bf16=bf16)["bf16"] is bf16
    # unset: float32 on a CPU, bf16 on a GPU, as before
    assert grpo_config_kwargs(GRPOSettings(), 1e-4, "/tmp/o", "cpu")["bf16"] is False
    assert grpo_config_kwargs(GRPOSettings(), 1e-4, "/tmp/o", "cuda")["bf16"] is True


def test_the_cli_refuses_an_unknown_precision(capsys):
    with pytest.raises(SystemExit):
        main(["sft", "--precision", "fp16"])
    assert "--precision" in capsys.readouterr().err


@pytest.mark.slow
def test_an_sft_run_under_bf16_autocast_trains_and_says_so(starter_2m_folder, tmp_path):
    runs = tmp_path / "runs"
    code = main(["sft", "--base-model", "starter-2m", "--prompts", "40", "--steps", "3",
                 "--eval-samples", "1", "--eval-repeats", "1", "--precision", "bf16",
                 "--run-name", "half", "--runs-dir", str(runs)])
    assert code in (0, 1)
    summary = json.loads((runs / "half" / "summary.json").read_text())
    assert summary["status"] == "done" and summary["precision"]["bf16"] is True
    steps = [json.loads(line)["metrics"] for line in (runs / "half" / "metrics.jsonl").open()]
    losses = [m["loss"] for m in steps if "loss" in m]
    assert len(losses) == 3 and all(loss == loss and loss < 50 for loss in losses)


@pytest.mark.slow
@needs_native_bf16
def test_grpo_under_bf16_keeps_the_trainer_near_the_sampler_on_smollm2(smollm2_folder):
    """SmolLM2 rollouts sampled in float32; TRL's trainer scores the same tokens under bf16
    autocast: the same tokens as the sampler's (autocast off: within float32's bound) and,
    under bf16, a mean gap inside GRPO's clip range."""
    from posttrain.policy.loading import load_policy
    from posttrain.train.precision import PrecisionChoice

    trainer, output, handed = rollout_batch(load_policy("smollm2"), completion_length=12,
                                            generations=2,
                                            precision=PrecisionChoice(True, "test"))
    bf16_gaps = logprob_gaps(trainer_logprobs(trainer, output), handed)
    float32_gaps = logprob_gaps(float32_logprobs(trainer, output), handed)
    magnitude = max(abs(value) for row in handed["logprobs"] for value in row)
    assert max(float32_gaps) <= difference_bound(trainer.model.config, magnitude)
    assert max(bf16_gaps) > 0  # bf16 did round
    assert sum(bf16_gaps) / len(bf16_gaps) < math.log1p(trainer.args.epsilon)


def test_auto_on_a_cpu_follows_what_was_measured_there():
    from posttrain.train.precision_probe import PrecisionMeasurement

    faster = PrecisionMeasurement(bf16_s=1.0, fp32_s=2.0)
    slower = PrecisionMeasurement(bf16_s=1.9, fp32_s=2.0)  # under a tenth saved: not enough
    chosen = choose_precision("auto", on_gpu=False, large_model=True, native_bf16=True,
                              measured=faster)
    assert chosen.bf16 and "measured here: a training pass 1.00 s in bf16" in chosen.reason
    kept = choose_precision("auto", on_gpu=False, large_model=True, native_bf16=True,
                            measured=slower)
    assert not kept.bf16 and "bf16 does not pay here" in kept.reason
    assert kept.to_dict()["measured"] == {"bf16_s": 1.9, "fp32_s": 2.0, "cached": False,
                                          "bf16_faster": False}
    # an explicit choice is never overruled by a measurement
    assert choose_precision("fp32", on_gpu=False, large_model=True, native_bf16=True,
                            measured=faster).bf16 is False


@pytest.mark.slow
def test_the_measurement_is_made_once_per_machine_and_model(starter_2m_folder, tmp_path):
    from posttrain.policy.loading import load_policy
    from posttrain.train.precision_probe import CACHE_FILE, machine_key, measure_precision

    policy = load_policy("starter-2m", device="cpu", show_progress=False)
    told: list[str] = []
    first = measure_precision(policy.model, cache_dir=tmp_path, model_name="starter-2m",
                              say=told.append)
    assert not first.cached and first.bf16_s > 0 and first.fp32_s > 0
    assert len(told) == 1 and "once per machine and model" in told[0]
    # the weights are as they were: still trainable, no gradient left behind
    assert all(p.requires_grad and p.grad is None for p in policy.model.parameters())
    cache = json.loads((tmp_path / CACHE_FILE).read_text())
    assert set(cache) == {machine_key("starter-2m")}
    again = measure_precision(policy.model, cache_dir=tmp_path, model_name="starter-2m",
                              say=told.append)
    assert again.cached and (again.bf16_s, again.fp32_s) == (first.bf16_s, first.fp32_s)
    assert len(told) == 1  # read, not measured
    assert "measured on this machine before" in again.words()
    # a damaged cache is measured anew and rewritten
    (tmp_path / CACHE_FILE).write_text('{"x": [1, 2, 3]')
    rebuilt = measure_precision(policy.model, cache_dir=tmp_path, model_name="starter-2m")
    assert not rebuilt.cached
    assert machine_key("starter-2m") in json.loads((tmp_path / CACHE_FILE).read_text())
