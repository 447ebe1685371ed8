"""DPO with a LoRA adapter on TRL's DPOTrainer, from on-policy preference pairs.

The algorithm is TRL's: for each pair, the policy's and the reference's
log-probabilities of the chosen and the rejected reply give the implicit reward
``beta * (log pi - log ref)`` of each side; the loss (``--loss-type``, sigmoid by
default: ``-log sigmoid(reward_chosen - reward_rejected)``) pushes the chosen side's
implicit reward above the rejected one's. The reference is the base model with the
adapter switched off (``ref_model=None`` with a PEFT model), so there is one copy of
the weights in memory. DPO never samples while it trains.

The pairs (``posttrain.train.training_data.pairs``) are on-policy: the base policy answers each
train prompt ``--pair-samples`` times at the evaluation temperature, the environment
scores every reply, and a better reply is paired with a worse one of similar length.
``--pairs FILE`` trains on a file written by ``export_preference`` instead.
``--from-run`` is iterated DPO: the shared flow merges that run's adapter into the
base, this recipe samples fresh pairs from the merged policy, trains a new adapter
against it as the reference, and saves the merged policy under ``merged/``.

Where we deviate from the seed recipe, and why:
- A step takes ``--batch-size`` pairs (8) as one micro-batch, where the seed took
  2 per device x 4 accumulated: the same 8 pairs per step, and on a CPU one
  micro-batch is faster than four.
- ``--learning-rate`` defaults by model size (``DPO_LEARNING_RATE_BY_SIZE``: 5e-5 for
  the starter models), not to the seed's 5e-6, which is for a 1.5B model.
- The constructed-negative share is a flag (the seed fixed it at 0.3), and with no
  sampled pair there are no constructed pairs (the seed forced at least one): see
  ``posttrain.train.training_data.pairs``.
- ``exo_pair`` gets ``label_smoothing`` 1e-3 unless ``--label-smoothing`` says
  otherwise: TRL refuses it at 0.
"""

from __future__ import annotations

import math
from dataclasses import dataclass, field
from typing import Any

from posttrain.envs import DEFAULT_ENV
from posttrain.envs.base import ConstructedNegatives, Env, has_hook, require_single_turn
from posttrain.errors import PosttrainError
from posttrain.train.settings import RecipeSettings, rate_for_size, trainer_runtime_kwargs
from posttrain.train.training_data.pairs import DEFAULT_CONSTRUCTED_SHARE, load_pairs

# loss types TRL 1.16's DPOTrainer accepts (checked against its DPOConfig help text)
DPO_LOSS_TYPES = (
    "sigmoid",
    "hinge",
    "ipo",
    "exo_pair",
    "nca_pair",
    "robust",
    "bco_pair",
    "sppo_hard",
    "aot",
    "aot_unpaired",
    "apo_zero",
    "apo_down",
    "discopop",
    "sft",
    "sigmoid_norm",
)
# The supervised term beside the preference loss by default (RPO-style). Measured on the
# 9.1M starter (docs/recipes/dpo.md): without it, the seed's DPO (beta 0.1, 5e-5) read
# +0.07 with the well_formed guard falling 0.85 -> 0.61 (DPO pushed both sides of the
# pairs down and the copy into the tool call broke); the seed's value stays reachable
# with --sft-weight 0.
DEFAULT_SFT_WEIGHT = 1.0
# EXO's epsilon; the paper's recommended value, and TRL refuses 0 for exo_pair
EXO_LABEL_SMOOTHING = 1e-3

# LoRA learning rates for DPO by base-model size (parameters, rate). On the 9.1M starter
# (docs/recipes/dpo.md, "Choosing the defaults"), with the sft term and constructed
# negatives on and beta 0.3: 1e-4 moved +0.19 with every category held; the seed's
# shape (5e-5, beta 0.1, neither) read +0.07 with the well_formed guard falling. The
# larger sizes are not measured here; they step down to the seed's 5e-6 for 1.5B.
DPO_LEARNING_RATE_BY_SIZE = (
    (50e6, 1e-4),
    (300e6, 2e-5),
    (1e9, 1e-5),
)
DPO_LARGE_MODEL_LEARNING_RATE = 5e-6
# beta by size: a model this small needs a tighter leash to its reference (at 0.1 with
# the rest as above it lost 0.17 on off-topic prompts); above it, the seed's 0.1
SMALL_MODEL_PARAMETERS = 50e6
SMALL_MODEL_BETA = 0.3
SEED_BETA = 0.1


def dpo_default_learning_rate(parameters: int) -> float:
    """The DPO LoRA learning rate used when ``--learning-rate`` is not given."""
    return rate_for_size(DPO_LEARNING_RATE_BY_SIZE, DPO_LARGE_MODEL_LEARNING_RATE, parameters)


