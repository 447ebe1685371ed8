"""The caller's side of RL over the primitives: advantage and datum helpers, and the loop.

The caller owns prompts, rewards, grouping, advantages and the loss payload; the server
owns the model, sampling, weight sync and ordered execution. Each cycle is::

    save_weights_for_sampler(N) -> sample(N) per request -> build_loss(...) per request
        -> forward_backward per payload (gradients accumulate) -> optim_step

and the only algorithm-specific code is ``build_loss(sample, cycle, request, ctx) -> dict``,
which returns a ``forward_backward`` payload (``forward_backward_payload(data, loss)``).
``sample`` is the sample result (``sequences``: tokens, logprobs, stop_reason),
``request`` the caller's request for that group (``{"prompt": {"token_ids"}, ...}`` plus
anything the reward needs), ``ctx`` a ``LoopContext`` (the run, extra logprobs, a teacher,
a place to note rewards).

After the loop: ``save_state -> export_lora -> finish -> close session``. On any failure:
``cancel -> poll until terminal -> close session``, then the error is raised again.

Before any session exists the algorithm is checked against the server's capabilities
(``check_expressible``): a loss the server does not have, a config key it does not take,
or a missing teacher stops the loop there. Nothing is ever replaced by generic GRPO.

Each cycle also reports logprob parity: for every datum that is a sampled sequence, the
mean absolute difference between the sampler's logprobs and the trainer's (from the
``forward_backward`` output, same weights since nothing stepped in between).
"""

from __future__ import annotations

import time
from collections.abc import Callable, Sequence
from dataclasses import dataclass, field
from typing import Any

from posttrain.errors import PosttrainError
from posttrain.score.rubric import all_zero, group_mean_advantages, leave_one_out_advantages
from posttrain.service.client.datums import forward_backward_payload, rl_datum, weighted_datum
from posttrain.service.client.service_client import Run, ServiceClient
from posttrain.service.schema import AdamParams

BuildLoss = Callable[[dict, int, dict, "LoopContext"], dict]


class NoGradientSignal(ValueError):
    """A group whose advantages are all zero: training on it changes nothing."""


class AlgorithmNotExpressible(PosttrainError):
    """The algorithm's loss cannot be sent as this server's primitives; nothing was created."""


# ---------------------------------------------------------------- helpers (pure)
# the advantages (group_mean_advantages, leave_one_out_advantages, all_zero) are the
# reward pipeline's, defined once in posttrain.score.rubric, and the datums and payloads
# (rl_datum, weighted_datum, forward_backward_payload) are in client.datums; both are
# re-exported here


def uniform_group_error(cycle: int, rewards: Sequence[float]) -> NoGradientSignal:
    """The error a ``build_loss`` raises for a group whose rewards are all equal."""
    return NoGradientSignal(
        f"cycle {cycle}: reward is uniform across the group ({rewards[0]:g} for all "
        f"{len(rewards)} samples), no gradient signal"
    )


# ---------------------------------------------------------------- algorithms and their check


@dataclass(frozen=True)
class Algorithm:
    """A ``build_loss`` and the loss it sends, declared up front so it can be checked."""

    name: str
    build_loss: BuildLoss
    loss_function: str
    loss_config: dict[str, float] = field(default_factory=dict)
    needs: tuple[str, ...] = ()  # "teacher", "logprobs"
    skip_uniform_groups: bool = False  # DAPO's dynamic sampling drops them instead of failing
    description: str = ""


