"""The sampler's top-p draw: a sorted head grown to the nucleus against a full sort.

``pick_tokens`` sorts only the head of each row that holds the top-p nucleus
(``nucleus_head``); the baseline, measured in the same run, sorts the whole vocabulary
(``nucleus_head`` swapped for ``torch.sort``, what the draw did before). Three readings:

1. the draw alone: milliseconds a token step for 16 rows of the model's vocabulary,
   model-like logits (Gaussian, a few tokens well ahead), median of ``--repeats``;
2. the sampler on the model: 16 completions (4 refund holdout prompts x 4 seeds) of up
   to ``--max-new-tokens`` tokens at temperature 1.0, top-p 0.95, the two draws
   interleaved ``--runs`` times each (median), and how many completions are identical;
3. flat rows, where a 0.95 nucleus holds thousands of tokens: how many of the draws
   differ from the full sort's (sums rounded in another order).

    .venv/bin/python benchmarks/token_draw.py              # smollm2, about 4 minutes
    .venv/bin/python benchmarks/token_draw.py --write      # also update RESULTS.md
"""

from __future__ import annotations

import argparse
import contextlib
import statistics
import sys
import time
from collections.abc import Iterator

import torch
from results_md import cpu_description, write_section  # benchmarks/ is the script's folder

from posttrain.data.prompts import split_holdout_stratified
from posttrain.envs.refund import REFUND_ENV
from posttrain.envs.refund.prompts import simulate
from posttrain.errors import PosttrainError
from posttrain.policy import sampler as sampler_module
from posttrain.policy.loading import load_policy
from posttrain.policy.sampler import Sampler, SamplingParams, pick_tokens

ROWS = 16
TITLE = "Sampling: the top-p draw"


@contextlib.contextmanager
def full_sort_draw() -> Iterator[None]:
    """The baseline: every row's whole vocabulary sorted for the draw."""
    original = sampler_module.nucleus_head
    sampler_module.nucleus_head = lambda scaled, probs, top_p: torch.sort(
        scaled, dim=-1, descending=True)
    try:
        yield
    finally:
        sampler_module.nucleus_head = original


def model_like_logits(vocab: int, scale: float, seed: int) -> torch.Tensor:
    logits = torch.randn(ROWS, vocab, generator=torch.Generator().manual_seed(seed)) * scale
    logits[:, :5] += 2 * scale
    return logits


def draw(logits: torch.Tensor, params: SamplingParams, seed: int = 0) -> torch.Tensor:
    generators = [torch.Generator().manual_seed(seed + row) for row in range(ROWS)]
    return pick_tokens(logits, generators, params)[0]


def draw_milliseconds(vocab: int, params: SamplingParams, repeats: int, calls: int = 30) -> float:
    logits = model_like_logits(vocab, 6.0, seed=0)
    timings = []
    for _ in range(repeats):
        draw(logits, params)  # warm-up
        started = time.perf_counter()
        for _ in range(calls):
            draw(logits, params)
        timings.append((time.perf_counter() - started) / calls * 1000)
    return statistics.median(timings)


def flat_row_differences(vocab: int, params: SamplingParams, batches: int) -> dict:
    """Draws on flat rows that differ from the full sort's, and the largest gap in
    probability between the two picks of a differing draw."""
    differing, widest = 0, 0.0
    for scale in (1.0, 3.0):
        for batch in range(batches):
            logits = model_like_logits(vocab, scale, seed=1000 + batch)
            head = draw(logits, params, seed=batch * ROWS)
            with full_sort_draw():
                full = draw(logits, params, seed=batch * ROWS)
            probs = torch.softmax(logits / params.temperature, dim=-1)
            for row in (head != full).nonzero().flatten().tolist():
                differing += 1
                gap = abs(probs[row, head[row]] - probs[row, full[row]]) / probs[row, full[row]]
                widest = max(widest, float(gap))
    return {"differing": differing, "draws": 2 * batches * ROWS, "widest": widest}


def sampler_requests(sampler: Sampler) -> tuple[list[list[int]], list[int]]:
    _, holdout = split_holdout_stratified(simulate(200, seed=0), 0.2)
    prompts = sampler.encode([REFUND_ENV.messages_for(r["prompt"]) for r in holdout[:4]])
    return [p for p in prompts for _ in range(4)], list(range(ROWS))


