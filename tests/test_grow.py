"""Growing a trained starter into a wider, deeper one without changing what it computes."""

from __future__ import annotations

import json

import pytest

from posttrain.envs.refund import SYSTEM
from posttrain.errors import PosttrainError
from posttrain.policy.grow import grow_llama
from posttrain.policy.starter import (
    Architecture,
    StarterRecipe,
    build_starter,
    recipe_for,
)

PROMPTS = (
    "Please refund ORD-4821, it arrived broken.",
    "Where is my order? It's been two weeks.",
    "What's the weather like today?",
)


def _chat_ids(tokenizer, prompt):
    messages = [{"role": "system", "content": SYSTEM}, {"role": "user", "content": prompt}]
    text = tokenizer.apply_chat_template(messages, tokenize=False, add_generation_prompt=True)
    return tokenizer(text, return_tensors="pt").input_ids


@pytest.fixture(scope="module")
def grown(starter_2m):
    model = grow_llama(
        starter_2m.model,
        hidden_size=256,
        num_layers=8,
        intermediate_size=1024,
        seed=0,
        frozen_attention_layers=2,
    ).eval()
    return model


def test_the_grown_model_computes_what_the_small_one_did(starter_2m, grown):
    import torch

    small = starter_2m.model
    assert grown.config.num_attention_heads == 8 and grown.config.num_key_value_heads == 4
    assert sum(p.numel() for p in grown.parameters()) > 4 * sum(
        p.numel() for p in small.parameters()
    )
    for prompt in PROMPTS:
        ids = _chat_ids(starter_2m.tokenizer, prompt)
        with torch.no_grad():
            before, after = small(ids).logits, grown(ids).logits
        assert torch.allclose(before, after, atol=1e-4), prompt
        greedy = dict(max_new_tokens=24, do_sample=False)
        assert torch.equal(small.generate(ids, **greedy), grown.generate(ids, **greedy))


def test_new_weights_start_silent_and_the_circuit_cannot_read_new_width(grown):
    for index, layer in enumerate(grown.model.layers):
        attention = layer.self_attn
        assert (attention.o_proj.weight[128:] == 0).all()  # nothing writes the new width
        assert (layer.mlp.down_proj.weight[128:] == 0).all()
        assert (attention.o_proj.weight[:, 128:] == 0).all()  # new heads say nothing yet
        assert (layer.mlp.down_proj.weight[:, 512:] == 0).all()
        if index < 2:  # the copy circuit's layers, held fixed in training
            for projection in (attention.q_proj, attention.k_proj, attention.v_proj):
                assert (projection.weight[:, 128:] == 0).all()
        if index >= 6:  # new layers are identities
            assert (attention.o_proj.weight == 0).all() and (layer.mlp.down_proj.weight == 0).all()
        elif index >= 2:  # elsewhere the new width is read, so training can use it
            assert attention.q_proj.weight[:, 128:].abs().sum() > 0
    assert (grown.model.embed_tokens.weight[:, 128:] == 0).all()
    assert grown.lm_head.weight is grown.model.embed_tokens.weight


def test_growing_refuses_to_shrink_or_split_a_head(starter_2m):
    model = starter_2m.model
    with pytest.raises(ValueError, match="only grows"):
        grow_llama(model, hidden_size=64, num_layers=6, intermediate_size=512, seed=0)
    with pytest.raises(ValueError, match="only grows"):
        grow_llama(model, hidden_size=128, num_layers=4, intermediate_size=512, seed=0)
    with pytest.raises(ValueError, match="whole number of 32-wide heads"):
        grow_llama(model, hidden_size=160, num_layers=6, intermediate_size=512, seed=0)


def _small_grown_recipe(**changes) -> StarterRecipe:
    fields = dict(
        name="starter-grown-test",
        architecture=Architecture(
            hidden_size=192, num_layers=7, num_heads=6, num_kv_heads=3, intermediate_size=768
        ),
        skill_steps=2,
        mix_steps=2,
        warmup_steps=1,
        corpus_situations=300,
        grow_from="starter-2m",
    )
    fields.update(changes)
    return StarterRecipe(**fields)


def test_a_grown_recipe_builds_trains_and_loads(starter_2m_folder):
    from posttrain.policy.models import load_policy

    recipe = _small_grown_recipe()
    folder = build_starter(recipe=recipe, show_progress=False)
    build = json.loads((folder / "build.json").read_text())
    assert build["parameters"] > 2 * 1_609_856 and build["final_loss"] > 0
    assert json.loads((folder / "recipe.json").read_text())["recipe"]["grow_from"] == "starter-2m"
    policy = load_policy(str(folder), show_progress=False)
    assert policy.model.config.hidden_size == 192
    # the tokenizer is the base's, byte for byte
    assert (folder / "tokenizer.json").read_text() == (
        starter_2m_folder / "tokenizer.json"
    ).read_text()
    assert recipe.key() != recipe_for("starter").key()


def test_a_grown_recipe_with_the_wrong_head_count_is_refused(starter_2m_folder):
    recipe = _small_grown_recipe(
        name="starter-grown-bad",
        architecture=Architecture(
            hidden_size=192, num_layers=7, num_heads=4, num_kv_heads=2, intermediate_size=768
        ),
    )
    with pytest.raises(PosttrainError, match="means 6 heads / 3 KV heads, not 4 / 2"):
        build_starter(recipe=recipe, show_progress=False)
