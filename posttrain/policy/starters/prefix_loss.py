"""A warm-start step's loss with the batch's shared head run once instead of once a row.

Every dialogue of a starter's warm start opens with the same tokens: the chat template's
system turn (26 of the 9.1M starter's ~94 tokens a row) and the start of the user turn.
Those tokens give the same keys and values in every row, so a batch of 16 computes them
16 times. ``shared_head_loss`` runs them once, as one row, repeats their cache to every
row and runs each row's remainder on top of it. The gradient reaches the head through the
repeated cache (autograd sums the rows' contributions), and the loss covers the same
reply tokens, so the step is the same step to rounding: not bit for bit, which is why a
recipe opts in (``StarterRecipe.shared_head``) and its cache key says so.

The batches are ``scratch._collate``'s: right-padded, every row starting at column 0,
labels -100 outside the reply. The head stops one token before the shortest prompt ends,
so the token whose output predicts a reply's first token stays in every row's remainder
and no labelled position is lost to the head.
"""

from __future__ import annotations

from typing import Any

from posttrain.policy.prefix_cache import repeated_prefix_cache

# below this many shared tokens the extra pass and the cache copy save too little
MIN_SHARED_HEAD = 8


def shared_head_length(input_ids: Any, labels: Any) -> int:
    """How many leading tokens every row of the batch shares, stopping one token before
    the first labelled position of any row (0 when under ``MIN_SHARED_HEAD``)."""
    labelled = (labels != -100).int()
    # the first labelled column of each row; a row with no label keeps its full width
    firsts = labelled.argmax(dim=1).masked_fill(labelled.sum(dim=1) == 0, labels.size(1))
    cap = int(firsts.min()) - 1
    if cap < MIN_SHARED_HEAD:
        return 0
    same = (input_ids[:, :cap] == input_ids[:1, :cap]).all(dim=0)
    length = cap if bool(same.all()) else int((~same).int().argmax())
    return length if length >= MIN_SHARED_HEAD else 0


def shared_head_outputs(model: Any, input_ids: Any, attention: Any, length: int,
                        labels: Any = None) -> Any:
    """The model's outputs on columns ``[length:]`` of every row, with the first
    ``length`` columns (the same in every row) run once and their cache repeated to every
    row; with ``labels`` (the whole batch's), the loss over the labelled columns."""
    rows = input_ids.size(0)
    cache = repeated_prefix_cache(model, input_ids[:1, :length], rows)
    rest_ids = input_ids[:, length:]
    # right padding: every row's real tokens continue the head's positions without a gap
    positions = length + rest_ids.new_tensor(range(rest_ids.size(1)))[None, :].expand(rows, -1)
    full_attention = attention.new_ones(rows, input_ids.size(1))
    full_attention[:, length:] = attention[:, length:]
    return model(input_ids=rest_ids, attention_mask=full_attention, position_ids=positions,
                 cache=cache, labels=None if labels is None else labels[:, length:])


def shared_head_loss(model: Any, input_ids: Any, labels: Any, attention: Any) -> Any:
    """The mean cross-entropy over the labelled tokens of ``(input_ids, labels,
    attention)``, as ``model(..., labels=labels).loss`` gives it, with the rows' shared
    head run once (module docstring). Falls back to the plain forward when the head is
    shorter than ``MIN_SHARED_HEAD``."""
    length = shared_head_length(input_ids, labels)
    if not length:
        return model(input_ids=input_ids, attention_mask=attention, labels=labels).loss
    return shared_head_outputs(model, input_ids, attention, length, labels).loss
