"""GRPO with a LoRA adapter on TRL's GRPOTrainer, against the environment's rule reward.

The algorithm is TRL's: for each prompt, ``num_generations`` completions are
sampled from the policy; each completion's reward is the environment's raw rule
score of its first reply (a function, not a judge); the advantage is the reward
minus the group mean, divided by the group's standard deviation unless
``--no-scale-rewards``; the loss is the clipped policy-gradient surrogate,
normalised per ``--loss-type``, plus ``beta`` times the KL to the reference,
which is the base model with the adapter switched off.

Where we deviate from the seed recipe, and why:
- ``--loss-type`` defaults to ``bnpo`` as in the seed (TRL 1.16's own default is
  ``dapo``).
- A step here takes ``--batch-size`` completions (default four prompts' groups,
  32 completions): on the starter, 40 steps of two groups at 3e-4 read flat
  (+0.08 [+0.03, +0.12], inside the noise band), four groups moved it (+0.13
  [+0.07, +0.20]); a step still takes under a second here.
- Rollouts sample like the evaluations, at temperature 0.8 and top-p 0.95
  (``--temperature``, ``--top-p``), not at TRL's 1.0: the reward the trainer sees
  is then the pass rate the report measures. On the starter at 1.0 the with-id
  pass rate is 0.06 against 0.34 at 0.8/0.95 (train prompts, measured), so the
  groups mostly compare two kinds of failure and the run drifted away from tool
  calls (with-id pass@1 0.23 -> 0.16 at learning rate 5e-4).
"""

from __future__ import annotations

import math
from dataclasses import dataclass, field
from typing import Any

from posttrain.data.prepare import PreparedData
from posttrain.envs import DEFAULT_ENV
from posttrain.envs.base import Env, is_multi_turn
from posttrain.errors import PosttrainError
from posttrain.policy.judge import endpoint_judge
from posttrain.policy.vllm_sampler import vllm_problem
from posttrain.score.rubric import trl_scale_rewards
from posttrain.train.grpo.cold_start_choice import COLD_STARTS, check_cold_start
from posttrain.train.grpo.cold_start_shape import COLD_START_SHAPES
from posttrain.train.grpo.rollout import ROLLOUTS
from posttrain.train.grpo.shared_prefix import SHARED_PREFIX_CHOICES
from posttrain.train.settings import RecipeSettings, trainer_runtime_kwargs

# completions per forward/backward pass for a model of real size: a pass over all 16 of a
# step holds every layer's activations of ~6,000 tokens for the backward (SmolLM2: GiBs)
LARGE_MODEL_MICRO_BATCH = 4
# with the prompts' shared head run once per pass (posttrain.train.grpo.shared_prefix) a row holds
# its own ~100 tokens instead of ~400, so passes of 8 fit in less memory than passes of 4
# did, and run faster (benchmarks/RESULTS.md "Real weights: issue #30's targets")
SHARED_PREFIX_MICRO_BATCH = 8
# loss types TRL 1.16's GRPOTrainer accepts (checked against its GRPOConfig help text)
GRPO_LOSS_TYPES = ("bnpo", "grpo", "dr_grpo", "dapo", "cispo", "sapo", "luspo", "vespo")
STOP_ON_ALARMS = ("hack", "length", "guard", "divergence")
SINGLE_TURN_COMPLETION_LENGTH = 64
# an episode's turns and tool results share one budget in TRL's tool loop (ask, look up,
# refund: three calls and three results, ~250 tokens with the starter's tokenizer)
MULTI_TURN_COMPLETION_LENGTH = 320


