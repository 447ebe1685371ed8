"""GRPO rollouts through posttrain's batched sampler (`--rollout posttrain`): what auto picks
and refuses, and, on a real TRL GRPOTrainer, that the completions it hands TRL end the way
TRL's own do and carry the logprobs TRL's trainer computes for the same tokens (the
reference path), on the starter and on SmolLM2's real weights."""

from __future__ import annotations

import json
from copy import deepcopy

import pytest

from posttrain.cli import main
from posttrain.errors import PosttrainError
from posttrain.train.grpo.rollout import choose_rollout, rollout_seed
from tests.adam_step import ROUNDING, assert_same_first_step
from tests.grpo_rollouts import logprob_gaps, rollout_batch, short_smollm2, trainer_logprobs

# sampler vs trainer logprobs of the same tokens: the two batch the rows differently (the
# sampler runs the shared system prompt once, TRL pads each row and uses its chunked fused
# LM head), so the float sums differ in their last bits: the largest gap measured here was
# 3e-6 on starter-2m and 2e-5 on SmolLM2; asserted at 1e-3 for other CPUs' rounding
LOGPROB_TOLERANCE = 1e-3


def test_auto_keeps_trl_on_the_test_starters_and_where_posttrain_cannot_run():
    small = choose_rollout("auto", use_vllm=False, multi_turn=False, trl_recorded=True)
    assert small.name == "trl" and "starter-2m" in small.reason
    assert choose_rollout("auto", use_vllm=False, multi_turn=False,
                          trl_recorded=False).name == "posttrain"
    vllm = choose_rollout("auto", use_vllm=True, multi_turn=False, trl_recorded=False)
    assert vllm.name == "trl" and "vLLM" in vllm.reason
    turns = choose_rollout("auto", use_vllm=False, multi_turn=True, trl_recorded=False)
    assert turns.name == "trl" and "tool loop" in turns.reason
    assert choose_rollout("posttrain", use_vllm=False, multi_turn=False,
                          trl_recorded=True).name == "posttrain"
    with pytest.raises(PosttrainError, match="tool loop is TRL's"):
        choose_rollout("posttrain", use_vllm=False, multi_turn=True, trl_recorded=False)
    with pytest.raises(PosttrainError, match="expected one of"):
        choose_rollout("vllm", use_vllm=False, multi_turn=False, trl_recorded=False)


def test_rollout_seeds_are_fixed_by_the_run_seed_and_differ_between_rows_and_calls():
    seeds = {rollout_seed(0, process, call, row)
             for process in range(2) for call in range(3) for row in range(16)}
    assert len(seeds) == 96
    assert rollout_seed(7, 0, 1, 2) == rollout_seed(7, 0, 1, 2) != rollout_seed(8, 0, 1, 2)


def test_the_cli_refuses_posttrain_rollouts_with_vllm(capsys):
    assert main(["grpo", "--rollout", "posttrain", "--use-vllm", "--steps", "1"]) == 2
    assert "cannot go with --use-vllm" in capsys.readouterr().err


def check_rollouts(trainer, output, handed, completion_length: int) -> float:
    """Completions end at one of TRL's eos ids or at the length limit; the sampler's
    logprobs equal TRL's logprob forward over the same tokens. Returns the largest gap."""
    ends = set(trainer.eos_token_ids)
    for ids in handed["completion_ids"]:
        assert ids and (ids[-1] in ends or len(ids) == completion_length), ids
        assert all(token not in ends for token in ids[:-1])
    completion_ids = output["completion_ids"]
    for row, sampled in enumerate(handed["completion_ids"]):
        assert completion_ids[row, :len(sampled)].tolist() == sampled
    gap = max(logprob_gaps(trainer_logprobs(trainer, output), handed))
    assert gap < LOGPROB_TOLERANCE, gap
    return gap


@pytest.mark.slow
def test_posttrain_rollouts_match_the_trainer_on_the_starter(starter_2m):
    from posttrain.policy.models import Policy

    policy = Policy(model=deepcopy(starter_2m.model), tokenizer=deepcopy(starter_2m.tokenizer),
                    name="starter-2m", device="cpu", dtype="float32")
    trainer, output, handed = rollout_batch(policy, completion_length=48, generations=4)
    assert len(handed["completion_ids"]) == 16
    check_rollouts(trainer, output, handed, 48)


@pytest.mark.slow
def test_posttrain_rollouts_match_the_trainer_on_smollm2(smollm2_folder):
    policy = short_smollm2()  # its first 8 layers (tests/grpo_rollouts.py)
    trainer, output, handed = rollout_batch(policy, completion_length=12, generations=2)
    assert len(handed["completion_ids"]) == 8
    check_rollouts(trainer, output, handed, 12)


