"""The order-id copy circuit of the starter models, and the subspace it keeps for itself.

Passing a with-id prompt means copying the customer's order number into the tool
call. A model this small, trained for the few hundred steps a few-minute CPU build
allows, does not find a copying circuit by itself (measured on starter-2m: a greedy
copy rate of 0/60 after 300 steps, 6/60 after 900). So two attention heads are
wired by hand at initialisation (``wire_copy_circuit``) and held fixed in training.

Wiring alone was not enough. At initialisation the circuit copies 0.95 of ids, but
within 25-75 warm-start steps the rest of the network learned to write over the
slices of the residual stream the circuit reads and writes, the copy fell to 0.00,
and whether (and how far) it came back depended on the build seed and even on the
CPU's float rounding (2M builds: 0.00-0.45 across seeds 0-5 and AVX2 vs AVX-512
kernels; docs/policies.md). So the circuit now *owns* its two slices: after every
optimizer step ``CopyCircuit.enforce`` removes whatever another weight wrote into
them (``reserved``), and puts back the digit and prefix tokens' own content there.
The rest of the network still learns *whether* a digit comes next (through the
other dimensions of those tokens' embeddings); only *which* digit is the circuit's.
Measured on the same seeds: 0.90-1.00 copied after the warm start, every seed.
"""

from __future__ import annotations

import math
from dataclasses import dataclass
from typing import Any

# layers 0 and 1 hold the circuit; their attention is not trained
CIRCUIT_LAYERS = 2


@dataclass
class CopyCircuit:
    """What the warm start must keep intact: the reserved slices and the held embeddings.

    ``reserved`` (hidden x 2 * head_dim, orthonormal columns) spans ``C`` (the
    digit tokens' slice) and ``B`` (the previous-token slot). ``held_rows`` are the
    digit and prefix token ids, ``held_content`` their embeddings' part inside ``C``.
    """

    reserved: Any  # torch.Tensor
    held_rows: Any  # torch.Tensor of token ids
    held_content: Any  # torch.Tensor, len(held_rows) x hidden
    head_dim: int

    def enforce(self, model: Any) -> None:
        """Project every write into the residual stream out of the reserved slices.

        Embeddings (then the held tokens get their ``C`` content back), every MLP's
        output, every attention output of layers past the circuit's, and the other
        heads' outputs in the circuit's layers. Called once before training and
        after each optimizer step; costs a few matrix products.
        """
        import torch

        projector = self.reserved @ self.reserved.T
        with torch.no_grad():
            embeddings = model.model.embed_tokens.weight
            embeddings.sub_(embeddings @ projector)
            embeddings[self.held_rows] += self.held_content
            for index, layer in enumerate(model.model.layers):
                down = layer.mlp.down_proj.weight
                down.sub_(projector @ down)
                output = layer.self_attn.o_proj
                if index >= CIRCUIT_LAYERS:
                    output.weight.sub_(projector @ output.weight)
                    if output.bias is not None:
                        output.bias.sub_(projector @ output.bias)
                else:  # heads 0 and 1 are the circuit's (head 1 writes nothing)
                    others = output.weight[:, 2 * self.head_dim :]
                    others.sub_(projector @ others)

    @staticmethod
    def frozen_module_names() -> list[str]:
        """The attention projections of the circuit's layers, by module name.

        Saved in the model's config (``posttrain_frozen_modules``) so that every LoRA
        adapter posttrain attaches leaves them alone: adapted, they let GRPO break the
        copy (a 40-step run at 3e-4 moved with-id pass@1 0.24 -> 0.10; without them
        adapted, +0.08; docs/policies.md).
        """
        return [
            f"model.layers.{layer}.self_attn.{projection}"
            for layer in range(CIRCUIT_LAYERS)
            for projection in ("q_proj", "k_proj", "v_proj", "o_proj")
        ]

    def freeze_attention(self, model: Any) -> list[Any]:
        """Zero-gradient hooks on the circuit layers' attention; returns them for removal.

        With no weight decay AdamW then leaves those weights exactly as they are
        (trained, the wired heads drift within the first steps: layer 0's weight one
        token back fell from 0.99 to 0.53 in 300 steps).
        """
        import torch

        hooks = []
        for layer in model.model.layers[:CIRCUIT_LAYERS]:
            for parameter in layer.self_attn.parameters():
                hooks.append(parameter.register_hook(torch.zeros_like))
        return hooks


