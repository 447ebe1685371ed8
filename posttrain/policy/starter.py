"""The embedded starter model: a tiny chat model built offline, deterministically, from a seed.

The machine this project runs on cannot download a model, so ``starter`` is built
here, on first use, from nothing but the template simulator:

1. **Dialogues.** ``simulate(recipe.corpus_situations, recipe.data_seed)`` writes
   customer prompts; each gets one assistant reply drawn from ``BehaviourMix``
   (per category: the right move, or one of the typical mistakes). This mix is
   what makes the base policy *partial*: on with-id prompts it sometimes looks
   the order up, sometimes garbles the id, asks for the id again, or refunds
   first. A fully converged warm start leaves GRPO nothing to learn (all samples
   of a group agree, advantages are zero); a mixed one leaves the choice of move
   for GRPO to climb (spike section 3).
2. **Tokenizer.** Byte-level BPE trained with ``tokenizers`` on those dialogues
   rendered in ChatML. Merges may cross words but not lines, and digits are
   split one per token (copying an order id is a copy of single digits). The
   template world is small, so the vocabulary fills with phrases and a whole
   dialogue is ~55 tokens. ``<tool_call>``/``</tool_call>`` are added as
   *non-special* tokens so ``skip_special_tokens`` never strips them.
3. **Model.** The Qwen2 decoder shape (RMSNorm, rotary positions, SwiGLU,
   grouped-query attention, tied embeddings) initialised from ``recipe.seed`` and
   saved as a transformers ``llama`` model (see ``new_model`` for why).
4. **Supervised warm start.** A plain torch loop (AdamW, linear warm-up then
   cosine to zero, loss on the reply tokens and the closing ``<|im_end|>`` only).
   A plain loop was chosen over TRL's SFTTrainer: fewer moving parts, no dataset
   conversion, bit-for-bit repeatable on one machine.

The result is cached under ``<models folder>/starter/<name>-<recipe key>/``; the
key is a SHA-256 of the whole recipe plus ``STARTER_CODE_VERSION`` (bump it when
the build code changes what it produces). Builds are atomic (a temp folder,
then a rename), so an interrupted build never leaves a half model behind.
Training on 2 CPU threads is deterministic: the same recipe on the same machine
gives the same tokenizer and the same weights, byte for byte.
"""

from __future__ import annotations

import fcntl
import hashlib
import json
import math
import random
import shutil
import sys
import time
from collections.abc import Callable, Iterator
from contextlib import contextmanager
from dataclasses import asdict, dataclass, field, replace
from pathlib import Path
from typing import Any

from posttrain.data.simulate import simulate
from posttrain.envs.refund import SYSTEM, normalize_order_id
from posttrain.errors import PosttrainError
from posttrain.progress import progress_bar

# Bump when a change to this module changes what a recipe builds.
STARTER_CODE_VERSION = 1

CHATML_TEMPLATE = (
    "{%- for message in messages %}"
    "{{- '<|im_start|>' + message['role'] + '\\n' + message['content'] + '<|im_end|>' + '\\n' }}"
    "{%- endfor %}"
    "{%- if add_generation_prompt %}{{- '<|im_start|>assistant\\n' }}{%- endif %}"
)
SPECIAL_TOKENS = ("<|endoftext|>", "<|im_start|>", "<|im_end|>")
TOOL_TAGS = ("<tool_call>", "</tool_call>")
ID_PREFIX = r"[A-Za-z]+[-_ ]?(?=[0-9])"  # letters (and one separator) right before a number

ASK_FOR_ID = (
    "Could you tell me your order number?",
    "I can help with that. What is your order id?",
    "Sorry to hear that. Which order is it? Please send me the order id.",
    "Sure, I will look into it. What is the order number?",
    "Thanks for writing. Can you give me the order id?",
)
OFF_TOPIC_REPLIES = (
    "Sorry, I can only help with orders and refunds.",
    "I'm the refund assistant, so I can't help with that one.",
    "That is outside what I can do here. I handle orders and refunds.",
    "I can't help with that, sorry. Ask me about an order or a refund.",
)


@dataclass(frozen=True)
class Architecture:
    """Qwen2 shape. Parameter counts include the tied embedding (vocab ~3.5k)."""

    hidden_size: int = 256
    num_layers: int = 9
    num_heads: int = 4
    num_kv_heads: int = 2
    intermediate_size: int = 1024
    max_positions: int = 1024


