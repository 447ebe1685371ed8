"""GRPO on an environment (the refund rule by default), entirely over the primitives service.

What ``posttrain primitives-demo`` runs. The server (in this process on a free port, or
the one at ``--url``) owns the model; this side owns everything else:

1. prompts from the environment's writer (or ``--prompts-file``), split into train and
   a stratified holdout;
2. ``rl.run_rl_loop`` with ``algorithms.grpo``: each cycle saves sampler version N,
   samples a group per training prompt from N, scores each completion with the
   environment's rule (``env.score`` on the detokenised reply), sends group-mean advantages
   with the ``importance_sampling`` loss, then one explicit AdamW step. Groups whose
   samples all score the same are skipped and counted (the seed's build_loss would stop
   the run; a real run meets them often on a partly trained policy);
3. after the last cycle, the holdout is sampled from version 0 (the weights before any
   update: versions are immutable, so it is still there) and from the final version with
   the same seeds, graded into rows, and compared with ``posttrain.score.delta``: pass@1
   before and after with intervals, the paired delta and its verdict;
4. save_state -> export_lora -> finish -> close.

Every cycle also prints the logprob parity between sampler and trainer.
"""

from __future__ import annotations

import json
import tempfile
import time
from collections.abc import Callable
from dataclasses import asdict, dataclass, field
from pathlib import Path
from typing import Any

from posttrain.agents import stable_seed
from posttrain.data.prompts import load_prompts, split_holdout_stratified
from posttrain.envs import DEFAULT_ENV, get_env
from posttrain.envs.base import (
    Env,
    PromptWriter,
    case_of,
    require_hook,
    require_single_turn,
)
from posttrain.score.delta import delta
from posttrain.score.passat import pass_at
from posttrain.score.rows import grade_replies, save_rows
from posttrain.score.rubric import rule_rubric
from posttrain.service.client import Run, ServiceClient, algorithms
from posttrain.service.client.rl import LoopSettings, run_rl_loop
from posttrain.service.engine import Engine
from posttrain.service.server import start_server

STOP = ("</tool_call>",)  # the wire format's end of a call (posttrain.envs.wire)


@dataclass
class DemoSettings:
    """Knobs of the demo; the defaults fit a few minutes on 2 CPU cores with ``starter``."""

    base_model: str = field(default="starter", metadata={"help": "base model the server loads"})
    url: str | None = field(
        default=None, metadata={"help": "use a running server instead of starting one here"}
    )
    token: str | None = field(default=None, metadata={"help": "bearer token for --url"})
    env: str = field(default=DEFAULT_ENV,
                     metadata={"help": "environment name or module:attribute"})
    prompts: int = field(default=200, metadata={"help": "template situations to write"})
    prompts_file: str | None = field(
        default=None, metadata={"help": "a JSONL prompt set instead of the environment's writer"}
    )
    seed: int = field(default=0, metadata={"help": "data and sampling seed"})
    holdout: float = field(default=0.2, metadata={"help": "share of scenarios held out"})
    eval_prompts: int = field(default=48, metadata={"help": "holdout prompts evaluated"})
    eval_samples: int = field(default=4, metadata={"help": "samples per holdout prompt"})
    eval_temperature: float = field(default=0.8, metadata={"help": "evaluation temperature"})
    eval_top_p: float = field(default=0.95, metadata={"help": "evaluation top-p"})
    cycles: int = field(default=24, metadata={"help": "RL cycles (sample, score, update)"})
    # 8 prompts a cycle at 2e-4 move the 9.1M starter; 4 at 3e-4 (the 2M starter's
    # defaults) dropped its no-id group (measured: docs/service.md, "The demo")
    groups_per_cycle: int = field(default=8, metadata={"help": "training prompts per cycle"})
    num_samples: int = field(default=8, metadata={"help": "samples per prompt (the group)"})
    max_tokens: int = field(default=48, metadata={"help": "tokens per sampled reply"})
    # measured on starter (docs/service.md): 8 cycles at 2e-3 read flat and broke tool
    # calls (well_formed fell); 24 at 3e-4 moved (+0.11); 24 at 6e-4 lost with-id
    learning_rate: float = field(default=2e-4, metadata={"help": "AdamW learning rate"})
    lora_rank: int = field(default=16, metadata={"help": "LoRA rank"})
    lora_alpha: float = field(default=32.0, metadata={"help": "LoRA alpha"})
    torch_threads: int | None = field(
        default=1, metadata={"help": "torch threads of the in-process server"}
    )
    out: str | None = field(
        default=None, metadata={"help": "folder for summary.json and the holdout rows"}
    )


