"""Data parallel: a recipe launched by torchrun (or ``accelerate launch --multi_gpu``).

TRL and accelerate do the distribution of training; this module does the rest of a
recipe's part (facts from the project's torchrun spike on TRL 1.16):

- the process group is created here, before any TRL config exists, with a timeout of
  our choosing (under ``use_cpu`` TRL's ``ddp_timeout`` is ignored and gloo would wait 30
  minutes for a stuck rank);
- only the main process (rank 0) writes the run folder, the run store and the console;
  the other ranks write into a scratch folder nobody reads;
- the holdout evaluations are split across the ranks (prompt ``i`` on rank ``i % world``)
  and gathered back in the holdout's order, so every rank holds the same rows and the
  verdict is the one a single process would compute for the same seeds (each sample's
  seed depends on its prompt and index, not on which process drew it);
- an error on one rank before training reaches all of them (``agree``), so no rank waits
  at a collective for a peer that already stopped.
"""

from __future__ import annotations

import os
from dataclasses import dataclass
from datetime import timedelta
from typing import Any

from posttrain.errors import PosttrainError

#: how long a rank waits at a collective for a slower peer (the hack monitor samples the
#: holdout on rank 0 while the others wait)
COLLECTIVE_TIMEOUT = timedelta(hours=2)
#: set by ``accelerate launch`` in every process it starts (accelerate/utils/launch.py)
ACCELERATE_LAUNCH_VARIABLES = ("ACCELERATE_MIXED_PRECISION", "ACCELERATE_DYNAMO_BACKEND",
                               "ACCELERATE_USE_CPU")


@dataclass(frozen=True)
class Ranks:
    """This process's place in the launch."""

    world: int = 1
    rank: int = 0

    @property
    def is_main(self) -> bool:
        return self.rank == 0

    @property
    def distributed(self) -> bool:
        return self.world > 1


def current_ranks() -> Ranks:
    """The launch as the launcher's environment describes it (one process when unset)."""
    try:
        world = int(os.environ.get("WORLD_SIZE", "1"))
        rank = int(os.environ.get("RANK", "0"))
    except ValueError:
        raise PosttrainError("WORLD_SIZE and RANK must be whole numbers (set by torchrun)") \
            from None
    if world < 1 or not 0 <= rank < world:
        raise PosttrainError(f"RANK {rank} does not fit WORLD_SIZE {world}")
    return Ranks(world, rank)


def launcher() -> str:
    """Which launcher started this process, for the run's config. ``accelerate launch
    --multi_gpu`` starts its processes through torchrun, so its own variables go first."""
    if any(os.environ.get(key) for key in ACCELERATE_LAUNCH_VARIABLES):
        return "accelerate"
    if os.environ.get("TORCHELASTIC_RUN_ID"):
        return "torchrun"
    return "one process"


def start(ranks: Ranks) -> None:
    """Create the process group (gloo on CPU, nccl on GPUs) when launched as several."""
    if not ranks.distributed:
        return
    import torch
    import torch.distributed as dist

    if not dist.is_initialized():
        # TRL's config then finds this group and keeps it (with our timeout); on a CPU the
        # recipes' configs set use_cpu=True, without which accelerate would turn a torchrun
        # launch into several independent single-process runs
        backend = "nccl" if torch.cuda.is_available() else "gloo"
        dist.init_process_group(backend=backend, timeout=COLLECTIVE_TIMEOUT)


def agree(ranks: Ranks, error: BaseException | None) -> None:
    """Every rank reaches this with its own error or None; if any rank failed, all raise
    (the failing rank its own error, the others a ``PosttrainError`` naming it)."""
    if not ranks.distributed:
        if error is not None:
            raise error
        return
    import torch.distributed as dist

    reports: list[Any] = [None] * ranks.world
    dist.all_gather_object(reports, None if error is None else f"{error}")
    if error is not None:
        raise error
    failed = [(rank, text) for rank, text in enumerate(reports) if text is not None]
    if failed:
        rank, text = failed[0]
        raise PosttrainError(f"rank {rank} stopped: {text}")


def all_true(flag: bool, ranks: Ranks) -> bool:
    """True on every rank when ``flag`` is true on every rank (a decision every process
    must take the same way, such as ending training)."""
    if not ranks.distributed:
        return flag
    import torch.distributed as dist

    flags: list[Any] = [None] * ranks.world
    dist.all_gather_object(flags, bool(flag))
    return all(flags)


def barrier(ranks: Ranks) -> None:
    if ranks.distributed:
        import torch.distributed as dist

        dist.barrier()


def shard(items: list[Any], ranks: Ranks) -> list[Any]:
    """This rank's share: item ``i`` goes to rank ``i % world``."""
    return items[ranks.rank::ranks.world]


def gather_in_order(mine: list[list[Any]], count: int, ranks: Ranks) -> list[Any]:
    """Every rank's groups back in the order of the ``count`` items they came from.
    ``mine[j]`` is the group of this rank's ``j``-th item (``shard``'s order)."""
    if not ranks.distributed:
        return [entry for group in mine for entry in group]
    import torch.distributed as dist

    everyone: list[Any] = [None] * ranks.world
    dist.all_gather_object(everyone, mine)
    ordered: list[Any] = []
    for index in range(count):
        ordered.extend(everyone[index % ranks.world][index // ranks.world])
    return ordered


def gather_all(mine: list[Any], ranks: Ranks) -> list[Any]:
    """Every rank's items, rank 0's first (callers that need another order sort them)."""
    if not ranks.distributed:
        return list(mine)
    import torch.distributed as dist

    everyone: list[Any] = [None] * ranks.world
    dist.all_gather_object(everyone, mine)
    return [item for items in everyone for item in items]


def trainer_launch(trainer: Any) -> dict[str, Any]:
    """How the trainer itself ran, for the summary: the world size it saw (1 when a launch
    fell apart into independent copies) and accelerate's distributed type (``MULTI_CPU``
    for data parallel on CPUs, ``MULTI_GPU``, ``FSDP``, ``DEEPSPEED``, ``NO``), which shows
    whether an FSDP or DeepSpeed config took effect."""
    accelerator = getattr(trainer, "accelerator", None)
    kind = getattr(getattr(accelerator, "state", None), "distributed_type", None)
    return {"trainer_world_size": trainer.args.world_size,
            "trainer_distributed_type": getattr(kind, "value", None if kind is None else str(kind))}


def sharding_not_applied(distributed_type: str | None) -> str | None:
    """A warning when ``accelerate launch`` was asked for FSDP or DeepSpeed (its launch
    variables say so) but the trainer ran something else: on CPUs accelerate quietly
    trains plain data parallel instead (seen with an FSDP config on this project's CPU)."""
    asked = [name for name, variable in (("FSDP", "ACCELERATE_USE_FSDP"),
                                         ("DeepSpeed", "ACCELERATE_USE_DEEPSPEED"))
             if os.environ.get(variable, "").lower() == "true"]
    if not asked or distributed_type is None or distributed_type.upper().startswith(
            asked[0].upper()):
        return None
    return (f"the accelerate config asked for {asked[0]} but the trainer ran "
            f"{distributed_type} (plain data parallel on CPUs: {asked[0]} needs GPUs)")
