"""The batched sampler: seeded reproducibility, stops, logprobs (on starter-2m)."""

from __future__ import annotations

import pytest
import torch

from posttrain.envs.refund import REFUND_ENV
from posttrain.policy.model_agent import ModelAgent
from posttrain.policy.sampler import Sampler, SamplingParams

PROMPTS = [
    "Refund ORD-4017 please.",
    "Where is my order ORD-20931? It has not arrived.",
    "I want a refund for my last order.",
    "Tell me a joke.",
    "I was charged twice for order ord_5512.",
    "How do I return something I bought?",
    "My package ORD-781 is late, can you check on it?",
    "What time does your shop open on Sundays?",
]
CONVERSATIONS = [REFUND_ENV.messages_for(prompt) for prompt in PROMPTS]
SEEDS = [11, 12, 13, 14, 15, 16, 17, 18]
EVAL = SamplingParams(temperature=0.8, top_p=0.95, max_new_tokens=48)


@pytest.fixture(scope="module")
def sampler(starter_2m):
    return Sampler(starter_2m, batch_size=64)


@pytest.fixture(scope="module")
def completions(sampler):
    return sampler.sample(CONVERSATIONS, SEEDS, EVAL)


def test_same_seeds_give_the_same_replies_whatever_the_batch(starter_2m, completions):
    small_batches = Sampler(starter_2m, batch_size=3)
    reordered = list(reversed(range(len(PROMPTS))))
    again = small_batches.sample(
        [CONVERSATIONS[i] for i in reordered], [SEEDS[i] for i in reordered], EVAL
    )
    for position, index in enumerate(reordered):
        assert again[position].token_ids == completions[index].token_ids
    # request 0 alone, and next to strangers with other seeds
    alone = small_batches.sample(CONVERSATIONS[:1], SEEDS[:1], EVAL)[0]
    crowded = Sampler(starter_2m).sample(CONVERSATIONS[:1] * 5, [SEEDS[0], 1, 2, 3, 4], EVAL)[0]
    assert alone.text == crowded.text == completions[0].text


def test_other_seeds_give_other_replies(sampler, completions):
    reseeded = sampler.sample(CONVERSATIONS, [seed + 1000 for seed in SEEDS], EVAL)
    assert [c.text for c in reseeded] != [c.text for c in completions]


def test_logprobs_match_a_forward_pass_over_the_same_tokens(starter_2m, completions):
    for completion in completions:
        ids = completion.prompt_token_ids + completion.token_ids
        with torch.no_grad():
            logits = starter_2m.model(torch.tensor([ids])).logits[0].float()
        start = len(completion.prompt_token_ids)
        expected = torch.log_softmax(logits[start - 1 : len(ids) - 1], dim=-1)
        expected = expected.gather(-1, torch.tensor(completion.token_ids)[:, None])[:, 0]
        assert torch.allclose(torch.tensor(completion.logprobs), expected, atol=1e-4)


def test_a_tool_call_stops_right_after_its_closing_tag(starter_2m):
    sampler = Sampler(starter_2m)
    prompt = "I was charged twice for ORD-5532. Please refund one of the payments."
    with_id = [REFUND_ENV.messages_for(prompt)] * 16
    calls = [
        c for c in sampler.sample(with_id, list(range(16)), EVAL) if c.stop_reason == "tool_call"
    ]
    assert calls  # starter-2m calls a tool on ~0.6 of with-id prompts
    closing = starter_2m.tokenizer.convert_tokens_to_ids("</tool_call>")
    for call in calls:
        assert call.text.endswith("</tool_call>")
        assert call.token_ids[-1] == closing


def test_end_of_turn_stops_and_is_not_in_the_text(sampler, completions):
    ended = [c for c in completions if c.stop_reason == "eos"]
    assert ended  # off-topic and no-id replies end with <|im_end|>
    for completion in ended:
        assert completion.token_ids[-1] in sampler.eos_ids
        assert "<|im_end|>" not in completion.text


def test_length_stop_caps_the_reply(sampler):
    short = SamplingParams(temperature=0.8, top_p=0.95, max_new_tokens=2)
    for completion in sampler.sample(CONVERSATIONS, SEEDS, short):
        assert len(completion.token_ids) <= 2
        assert completion.stop_reason in ("length", "eos")
    assert any(c.stop_reason == "length" for c in sampler.sample(CONVERSATIONS, SEEDS, short))


def test_a_stop_string_spanning_several_tokens_is_found_in_the_text(sampler):
    params = SamplingParams(temperature=0.0, max_new_tokens=48, stop_strings=('"arguments"',))
    calls = sampler.sample(CONVERSATIONS[:2], SEEDS[:2], params)
    stopped = [c for c in calls if c.stop_reason == "stop"]
    assert stopped
    for completion in stopped:
        assert completion.text.endswith('"arguments"')


def test_greedy_matches_transformers_generate(starter_2m, sampler):
    greedy = SamplingParams(temperature=0.0, max_new_tokens=24, stop_strings=())
    ours = sampler.sample(CONVERSATIONS[:3], [0, 0, 0], greedy)
    for completion in ours:
        prompt = torch.tensor([completion.prompt_token_ids])
        with torch.no_grad():
            reference = starter_2m.model.generate(
                prompt,
                attention_mask=torch.ones_like(prompt),
                do_sample=False,
                max_new_tokens=24,
                eos_token_id=sorted(sampler.eos_ids),
                pad_token_id=starter_2m.tokenizer.pad_token_id,
            )[0, prompt.shape[1] :].tolist()
        assert completion.token_ids == reference


def test_model_agent_implements_the_batch_protocol(starter_2m):
    from posttrain.agents import BatchAgent

    agent = ModelAgent(starter_2m)
    assert isinstance(agent, BatchAgent)
    assert agent.policy == {"base_model": "starter-2m", "adapter": None}
    assert (agent.sampling["temperature"], agent.sampling["top_p"]) == (0.8, 0.95)
    assert agent.sampling["max_new_tokens"] == 64
    replies = agent.reply_batch(CONVERSATIONS[:3], SEEDS[:3])
    assert len(replies) == 3 and all(isinstance(r, str) for r in replies)
    assert replies == agent.reply_batch(CONVERSATIONS[:3], SEEDS[:3])


@pytest.mark.parametrize(
    "bad", [dict(temperature=-1), dict(top_p=0), dict(top_k=-1), dict(max_new_tokens=0)]
)
def test_invalid_sampling_params_are_refused(bad):
    with pytest.raises(ValueError):
        SamplingParams(**bad)


def test_shared_prefix_leaves_every_prompt_a_token_of_its_own():
    from posttrain.policy.sampler import shared_prefix_length

    assert shared_prefix_length([[1, 2, 3, 4], [1, 2, 3, 9, 9]]) == 3
    assert shared_prefix_length([[1, 2, 3], [1, 2, 3]]) == 2  # not the whole prompt
    assert shared_prefix_length([[1, 2, 3]]) == 2
    assert shared_prefix_length([[5, 2], [1, 2]]) == 0