@dataclass(frozen=True)
class BehaviourMix:
    """Shares of the warm-start replies per prompt category (each category sums to 1).

    with-id: ``lookup`` = lookup_order with the customer's id (the only pass);
    ``wrong_id`` = lookup_order with one digit changed, dropped or swapped;
    ``ask`` = asks for the id the customer already gave; ``refund_first`` =
    create_refund before any lookup. no-id: ``ask`` (pass) or ``invent`` (a
    lookup with a made-up id). off-topic: ``short`` reply (pass) or ``invent``.
    """

    with_id_lookup: float = 0.30
    with_id_wrong_id: float = 0.15
    with_id_ask: float = 0.35
    with_id_refund_first: float = 0.20
    no_id_ask: float = 0.92
    no_id_invent: float = 0.08
    off_topic_short: float = 0.96
    off_topic_invent: float = 0.04

    def shares(self, category: str) -> dict[str, float]:
        """``{behaviour: share}`` for one prompt category."""
        prefix = category + "_"
        return {
            name[len(prefix) :]: value
            for name, value in asdict(self).items()
            if name.startswith(prefix)
        }


@dataclass(frozen=True)
class StarterRecipe:
    """Everything a starter build depends on; its hash is the cache key."""

    name: str = "starter"
    architecture: Architecture = field(default_factory=Architecture)
    mix: BehaviourMix = field(default_factory=BehaviourMix)
    seed: int = 0
    data_seed: int = 7919  # not 0: the evaluation's default prompt set is simulate(seed=0)
    corpus_situations: int = 4000
    vocab_size: int = 1024
    max_token_length: int | None = None  # longest token in characters (None: no limit)
    sft_steps: int = 300
    skill_share: float = 0.0  # first share of the SFT steps: the right move only
    batch_size: int = 16
    learning_rate: float = 1e-3
    warmup_steps: int = 20
    weight_decay: float = 0.0
    max_grad_norm: float = 1.0

    def key(self) -> str:
        """12 hex digits of SHA-256 over the recipe and the build-code version."""
        payload = json.dumps(
            {"recipe": asdict(self), "code_version": STARTER_CODE_VERSION}, sort_keys=True
        )
        return hashlib.sha256(payload.encode()).hexdigest()[:12]


RECIPES: dict[str, StarterRecipe] = {
    "starter": StarterRecipe(),
    "starter-2m": StarterRecipe(
        name="starter-2m",
        architecture=Architecture(hidden_size=128, num_layers=6, intermediate_size=512),
        sft_steps=200,
        learning_rate=2e-3,
    ),
}


def recipe_for(name: str) -> StarterRecipe:
    """The shipped recipe of a starter name; PosttrainError naming the choices otherwise."""
    if name not in RECIPES:
        raise PosttrainError(f"unknown starter model {name!r}; choose one of {', '.join(RECIPES)}")
    return RECIPES[name]


# ---------------------------------------------------------------- dialogues


RIGHT_MOVE = {"with_id": "lookup", "no_id": "ask", "off_topic": "short"}


def _tool_block(name: str, arguments: dict[str, Any]) -> str:
    return f"<tool_call>\n{json.dumps({'name': name, 'arguments': arguments})}\n</tool_call>"


def _garbled(order_id: str, rng: random.Random) -> str:
    """``order_id`` with one plausible copying mistake; never the id itself."""
    digits = order_id.split("-", 1)[1]
    while True:
        how = rng.choice(("change", "drop", "swap", "add"))
        chars = list(digits)
        spot = rng.randrange(len(chars))
        if how == "change":
            chars[spot] = str((int(chars[spot]) + rng.randrange(1, 10)) % 10)
        elif how == "drop" and len(chars) > 3:
            del chars[spot]
        elif how == "swap" and spot + 1 < len(chars):
            chars[spot], chars[spot + 1] = chars[spot + 1], chars[spot]
        elif how == "add":
            chars.insert(spot, str(rng.randrange(10)))
        candidate = "ORD-" + "".join(chars)
        if candidate != order_id:
            return candidate


def _reply(behaviour: str, order_id: str | None, rng: random.Random) -> str:
    invented = f"ORD-{rng.randrange(1000, 10000)}"
    if behaviour == "lookup":
        return _tool_block("lookup_order", {"order_id": order_id})
    if behaviour == "wrong_id":
        return _tool_block("lookup_order", {"order_id": _garbled(order_id, rng)})
    if behaviour == "refund_first":
        amount = rng.choice((9.99, 15.0, 20.0, 24.5, 39.0, 49.99, 60.0))
        return _tool_block("create_refund", {"order_id": order_id, "amount": amount})
    if behaviour == "invent":
        return _tool_block("lookup_order", {"order_id": invented})
    if behaviour == "ask":
        return rng.choice(ASK_FOR_ID)
    if behaviour == "short":
        return rng.choice(OFF_TOPIC_REPLIES)
    raise ValueError(f"unknown behaviour {behaviour!r}")