def sampler_seconds(model: str, max_new_tokens: int, runs: int) -> dict:
    policy = load_policy(model, show_progress=False)
    sampler = Sampler(policy, batch_size=ROWS)
    prompts, seeds = sampler_requests(sampler)
    params = SamplingParams(temperature=1.0, top_p=0.95, max_new_tokens=max_new_tokens)
    sampler.sample_tokens(prompts[:2], seeds[:2], params)  # warm-up
    seconds: dict[str, list[float]] = {"head": [], "full sort": []}
    outputs: dict[str, list[list[int]]] = {}
    for attempt in range(runs):
        for side in seconds:
            context = full_sort_draw() if side == "full sort" else contextlib.nullcontext()
            with context:
                started = time.perf_counter()
                completions = sampler.sample_tokens(prompts, seeds, params)
                seconds[side].append(time.perf_counter() - started)
            outputs[side] = [c.token_ids for c in completions]
            print(f"{model} {side} run {attempt + 1}: {seconds[side][-1]:.2f}s", file=sys.stderr)
    identical = sum(a == b for a, b in zip(outputs["head"], outputs["full sort"], strict=True))
    return {
        "vocab": len(policy.tokenizer),
        "tokens": sum(len(t) for t in outputs["head"]),
        "head": statistics.median(seconds["head"]),
        "full sort": statistics.median(seconds["full sort"]),
        "identical": identical,
    }


def differing_why(flat: dict) -> str:
    if not flat["differing"]:
        return "."
    if flat["widest"] == 0:
        return (": each between two tokens of exactly equal probability, which a full sort "
                "and `topk` order differently.")
    return (f", each picking a token within {100 * flat['widest']:.2g}% of the other's "
            "probability (ties ordered differently, sums rounded in another order).")


def markdown(model: str, sampled: dict, draws: dict, flat: dict, args) -> str:
    command = (f".venv/bin/python benchmarks/token_draw.py --model {model} --runs {args.runs} "
               f"--repeats {args.repeats} --max-new-tokens {args.max_new_tokens} "
               f"--flat-batches {args.flat_batches}")
    lines = [
        f"## {TITLE}",
        "",
        f"`{command}` on {cpu_description()}, torch {torch.__version__} "
        f"({torch.get_num_threads()} threads). The draw sorts only the head of each row that "
        "holds the top-p nucleus (`nucleus_head`); the baseline, in the same run, sorts the "
        "whole vocabulary (the draw before). Medians.",
        "",
        "| reading | full sort | sorted head | ratio |",
        "|---|---|---|---|",
    ]
    for label, (full, head) in draws.items():
        lines.append(f"| draw for {ROWS} rows of {sampled['vocab']:,} tokens, {label} "
                     f"| {full:.1f} ms | {head:.1f} ms | {full / head:.1f}x |")
    lines += [
        f"| {model}: {ROWS} completions of up to {args.max_new_tokens} tokens "
        f"({sampled['tokens']} made), temperature 1.0, top-p 0.95 "
        f"| {sampled['full sort']:.2f} s | {sampled['head']:.2f} s "
        f"| {sampled['full sort'] / sampled['head']:.2f}x |",
        "",
        f"Identical completions, sorted head against full sort: {sampled['identical']} of {ROWS}. "
        f"On flat rows (Gaussian logits of scale 1 and 3, a nucleus of thousands of tokens), "
        f"{flat['differing']} of {flat['draws']:,} draws differed from the full sort's"
        + differing_why(flat),
    ]
    return "\n".join(lines) + "\n"


def main() -> int:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--model", default="smollm2", help="model to sample (default smollm2)")
    parser.add_argument("--runs", type=int, default=3,
                        help="sampler runs per draw, interleaved (median; default 3)")
    parser.add_argument("--repeats", type=int, default=5,
                        help="timings of the draw alone (median; default 5)")
    parser.add_argument("--max-new-tokens", type=int, default=64,
                        help="tokens per completion at most (default 64)")
    parser.add_argument("--flat-batches", type=int, default=200,
                        help=f"batches of {ROWS} flat rows per scale (default 200)")
    parser.add_argument("--write", action="store_true", help="update benchmarks/RESULTS.md")
    args = parser.parse_args()
    for name in ("runs", "repeats", "max_new_tokens", "flat_batches"):
        if getattr(args, name) < 1:
            parser.error(f"--{name.replace('_', '-')} must be at least 1")
    try:
        sampled = sampler_seconds(args.model, args.max_new_tokens, args.runs)
    except PosttrainError as error:
        print(f"token_draw.py: {error}", file=sys.stderr)
        return 2
    draws = {}
    for label, params in (("temperature 0.8, top-p 0.95", SamplingParams()),
                          ("temperature 1.0, top-p 0.95", SamplingParams(temperature=1.0))):
        head = draw_milliseconds(sampled["vocab"], params, args.repeats)
        with full_sort_draw():
            full = draw_milliseconds(sampled["vocab"], params, args.repeats)
        draws[label] = (full, head)
    flat = flat_row_differences(sampled["vocab"], SamplingParams(temperature=1.0),
                                args.flat_batches)
    section = markdown(args.model, sampled, draws, flat, args)
    print(section)
    if args.write:
        write_section(TITLE, section)
    return 0


if __name__ == "__main__":
    sys.exit(main())