@dataclass
class DPOSettings(RecipeSettings):
    """Every knob of the DPO recipe (see ``posttrain dpo --help``)."""

    learning_rate: float | None = field(
        default=None,
        metadata={
            "help": "LoRA learning rate; default by model size: 1e-4 up to 50M parameters, "
            "2e-5 up to 300M, 1e-5 up to 1B, 5e-6 above (lower than GRPO's: see "
            "docs/recipes/dpo.md)"
        },
    )
    steps: int = field(default=60, metadata={"help": "optimizer steps",
                                             "range": (None, 10_000_000)})
    beta: float | None = field(
        default=None,
        metadata={
            "help": "how far from the reference (adapter off) the policy may move; default by "
            f"model size: {SMALL_MODEL_BETA:g} up to 50M parameters, {SEED_BETA:g} (the seed's) "
            "above"
        },
    )
    loss_type: str = field(
        default="sigmoid",
        metadata={"help": "the DPO loss (TRL DPOConfig.loss_type)", "choices": DPO_LOSS_TYPES},
    )
    sft_weight: float | None = field(
        default=None,
        metadata={
            "help": "weight of a supervised term (the chosen reply's negative log-likelihood, "
            "TRL's 'sft' loss) added to the DPO loss, as in RPO; it keeps DPO from pushing "
            f"both replies down, which breaks a small policy's tool calls. Default "
            f"{DEFAULT_SFT_WEIGHT:g} (0 with --loss-type sft); 0 = off, the seed recipe's"
        },
    )
    label_smoothing: float | None = field(
        default=None,
        metadata={
            "help": "label smoothing of the robust, exo_pair and aot losses; default 0, "
            f"or {EXO_LABEL_SMOOTHING:g} for exo_pair (which needs it above 0)"
        },
    )
    pair_samples: int = field(
        default=8,
        metadata={
            "help": "replies per train prompt when building on-policy pairs; a policy that "
            "rarely passes (or rarely fails) needs more",
            "range": (None, 1024),
        },
    )
    pairs: str | None = field(
        default=None,
        metadata={
            "help": "a pairs JSONL (export_preference / posttrain pairs build) instead of "
            "on-policy sampling",
            "metavar": "FILE",
        },
    )
    skip_invalid: bool = field(
        default=False,
        metadata={"help": "with --pairs: drop bad lines (and count them) instead of stopping"},
    )
    constructed_negatives: bool | None = field(
        default=None,
        metadata={
            "help": "add (own passing reply, the environment's known-bad reply) pairs where it "
            "knows one (refund: an invented lookup on prompts without an id). Default: on "
            "when pairs are sampled and the environment has the hook, off with --pairs; "
            "--no-constructed-negatives is the seed recipe's"
        },
    )
    constructed_share: float = field(
        default=DEFAULT_CONSTRUCTED_SHARE,
        metadata={"help": "cap on constructed pairs, as a share of the sampled pairs"},
    )
    min_margin: float = field(
        default=0.5,
        metadata={"help": "least raw-score gap between the chosen and the rejected reply"},
    )
    max_pairs_per_prompt: int = field(
        default=2, metadata={"help": "pairs one prompt may give at most",
                             "range": (None, 10_000)}
    )
    batch_size: int = field(default=8, metadata={"help": "pairs per optimizer step",
                                                 "range": (None, 100_000)})
    max_length: int = field(
        default=1024,
        metadata={"help": "longest prompt + reply in tokens; longer pairs are cut at the end",
                  "range": (None, 1_000_000)},
    )
    run_name: str = field(
        default=f"{DEFAULT_ENV}-dpo-v1",
        metadata={"help": "the run's name: its folder and dashboard entry (left at the "
                          "default, another environment's name replaces 'refund')"},
    )

    def default_learning_rate(self, parameters: int) -> float:
        """The learning rate when ``--learning-rate`` is not given (DPO's table)."""
        return dpo_default_learning_rate(parameters)

    def resolved_sft_weight(self) -> float:
        """``--sft-weight``, or the default: ``DEFAULT_SFT_WEIGHT`` beside a preference
        loss, 0 when the loss is ``sft`` already."""
        if self.sft_weight is not None:
            return self.sft_weight
        return 0.0 if self.loss_type == "sft" else DEFAULT_SFT_WEIGHT

    def resolved_beta(self, parameters: int) -> float:
        """``--beta``, or the default for a model of ``parameters``."""
        if self.beta is not None:
            return self.beta
        return SMALL_MODEL_BETA if parameters <= SMALL_MODEL_PARAMETERS else SEED_BETA

    def resolved_constructed_negatives(self, env: Any = None) -> bool:
        """``--constructed-negatives`` / ``--no-...``, or on unless ``--pairs`` is given or
        the environment has no ``constructed_negative`` hook."""
        if self.constructed_negatives is not None:
            return self.constructed_negatives
        return not self.pairs and (env is None or has_hook(env, ConstructedNegatives))

    def resolved_defaults(self, parameters: int) -> dict[str, Any]:
        return {"beta": self.resolved_beta(parameters),
                "sft_weight": self.resolved_sft_weight(),
                "constructed_negatives": self.resolved_constructed_negatives(),
                "label_smoothing": self.resolved_label_smoothing()}

    def resolved_label_smoothing(self) -> float:
        if self.label_smoothing is not None:
            return self.label_smoothing
        return EXO_LABEL_SMOOTHING if self.loss_type == "exo_pair" else 0.0

    def per_step_batch(self) -> int:
        return self.batch_size

    def check(self) -> None:
        super().check()
        check_dpo_settings(self)

    def check_env(self, env: Env) -> None:
        require_single_turn(env, "posttrain dpo")


