"""Supervised fine-tuning (SFT) with a LoRA adapter on TRL's SFTTrainer: the cold start.

A small real model that never calls a tool gives GRPO nothing to learn from: every reply
in a group scores the same, so every advantage is zero. The field's answer is a short
supervised run on demonstrations first. This recipe is that run, with the same shape as
the others (holdout, noise band, paired delta, category table, run store, report):

- demonstrations come from ``--demos FILE`` (TRL's conversational format, see
  ``posttrain.train.training_data.demos``) or ``--demos reference``:
  ``--demos-per-prompt`` replies per
  *train* prompt from the environment's reference agent, kept only when the rule passes
  them; any demonstration of a holdout scenario or prompt is dropped either way;
- the loss is on the assistant replies only (prompt-completion records);
- ``posttrain grpo --from-run <this run>`` then starts from the adapter, merged.
"""

from __future__ import annotations

from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

from posttrain.envs import DEFAULT_ENV
from posttrain.envs.base import Env, ReferenceAgentSource, is_multi_turn, require_hook
from posttrain.errors import PosttrainError
from posttrain.train.settings import RecipeSettings, rate_for_size, trainer_runtime_kwargs
from posttrain.train.training_data.demos import REFERENCE, load_demos

#: SFT's LoRA rates by model size: a supervised step is steadier than a policy-gradient
#: one, so the small models take the same rates as GRPO and the large ones a bit more.
#: The starters (1.6M and 9.1M) take 1e-3: at 3e-4 (and less) 40-60 steps taught them to
#: *open* a tool call before they learned *when* to, and on prompts with nothing to copy
#: the call broke (refund starter@1, 9.1M: well_formed 0.86 -> 0.78 at 3e-4 x 40, 0.69 at
#: 5e-5; 0.96 at 1e-3 x 60, no category down; benchmarks/RESULTS.md, SFT seed study)
SFT_LEARNING_RATE_BY_SIZE = ((10e6, 1e-3), (50e6, 3e-4), (300e6, 2e-4), (1e9, 5e-5))
SFT_LARGE_MODEL_LEARNING_RATE = 2e-5
#: Demonstrations per forward/backward pass on a model of 50M parameters or more. A pass
#: holds every layer's activations of its tokens for the backward (about 1 MB a token on
#: SmolLM2 under bf16 autocast); 8 demonstrations of ~330 tokens in one pass peaked the
#: run at 5.2 GiB, passes of 2 at 2.7 GiB, the step 5.0 -> 5.4 s (benchmarks/RESULTS.md)
SFT_LARGE_MODEL_MICRO_BATCH = 2


def sft_default_learning_rate(parameters: int) -> float:
    return rate_for_size(SFT_LEARNING_RATE_BY_SIZE, SFT_LARGE_MODEL_LEARNING_RATE, parameters)


