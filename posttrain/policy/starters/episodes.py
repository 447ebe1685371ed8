"""Starters for multi-turn environments: a built starter, taught to play episodes.

A multi-turn environment may name a starter of its own (``starter_model``, with
``starter_episode_spec()``; ``starter-multiturn`` for the built-in multi-turn desk):
a built starter continued on that environment's episodes. It keeps the base's
tokenizer, its weights and its order-id copy circuit (rebuilt from the base recipe
and build seed, held and enforced exactly as in the base build), then a
supervised warm start on whole episodes from the environment's ``starter_dialogue``
hook: the loss covers the policy's turns (each ending in ``<|im_end|>``) and not the
tool results, which are laid out as TRL's tool loop lays them out (the tool-turn
template of ``posttrain.policy.tool_turns``). As in the base build, a phase of
right moves comes first, then the environment's behaviour mix, so the starter is a
partial policy with choices for GRPO to compare. The build is probed on the
environment's own prompts and held against per-category pass-rate ranges; a build
outside them is retried from the next build seed.

Continuing the 1.6M model rather than training a new one: it copies order ids from
the first step (the circuit), and a step over episodes costs about 1 s on 2 cores
where the 9.1M model takes about 4 s.
"""

from __future__ import annotations

import hashlib
import json
import random
import sys
import time
from dataclasses import asdict, dataclass, field
from pathlib import Path
from typing import Any

from posttrain.envs import BUILTIN_ENVS, get_env
from posttrain.envs.base import Env, EpisodeStarterSource, PromptWriter, has_hook, require_hook
from posttrain.policy.model_agent import EVAL_TEMPERATURE, EVAL_TOP_P, ModelAgent
from posttrain.policy.models import Policy
from posttrain.policy.sampler import SamplingParams
from posttrain.policy.starters.gate import CategoryRange
from posttrain.policy.starters.recipes import base_recipe, starter_data
from posttrain.policy.starters.scratch import (
    learning_rate_at,
    new_model,
    save_atomically,
    warm_start_step,
)
from posttrain.policy.tool_turns import enable_tool_turns
from posttrain.progress import progress_bar
from posttrain.score.rows import grade

# Bump when a change to this module changes what a recipe builds.
EPISODE_CODE_VERSION = 1
PROBE_SEED = 4049
PROBE_SAMPLES = 2
TOOL_RESULT_OPEN = "\n<|im_start|>user\n<tool_response>\n"
TOOL_RESULT_CLOSE = "\n</tool_response><|im_end|>\n<|im_start|>assistant\n"


@dataclass(frozen=True)
class EpisodeStarterRecipe:
    """Everything a multi-turn starter build depends on; its hash is the cache key."""

    name: str
    base: str  # the starter it continues
    env: str  # the environment whose starter_dialogue hook writes the episodes
    seed: int = 0  # build seed (draws and shuffles); the gate tries seed + 1 ... after it
    data_seed: int = 7919
    corpus_situations: int = 4000
    skill_steps: int = 300
    mix_steps: int = 200
    batch_size: int = 16
    learning_rate: float = 2e-3
    warmup_steps: int = 10
    max_grad_norm: float = 1.0
    pass_rates: tuple[CategoryRange, ...] = ()
    probe_prompts: int = 100  # prompts of the environment's writer the gate samples
    build_attempts: int = 3

    @property
    def total_steps(self) -> int:
        return self.skill_steps + self.mix_steps

    def key(self) -> str:
        """12 hex digits of SHA-256 over the recipe, the base's key and the code version."""
        content = {"recipe": asdict(self), "base_key": base_recipe(self.base).key(),
                   "code_version": EPISODE_CODE_VERSION}
        return hashlib.sha256(json.dumps(content, sort_keys=True).encode()).hexdigest()[:12]


def episode_recipes() -> dict[str, EpisodeStarterRecipe]:
    """The multi-turn starters: one per built-in environment that declares one (its
    ``starter_model`` name and ``starter_episode_spec()``: the base starter and the gate's
    pass-rate ranges, e.g. ``starter-multiturn`` for refund-multiturn)."""
    recipes = {}
    for env_name in BUILTIN_ENVS:
        env = get_env(env_name)
        if not has_hook(env, EpisodeStarterSource):
            continue
        fields = dict(env.starter_episode_spec())
        ranges = tuple(CategoryRange(*bounds) for bounds in fields.pop("pass_rates", ()))
        recipes[env.starter_model] = EpisodeStarterRecipe(
            name=env.starter_model, env=env_name, pass_rates=ranges, **fields)
    return recipes