def check_dpo_settings(settings: DPOSettings) -> None:
    """Refuse impossible settings, and read ``--pairs``, before anything is loaded or written.

    Raises ``PosttrainError`` (``InputFileError`` for a bad pairs line, naming it).
    """
    if settings.loss_type not in DPO_LOSS_TYPES:
        raise PosttrainError(
            f"--loss-type {settings.loss_type!r} is not a DPO loss this TRL accepts; "
            f"use one of {', '.join(DPO_LOSS_TYPES)}"
        )
    sft_weight = settings.resolved_sft_weight()
    if not (math.isfinite(sft_weight) and sft_weight >= 0):
        raise PosttrainError(f"--sft-weight must be a number >= 0, got {sft_weight}")
    if sft_weight and settings.loss_type == "sft":
        raise PosttrainError(
            "--sft-weight adds an sft term to a preference loss; with --loss-type sft the "
            "loss is that term alone, so leave --sft-weight at 0"
        )
    if settings.steps < 1:
        raise PosttrainError(f"--steps must be at least 1, got {settings.steps}")
    if settings.beta is not None and not (math.isfinite(settings.beta) and settings.beta > 0):
        raise PosttrainError(f"--beta must be a number above 0, got {settings.beta}")
    smoothing = settings.resolved_label_smoothing()
    if settings.loss_type == "exo_pair" and smoothing <= 0:
        raise PosttrainError("--loss-type exo_pair needs --label-smoothing above 0 (e.g. 1e-3)")
    if settings.loss_type == "robust" and not 0.0 <= smoothing < 0.5:
        raise PosttrainError(
            f"--loss-type robust needs --label-smoothing in [0, 0.5), got {smoothing}"
        )
    if not (math.isfinite(smoothing) and 0.0 <= smoothing < 1.0):
        raise PosttrainError(f"--label-smoothing must be in [0, 1), got {smoothing}")
    if settings.pair_samples < 2:
        raise PosttrainError(
            f"--pair-samples must be at least 2 (a pair needs two replies), got "
            f"{settings.pair_samples}"
        )
    if not (math.isfinite(settings.min_margin) and settings.min_margin > 0):
        raise PosttrainError(f"--min-margin must be a number above 0, got {settings.min_margin}")
    if settings.max_pairs_per_prompt < 1:
        raise PosttrainError(
            f"--max-pairs-per-prompt must be at least 1, got {settings.max_pairs_per_prompt}"
        )
    if not (math.isfinite(settings.constructed_share) and settings.constructed_share >= 0):
        raise PosttrainError(f"--constructed-share must be >= 0, got {settings.constructed_share}")
    if settings.batch_size < 1:
        raise PosttrainError(f"--batch-size must be at least 1, got {settings.batch_size}")
    if settings.max_length < 16:
        raise PosttrainError(f"--max-length must be at least 16 tokens, got {settings.max_length}")
    if settings.pairs:
        if settings.constructed_negatives:  # asked for by name: the default is off here
            raise PosttrainError(
                "--constructed-negatives is built from the policy's own samples and cannot be "
                "added to --pairs; build the file with `posttrain pairs build "
                "--constructed-negatives` instead"
            )
        load_pairs(settings.pairs, skip_invalid=settings.skip_invalid)
    elif settings.skip_invalid:
        raise PosttrainError("--skip-invalid only applies to --pairs FILE")


def dpo_config_kwargs(
    settings: DPOSettings, learning_rate: float, output_dir: str, device: str,
    parameters: int = 0, world_size: int = 1, bf16: bool | None = None,
) -> dict[str, Any]:
    """The ``trl.DPOConfig`` arguments for these settings and a model of ``parameters``
    (pure: tested without TRL)."""
    on_gpu = device.startswith("cuda")
    return {
        "output_dir": output_dir,
        "max_steps": settings.steps,
        "per_device_train_batch_size": settings.batch_size // world_size,
        "gradient_accumulation_steps": 1,
        "learning_rate": learning_rate,
        "beta": settings.resolved_beta(parameters),
        **dpo_loss_kwargs(settings),
        "label_smoothing": settings.resolved_label_smoothing(),
        "max_length": settings.max_length,
        "seed": settings.seed,
        **trainer_runtime_kwargs(on_gpu, settings.report_to, bf16),
    }


def dpo_loss_kwargs(settings: DPOSettings) -> dict[str, Any]:
    """``loss_type`` (a list in TRL 1.16: several losses, summed) and, with an sft term,
    ``loss_weights``."""
    sft_weight = settings.resolved_sft_weight()
    if not sft_weight:
        return {"loss_type": [settings.loss_type]}
    return {"loss_type": [settings.loss_type, "sft"], "loss_weights": [1.0, sft_weight]}