def starter_dialogues(recipe: StarterRecipe) -> list[dict[str, Any]]:
    """Warm-start rows ``{"prompt", "category", "behaviour", "reply"}``, deterministic.

    Prompts come from the template simulator (``recipe.data_seed``); each reply's
    behaviour is drawn from ``recipe.mix`` for the prompt's category.
    """
    rng = random.Random(recipe.data_seed)
    rows = []
    for record in simulate(recipe.corpus_situations, seed=recipe.data_seed):
        shares = recipe.mix.shares(record["category"])
        names = sorted(shares)
        behaviour = rng.choices(names, weights=[shares[n] for n in names])[0]
        order_id = normalize_order_id(record["prompt"])
        rows.append(
            {
                "prompt": record["prompt"],
                "category": record["category"],
                "behaviour": behaviour,
                "reply": _reply(behaviour, order_id, rng),
                "right_reply": _reply(RIGHT_MOVE[record["category"]], order_id, rng),
            }
        )
    return rows


def render_chatml(system: str, prompt: str, reply: str) -> str:
    """One dialogue as ChatML text (what the tokenizer is trained on)."""
    return (
        f"<|im_start|>system\n{system}<|im_end|>\n<|im_start|>user\n{prompt}<|im_end|>\n"
        f"<|im_start|>assistant\n{reply}<|im_end|>\n"
    )


# ---------------------------------------------------------------- tokenizer and model


