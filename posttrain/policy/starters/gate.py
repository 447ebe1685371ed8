"""The starter build's quality gate: a fixed probe, a spec, and the verdict on one build.

A starter build is trained from a seed on whatever CPU the user has, and float
rounding differs between CPUs (AVX2, AVX-512, ARM), so two machines building the
same recipe get different weights. The gate makes sure they get the same *kind* of
policy: after training, the build is probed on a fixed prompt set and compared with
``StarterSpec``; a build outside it is thrown away and the next build seed is tried
(``posttrain.policy.starters.registry``).

The probe (``probe_policy``), all deterministic for given weights:

- **copy rate**: teacher-forced, the share of 60 prompts that name an id (the refund
  rule: with-id prompts) whose number is the model's greedy choice token by token
  inside the call that takes it (``id_copy_rate``): the skill such a pass needs, apart
  from the choice to call;
- **pass rate and tool-call rate per category**: 4 samples per prompt at the
  evaluation's settings (temperature 0.8, top-p 0.95, seeded) on the environment's
  ``write_prompts(PROBE_SITUATIONS, seed=PROBE_SEED)``, a prompt set no recipe trains
  or evaluates on by default (the warm start uses seed 7919, recipes seed 0).

What is rule-specific (the system prompt, the call the copy is forced into, the
categories and their ranges) comes from the environment's ``starter_data`` hook.

The spec asks for the seeds' kind of base policy: it copies ids, it often fails the
with-id rule by choosing the wrong move (so GRPO and DPO have something to fix) and
usually passes the no-id and off-topic ones. docs/policies.md gives the ranges
measured across build seeds and CPUs, and why these bounds.
"""

from __future__ import annotations

from dataclasses import asdict, dataclass
from typing import Any

from posttrain.envs.base import PromptWriter, has_hook
from posttrain.envs.wire import parse_tool_call
from posttrain.policy.model_agent import EVAL_TEMPERATURE, EVAL_TOP_P, ModelAgent
from posttrain.policy.models import Policy
from posttrain.policy.sampler import SamplingParams
from posttrain.policy.starters.copy_circuit import id_copy_rate
from posttrain.score.rows import grade

PROBE_SEED = 4049
PROBE_SITUATIONS = 150
PROBE_SAMPLES = 4
PROBE_COPY_PROMPTS = 60


@dataclass(frozen=True)
class CategoryRange:
    """Bounds on the sampled pass rate of one prompt category (inclusive)."""

    category: str
    low: float
    high: float


@dataclass(frozen=True)
class StarterSpec:
    """What every starter build must be, whatever the machine (see the module docstring)."""

    min_copy_rate: float = 0.8
    #: None: the environment's ranges (its starter data's ``spec_pass_rates``), filled in
    #: by the recipe
    pass_rates: tuple[CategoryRange, ...] | None = None

    def failures(self, probe: StarterProbe) -> list[str]:
        """Why ``probe`` is outside the spec, one readable reason each; [] when inside."""
        reasons = []
        if probe.copy_rate is not None and probe.copy_rate < self.min_copy_rate:
            reasons.append(f"copy rate {probe.copy_rate:.2f} < {self.min_copy_rate:.2f}")
        for bounds in self.pass_rates or ():
            rate = probe.pass_rate.get(bounds.category)
            if rate is None:
                reasons.append(f"no {bounds.category} prompts in the probe")
            elif rate < bounds.low:
                reasons.append(f"{bounds.category} pass rate {rate:.2f} < {bounds.low:.2f}")
            elif rate > bounds.high:
                reasons.append(f"{bounds.category} pass rate {rate:.2f} > {bounds.high:.2f}")
        return reasons

    def distance(self, probe: StarterProbe) -> float:
        """How far outside the spec ``probe`` is (0 inside): picks the best failed build."""
        total = (0.0 if probe.copy_rate is None
                 else max(0.0, self.min_copy_rate - probe.copy_rate))
        for bounds in self.pass_rates or ():
            rate = probe.pass_rate.get(bounds.category, 0.0)
            total += max(0.0, bounds.low - rate) + max(0.0, rate - bounds.high)
        return total


@dataclass
class StarterProbe:
    """What the probe measured on one build."""

    copy_rate: float | None  # None: the rule's right moves copy nothing from the prompt
    pass_rate: dict[str, float]
    tool_call_rate: dict[str, float]
    prompts: dict[str, int]
    samples: int = PROBE_SAMPLES

    def describe(self) -> str:
        """One line: copy rate, then pass rate (tool-call rate) per category."""
        parts = [f"copy {self.copy_rate:.2f}"] if self.copy_rate is not None else []
        parts += [
            f"{name} {self.pass_rate[name]:.2f} (tools {self.tool_call_rate[name]:.2f})"
            for name in self.pass_rate
        ]
        return ", ".join(parts)

    def to_dict(self) -> dict[str, Any]:
        return asdict(self)


def probe_prompts(env: Any, data: Any = None) -> list[dict[str, Any]]:
    """The fixed probe set: prompt records of the environment's writer, else of the
    prompts file its starter ``data`` was built on."""
    if has_hook(env, PromptWriter) or data is None:
        return env.write_prompts(PROBE_SITUATIONS, PROBE_SEED)
    return data.records(PROBE_SITUATIONS, PROBE_SEED)


def _made_a_call(row: dict[str, Any]) -> float:
    """The row's ``tool_call`` marker, or (an environment without that marker: one another
    library wrote) whether the reply holds a ``<tool_call>`` block."""
    marker = row["markers"].get("tool_call")
    if marker is not None:
        return float(marker)
    return float(parse_tool_call(row["reply"]) is not None)


def probe_policy(model: Any, tokenizer: Any, env: Any, data: Any) -> StarterProbe:
    """Probe a starter model (module docstring) on ``env``, with its starter ``data``.
    Leaves the model in eval mode."""
    model.eval()
    records = probe_prompts(env, data)
    naming = data.copy_prompts(records)[:PROBE_COPY_PROMPTS]
    copy_rate = id_copy_rate(model, tokenizer, naming, data) if naming else None
    policy = Policy(model=model, tokenizer=tokenizer, name="starter", device="cpu", dtype="float32")
    params = SamplingParams(temperature=EVAL_TEMPERATURE, top_p=EVAL_TOP_P, max_new_tokens=64)
    rows = grade(env, records, ModelAgent(policy, params), PROBE_SAMPLES, seed=PROBE_SEED)
    pass_rate, tool_rate, prompts = {}, {}, {}
    for category in env.categories:
        group = [row for row in rows if row["category"] == category]
        if not group:
            continue
        pass_rate[category] = round(sum(row["reward"] for row in group) / len(group), 4)
        tool_rate[category] = round(sum(_made_a_call(row) for row in group) / len(group), 4)
        prompts[category] = len(group) // PROBE_SAMPLES
    copied = round(copy_rate, 4) if copy_rate is not None else None
    return StarterProbe(copied, pass_rate, tool_rate, prompts)