def check_expressible(
    algorithm: Algorithm, capabilities: dict[str, Any], *, have_teacher: bool = False
) -> None:
    """Raise ``AlgorithmNotExpressible`` unless the server can run ``algorithm`` as declared."""
    served = capabilities.get("losses", {})
    if algorithm.loss_function not in served:
        raise AlgorithmNotExpressible(
            f"{algorithm.name}: needs loss {algorithm.loss_function!r}, which this server does "
            f"not provide ({', '.join(served)}); stopping before creating a session rather "
            "than substituting another loss"
        )
    allowed = set(served[algorithm.loss_function].get("config_defaults", {}))
    unknown = sorted(set(algorithm.loss_config) - allowed)
    if unknown:
        raise AlgorithmNotExpressible(
            f"{algorithm.name}: loss {algorithm.loss_function!r} takes no config key(s) "
            f"{', '.join(unknown)} (it takes: {', '.join(sorted(allowed)) or 'none'})"
        )
    primitives = capabilities.get("primitives", {})
    required = {"save_weights_for_sampler", "sample", "forward_backward", "optim_step"}
    if "logprobs" in algorithm.needs or "teacher" in algorithm.needs:
        required.add("logprobs")
    missing = sorted(required - set(primitives))
    if missing:
        raise AlgorithmNotExpressible(f"{algorithm.name}: the server lacks {', '.join(missing)}")
    if "teacher" in algorithm.needs and not have_teacher:
        raise AlgorithmNotExpressible(f"{algorithm.name}: needs a teacher (teacher=...)")


# ---------------------------------------------------------------- the loop


Teacher = Callable[[list[list[int]]], list[list[float | None]]]


def teacher_from_run(run: Run, version: int | None = None, timeout_s: float = 600) -> Teacher:
    """A teacher whose logprobs come from another run on a server (``logprobs`` primitive)."""

    def teacher(sequences: list[list[int]]) -> list[list[float | None]]:
        return run.logprobs(sequences, version).result(timeout_s)["logprobs"]

    return teacher


@dataclass
class LoopContext:
    """What ``build_loss`` may use besides its arguments."""

    run: Run
    client: ServiceClient
    teacher: Teacher | None = None
    reference_version: int = 0  # the sampler snapshot taken before the first update
    timeout_s: float = 600.0
    rewards: list[float] = field(default_factory=list)  # noted by build_loss this cycle

    def logprobs(self, sequences: list[list[int]], version: int | None = None) -> list[list]:
        """Per-token logprobs of full sequences from this run (``version`` None = trainer)."""
        return self.run.logprobs(sequences, version).result(self.timeout_s)["logprobs"]

    def note_rewards(self, rewards: Sequence[float]) -> None:
        self.rewards.extend(float(r) for r in rewards)


@dataclass
class LoopSettings:
    """Everything the loop does besides the algorithm; every AdamW value is explicit."""

    cycles: int = field(default=2, metadata={"help": "RL cycles (at least 2)"})
    num_samples: int = field(default=4, metadata={"help": "samples per prompt (the group)"})
    max_tokens: int = field(default=32, metadata={"help": "tokens per sample"})
    temperature: float = field(default=1.0, metadata={"help": "sampling temperature"})
    top_p: float = field(default=1.0, metadata={"help": "nucleus sampling mass"})
    stop: tuple[str, ...] = ()
    seed: int = field(default=0, metadata={"help": "sampling seed of cycle 0"})
    lora_rank: int = field(default=8, metadata={"help": "LoRA rank"})
    lora_alpha: float = field(default=16.0, metadata={"help": "LoRA alpha"})
    lora_seed: int = field(default=0, metadata={"help": "LoRA initialisation seed"})
    learning_rate: float = field(default=1e-4, metadata={"help": "AdamW learning rate"})
    beta1: float = field(default=0.9, metadata={"help": "AdamW beta1"})
    beta2: float = field(default=0.95, metadata={"help": "AdamW beta2"})
    eps: float = field(default=1e-8, metadata={"help": "AdamW eps"})
    weight_decay: float = field(default=0.0, metadata={"help": "AdamW decoupled weight decay"})
    grad_clip_norm: float = field(default=1.0, metadata={"help": "global grad-norm clip (0 off)"})
    skip_uniform_groups: bool = field(
        default=False, metadata={"help": "skip uniform-reward groups instead of failing"}
    )
    checkpoint_name: str | None = "final"
    heartbeat_timeout_s: float = 60.0
    timeout_s: float = 600.0

    def adam(self) -> AdamParams:
        return AdamParams(self.learning_rate, self.beta1, self.beta2, self.eps,
                          self.weight_decay, self.grad_clip_norm)


