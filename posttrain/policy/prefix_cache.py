"""A prefix every row shares, run once as one row and its keys and values repeated to
every row: the step both training paths that share a head take (the GRPO update's shared
prompt prefix, ``posttrain.train.grpo.shared_prefix``; a starter's warm start,
``posttrain.policy.starters.prefix_loss``). Outside inference mode the gradient reaches
the prefix through the repeated cache: autograd sums the rows' contributions."""

from __future__ import annotations

from typing import Any


def repeated_prefix_cache(model: Any, prefix_ids: Any, rows: int) -> Any:
    """A ``DynamicCache`` holding ``prefix_ids`` (one row) run through ``model``, repeated
    to ``rows`` rows, for the rows' remainders to run on top of."""
    from transformers import DynamicCache

    config = getattr(model, "config", None)
    cache = DynamicCache(config=config) if config is not None else DynamicCache()
    # the prefix's own logits are never needed: keep one position's (the least allowed)
    model(input_ids=prefix_ids, cache=cache, use_cache=True, logits_to_keep=1)
    cache.batch_repeat_interleave(rows)
    return cache