def _pick(records: list[dict[str, Any]], count: int) -> list[dict[str, Any]]:
    """``count`` records spread evenly over ``records`` (all of them when fewer)."""
    if count >= len(records):
        return list(records)
    step = len(records) / count
    return [records[int(i * step)] for i in range(count)]


def _evaluate(env: Env, client: ServiceClient, run: Run, version: int,
              eval_requests: list[dict],
              settings: DemoSettings, label: str) -> list[dict[str, Any]]:
    """Graded rows of the holdout sampled from sampler ``version`` (same seeds per prompt)."""
    operations = [
        run.sample(version, request["prompt"]["token_ids"], num_samples=settings.eval_samples,
                   max_tokens=settings.max_tokens, temperature=settings.eval_temperature,
                   top_p=settings.eval_top_p, stop=STOP, seed=request["eval_seed"])
        for request in eval_requests
    ]
    graded_requests, replies = [], []
    for request, operation in zip(eval_requests, operations, strict=True):
        sample = operation.result()
        for index, sequence in enumerate(sample["sequences"]):
            graded_requests.append((request["record"], index, sample["seed"] + index))
            replies.append(client.detokenize(sequence["tokens"]))
    sampling = {"temperature": settings.eval_temperature, "top_p": settings.eval_top_p,
                "max_tokens": settings.max_tokens}
    policy = {"base_model": settings.base_model, "service_run": run.id, "version": version,
              "label": label}
    return grade_replies(env, graded_requests, replies, policy=policy, sampling=sampling)


def run_demo(settings: DemoSettings, say: Callable[[str], None] = print) -> dict[str, Any]:
    """Run the demo; returns the summary (cycles, pass@1 before/after, delta)."""
    require_single_turn(get_env(settings.env), "the primitives demo")  # before a server starts
    started = time.monotonic()
    server = None
    if settings.url is None:
        say(f"loading {settings.base_model} into an in-process server ...")
        state_dir = Path(settings.out or tempfile.mkdtemp(prefix="posttrain-demo-")) / "service"
        engine = Engine(settings.base_model, state_dir, torch_threads=settings.torch_threads)
        server = start_server(engine, port=0)
        url = server.url
    else:
        url = settings.url
    try:
        client = ServiceClient(url, settings.token)
        return _demo(client, settings, say, started)
    finally:
        if server is not None:
            server.stop()


