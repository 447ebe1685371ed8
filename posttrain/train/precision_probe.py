"""A short measurement of which trainer precision is faster on this machine for a model.

A CPU flag does not say it: on an AMD EPYC with AVX512-BF16, bf16 autocast made a SmolLM2
step faster; on an Intel Xeon with AMX it made the same GRPO step slower (56-60 s against
33-45 s in float32: scoring 11 s against 4 s, backward 17 s against 7-9 s; issue #48). So
``--precision auto`` on a CPU with native bf16 and a model of 50M parameters or more times
one training pass both ways at the start of the run, and keeps what it measured per
machine, torch build and model in ``<models folder>/precision.json``, so later runs on the
same machine do not pay for it again (about 10 s for SmolLM2 on 2 cores).

The pass: a forward and a backward of the model over a batch the size of a training
micro-batch (4 rows of 256 tokens), the gradient flowing through every layer as it does
to a LoRA adapter (the input embeddings require it; the base weights stay frozen). One
untimed pass each way, then ``REPEATS`` timed ones, alternating; bf16 is chosen when its
median is under ``FASTER`` of float32's (float32 keeps the arithmetic exact otherwise).
"""

from __future__ import annotations

import json
import os
import platform
import statistics
import time
from contextlib import nullcontext
from dataclasses import asdict, dataclass
from pathlib import Path
from typing import Any

REPEATS = 3
ROWS, TOKENS = 4, 256
FASTER = 0.9  # bf16 must save a tenth of the pass to be chosen
CACHE_FILE = "precision.json"


@dataclass(frozen=True)
class PrecisionMeasurement:
    """Seconds of one training pass each way on this machine, and what they chose."""

    bf16_s: float
    fp32_s: float
    cached: bool = False  # read from the cache, not measured by this run

    @property
    def bf16_faster(self) -> bool:
        return self.bf16_s < FASTER * self.fp32_s

    def words(self) -> str:
        where = "measured on this machine before" if self.cached else "measured here"
        return (f"{where}: a training pass {self.bf16_s:.2f} s in bf16 autocast against "
                f"{self.fp32_s:.2f} s in float32")

    def to_dict(self) -> dict[str, Any]:
        return {**asdict(self), "bf16_faster": self.bf16_faster}


def machine_key(model_name: str) -> str:
    """What a measurement holds for: this CPU, its threads, the torch build, the model."""
    import torch

    cpu = _cpu_name()
    return f"{cpu}|threads={torch.get_num_threads()}|torch={torch.__version__}|{model_name}"


def _cpu_name() -> str:
    try:
        for line in Path("/proc/cpuinfo").read_text().splitlines():
            if line.startswith("model name"):
                return line.split(":", 1)[1].strip()
    except OSError:
        pass
    return platform.processor() or platform.machine()


def measure_precision(model: Any, *, cache_dir: Path | None, model_name: str,
                      say: Any = None) -> PrecisionMeasurement:
    """The cached measurement for this machine and model, else a new one (cached when
    ``cache_dir`` is given). ``say`` is told before a measurement starts."""
    key = machine_key(model_name)
    cache = cache_dir / CACHE_FILE if cache_dir is not None else None
    known = _read_cache(cache)
    if key in known:
        entry = known[key]
        return PrecisionMeasurement(float(entry["bf16_s"]), float(entry["fp32_s"]), cached=True)
    if say is not None:
        say("precision: timing one training pass in bf16 autocast and in float32 "
            f"({REPEATS} each; once per machine and model)")
    measured = time_passes(model)
    if cache is not None:
        known[key] = {"bf16_s": measured.bf16_s, "fp32_s": measured.fp32_s,
                      "measured_at": time.strftime("%Y-%m-%dT%H:%M:%S")}
        _write_cache(cache, known)
    return measured


def time_passes(model: Any, rows: int = ROWS, tokens: int = TOKENS) -> PrecisionMeasurement:
    """Median seconds of a forward and backward pass of ``model`` on CPU, each way."""
    import torch

    embed = model.get_input_embeddings()
    vocab = embed.weight.shape[0]
    generator = torch.Generator().manual_seed(0)
    ids = torch.randint(0, vocab, (rows, tokens), generator=generator)
    was_training = model.training
    # frozen base weights, as under a LoRA adapter: the backward computes what flows
    # through the layers, not a gradient for every weight
    trainable = [p for p in model.parameters() if p.requires_grad]
    for parameter in trainable:
        parameter.requires_grad_(False)
    model.train()
    timings: dict[bool, list[float]] = {True: [], False: []}
    try:
        for repeat in range(REPEATS + 1):
            for bf16 in (True, False):
                seconds = _one_pass(model, embed, ids, bf16)
                if repeat:  # the first pass each way warms the kernels up
                    timings[bf16].append(seconds)
    finally:
        for parameter in trainable:
            parameter.requires_grad_(True)
        model.train(was_training)
    return PrecisionMeasurement(statistics.median(timings[True]),
                                statistics.median(timings[False]))


def _one_pass(model: Any, embed: Any, ids: Any, bf16: bool) -> float:
    import torch

    start = time.perf_counter()
    inputs = embed(ids).detach().requires_grad_(True)
    scope = torch.autocast("cpu", dtype=torch.bfloat16) if bf16 else nullcontext()
    with scope:
        logits = model(inputs_embeds=inputs).logits
    logits.float().logsumexp(-1).mean().backward()
    return time.perf_counter() - start


def _read_cache(path: Path | None) -> dict[str, Any]:
    """The cache's entries; a missing or damaged file is an empty cache (it is rebuilt)."""
    if path is None or not path.is_file():
        return {}
    try:
        known = json.loads(path.read_text())
    except (OSError, ValueError):
        return {}
    if not isinstance(known, dict):
        return {}
    return {key: entry for key, entry in known.items()
            if isinstance(entry, dict) and all(
                isinstance(entry.get(name), (int, float)) and entry[name] > 0
                for name in ("bf16_s", "fp32_s"))}


def _write_cache(path: Path, known: dict[str, Any]) -> None:
    try:
        path.parent.mkdir(parents=True, exist_ok=True)
        scratch = path.with_suffix(f".{os.getpid()}.tmp")
        scratch.write_text(json.dumps(known, indent=1, sort_keys=True))
        os.replace(scratch, path)
    except OSError:  # a read-only cache: the measurement still holds for this run
        pass
