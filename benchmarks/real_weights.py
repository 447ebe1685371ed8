"""Real weights at the machine's limit: how far an SFT step and a GRPO step on
SmolLM2-135M-Instruct are from what this CPU can do, phase by phase.

First the limits, measured here: the matmul peak (fp32, and bf16, saying whether the CPU
has native bf16: AVX512-BF16 or AMX) and the memory bandwidth (a large copy). Then the
steps, on the model posttrain loads (``--base-model smollm2``, float32 on a CPU) with the
recipes' LoRA (rank 16, alpha 32, posttrain's targets), phase by phase:

- SFT step (8 demonstrations of ``--sft-tokens`` tokens): forward, backward, optimizer;
- GRPO step (``--prompts`` prompts x ``--completions`` completions of up to
  ``--max-new-tokens``): prefill and decode (``generate``), the logprob forward of the
  completions (logits of the completion positions only, ``logits_to_keep``, as TRL's
  GRPOTrainer computes them), backward, optimizer.

Each phase's achieved rate is a share of its limit: FLOP/s of the matmul peak for the
forward, backward and prefill (the usual 2 x parameters FLOP per token forward, the
unembedding counted only where logits are computed, and the input-gradient pass
backward: LoRA trains no base weight, so backward is about one forward more), bytes/s
of the bandwidth for decode (every step reads every weight). Peak resident memory is the
process's. Median of ``--repeats``; a phase is timed with the
same tensors each repeat. This measures the phases on the same shapes the recipes use,
outside TRL's trainers (which add their own bookkeeping: the recipes' whole-step times
are in the README).

    .venv/bin/python benchmarks/real_weights.py            # 3 repeats, about 10 minutes
    .venv/bin/python benchmarks/real_weights.py --write    # also update RESULTS.md
"""

from __future__ import annotations

import argparse
import contextlib
import resource
import statistics
import sys
import time
from collections.abc import Callable
from pathlib import Path

from results_md import cpu_description, write_section  # benchmarks/ is the script's folder

SECTION = "Real weights at the machine's limit"


def cpu_flags() -> set[str]:
    try:
        for line in Path("/proc/cpuinfo").read_text().splitlines():
            key, _, value = line.partition(":")
            if key.strip() == "flags":
                return set(value.split())
    except OSError:
        pass
    return set()


def best_of(repeats: int, work: Callable[[], None]) -> float:
    """The fastest of ``repeats`` runs of ``work``, in seconds (after one warm-up)."""
    work()
    times = []
    for _ in range(repeats):
        began = time.perf_counter()
        work()
        times.append(time.perf_counter() - began)
    return min(times)


def matmul_peak(torch, dtype, size: int = 2048, repeats: int = 5) -> float:
    """FLOP/s of one ``size`` x ``size`` matmul in ``dtype``, the best of ``repeats``."""
    a = torch.randn(size, size).to(dtype)
    b = torch.randn(size, size).to(dtype)
    seconds = best_of(repeats, lambda: torch.matmul(a, b))
    return 2 * size ** 3 / seconds


def bandwidth(torch, megabytes: int = 512, repeats: int = 5) -> float:
    """Bytes/s of a large copy (read once, written once)."""
    elements = megabytes * 2 ** 20 // 4
    source = torch.ones(elements)
    target = torch.empty(elements)
    seconds = best_of(repeats, lambda: target.copy_(source))
    return 2 * elements * 4 / seconds


def peak_resident_gib() -> float:
    return resource.getrusage(resource.RUSAGE_SELF).ru_maxrss / 2 ** 20  # KiB on Linux


def load_lora_model(torch):
    from peft import get_peft_model

    from posttrain.policy.loading import load_policy
    from posttrain.policy.models import lora_config

    policy = load_policy("smollm2", show_progress=False)
    base_parameters = sum(p.numel() for p in policy.model.parameters())
    model = get_peft_model(policy.model, lora_config(policy.model, 16, 32))
    model.train()
    return policy.tokenizer, model, base_parameters


def sft_phases(torch, model, tokens: int, batch: int) -> dict[str, float]:
    """Seconds of one SFT step's forward, backward and optimizer step."""
    ids = torch.randint(100, 40_000, (batch, tokens))
    optimizer = torch.optim.AdamW([p for p in model.parameters() if p.requires_grad], lr=1e-5)
    began = time.perf_counter()
    loss = model(input_ids=ids, labels=ids).loss
    forward = time.perf_counter() - began
    began = time.perf_counter()
    loss.backward()
    backward = time.perf_counter() - began
    began = time.perf_counter()
    optimizer.step()
    optimizer.zero_grad(set_to_none=True)
    step = time.perf_counter() - began
    return {"forward": forward, "backward": backward, "optimizer": step,
            "tokens": float(batch * tokens)}


