"""Primitives-service overhead: the same work through HTTP and in-process, on ``starter``.

Two measurements, each the median of ``--runs`` repetitions, the two sides alternating so
that load from other jobs hits both alike:

- **train step**: ``forward_backward`` (``importance_sampling``, 32 datums: 8 refund
  prompts x 4 sampled replies) then ``optim_step`` (AdamW). In-process is
  ``LoraModel.forward_backward`` + ``optim_step`` on a parsed request, the service's own
  compute with nothing around it; HTTP is the client submitting both operations and
  waiting for both results (JSON, validation, the run's queue, the compute thread,
  long-polling).
- **sample**: one prompt, 8 samples x 48 tokens, seeded, temperature 1. Direct is
  ``LoraModel.sample`` on a parsed request (the project's ``Sampler`` on the run's
  sampler model); HTTP is ``run.sample(...).result()``. The tokens must be identical.

Both sides run with one torch thread (``--torch-threads``; see
``posttrain/service/compute.py`` for why on a shared 2-core machine).

    .venv/bin/python benchmarks/service.py             # 11 runs
    .venv/bin/python benchmarks/service.py --write     # also update RESULTS.md
"""

from __future__ import annotations

import argparse
import os
import platform
import statistics
import sys
import tempfile
import time

from results_md import RESULTS, write_section  # benchmarks/ is the script's folder

SECTION = "Primitives service"
ADAM = {"learning_rate": 1e-4, "beta1": 0.9, "beta2": 0.95, "eps": 1e-8, "weight_decay": 0.0,
        "grad_clip_norm": 1.0}


def _medians(functions: list, runs: int) -> list[tuple[float, list[float]]]:
    """Run each function ``runs`` times (after one warm-up each), rotating the order every
    round; returns ``(median seconds, all seconds)`` per function."""
    for function in functions:
        function()
    times: list[list[float]] = [[] for _ in functions]
    for round_index in range(runs):
        shift = round_index % len(functions)
        for index in list(range(len(functions)))[shift:] + list(range(len(functions)))[:shift]:
            started = time.perf_counter()
            functions[index]()
            times[index].append(time.perf_counter() - started)
    return [(statistics.median(t), t) for t in times]


def measure(base_model: str, runs: int, torch_threads: int) -> dict:
    from posttrain.envs.refund import REFUND_ENV
    from posttrain.envs.refund.prompts import simulate
    from posttrain.policy.sampler import Sampler, SamplingParams
    from posttrain.service.client import AdamParams, ServiceClient
    from posttrain.service.client.rl import forward_backward_payload, rl_datum
    from posttrain.service.engine import Engine
    from posttrain.service.engine.requests import LoraSpec
    from posttrain.service.protocols.native import parsing as parse
    from posttrain.service.server import start_server

    state = tempfile.mkdtemp(prefix="posttrain-service-bench-")
    engine = Engine(base_model, state, torch_threads=torch_threads)
    server = start_server(engine, port=0)
    try:
        client = ServiceClient(server.url)
        session = client.create_session()
        run = session.create_run(rank=16, alpha=32, seed=0)
        local = engine.new_lora_model(LoraSpec(16, 32.0, engine.module_names, 0))
        run.save_weights_for_sampler(0)
        local.save_weights_for_sampler(0)

        prompts = [client.tokenize(messages=REFUND_ENV.messages_for(r["prompt"]))
                   for r in simulate(8, seed=3)[:8]]
        data = []
        for index, prompt in enumerate(prompts):
            sample = run.sample(0, prompt, num_samples=4, max_tokens=48, seed=index).result()
            for k, sequence in enumerate(sample["sequences"]):
                data.append(rl_datum(prompt, sequence["tokens"], sequence["logprobs"],
                                     1.0 if k % 2 else -1.0))
        payload = forward_backward_payload(data, "importance_sampling")
        parsed = parse.parse_forward_backward(payload, engine.vocab_size, engine.limits)
        adam = AdamParams(**ADAM)
        parsed_adam = parse.parse_optim_step({"adam_params": ADAM})
        tokens = sum(len(d["model_input"]["token_ids"]) for d in data)

        def step_http() -> None:
            backward = run.forward_backward_payload(payload)
            step = run.optim_step(adam)
            backward.result(), step.result()

        def step_local() -> None:
            engine.compute.run(local.forward_backward, parsed)
            engine.compute.run(local.optim_step, parsed_adam)

        step_timings = _medians([step_local, step_http], runs)

        sample_body = {"version": 0, "prompt": {"token_ids": prompts[0]}, "num_samples": 8,
                       "sampling_params": {"max_tokens": 48, "temperature": 1.0, "seed": 7}}
        parsed_sample = parse.parse_sample(sample_body, engine.vocab_size, engine.limits)
        outputs: dict[str, list] = {}

        def sample_http() -> None:
            result = run.sample(0, prompts[0], num_samples=8, max_tokens=48, temperature=1.0,
                                seed=7).result()
            outputs["http"] = [s["tokens"] for s in result["sequences"]]

        def sample_local() -> None:
            result = engine.compute.run(local.sample, parsed_sample)
            outputs["local"] = [s["tokens"] for s in result["sequences"]]

        versions = iter(range(1, 10_000))

        def tiny_http() -> None:
            run.save_weights_for_sampler(next(versions)).result()

        def tiny_local() -> None:
            engine.compute.run(local.save_weights_for_sampler, next(versions))

        tiny_timings = _medians([tiny_local, tiny_http], runs)

        base_sampler = Sampler(engine.policy)
        params = SamplingParams(temperature=1.0, top_p=1.0, top_k=0, max_new_tokens=48,
                                stop_strings=())

        def sample_base() -> None:
            completions = engine.compute.run(base_sampler.sample_tokens, [prompts[0]] * 8,
                                             [7 + i for i in range(8)], params)
            outputs["base"] = [c.token_ids for c in completions]

        sample_timings = _medians([sample_local, sample_http, sample_base], runs)
        if not outputs["http"] == outputs["local"] == outputs["base"]:
            raise SystemExit("HTTP, direct and base sampling gave different tokens: not the "
                             "same work")
        sampled_tokens = sum(len(t) for t in outputs["http"])
        session.close()
    finally:
        server.stop()
    return {
        "base_model": base_model,
        "parameters": engine.capabilities()["base_model"]["parameters"],
        "runs": runs,
        "torch_threads": torch_threads,
        "datums": len(data),
        "tokens": tokens,
        "sampled_tokens": sampled_tokens,
        "step": step_timings,
        "sample": sample_timings,
        "tiny": tiny_timings,
    }