@dataclass
class GRPOSettings(RecipeSettings):
    """Every knob of the GRPO recipe (see ``posttrain grpo --help``)."""

    steps: int = field(default=40, metadata={"help": "optimizer steps",
                                             "range": (None, 10_000_000)})
    num_generations: int = field(
        default=8,
        metadata={"help": "completions per prompt: the group the advantage is relative to",
                  "range": (None, 4096)},
    )
    batch_size: int | None = field(
        default=None,
        metadata={
            "help": "completions per optimizer step; must be a multiple of --num-generations "
            "(default: four prompts' groups)",
            "range": (None, 1_000_000),
        },
    )
    beta: float = field(
        default=0.04,
        metadata={"help": "KL penalty to the reference (adapter off); 0 turns it off (a light "
                          "--cold-start-shape sets 0.2 unless given)"},
    )
    loss_type: str = field(
        default="bnpo",
        metadata={"help": "how the per-token loss is normalised", "choices": GRPO_LOSS_TYPES},
    )
    epsilon_high: float = field(
        default=0.0,
        metadata={"help": "upper PPO clip; 0 keeps TRL's symmetric 0.2, DAPO uses 0.28"},
    )
    no_scale_rewards: bool = field(
        default=False,
        metadata={"help": "do not divide the advantage by the group's reward std"},
    )
    mask_truncated: bool = field(
        default=False,
        metadata={"help": "drop completions cut at --max-completion-length from the loss"},
    )
    temperature: float = field(
        default=0.8,
        metadata={"help": "sampling temperature of the training rollouts (a light "
                          "--cold-start-shape sets 1.2 unless given)"},
    )
    top_p: float = field(default=0.95, metadata={"help": "top-p of the training rollouts"})
    max_completion_length: int | None = field(
        default=None,
        metadata={"help": "longest completion sampled in training, in tokens; a multi-turn "
                          "episode's turns and tool results share it (default: 64, or "
                          f"{MULTI_TURN_COMPLETION_LENGTH} for a multi-turn environment)",
                  "range": (None, 1_000_000)},
    )
    stop_when_solved: int = field(
        default=5,
        metadata={"help": "end training after this many steps in a row (more if they have "
                          "not yet drawn prompts of every category) in which every "
                          "completion passed the rule and every group scored alike: no "
                          "advantage is left, and further steps would only pull the policy "
                          "back toward the reference (0: always run --steps)",
                  "range": (None, 10_000_000), "metavar": "STEPS"},
    )
    monitor_every: int = field(
        default=10,
        metadata={"help": "steps between hack-monitor samples of the holdout (0: off)",
                  "range": (None, 10_000_000)},
    )
    stop_on: str = field(
        default="",
        metadata={
            "help": "alarms that end the run, comma-separated: hack (the policy exploits a "
                    "feature the design does not endorse), length (replies grow for "
                    "nothing), guard (a guard marker such as well_formed fell), divergence "
                    "(with --gold-endpoint: the proxy reward rises, the judge's score does "
                    "not)",
            "metavar": "ALARMS",
        },
    )
    gold_endpoint: str | None = field(
        default=None,
        metadata={"help": "an OpenAI-compatible API whose model judges the hack monitor's "
                          "holdout replies PASS or FAIL against the policy: the gold score "
                          "of the divergence alarm (the proxy reward rises, the judge's "
                          "score does not)", "metavar": "URL"},
    )
    gold_model: str | None = field(
        default=None,
        metadata={"help": "the judge model at --gold-endpoint (default: its only model)",
                  "metavar": "NAME"},
    )
    gold_key_env: str = field(
        default="OPENAI_API_KEY",
        metadata={"help": "environment variable holding --gold-endpoint's API key",
                  "metavar": "VAR"},
    )
    use_vllm: bool = field(
        default=False,
        metadata={"help": "generate the training rollouts with vLLM (TRL's integration; "
                          "needs the vllm package and a CUDA GPU)"},
    )
    vllm_mode: str = field(
        default="colocate",
        metadata={"help": "with --use-vllm: colocate (vLLM in the training process, sharing "
                          "the GPU) or server (a separate `trl vllm-serve` process)",
                  "choices": ("colocate", "server")},
    )
    vllm_server_url: str | None = field(
        default=None,
        metadata={"help": "with --vllm-mode server: the vLLM server's base URL "
                          "(default TRL's http://0.0.0.0:8000)", "metavar": "URL"},
    )
    micro_batch: int | None = field(
        default=None,
        metadata={"help": "completions per forward/backward pass of the update: the step's "
                          "completions are sampled together and their gradients summed over "
                          "passes of this many (the same step, less memory). Default: for a "
                          "model of 50M parameters or more 8 (4 with --shared-prefix off), "
                          "else the whole step (the embedded starters)",
                  "metavar": "N"},
    )
    resample_dead_groups: int = field(
        default=0,
        metadata={"help": "dynamic sampling: draw a group whose replies all scored the same "
                          "(no advantage) again with fresh seeds, up to this many times, "
                          "keeping the first draw whose replies differ (DAPO's idea within a "
                          "budget; inside posttrain's rollout, one process, single-turn "
                          "environments; 0: off)",
                  "range": (None, 64), "metavar": "ROUNDS"},
    )
    rollout: str = field(
        default="auto",
        metadata={"help": "what samples the training rollouts: trl (TRL's generate), "
                          "posttrain (posttrain's batched sampler: the shared system prompt "
                          "run once, a leaner decode loop; not with --use-vllm or a "
                          "multi-turn environment) or auto (posttrain, the faster, except "
                          "trl for a model under 5M parameters, the test starters, whose "
                          "recorded numbers come from it; the run says which and why)",
                  "choices": ROLLOUTS},
    )
    shared_prefix: str = field(
        default="auto",
        metadata={"help": "how the update scores a pass of completions: on (the prompt "
                          "tokens every row starts with, such as a system prompt, run once "
                          "and shared; the same logprobs to rounding), off (TRL's forward: "
                          "every row's whole prompt) or auto (on, except off for a model "
                          "under 5M parameters, the test starters, whose recorded numbers "
                          "come from TRL's forward; the run says which)",
                  "choices": SHARED_PREFIX_CHOICES},
    )
    cold_start: str = field(
        default="auto",
        metadata={"help": "a supervised cold start before RL, in the same run: sft (SFT on "
                          "the environment's reference agent's replies to the train "
                          "prompts, merged in), self (SFT on the policy's own replies "
                          "that the rule passes, sampled at --cold-start-temperature, in "
                          "rounds while they find more), none, or auto (when the base's "
                          "first evaluation shows some category's pass rate under 0.05, so "
                          "RL would have almost nothing to reinforce there: the upper end of "
                          "its 95%% interval under the mark, 59 replies when none passed; "
                          "sft where the environment has a reference agent, else self; "
                          "with fewer replies it keeps none and says so). The report gives "
                          "each phase its own delta",
                  "choices": COLD_STARTS},
    )
    cold_start_shape: str = field(
        default="auto",
        metadata={"help": "how the cold start and the RL after it are shaped: full (the "
                          "defaults of these flags), light (--cold-start-steps 30 "
                          "--cold-start-until 0.3 --cold-start-balance 0.33 --balance 0.33 "
                          "--beta 0.2 --temperature 1.2: a short cold start that leaves RL "
                          "exploring), or auto (light when some category the base never "
                          "passes scored every one of its groups alike, 10 or more, so the "
                          "move is absent, not partial; else full). Flags you give are "
                          "kept either way; the run says which shape and why",
                  "choices": COLD_START_SHAPES},
    )
    cold_start_steps: int = field(
        default=40,
        metadata={"help": "SFT steps of the cold start (8 demonstrations a step; a light "
                          "--cold-start-shape sets 30 unless given)",
                  "range": (None, 10_000_000)},
    )
    cold_start_until: float = field(
        default=0.0,
        metadata={"help": "stop the cold start early once one reply to each of up to 8 train "
                          "prompts per category passes at this rate or more in every "
                          "category (e.g. 0.5: RL learns most from a category passing about "
                          "half its replies); checked every --cold-start-check-every steps "
                          "from half the steps on. 0 (default): run every step (0.5 stopped "
                          "SmolLM2's refund cold start at step 20 on seed 1, before it knew "
                          "when to call the tool; benchmarks/RESULTS.md, H; a light "
                          "--cold-start-shape sets 0.3 unless given)",
                  "range": (0.0, 1.0)},
    )
    cold_start_balance: float = field(
        default=0.0,
        metadata={"help": "repeat the minority categories' train prompts up to this share in "
                          "the cold start's demonstrations only (RL's prompts are --balance's): "
                          "so the cold start learns when *not* to call a tool as well as how "
                          "(0.33 took the library example's chitchat from 0.23 to 0.78 after "
                          "the cold start; benchmarks/RESULTS.md, LG). 0 (default): the train "
                          "split as it is (a light --cold-start-shape sets 0.33 unless given, "
                          "and --balance 0.33 for RL's prompts)",
                  "range": (0.0, 1.0)},
    )
    cold_start_check_every: int = field(
        default=5,
        metadata={"help": "steps between the cold start's checks of --cold-start-until "
                          "(0: no check)",
                  "range": (0, 10_000_000)},
    )
    cold_start_learning_rate: float | None = field(
        default=None,
        metadata={"help": "LoRA learning rate of the cold start (default by model size: "
                          "1e-3 up to 10M parameters, 5e-4 up to 300M, 5e-5 up to 1B, 2e-5 "
                          "above)"},
    )
    cold_start_samples: int = field(
        default=8,
        metadata={"help": "--cold-start self: replies sampled per train prompt in each round "
                          "(the pass@k the policy's own successes are found by)",
                  "range": (1, 1024)},
    )
    cold_start_temperature: float = field(
        default=1.0,
        metadata={"help": "--cold-start self: the sampling temperature of its rounds (higher "
                          "than the evaluation's, so a move the policy makes rarely shows)",
                  "range": (0.01, 5.0)},
    )
    cold_start_prompts: int = field(
        default=32,
        metadata={"help": "--cold-start self: train prompts sampled per category in each round "
                          "(the categories the base does not pass; 32 keeps a SmolLM2 round "
                          "of two categories near ten minutes on two cores)",
                  "range": (1, 100_000)},
    )
    cold_start_rounds: int = field(
        default=3,
        metadata={"help": "--cold-start self: the most rounds of sampling and fine-tuning; "
                          "they end sooner when a round finds no passing reply it had not",
                  "range": (1, 100)},
    )
    cold_start_anchor_samples: int = field(
        default=2,
        metadata={"help": "--cold-start self: replies sampled once to each of up to "
                          "--cold-start-prompts train prompts of every category the base "
                          "passes; the passing ones join the demonstrations, about as many "
                          "a category as a mined category has, so fine-tuning on the mined "
                          "moves does not teach them everywhere (0: none)",
                  "range": (0, 64)},
    )
    cold_start_hint: str = field(
        default="tools",
        metadata={"help": "--cold-start self: where a round's plain samples of a category "
                          "find nothing, 'tools' samples it again with each reply opened by "
                          "a call of one of the environment's declared tools, and keeps the "
                          "passing ones as replies to the plain prompt; 'none' never hints",
                  "choices": ("tools", "none")},
    )
    reward: str | None = field(
        default=None,
        metadata={
            "help": "train on this reward instead of the environment's rule: module:function, "
            "fn(reply, case) -> float; or planted:KIND, the rule with a known flaw planted "
            "(length, keyword[=WORD], format_token, any_call, invented_arguments, question, "
            "sycophancy, early_end), to see the hack monitor catch it; the holdout is still "
            "graded by the rule",
            "metavar": "MODULE:FUNCTION",
        },
    )
    run_name: str = field(
        default=f"{DEFAULT_ENV}-grpo-v1",
        metadata={"help": "the run's name: its folder and dashboard entry (left at the "
                          "default, another environment's name replaces 'refund')"},
    )

    def completions_per_step(self) -> int:
        return self.batch_size if self.batch_size is not None else 4 * self.num_generations

    def per_step_batch(self) -> int:
        return self.completions_per_step()

    def completion_budget(self, multi_turn: bool = False) -> int:
        """``--max-completion-length``, or its default for the environment."""
        if self.max_completion_length is not None:
            return self.max_completion_length
        return MULTI_TURN_COMPLETION_LENGTH if multi_turn else SINGLE_TURN_COMPLETION_LENGTH

    def micro_batch_for(self, large_model: bool, world_size: int = 1,
                        shared_prefix: bool = False) -> int:
        """Completions per forward/backward pass for this run (``--micro-batch`` or its
        default: for a model of 50M parameters or more, passes of
        ``SHARED_PREFIX_MICRO_BATCH`` when the update shares the prompts' head, else of
        ``LARGE_MODEL_MICRO_BATCH``), never more than one process's share of the step."""
        share = self.completions_per_step() // world_size
        large = SHARED_PREFIX_MICRO_BATCH if shared_prefix else LARGE_MODEL_MICRO_BATCH
        wanted = self.micro_batch or (large if large_model else share)
        return min(wanted, share)

    def stop_on_alarms(self) -> tuple[str, ...]:
        return tuple(part.strip() for part in self.stop_on.split(",") if part.strip())

    def check(self) -> None:
        super().check()
        check_grpo_settings(self)

    def check_data(self, data: PreparedData) -> None:
        check_grpo_data(self, data)

    def check_env(self, env: Env) -> None:
        check_cold_start(self.cold_start, env)
        if self.resample_dead_groups and is_multi_turn(env):
            raise PosttrainError(
                f"--resample-dead-groups redraws single replies in posttrain's rollout and "
                f"{env.name!r} plays episodes through TRL's tool loop: leave it at 0")

    def one_process_only(self) -> str | None:
        if self.resample_dead_groups:
            return ("--resample-dead-groups reads whole groups in one process's rollout (under "
                    "several processes a group spans them): leave it at 0")
        return None

    def training_reward(self) -> str | None:
        return self.reward

    def stops_on_alarms(self) -> bool:
        return bool(self.stop_on_alarms())


