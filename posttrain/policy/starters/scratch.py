"""Building a starter from scratch: a tiny chat model built offline, from a seed, gated.

The recipes are ``posttrain.policy.starters.recipes``; the names, the cache and the build
step ``posttrain.policy.starters.registry`` and ``build``; the starters continued on an
environment's episodes are ``posttrain.policy.starters.episodes``.

The machine this project runs on cannot download a model, so ``starter`` (9.1M
parameters) and ``starter-2m`` (1.6M, the one tests use) are built here, on first
use, from nothing but the template simulator:

1. **Dialogues** (the environment's ``starter_data`` hook; for the refund rule
   ``posttrain.envs.refund.starter_data``): template prompts, each answered by the
   behaviour mix (the right move or a typical mistake) and by the right move.
2. **Tokenizer.** Byte-level BPE trained with ``tokenizers`` on those dialogues
   rendered in ChatML. Merges may cross words but not lines; an id's prefix
   (``ORD-``, ``ord_`` ...) is its own token and its number splits into pairs of
   digits from the left, the same way in a prompt and in a tool call. The
   template world is small, so the vocabulary fills with phrases (the whole
   system prompt is a handful of tokens). ``<tool_call>``/``</tool_call>`` are
   added as *non-special* tokens so ``skip_special_tokens`` never strips them.
3. **Model.** The Qwen2 decoder shape (RMSNorm, rotary positions, SwiGLU,
   grouped-query attention, tied embeddings) initialised from the build seed and
   saved as a transformers ``llama`` model (see ``new_model`` for why), with an
   order-id copy circuit wired into its first two layers that keeps two slices of
   the hidden space to itself (``posttrain.policy.starters.copy_circuit``).
4. **Supervised warm start.** A plain torch loop (AdamW, linear warm-up then
   cosine to zero, loss on the reply tokens and the closing ``<|im_end|>`` only):
   first the right move only, then the behaviour mix; every with-id dialogue gets
   a fresh random order number each time it is drawn, so ids are copied, never
   remembered. A plain loop was chosen over TRL's SFTTrainer: fewer moving parts,
   no dataset conversion, bit-for-bit repeatable on one machine.
5. **Quality gate** (``posttrain.policy.starters.gate``). Other CPUs round floats
   differently, so the same recipe gives other weights on another machine. The
   trained model is probed and held against ``recipe.spec``; a build outside it
   is dropped and retrained from the next build seed, at most
   ``recipe.build_attempts`` times (each try is logged and kept in ``build.json``).
   If none meets the spec the nearest is kept and marked ``gate: failed``.

The result is cached under ``<models folder>/starter/<name>-<recipe key>/``; the
key is a SHA-256 of the whole recipe plus ``STARTER_CODE_VERSION`` (bump it when
the build code changes what it produces). Builds are atomic (a temp folder,
then a rename), so an interrupted build never leaves a half model behind. The
build runs torch on ``BUILD_THREADS`` threads, whatever the machine has, so on one
machine the same recipe gives the same weights, byte for byte.

``starter@N`` names the same recipe started from build seed ``N`` (a seed study
over builds: ``posttrain grpo --base-model starter@3``).
"""

from __future__ import annotations

import hashlib
import json
import math
import random
import re
import shutil
import sys
import time
from collections.abc import Callable
from dataclasses import asdict, dataclass
from pathlib import Path
from typing import Any, Protocol

from posttrain.envs import get_env
from posttrain.policy.models import FROZEN_MODULES_KEY
from posttrain.policy.starters.copy_circuit import CopyCircuit, wire_copy_circuit
from posttrain.policy.starters.gate import StarterProbe, probe_policy
from posttrain.policy.starters.hook_data import HookStarterData
from posttrain.policy.starters.prefix_loss import shared_head_loss
from posttrain.policy.starters.recipes import (
    STARTER_CODE_VERSION,
    Architecture,
    StarterRecipe,
    starter_data,
)
from posttrain.policy.tool_turns import CHATML_TEMPLATE
from posttrain.progress import progress_bar