def train_tokenizer(texts: list[str], vocab_size: int, max_token_length: int | None = None) -> Any:
    """A byte-level BPE ``PreTrainedTokenizerFast`` with the ChatML template.

    Digits are pre-split one per token. The vocabulary can stop below
    ``vocab_size`` when the corpus runs out of pairs seen twice.
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
    tokenizer.pre_tokenizer = pre_tokenizers.Sequence(
        [
            pre_tokenizers.Split("\n", behavior="merged_with_previous"),
            pre_tokenizers.Split(Regex(ID_PREFIX), behavior="isolated"),
            pre_tokenizers.Digits(individual_digits=True),
            pre_tokenizers.ByteLevel(add_prefix_space=False, use_regex=False),
        ]
    )
    tokenizer.decoder = decoders.ByteLevel()
    tokenizer.post_processor = processors.ByteLevel(trim_offsets=False)
    trainer = trainers.BpeTrainer(
        vocab_size=vocab_size,
        min_frequency=2,
        special_tokens=list(SPECIAL_TOKENS),
        initial_alphabet=pre_tokenizers.ByteLevel.alphabet(),
        show_progress=False,
        max_token_length=max_token_length,
    )
    tokenizer.train_from_iterator(texts, trainer=trainer)
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


def new_model(tokenizer: Any, architecture: Architecture, seed: int) -> Any:
    """A freshly initialised decoder sized for ``tokenizer`` (see the note on the architecture).

    It is the Qwen2 decoder (RMSNorm, rotary positions, SwiGLU MLP, grouped-query
    attention, tied embeddings) saved as ``model_type: llama``. The reason is the
    tokenizer: for a ``qwen2`` folder, transformers' ``AutoTokenizer`` always
    builds ``Qwen2Tokenizer``, which replaces the saved pre-tokenizer with Qwen's
    word-splitting regex and silently tokenises the starter's text differently
    from training. For a ``llama`` folder it loads ``tokenizer.json`` as saved.
    (Qwen2 adds biases to the q/k/v projections; this model has none.)
    """
    import torch
    from transformers import LlamaConfig, LlamaForCausalLM

    eos_id = tokenizer.convert_tokens_to_ids("<|im_end|>")
    pad_id = tokenizer.convert_tokens_to_ids("<|endoftext|>")
    config = LlamaConfig(
        vocab_size=len(tokenizer),
        hidden_size=architecture.hidden_size,
        intermediate_size=architecture.intermediate_size,
        num_hidden_layers=architecture.num_layers,
        num_attention_heads=architecture.num_heads,
        num_key_value_heads=architecture.num_kv_heads,
        max_position_embeddings=architecture.max_positions,
        tie_word_embeddings=True,
        rope_theta=10000.0,
        attention_bias=False,
        bos_token_id=None,
        eos_token_id=eos_id,
        pad_token_id=pad_id,
    )
    torch.manual_seed(seed)
    model = LlamaForCausalLM(config)
    model.generation_config.eos_token_id = eos_id
    model.generation_config.pad_token_id = pad_id
    model.generation_config.bos_token_id = None
    return model


# ---------------------------------------------------------------- supervised warm start


def _encode_rows(
    tokenizer: Any, rows: list[dict[str, Any]], field: str
) -> list[tuple[list[int], int]]:
    """(token ids, prompt length) per row for reply ``field``; replies end with ``<|im_end|>``."""
    eos_id = tokenizer.convert_tokens_to_ids("<|im_end|>")
    encoded = []
    for row in rows:
        messages = [
            {"role": "system", "content": SYSTEM},
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


def _learning_rate(step: int, recipe: StarterRecipe) -> float:
    """Linear warm-up to ``learning_rate``, then cosine to zero at ``sft_steps``."""
    if step < recipe.warmup_steps:
        return recipe.learning_rate * (step + 1) / recipe.warmup_steps
    progress = (step - recipe.warmup_steps) / max(1, recipe.sft_steps - recipe.warmup_steps)
    return recipe.learning_rate * 0.5 * (1.0 + math.cos(math.pi * min(1.0, progress)))


def supervised_warm_start(
    model: Any,
    tokenizer: Any,
    rows: list[dict[str, Any]],
    recipe: StarterRecipe,
    on_step: Callable[[int, float], None] | None = None,
) -> list[float]:
    """Train ``model`` in place for ``recipe.sft_steps`` steps; returns the loss per step.

    Batches are drawn by a seeded shuffle over epochs; padding is on the right and
    the loss covers only reply tokens (prompt and padding are labelled -100).
    """
    import torch

    skill_steps = round(recipe.skill_share * recipe.sft_steps)
    right = _encode_rows(tokenizer, rows, "right_reply") if skill_steps else []
    mixed = _encode_rows(tokenizer, rows, "reply")
    pad_id = tokenizer.pad_token_id
    order_rng = random.Random(recipe.seed)
    optimizer = torch.optim.AdamW(
        model.parameters(),
        lr=recipe.learning_rate,
        betas=(0.9, 0.95),
        weight_decay=recipe.weight_decay,
    )
    model.train()
    queue: list[int] = []
    losses = []
    for step in range(recipe.sft_steps):
        if len(queue) < recipe.batch_size:
            epoch = list(range(len(rows)))
            order_rng.shuffle(epoch)
            queue.extend(epoch)
        source = right if step < skill_steps else mixed
        batch = [source[i] for i in queue[: recipe.batch_size]]
        del queue[: recipe.batch_size]
        width = max(len(ids) for ids, _ in batch)
        input_ids = torch.full((len(batch), width), pad_id, dtype=torch.long)
        labels = torch.full((len(batch), width), -100, dtype=torch.long)
        attention = torch.zeros((len(batch), width), dtype=torch.long)
        for row, (ids, prompt_length) in enumerate(batch):
            input_ids[row, : len(ids)] = torch.tensor(ids)
            labels[row, prompt_length : len(ids)] = torch.tensor(ids[prompt_length:])
            attention[row, : len(ids)] = 1
        for group in optimizer.param_groups:
            group["lr"] = _learning_rate(step, recipe)
        loss = model(input_ids=input_ids, attention_mask=attention, labels=labels).loss
        optimizer.zero_grad(set_to_none=True)
        loss.backward()
        torch.nn.utils.clip_grad_norm_(model.parameters(), recipe.max_grad_norm)
        optimizer.step()
        losses.append(loss.item())
        if on_step is not None:
            on_step(step + 1, losses[-1])
    model.eval()
    return losses


# ---------------------------------------------------------------- build and cache


def starter_folder(name: str = "starter", *, recipe: StarterRecipe | None = None) -> Path:
    """Where the build of ``name`` (or of ``recipe``) is cached; it may not exist yet."""
    from posttrain.policy.models import models_dir

    recipe = recipe or recipe_for(name)
    return models_dir() / "starter" / f"{recipe.name}-{recipe.key()}"


def weights_sha256(folder: str | Path) -> str:
    """SHA-256 of a built model's ``model.safetensors`` (pins determinism)."""
    return hashlib.sha256((Path(folder) / "model.safetensors").read_bytes()).hexdigest()


