"""Settings shared by the training recipes: data, evaluation, run folder, model.

Each recipe's settings dataclass (``GRPOSettings``, ``DPOSettings``) extends
``RecipeSettings``; the CLI builds its flags from the fields' ``help`` metadata,
and ``config.json`` holds every field, so a run's folder says exactly how it ran.
"""

from __future__ import annotations

import dataclasses
import math
from dataclasses import dataclass, field
from typing import Any

from posttrain.data.prepare import DataFlags, PreparedData, check_data_config, check_seed
from posttrain.envs import DEFAULT_ENV
from posttrain.envs.base import Env
from posttrain.errors import PosttrainError
from posttrain.policy.vllm_sampler import SAMPLERS, check_vllm_sampler
from posttrain.runs.model_card import push_problem
from posttrain.runs.store import check_store_server, describe_store
from posttrain.text import slug
from posttrain.train.precision import PRECISIONS

# learning rates for a LoRA adapter by base-model size (parameters, rate). The seed's 5e-6
# is for a 1.5B model; the tiny starter learns nothing visible at that rate in 40 steps
# (reference/spike.md). On the 1.6M starter, GRPO at 2e-3 and 1e-3 collapsed the policy
# (KL above 5 by step 10, with-id pass@1 0.23 -> 0.00); 3e-4 moved it (docs/recipes/grpo.md).
LEARNING_RATE_BY_SIZE = (
    (50e6, 3e-4),
    (300e6, 2e-4),
    (1e9, 2e-5),
)
LARGE_MODEL_LEARNING_RATE = 5e-6


def rate_for_size(table: tuple[tuple[float, float], ...], above: float,
                  parameters: int) -> float:
    """The rate of the first ``(parameter limit, rate)`` row the model fits under, else
    ``above``: every recipe's default learning rate is such a table."""
    for limit, rate in table:
        if parameters <= limit:
            return rate
    return above


def default_learning_rate(parameters: int) -> float:
    """The LoRA learning rate used when ``--learning-rate`` is not given."""
    return rate_for_size(LEARNING_RATE_BY_SIZE, LARGE_MODEL_LEARNING_RATE, parameters)


#: the trackers TRL can send its logs to next to posttrain's run store, and the package
#: each one needs (any of them)
TRACKERS: dict[str, tuple[str, ...]] = {
    "none": (),
    "tensorboard": ("tensorboardX", "tensorboard"),
    "wandb": ("wandb",),
    "trackio": ("trackio",),
    "mlflow": ("mlflow",),
}


def tracker_problem(name: str) -> str | None:
    """Why ``--report-to name`` cannot work here, or None."""
    import importlib.util

    if name not in TRACKERS:
        return f"--report-to must be one of {', '.join(TRACKERS)}, got {name!r}"
    packages = TRACKERS[name]
    if packages and not any(importlib.util.find_spec(package) for package in packages):
        extra = " (pip install 'posttrain[track]')" if name == "tensorboard" else ""
        return (f"--report-to {name} needs the {packages[0]} package, which is not installed"
                f"{extra}: install it or leave --report-to out (posttrain's own run store and "
                "dashboard are always on)")
    return None


def trainer_runtime_kwargs(on_gpu: bool, report_to: str = "none",
                           bf16: bool | None = None) -> dict[str, Any]:
    """The TRL config values both recipes set the same way.

    TRL's defaults are GPU-minded (bf16, gradient checkpointing): set the CPU-safe
    values explicitly (spike.md 9.2); log every step into the run store, save
    nothing mid-run, report to no tracker but ``report_to`` (posttrain's run store is fed
    by its own callback either way), keep the learning rate constant. ``bf16``: autocast
    the trainer to bfloat16 (``posttrain.train.precision``); by default on a GPU only.
    """
    return {
        "use_cpu": not on_gpu,
        "bf16": on_gpu if bf16 is None else bf16,
        "fp16": False,
        "gradient_checkpointing": False,
        "logging_steps": 1,
        "save_strategy": "no",
        "report_to": report_to,
        "disable_tqdm": True,
        "lr_scheduler_type": "constant",
    }


