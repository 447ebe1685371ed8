"""A language model as a batch agent: what ``grade`` and ``posttrain eval`` call.

``ModelAgent`` implements the protocol of ``posttrain.agents``
(``reply_batch(conversations, seeds)``, ``policy``, ``sampling``) on top of the
``Sampler``. The evaluation defaults are sampled, never greedy (greedy hides
progress): temperature 0.8, top-p 0.95, and a reply cap that fits the model
(64 new tokens for the starter models, whose replies end within ~40; 128 for
real models, whose prose is longer and whose off-topic answers must stay under
400 characters to pass anyway). How many samples per prompt is the caller's
choice (``grade(k=4)`` by default).
"""

from __future__ import annotations

from typing import Any

from posttrain.policy.models import Policy, parameter_count
from posttrain.policy.sampler import Completion, Messages, Sampler, SamplingParams
from posttrain.policy.starter_names import is_starter_name
from posttrain.policy.tool_turns import enable_tool_turns

EVAL_TEMPERATURE = 0.8
EVAL_TOP_P = 0.95
STARTER_MAX_NEW_TOKENS = 64
MODEL_MAX_NEW_TOKENS = 128
LARGE_MODEL_PARAMETERS = 50_000_000  # above this, smaller micro-batches
#: under this, the test starters (starter-2m, 1.6M parameters, and the starters built on
#: its size from a rule's hooks): the suite's recorded GRPO numbers come from TRL's own
#: rollouts and forward, so ``auto`` keeps those for them
TRL_RECORDED_PARAMETERS = 5_000_000


def default_max_new_tokens(policy: Policy) -> int:
    """64 for the starter models, 128 for anything else."""
    return STARTER_MAX_NEW_TOKENS if is_starter_name(policy.name) else MODEL_MAX_NEW_TOKENS


def is_large_model(policy: Policy) -> bool:
    """50M parameters or more: a model of real size, not an embedded starter (the size at
    which sampling takes smaller micro-batches, and the recipes' real-weights defaults
    apply: posttrain.train.precision, posttrain.train.grpo.rollout)."""
    return parameter_count(policy.model) >= LARGE_MODEL_PARAMETERS


def keeps_trl_numbers(policy: Policy) -> bool:
    """Under 5M parameters: a test starter, whose recorded numbers come from TRL's own
    rollouts and forward (``posttrain.train.grpo.rollout``, ``.shared_prefix``)."""
    return parameter_count(policy.model) < TRL_RECORDED_PARAMETERS


def default_batch_size(policy: Policy) -> int:
    """Micro-batch for sampling: 64 rows for tiny models, 16 for real ones (CPU memory/speed)."""
    return 16 if is_large_model(policy) else 64


class ModelAgent:
    """Answers conversations by sampling a policy; one seed per conversation."""

    def __init__(
        self,
        policy: Policy,
        sampling_params: SamplingParams | None = None,
        batch_size: int | None = None,
    ):
        self.policy_object = policy
        self.params = sampling_params or SamplingParams(
            temperature=EVAL_TEMPERATURE,
            top_p=EVAL_TOP_P,
            max_new_tokens=default_max_new_tokens(policy),
        )
        self.sampler = Sampler(policy, batch_size=batch_size or default_batch_size(policy))
        self.policy: dict[str, Any] = policy.describe()
        self.sampling: dict[str, Any] = self.params.to_dict()
        self.last_completions: list[Completion] = []

    def reply_batch(self, conversations: list[Messages], seeds: list[int]) -> list[str]:
        """One reply text per conversation, in order (the full completions stay in
        ``last_completions`` for callers that want tokens, logprobs or stop reasons)."""
        self.last_completions = self.sampler.sample(conversations, seeds, self.params)
        return [completion.text for completion in self.last_completions]

    def prepare_for_episodes(self) -> None:
        """Give the tokenizer a chat template that renders tool calls and tool results
        (``posttrain.policy.tool_turns``): the episode runner calls this before turn one."""
        enable_tool_turns(self.policy_object.tokenizer, self.policy_object.name)

    def __call__(self, messages: Messages, seed: int = 0) -> str:
        return self.reply_batch([messages], [seed])[0]