@dataclass
class CycleReport:
    cycle: int
    groups: int
    skipped_groups: int
    mean_reward: float | None
    loss: float | None
    grad_norm: float | None
    parity_mean_abs_diff: float | None
    parity_tokens: int
    seconds: float

    def line(self) -> str:
        def show(value: float | None, spec: str) -> str:
            return "-" if value is None else format(value, spec)

        return (
            f"cycle {self.cycle}: groups {self.groups - self.skipped_groups}/{self.groups} "
            f"reward {show(self.mean_reward, '.3f')} loss {show(self.loss, '.4f')} "
            f"grad_norm {show(self.grad_norm, '.3f')} logprob parity "
            f"{show(self.parity_mean_abs_diff, '.2e')} ({self.parity_tokens} tokens) "
            f"{self.seconds:.1f}s"
        )


@dataclass
class LoopReport:
    algorithm: str
    run_id: str
    cycles: list[CycleReport]
    final_version: int  # the sampler version holding the trained weights
    state: dict[str, Any] | None
    export: dict[str, Any] | None
    status: str  # the run's final status ("finished")
    evaluation: Any = None  # what ``evaluate`` returned


def _parity(payloads: list[dict], results: list[dict], sampled: dict[tuple, list[float]]):
    """Mean |sampler - trainer| logprob over datums that are sampled sequences."""
    total, count = 0.0, 0
    for payload, result in zip(payloads, results, strict=True):
        for datum, output in zip(payload["data"], result["loss_fn_outputs"], strict=True):
            ids = datum["model_input"]["token_ids"]
            full = (*ids, datum["loss_fn_inputs"]["target_tokens"][-1])
            found = sampled.get(full)
            if found is None:
                continue
            prompt_length, logprobs = found
            trainer = output["logprobs"][prompt_length - 1:]
            for ours, theirs in zip(trainer, logprobs, strict=True):
                total += abs(ours - theirs)
                count += 1
    return (total / count if count else None), count


def run_rl_loop(
    client: ServiceClient,
    algorithm: Algorithm,
    requests: Sequence[dict[str, Any]] | Callable[[int], Sequence[dict[str, Any]]],
    settings: LoopSettings | None = None,
    *,
    teacher: Teacher | None = None,
    on_cycle: Callable[[CycleReport], None] | None = None,
    evaluate: Callable[[Run, int], Any] | None = None,
) -> LoopReport:
    """Run ``algorithm`` for ``settings.cycles`` ordered cycles on a new LoRA run.

    ``requests`` are the groups of each cycle (``{"prompt": {"token_ids": [...]}, ...}``),
    or a function of the cycle returning them. After the last cycle the trained weights
    are saved as sampler version ``cycles`` and ``evaluate(run, cycles)`` (when given) may
    sample from it and from version 0, the weights before training; its return value is
    kept in the report. Then ``save_state -> export_lora -> finish -> close``.

    Raises ``AlgorithmNotExpressible`` before any session when the server cannot run the
    algorithm, ``NoGradientSignal`` for a uniform group (unless skipped), and whatever
    failed otherwise, after cancelling the run and closing the session.
    """
    settings = settings or LoopSettings()
    if settings.cycles < 2:
        raise ValueError(
            f"cycles must be at least 2, got {settings.cycles}: the second cycle is the one "
            "that samples from updated weights"
        )
    check_expressible(algorithm, client.capabilities(), have_teacher=teacher is not None)
    session = client.create_session(settings.heartbeat_timeout_s)
    run: Run | None = None
    try:
        run = session.create_run(rank=settings.lora_rank, alpha=settings.lora_alpha,
                                 seed=settings.lora_seed)
        ctx = LoopContext(run=run, client=client, teacher=teacher, timeout_s=settings.timeout_s)
        reports = []
        for cycle in range(settings.cycles):
            batch = requests(cycle) if callable(requests) else requests
            reports.append(_cycle(run, algorithm, batch, cycle, ctx, settings))
            if on_cycle is not None:
                on_cycle(reports[-1])
        final_version = settings.cycles
        run.save_weights_for_sampler(final_version)
        evaluation = evaluate(run, final_version) if evaluate is not None else None
        state = export = None
        if settings.checkpoint_name:
            state_op = run.save_state(settings.checkpoint_name)
            export_op = run.export_lora(settings.checkpoint_name)
            state = state_op.result(settings.timeout_s)
            export = export_op.result(settings.timeout_s)
        run.finish().result(settings.timeout_s)
        status = run.wait_terminal(settings.timeout_s)["status"]
        session.close()
        return LoopReport(algorithm.name, run.id, reports, final_version, state, export, status,
                          evaluation)
    except BaseException:
        cleanup(session, run)
        raise