def check_grpo_settings(settings: GRPOSettings) -> None:
    """Refuse impossible settings before anything is loaded or written."""
    if settings.loss_type not in GRPO_LOSS_TYPES:
        raise PosttrainError(
            f"--loss-type {settings.loss_type!r} is not a GRPO loss this TRL accepts; "
            f"use one of {', '.join(GRPO_LOSS_TYPES)}"
        )
    if settings.steps < 1:
        raise PosttrainError(f"--steps must be at least 1, got {settings.steps}")
    if settings.cold_start not in COLD_STARTS:
        raise PosttrainError(f"--cold-start {settings.cold_start!r}: expected one of "
                             f"{', '.join(COLD_STARTS)}")
    if settings.cold_start_hint not in ("tools", "none"):
        raise PosttrainError(f"--cold-start-hint {settings.cold_start_hint!r}: expected tools "
                             "or none")
    if settings.cold_start_shape not in COLD_START_SHAPES:
        raise PosttrainError(f"--cold-start-shape {settings.cold_start_shape!r}: expected one "
                             f"of {', '.join(COLD_START_SHAPES)}")
    if settings.cold_start_shape == "light" and settings.cold_start == "none":
        raise PosttrainError("--cold-start-shape light shapes a cold start and --cold-start "
                             "none runs none: drop one of them")
    if settings.cold_start_steps < 1:
        raise PosttrainError(
            f"--cold-start-steps must be at least 1, got {settings.cold_start_steps}")
    until = settings.cold_start_until
    if not (math.isfinite(until) and 0 <= until <= 1):
        raise PosttrainError(f"--cold-start-until must be between 0 and 1, got {until}")
    share = settings.cold_start_balance
    if not (math.isfinite(share) and 0 <= share < 1):
        raise PosttrainError(f"--cold-start-balance must be a share in [0, 1), got {share}")
    if settings.cold_start_check_every < 0:
        raise PosttrainError("--cold-start-check-every must be 0 (no check) or more, got "
                             f"{settings.cold_start_check_every}")
    for flag, value, low, high in (
            ("--cold-start-samples", settings.cold_start_samples, 1, 1024),
            ("--cold-start-prompts", settings.cold_start_prompts, 1, 100_000),
            ("--cold-start-rounds", settings.cold_start_rounds, 1, 100),
            ("--cold-start-anchor-samples", settings.cold_start_anchor_samples, 0, 64)):
        if isinstance(value, bool) or not isinstance(value, int) or not low <= value <= high:
            raise PosttrainError(f"{flag} must be a whole number from {low} to {high}, got "
                                 f"{value!r}")
    heat = settings.cold_start_temperature
    if not (math.isfinite(heat) and 0.01 <= heat <= 5.0):
        raise PosttrainError(f"--cold-start-temperature must be between 0.01 and 5, got {heat}")
    rate = settings.cold_start_learning_rate
    if rate is not None and not (math.isfinite(rate) and rate > 0):
        raise PosttrainError(f"--cold-start-learning-rate must be a number above 0, got {rate}")
    if settings.num_generations < 2:
        raise PosttrainError(
            "--num-generations must be at least 2: the advantage is relative to the group"
        )
    batch = settings.completions_per_step()
    if batch < 1 or batch % settings.num_generations:
        raise PosttrainError(
            f"--batch-size {batch} is not a multiple of --num-generations "
            f"{settings.num_generations}: each step needs whole groups "
            f"(e.g. --batch-size {2 * settings.num_generations})"
        )
    unknown = [a for a in settings.stop_on_alarms() if a not in STOP_ON_ALARMS]
    if unknown:
        raise PosttrainError(
            f"--stop-on {','.join(unknown)}: unknown alarm; use hack, length and/or guard"
        )
    if not (math.isfinite(settings.temperature) and settings.temperature > 0):
        raise PosttrainError(f"--temperature must be a number above 0, got {settings.temperature}")
    if not (math.isfinite(settings.top_p) and 0 < settings.top_p <= 1):
        raise PosttrainError(f"--top-p must be in (0, 1], got {settings.top_p}")
    if not (math.isfinite(settings.beta) and settings.beta >= 0):
        raise PosttrainError(f"--beta must be a number >= 0, got {settings.beta}")
    if not (math.isfinite(settings.epsilon_high) and settings.epsilon_high >= 0):
        raise PosttrainError(f"--epsilon-high must be a number >= 0, got {settings.epsilon_high}")
    if settings.max_completion_length is not None and settings.max_completion_length < 1:
        raise PosttrainError(
            f"--max-completion-length must be at least 1, got {settings.max_completion_length}"
        )
    if settings.micro_batch is not None and (
            settings.micro_batch < 1 or batch % settings.micro_batch):
        raise PosttrainError(f"--micro-batch {settings.micro_batch} must be at least 1 and "
                             f"divide the step's {batch} completions (--batch-size)")
    if settings.monitor_every < 0:
        raise PosttrainError(f"--monitor-every must be >= 0, got {settings.monitor_every}")
    if settings.resample_dead_groups < 0:
        raise PosttrainError(f"--resample-dead-groups must be >= 0 (0: off), got "
                             f"{settings.resample_dead_groups}")
    if settings.resample_dead_groups and (settings.rollout == "trl" or settings.use_vllm):
        raise PosttrainError("--resample-dead-groups redraws inside posttrain's rollout: use "
                             "--rollout auto or posttrain, without --use-vllm")
    if settings.stop_when_solved < 0:
        raise PosttrainError(
            f"--stop-when-solved must be >= 0 (0: never), got {settings.stop_when_solved}")
    if settings.gold_endpoint:
        if settings.monitor_every == 0:
            raise PosttrainError("--gold-endpoint judges the hack monitor's checks; it needs "
                                 "--monitor-every above 0")
        judge = gold_judge(settings, None)  # reachable and key accepted, or it says so
        if settings.gold_model:
            judge.agent.check()  # the named model is served (without one, the only one is)
    if settings.rollout not in ROLLOUTS:
        raise PosttrainError(f"--rollout {settings.rollout!r}: expected one of "
                             f"{', '.join(ROLLOUTS)}")
    if settings.shared_prefix not in SHARED_PREFIX_CHOICES:
        raise PosttrainError(f"--shared-prefix {settings.shared_prefix!r}: expected one of "
                             f"{', '.join(SHARED_PREFIX_CHOICES)}")
    if settings.rollout == "posttrain" and settings.use_vllm:
        raise PosttrainError("--rollout posttrain samples with the training model; it cannot "
                             "go with --use-vllm")
    if settings.use_vllm:
        problem = vllm_problem()
        if problem:
            raise PosttrainError(f"--use-vllm: {problem}; leave --use-vllm out to generate "
                                 "with the training model (TRL's default)")
    elif settings.vllm_server_url:
        raise PosttrainError("--vllm-server-url only applies with --use-vllm --vllm-mode server")