def grpo_phases(torch, tokenizer, model, prompts: int, completions: int, prompt_tokens: int,
                max_new_tokens: int) -> dict[str, float]:
    """Seconds of one GRPO step's generation (prefill, decode), logprob forward, backward
    and optimizer step, as the recipe's shapes make them."""
    ids = torch.randint(100, 40_000, (prompts * completions, prompt_tokens))
    mask = torch.ones_like(ids)
    model.eval()
    with torch.no_grad():
        began = time.perf_counter()
        model(input_ids=ids, attention_mask=mask)  # prefill alone: the prompt's forward
        prefill = time.perf_counter() - began
        began = time.perf_counter()
        out = model.generate(input_ids=ids, attention_mask=mask, do_sample=True,
                             max_new_tokens=max_new_tokens, min_new_tokens=max_new_tokens,
                             pad_token_id=tokenizer.pad_token_id)
        generate = time.perf_counter() - began
    model.train()
    optimizer = torch.optim.AdamW([p for p in model.parameters() if p.requires_grad], lr=1e-5)
    began = time.perf_counter()
    # as TRL's GRPOTrainer asks for them: logits of the completion positions only
    logits = model(input_ids=out, logits_to_keep=max_new_tokens + 1).logits[:, :-1]
    logprobs = torch.log_softmax(logits.float(), dim=-1).gather(
        -1, out[:, prompt_tokens:].unsqueeze(-1)).squeeze(-1)
    forward = time.perf_counter() - began
    began = time.perf_counter()
    (-logprobs.mean()).backward()
    backward = time.perf_counter() - began
    began = time.perf_counter()
    optimizer.step()
    optimizer.zero_grad(set_to_none=True)
    step = time.perf_counter() - began
    return {"prefill": prefill, "decode": max(generate - prefill, 1e-9),
            "logprob_forward": forward, "backward": backward, "optimizer": step,
            "prompt_tokens": float(ids.numel()),
            "new_tokens": float(prompts * completions * max_new_tokens),
            "decode_steps": float(max_new_tokens), "all_tokens": float(out.numel())}


