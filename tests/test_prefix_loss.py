"""A warm-start step with the batch's shared head run once: the same loss and gradient."""

from __future__ import annotations

from dataclasses import replace

import torch

from posttrain.envs.refund.starter_data import STARTER_DATA, starter_dialogues
from posttrain.policy.starters.prefix_loss import (
    MIN_SHARED_HEAD,
    shared_head_length,
    shared_head_loss,
    shared_head_outputs,
)
from posttrain.policy.starters.recipes import RECIPES, Architecture
from posttrain.policy.starters.scratch import (
    _collate,
    _encode_rows,
    new_model,
    supervised_warm_start,
    train_tokenizer,
)

SMALL = Architecture(hidden_size=64, num_layers=3, num_heads=4, num_kv_heads=2,
                     intermediate_size=128)


def _batch_and_model(rows: int = 12):
    recipe = RECIPES["starter-2m"]
    dialogues = starter_dialogues(recipe.mix, 200, recipe.data_seed)
    tokenizer = train_tokenizer([STARTER_DATA.render(row) for row in dialogues], 512,
                                STARTER_DATA.isolated_words(dialogues))
    model, _ = new_model(tokenizer, SMALL, 0, True, match=recipe.circuit_match,
                         copy=recipe.circuit_copy, digit_norm=recipe.circuit_digit_norm,
                         copy_ids=STARTER_DATA.copy_token_ids(tokenizer, dialogues))
    batch = _collate(_encode_rows(tokenizer, dialogues[:rows], "reply", STARTER_DATA.system),
                     tokenizer.pad_token_id)
    return model, batch


def _loss_and_gradients(model, loss_function):
    model.zero_grad(set_to_none=True)
    loss = loss_function()
    loss.backward()
    return loss.detach(), [parameter.grad.detach().clone() for parameter in model.parameters()]


def _float64_loss(logits, labels):
    """The labelled tokens' mean cross-entropy in float64 (transformers' own loss upcasts
    to float32, whose rounding would hide what this compares)."""
    return torch.nn.functional.cross_entropy(logits[:, :-1].flatten(0, 1),
                                             labels[:, 1:].flatten(), ignore_index=-100)


def test_the_shared_head_gives_the_plain_forwards_logits_and_gradient():
    model, (input_ids, labels, attention) = _batch_and_model()
    model = model.double().train()
    head = shared_head_length(input_ids, labels)
    assert head >= MIN_SHARED_HEAD  # the system turn and the user turn's opening
    assert (labels[:, : head + 1] == -100).all()  # no labelled token is left to the head
    # the remainder's first column is never a prediction target: its loss is the plain one
    rest_labels = labels[:, head:]

    def plain():
        logits = model(input_ids=input_ids, attention_mask=attention).logits[:, head:]
        return _float64_loss(logits, rest_labels)

    def shared():
        logits = shared_head_outputs(model, input_ids, attention, head).logits
        return _float64_loss(logits, rest_labels)

    plain_loss, plain_grads = _loss_and_gradients(model, plain)
    shared_loss, shared_grads = _loss_and_gradients(model, shared)
    # the loss is float64 throughout (the same sums in another order: ~1e-15 relative; 1e-10
    # still catches a lost, extra or misplaced token, which moves it by a percent)
    assert torch.allclose(plain_loss, shared_loss, rtol=1e-10, atol=0)
    # transformers' RMSNorm computes in float32 even in a float64 model, so a gradient is
    # rounded to float32 at each norm it passes back through: the head's, summed over the
    # rows before it (shared) or after it (plain), at each of the 2 norms a layer and the
    # final one; a parameter's gradient agrees to rows x norms float32 epsilons of its size
    norms = 2 * len(model.model.layers) + 1
    tolerance = input_ids.size(0) * norms * torch.finfo(torch.float32).eps
    for before, after in zip(plain_grads, shared_grads, strict=True):
        assert (before - after).abs().max() <= tolerance * before.abs().max()


def test_the_shared_head_loss_is_transformers_loss_to_float32_rounding():
    model, (input_ids, labels, attention) = _batch_and_model()
    model.train()
    plain = model(input_ids=input_ids, attention_mask=attention, labels=labels).loss
    shared = shared_head_loss(model, input_ids, labels, attention)
    # the same terms summed in another order: each of the n labelled terms can move the
    # float32 sum by its rounding, so the mean agrees to n float32 epsilons
    labelled = int((labels != -100).sum())
    assert torch.allclose(plain, shared, rtol=labelled * torch.finfo(torch.float32).eps,
                          atol=0)


def test_rows_that_share_too_little_take_the_plain_forward():
    model, (input_ids, labels, attention) = _batch_and_model(rows=2)
    # a row whose reply starts at column 3: no head of MIN_SHARED_HEAD tokens fits before it
    labels = labels.clone()
    labels[1, 3:] = input_ids[1, 3:]
    assert shared_head_length(input_ids, labels) == 0
    model.train()
    plain = model(input_ids=input_ids, attention_mask=attention, labels=labels).loss
    assert torch.equal(shared_head_loss(model, input_ids, labels, attention), plain)


def test_a_shared_head_warm_start_is_deterministic_and_keyed_apart():
    tiny = replace(RECIPES["starter-2m"], name="starter-tiny", architecture=SMALL,
                   corpus_situations=200, skill_steps=2, mix_steps=2, warmup_steps=2,
                   build_attempts=1, shared_head=True)
    plain = replace(tiny, shared_head=False)
    # off is the default and stays out of the key: starter-2m keeps its cached weights
    assert plain.key() == replace(plain, shared_head=False).key() != tiny.key()
    assert RECIPES["starter"].shared_head and not RECIPES["starter-2m"].shared_head
    dialogues = starter_dialogues(tiny.mix, tiny.corpus_situations, tiny.data_seed)
    tokenizer = train_tokenizer([STARTER_DATA.render(row) for row in dialogues], 512,
                                STARTER_DATA.isolated_words(dialogues))
    weights = []
    for _ in range(2):
        model, circuit = new_model(tokenizer, SMALL, 0, True, match=tiny.circuit_match,
                                   copy=tiny.circuit_copy, digit_norm=tiny.circuit_digit_norm,
                                   copy_ids=STARTER_DATA.copy_token_ids(tokenizer, dialogues))
        supervised_warm_start(model, tokenizer, dialogues, tiny, seed=0, circuit=circuit)
        weights.append({name: tensor.clone() for name, tensor in model.state_dict().items()})
    first, second = weights
    assert all(torch.equal(first[name], second[name]) for name in first)
