"""A GRPO step's shared prompt prefix, run once per forward pass instead of once per row.

TRL's GRPOTrainer scores a step's completions three times: the reference model's logprobs
(for the KL term), then the policy's in the loss forward, then that forward's backward.
Each pass feeds every row its whole prompt again. On the refund rule (and most real
environments) the prompts of a step share a long head, the system prompt and the chat
template around it: about 300 of a SmolLM2 row's ~330 tokens. Those tokens give the same
keys and values in every row, so the rows repeat work that one row could do.

``share_prompt_prefix(trainer)`` swaps the trainer's per-token logprob function for one
that, for each pass of rows (TRL's micro-batch):

1. finds the longest run of prompt tokens every row starts with (``common_prefix``),
2. runs that prefix once, as one row, keeping its keys and values in a cache,
3. repeats the cache to every row and runs each row's remainder (the rest of its prompt,
   then its completion) on top of it, through TRL's own fused LM head.

The remainders are a plain slice of TRL's left-padded batch (see ``PrefixSplit``), their
positions continue the prefix's, and the completion columns come out where TRL's function
puts them. The gradient reaches the prefix through the repeated cache (autograd sums the
rows' contributions), so the LoRA weights in the prefix's layers get the same gradient as
before. Results match TRL's function to rounding (tests/test_shared_prefix.py, on the
starter in float32 and on SmolLM2 under bf16 autocast).

Where it does not apply the pass goes to TRL's function unchanged: images or token types
in the batch, a mixture-of-experts auxiliary loss, prompts that are not left-padded, or a
shared prefix shorter than ``MIN_SHARED_PREFIX`` tokens.
"""

from __future__ import annotations

from collections.abc import Callable
from dataclasses import dataclass
from typing import Any

from posttrain.errors import PosttrainError
from posttrain.policy.prefix_cache import repeated_prefix_cache

SHARED_PREFIX_CHOICES = ("auto", "on", "off")

# below this many shared tokens the extra pass (and its cache copy) saves too little
MIN_SHARED_PREFIX = 16


@dataclass(frozen=True)
class SharedPrefixChoice:
    """Whether the trainer runs the shared prompt prefix once per pass, and why."""

    on: bool
    reason: str

    def words(self) -> str:
        return ("shared prompt prefix run once per pass" if self.on
                else "every row's whole prompt run") + f" ({self.reason})"


def choose_shared_prefix(asked: str, *, trl_recorded: bool,
                         world_size: int = 1) -> SharedPrefixChoice:
    """The choice for ``--shared-prefix asked``: ``auto`` is on, except for a test starter
    (``trl_recorded``: under 5M parameters, ``model_agent.keeps_trl_numbers``), whose
    recorded numbers come from TRL's own forward (the results agree to rounding, not bit
    for bit). Off under torchrun
    either way: DistributedDataParallel expects one forward of the wrapped model per
    backward, and the shared prefix takes two."""
    if asked not in SHARED_PREFIX_CHOICES:
        raise PosttrainError(f"--shared-prefix {asked!r}: expected one of "
                             f"{', '.join(SHARED_PREFIX_CHOICES)}")
    if world_size > 1 and asked != "off":
        return SharedPrefixChoice(False, f"{asked}, but off under torchrun: "
                                  "DistributedDataParallel expects one forward per backward")
    if asked == "on":
        return SharedPrefixChoice(True, "asked for (--shared-prefix on)")
    if asked == "off":
        return SharedPrefixChoice(False, "asked for (--shared-prefix off)")
    if trl_recorded:
        return SharedPrefixChoice(False, "auto: a model under 5M parameters, like the test "
                                  "starter starter-2m, whose recorded numbers come from "
                                  "TRL's forward")
    return SharedPrefixChoice(True, "auto: a model of 5M parameters or more")


@dataclass(frozen=True)
class PrefixSplit:
    """Where a pass's rows split into the shared prefix and each row's remainder.

    TRL's rows are ``[padding][prompt][completion]`` with every prompt ending at column
    ``prompt_width``. The prefix is the first ``length`` tokens of every prompt. The
    remainders are the last ``rest_width`` prompt columns plus the completion columns:
    the longest prompt's remainder fills them exactly, and in a shorter prompt's row the
    columns before its remainder hold its own copy of the prefix or padding, which
    ``remainder_mask`` masks out."""

    length: int
    rest_width: int
    prompt_width: int


