"""Grow a trained Llama-shaped decoder into a wider, deeper one that computes the same function.

Why this exists: the ~10M ``starter`` cannot be warm-started from scratch with the
order-id copy circuit intact (eight attempts lost it; docs/policies.md). The 2M model
keeps it. So the 10M model starts as the trained 2M model, grown without changing a
single output, and is then trained further: the copying it inherited is there from
step one, and the new width and layers only have to learn what helps on top of it.

How the function is kept (every new weight that could change an output starts at zero):

- the residual stream gets new dimensions that nothing writes to at first: the new
  embedding columns, the new output rows of ``o_proj`` and ``down_proj`` are zero;
- new attention heads (same head size) and new MLP units read the whole stream with
  random weights, but their outputs (``o_proj`` / ``down_proj`` columns) are zero;
- RMSNorm averages over the whole width, so with the new dimensions at zero it would
  divide by a smaller root-mean-square: every norm weight is scaled by
  ``sqrt(old_width / new_width)`` to cancel that, and ``eps`` by ``old / new width``;
- new layers go after the old ones, with zero output projections: identities;
- in ``frozen_attention_layers`` (the copy circuit's, held fixed in training) the
  attention projections get zero weights on the new dimensions, so the circuit never
  reads what training later writes there.

New weights that are trained get gradient at once: the zero outputs are multiplied
by nonzero activations, so they move in the first step and the rest follows.
"""

from __future__ import annotations

import math
from typing import Any

INIT_STD = 0.02  # transformers' initializer_range for Llama


def grow_llama(
    model: Any,
    *,
    hidden_size: int,
    num_layers: int,
    intermediate_size: int,
    seed: int,
    frozen_attention_layers: int = 0,
) -> Any:
    """A new ``LlamaForCausalLM``, wider and deeper than ``model``, with the same outputs.

    The head size stays, so the number of heads (and KV heads) grows with the width
    in the same ratio. Raises ValueError when a size would shrink or the width is not
    a whole number of heads.
    """
    import torch
    from transformers import LlamaForCausalLM

    old = model.config
    head_dim = old.hidden_size // old.num_attention_heads
    group = old.num_attention_heads // old.num_key_value_heads
    _check_growth(old, hidden_size, num_layers, intermediate_size, head_dim, group)
    config = old.__class__.from_dict(old.to_dict())
    config.hidden_size = hidden_size
    config.num_hidden_layers = num_layers
    config.intermediate_size = intermediate_size
    config.num_attention_heads = hidden_size // head_dim
    config.num_key_value_heads = config.num_attention_heads // group
    config.head_dim = head_dim
    # the norms average over the new width too; a smaller eps keeps eps's share the same
    config.rms_norm_eps = old.rms_norm_eps * old.hidden_size / hidden_size
    torch.manual_seed(seed)
    grown = LlamaForCausalLM(config)
    grown.generation_config = model.generation_config
    norm_scale = math.sqrt(old.hidden_size / hidden_size)
    h = old.hidden_size
    with torch.no_grad():
        for parameter in grown.parameters():
            parameter.normal_(0.0, INIT_STD)
        embed = grown.model.embed_tokens.weight
        embed.zero_()
        embed[:, :h] = model.model.embed_tokens.weight
        for index, layer in enumerate(grown.model.layers):
            source = model.model.layers[index] if index < old.num_hidden_layers else None
            _grow_layer(layer, source, h, norm_scale, index < frozen_attention_layers)
        grown.model.norm.weight.fill_(norm_scale)
        grown.model.norm.weight[:h] = model.model.norm.weight * norm_scale
    grown.tie_weights()
    return grown


def _check_growth(
    old: Any, hidden: int, layers: int, intermediate: int, head_dim: int, group: int
) -> None:
    if hidden < old.hidden_size or layers < old.num_hidden_layers:
        raise ValueError("grow_llama only grows: width and depth must not shrink")
    if intermediate < old.intermediate_size:
        raise ValueError("grow_llama only grows: the MLP width must not shrink")
    if hidden % head_dim or (hidden // head_dim) % group:
        raise ValueError(
            f"width {hidden} must be a whole number of {head_dim}-wide heads, "
            f"in groups of {group} per KV head"
        )


def _grow_layer(layer: Any, source: Any, h: int, norm_scale: float, frozen: bool) -> None:
    """Fill one grown layer from ``source`` (None: a new identity layer)."""
    attention, mlp = layer.self_attn, layer.mlp
    for norm in (layer.input_layernorm, layer.post_attention_layernorm):
        norm.weight.fill_(norm_scale)
    # nothing a new head or unit computes reaches the stream until training moves it
    attention.o_proj.weight.zero_()
    mlp.down_proj.weight.zero_()
    if attention.o_proj.bias is not None:
        attention.o_proj.bias.zero_()
    for projection in (attention.q_proj, attention.k_proj, attention.v_proj):
        if projection.bias is not None:
            projection.bias.zero_()
    if frozen:
        for projection in (attention.q_proj, attention.k_proj, attention.v_proj):
            projection.weight[:, h:] = 0.0
    if source is None:
        return
    layer.input_layernorm.weight[:h] = source.input_layernorm.weight * norm_scale
    layer.post_attention_layernorm.weight[:h] = source.post_attention_layernorm.weight * norm_scale
    old_attention, old_mlp = source.self_attn, source.mlp
    for name in ("q_proj", "k_proj", "v_proj"):
        new, old = getattr(attention, name), getattr(old_attention, name)
        rows = old.weight.shape[0]  # the old heads are the first ones, in order
        new.weight[:rows, :h] = old.weight
        if old.bias is not None:
            new.bias[:rows] = old.bias
    old_o = old_attention.o_proj
    attention.o_proj.weight[:h, : old_o.weight.shape[1]] = old_o.weight
    if old_o.bias is not None:
        attention.o_proj.bias[:h] = old_o.bias
    units = old_mlp.gate_proj.weight.shape[0]
    mlp.gate_proj.weight[:units, :h] = old_mlp.gate_proj.weight
    mlp.up_proj.weight[:units, :h] = old_mlp.up_proj.weight
    mlp.down_proj.weight[:h, :units] = old_mlp.down_proj.weight
