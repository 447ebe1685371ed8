"""What every TRL recipe does around ``trainer.train()``: train with transformers' noise
silenced, save the adapter into the run folder, and hand the trained policy back to the
shared flow as a ``TrainOutcome``.

GRPO, DPO and SFT build different trainers (``grpo_trainer``, ``dpo_trainer``,
``sft_trainer``); from ``train()`` on they end the same way, written once here.
"""

from __future__ import annotations

import shutil
import tempfile
import warnings
from collections.abc import Iterator, Mapping, Sequence
from contextlib import contextmanager
from dataclasses import replace
from pathlib import Path
from typing import Any

from posttrain.policy.models import Policy
from posttrain.train.context import RecipeContext, TrainOutcome
from posttrain.train.distributed import trainer_launch
from posttrain.train.fused_head import labelled_positions_only


@contextmanager
def quiet_transformers_warnings() -> Iterator[None]:
    """Silence transformers 5.24's renaming notice for gradient checkpointing, which every
    TRL run prints although posttrain turns checkpointing off (reference/spike.md 9.3),
    and TRL's experimental-feature notices for environment_factory and rollout_func."""
    with warnings.catch_warnings():
        warnings.filterwarnings("ignore", message=".*gradient_checkpointing.*")
        warnings.filterwarnings("ignore", message=".*is_gradient_checkpointing.*")
        # environment_factory is TRL's multi-turn route; its "experimental" notice is
        # printed on every multi-turn run and says nothing the user can act on
        warnings.filterwarnings("ignore", message=".*'environment_factory'.*experimental.*")
        # and rollout_func, posttrain's own rollouts (--rollout posttrain), likewise
        warnings.filterwarnings("ignore", message=".*'rollout_func'.*experimental.*")
        yield


def train_and_save(trainer: Any, context: RecipeContext) -> Policy:
    """Run ``trainer.train()``, save its adapter to the run folder's ``adapter/``; returns
    the trained policy (the context's policy with the trained model and adapter on)."""
    try:
        with quiet_transformers_warnings(), labelled_positions_only():
            trainer.train()
        trainer.model.save_pretrained(str(context.folder.adapter))
    finally:  # also when training fails or a Ctrl-C stops it
        if context.settings.trainer_output_dir(context.folder) is None:
            remove_scratch(Path(trainer.args.output_dir))
    return replace(context.policy, model=trainer.model, adapter=str(context.folder.adapter))


def remove_scratch(folder: Path) -> None:
    """Remove a trainer's scratch folder (save_strategy "no": it holds nothing); left, every
    run would leave an empty posttrain-<recipe>-* folder in the temp folder. Only one the
    recipe made there (``tempfile.mkdtemp(prefix="posttrain-...")``) is touched."""
    if folder.name.startswith("posttrain-") and folder.parent == Path(tempfile.gettempdir()):
        shutil.rmtree(folder, ignore_errors=True)


def trainer_outcome(
    trainer: Any,
    trained: Policy,
    extra: Mapping[str, Any],
    *,
    stop_reason: str | None = None,
    alarms: Sequence[dict[str, Any]] = (),
) -> TrainOutcome:
    """The outcome of a finished (``done``) or alarm-stopped (``stop_reason`` given) TRL run:
    the trainer's log history, the recipe's own summary entries (``extra``) and how the
    trainer itself ran (world size, distributed type)."""
    return TrainOutcome(
        policy=trained,
        status="stopped" if stop_reason else "done",
        stop_reason=stop_reason,
        history=list(trainer.state.log_history),
        alarms=list(alarms),
        extra={**extra, **trainer_launch(trainer)},
    )