def gold_judge(settings: GRPOSettings, env: Any) -> Any:
    """The ``--gold-endpoint`` judge."""
    return endpoint_judge(str(settings.gold_endpoint), settings.gold_model,
                          settings.gold_key_env, env, flag="--gold-endpoint")


def check_grpo_data(settings: GRPOSettings, data: PreparedData) -> None:
    """Refuse a step larger than the train side (TRL would run 0 steps and call it done)."""
    prompts_per_step = settings.completions_per_step() // settings.num_generations
    if prompts_per_step > len(data.train):
        raise PosttrainError(
            f"--batch-size {settings.completions_per_step()} needs {prompts_per_step} train "
            f"prompts a step ({settings.num_generations} completions each) and the train "
            f"side has {len(data.train)}: lower --batch-size or raise --prompts"
        )


def trl_loss_type(loss_type: str, passes: int, world_size: int) -> str:
    """The loss type TRL is given. TRL's ``bnpo`` divides by the tokens of each pass, so
    over several passes (``--micro-batch``) it would weight them unlike one pass over the
    step; ``dapo`` divides every pass by the whole step's tokens, which on one process is
    exactly ``bnpo`` over the whole step. (``grpo`` and ``dr_grpo`` already sum to the
    same over equal passes.)"""
    return "dapo" if loss_type == "bnpo" and passes > 1 and world_size == 1 else loss_type


