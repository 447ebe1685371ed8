"""The embedded starter model: a tiny chat model built offline, deterministically, from a seed.

The machine this project runs on cannot download a model, so ``starter`` is built
here, on first use, from nothing but the template simulator:

1. **Dialogues.** ``simulate(recipe.corpus_situations, recipe.data_seed)`` writes
   customer prompts; each gets one assistant reply drawn from ``BehaviourMix``
   (per category: the right move, or one of the typical mistakes). This mix is
   what makes the base policy *partial*: on with-id prompts it sometimes looks
   the order up, sometimes asks for the id again, or refunds first. A fully
   converged warm start leaves GRPO nothing to learn (all samples of a group
   agree, advantages are zero); a mixed one leaves the choice of move for GRPO
   to climb (spike section 3).
2. **Tokenizer.** Byte-level BPE trained with ``tokenizers`` on those dialogues
   rendered in ChatML. Merges may cross words but not lines; an id's prefix
   (``ORD-``, ``ord_`` ...) is its own token and its number splits into pairs of
   digits from the left, the same way in a prompt and in a tool call. The
   template world is small, so the vocabulary fills with phrases (the whole
   system prompt is a handful of tokens). ``<tool_call>``/``</tool_call>`` are
   added as *non-special* tokens so ``skip_special_tokens`` never strips them.
3. **Model.** The Qwen2 decoder shape (RMSNorm, rotary positions, SwiGLU,
   grouped-query attention, tied embeddings) initialised from ``recipe.seed`` and
   saved as a transformers ``llama`` model (see ``new_model`` for why), with an
   order-id copying circuit wired into its first two layers (``wire_copy_circuit``:
   a few-minute warm start cannot teach a model this small to copy).
4. **Supervised warm start.** A plain torch loop (AdamW, linear warm-up then
   cosine to zero, loss on the reply tokens and the closing ``<|im_end|>`` only):
   first the right move only, then the behaviour mix; every with-id dialogue gets
   a fresh random order number each time it is drawn, so ids are copied, never
   remembered. A plain loop was chosen over TRL's SFTTrainer: fewer moving parts,
   no dataset conversion, bit-for-bit repeatable.

The result is cached under ``<models folder>/starter/<name>-<recipe key>/``; the
key is a SHA-256 of the whole recipe plus ``STARTER_CODE_VERSION`` (bump it when
the build code changes what it produces). Builds are atomic (a temp folder,
then a rename), so an interrupted build never leaves a half model behind.
The build always runs torch on ``BUILD_THREADS`` threads, whatever the machine
has, so the same recipe gives the same tokenizer and the same weights, byte for
byte (a different split of a sum would round differently).
"""

from __future__ import annotations

import fcntl
import hashlib
import json
import math
import random
import re
import shutil
import sys
import time
from collections.abc import Callable, Iterator
from contextlib import contextmanager
from dataclasses import asdict, dataclass, field, replace
from pathlib import Path
from typing import Any

from posttrain.data.simulate import ID_SPELLINGS, simulate
from posttrain.envs.refund import SYSTEM, normalize_order_id
from posttrain.errors import PosttrainError
from posttrain.progress import progress_bar

# torch threads of every build. Two halves the 10M build here (measured 0.52 s a
# step against 0.92 on one thread, 2-core x86_64); a 1-core machine still gets
# the same weights, just more slowly.
BUILD_THREADS = 2

# Bump when a change to this module changes what a recipe builds.
STARTER_CODE_VERSION = 4