@dataclass
class SFTSettings(RecipeSettings):
    """Every knob of the SFT recipe (see ``posttrain sft --help``)."""

    learning_rate: float | None = field(
        default=None,
        metadata={
            "help": "LoRA learning rate; default by model size: 1e-3 up to 10M parameters (the "
            "starters), 3e-4 up to 50M, "
            "2e-4 up to 300M, 5e-5 up to 1B, 2e-5 above"
        },
    )
    demos: str = field(
        default=REFERENCE,
        metadata={
            "help": "'reference': demonstrations written by the environment's reference "
            "agent on the train prompts; or a JSONL file, one conversation per line "
            '({"messages": [...]}, loss on every assistant turn) or {"prompt": [...], '
            '"completion": [...]}. Demonstrations of holdout prompts are dropped',
            "metavar": "reference|FILE",
        },
    )
    demos_per_prompt: int = field(
        default=2,
        metadata={"help": "with --demos reference: replies per train prompt (identical "
                          "ones are kept once)", "range": (None, 1024)},
    )
    # 60, not 40: the starters learn when to call a tool only after they learned to
    # open one (see SFT_LEARNING_RATE_BY_SIZE); on SmolLM2 a step is ~24 s on 2 cores
    steps: int = field(default=60, metadata={"help": "optimizer steps",
                                             "range": (None, 10_000_000)})
    batch_size: int = field(default=8, metadata={"help": "demonstrations per optimizer step",
                                                 "range": (None, 100_000)})
    max_length: int = field(
        default=1024,
        metadata={"help": "longest prompt + reply in tokens; longer ones are cut",
                  "range": (None, 1_000_000)},
    )
    micro_batch: int | None = field(
        default=None,
        metadata={"help": "demonstrations per forward/backward pass: a step's --batch-size "
                          "demonstrations run in passes of this many whose gradients add up "
                          "before the one optimizer step (the same step, less memory). "
                          f"Default: {SFT_LARGE_MODEL_MICRO_BATCH} for a model of 50M "
                          "parameters or more, else the whole step (the embedded starters)",
                  "metavar": "N"},
    )
    run_name: str = field(
        default=f"{DEFAULT_ENV}-sft-v1",
        metadata={"help": "the run's name: its folder and dashboard entry (left at the "
                          "default, another environment's name replaces 'refund')"},
    )

    def default_learning_rate(self, parameters: int) -> float:
        """The learning rate when ``--learning-rate`` is not given (SFT's table)."""
        return sft_default_learning_rate(parameters)

    def uses_reference(self) -> bool:
        return self.demos == REFERENCE

    def micro_batch_for(self, large_model: bool, world_size: int = 1) -> int:
        """Demonstrations per forward/backward pass for this run (``--micro-batch`` or its
        default by model size), never more than one process's share of the step."""
        share = max(1, self.batch_size // world_size)
        wanted = self.micro_batch or (SFT_LARGE_MODEL_MICRO_BATCH if large_model else share)
        return min(wanted, share)

    def per_step_batch(self) -> int:
        return self.batch_size

    def check(self) -> None:
        super().check()
        check_sft_settings(self)

    def check_env(self, env: Env) -> None:
        # on the environment the run loads (loading it again would start an OpenEnv app
        # a second time): the reference agent writes single replies
        if not self.uses_reference():
            return
        if is_multi_turn(env):
            raise PosttrainError(
                f"--demos reference writes single replies; {env.name!r} plays episodes: give "
                "--demos FILE with whole conversations (tool calls and tool results)"
            )
        require_hook(env, ReferenceAgentSource, "has no reference agent",
                     "give --demos FILE (a JSONL of conversations)")


def check_sft_settings(settings: SFTSettings) -> None:
    """Refuse impossible settings, and read ``--demos FILE``, before anything loads or is
    written. Raises ``PosttrainError`` (``InputFileError`` naming a bad line)."""
    if settings.steps < 1:
        raise PosttrainError(f"--steps must be at least 1, got {settings.steps}")
    if settings.batch_size < 1:
        raise PosttrainError(f"--batch-size must be at least 1, got {settings.batch_size}")
    if settings.max_length < 16:
        raise PosttrainError(f"--max-length must be at least 16 tokens, got {settings.max_length}")
    if settings.micro_batch is not None and (
            settings.micro_batch < 1 or settings.batch_size % settings.micro_batch):
        raise PosttrainError(f"--micro-batch {settings.micro_batch} must be at least 1 and "
                             f"divide the step's {settings.batch_size} demonstrations "
                             "(--batch-size)")
    if settings.demos_per_prompt < 1:
        raise PosttrainError(
            f"--demos-per-prompt must be at least 1, got {settings.demos_per_prompt}")
    if not settings.uses_reference():
        if not Path(settings.demos).is_file():
            raise PosttrainError(
                f"--demos {settings.demos!r}: no such file; give a JSONL of conversations "
                "or 'reference'"
            )
        load_demos(settings.demos)


def sft_config_kwargs(settings: SFTSettings, learning_rate: float, output_dir: str,
                      device: str, world_size: int = 1, bf16: bool | None = None,
                      micro_batch: int | None = None) -> dict[str, Any]:
    """The ``trl.SFTConfig`` arguments for these settings (pure: tested without TRL).
    ``micro_batch``: demonstrations per forward/backward pass
    (``SFTSettings.micro_batch_for``; default the whole share). The passes' losses are
    divided by the whole step's reply tokens (transformers hands the trainer
    ``num_items_in_batch``), so passes add up to the one-pass step."""
    share = settings.batch_size // world_size
    micro = micro_batch or share
    if share % micro:
        raise PosttrainError(f"--micro-batch {micro} must divide each process's {share} "
                             "demonstrations of a step")
    return {
        "output_dir": output_dir,
        "max_steps": settings.steps,
        "per_device_train_batch_size": micro,
        "gradient_accumulation_steps": share // micro,
        "learning_rate": learning_rate,
        "max_length": settings.max_length,
        # prompt-completion records: the loss is on the completion (the reply) only
        "completion_only_loss": True,
        "packing": False,
        "seed": settings.seed,
        **trainer_runtime_kwargs(device.startswith("cuda"), settings.report_to, bf16),
    }