SPECIAL_TOKENS = ("<|endoftext|>", "<|im_start|>", "<|im_end|>")
TOOL_TAGS = ("<tool_call>", "</tool_call>")
ID_PREFIX = r"[A-Za-z]+[-_ ]?(?=[0-9])"  # letters (and one separator) right before a number
DIGIT_CHUNK = r"[0-9]{1,2}"  # numbers split into pairs of digits from the left


# ---------------------------------------------------------------- tokenizer and model


def train_tokenizer(texts: list[str], vocab_size: int, isolated: tuple[str, ...] = ()
                    ) -> Any:
    """A byte-level BPE ``PreTrainedTokenizerFast`` with the ChatML template.

    Digits are pre-split one per token. A run of ``isolated`` words is kept apart from
    its neighbours (the words of spans a policy copies from a prompt into a tool call), so
    a span is the same tokens wherever it stands. The vocabulary can stop below ``vocab_size``
    when the corpus runs out of pairs seen twice.
    """
    from tokenizers import (
        Regex,
        Tokenizer,
        decoders,
        models,
        pre_tokenizers,
        processors,
        trainers,
    )
    from transformers import PreTrainedTokenizerFast

    tokenizer = Tokenizer(models.BPE())
    # Without the usual word-splitting regex, BPE merges across words, so the
    # fixed system prompt (~220 tokens with word splits) shrinks to ~15 tokens and
    # training and sampling get ~4x cheaper. Three splits remain: at line ends (a
    # token never spans a role header and its text), before each digit (an id is
    # copied digit by digit), and around the letters that prefix a number
    # ("ORD-", "ord_"), so the token before an id's first digit is the same in the
    # customer's message and in the tool call, which makes the copy learnable.
    splits = [
        pre_tokenizers.Split("\n", behavior="merged_with_previous"),
        pre_tokenizers.Split(Regex(ID_PREFIX), behavior="isolated"),
        pre_tokenizers.Split(Regex(DIGIT_CHUNK), behavior="isolated"),
    ]
    if isolated:
        # a run of these words (one space apart) is split off without the space before
        # it, then cut before each inner word with its space: "The Quiet Orchard" is
        # "The" " Quiet" " Orchard" after 'have "' in a prompt as after '"title": "' in a
        # call, and "Friday" the same after "on " as after '"day": "'
        words = "(?:" + "|".join(re.escape(word) for word in isolated) + ")"
        splits += [
            pre_tokenizers.Split(Regex(rf"\b{words}(?: {words})*\b"), behavior="isolated"),
            pre_tokenizers.Split(Regex(rf" (?={words}\b)"), behavior="merged_with_next"),
        ]
    tokenizer.pre_tokenizer = pre_tokenizers.Sequence(
        [*splits, pre_tokenizers.ByteLevel(add_prefix_space=False, use_regex=False)]
    )
    tokenizer.decoder = decoders.ByteLevel()
    tokenizer.post_processor = processors.ByteLevel(trim_offsets=False)
    trainer = trainers.BpeTrainer(
        vocab_size=vocab_size,
        min_frequency=2,
        special_tokens=list(SPECIAL_TOKENS),
        initial_alphabet=pre_tokenizers.ByteLevel.alphabet(),
        show_progress=False,
    )
    # every two-digit number, often enough that all 100 pairs become tokens and
    # every id splits the same way ("4017" -> "40" "17", "20931" -> "20" "93" "1")
    digit_pairs = " ".join(f"{n:02d}" for n in range(100))
    # and every isolated word, with a space before it and without, often enough to be
    # one token each (a word split into letters shares them with every other word, and
    # the copy circuit would confuse the two)
    word_lines = [" ".join(isolated), "\n".join(isolated)] if isolated else []
    tokenizer.train_from_iterator([*texts, *[digit_pairs] * 1000, *word_lines * 200],
                                  trainer=trainer)
    wrapped = PreTrainedTokenizerFast(
        tokenizer_object=tokenizer,
        bos_token=None,
        eos_token="<|im_end|>",
        pad_token="<|endoftext|>",
        additional_special_tokens=["<|im_start|>", "<|im_end|>"],
    )
    wrapped.add_tokens(list(TOOL_TAGS))  # not special: decode keeps them
    wrapped.chat_template = CHATML_TEMPLATE
    wrapped.padding_side = "left"
    return wrapped