CHATML_TEMPLATE = (
    "{%- for message in messages %}"
    "{{- '<|im_start|>' + message['role'] + '\\n' + message['content'] + '<|im_end|>' + '\\n' }}"
    "{%- endfor %}"
    "{%- if add_generation_prompt %}{{- '<|im_start|>assistant\\n' }}{%- endif %}"
)
SPECIAL_TOKENS = ("<|endoftext|>", "<|im_start|>", "<|im_end|>")
TOOL_TAGS = ("<tool_call>", "</tool_call>")
ID_PREFIX = r"[A-Za-z]+[-_ ]?(?=[0-9])"  # letters (and one separator) right before a number
DIGIT_CHUNK = r"[0-9]{1,2}"  # numbers split into pairs of digits from the left

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

    with_id_lookup: float = 0.50
    with_id_wrong_id: float = 0.0
    with_id_ask: float = 0.30
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
    skill_steps: int = 200  # phase 1: dialogues answered with the right move only
    mix_steps: int = 100  # phase 2: dialogues answered from the behaviour mix
    fresh_ids: bool = True  # a new random order number each time a dialogue is drawn
    copy_circuit: bool = True  # an order-id copying circuit wired at init (wire_copy_circuit)
    freeze_circuit: bool = True  # keep layers 0-1 attention fixed during the warm start
    circuit_match: float = 3.0  # sharpness of the copy head's match (wire_copy_circuit)
    circuit_quiet: float = 1.0  # scale of layers 0-1's other random branches at init
    batch_size: int = 16
    learning_rate: float = 2e-3
    warmup_steps: int = 20
    weight_decay: float = 0.0  # must stay 0 while freeze_circuit holds weights by zero grads
    max_grad_norm: float = 1.0
    # "": trained from scratch. A starter name: start from that starter's build, grown
    # to ``architecture`` without changing its outputs (posttrain.policy.grow), then
    # trained ``skill_steps + mix_steps`` more steps; the tokenizer is the base's.
    grow_from: str = ""

    @property
    def total_steps(self) -> int:
        """Optimizer steps over both phases (one learning-rate schedule)."""
        return self.skill_steps + self.mix_steps

    def key(self) -> str:
        """12 hex digits of SHA-256 over the recipe and the build-code version."""
        recipe = asdict(self)
        content = {"recipe": recipe, "code_version": STARTER_CODE_VERSION}
        if self.grow_from:  # a new base build means a new grown one
            content["base_key"] = recipe_for(self.grow_from).key()
        else:  # recipes from before growing existed keep their key (and their cache)
            del recipe["grow_from"]
        payload = json.dumps(content, sort_keys=True)
        return hashlib.sha256(payload.encode()).hexdigest()[:12]


RECIPES: dict[str, StarterRecipe] = {
    "starter-2m": StarterRecipe(
        name="starter-2m",
        architecture=Architecture(hidden_size=128, num_layers=6, intermediate_size=512),
        skill_steps=230,
        # 71, not 70: the warm start is sensitive to small changes. Of four builds
        # differing in one step or one circuit constant, two kept the copy (35/60
        # ids) and two lost it and mixed up the categories; 70 is one that lost
        # it. tests/test_starter.py checks the built model's copy rate.
        mix_steps=71,
        learning_rate=3e-3,
    ),
}


# ``starter`` (~9.1M) is grown from the 2M build rather than trained from scratch: a
# ~10M shape warm-started from scratch with the copy circuit lost the copy in all eight
# variants tried (at most 3 of 60 ids, greedy; learning rate 7e-4 to 2e-3, the
# circuit's branches at full, 0.5, 0.3 or 0.1 scale, the match head in layer 1 or
# last). Grown, it starts as the 2M model exactly (posttrain.policy.grow) and keeps
# the copy; 100 right-move + 60 mix steps then use the new width. Its mix asks
# again more often than the 2M one (0.40 against 0.30 of with-id replies): the
# larger model copies better, and a with-id pass@1 near the seeds' base (~0.3)
# needs fewer lookups to say so. Of thirteen grown variants (100-200 steps, rates
# 3e-4 to 2e-3, four mixes) this one is the nearest to the seeds' base policy; the
# no-id rate is the fragile one (0.50-0.70 on the holdout across variants, 0.57-0.81
# over 400 situations). docs/policies.md has the measurements.
RECIPES["starter"] = StarterRecipe(
    name="starter",
    architecture=Architecture(
        hidden_size=256, num_layers=9, num_heads=8, num_kv_heads=4, intermediate_size=1024
    ),
    mix=BehaviourMix(
        with_id_lookup=0.35,
        with_id_ask=0.40,
        with_id_refund_first=0.25,
        no_id_ask=0.96,
        no_id_invent=0.04,
    ),
    skill_steps=100,
    mix_steps=60,
    learning_rate=1e-3,
    grow_from="starter-2m",
)


