"""The sampler's token draw: top-k/top-p from a sorted head instead of a full sort.

``pick_tokens`` sorts only as many of a row's tokens as top-k and top-p can keep
(``nucleus_head``). These tests hold it to the full-sort draw it replaced: the same
tokens for the same seeds (up to the order of exactly tied tokens in flat nuclei), never a token
outside the nucleus, and the nucleus's renormalised probabilities as frequencies.
"""

from __future__ import annotations

import pytest
import torch

from posttrain.policy.sampler import SamplingParams, nucleus_head, pick_tokens


def full_sort_pick(logits: torch.Tensor, seeds: list[int], params: SamplingParams) -> torch.Tensor:
    """The reference: sort the whole vocabulary, cut top-k and top-p, draw by inverse CDF
    with one uniform number per row (what ``pick_tokens`` did before the sorted head)."""
    uniforms = torch.stack([torch.rand((), generator=torch.Generator().manual_seed(s))
                            for s in seeds])
    sorted_logits, sorted_ids = torch.sort(logits / params.temperature, dim=-1, descending=True)
    if params.top_k > 0:
        sorted_logits[:, params.top_k:] = float("-inf")
    probs = torch.softmax(sorted_logits, dim=-1)
    if params.top_p < 1.0:
        outside = probs.cumsum(dim=-1) - probs >= params.top_p
        probs = torch.softmax(sorted_logits.masked_fill(outside, float("-inf")), dim=-1)
    cumulative = probs.cumsum(dim=-1)
    position = torch.searchsorted(cumulative, (uniforms * cumulative[:, -1]).unsqueeze(-1))
    return sorted_ids.gather(-1, position.clamp(max=logits.shape[-1] - 1)).squeeze(-1)


def nucleus(logits_row: torch.Tensor, params: SamplingParams) -> set[int]:
    """Token ids the reference can draw for one row."""
    values, ids = torch.sort(logits_row / params.temperature, descending=True)
    if params.top_k > 0:
        values, ids = values[: params.top_k], ids[: params.top_k]
    probs = torch.softmax(values, dim=-1)
    keep = probs.cumsum(-1) - probs < params.top_p
    return set(ids[keep].tolist())


def model_like_logits(rows: int, vocab: int, scale: float, seed: int) -> torch.Tensor:
    """Gaussian logits with a few tokens well ahead, like a language model's."""
    generator = torch.Generator().manual_seed(seed)
    logits = torch.randn(rows, vocab, generator=generator) * scale
    logits[:, :5] += 2 * scale
    return logits


def setting_id(params: SamplingParams) -> str:
    return f"t{params.temperature}-p{params.top_p}-k{params.top_k}"


def draw(logits: torch.Tensor, seeds: list[int], params: SamplingParams) -> torch.Tensor:
    generators = [torch.Generator().manual_seed(s) for s in seeds]
    return pick_tokens(logits, generators, params)[0]


SETTINGS = [
    SamplingParams(temperature=0.8, top_p=0.95),
    SamplingParams(temperature=1.0, top_p=0.95),
    SamplingParams(temperature=1.2, top_p=0.9),
    SamplingParams(temperature=0.7, top_p=0.95, top_k=20),
    SamplingParams(temperature=1.0, top_p=1.0, top_k=50),
    SamplingParams(temperature=1.0, top_p=1.0),
]


@pytest.mark.parametrize("params", SETTINGS, ids=setting_id)
@pytest.mark.parametrize("vocab", [1024, 49152])
def test_the_same_tokens_as_a_full_sort_for_the_same_seeds(params, vocab):
    # sharp rows (a model's usual case): the head gives the reference's tokens; a
    # differing token needs a tie or a draw within rounding of a boundary, allowed once in 500
    mismatches, total = 0, 0
    for scale in (6.0, 12.0):
        for batch in range(8 if vocab > 2000 else 40):
            logits = model_like_logits(16, vocab, scale, seed=batch)
            seeds = [batch * 16 + row for row in range(16)]
            picked = draw(logits, seeds, params)
            mismatches += int((picked != full_sort_pick(logits, seeds, params)).sum())
            total += 16
    assert mismatches <= total / 500, f"{mismatches} of {total} draws differ from a full sort"


@pytest.mark.parametrize("params", SETTINGS[:4], ids=setting_id)
def test_a_drawn_token_is_always_inside_the_nucleus(params):
    # flat rows too, where a 0.95 nucleus holds thousands of tokens and the head grows
    for scale in (0.5, 1.0, 3.0, 12.0):
        logits = model_like_logits(32, 8192, scale, seed=int(scale * 10))
        picked = draw(logits, list(range(32)), params)
        for row, token in enumerate(picked.tolist()):
            assert token in nucleus(logits[row], params), (scale, row, token)


@pytest.mark.parametrize("scale", [0.3, 2.0, 8.0])
def test_the_head_is_sorted_and_holds_the_nucleus(scale):
    params = SamplingParams(temperature=1.0, top_p=0.95)
    logits = model_like_logits(8, 4096, scale, seed=3)
    values, ids = nucleus_head(logits, torch.softmax(logits, dim=-1), params.top_p)
    assert torch.all(values[:, :-1] >= values[:, 1:])
    assert torch.equal(logits.gather(-1, ids), values)
    mass = torch.softmax(logits, dim=-1).gather(-1, ids).sum(-1)
    assert torch.all(mass >= params.top_p)
    for row in range(8):
        assert nucleus(logits[row], params) <= set(ids[row].tolist())


def test_frequencies_follow_the_renormalised_nucleus():
    # one row of 300 fairly flat logits: the 0.9 nucleus is past the first head of 64
    params = SamplingParams(temperature=1.0, top_p=0.9)
    row = torch.randn(300, generator=torch.Generator().manual_seed(7)) * 0.8
    expected = torch.zeros(300)
    values, ids = torch.sort(row, descending=True)
    probs = torch.softmax(values, -1)
    keep = probs.cumsum(-1) - probs < params.top_p
    assert keep.sum() > 64
    expected[ids[keep]] = probs[keep] / probs[keep].sum()
    draws = 20_000
    picked = draw(row.expand(draws, -1).contiguous(), list(range(draws)), params)
    counts = torch.bincount(picked, minlength=300).float()
    assert counts[expected == 0].sum() == 0
    # chi-square over the kept tokens: ~N(k, 2k) under the null; 6 sigma of slack
    kept = expected > 0
    chi2 = ((counts[kept] - draws * expected[kept]) ** 2 / (draws * expected[kept])).sum()
    dof = int(kept.sum()) - 1
    assert chi2 < dof + 6 * (2 * dof) ** 0.5, f"chi2 {chi2:.0f} for {dof} degrees of freedom"


def test_greedy_takes_the_argmax_and_reports_its_logprob():
    logits = model_like_logits(4, 1000, 3.0, seed=1)
    picked, logprobs = pick_tokens(logits, [torch.Generator().manual_seed(i) for i in range(4)],
                                   SamplingParams(temperature=0))
    assert torch.equal(picked, logits.argmax(-1))
    assert torch.allclose(logprobs, torch.log_softmax(logits, -1).max(-1).values)