def _prompt_writer(env: Env) -> PromptWriter:
    return require_hook(env, PromptWriter, "writes no prompts for an episode starter",
                        "use another --base-model")


def encode_episode(tokenizer: Any, messages: list[dict[str, Any]], turns: list[dict[str, Any]]
                   ) -> tuple[list[int], list[int]]:
    """(token ids, labels) of a prompt and its episode: labels on the policy's turns
    and their ``<|im_end|>``, -100 on the prompt and the tool results."""
    eos_id = tokenizer.convert_tokens_to_ids("<|im_end|>")
    ids = list(tokenizer.apply_chat_template(messages, add_generation_prompt=True,
                                             tokenize=True, return_dict=False))
    labels = [-100] * len(ids)
    for message in turns:
        if message["role"] == "assistant":
            part = [*tokenizer.encode(message["content"], add_special_tokens=False), eos_id]
            labels += part
        else:
            part = tokenizer.encode(TOOL_RESULT_OPEN + message["content"] + TOOL_RESULT_CLOSE,
                                    add_special_tokens=False)
            labels += [-100] * len(part)
        ids += part
    return ids, labels


def _collate(batch: list[tuple[list[int], list[int]]], pad_id: int) -> tuple[Any, Any, Any]:
    import torch

    width = max(len(ids) for ids, _ in batch)
    input_ids = torch.full((len(batch), width), pad_id, dtype=torch.long)
    labels = torch.full((len(batch), width), -100, dtype=torch.long)
    attention = torch.zeros((len(batch), width), dtype=torch.long)
    for row, (ids, row_labels) in enumerate(batch):
        input_ids[row, : len(ids)] = torch.tensor(ids)
        labels[row, : len(ids)] = torch.tensor(row_labels)
        attention[row, : len(ids)] = 1
    return input_ids, labels, attention


def _load_base(recipe: EpisodeStarterRecipe, folder: Path) -> tuple[Any, Any, Any]:
    """The base starter's tokenizer (with the tool-turn template), weights and circuit, from
    its built ``folder``."""
    from transformers import AutoModelForCausalLM, AutoTokenizer

    base = base_recipe(recipe.base)
    build = json.loads((folder / "build.json").read_text())
    tokenizer = enable_tool_turns(AutoTokenizer.from_pretrained(folder), recipe.base)
    circuit = None
    if base.copy_circuit:  # the same seed and tokenizer wire the same circuit
        _, circuit = new_model(
            tokenizer, base.architecture, int(build["build_seed"]), True,
            match=base.circuit_match, copy=base.circuit_copy,
            digit_norm=base.circuit_digit_norm,
            copy_ids=starter_data(base.env).copy_token_ids(tokenizer, []))
    return tokenizer, AutoModelForCausalLM.from_pretrained(folder), circuit


def train_episodes(model: Any, tokenizer: Any, circuit: Any, recipe: EpisodeStarterRecipe,
                   seed: int, on_step: Any = None) -> tuple[list[float], dict[str, int]]:
    """The warm start on episodes (module docstring); returns losses and move counts."""
    import torch

    env = get_env(recipe.env)
    dialogue = require_hook(env, EpisodeStarterSource, "has no episode starter",
                            "use another --base-model").starter_dialogue
    prompts = [record["prompt"] for record in
               _prompt_writer(env).write_prompts(recipe.corpus_situations, recipe.data_seed)]
    order_rng, draw_rng = random.Random(seed), random.Random(seed + 2)
    hooks = circuit.freeze_attention(model) if circuit is not None else []
    optimizer = torch.optim.AdamW(model.parameters(), lr=recipe.learning_rate,
                                  betas=(0.9, 0.95), weight_decay=0.0)
    model.train()
    queue: list[int] = []
    losses: list[float] = []
    moves: dict[str, int] = {}
    for step in range(recipe.total_steps):
        if len(queue) < recipe.batch_size:
            epoch = list(range(len(prompts)))
            order_rng.shuffle(epoch)
            queue.extend(epoch)
        picked = queue[: recipe.batch_size]
        del queue[: recipe.batch_size]
        batch = []
        for index in picked:
            prompt, move, turns = dialogue(prompts[index], step < recipe.skill_steps, draw_rng)
            moves[move] = moves.get(move, 0) + 1
            batch.append(encode_episode(tokenizer, env.messages_for(prompt), turns))
        losses.append(warm_start_step(model, optimizer, _collate(batch, tokenizer.pad_token_id),
                                      learning_rate_at(step, recipe), recipe.max_grad_norm,
                                      circuit))
        if on_step is not None:
            on_step(step + 1)
    for hook in hooks:
        hook.remove()
    model.eval()
    return losses, dict(sorted(moves.items()))


