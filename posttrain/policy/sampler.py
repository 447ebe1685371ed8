"""Batched sampling with per-request seeds, stop handling and per-token logprobs.

One loop of our own over a KV cache, rather than ``model.generate``, because
we need three things ``generate`` does not give together:

- **Per-request seeds.** Each request owns a ``torch.Generator`` seeded with its
  seed and draws exactly one uniform number per generated token, so its output
  does not depend on which other requests share the batch, their order, or the
  batch size. (Exactly: up to float rounding. Padding changes matrix shapes, so
  logits can differ in the last bits; a different token needs a draw within
  ~1e-6 of a boundary of the cumulative distribution, which we have not seen.)
- **Stops.** A completion ends at an end-of-turn token (the tokenizer's eos,
  ``<|im_end|>``, ``<|endoftext|>``, or one of ``stop_token_ids``: stop reason
  ``"eos"``), right after a stop
  string (``</tool_call>`` by default: ``"tool_call"``; any other stop string:
  ``"stop"``), or at ``max_new_tokens`` (``"length"``). Stop strings are matched
  on decoded text, so they work when a tokenizer splits them into pieces.
- **Logprobs.** ``Completion.logprobs[i]`` is the log-softmax of the model's raw
  logits (temperature 1, no top-p/top-k) at the sampled token ``token_ids[i]``:
  the policy's own log-likelihood, what GRPO's ratio and KL terms compare
  against, and what a forward pass over prompt + completion gives back.

Prompts are left-padded, sorted by length into micro-batches of ``batch_size``
(less padding; results do not depend on the grouping), and rows that finish are
dropped from the cache once a quarter of the batch has finished. The tokens all
prompts of a micro-batch start with (the system prompt) are run once and their
cache shared, the padding going between that prefix and each row's own tokens.

``token_ids`` include the final eos token when the stop reason is ``"eos"``;
``text`` never does (special tokens are skipped) and ends right after the stop
string when one matched.
"""

from __future__ import annotations

from dataclasses import asdict, dataclass
from typing import Any

Messages = list[dict[str, str]]

TOOL_CALL_END = "</tool_call>"
END_OF_TURN_TOKENS = ("<|im_end|>", "<|endoftext|>", "<|eot_id|>", "<end_of_turn>")
COMPACT_WHEN_FINISHED = 0.25  # drop finished rows from the cache past this share
MIN_SHARED_PREFIX = 8  # shorter common prefixes are not worth a separate forward pass
FIRST_SAMPLING_HEAD = 64  # top-p's first guess at how many tokens hold the nucleus
HEAD_MARGIN = 1e-4  # a head must exceed top_p by this much to be sure it holds the nucleus


@dataclass(frozen=True)
class SamplingParams:
    """How to sample. ``temperature`` 0 is greedy; ``top_k`` 0 and ``top_p`` 1.0 are off."""

    temperature: float = 0.8
    top_p: float = 0.95
    top_k: int = 0
    max_new_tokens: int = 64
    stop_strings: tuple[str, ...] = (TOOL_CALL_END,)
    # token ids that end a completion like an end-of-turn token: kept as its last token,
    # stop reason "eos" (the tinker SDK's renderers send their end-of-message ids here)
    stop_token_ids: tuple[int, ...] = ()

    def __post_init__(self) -> None:
        if self.temperature < 0:
            raise ValueError(f"temperature must be >= 0, got {self.temperature}")
        if not 0.0 < self.top_p <= 1.0:
            raise ValueError(f"top_p must be in (0, 1], got {self.top_p}")
        if self.top_k < 0:
            raise ValueError(f"top_k must be >= 0 (0 = off), got {self.top_k}")
        if self.max_new_tokens < 1:
            raise ValueError(f"max_new_tokens must be at least 1, got {self.max_new_tokens}")

    def to_dict(self) -> dict[str, Any]:
        """JSON-ready form, for graded rows and run configs."""
        return {**asdict(self), "stop_strings": list(self.stop_strings),
                "stop_token_ids": list(self.stop_token_ids)}


@dataclass
class Completion:
    """One sampled reply."""

    text: str
    token_ids: list[int]
    logprobs: list[float]  # log p(token) at temperature 1, one per token id
    stop_reason: str  # "eos", "tool_call", "stop" or "length"
    prompt_token_ids: list[int]