def main() -> int:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--repeats", type=int, default=3, help="measurements (median)")
    parser.add_argument("--sft-tokens", type=int, default=330, help="tokens per demonstration")
    parser.add_argument("--prompts", type=int, default=4, help="GRPO prompts per step")
    parser.add_argument("--completions", type=int, default=4, help="completions per prompt")
    parser.add_argument("--prompt-tokens", type=int, default=300, help="tokens per prompt")
    parser.add_argument("--max-new-tokens", type=int, default=64, help="tokens per completion")
    parser.add_argument("--bf16", action="store_true",
                        help="run the phases under torch.autocast(bfloat16) (the weights stay "
                        "float32), to see what native bf16 would give; the table says so")
    parser.add_argument("--write", action="store_true", help="update benchmarks/RESULTS.md")
    args = parser.parse_args()

    import torch

    flags = cpu_flags()
    native_bf16 = bool(flags & {"avx512_bf16", "amx_bf16"})
    fp32_peak = matmul_peak(torch, torch.float32)
    bf16_peak = matmul_peak(torch, torch.bfloat16)
    memory = bandwidth(torch)
    print(f"limits: fp32 matmul {fp32_peak / 1e9:.0f} GFLOP/s, bf16 matmul "
          f"{bf16_peak / 1e9:.0f} GFLOP/s ({'native' if native_bf16 else 'no native'} bf16), "
          f"copy {memory / 1e9:.1f} GB/s, torch threads {torch.get_num_threads()}", flush=True)

    tokenizer, model, parameters = load_lora_model(torch)
    weight_bytes = parameters * 4
    sft, grpo = [], []
    autocast = (torch.autocast("cpu", dtype=torch.bfloat16) if args.bf16
                else contextlib.nullcontext())
    for repeat in range(args.repeats):
        with autocast:
            sft.append(sft_phases(torch, model, args.sft_tokens, 8))
            grpo.append(grpo_phases(torch, tokenizer, model, args.prompts, args.completions,
                                    args.prompt_tokens, args.max_new_tokens))
        print(f"repeat {repeat + 1}: sft " + ", ".join(
            f"{k} {v:.2f}s" for k, v in sft[-1].items() if k != "tokens")
            + "; grpo " + ", ".join(f"{k} {v:.2f}s" for k, v in grpo[-1].items()
                                    if not k.endswith(("tokens", "steps"))), flush=True)

    def median(rows: list[dict[str, float]], key: str) -> float:
        return statistics.median(row[key] for row in rows)

    flop_per_token = 2 * parameters
    lines = []

    def row(step: str, phase: str, seconds: float, rate: float, limit: float, unit: str) -> None:
        lines.append(f"| {step} | {phase} | {seconds:.2f} | {rate / 1e9:.1f} {unit} | "
                     f"{rate / limit:.0%} |")

    peak = bf16_peak if args.bf16 else fp32_peak
    tokens = sft[0]["tokens"]
    row("SFT", "forward", median(sft, "forward"), flop_per_token * tokens
        / median(sft, "forward"), peak, "GFLOP/s")
    row("SFT", "backward", median(sft, "backward"), flop_per_token * tokens
        / median(sft, "backward"), peak, "GFLOP/s")
    lines.append(f"| SFT | optimizer | {median(sft, 'optimizer'):.2f} | – | – |")
    g = grpo[0]
    row("GRPO", "prefill", median(grpo, "prefill"), flop_per_token * g["prompt_tokens"]
        / median(grpo, "prefill"), peak, "GFLOP/s")
    row("GRPO", "decode", median(grpo, "decode"), weight_bytes * g["decode_steps"]
        / median(grpo, "decode"), memory, "GB/s")
    # the unembedding (tied to the embedding) runs only on the kept completion positions
    head = 2 * model.get_input_embeddings().weight.numel()
    kept = args.prompts * args.completions * (args.max_new_tokens + 1)
    logprob_flop = (flop_per_token - head) * g["all_tokens"] + head * kept
    row("GRPO", "logprob forward", median(grpo, "logprob_forward"),
        logprob_flop / median(grpo, "logprob_forward"), peak, "GFLOP/s")
    row("GRPO", "backward", median(grpo, "backward"), logprob_flop
        / median(grpo, "backward"), peak, "GFLOP/s")
    lines.append(f"| GRPO | optimizer | {median(grpo, 'optimizer'):.2f} | – | – |")
    sft_total = sum(median(sft, key) for key in ("forward", "backward", "optimizer"))
    grpo_total = sum(median(grpo, key) for key in ("prefill", "decode", "logprob_forward",
                                                   "backward", "optimizer"))
    command = (f".venv/bin/python benchmarks/real_weights.py --repeats {args.repeats} "
               f"--sft-tokens {args.sft_tokens} --prompts {args.prompts} --completions "
               f"{args.completions} --prompt-tokens {args.prompt_tokens} --max-new-tokens "
               f"{args.max_new_tokens}" + (" --bf16" if args.bf16 else ""))
    flag_list = ", ".join(sorted(flags & {"avx2", "avx512f", "avx512_bf16", "amx_bf16",
                                          "amx_tile", "fma"})) or "none of note"
    title = SECTION + (" (bf16 autocast)" if args.bf16 else "")
    section = "\n".join([
        f"## {title}", "",
        f"SmolLM2-135M-Instruct ({parameters / 1e6:.1f}M parameters, float32 weights"
        f"{', phases under bf16 autocast: shares are of the bf16 peak' if args.bf16 else ''}"
        f", LoRA r16) on "
        f"{cpu_description()}; CPU flags: {flag_list}; torch {torch.__version__}, "
        f"{torch.get_num_threads()} threads. Limits measured here: fp32 matmul "
        f"{fp32_peak / 1e9:.0f} GFLOP/s, bf16 matmul {bf16_peak / 1e9:.0f} GFLOP/s "
        f"({'native' if native_bf16 else 'no native'} bf16), memory copy "
        f"{memory / 1e9:.1f} GB/s. Phases timed outside TRL on the recipes' shapes "
        f"(SFT: 8 x {args.sft_tokens} tokens; GRPO: {args.prompts} x {args.completions} "
        f"completions of {args.max_new_tokens} tokens after {args.prompt_tokens}-token "
        f"prompts), median of {args.repeats}. `{command}`", "",
        "| step | phase | seconds | achieved | share of the limit |", "|---|---|---|---|---|",
        *lines, "",
        f"Totals: SFT step {sft_total:.1f} s, GRPO step {grpo_total:.1f} s; peak resident "
        f"memory of the process {peak_resident_gib():.1f} GiB.", ""])
    print(section)
    if args.write:
        write_section(title, section)
    return 0


if __name__ == "__main__":
    sys.exit(main())
