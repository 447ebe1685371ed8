"""Build one grown-starter variant and measure it (how the shipped `starter` recipe was chosen).

    .venv/bin/python benchmarks/starter_variants.py NAME --skill-steps 100 --mix-steps 60 \
        --learning-rate 1e-3 --mix '{"with_id_lookup": 0.35, "with_id_ask": 0.40, ...}'

It grows `starter-2m` to the `starter` shape (256 wide, 9 layers), trains the given steps,
caches the build under the models folder as NAME-<key>, and prints: the teacher-forced
copy rate on 60 with-id prompts (`simulate(300, seed=11)`), `posttrain eval` on the default
holdout, and `posttrain eval` over 400 situations (seed 5, every split, 2 samples). The
table of variants tried is in docs/policies.md.
"""

from __future__ import annotations

import argparse
import json
import subprocess
import sys
import time

from posttrain.data.simulate import simulate
from posttrain.policy.models import load_policy
from posttrain.policy.starter import (
    RECIPES,
    BehaviourMix,
    build_starter,
    id_copy_rate,
    with_overrides,
)

CATEGORY_ROWS = ("with_id", "no_id", "off_topic", "holdout pass@1", "pass@1")


def eval_table(folder: str, *extra: str) -> str:
    """The category rows `posttrain eval` prints for a model folder."""
    command = [sys.executable, "-m", "posttrain.cli", "eval", "--base-model", folder, *extra]
    printed = subprocess.run(command, capture_output=True, text=True, check=True).stdout
    return "\n".join(line for line in printed.splitlines() if line.startswith(CATEGORY_ROWS))


def main() -> int:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("name", help="the variant's name (its cache folder is NAME-<key>)")
    parser.add_argument("--skill-steps", type=int, default=100, help="right-move steps")
    parser.add_argument("--mix-steps", type=int, default=60, help="behaviour-mix steps")
    parser.add_argument("--learning-rate", type=float, default=1e-3, help="peak learning rate")
    parser.add_argument(
        "--mix", default="{}", help="BehaviourMix fields as JSON (default: the 2M mix)"
    )
    args = parser.parse_args()
    steps = args.skill_steps + args.mix_steps
    recipe = with_overrides(
        RECIPES["starter"],
        name=args.name,
        skill_steps=args.skill_steps,
        mix_steps=args.mix_steps,
        learning_rate=args.learning_rate,
        warmup_steps=min(20, steps // 4),
        mix=BehaviourMix(**json.loads(args.mix)),
    )
    started = time.monotonic()
    folder = build_starter(recipe=recipe)
    print(f"{args.name}: built in {time.monotonic() - started:.0f} s -> {folder}")
    policy = load_policy(str(folder), show_progress=False)
    prompts = [r["prompt"] for r in simulate(300, seed=11) if r["category"] == "with_id"][:60]
    rate = id_copy_rate(policy.model, policy.tokenizer, prompts)
    print(f"copy rate (teacher-forced, 60 prompts): {rate:.2f}")
    print("holdout (posttrain eval defaults):")
    print(eval_table(str(folder)))
    print("400 situations, seed 5, all splits, 2 samples:")
    print(eval_table(str(folder), "--prompts", "400", "--seed", "5", "--split", "all",
                     "--samples", "2"))
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
