"""A LoRA run: its ordered queue, its tensors, and its lifecycle.

States::

    active ──finish──> finished
      │ ──cancel───> cancelling ──(running op done)──> cancelled
      │ ──a training op fails──> failed
    dormant (found on disk after a restart) ──resume──> active
    lost    (found on disk, active when the server stopped, never saved)

``finished``, ``cancelled``, ``failed`` and ``lost`` are terminal. A terminal run keeps
its record and operations (they can still be polled) but drops its tensors.

Failures: an operation that can leave the run's tensors half-changed (``forward_backward``,
``optim_step``, ``load_state``) fails the run, and everything queued after it is cancelled,
since it was built on that operation's result. A failing read-only operation (``sample``
of an unknown version, say) fails alone and the run goes on.
"""

from __future__ import annotations

import threading
import time
from collections.abc import Callable
from dataclasses import asdict
from pathlib import Path
from typing import Any

from posttrain.service.engine import state
from posttrain.service.engine.compute import ComputeThread
from posttrain.service.engine.errors import Conflict
from posttrain.service.engine.operations import Operation, OrderedQueue
from posttrain.service.engine.requests import LoraSpec
from posttrain.service.schema import TERMINAL_RUN_STATES

FAILS_THE_RUN = ("forward_backward", "optim_step", "load_state")