def grpo_config_kwargs(
    settings: GRPOSettings, learning_rate: float, output_dir: str, device: str,
    max_turns: int | None = None, world_size: int = 1, micro_batch: int | None = None,
    bf16: bool | None = None,
) -> dict[str, Any]:
    """The ``trl.GRPOConfig`` arguments for these settings (pure: tested without TRL).
    ``max_turns``: the policy turns of a multi-turn environment's episode (TRL runs
    ``max_turns - 1`` rounds of tool results). ``micro_batch``: completions per
    forward/backward pass (``GRPOSettings.micro_batch_for``; default the whole share)."""
    on_gpu = device.startswith("cuda")
    multi_turn = max_turns is not None
    # each process takes its share of the step's completions (whole groups are not
    # needed per process: TRL gathers the rewards before computing advantages)
    share = settings.completions_per_step() // world_size
    micro = micro_batch or share
    if share % micro:
        raise PosttrainError(f"--micro-batch {micro} must divide the {share} completions "
                             "each process trains on per step")
    return {
        "output_dir": output_dir,
        "max_steps": settings.steps,
        # the step's completions are generated together (steps_per_generation passes of one
        # generation batch) and the optimizer steps once after all its passes: the same
        # step as one pass, in less memory (TRL normalises the loss over the whole batch)
        "per_device_train_batch_size": micro,
        "gradient_accumulation_steps": share // micro,
        "steps_per_generation": share // micro,
        "num_generations": settings.num_generations,
        "max_completion_length": settings.completion_budget(multi_turn),
        **({"max_tool_calling_iterations": max_turns - 1} if multi_turn else {}),
        "learning_rate": learning_rate,
        "beta": settings.beta,
        "loss_type": trl_loss_type(settings.loss_type, share // micro, world_size),
        "epsilon_high": settings.epsilon_high or None,
        # the advantage's std scaling: TRL computes the advantages itself (score/rubric.py)
        "scale_rewards": trl_scale_rewards(normalize_std=not settings.no_scale_rewards),
        "mask_truncated_completions": settings.mask_truncated,
        "temperature": settings.temperature,
        "top_p": settings.top_p,
        "seed": settings.seed,
        **({"use_vllm": True, "vllm_mode": settings.vllm_mode,
            **({"vllm_server_base_url": settings.vllm_server_url}
               if settings.vllm_server_url else {})}
           if settings.use_vllm else {}),
        **trainer_runtime_kwargs(on_gpu, settings.report_to, bf16),
    }

