"""A console progress bar for a Hugging Face trainer, with the latest reward beside it.

Training can take minutes; this keeps the terminal honest about where it is. It
uses ``posttrain.progress`` (a rich bar on a terminal, milestone lines in logs).
"""

from __future__ import annotations

from contextlib import ExitStack
from typing import Any

from transformers import TrainerCallback as HFTrainerCallback

from posttrain.progress import progress_bar


class ConsoleProgress(HFTrainerCallback):
    """Shows ``label`` with a bar over ``max_steps`` optimizer steps."""

    def __init__(self, label: str, *, enabled: bool = True) -> None:
        self.label = label
        self.enabled = enabled  # off on every process but the main one of a launch
        self._stack = ExitStack()
        self._update = None

    def on_train_begin(self, args: Any, state: Any, control: Any, **kwargs: Any) -> None:
        self._update = self._stack.enter_context(
            progress_bar(self.label, state.max_steps, enabled=self.enabled))

    def on_step_end(self, args: Any, state: Any, control: Any, **kwargs: Any) -> None:
        if self._update is not None:
            self._update(state.global_step)

    def on_train_end(self, args: Any, state: Any, control: Any, **kwargs: Any) -> None:
        self._stack.close()
        self._update = None