def cleanup(session: Any, run: Run | None, timeout_s: float = 120.0) -> None:
    """The failure path: cancel the run, poll until it is terminal, close the session.

    Errors here are swallowed: the original error is the one worth raising.
    """
    try:
        if run is not None:
            run.cancel()
            run.wait_terminal(timeout_s)
    except (PosttrainError, TimeoutError):
        pass
    finally:
        try:
            session.close()
        except PosttrainError:
            pass


def _cycle(run: Run, algorithm: Algorithm, requests: Sequence[dict[str, Any]], cycle: int,
           ctx: LoopContext, settings: LoopSettings) -> CycleReport:
    started = time.monotonic()
    ctx.rewards = []
    run.save_weights_for_sampler(cycle)
    sample_ops = [
        run.sample(cycle, request["prompt"]["token_ids"], num_samples=settings.num_samples,
                   max_tokens=settings.max_tokens, temperature=settings.temperature,
                   top_p=settings.top_p, stop=settings.stop,
                   seed=settings.seed + 100_003 * cycle + 1_009 * index)
        for index, request in enumerate(requests)
    ]
    samples = [op.result(settings.timeout_s) for op in sample_ops]
    sampled: dict[tuple, tuple[int, list[float]]] = {}
    payloads, skipped = [], 0
    for request, sample in zip(requests, samples, strict=True):
        prompt = list(request["prompt"]["token_ids"])
        for sequence in sample["sequences"]:
            sampled[(*prompt, *sequence["tokens"])] = (len(prompt), sequence["logprobs"])
        try:
            payloads.append(algorithm.build_loss(sample, cycle, request, ctx))
        except NoGradientSignal:
            if not (settings.skip_uniform_groups or algorithm.skip_uniform_groups):
                raise
            skipped += 1
    loss = grad_norm = parity = None
    parity_tokens = 0
    if payloads:
        backward_ops = [run.forward_backward_payload(p) for p in payloads]
        step_op = run.optim_step(settings.adam())
        results = [op.result(settings.timeout_s) for op in backward_ops]
        grad_norm = step_op.result(settings.timeout_s)["grad_norm"]
        loss = sum(r["loss"] for r in results)
        parity, parity_tokens = _parity(payloads, results, sampled)
    report = CycleReport(
        cycle=cycle,
        groups=len(requests),
        skipped_groups=skipped,
        mean_reward=sum(ctx.rewards) / len(ctx.rewards) if ctx.rewards else None,
        loss=loss,
        grad_norm=grad_norm,
        parity_mean_abs_diff=parity,
        parity_tokens=parity_tokens,
        seconds=time.monotonic() - started,
    )
    return report


# the caller helpers of the seed's primitives page, importable from here as before
__all__ = [
    "AlgorithmNotExpressible", "LoopContext", "LoopReport", "LoopSettings", "NoGradientSignal",
    "all_zero", "forward_backward_payload", "group_mean_advantages", "leave_one_out_advantages",
    "rl_datum", "run_rl_loop", "weighted_datum",
]