def build_starter(
    name: str = "starter",
    force: bool = False,
    *,
    recipe: StarterRecipe | None = None,
    show_progress: bool = True,
) -> Path:
    """Build (or find in the cache) a starter model; returns its folder.

    The folder is a normal transformers folder (``from_pretrained`` loads it)
    plus ``recipe.json`` and ``build.json`` (timings, final loss, behaviour
    counts). ``force`` rebuilds even when cached. ``recipe`` overrides the
    shipped recipe of ``name`` (tests use smaller ones). Concurrent builds of
    the same recipe are serialised by a lock file next to the folder.
    """
    recipe = recipe or recipe_for(name)
    folder = starter_folder(recipe.name, recipe=recipe)
    if folder.is_dir() and not force:
        return folder
    with _build_lock(folder):
        if folder.is_dir() and not force:
            return folder  # another process built it while we waited
        return _build(recipe, folder, force, show_progress)


@contextmanager
def _build_lock(folder: Path) -> Iterator[None]:
    """One build of a recipe at a time across processes; the others wait, then reuse it."""
    folder.parent.mkdir(parents=True, exist_ok=True)
    with open(folder.parent / f".{folder.name}.lock", "w") as handle:
        try:
            fcntl.flock(handle, fcntl.LOCK_EX | fcntl.LOCK_NB)
        except BlockingIOError:
            print(f"waiting for another build of {folder.name} ...", file=sys.stderr)
            fcntl.flock(handle, fcntl.LOCK_EX)
        try:
            yield
        finally:
            fcntl.flock(handle, fcntl.LOCK_UN)


def _build(recipe: StarterRecipe, folder: Path, force: bool, show_progress: bool) -> Path:
    import torch

    # One thread: the weights then do not depend on the machine's core count (a
    # different split of a sum rounds differently), and a build sharing busy cores
    # with other work does not stall in thread barriers.
    threads = torch.get_num_threads()
    torch.set_num_threads(1)
    try:
        return _build_single_threaded(recipe, folder, force, show_progress)
    finally:
        torch.set_num_threads(threads)


def _build_single_threaded(
    recipe: StarterRecipe, folder: Path, force: bool, show_progress: bool
) -> Path:
    import torch

    started = time.monotonic()
    rows = starter_dialogues(recipe)
    texts = [render_chatml(SYSTEM, row["prompt"], row["reply"]) for row in rows]
    tokenizer = train_tokenizer(texts, recipe.vocab_size, recipe.max_token_length)
    model = new_model(tokenizer, recipe.architecture, recipe.seed)
    tokenizer_seconds = time.monotonic() - started
    with progress_bar(f"building {recipe.name}", recipe.sft_steps, enabled=show_progress) as bar:
        losses = supervised_warm_start(model, tokenizer, rows, recipe, lambda step, _: bar(step))
    counts: dict[str, int] = {}
    for row in rows:
        key = f"{row['category']}/{row['behaviour']}"
        counts[key] = counts.get(key, 0) + 1
    build = {
        "name": recipe.name,
        "key": recipe.key(),
        "code_version": STARTER_CODE_VERSION,
        "parameters": sum(p.numel() for p in model.parameters()),
        "vocab_size": len(tokenizer),
        "dialogues": len(rows),
        "behaviour_counts": dict(sorted(counts.items())),
        "final_loss": sum(losses[-10:]) / min(10, len(losses)),
        "seconds": round(time.monotonic() - started, 1),
        "tokenizer_seconds": round(tokenizer_seconds, 2),
        "torch_threads": torch.get_num_threads(),
    }
    _save_atomically(folder, model, tokenizer, recipe, build, force)
    return folder


def _save_atomically(
    folder: Path, model: Any, tokenizer: Any, recipe: StarterRecipe, build: dict, force: bool
) -> None:
    folder.parent.mkdir(parents=True, exist_ok=True)
    staging = folder.parent / f".{folder.name}.building-{time.time_ns()}"
    try:
        model.save_pretrained(staging)
        tokenizer.save_pretrained(staging)
        recipe_json = {"recipe": asdict(recipe), "code_version": STARTER_CODE_VERSION}
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


def with_overrides(recipe: StarterRecipe, **changes: Any) -> StarterRecipe:
    """A copy of ``recipe`` with fields replaced (a changed recipe has a new cache key)."""
    return replace(recipe, **changes)