def _overhead(local: float, http: float) -> str:
    return f"{100 * (http - local) / local:+.1f}%"


def _paired_overhead(local_all: list[float], http_all: list[float]) -> str:
    """Median over rounds of (HTTP - in-process) / in-process, the two timed back to back:
    steadier than comparing the medians when other jobs load the machine unevenly."""
    ratios = [(h - loc) / loc for loc, h in zip(local_all, http_all, strict=True)]
    return f"{100 * statistics.median(ratios):+.1f}%"


def format_section(result: dict, command: str, load: str) -> str:
    (step_local, step_local_all), (step_http, step_http_all) = result["step"]
    (sample_local, sample_local_all), (sample_http, sample_http_all), (sample_base, _) = (
        result["sample"])
    (tiny_local, tiny_local_all), (tiny_http, tiny_http_all) = result["tiny"]

    def spread(*lists: list[float]) -> str:
        values = [v for values in lists for v in values]
        return f"{min(values):.3f}-{max(values):.3f}"

    return "\n".join([
        f"## {SECTION}",
        "",
        f"Command: `{command}`. Machine: {platform.machine()}, {os.cpu_count()} CPU cores "
        f"shared with other jobs (load average {load} at the start), no GPU; base model "
        f"`{result['base_model']}` ({result['parameters']:,} parameters), LoRA rank 16 on every "
        f"linear layer, float32, {result['torch_threads']} torch thread(s). Median of "
        f"{result['runs']} runs per side, the order rotating every round.",
        "",
        "| work | in-process (s) | through HTTP (s) | overhead of the medians | "
        "median paired overhead | range of all runs (s) |",
        "|---|---|---|---|---|---|",
        f"| forward_backward + optim_step, {result['datums']} datums / {result['tokens']} "
        f"tokens | {step_local:.3f} | {step_http:.3f} | {_overhead(step_local, step_http)} "
        f"| {_paired_overhead(step_local_all, step_http_all)} "
        f"| {spread(step_local_all, step_http_all)} |",
        f"| sample 8 x up to 48 tokens ({result['sampled_tokens']} sampled) | "
        f"{sample_local:.3f} | {sample_http:.3f} | {_overhead(sample_local, sample_http)} "
        f"| {_paired_overhead(sample_local_all, sample_http_all)} "
        f"| {spread(sample_local_all, sample_http_all)} |",
        f"| save_weights_for_sampler (no real compute: the fixed cost of one operation) | "
        f"{tiny_local:.4f} | {tiny_http:.4f} | +{1000 * (tiny_http - tiny_local):.1f} ms | | "
        f"{spread(tiny_local_all, tiny_http_all)} |",
        "",
        "In-process is the service's own compute called directly (no JSON, no queue); "
        "HTTP is the Python client against the server on 127.0.0.1 (submit, then "
        "long-poll the result). Target: overhead under 10%. HTTP, direct and base-model "
        "sampling return identical tokens (checked; a fresh LoRA adds exactly zero).",
        f"For reference, the same sample from the base model with no adapter (the project's "
        f"`Sampler` on the plain policy) takes {sample_base:.3f} s: the unmerged LoRA layers "
        f"cost {_overhead(sample_base, sample_local)} on a model this small.",
        "",
    ])


def main() -> int:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--base-model", default="starter", help="model the server loads")
    parser.add_argument("--runs", type=int, default=11, help="repetitions per side")
    parser.add_argument("--torch-threads", type=int, default=1, help="torch intra-op threads")
    parser.add_argument("--write", action="store_true", help="update benchmarks/RESULTS.md")
    args = parser.parse_args()
    load = ", ".join(f"{value:.1f}" for value in os.getloadavg())
    result = measure(args.base_model, args.runs, args.torch_threads)
    command = "python benchmarks/service.py" + " ".join(
        [""] + [a for a in sys.argv[1:] if a != "--write"])
    section = format_section(result, command.strip(), load)
    print(section)
    if args.write:
        write_section(SECTION, section)
        print(f"wrote the {SECTION!r} section of {RESULTS}")
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