def new_model(
    tokenizer: Any,
    architecture: Architecture,
    seed: int,
    copy_circuit: bool = False,
    *,
    match: float = 3.0,
    copy: float = 8.0,
    digit_norm: float = 1.0,
    copy_ids: tuple[list[int], list[int]] | None = None,
) -> tuple[Any, CopyCircuit | None]:
    """A freshly initialised decoder sized for ``tokenizer``, and its copy circuit (or None).

    ``copy_ids``: (the tokens the circuit copies, the prefix tokens it matches before
    them), from the environment's starter data (``copy_token_ids``); default: the default
    environment's.

    It is the Qwen2 decoder (RMSNorm, rotary positions, SwiGLU MLP, grouped-query
    attention, tied embeddings) saved as ``model_type: llama``. The reason is the
    tokenizer: for a ``qwen2`` folder, transformers' ``AutoTokenizer`` always
    builds ``Qwen2Tokenizer``, which replaces the saved pre-tokenizer with Qwen's
    word-splitting regex and silently tokenises the starter's text differently
    from training. For a ``llama`` folder it loads ``tokenizer.json`` as saved.
    (The attention projections carry biases: the circuit's position head uses them.)
    """
    import torch
    from transformers import LlamaConfig, LlamaForCausalLM

    eos_id = tokenizer.convert_tokens_to_ids("<|im_end|>")
    pad_id = tokenizer.convert_tokens_to_ids("<|endoftext|>")
    # a plain dict: LlamaConfig takes rope_theta through **kwargs, which its stubs omit
    config_fields: dict[str, Any] = dict(
        vocab_size=len(tokenizer),
        hidden_size=architecture.hidden_size,
        intermediate_size=architecture.intermediate_size,
        num_hidden_layers=architecture.num_layers,
        num_attention_heads=architecture.num_heads,
        num_key_value_heads=architecture.num_kv_heads,
        max_position_embeddings=architecture.max_positions,
        tie_word_embeddings=True,
        rope_theta=10000.0,
        attention_bias=copy_circuit,  # layer 0 position head uses biases
        bos_token_id=None,
        eos_token_id=eos_id,
        pad_token_id=pad_id,
    )
    config = LlamaConfig(**config_fields)
    torch.manual_seed(seed)
    model = LlamaForCausalLM(config)
    model.generation_config.eos_token_id = eos_id
    model.generation_config.pad_token_id = pad_id
    model.generation_config.bos_token_id = None
    circuit = None
    if copy_circuit:
        sink_id = tokenizer.convert_tokens_to_ids("<|im_start|>")
        copied, prefixes = copy_ids or starter_data().copy_token_ids(tokenizer, [])
        circuit = wire_copy_circuit(
            model,
            seed,
            copied,
            prefixes,
            sink_id,
            match=match,
            copy=copy,
            digit_norm=digit_norm,
        )
        setattr(model.config, FROZEN_MODULES_KEY, circuit.frozen_module_names())
    return model, circuit


# ---------------------------------------------------------------- supervised warm start


def _encode_rows(
    tokenizer: Any, rows: list[dict[str, Any]], field: str, system: str
) -> list[tuple[list[int], int]]:
    """(token ids, prompt length) per row for reply ``field``; replies end with ``<|im_end|>``."""
    eos_id = tokenizer.convert_tokens_to_ids("<|im_end|>")
    encoded = []
    for row in rows:
        messages = [
            {"role": "system", "content": system},
            {"role": "user", "content": row["prompt"]},
        ]
        prompt_ids = list(
            tokenizer.apply_chat_template(
                messages, add_generation_prompt=True, tokenize=True, return_dict=False
            )
        )
        reply_ids = [*tokenizer.encode(row[field], add_special_tokens=False), eos_id]
        encoded.append((prompt_ids + reply_ids, len(prompt_ids)))
    return encoded


class LearningSchedule(Protocol):
    """What ``learning_rate_at`` reads of a recipe (both kinds of starter recipe have it)."""

    @property
    def learning_rate(self) -> float: ...

    @property
    def warmup_steps(self) -> int: ...

    @property
    def total_steps(self) -> int: ...


