"""The RESULTS.md section of benchmarks/external_server.sh, from the files it left.

    python benchmarks/external_server_summary.py WORK_FOLDER TRANSFORMERS_VERSION [--write]
"""

from __future__ import annotations

import json
import sys
from pathlib import Path

from results_md import cpu_description, write_section

TITLE = "External server: `posttrain eval --endpoint` against `transformers serve`"


def rows(path: Path) -> list[dict]:
    return [json.loads(line) for line in path.read_text().splitlines() if line.strip()]


def agreement(work: Path, pass_: str) -> str:
    """How far the endpoint's rows match the in-process ones, row by row (same order:
    the same prompts, samples and seeds)."""
    ours = rows(work / f"inprocess-{pass_}.jsonl")
    theirs = rows(work / f"endpoint-{pass_}.jsonl")
    same_reply = sum(a["reply"] == b["reply"] for a, b in zip(ours, theirs, strict=True))
    same_score = sum(a["score"] == b["score"] for a, b in zip(ours, theirs, strict=True))
    calls = sum("<tool_call>" in row["reply"] for row in theirs)
    return (f"{len(theirs)} rows; identical replies {same_reply}, identical scores "
            f"{same_score}; replies with a tool call from the server {calls}")


def section(work: Path, version: str) -> str:
    def text(name: str) -> str:
        return (work / name).read_text().strip()

    lines = [
        f"## {TITLE}", "",
        "Command: `bash benchmarks/external_server.sh --write`. Machine: "
        f"{cpu_description()}, no GPU. Server: Hugging Face `transformers serve` "
        f"(transformers {version}, not written by this project) serving starter-2m from a "
        "local folder on the CPU; posttrain's endpoint agent sends the refund tools, the "
        "system prompt and a seed per sample, over the default holdout (99 prompts x 4 "
        "samples); the same holdout is evaluated in-process and the two are paired.", "",
        "transformers serve copies a request's `temperature` into the model's generation "
        "config but samples only when that config says `do_sample`, which starter-2m's does "
        "not: served as it is, it answers greedily whatever the request says. Sampling, it "
        "keeps transformers' default `top_k` of 50, which posttrain's sampler does not "
        "apply (a first sampled run without the `top_k` fix read 0.56 [0.48, 0.64] against "
        "0.42 [0.35, 0.49] in-process: +0.14 [+0.06, +0.21], the truncated sampler makes "
        "fewer mistakes). Pass 1 pairs the folder as it is with a greedy in-process "
        "evaluation (`--temperature 0`); pass 2 serves a copy whose `generation_config.json` "
        "says `do_sample: true, top_k: 0`, paired with the default sampled evaluation "
        "(temperature 0.8, top-p 0.95).", "",
    ]
    for pass_, label in (("greedy", "Pass 1, greedy"), ("sampling", "Pass 2, sampled")):
        lines += [
            f"### {label}", "",
            f"Endpoint {text(f'endpoint-{pass_}.s')} s, in-process "
            f"{text(f'inprocess-{pass_}.s')} s; {agreement(work, pass_)}.", "",
            "```", text(f"endpoint-{pass_}.txt"), "```", "",
            "`posttrain eval --compare inprocess.jsonl endpoint.jsonl`:", "",
            "```", text(f"compare-{pass_}.txt"), "```", "",
        ]
    return "\n".join(lines)


def main() -> int:
    work, version = Path(sys.argv[1]), sys.argv[2]
    text = section(work, version)
    print(text)
    if sys.argv[3:] == ["--write"]:
        write_section(TITLE, text)
    return 0


if __name__ == "__main__":
    sys.exit(main())
