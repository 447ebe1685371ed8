"""A self cold start's hint: the reply opened with a call of one of the rule's own tools.

A small model may never make the move a category pays for, not in hundreds of samples:
SmolLM2-135M on the library rule without its reference agent called no tool in 512
samples a category at temperature 1, though the system prompt lists the tools and the
call's format. Opened for it, the same model finishes the call: with the reply begun as
``<tool_call>\\n{"name": "renew_loan", "arguments": {"loan": "`` it wrote the prompt's own
loan number in about one sample of six (RESULTS.md, "The hinted self cold start").

So where a round's plain samples of a category find nothing, the self cold start samples
it again with the reply opened by one of the environment's declared tools (its name and
first required argument, in posttrain's ``<tool_call>`` wire), the tool chosen by each
sample's seed. The rule grades the whole reply against the plain prompt's case, as ever,
and a passing one is kept as the reply to the *plain* prompt: fine-tuning teaches the
policy to open the call itself (STaR's rationalization: Zelikman et al., 2022). Nothing
here knows the rule: only its ``tools`` list, which every tool-using environment declares.
"""

from __future__ import annotations

from typing import Any

from posttrain.envs.wire import render_tool_call
from posttrain.policy.model_agent import ModelAgent
from posttrain.policy.models import Policy
from posttrain.policy.sampler import SamplingParams

Messages = list[dict[str, Any]]

#: stands for the argument's value while a call is rendered, then cut away: what is left
#: is the call opened up to the value the model must write
_VALUE = "@@posttrain-hint-value@@"


def tool_openings(env: Any) -> list[str]:
    """One reply opening per tool the environment declares (OpenAI function schemas in
    ``env.tools``): the call rendered up to its first required argument's value (its first
    property's when none is required; the whole call when it takes no argument). No tools,
    no openings: the hint needs none of the rule's code, only what it declares."""
    openings = []
    for tool in getattr(env, "tools", None) or []:
        function = tool.get("function", tool) if isinstance(tool, dict) else None
        if not isinstance(function, dict) or not function.get("name"):
            continue
        parameters = function.get("parameters") or {}
        names = list(parameters.get("required") or []) or list(parameters.get("properties")
                                                                  or {})
        if not names:
            openings.append(render_tool_call(str(function["name"]), {}))
            continue
        call = render_tool_call(str(function["name"]), {str(names[0]): _VALUE})
        openings.append(call[:call.index(_VALUE)])
    return openings


class OpenedReplyAgent(ModelAgent):
    """Samples the policy with each reply begun by one of ``openings`` (chosen by the
    sample's seed); a reply is the opening followed by what the policy wrote after it."""

    def __init__(self, policy: Policy, params: SamplingParams, openings: list[str]):
        if not openings:
            raise ValueError("an opened-reply agent needs at least one opening")
        super().__init__(policy, params)
        self.openings = openings
        tokenizer = policy.tokenizer
        self.opening_ids = [tokenizer.encode(text, add_special_tokens=False)
                            for text in openings]

    def opening_for(self, seed: int) -> int:
        return seed % len(self.openings)

    def reply_batch(self, conversations: list[Messages], seeds: list[int]) -> list[str]:
        chosen = [self.opening_for(seed) for seed in seeds]
        prompts = [ids + self.opening_ids[index] for ids, index in
                   zip(self.sampler.encode(conversations), chosen, strict=True)]
        self.last_completions = self.sampler.sample_tokens(prompts, seeds, self.params)
        return [self.openings[index] + completion.text
                for index, completion in zip(chosen, self.last_completions, strict=True)]