def learning_rate_at(step: int, recipe: LearningSchedule) -> float:
    """Linear warm-up to ``learning_rate``, then cosine to zero at the last step."""
    if step < recipe.warmup_steps:
        return recipe.learning_rate * (step + 1) / recipe.warmup_steps
    progress = (step - recipe.warmup_steps) / max(1, recipe.total_steps - recipe.warmup_steps)
    return recipe.learning_rate * 0.5 * (1.0 + math.cos(math.pi * min(1.0, progress)))


def _collate(batch: list[tuple[list[int], int]], pad_id: int) -> tuple[Any, Any, Any]:
    """Right-padded ``(input_ids, labels, attention_mask)``; labels only after the prompt."""
    import torch

    width = max(len(ids) for ids, _ in batch)
    input_ids = torch.full((len(batch), width), pad_id, dtype=torch.long)
    labels = torch.full((len(batch), width), -100, dtype=torch.long)
    attention = torch.zeros((len(batch), width), dtype=torch.long)
    for row, (ids, prompt_length) in enumerate(batch):
        input_ids[row, : len(ids)] = torch.tensor(ids)
        labels[row, prompt_length : len(ids)] = torch.tensor(ids[prompt_length:])
        attention[row, : len(ids)] = 1
    return input_ids, labels, attention


def warm_start_step(model: Any, optimizer: Any, tensors: tuple[Any, Any, Any],
                    learning_rate: float, max_grad_norm: float,
                    circuit: CopyCircuit | None, *, shared_head: bool = False) -> float:
    """One optimizer step of a warm start on ``(input_ids, labels, attention_mask)``: the
    loss, its gradient clipped to ``max_grad_norm``, AdamW at ``learning_rate``, then the
    copy circuit's slices enforced. Returns the loss. ``shared_head``: the rows' shared
    head run once (``starters.prefix_loss``). (The episode starters use it too.)"""
    import torch

    input_ids, labels, attention = tensors
    for group in optimizer.param_groups:
        group["lr"] = learning_rate
    if shared_head:
        loss = shared_head_loss(model, input_ids, labels, attention)
    else:
        loss = model(input_ids=input_ids, attention_mask=attention, labels=labels).loss
    optimizer.zero_grad(set_to_none=True)
    loss.backward()
    torch.nn.utils.clip_grad_norm_(model.parameters(), max_grad_norm)
    optimizer.step()
    if circuit is not None:
        circuit.enforce(model)
    return loss.item()


def supervised_warm_start(
    model: Any,
    tokenizer: Any,
    rows: list[dict[str, Any]],
    recipe: StarterRecipe,
    *,
    seed: int,
    circuit: CopyCircuit | None = None,
    on_step: Callable[[int, float], None] | None = None,
) -> list[float]:
    """Train ``model`` in place through both phases; returns the loss per step.

    Phase 1 (``skill_steps``): dialogues answered with the right move. Phase 2
    (``mix_steps``): dialogues answered from the behaviour mix. One AdamW
    optimizer and one learning-rate schedule span both. Dialogues are drawn by a
    shuffle over epochs seeded by ``seed`` (with ``fresh_ids``, each draw gets a
    new order number); the loss covers only reply tokens. With a ``circuit``, its
    layers' attention is not trained and its slices stay reserved (enforced after
    every step).
    """
    import torch

    data = starter_data(recipe.env, recipe.prompts_file)
    fixed = not recipe.fresh_ids  # encode once; with fresh ids each draw is encoded anew
    right = _encode_rows(tokenizer, rows, "right_reply", data.system) if fixed else []
    mixed = _encode_rows(tokenizer, rows, "reply", data.system) if fixed else []
    order_rng, id_rng = random.Random(seed), random.Random(seed + 2)
    hooks = circuit.freeze_attention(model) if circuit is not None else []
    optimizer = torch.optim.AdamW(
        model.parameters(),
        lr=recipe.learning_rate,
        betas=(0.9, 0.95),
        weight_decay=recipe.weight_decay,
    )
    model.train()
    queue: list[int] = []
    losses = []
    for step in range(recipe.total_steps):
        if len(queue) < recipe.batch_size:
            epoch = list(range(len(rows)))
            order_rng.shuffle(epoch)
            queue.extend(epoch)
        skill = step < recipe.skill_steps
        picked = queue[: recipe.batch_size]
        del queue[: recipe.batch_size]
        if recipe.fresh_ids:
            fresh = [data.fresh(rows[i], id_rng) for i in picked]
            batch = _encode_rows(tokenizer, fresh, "right_reply" if skill else "reply",
                                 data.system)
        else:
            batch = [(right if skill else mixed)[i] for i in picked]
        losses.append(warm_start_step(model, optimizer, _collate(batch, tokenizer.pad_token_id),
                                      learning_rate_at(step, recipe), recipe.max_grad_norm,
                                      circuit, shared_head=recipe.shared_head))
        if on_step is not None:
            on_step(step + 1, losses[-1])
    for hook in hooks:
        hook.remove()
    model.eval()
    return losses