def recipe_for(name: str) -> StarterRecipe:
    """The shipped recipe of a starter name; PosttrainError naming the choices otherwise."""
    if name not in RECIPES:
        choices = ", ".join(sorted(RECIPES))
        raise PosttrainError(f"unknown starter model {name!r}; choose one of {choices}")
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


def train_tokenizer(texts: list[str], vocab_size: int) -> Any:
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
            pre_tokenizers.Split(Regex(DIGIT_CHUNK), behavior="isolated"),
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
    )
    # every two-digit number, often enough that all 100 pairs become tokens and
    # every id splits the same way ("4017" -> "40" "17", "20931" -> "20" "93" "1")
    digit_pairs = " ".join(f"{n:02d}" for n in range(100))
    tokenizer.train_from_iterator([*texts, *[digit_pairs] * 1000], trainer=trainer)
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
    quiet: float = 1.0,
) -> Any:
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
        attention_bias=copy_circuit,  # layer 0 position head uses biases
        bos_token_id=None,
        eos_token_id=eos_id,
        pad_token_id=pad_id,
    )
    torch.manual_seed(seed)
    model = LlamaForCausalLM(config)
    model.generation_config.eos_token_id = eos_id
    model.generation_config.pad_token_id = pad_id
    model.generation_config.bos_token_id = None
    if copy_circuit:
        sink_id = tokenizer.convert_tokens_to_ids("<|im_start|>")
        wire_copy_circuit(model, seed, *id_token_ids(tokenizer), sink_id, match=match, quiet=quiet)
    return model


def id_token_ids(tokenizer: Any) -> tuple[list[int], list[int]]:
    """(digit-chunk token ids, order-id prefix token ids) of a starter tokenizer.

    The prefixes are the tokens right before the number in each way a customer
    spells an order id (``ORD-``, ``ord_``, ``#ORD-`` ...), read off the tokenizer.
    """
    digits = sorted(i for token, i in tokenizer.get_vocab().items() if token.isdigit())
    prefixes = set()
    for spelling in ID_SPELLINGS:
        ids = tokenizer.encode(spelling.format(n=4017), add_special_tokens=False)
        first_digit = next(k for k, i in enumerate(ids) if i in set(digits))
        prefixes.add(ids[first_digit - 1])
    return digits, sorted(prefixes)