@dataclass
class RecipeSettings(DataFlags):
    """What every recipe shares (the data flags from ``DataFlags``). Fields with ``help``
    become command-line flags."""

    base_model: str | None = field(
        default=None,
        metadata={
            "help": "policy to train: starter, starter-2m, starter-multiturn, smollm2, a hub "
            "id, a local folder or a .gguf file (default: the environment's starter: "
            "starter, or starter-multiturn for refund-multiturn)"
        },
    )
    learning_rate: float | None = field(
        default=None,
        metadata={
            "help": "LoRA learning rate; default by model size: 3e-4 up to 50M parameters, "
            "2e-4 up to 300M, 2e-5 up to 1B, 5e-6 above"
        },
    )
    seed: int = field(
        default=0,
        metadata={
            "help": "training seed: rollouts, trainer initialisation and data order, the hack "
            "monitor's samples; change it (not --data-seed) for a paired seed study"
        },
    )
    eval_seed: int = field(
        default=0,
        metadata={
            "help": "sampling seed of the holdout evaluations; the same value gives the same "
            "base-policy rows to every run of one data seed"
        },
    )
    eval_samples: int = field(
        default=4, metadata={"help": "samples per holdout prompt in each evaluation",
                             "range": (None, 1024)}
    )
    eval_repeats: int = field(
        default=2,
        metadata={"help": "evaluations of RL's baseline with different sampling seeds (noise "
                  "band): the base policy's, or with a GRPO cold start the cold-started "
                  "policy's (the base is then evaluated once)",
                  "range": (None, 100)},
    )
    eval_temperature: float = field(
        default=0.8, metadata={"help": "sampling temperature of the evaluations"}
    )
    eval_top_p: float = field(default=0.95, metadata={"help": "top-p of the evaluations"})
    sampler: str = field(
        default="transformers",
        metadata={"help": "what samples the before/after holdout evaluations: transformers "
                          "(posttrain's own loop, any device) or vllm (needs the vllm package "
                          "and a CUDA GPU; a hub model or local folder, not a starter)",
                  "choices": SAMPLERS},
    )
    run_name: str = field(
        default=f"{DEFAULT_ENV}-run",
        metadata={"help": "the run's name: its folder and dashboard entry (left at the "
                          "default, another environment's name replaces 'refund')"},
    )
    runs_dir: str | None = field(
        default=None, metadata={"help": "folder holding run folders ($POSTTRAIN_RUNS or ./runs)"}
    )
    store: str | None = field(
        default=None,
        metadata={"help": "the run store: a PostgreSQL URL (postgresql://user@host/db, one "
                          "store a team shares) or a SQLite file ($POSTTRAIN_STORE; default: "
                          "<runs folder>/posttrain.db, or $POSTTRAIN_SERVER when set)"},
    )
    overwrite: bool = field(
        default=False, metadata={"help": "replace an existing run of the same name: the old "
                                 "run is moved aside and removed once the new one ends done; "
                                 "if the new one fails or is stopped, the old one comes back "
                                 "(its folder, and its record in a SQL run store)"}
    )
    from_run: str | None = field(
        default=None,
        metadata={"help": "start from that run's adapter merged into its base model (e.g. "
                          "an sft run before grpo); --base-model then defaults to that run's"},
    )
    env: str = field(
        default=DEFAULT_ENV,
        metadata={"help": "environment name, module:attribute, verifiers:ENV_ID or "
                          "inspect:PKG/TASK"}
    )
    report_to: str = field(
        default="none",
        metadata={
            "help": "also send the trainer's logs to this tracker: none, tensorboard (event "
            "files under <run>/trainer/runs/), wandb, trackio or mlflow; posttrain's own run "
            "store and dashboard stay on",
            "choices": tuple(TRACKERS),
        },
    )
    push_to_hub: str | None = field(
        default=None,
        metadata={"help": "after a finished run, upload the adapter folder (PEFT files, "
                          "tokenizer, model card with the verdict) to this Hub repo; needs "
                          "network access and a Hub token (HF_TOKEN or `hf auth login`)",
                  "metavar": "OWNER/NAME"},
    )
    precision: str = field(
        default="auto",
        metadata={"help": "the trainer's arithmetic: fp32, bf16 (autocast: products in "
                          "bfloat16, weights and optimizer in float32) or auto (bf16 on a GPU, "
                          "and on a CPU with native bf16 for a model of 50M parameters or "
                          "more; fp32 otherwise); the run says which and why",
                  "choices": PRECISIONS},
    )
    plan_only: bool = field(
        default=False,
        metadata={"help": "stop after the run's plan: the base is evaluated once, every "
                          "automatic choice (cold start, precision, rollouts, guards, ...) is "
                          "made and printed with its evidence, and nothing trains"},
    )
    lora_rank: int = field(default=16, metadata={"help": "LoRA rank r"})
    lora_alpha: int = field(default=32, metadata={"help": "LoRA alpha"})
    # the fields set on the command line or in --config (``settings_from_args`` fills it):
    # not a flag and not in config.json. A default a recipe picks from what it measured
    # (GRPO's cold start shape) never replaces one of these.
    explicit: tuple[str, ...] = field(default=(), repr=False, compare=False)

    def default_learning_rate(self, parameters: int) -> float:
        """The learning rate when ``--learning-rate`` is not given; recipes override it."""
        return default_learning_rate(parameters)

    def resolved_learning_rate(self, parameters: int) -> tuple[float, str]:
        """(rate, where it came from): the flag, else this recipe's default for the size."""
        if self.learning_rate is not None:
            return self.learning_rate, "flag"
        return self.default_learning_rate(parameters), "default for model size"

    def per_step_batch(self) -> int:
        """Examples per optimizer step, over every process (GRPO: completions); each recipe
        says its own."""
        return 1

    def check(self) -> None:
        """Refuse settings this recipe cannot run with (``PosttrainError`` naming the
        flag), before anything loads or is written: the shared flags here, a recipe adds
        its own."""
        check_recipe_settings(self)

    def check_world(self, world: int) -> None:
        """Refuse what a launch of ``world`` processes cannot do (before anything loads): a
        step's batch must split evenly across them, and a stop on an alarm, decided on the
        main process, would leave the others waiting."""
        if world <= 1:
            return
        batch = self.per_step_batch()
        if batch % world:
            raise PosttrainError(
                f"--batch-size {batch} does not split across {world} processes: give a "
                f"multiple of {world} (each process takes an equal share of every step)")
        if self.stops_on_alarms():
            raise PosttrainError("--stop-on is not available with several processes yet: the "
                                 "alarm is raised on the main process only; leave it out")
        reason = self.one_process_only()
        if reason:
            raise PosttrainError(reason)

    def check_data(self, data: PreparedData) -> None:
        """Refuse settings that do not fit the prepared prompts (before the model loads);
        a recipe whose settings depend on the data adds its check."""

    def check_env(self, env: Env) -> None:
        """Refuse settings that do not fit the environment (before the data is built); a
        recipe whose settings depend on the environment's hooks adds its check."""

    def training_reward(self) -> str | None:
        """``--reward``'s ``module:function`` when the recipe trains on a reward other than
        the environment's rule, else None (only GRPO trains on a reward)."""
        return None

    def stops_on_alarms(self) -> bool:
        """Whether an alarm may end the run (``--stop-on``; only GRPO watches a run)."""
        return False

    def one_process_only(self) -> str | None:
        """Why these settings need a launch of one process (None when they do not)."""
        return None

    def trainer_output_dir(self, run_folder: Any) -> str | None:
        """Where the trainer writes: the run folder's ``trainer/`` when a tracker is on (its
        event files belong with the run), else None (a temporary folder)."""
        return None if self.report_to == "none" else str(run_folder.file("trainer"))

    def name_run_for(self, env_name: str | None) -> None:
        """Left at its default, the run name names the environment it trains on
        (``library-grpo-v1`` for the library example, not ``refund-grpo-v1``)."""
        default = next(f.default for f in dataclasses.fields(self) if f.name == "run_name")
        prefix = f"{DEFAULT_ENV}-"
        if (self.run_name == default and env_name and env_name != DEFAULT_ENV
                and isinstance(default, str) and default.startswith(prefix)):
            name = slug(env_name)
            if name:
                self.run_name = name + "-" + default[len(prefix):]

    def to_config(self) -> dict[str, Any]:
        """Every field, for ``config.json`` (a store URL's password hidden)."""
        config = dataclasses.asdict(self)
        config.pop("explicit", None)
        if config.get("store"):
            config["store"] = describe_store(config["store"])
        return config

    def resolved_defaults(self, parameters: int) -> dict[str, Any]:
        """Settings whose default depends on others or on the model's size
        (``parameters``), as the run uses them (``config.json`` ``resolved``); a recipe
        adds its own."""
        return {}