# ---------------------------------------------------------------- build and cache


def weights_sha256(folder: str | Path) -> str:
    """SHA-256 of a built model's ``model.safetensors`` (pins determinism)."""
    return hashlib.sha256((Path(folder) / "model.safetensors").read_bytes()).hexdigest()


@dataclass
class _Attempt:
    """One build seed's trained model and what the gate found."""

    seed: int
    model: Any
    probe: StarterProbe
    failures: list[str]
    losses: list[float]
    seconds: float
    mix: dict[str, Any] | None = None  # the behaviour mix it was trained on
    rows: list[dict[str, Any]] | None = None  # and the dialogues of that mix

    def record(self) -> dict[str, Any]:
        return {
            "seed": self.seed,
            "mix": self.mix,
            "probe": self.probe.to_dict(),
            "failures": self.failures,
            "final_loss": sum(self.losses[-10:]) / len(self.losses[-10:]) if self.losses else None,
            "seconds": round(self.seconds, 1),
        }


def _say(text: str) -> None:
    print(text, file=sys.stderr, flush=True)


def _train_one_seed(
    recipe: StarterRecipe,
    seed: int,
    tokenizer: Any,
    rows: list[dict[str, Any]],
    label: str,
    show_progress: bool,
) -> _Attempt:
    started = time.monotonic()
    data = starter_data(recipe.env, recipe.prompts_file)
    copy_ids = data.copy_token_ids(tokenizer, rows)
    model, circuit = new_model(
        tokenizer,
        recipe.architecture,
        seed,
        recipe.copy_circuit and bool(copy_ids[0]),
        match=recipe.circuit_match,
        copy=recipe.circuit_copy,
        digit_norm=recipe.circuit_digit_norm,
        copy_ids=copy_ids,
    )
    with progress_bar(label, recipe.total_steps, enabled=show_progress) as bar:
        losses = supervised_warm_start(
            model, tokenizer, rows, recipe, seed=seed, circuit=circuit,
            on_step=lambda step, _: bar(step),
        )  # fmt: skip
    probe = probe_policy(model, tokenizer, get_env(recipe.env), data)
    failures = recipe.spec.failures(probe)
    return _Attempt(seed, model, probe, failures, losses, time.monotonic() - started)