def wire_copy_circuit(
    model: Any,
    seed: int,
    copied_ids: list[int],
    prefix_ids: list[int],
    sink_id: int,
    *,
    sharpness: float = 60.0,
    match: float = 3.0,
    copy: float = 8.0,
    sink: float = 8.0,
    max_turn: float = 0.015,
    match_pairs: int = 12,
    digit_norm: float = 1.0,
) -> CopyCircuit:
    """Wire a copying circuit into head 0 of layers 0 and 1 at initialisation.

    A generic copy circuit wired by hand does not survive a warm start: it copies
    every token and the loss pays for undoing that. So this one copies ``copied_ids``
    only (the refund rule's digit chunks; for a starter built from an environment's
    hooks, the tokens of the spans its right moves copy), and it keeps two slices of the
    hidden space to itself (the module docstring; ``CopyCircuit.enforce``). The
    ``prefix_ids`` (may be empty) all share one direction, so a call's prefix matches
    the prompt's however it was spelled (``ORD-`` and ``ord_``).

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

    The weights stay ordinary parameters of a standard decoder. Returns the
    ``CopyCircuit`` the warm start keeps intact: layers 0 and 1's attention held
    (``freeze_attention``), the two slices reserved (``enforce``).
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
        directions = torch.randn(len(copied_ids) + 1, head_dim, generator=generator)
        directions = directions / directions.norm(dim=1, keepdim=True)
        # tied embeddings: a digit's norm sets how sharply the copy picks it as output
        embeddings[copied_ids] = digit_norm * scale * directions[:-1] @ copy_slice.T
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
        for attention in (position, matcher):
            for projection in (attention.q_proj, attention.k_proj, attention.v_proj):
                projection.bias[head_dim:] = 0.0
            attention.o_proj.bias.zero_()
        for projection in (matcher.k_proj, matcher.v_proj):
            projection.bias[:head_dim] = 0.0
        position.v_proj.bias[:head_dim] = 0.0
    held = torch.tensor(sorted({*copied_ids, *prefix_ids}))
    circuit = CopyCircuit(
        reserved=basis[:, : 2 * head_dim].clone(),
        held_rows=held,
        held_content=(embeddings.detach()[held] @ copy_slice) @ copy_slice.T,
        head_dim=head_dim,
    )
    circuit.enforce(model)
    return circuit


def id_copy_rate(model: Any, tokenizer: Any, prompts: list[str], data: Any) -> float:
    """Share of ``prompts`` (each names an id) whose number the model copies into a call.

    Teacher-forced and greedy: the reply is forced up to the number (for the refund
    rule, ``"order_id": "ORD-``; ``data.copy_probe(prompt)``, the environment's starter
    data, gives the call, the prefix and the number) and every token of the number must
    be the model's top choice. It measures the copy alone, apart from whether the
    policy chooses to call the tool.
    """
    import torch

    copied = 0
    for prompt in prompts:
        call, prefix, number = data.copy_probe(prompt)
        messages = [{"role": "system", "content": data.system},
                    {"role": "user", "content": prompt}]
        chat = tokenizer.apply_chat_template(messages, tokenize=False, add_generation_prompt=True)
        ids = tokenizer(chat + call + prefix + number, return_tensors="pt").input_ids
        start = len(tokenizer(chat + call + prefix).input_ids)
        with torch.no_grad():
            predicted = model(ids).logits[0, start - 1 : -1].argmax(-1)
        copied += bool((predicted == ids[0, start:]).all())
    return copied / len(prompts)