def common_prefix(input_ids: Any, attention_mask: Any, prompt_width: int) -> PrefixSplit | None:
    """The shared prefix of a pass's prompts (columns ``[0, prompt_width)`` of TRL's
    left-padded batch), or None when it is shorter than ``MIN_SHARED_PREFIX`` or the
    prompts are not left-padded. Every row keeps at least one prompt token outside the
    prefix, since that token's output predicts the completion's first token."""
    import torch

    prompt_mask = attention_mask[:, :prompt_width].bool()
    lengths = prompt_mask.sum(dim=1)
    starts = prompt_width - lengths
    columns = torch.arange(prompt_width, device=input_ids.device)
    if not torch.equal(prompt_mask, columns[None, :] >= starts[:, None]):
        return None  # padding inside or after a prompt: not TRL's layout
    cap = int(lengths.min()) - 1
    if cap < MIN_SHARED_PREFIX:
        return None
    offsets = torch.arange(cap, device=input_ids.device)
    aligned = input_ids.gather(1, starts[:, None] + offsets[None, :])
    same = (aligned == aligned[:1]).all(dim=0)
    length = cap if bool(same.all()) else int((~same).nonzero()[0, 0])
    if length < MIN_SHARED_PREFIX:
        return None
    return PrefixSplit(length=length, rest_width=int(lengths.max()) - length,
                       prompt_width=prompt_width)


def remainder_mask(attention_mask: Any, split: PrefixSplit) -> Any:
    """The attention mask of the remainders' columns: TRL's, with each row's columns before
    its own remainder (its copy of the prefix, or padding) masked out."""
    import torch

    first = split.prompt_width - split.rest_width
    mask = attention_mask[:, first:].clone()
    rest_lengths = attention_mask[:, :split.prompt_width].sum(dim=1) - split.length
    columns = torch.arange(mask.size(1), device=mask.device)
    mask[columns[None, :] < (split.rest_width - rest_lengths)[:, None]] = 0
    return mask


def prefix_shared_logps(model: Any, input_ids: Any, attention_mask: Any, logits_to_keep: int,
                        split: PrefixSplit, compute_entropy: bool) -> tuple[Any, Any]:
    """Per-token logprobs (and entropies) of the completion columns, as TRL's
    ``_get_per_token_logps_and_entropies`` returns them for one pass, with the shared
    prefix run once. ``model`` carries TRL's fused LM head (``fused_lm_head=True``)."""
    import torch

    rows = input_ids.size(0)
    start = split.prompt_width - int(attention_mask[0, :split.prompt_width].sum())
    cache = repeated_prefix_cache(model, input_ids[:1, start:start + split.length], rows)

    first = split.prompt_width - split.rest_width
    rest_ids = input_ids[:, first:]
    rest_mask = remainder_mask(attention_mask, split)
    # positions continue the prefix's along each row's real tokens (RoPE sees the same
    # distances between tokens as in TRL's padded rows); masked columns get any position
    positions = (split.length + rest_mask.cumsum(dim=1) - 1).clamp(min=split.length)
    full_mask = torch.cat([rest_mask.new_ones(rows, split.length), rest_mask], dim=1)
    labels = rest_ids.masked_fill(rest_mask == 0, -100)
    labels[:, :-logits_to_keep] = -100
    outputs = model(input_ids=rest_ids, attention_mask=full_mask, position_ids=positions,
                    cache=cache, labels=labels, fused_lm_head=True)
    logps = outputs.log_probs[:, -logits_to_keep:]
    entropies = outputs.entropy[:, -logits_to_keep:] if compute_entropy else None
    return logps, entropies


def share_prompt_prefix(trainer: Any) -> None:
    """Make ``trainer`` (a ``trl.GRPOTrainer``) run each pass's shared prompt prefix once
    (module docstring). Passes the swap does not apply to go to TRL's function."""
    trl_function: Callable[..., Any] = trainer._get_per_token_logps_and_entropies

    def per_token_logps_and_entropies(model: Any, input_ids: Any, attention_mask: Any,
                                      logits_to_keep: int, batch_size: int | None = None,
                                      compute_entropy: bool = False,
                                      compute_aux_loss: bool = False,
                                      **extra: Any) -> tuple[Any, Any, Any]:
        if compute_aux_loss or any(value is not None for value in extra.values()):
            return trl_function(model, input_ids, attention_mask, logits_to_keep,
                                batch_size=batch_size, compute_entropy=compute_entropy,
                                compute_aux_loss=compute_aux_loss, **extra)
        import torch

        rows = input_ids.size(0)
        size = batch_size or rows
        prompt_width = input_ids.size(1) - logits_to_keep
        all_logps, all_entropies = [], []
        for begin in range(0, rows, size):
            ids, mask = input_ids[begin:begin + size], attention_mask[begin:begin + size]
            split = common_prefix(ids, mask, prompt_width)
            if split is None:
                logps, entropies, _ = trl_function(model, ids, mask, logits_to_keep,
                                                   compute_entropy=compute_entropy)
            else:
                with trainer.accelerator.autocast():
                    logps, entropies = prefix_shared_logps(model, ids, mask, logits_to_keep,
                                                           split, compute_entropy)
            all_logps.append(logps)
            all_entropies.append(entropies)
        return (torch.cat(all_logps, dim=0),
                torch.cat(all_entropies, dim=0) if compute_entropy else None,
                None)

    trainer._get_per_token_logps_and_entropies = per_token_logps_and_entropies