class Run:
    """One LoRA run on the shared base model."""

    def __init__(
        self,
        run_id: str,
        session_id: str | None,
        spec: LoraSpec,
        *,
        state_dir: Path,
        base_model: str,
        compute: ComputeThread,
        max_queued: int,
        max_ahead: int,
        created_at: float | None = None,
        public_text: Callable[[str], str] = lambda text: text,
        owner: str | None = None,
    ):
        self.run_id = run_id
        self.owner = owner  # the tokens-file name whose session created it (None: admin)
        self.public_text = public_text  # what a failed operation's message may show
        self.session_id = session_id
        self.spec = spec
        self.state_dir = state_dir
        self.base_model = base_model
        self.created_at = created_at or time.time()
        self.status = "dormant"
        self.status_reason: str | None = None
        self.last_state: dict[str, Any] | None = None  # {"name", "step", "seq"}
        self.model: Any = None  # LoraModel while active
        self.queue: OrderedQueue | None = None
        self._compute = compute
        self._max_queued = max_queued
        self._max_ahead = max_ahead
        self._lock = threading.Lock()

    # ------------------------------------------------------------ lifecycle

    def start(self, model: Any, first_seq: int = 1) -> None:
        """Make the run active on ``model`` (a ``LoraModel``), numbering from ``first_seq``."""
        self.model = model
        self.status, self.status_reason = "active", None
        self.queue = OrderedQueue(
            self.run_id,
            self._execute,
            self._after,
            on_stop=self._on_worker_stop,
            first_seq=first_seq,
            max_queued=self._max_queued,
            max_ahead=self._max_ahead,
            public_text=self.public_text,
        )
        self.save_record()

    @property
    def terminal(self) -> bool:
        return self.status in TERMINAL_RUN_STATES

    def cancel(self, why: str) -> list[Operation]:
        """Cancel queued operations and stop the run; the running one finishes first.

        Returns the cancelled operations. Cancelling a terminal run changes nothing.
        """
        with self._lock:
            if self.terminal or self.status == "cancelling":
                return []
            if self.status == "dormant":
                self.status, self.status_reason = "cancelled", why
                self.save_record()
                return []
            self.status, self.status_reason = "cancelling", why
        # the worker wakes, finishes what it is running, and settles the state on its way out
        return self.queue.close(why, cancel_queued=True) if self.queue else []

    def _on_worker_stop(self) -> None:
        with self._lock:
            if self.status == "cancelling":
                self._end("cancelled", self.status_reason)

    def _end(self, status: str, reason: str | None) -> None:
        self.status, self.status_reason = status, reason
        if self.model is not None:
            self.model.release()  # drops references only; no torch work
            self.model = None
        self.save_record()

    def restore(self, record: dict[str, Any]) -> None:
        """Take the state ``record`` (a ``run.json`` found after a restart) holds: a run that
        was active becomes ``dormant`` (resumable from its last save_state) or ``lost`` (it
        never saved); a terminal one stays as it ended."""
        self.last_state = record.get("last_state")
        self.owner = record.get("owner")  # checked by state.record_problem
        self.status, self.status_reason = record["status"], record.get("status_reason")
        if not self.terminal:
            if self.last_state:
                self.status = "dormant"
                self.status_reason = "the server restarted; resume from the last save_state"
            else:
                self.status = "lost"
                self.status_reason = "the server restarted before the run saved any state"
            self.save_record()

    # ------------------------------------------------------------ submitting

    def submit(self, seq: int | None, primitive: str, fingerprint: str, request: Any):
        """Queue an operation (see ``OrderedQueue.submit``)."""
        if self.queue is None or self.status != "active":
            if self.queue is not None and seq is not None:
                # a retry of something sent before the end is still answered
                return self.queue.submit(seq, primitive, fingerprint, request)
            raise Conflict(
                f"run {self.run_id} is {self.status}"
                + (f" ({self.status_reason})" if self.status_reason else "")
                + "; it accepts no operations"
                + ("; resume it first" if self.status == "dormant" else "")
            )
        return self.queue.submit(seq, primitive, fingerprint, request)

    def refuse(self, seq: int, primitive: str, fingerprint: str, why: str):
        """Record ``seq`` as refused (see ``OrderedQueue.refuse``)."""
        if self.queue is None or self.status != "active":
            raise Conflict(f"run {self.run_id} is {self.status}; it accepts no operations")
        return self.queue.refuse(seq, primitive, fingerprint, why)

    # ------------------------------------------------------------ executing

    def _execute(self, operation: Operation) -> dict[str, Any]:
        if operation.primitive == "finish":
            return {"status": "finished", "step": self.model.step}
        return self._compute.run(self._compute_operation, operation)

    def _compute_operation(self, operation: Operation) -> dict[str, Any]:
        """The torch work of one operation (on the engine's compute thread)."""
        request, model, primitive = operation.request, self.model, operation.primitive
        if model is None:
            raise RuntimeError(f"run {self.run_id} has no model loaded")
        if primitive in ("forward_backward", "forward"):
            return model.forward_backward(request)
        if primitive == "optim_step":
            return model.optim_step(request)
        if primitive == "save_weights_for_sampler":
            return model.save_weights_for_sampler(request.version)
        if primitive == "sample":
            return model.sample(request)
        if primitive == "logprobs":
            return model.logprobs(request)
        if primitive == "save_state":
            return self._save_state(request.name, operation.seq)
        if primitive == "load_state":
            return self._load_state(request.name, request.run_id, request.optimizer)
        if primitive == "export_lora":
            folder = state.run_folder(self.state_dir, self.run_id) / "exports" / request.name
            files = state.export_lora(folder, model)
            return {"path": str(folder), "files": files, "step": model.step}
        raise ValueError(f"unknown primitive {primitive!r}")

    def _save_state(self, name: str, seq: int) -> dict[str, Any]:
        folder = state.run_folder(self.state_dir, self.run_id) / "states" / name
        info = state.save_state(folder, self.model, seq=seq, base_model=self.base_model)
        self.last_state = {"name": name, "step": info["step"], "seq": seq}
        self.save_record()
        return {"name": name, "path": str(folder), "step": info["step"], "seq": seq}

    def _load_state(self, name: str, source_run: str | None, optimizer: bool = True
                    ) -> dict[str, Any]:
        folder = state.run_folder(self.state_dir, source_run or self.run_id) / "states" / name
        info = state.load_state(folder, self.model, base_model=self.base_model,
                                with_optimizer=optimizer)
        return {"name": name, "run_id": source_run or self.run_id, "step": info["step"],
                "optimizer": optimizer}

    def _after(self, operation: Operation) -> bool:
        """Called by the worker after each operation; True stops the worker."""
        if operation.primitive == "finish" and operation.status == "succeeded":
            self.queue.close("the run is finished", cancel_queued=True)
            with self._lock:
                self._end("finished", None)
            return True
        if operation.status == "failed" and operation.primitive in FAILS_THE_RUN:
            why = f"{operation.primitive} (seq {operation.seq}) failed: {operation.error}"
            self.queue.close(why, cancel_queued=True)
            with self._lock:
                if not self.terminal:
                    self._end("failed", why)
            return True
        return self.status == "cancelling"

    # ------------------------------------------------------------ records

    def record(self) -> dict[str, Any]:
        """What ``run.json`` holds."""
        return {
            "run_id": self.run_id,
            "session_id": self.session_id,
            "owner": self.owner,
            "base_model": self.base_model,
            "lora": asdict(self.spec),
            "status": self.status,
            "status_reason": self.status_reason,
            "last_state": self.last_state,
            "created_at": self.created_at,
            "updated_at": time.time(),
        }

    def save_record(self) -> None:
        state.write_run_record(self.state_dir, self.record())

    def describe(self) -> dict[str, Any]:
        """The run's status as the API serves it."""
        info = self.record()
        model = self.model
        if model is not None:
            info["step"] = model.step
            info["sampler_versions"] = list(model.versions)
            info["pending_forward_backward_calls"] = model.pending_backward_calls
        if self.queue is not None:
            info["next_seq"] = self.queue.next_seq
            info["operations"] = self.queue.counts()
            info["waiting_for_seq"] = self.queue.waiting_for()
        info["terminal"] = self.terminal
        return info
