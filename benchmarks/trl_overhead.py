"""posttrain's overhead over plain TRL: the GRPO training phase through ``posttrain grpo``
against a bare ``trl.GRPOTrainer`` script with the same model, data, reward and config.

Both sides train the same LoRA on the same starter model, the same train prompts (same
data seed), the same reward (the environment's rule) and the same ``GRPOConfig`` values;
the bare side has none of posttrain's callbacks (run store, console progress, signal
watch, hack monitor). Rounds are interleaved (bare, posttrain, bare, posttrain, ...), so a
change in the machine's load hits both alike. Timed: ``trainer.train()`` on the bare side,
the recipe's own ``timings["train_s"]`` on the posttrain side (the same call, with
posttrain's callbacks inside). Target: at most 1.10x.

    .venv/bin/python benchmarks/trl_overhead.py                 # 3 rounds, 20 steps
    .venv/bin/python benchmarks/trl_overhead.py --write         # also update RESULTS.md
"""

from __future__ import annotations

import argparse
import dataclasses
import os
import platform
import statistics
import sys
import tempfile
import time

os.environ.setdefault("HF_HUB_OFFLINE", "1")
os.environ.setdefault("TRANSFORMERS_OFFLINE", "1")
os.environ.setdefault("TOKENIZERS_PARALLELISM", "false")
os.environ.pop("POSTTRAIN_SERVER", None)

from results_md import write_section  # benchmarks/ is the script's folder

from posttrain.data.prepare import prepare_data
from posttrain.envs import get_env
from posttrain.train.grpo.run import run_grpo
from posttrain.train.grpo.settings import GRPOSettings, grpo_config_kwargs

SECTION = "Overhead over plain TRL"
TARGET = 1.10


def bare_trl(settings: GRPOSettings) -> float:
    """Seconds of ``trainer.train()`` for a plain TRL script: no posttrain callbacks."""
    from datasets import Dataset
    from peft import LoraConfig
    from trl import GRPOConfig, GRPOTrainer

    from posttrain.policy.loading import load_policy
    from posttrain.policy.models import LORA_TARGET_MODULES, parameter_count
    from posttrain.train.rewards import RuleReward

    env = get_env(settings.env)
    data = prepare_data(settings.data_config(), env)
    policy = load_policy(settings.base_model, show_progress=False)
    rate, _ = settings.resolved_learning_rate(parameter_count(policy.model))
    dataset = Dataset.from_list([{"prompt": env.messages_for(r["prompt"]),
                                  "prompt_text": r["prompt"],
                                  "scenario_id": str(r["scenario_id"])} for r in data.train])
    with tempfile.TemporaryDirectory() as output:
        config = GRPOConfig(**grpo_config_kwargs(settings, rate, output, policy.device))
        trainer = GRPOTrainer(
            model=policy.model, reward_funcs=RuleReward(env), args=config,
            train_dataset=dataset, processing_class=policy.tokenizer,
            peft_config=LoraConfig(task_type="CAUSAL_LM", r=settings.lora_rank,
                                   lora_alpha=settings.lora_alpha, lora_dropout=0.0,
                                   target_modules=list(LORA_TARGET_MODULES),
                                   # the starter's copy circuit stays frozen, as in the recipe
                                   exclude_modules=list(getattr(
                                       policy.model.config, "posttrain_frozen_modules", None)
                                       or []) or None),
        )
        started = time.perf_counter()
        trainer.train()
        return time.perf_counter() - started


def through_posttrain(settings: GRPOSettings, runs_dir: str, index: int) -> float:
    """Seconds of the recipe's training phase (``timings["train_s"]``)."""
    chosen = dataclasses.replace(settings, run_name=f"overhead-{index}", runs_dir=runs_dir)
    summary = run_grpo(chosen, say=lambda line: None)
    return float(summary["timings"]["train_s"])


def main() -> int:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--rounds", type=int, default=3, help="interleaved rounds")
    parser.add_argument("--steps", type=int, default=20, help="GRPO steps per run")
    parser.add_argument("--base-model", default="starter", help="the model both sides train")
    parser.add_argument("--write", action="store_true", help="update benchmarks/RESULTS.md")
    args = parser.parse_args()
    settings = dataclasses.replace(GRPOSettings(), steps=args.steps, base_model=args.base_model)
    load = ", ".join(f"{value:.1f}" for value in os.getloadavg())
    bare, ours = [], []
    with tempfile.TemporaryDirectory(prefix="posttrain-overhead-") as runs_dir:
        for index in range(args.rounds):
            bare.append(bare_trl(settings))
            ours.append(through_posttrain(settings, runs_dir, index))
            print(f"round {index + 1}: bare TRL {bare[-1]:.1f} s, posttrain {ours[-1]:.1f} s",
                  file=sys.stderr, flush=True)
    ratio = statistics.median(ours) / statistics.median(bare)
    command = ("python benchmarks/trl_overhead.py"
               + (f" --rounds {args.rounds}" if args.rounds != 3 else "")
               + (f" --steps {args.steps}" if args.steps != 20 else "")
               + (f" --base-model {args.base_model}" if args.base_model != "starter" else ""))
    section = "\n".join([
        f"## {SECTION}", "",
        f"Command: `{command}`. Machine: {platform.machine()}, {os.cpu_count()} CPU cores "
        f"(load average {load} at the start), no GPU; Python {platform.python_version()}; "
        f"{time.strftime('%Y-%m-%d')}. GRPO on `{args.base_model}`, {args.steps} steps at the "
        f"recipe's defaults (monitor every {settings.monitor_every} steps), {args.rounds} "
        "interleaved rounds, medians. The bare side is a plain TRL script with the same "
        "model, train prompts, reward and GRPOConfig values and no posttrain callbacks.", "",
        "| side | training phase, median | per round | ratio |",
        "|---|---|---|---|",
        f"| bare TRL `GRPOTrainer` | {statistics.median(bare):.1f} s | "
        f"{', '.join(f'{v:.1f}' for v in bare)} s | 1.00 |",
        f"| `posttrain grpo` (store, console, signal watch, hack monitor) | "
        f"{statistics.median(ours):.1f} s | {', '.join(f'{v:.1f}' for v in ours)} s | "
        f"**{ratio:.2f}** |", "",
        f"Target: at most {TARGET:.2f}x; {'met' if ratio <= TARGET else 'NOT met'}.", "",
    ])
    print(section)
    if args.write:
        write_section(SECTION, section)
    return 0


if __name__ == "__main__":
    sys.exit(main())