def build_from_scratch(
    recipe: StarterRecipe, folder: Path, force: bool, show_progress: bool
) -> Path:
    """Build ``recipe`` into ``folder`` (atomically): tokenizer, then build seeds in turn
    until one meets the gate (module docstring). The caller holds the build lock and has
    set torch's thread count (``posttrain.policy.starters.registry.build_starter``)."""
    import torch

    started = time.monotonic()
    data = starter_data(recipe.env, recipe.prompts_file)
    rows = data.dialogues(recipe.mix, recipe.corpus_situations, recipe.data_seed)
    # a rule's own hand-written data has no such note; one built from hooks may
    overlap = getattr(data, "overlap_note", None)
    if callable(overlap) and (note := overlap(recipe.corpus_situations, recipe.data_seed)):
        _say(note)
    texts = [data.render(row) for row in rows]
    tokenizer = train_tokenizer(texts, recipe.vocab_size, data.isolated_words(rows))
    tokenizer_seconds = time.monotonic() - started
    attempts: list[dict[str, Any]] = []
    chosen: _Attempt | None = None
    mix = recipe.mix
    for number in range(recipe.build_attempts):
        seed = recipe.seed + number
        label = f"building {recipe.name} (build seed {seed})"
        if number and isinstance(data, HookStarterData):
            # a starter built from hooks also steers its mix toward the gate's ranges
            # (the refund starters' mixes were measured by hand: docs/policies.md)
            mix = mix.steered(attempts[-1]["probe"]["pass_rate"], data.spec_pass_rates)
            rows = data.dialogues(mix, recipe.corpus_situations, recipe.data_seed)
        attempt = _train_one_seed(recipe, seed, tokenizer, rows, label, show_progress)
        attempt.mix, attempt.rows = asdict(mix), rows
        attempts.append(attempt.record())
        if chosen is None or recipe.spec.distance(attempt.probe) < recipe.spec.distance(
            chosen.probe
        ):
            chosen = attempt
        if not attempt.failures:
            _say(f"{recipe.name}: build seed {seed} meets the spec ({attempt.probe.describe()})")
            break
        steer = (", its mix steered toward the ranges"
                 if isinstance(data, HookStarterData) else "")
        retry = (
            f"; rebuilding from build seed {seed + 1}{steer} ({number + 2} of "
            f"{recipe.build_attempts})"
            if number + 1 < recipe.build_attempts
            else ""
        )
        _say(
            f"{recipe.name}: build seed {seed} is outside the spec "
            f"({'; '.join(attempt.failures)}){retry}"
        )
    assert chosen is not None  # build_attempts >= 1 (StarterRecipe checks it)
    gate = "passed" if not chosen.failures else "failed"
    if gate == "failed":
        _say(
            f"{recipe.name}: no build seed in {recipe.seed}-{recipe.seed + len(attempts) - 1} "
            f"met the spec; keeping build seed {chosen.seed}, the nearest "
            f"({chosen.probe.describe()}). Training on it may not behave as documented; "
            "`posttrain model info` shows the probe."
        )
    counts: dict[str, int] = {}
    for row in chosen.rows or rows:
        key = f"{row['category']}/{row['behaviour']}"
        counts[key] = counts.get(key, 0) + 1
    build = {
        "name": recipe.name,
        "key": recipe.key(),
        "code_version": STARTER_CODE_VERSION,
        "gate": gate,
        "build_seed": chosen.seed,
        "probe": chosen.probe.to_dict(),
        "attempts": attempts,
        "parameters": sum(p.numel() for p in chosen.model.parameters()),
        "vocab_size": len(tokenizer),
        "dialogues": len(rows),
        "mix": chosen.mix,
        "behaviour_counts": dict(sorted(counts.items())),
        "final_loss": chosen.record()["final_loss"],
        "seconds": round(time.monotonic() - started, 1),
        "tokenizer_seconds": round(tokenizer_seconds, 2),
        "torch_threads": torch.get_num_threads(),
    }
    save_atomically(folder, chosen.model, tokenizer, recipe, build, force)
    return folder


def save_atomically(
    folder: Path, model: Any, tokenizer: Any, recipe: Any, build: dict, force: bool,
    code_version: int = STARTER_CODE_VERSION,
) -> None:
    folder.parent.mkdir(parents=True, exist_ok=True)
    staging = folder.parent / f".{folder.name}.building-{time.time_ns()}"
    try:
        model.save_pretrained(staging)
        tokenizer.save_pretrained(staging)
        recipe_json = {"recipe": asdict(recipe), "code_version": code_version}
        (staging / "recipe.json").write_text(json.dumps(recipe_json, indent=2) + "\n")
        (staging / "build.json").write_text(json.dumps(build, indent=2) + "\n")
        if force and folder.exists():
            shutil.rmtree(folder)
        try:
            staging.rename(folder)
        except OSError:
            if not folder.is_dir():  # another process finished first: keep theirs
                raise
    finally:
        if staging.exists():
            shutil.rmtree(staging, ignore_errors=True)

