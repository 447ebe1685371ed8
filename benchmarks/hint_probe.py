"""How often a policy's replies pass a rule's tool categories when the reply is opened
for it, at each depth of the opening (issue #69: the self cold start's hint).

For each tool category it samples ``--samples`` replies to each of ``--prompts`` train
prompts at temperature 1, four ways: plain; opened with ``<tool_call>\\n``; opened up to
each tool's name and ``"arguments": {``; opened up to each tool's first required value
(what ``--cold-start-hint tools`` uses, ``cold_start_hint.tool_openings``). Every opening
that names a tool gets ``--samples`` on each prompt (the cold start spreads its samples
over the tools by seed instead), so half of them open the other category's tool.

    .venv/bin/python benchmarks/hint_probe.py                     # SmolLM2, library rule
    .venv/bin/python benchmarks/hint_probe.py --model starter-2m --env refund
"""

from __future__ import annotations

import argparse
import os
import time

os.environ.setdefault("HF_HUB_OFFLINE", "1")

EXAMPLE = "examples/library_env.py:NO_REFERENCE_ENV"


def openings_by_depth(env) -> dict[str, list[str]]:
    from posttrain.envs.wire import render_tool_call
    from posttrain.train.grpo.cold_start_hint import tool_openings

    named = []
    for tool in env.tools:
        call = render_tool_call(tool["function"]["name"], {"@@": 0})
        named.append(call[:call.index('"@@"')])
    return {"plain": [""], "tag": ["<tool_call>\n"], "name": named,
            "value": tool_openings(env)}


def main() -> int:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--model", default="smollm2", help="base model (default smollm2)")
    parser.add_argument("--env", default=EXAMPLE, help=f"environment (default {EXAMPLE})")
    parser.add_argument("--prompts", type=int, default=8, help="train prompts per category")
    parser.add_argument("--samples", type=int, default=4, help="samples per prompt and opening")
    parser.add_argument("--seed", type=int, default=5, help="the prompt writer's seed")
    parser.add_argument("--categories", default="", help="comma-separated (default: all)")
    args = parser.parse_args()

    from posttrain.envs import get_env
    from posttrain.policy.loading import load_policy
    from posttrain.policy.sampler import Sampler, SamplingParams

    env = get_env(args.env)
    policy = load_policy(args.model, env=env)
    policy.model.eval()
    sampler = Sampler(policy, batch_size=16)
    params = SamplingParams(temperature=1.0, top_p=1.0, max_new_tokens=96)
    by_category: dict[str, list[dict]] = {}
    for record in env.write_prompts(200, seed=args.seed):
        by_category.setdefault(env.category(env.case_for(record["prompt"])), []).append(record)
    print(f"{args.model} on {env.name}: {args.prompts} prompts x {args.samples} samples an "
          "opening, temperature 1")
    print("| depth | category | passed | seconds | a passing reply |")
    print("|---|---|---|---|---|")
    for depth, openings in openings_by_depth(env).items():
        opened = [policy.tokenizer.encode(text, add_special_tokens=False) for text in openings]
        for category, records in by_category.items():
            if args.categories and category not in args.categories.split(","):
                continue
            chosen = records[:args.prompts]
            encoded = [sampler.encode([env.messages_for(record["prompt"])])[0]
                       for record in chosen]
            started = time.monotonic()
            passed, total, example = 0, 0, ""
            for opening, ids in zip(openings, opened, strict=True):
                # every opening gets --samples on each prompt, one batch call per opening
                prompts = [prompt + ids for prompt in encoded for _ in range(args.samples)]
                seeds = [1000 * index + sample for index in range(len(chosen))
                         for sample in range(args.samples)]
                completions = sampler.sample_tokens(prompts, seeds, params)
                for at, completion in enumerate(completions):
                    record = chosen[at // args.samples]
                    reply = opening + completion.text
                    total += 1
                    if env.score(reply, env.case_for(record["prompt"])) == 1.0:
                        passed += 1
                        example = example or reply
            print(f"| {depth} | {category} | {passed}/{total} | "
                  f"{time.monotonic() - started:.0f} | {example[:90]!r} |", flush=True)
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