class Sampler:
    """Samples replies from a ``Policy`` (see ``posttrain.policy.models``)."""

    def __init__(self, policy: Any, batch_size: int = 64,
                 end_ids: frozenset[int] | None = None):
        """``end_ids``: the tokens that end a completion (stop reason "eos"); by default
        every end-of-turn token the tokenizer and model know (``end_of_turn_ids``). A
        caller whose trainer decides truncation by its own list passes that list."""
        if batch_size < 1:
            raise ValueError(f"batch_size must be at least 1, got {batch_size}")
        self.policy = policy
        self.model = policy.model
        self.tokenizer = policy.tokenizer
        self.batch_size = batch_size
        self.eos_ids = end_ids if end_ids else end_of_turn_ids(self.tokenizer, self.model)
        self.pad_id = self.tokenizer.pad_token_id
        if self.pad_id is None:
            self.pad_id = min(self.eos_ids)
        self._stop_candidates: dict[str, frozenset[int]] = {}

    # ------------------------------------------------------------ public

    def encode(self, conversations: list[Messages]) -> list[list[int]]:
        """Prompt token ids: each conversation through the chat template, ready for the reply."""
        return [
            list(
                self.tokenizer.apply_chat_template(
                    messages, add_generation_prompt=True, tokenize=True, return_dict=False
                )
            )
            for messages in conversations
        ]

    def sample(
        self,
        conversations: list[Messages],
        seeds: list[int],
        params: SamplingParams | None = None,
    ) -> list[Completion]:
        """One completion per conversation, in order; ``seeds[i]`` drives request ``i``."""
        return self.sample_tokens(self.encode(conversations), seeds, params)

    def sample_tokens(
        self,
        prompts: list[list[int]],
        seeds: list[int],
        params: SamplingParams | None = None,
    ) -> list[Completion]:
        """Like ``sample`` but from prompt token ids (for callers that tokenised already)."""
        params = params or SamplingParams()
        if len(prompts) != len(seeds):
            raise ValueError(f"{len(prompts)} prompts but {len(seeds)} seeds: need one each")
        if any(not prompt for prompt in prompts):
            raise ValueError("every prompt needs at least one token")
        order = sorted(range(len(prompts)), key=lambda i: (len(prompts[i]), i))
        results: list[Completion | None] = [None] * len(prompts)
        for start in range(0, len(order), self.batch_size):
            chunk = order[start : start + self.batch_size]
            batch = self._generate([prompts[i] for i in chunk], [seeds[i] for i in chunk], params)
            for index, completion in zip(chunk, batch, strict=True):
                results[index] = completion
        return results  # type: ignore[return-value]

    # ------------------------------------------------------------ the loop

    def _generate(
        self, prompts: list[list[int]], seeds: list[int], params: SamplingParams
    ) -> list[Completion]:
        import torch
        from transformers import DynamicCache

        device = next(self.model.parameters()).device
        cache = DynamicCache(config=self.model.config)
        shared = shared_prefix_length(prompts)
        if shared < MIN_SHARED_PREFIX:
            shared = 0
        suffixes = [prompt[shared:] for prompt in prompts]
        width = max(len(p) for p in suffixes)
        input_ids = torch.full((len(prompts), width), self.pad_id, dtype=torch.long)
        mask = torch.zeros((len(prompts), shared + width), dtype=torch.long)
        mask[:, :shared] = 1
        for row, suffix in enumerate(suffixes):
            input_ids[row, width - len(suffix) :] = torch.tensor(suffix)
            mask[row, shared + width - len(suffix) :] = 1
        positions = ((mask.cumsum(-1) - 1).clamp(min=0))[:, shared:]
        input_ids, mask, positions = input_ids.to(device), mask.to(device), positions.to(device)
        if shared:
            # every prompt starts with the same tokens (the system prompt, the tool list):
            # run them once and copy their cache to each row, instead of once per row.
            # The rows' own tokens follow after left padding *between* prefix and suffix;
            # the mask hides the padding and the positions skip it, so each row computes
            # what it would alone.
            with torch.inference_mode():
                prefix = torch.tensor([prompts[0][:shared]], device=device)
                self.model(input_ids=prefix, cache=cache, use_cache=True, logits_to_keep=1)
            cache.batch_repeat_interleave(len(prompts))
        generators = [torch.Generator().manual_seed(int(seed)) for seed in seeds]
        tokens: list[list[int]] = [[] for _ in prompts]
        logprobs: list[list[float]] = [[] for _ in prompts]
        reasons: list[str | None] = [None] * len(prompts)
        rows = list(range(len(prompts)))  # cache row -> request index
        candidates = self._candidates(params.stop_strings)
        with torch.inference_mode():
            out = self.model(
                input_ids=input_ids,
                attention_mask=mask,
                position_ids=positions,
                cache=cache,
                use_cache=True,
                logits_to_keep=1,
            )
            next_position = positions[:, -1] + 1
            for _ in range(params.max_new_tokens):
                live = [n for n, request in enumerate(rows) if reasons[request] is None]
                picked, picked_logprobs = pick_tokens(
                    out.logits[live, -1, :].float(), [generators[rows[n]] for n in live], params
                )
                feed = torch.full((len(rows),), self.pad_id, dtype=torch.long)
                for n, token, logprob in zip(
                    live, picked.tolist(), picked_logprobs.tolist(), strict=True
                ):
                    request = rows[n]
                    tokens[request].append(token)
                    logprobs[request].append(logprob)
                    reasons[request] = self._stop_reason(tokens[request], params, candidates)
                    feed[n] = token
                unfinished = [n for n in range(len(rows)) if reasons[rows[n]] is None]
                if not unfinished:
                    break
                if len(unfinished) <= (1 - COMPACT_WHEN_FINISHED) * len(rows):
                    keep = torch.tensor(unfinished, device=device)
                    cache.batch_select_indices(keep)
                    mask, next_position = mask[keep], next_position[keep]
                    feed = feed[unfinished]
                    rows = [rows[n] for n in unfinished]
                mask = torch.cat([mask, mask.new_ones((len(rows), 1))], dim=1)
                out = self.model(
                    input_ids=feed.to(device)[:, None],
                    attention_mask=mask,
                    position_ids=next_position[:, None],
                    cache=cache,
                    use_cache=True,
                )
                next_position = next_position + 1
        return [
            Completion(
                text=self._text(tokens[i], reasons[i], params),
                token_ids=tokens[i],
                logprobs=logprobs[i],
                stop_reason=reasons[i] or "length",
                prompt_token_ids=list(prompts[i]),
            )
            for i in range(len(prompts))
        ]

    # ------------------------------------------------------------ stops and text

    def _candidates(self, stop_strings: tuple[str, ...]) -> frozenset[int]:
        """Token ids whose text holds the last character of a stop string (worth a check)."""
        key = "".join(sorted({s[-1] for s in stop_strings if s}))
        if key not in self._stop_candidates:
            size = len(self.tokenizer)
            pieces = self.tokenizer.batch_decode([[i] for i in range(size)])
            self._stop_candidates[key] = frozenset(
                i for i, piece in enumerate(pieces) if any(ch in piece for ch in key)
            )
        return self._stop_candidates[key]

    def _stop_reason(
        self, tokens: list[int], params: SamplingParams, candidates: frozenset[int]
    ) -> str | None:
        if tokens[-1] in self.eos_ids or tokens[-1] in params.stop_token_ids:
            return "eos"
        if tokens[-1] in candidates:
            tail = self.tokenizer.decode(tokens[-16:], skip_special_tokens=True)
            for stop in params.stop_strings:
                if stop and stop in tail:
                    return "tool_call" if stop == TOOL_CALL_END else "stop"
        if len(tokens) >= params.max_new_tokens:
            return "length"
        return None

    def _text(self, tokens: list[int], reason: str | None, params: SamplingParams) -> str:
        text = self.tokenizer.decode(tokens, skip_special_tokens=True)
        if reason in ("tool_call", "stop"):
            ends = [text.find(s) + len(s) for s in params.stop_strings if s and s in text]
            if ends:
                text = text[: min(ends)]
        return text


