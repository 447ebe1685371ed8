"""Memory of one ``forward_backward`` call on ``posttrain serve`` by its size in tokens.

The third hostile probe (issue #49) measured memory growing about 95 kB a token and a
published limit of 262,144 tokens a call (about 25 GB); the default
``--max-tokens-per-call`` is now 32,768. This measures what one call at a given size
costs: each size in a fresh process (peak resident memory is per process), the engine on
``--model``, one LoRA run (rank 16), then one ``forward_backward``
(``importance_sampling``) of sequences of ``--sequence`` tokens making up the size, through
the engine's own compute thread. Reported: the process's peak resident memory before the
call (model loaded, run made) and after it, the difference, and the seconds the call took.

    .venv/bin/python benchmarks/serve_call_memory.py                       # starter
    .venv/bin/python benchmarks/serve_call_memory.py --model smollm2 --tokens 4096,32768
"""

from __future__ import annotations

import argparse
import json
import platform
import resource
import subprocess
import sys
import tempfile
import time


def peak_mb() -> float:
    return resource.getrusage(resource.RUSAGE_SELF).ru_maxrss / 1024  # Linux: kB


def one_call(model: str, tokens: int, sequence: int) -> dict:
    """In this process: the engine, a run, one forward_backward of ``tokens`` tokens."""
    import random

    from posttrain.service.client.datums import forward_backward_payload, rl_datum
    from posttrain.service.engine import Engine
    from posttrain.service.engine.requests import Limits, LoraSpec
    from posttrain.service.protocols.native import parsing as parse

    engine = Engine(model, tempfile.mkdtemp(prefix="posttrain-call-memory-"),
                    limits=Limits(max_tokens_per_call=max(tokens, 1),
                                  max_sequence_tokens=sequence + 1, max_body_bytes=1 << 30),
                    torch_threads=None)
    lora = engine.new_lora_model(LoraSpec(16, 32.0, engine.module_names, 0))
    draw = random.Random(0)
    data = []
    left = tokens
    while left > 0:
        length = min(sequence, left)
        left -= length
        ids = [draw.randrange(engine.vocab_size) for _ in range(length + 1)]
        # prompt tokens and the sampled reply, in the wire convention (one token of prompt)
        data.append(rl_datum(ids[:1], ids[1:], [-1.0] * length, 1.0))
    payload = forward_backward_payload(data, "importance_sampling")
    parsed = parse.parse_forward_backward(payload, engine.vocab_size, engine.limits)
    before = peak_mb()
    started = time.perf_counter()
    engine.compute.run(lora.forward_backward, parsed)
    seconds = time.perf_counter() - started
    after = peak_mb()
    engine.shutdown()
    return {"tokens": tokens, "before_mb": round(before), "after_mb": round(after),
            "call_mb": round(after - before), "seconds": round(seconds, 1)}


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--model", default="starter", help="the served base model")
    parser.add_argument("--tokens", default="1024,8192,32768",
                        help="comma-separated call sizes in tokens")
    parser.add_argument("--sequence", type=int, default=1024,
                        help="tokens per sequence (serve's default --max-sequence-tokens)")
    parser.add_argument("--one", type=int, help=argparse.SUPPRESS)  # a child's one size
    args = parser.parse_args()
    if args.one is not None:
        print(json.dumps(one_call(args.model, args.one, args.sequence)))
        return
    print(f"machine: {platform.processor() or platform.machine()}, model {args.model}, "
          f"sequences of {args.sequence} tokens")
    print("| tokens | peak before (MB) | peak after (MB) | the call (MB) | kB a token | s |")
    print("|---|---|---|---|---|---|")
    for size in (int(text) for text in args.tokens.split(",")):
        answer = subprocess.run([sys.executable, __file__, "--model", args.model,
                                 "--sequence", str(args.sequence), "--one", str(size)],
                                capture_output=True, text=True, check=True)
        row = json.loads(answer.stdout.strip().splitlines()[-1])
        per_token = row["call_mb"] * 1024 / size
        print(f"| {size:,} | {row['before_mb']:,} | {row['after_mb']:,} | {row['call_mb']:,} "
              f"| {per_token:.0f} | {row['seconds']} |", flush=True)


if __name__ == "__main__":
    main()