def wire_copy_circuit(
    model: Any,
    seed: int,
    digit_ids: list[int],
    prefix_ids: list[int],
    sink_id: int,
    *,
    sharpness: float = 60.0,
    match: float = 3.0,
    copy: float = 8.0,
    sink: float = 8.0,
    max_turn: float = 0.015,
    match_pairs: int = 12,
    quiet: float = 1.0,
) -> None:
    """Wire an order-id copying circuit into head 0 of layers 0 and 1 at initialisation.

    Why: passing a with-id prompt means copying the customer's order number into
    the tool call. A model this small, trained for the few hundred steps a
    5-minute build allows, does not find a copying circuit by itself (measured
    on starter-2m: a greedy copy rate of 0/60 after 300 steps, 6/60 after 900
    steps, with or without a phase of copy-only training). A generic copy circuit
    wired by hand does not survive the warm start either: it copies every token,
    the loss pays for undoing that, and the embeddings move until it is gone. So
    this circuit copies digits only, and training only tunes the model around it.

    The layout of the hidden space (a random orthonormal basis): ``C``, one
    head-width slice where the digit-chunk tokens (and the id prefixes, which all
    share one direction so ``ord_`` matches ``ORD-``) have their embeddings; ``B``,
    where layer 0 writes "the previous token's C content"; the rest for every
    other token.

    - layer 0, head 0 attends one token back: zero query/key weights, constant
      biases, so the rotary score ``sum_j a^2 cos(theta_j (d - 1))`` over the
      fastest frequencies peaks at distance 1 (``sharpness`` 60: 0.99 of the
      weight). It writes ``C^T x`` of the previous token into ``B``.
    - layer 1, head 0 matches and copies: the query reads the current token's
      ``C`` content, the key the previous-token slot ``B``, both on slow rotary
      dimensions so the match favours the nearest occurrence; the value
      ``C^T x`` is written back into ``C``. After ``ORD-`` in a tool call it
      attends to the token after the prefix in the prompt (the first digit chunk)
      and raises that chunk's logit through the tied embedding; after a chunk,
      the chunk that followed it. On any other token the query has no digit
      content and the head rests on ``<|im_start|>`` (an attention sink: every
      query scores ``sink`` nats on it), whose value is empty.

    The weights stay ordinary parameters of a standard decoder. Layers 0 and 1's
    attention is held fixed during the warm start (``supervised_warm_start``).
    """
    import torch

    config = model.config
    hidden = config.hidden_size
    head_dim = hidden // config.num_attention_heads
    half = head_dim // 2
    rope_base = config.rope_parameters["rope_theta"]
    theta = rope_base ** (-torch.arange(half, dtype=torch.float32) * 2 / head_dim)
    generator = torch.Generator().manual_seed(seed + 3)
    basis, _ = torch.linalg.qr(torch.randn(hidden, hidden, generator=generator))
    copy_slice, previous_slot = basis[:, :head_dim], basis[:, head_dim : 2 * head_dim]
    rest = basis[:, 2 * head_dim :]
    # rotary pairs used by the position head (the fastest) and by the match: slow
    # ones, at most 0.015 rad a token, so a match 30 tokens back scores ~0.9 of one
    # next door and one 80 back ~0.4. That recency is what makes the copy take
    # the customer's id rather than the example id (ORD-4017) in the system prompt.
    fast = min(8, half // 2)
    slow_pairs = [j for j in range(fast, half) if theta[j] <= max_turn][:match_pairs]
    slow = len(slow_pairs)
    amplitude = math.sqrt(sharpness * math.sqrt(head_dim) / fast)
    slow_dims = [*slow_pairs, *(half + j for j in slow_pairs)]
    squeeze = torch.randn(2 * slow, head_dim, generator=generator) / math.sqrt(head_dim)
    embeddings = model.model.embed_tokens.weight
    with torch.no_grad():
        scale = embeddings.std().item() * math.sqrt(hidden)  # a typical embedding's norm
        embeddings.copy_((embeddings @ rest) @ rest.T)
        embeddings.mul_(scale / embeddings.norm(dim=1, keepdim=True).clamp_min(1e-12))  # pad row: 0
        directions = torch.randn(len(digit_ids) + 1, head_dim, generator=generator)
        directions = directions / directions.norm(dim=1, keepdim=True)
        embeddings[digit_ids] = scale * directions[:-1] @ copy_slice.T
        embeddings[prefix_ids] = scale * directions[-1:] @ copy_slice.T
        sink_direction = rest[:, 0]
        embeddings[sink_id] = scale * sink_direction
        position = model.model.layers[0].self_attn
        query, key = torch.zeros(head_dim), torch.zeros(head_dim)
        query[:fast] = amplitude
        key[:fast] = amplitude * torch.cos(theta[:fast])
        key[half : half + fast] = amplitude * torch.sin(theta[:fast])
        position.q_proj.weight[:head_dim] = 0.0
        position.q_proj.bias[:head_dim] = query
        position.k_proj.weight[:head_dim] = 0.0
        position.k_proj.bias[:head_dim] = key
        position.v_proj.weight[:head_dim] = copy_slice.T
        # heads 0 and 1 share key/value head 0 (grouped-query attention): head 1's
        # output starts at zero in both layers so it cannot blur the circuit
        position.o_proj.weight[:, : 2 * head_dim] = 0.0
        position.o_proj.weight[:, :head_dim] = previous_slot * (scale / math.sqrt(hidden))
        matcher = model.model.layers[1].self_attn
        reads_token, reads_previous = torch.zeros(head_dim, hidden), torch.zeros(head_dim, hidden)
        reads_token[slow_dims] = match * squeeze @ copy_slice.T
        reads_previous[slow_dims] = match * squeeze @ previous_slot.T
        # the sink: a constant query part that only the sink token's key answers
        sink_query = torch.zeros(head_dim)
        sink_query[slow_dims] = 1.0 / math.sqrt(2 * slow)
        # (the normed sink embedding is sqrt(hidden) * sink_direction)
        sink_key = sink * math.sqrt(head_dim) / math.sqrt(hidden)
        reads_previous += sink_key * torch.outer(sink_query, sink_direction)
        matcher.q_proj.weight[:head_dim] = reads_token
        matcher.q_proj.bias[:head_dim] = sink_query
        matcher.k_proj.weight[:head_dim] = reads_previous
        matcher.v_proj.weight[:head_dim] = copy_slice.T
        matcher.o_proj.weight[:, : 2 * head_dim] = 0.0
        matcher.o_proj.weight[:, :head_dim] = copy * copy_slice
        # ``quiet`` scales everything else in layers 0 and 1: their random output
        # blurs the previous-token slot (on the 10M shape at initialisation, 0.53 of
        # ids copied at full size, 0.78 at 0.3, 1.0 at 0.1; the 2M shape copies
        # 0.85 at full size)
        for layer in model.model.layers[:2]:
            layer.self_attn.o_proj.weight[:, 2 * head_dim :] *= quiet
            layer.mlp.down_proj.weight.mul_(quiet)
        for attention in (position, matcher):
            for projection in (attention.q_proj, attention.k_proj, attention.v_proj):
                projection.bias[head_dim:] = 0.0
            attention.o_proj.bias.zero_()
        for projection in (matcher.k_proj, matcher.v_proj):
            projection.bias[:head_dim] = 0.0
        position.v_proj.bias[:head_dim] = 0.0


def id_copy_rate(model: Any, tokenizer: Any, prompts: list[str]) -> float:
    """Share of with-id ``prompts`` whose order number the model copies into a lookup call.

    Teacher-forced and greedy: the reply is forced up to ``"order_id": "ORD-`` and every
    token of the customer's number must be the model's top choice. It measures the copy
    alone, apart from whether the policy chooses to call the tool.
    """
    import torch

    call = '<tool_call>\n{"name": "lookup_order", "arguments": {"order_id": "'
    copied = 0
    for prompt in prompts:
        messages = [{"role": "system", "content": SYSTEM}, {"role": "user", "content": prompt}]
        chat = tokenizer.apply_chat_template(messages, tokenize=False, add_generation_prompt=True)
        ids = tokenizer(chat + call + normalize_order_id(prompt), return_tensors="pt").input_ids
        start = len(tokenizer(chat + call + "ORD-").input_ids)
        with torch.no_grad():
            predicted = model(ids).logits[0, start - 1 : -1].argmax(-1)
        copied += bool((predicted == ids[0, start:]).all())
    return copied / len(prompts)


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


_SPELLED_ID = re.compile(r"(\bORD[-_ ]?)(\d{3,6})\b", re.IGNORECASE)


def with_fresh_id(row: dict[str, Any], rng: random.Random) -> dict[str, Any]:
    """``row`` with its order number replaced by a new random one, in prompt and replies.

    The customer's spelling (``ord_991``, ``#ORD-991`` ...) is kept. 4,000
    situations hold only a few thousand ids; drawn afresh, no id repeats, so the
    only way to lower the loss on the id is to copy it from the prompt rather
    than to remember which id goes with which sentence.
    """
    match = _SPELLED_ID.search(row["prompt"])
    if match is None:
        return row
    old = match.group(2)
    new = str(rng.randrange(10 ** (len(old) - 1), 10 ** len(old)))
    fresh = dict(row)
    fresh["prompt"] = row["prompt"][: match.start(2)] + new + row["prompt"][match.end(2) :]
    for name in ("reply", "right_reply"):
        fresh[name] = row[name].replace(f"ORD-{old}", f"ORD-{new}")
    return fresh


def _learning_rate(step: int, recipe: StarterRecipe) -> float:
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


def supervised_warm_start(
    model: Any,
    tokenizer: Any,
    rows: list[dict[str, Any]],
    recipe: StarterRecipe,
    on_step: Callable[[int, float], None] | None = None,
) -> list[float]:
    """Train ``model`` in place through both phases; returns the loss per step.

    Phase 1 (``skill_steps``): dialogues answered with the right move. Phase 2
    (``mix_steps``): dialogues answered from the behaviour mix. One AdamW
    optimizer and one learning-rate schedule span both. Dialogues are drawn by a
    seeded shuffle over epochs (with ``fresh_ids``, each draw gets a new order
    number); the loss covers only reply tokens. With ``copy_circuit`` and
    ``freeze_circuit``, layers 0 and 1's attention is not trained here.
    """
    import torch

    right = _encode_rows(tokenizer, rows, "right_reply") if not recipe.fresh_ids else []
    mixed = _encode_rows(tokenizer, rows, "reply") if not recipe.fresh_ids else []
    order_rng, id_rng = random.Random(recipe.seed), random.Random(recipe.seed + 2)
    hooks = []
    if recipe.copy_circuit and recipe.freeze_circuit:
        # trained, the wired heads drift within the first steps (measured: layer 0's
        # weight one token back fell from 0.99 to 0.53 in 300 steps). Layers 0 and
        # 1's attention get a zero gradient; with no weight decay AdamW then leaves
        # them exactly as they are. (Holding only the wired heads and training the
        # others beside them was tried: the copying was lost, 0/60 ids.)
        for layer in model.model.layers[:2]:
            for parameter in layer.self_attn.parameters():
                hooks.append(parameter.register_hook(torch.zeros_like))
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
            fresh = [with_fresh_id(rows[i], id_rng) for i in picked]
            batch = _encode_rows(tokenizer, fresh, "right_reply" if skill else "reply")
        else:
            batch = [(right if skill else mixed)[i] for i in picked]
        input_ids, labels, attention = _collate(batch, tokenizer.pad_token_id)
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
    for hook in hooks:
        hook.remove()
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

    # A fixed thread count: the weights then do not depend on the machine's core
    # count (a different split of a sum rounds differently).
    threads = torch.get_num_threads()
    torch.set_num_threads(BUILD_THREADS)
    try:
        return _build_on_fixed_threads(recipe, folder, force, show_progress)
    finally:
        torch.set_num_threads(threads)


def _build_on_fixed_threads(
    recipe: StarterRecipe, folder: Path, force: bool, show_progress: bool
) -> Path:
    import torch

    started = time.monotonic()
    rows = starter_dialogues(recipe)
    if recipe.grow_from:
        model, tokenizer = _grown_model(recipe, show_progress)
    else:
        texts = [render_chatml(SYSTEM, row["prompt"], row["reply"]) for row in rows]
        tokenizer = train_tokenizer(texts, recipe.vocab_size)
        model = new_model(
            tokenizer,
            recipe.architecture,
            recipe.seed,
            recipe.copy_circuit,
            match=recipe.circuit_match,
            quiet=recipe.circuit_quiet,
        )
    tokenizer_seconds = time.monotonic() - started
    with progress_bar(f"building {recipe.name}", recipe.total_steps, enabled=show_progress) as bar:
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
        "final_loss": sum(losses[-10:]) / len(losses[-10:]) if losses else None,
        "seconds": round(time.monotonic() - started, 1),
        "tokenizer_seconds": round(tokenizer_seconds, 2),
        "torch_threads": torch.get_num_threads(),
    }
    _save_atomically(folder, model, tokenizer, recipe, build, force)
    return folder