@dataclass
class EpisodeProbe:
    """Pass rate per category of the environment's probe prompts."""

    pass_rate: dict[str, float] = field(default_factory=dict)

    def describe(self) -> str:
        return ", ".join(f"{name} {rate:.2f}" for name, rate in self.pass_rate.items())


def probe_episodes(model: Any, tokenizer: Any, recipe: EpisodeStarterRecipe) -> EpisodeProbe:
    """Sampled pass rate per category on ``recipe.probe_prompts`` prompts of the
    environment's writer (seed ``PROBE_SEED``, which no recipe trains or evaluates on by
    default)."""
    env = get_env(recipe.env)
    policy = Policy(model=model, tokenizer=tokenizer, name=recipe.name, device="cpu",
                    dtype="float32")
    agent = ModelAgent(policy, SamplingParams(temperature=EVAL_TEMPERATURE, top_p=EVAL_TOP_P,
                                              max_new_tokens=64))
    records = _prompt_writer(env).write_prompts(recipe.probe_prompts, PROBE_SEED)
    rows = grade(env, records, agent, PROBE_SAMPLES, seed=PROBE_SEED)
    rates = {}
    for name in env.categories:
        group = [row for row in rows if row["category"] == name]
        if group:
            rates[name] = round(sum(row["reward"] for row in group) / len(group), 4)
    return EpisodeProbe(rates)


def spec_failures(recipe: EpisodeStarterRecipe, probe: EpisodeProbe) -> list[str]:
    reasons = []
    for bounds in recipe.pass_rates:
        rate = probe.pass_rate.get(bounds.category)
        if rate is None:
            reasons.append(f"no {bounds.category} prompts in the probe")
        elif not bounds.low <= rate <= bounds.high:
            reasons.append(f"{bounds.category} pass rate {rate:.2f} outside "
                           f"[{bounds.low:.2f}, {bounds.high:.2f}]")
    return reasons


def _distance(recipe: EpisodeStarterRecipe, probe: EpisodeProbe) -> float:
    return sum(max(0.0, b.low - probe.pass_rate.get(b.category, 0.0))
               + max(0.0, probe.pass_rate.get(b.category, 0.0) - b.high)
               for b in recipe.pass_rates)


def build_episode_starter(recipe: EpisodeStarterRecipe, folder: Path, force: bool,
                          show_progress: bool, base_folder: Path) -> Path:
    """Build ``recipe`` into ``folder`` (atomically), gate included (module docstring),
    continuing the base starter built in ``base_folder``."""
    started = time.monotonic()
    attempts, chosen = [], None
    for number in range(recipe.build_attempts):
        seed = recipe.seed + number
        tokenizer, model, circuit = _load_base(recipe, base_folder)
        label = f"building {recipe.name} (build seed {seed})"
        with progress_bar(label, recipe.total_steps, enabled=show_progress) as bar:
            losses, moves = train_episodes(model, tokenizer, circuit, recipe, seed, bar)
        probe = probe_episodes(model, tokenizer, recipe)
        failures = spec_failures(recipe, probe)
        attempts.append({"seed": seed, "probe": probe.pass_rate, "failures": failures,
                         "final_loss": sum(losses[-10:]) / len(losses[-10:])})
        if chosen is None or _distance(recipe, probe) < _distance(recipe, chosen[2]):
            chosen = (seed, model, probe, tokenizer, moves)
        if not failures:
            print(f"{recipe.name}: build seed {seed} meets the spec ({probe.describe()})",
                  file=sys.stderr, flush=True)
            break
        print(f"{recipe.name}: build seed {seed} is outside the spec ({'; '.join(failures)})",
              file=sys.stderr, flush=True)
    assert chosen is not None
    seed, model, probe, tokenizer, moves = chosen
    gate = "passed" if not spec_failures(recipe, probe) else "failed"
    build = {
        "name": recipe.name, "key": recipe.key(), "base": recipe.base, "env": recipe.env,
        "code_version": EPISODE_CODE_VERSION, "gate": gate, "build_seed": seed,
        "probe": {"pass_rate": probe.pass_rate}, "attempts": attempts,
        "parameters": sum(p.numel() for p in model.parameters()),
        "behaviour_counts": moves, "seconds": round(time.monotonic() - started, 1),
    }
    save_atomically(folder, model, tokenizer, recipe, build, force,
                     code_version=EPISODE_CODE_VERSION)
    return folder