def _finite(value: float) -> bool:
    return isinstance(value, (int, float)) and math.isfinite(value)


def check_before_loading(settings: RecipeSettings, world: int) -> None:
    """What a run refuses before anything loads (``PosttrainError``, one line): its flags,
    a launch of ``world`` processes they do not split across, a malformed run server URL.
    ``posttrain.train.recipe.prepare`` runs it first; the recipe commands run it also before
    they import their trainer (about 4 s of libraries), so bad input is said at once."""
    settings.check()
    settings.check_world(world)
    check_store_server()


def check_recipe_settings(settings: RecipeSettings) -> None:
    """Refuse shared settings no recipe can run with, before anything loads or is written.

    The one place the shared flags are checked (each recipe adds its own check for its own
    flags). Raises ``PosttrainError`` naming the flag and what it accepts.
    """
    check_data_config(settings.data_config())
    tracker = tracker_problem(settings.report_to)
    if tracker:
        raise PosttrainError(tracker)
    if settings.push_to_hub is not None:
        problem = push_problem(settings.push_to_hub)
        if problem:
            raise PosttrainError(f"--push-to-hub {settings.push_to_hub}: {problem}")
    check_seed("--seed", settings.seed)
    check_seed("--eval-seed", settings.eval_seed)
    if settings.sampler == "vllm":
        if settings.from_run:
            raise PosttrainError("--sampler vllm with --from-run: the policy starts as an "
                                 "adapter merged in memory, which vLLM cannot load; leave "
                                 "--sampler out for this run")
        check_vllm_sampler(settings.base_model)
    rate = settings.learning_rate
    if rate is not None and not (_finite(rate) and rate > 0):
        raise PosttrainError(
            f"--learning-rate must be a number above 0, got {rate}; leave it out for the "
            "default for the model's size"
        )
    if settings.eval_samples < 1:
        raise PosttrainError(f"--eval-samples must be at least 1, got {settings.eval_samples}")
    if settings.eval_repeats < 1:
        raise PosttrainError(f"--eval-repeats must be at least 1, got {settings.eval_repeats}")
    if not (_finite(settings.eval_temperature) and settings.eval_temperature > 0):
        raise PosttrainError(
            f"--eval-temperature must be a number above 0, got {settings.eval_temperature}"
        )
    if not (_finite(settings.eval_top_p) and 0 < settings.eval_top_p <= 1):
        raise PosttrainError(f"--eval-top-p must be in (0, 1], got {settings.eval_top_p}")
    if settings.lora_rank < 1:
        raise PosttrainError(f"--lora-rank must be at least 1, got {settings.lora_rank}")
    if settings.lora_alpha <= 0:
        raise PosttrainError(f"--lora-alpha must be above 0, got {settings.lora_alpha}")