def _demo(client: ServiceClient, settings: DemoSettings, say: Callable[[str], None],
          started: float) -> dict[str, Any]:
    caps = client.capabilities()
    say(f"server {client.url}: {caps['base_model']['name']} "
        f"({caps['base_model']['parameters']:,} parameters), losses: {', '.join(caps['losses'])}")
    env = get_env(settings.env)
    if settings.prompts_file:
        records = load_prompts(settings.prompts_file, env=env)
    else:
        writer = require_hook(env, PromptWriter, "writes no prompts", "give --prompts-file")
        records = writer.write_prompts(settings.prompts, seed=settings.seed)
    train, holdout = split_holdout_stratified(records, settings.holdout)
    evaluated = _pick(holdout, settings.eval_prompts)

    def request_for(record: dict[str, Any]) -> dict[str, Any]:
        ids = client.tokenize(messages=env.messages_for(record["prompt"]))
        return {"prompt": {"token_ids": ids}, "record": record,
                "case": case_of(env, record),
                "eval_seed": stable_seed("primitives-demo", settings.seed, record["prompt"])}

    eval_requests = [request_for(record) for record in evaluated]
    order = sorted(range(len(train)), key=lambda i: stable_seed(settings.seed, i))
    cache: dict[int, dict[str, Any]] = {}

    def requests_of(cycle: int) -> list[dict[str, Any]]:
        picked = [order[(cycle * settings.groups_per_cycle + i) % len(order)]
                  for i in range(settings.groups_per_cycle)]
        return [cache.setdefault(i, request_for(train[i])) for i in picked]

    # the same reward pipeline as posttrain grpo: the environment's rule as a rubric
    rubric = rule_rubric(env)

    def reward(tokens: list[int], request: dict[str, Any]) -> float:
        return rubric.score(client.detokenize(tokens), request["case"])

    loop = LoopSettings(
        cycles=settings.cycles, num_samples=settings.num_samples,
        # rollouts sample like the evaluation (as posttrain grpo's do): at 1.0 the
        # starter rarely copies an id right, and the groups compare two failures
        max_tokens=settings.max_tokens, temperature=settings.eval_temperature,
        top_p=settings.eval_top_p, stop=STOP,
        seed=settings.seed, lora_rank=settings.lora_rank, lora_alpha=settings.lora_alpha,
        learning_rate=settings.learning_rate, beta1=0.9, beta2=0.95, eps=1e-8,
        weight_decay=0.0, grad_clip_norm=1.0, skip_uniform_groups=True,
        checkpoint_name="primitives-demo",
    )
    say(f"{len(train)} train prompts, {len(holdout)} holdout ({len(evaluated)} evaluated x "
        f"{settings.eval_samples}); {settings.cycles} cycles x {settings.groups_per_cycle} "
        f"groups x {settings.num_samples} samples")

    def evaluate(run: Run, final_version: int) -> tuple[list, list]:
        say("evaluating the holdout on version 0 (before) and the final version (after) ...")
        before = _evaluate(env, client, run, 0, eval_requests, settings, "before")
        after = _evaluate(env, client, run, final_version, eval_requests, settings, "after")
        return before, after

    report = run_rl_loop(client, algorithms.grpo(reward), requests_of, loop,
                         on_cycle=lambda cycle: say(cycle.line()), evaluate=evaluate)
    before_rows, after_rows = report.evaluation
    before, after = pass_at(before_rows, seed=settings.seed), pass_at(after_rows,
                                                                       seed=settings.seed)
    comparison = delta(before_rows, after_rows, by="category", seed=settings.seed)
    say("")
    say(f"holdout: before = sampler version 0 (no update), after = version "
        f"{report.final_version} ({settings.cycles} cycles), same prompts and seeds")
    say(comparison.format())
    say(f"adapter: {report.export['path'] if report.export else '-'}  "
        f"(run {report.run_id}, {report.status}); {time.monotonic() - started:.0f} s in all")
    summary = {
        "settings": asdict(settings),
        "run_id": report.run_id,
        "status": report.status,
        "cycles": [asdict(cycle) for cycle in report.cycles],
        "pass_at_1_before": {"value": before.pass_at_1, "ci95": before.ci95},
        "pass_at_1_after": {"value": after.pass_at_1, "ci95": after.ci95},
        "delta": comparison.delta,
        "delta_ci95": comparison.ci95,
        "verdict": comparison.verdict,
        "export": report.export,
        "seconds": time.monotonic() - started,
    }
    if settings.out:
        folder = Path(settings.out)
        folder.mkdir(parents=True, exist_ok=True)
        save_rows(folder / "holdout_before.jsonl", before_rows)
        save_rows(folder / "holdout_after.jsonl", after_rows)
        (folder / "summary.json").write_text(json.dumps(summary, indent=2, default=str) + "\n")
    return summary