@pytest.mark.slow
def test_a_grpo_run_with_posttrain_rollouts_and_shared_prefix_says_so_and_trains(
        starter_2m_folder, tmp_path, monkeypatch):
    import tempfile

    scratch = tmp_path / "tmp"
    scratch.mkdir()
    monkeypatch.setattr(tempfile, "tempdir", str(scratch))  # where the trainer's scratch goes
    runs = tmp_path / "runs"
    code = main(["grpo", "--base-model", "starter-2m", "--prompts", "60", "--steps", "2",
                 "--num-generations", "4", "--eval-samples", "1", "--eval-repeats", "1",
                 "--monitor-every", "0", "--rollout", "posttrain", "--shared-prefix", "on",
                 "--run-name", "rolled", "--runs-dir", str(runs)])
    assert code in (0, 1)
    summary = json.loads((runs / "rolled" / "summary.json").read_text())
    assert summary["status"] == "done"
    assert summary["rollout"] == {"sampler": "posttrain",
                                  "reason": "asked for (--rollout posttrain)"}
    # the update ran the prompts' shared head once per pass (posttrain.train.grpo.shared_prefix)
    assert summary["shared_prefix"] == {"on": True, "reason": "asked for (--shared-prefix on)"}
    steps = [json.loads(line)["metrics"] for line in (runs / "rolled" / "metrics.jsonl").open()]
    trained = [m for m in steps if "step_time" in m]
    assert len(trained) == 2
    assert all(m["completion_length"] > 0 and m["generation_time"] > 0 for m in trained)
    # the trainer's scratch folder went with the run
    assert not list(scratch.glob("posttrain-*")), list(scratch.iterdir())
    # completions end where TRL reads them as ended: not all cut at the length limit
    assert min(m["completion_clipped_ratio"] for m in trained) < 1


def test_the_micro_batch_must_divide_the_step(capsys):
    assert main(["grpo", "--micro-batch", "5", "--steps", "1"]) == 2
    assert "--micro-batch 5 must be at least 1 and divide the step's 32" in capsys.readouterr().err


@pytest.mark.slow
def test_micro_batches_take_the_same_step_as_one_pass(starter_2m_folder, tmp_path):
    """A GRPO step of 16 completions (the default bnpo loss), trained in one pass and in
    passes of 4: the same samples (generated together either way), loss, gradient norm and
    adapter, up to float rounding. (Later steps part: TRL shuffles the step's completions
    before splitting them, which draws from the random stream the next sampling uses.)"""
    from safetensors.torch import load_file

    runs = tmp_path / "runs"
    losses, adapters = {}, {}
    for micro in ("16", "4"):
        name = f"micro-{micro}"
        code = main(["grpo", "--base-model", "starter-2m", "--prompts", "60", "--steps", "1",
                     "--num-generations", "4", "--eval-samples", "1", "--eval-repeats", "1",
                     "--monitor-every", "0", "--rollout", "trl", "--micro-batch", micro,
                     "--run-name", name, "--runs-dir", str(runs)])
        assert code in (0, 1)
        steps = [json.loads(line)["metrics"] for line in (runs / name / "metrics.jsonl").open()]
        losses[micro] = [(m["loss"], m["grad_norm"]) for m in steps if "step_time" in m]
        adapters[micro] = load_file(str(runs / name / "adapter" / "adapter_model.safetensors"))
    assert len(losses["16"]) == len(losses["4"]) == 1
    # loss and gradient norm: float32 sums in another order (ROUNDING, tests/adam_step.py)
    assert losses["4"][0] == pytest.approx(losses["16"][0], rel=ROUNDING)
    # up to what one AdamW step on float32-rounded gradients can differ by (any CPU)
    assert_same_first_step(adapters["16"], adapters["4"])


def test_micro_batches_in_the_trl_config():
    from posttrain.train.grpo.settings import GRPOSettings, grpo_config_kwargs

    settings = GRPOSettings(num_generations=4, batch_size=16)
    assert settings.micro_batch_for(large_model=False) == 16
    assert settings.micro_batch_for(large_model=True) == 4
    assert settings.micro_batch_for(large_model=True, shared_prefix=True) == 8
    assert settings.micro_batch_for(large_model=True, world_size=8) == 2
    one_pass = grpo_config_kwargs(settings, 1e-4, "/tmp/out", "cpu", micro_batch=16)
    assert (one_pass["per_device_train_batch_size"], one_pass["gradient_accumulation_steps"],
            one_pass["steps_per_generation"], one_pass["loss_type"]) == (16, 1, 1, "bnpo")
    passes = grpo_config_kwargs(settings, 1e-4, "/tmp/out", "cpu", micro_batch=4)
    assert (passes["per_device_train_batch_size"], passes["gradient_accumulation_steps"],
            passes["steps_per_generation"], passes["loss_type"]) == (4, 4, 4, "dapo")
    # two processes: bnpo's per-process means are not dapo's global one; kept as asked
    assert grpo_config_kwargs(settings, 1e-4, "/tmp/out", "cpu", world_size=2,
                              micro_batch=4)["loss_type"] == "bnpo"
    with pytest.raises(PosttrainError, match="must divide"):
        grpo_config_kwargs(settings, 1e-4, "/tmp/out", "cpu", micro_batch=3)