def shared_prefix_length(prompts: list[list[int]]) -> int:
    """Tokens every prompt starts with, leaving each at least one token of its own."""
    limit = min(len(prompt) for prompt in prompts) - 1
    first = prompts[0]
    length = 0
    while length < limit and all(prompt[length] == first[length] for prompt in prompts):
        length += 1
    return length


def end_of_turn_ids(tokenizer: Any, model: Any) -> frozenset[int]:
    """Token ids that end a reply: the tokenizer's and generation config's eos, and
    the usual end-of-turn tokens when the vocabulary has them as single tokens."""
    ids: set[int] = set()
    if tokenizer.eos_token_id is not None:
        ids.add(int(tokenizer.eos_token_id))
    configured = getattr(getattr(model, "generation_config", None), "eos_token_id", None)
    if isinstance(configured, int):
        ids.add(configured)
    elif configured:
        ids.update(int(i) for i in configured)
    vocab = tokenizer.get_vocab()
    ids.update(vocab[name] for name in END_OF_TURN_TOKENS if name in vocab)
    if not ids:
        raise ValueError("the tokenizer has no end-of-turn token; cannot tell where a reply ends")
    return frozenset(ids)


def pick_tokens(logits: Any, generators: list[Any], params: SamplingParams) -> tuple[Any, Any]:
    """Sample one token per row of ``logits`` (rows, vocab); returns (tokens, logprobs).

    Each row uses its own generator and draws exactly one uniform number (also
    when greedy, so a request's stream never depends on the settings of others).
    The draw picks a token from the kept tokens in descending order of probability.
    The returned logprob is log-softmax of the raw logits at the chosen token.
    """
    import torch

    full_logprobs = torch.log_softmax(logits, dim=-1)
    uniforms = torch.stack([torch.rand((), generator=g) for g in generators]).to(logits.device)
    if params.temperature == 0:
        chosen = logits.argmax(dim=-1)
    else:
        # the kept tokens' candidates in descending order, and their probabilities
        scaled = logits / params.temperature
        if params.top_k > 0:
            head_logits, head_ids = torch.topk(scaled, min(params.top_k, scaled.shape[-1]))
            probs = torch.softmax(head_logits, dim=-1)
        elif params.top_p < 1.0:
            # the nucleus is measured in the whole vocabulary's probabilities
            vocab_probs = torch.softmax(scaled, dim=-1)
            head_logits, head_ids = nucleus_head(scaled, vocab_probs, params.top_p)
            probs = vocab_probs.gather(-1, head_ids)
        else:
            head_logits, head_ids = torch.sort(scaled, dim=-1, descending=True)
            probs = torch.softmax(head_logits, dim=-1)
        if params.top_p < 1.0:
            # keep the smallest head whose mass reaches top_p (always at least one token)
            outside = probs.cumsum(dim=-1) - probs >= params.top_p
            head_logits = head_logits.masked_fill(outside, float("-inf"))
            probs = torch.softmax(head_logits, dim=-1)
        cumulative = probs.cumsum(dim=-1)
        target = (uniforms * cumulative[:, -1]).unsqueeze(-1)
        position = torch.searchsorted(cumulative, target).clamp(max=head_logits.shape[-1] - 1)
        chosen = head_ids.gather(-1, position).squeeze(-1)
    return chosen, full_logprobs.gather(-1, chosen.unsqueeze(-1)).squeeze(-1)


def nucleus_head(scaled: Any, probs: Any, top_p: float) -> tuple[Any, Any]:
    """Each row's highest-scoring tokens in descending order (values, ids), enough of
    them to hold the row's top-p nucleus; ``probs`` is the softmax of ``scaled``.

    Why not sort the whole row: on a laptop CPU a descending sort of 16 rows of a
    49k vocabulary took as long as the model's decode step for them, while a 0.95
    nucleus is usually tens of tokens. ``topk`` of a growing head finds it, with a
    margin so that no token past the head is one rounding away from the nucleus.
    """
    import torch

    vocab = scaled.shape[-1]
    size = min(FIRST_SAMPLING_HEAD, vocab)
    while True:
        values, ids = torch.topk(scaled, size, dim=-1)
        mass = probs.gather(-1, ids).sum(-1)
        if size == vocab or bool((mass >= top_p + HEAD_MARGIN).all()):
            return values, ids
        size = min(size * 4, vocab)