def _grown_model(recipe: StarterRecipe, show_progress: bool) -> tuple[Any, Any]:
    """The base starter's build (built first if needed), grown to ``recipe.architecture``."""
    import torch
    from transformers import AutoModelForCausalLM, AutoTokenizer

    from posttrain.policy.grow import grow_llama

    base_folder = build_starter(recipe.grow_from, show_progress=show_progress)
    base = AutoModelForCausalLM.from_pretrained(base_folder, dtype=torch.float32)
    tokenizer = AutoTokenizer.from_pretrained(base_folder)
    shape = recipe.architecture
    model = grow_llama(
        base,
        hidden_size=shape.hidden_size,
        num_layers=shape.num_layers,
        intermediate_size=shape.intermediate_size,
        seed=recipe.seed,
        frozen_attention_layers=2 if recipe.copy_circuit and recipe.freeze_circuit else 0,
    )
    heads = (model.config.num_attention_heads, model.config.num_key_value_heads)
    if heads != (shape.num_heads, shape.num_kv_heads):
        raise PosttrainError(
            f"starter recipe {recipe.name!r}: growing {recipe.grow_from} keeps its head size, "
            f"so {shape.hidden_size} wide means {heads[0]} heads / {heads[1]} KV heads, "
            f"not {shape.num_heads} / {shape.num_kv_heads}"
        )
    return model, tokenizer


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
