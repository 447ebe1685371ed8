"""Operations and the ordered per-run queue: strict sequence order, idempotent retries.

Each primitive a client sends becomes an ``Operation`` with the run's sequence number
``seq``. A run's ``OrderedQueue`` executes its operations one at a time, on its own worker
thread, in increasing ``seq`` with no gaps: operation 5 waits until 4 has arrived and run,
whatever order the HTTP requests landed in (the client numbers them; the server numbers
them when the client does not).

Retries are idempotent by ``seq``: sending ``seq`` 5 again with the same payload (compared
by a SHA-256 of its canonical JSON) returns the original operation, running, queued or
finished, with its stored result; a different payload under a used ``seq`` is a ``Conflict``
(409). Cancelling marks every queued operation ``cancelled``; the one running (torch
cannot be interrupted mid-step) finishes first, then the worker stops.

A ``seq`` can also be *refused* (``OrderedQueue.refuse``): recorded as a failed operation
that never runs and that the worker steps over. A client that numbers every request
itself, the tinker SDK, keeps counting after a request the server turned down; without
the refusal in its slot, everything it sends next would wait for that number forever.
"""

from __future__ import annotations

import hashlib
import json
import threading
import time
import uuid
from collections.abc import Callable
from dataclasses import dataclass, field
from typing import Any

from posttrain.service.engine.errors import Conflict, TooManyRequests
from posttrain.service.schema import TERMINAL_OPERATION_STATES

# exceptions an operation raises because of what the client sent (a loss that overflows,
# an unknown sampler version, a state that does not fit): its error is the caller's to fix
CALLER_ERRORS = (ValueError, LookupError)


def fingerprint(primitive: str, body: dict[str, Any]) -> str:
    """SHA-256 of the primitive and its body without ``seq`` (canonical JSON)."""
    payload = {key: value for key, value in body.items() if key != "seq"}
    text = json.dumps([primitive, payload], sort_keys=True, separators=(",", ":"))
    return hashlib.sha256(text.encode()).hexdigest()


@dataclass
class Operation:
    """One submitted primitive and, once run, its result or error."""

    run_id: str
    seq: int
    primitive: str
    fingerprint: str
    request: Any  # the parsed request (posttrain.service.engine.requests)
    id: str = field(default_factory=lambda: "op-" + uuid.uuid4().hex[:16])
    status: str = "queued"  # queued | running | succeeded | failed | cancelled
    result: dict[str, Any] | None = None
    error: str | None = None
    # who has to act on a failure: "user" (the request) or "server" (a bug, the machine)
    error_category: str | None = None
    refused: bool = False  # refused before running: the worker steps over it
    submitted_at: float = field(default_factory=time.time)
    started_at: float | None = None
    finished_at: float | None = None
    done: threading.Event = field(default_factory=threading.Event, repr=False)

    @property
    def terminal(self) -> bool:
        return self.status in TERMINAL_OPERATION_STATES

    def to_json(self) -> dict[str, Any]:
        """The operation as the API serves it."""
        return {
            "operation_id": self.id,
            "run_id": self.run_id,
            "seq": self.seq,
            "primitive": self.primitive,
            "status": self.status,
            "result": self.result,
            "error": self.error,
            "error_category": self.error_category,
            "submitted_at": self.submitted_at,
            "started_at": self.started_at,
            "finished_at": self.finished_at,
        }

    def finish(self, status: str, result: dict[str, Any] | None = None, error: str | None = None,
               *, error_category: str | None = None):
        self.status, self.result, self.error = status, result, error
        self.error_category = error_category
        self.finished_at = time.time()
        self.done.set()


class OrderedQueue:
    """Runs one run's operations strictly in ``seq`` order on a single worker thread.

    ``execute(operation) -> result dict`` does the work; an exception it raises fails the
    operation with the exception's message. ``after(operation)`` runs after each
    operation (the run uses it to stop on ``finish`` or on a failure that ends the run);
    ``on_stop()`` runs on the worker thread when it exits, whatever the reason.
    ``public_text(message)`` is what a failure's message may show (the engine's hides its
    folders).
    """

    def __init__(
        self,
        run_id: str,
        execute: Callable[[Operation], dict[str, Any]],
        after: Callable[[Operation], bool],
        *,
        on_stop: Callable[[], None] | None = None,
        first_seq: int = 1,
        max_queued: int = 1024,
        max_ahead: int = 1024,
        public_text: Callable[[str], str] = lambda text: text,
    ):
        self.run_id = run_id
        self._execute = execute
        self._public_text = public_text
        self._after = after
        self._on_stop = on_stop
        self._max_queued = max_queued
        self._max_ahead = max_ahead
        self._lock = threading.Condition()
        self._by_seq: dict[int, Operation] = {}
        self._next_seq = first_seq  # the next operation to execute
        self._first_seq = first_seq
        self._closed: str | None = None  # why no more operations are accepted
        self._running: Operation | None = None
        self._worker = threading.Thread(target=self._work, name=f"run-{run_id}", daemon=True)
        self._worker.start()

    # ------------------------------------------------------------ submitting

    def submit(
        self, seq: int | None, primitive: str, body_fingerprint: str, request: Any
    ) -> tuple[Operation, bool]:
        """Queue an operation; returns ``(operation, created)``.

        ``created`` is False for an idempotent retry (the original operation is returned).
        Raises ``Conflict`` for a used ``seq`` with another payload, a ``seq`` already
        executed and forgotten, or a closed queue; ``TooManyRequests`` when full.
        """
        with self._lock:
            if seq is None:
                seq = max(self._by_seq, default=self._next_seq - 1) + 1
                seq = max(seq, self._next_seq)
            existing = self._by_seq.get(seq)
            if existing is not None:
                if existing.fingerprint != body_fingerprint or existing.primitive != primitive:
                    raise Conflict(
                        f"run {self.run_id}: seq {seq} was already used by a different "
                        f"{existing.primitive} request; a retry must resend the same payload, "
                        "new work needs a new sequence number"
                    )
                return existing, False
            if seq < self._first_seq:
                raise Conflict(
                    f"run {self.run_id}: seq {seq} comes before this run's first sequence number "
                    f"{self._first_seq} (it was resumed from a saved state); continue from "
                    f"{self._first_seq}"
                )
            if self._closed is not None:
                raise Conflict(f"run {self.run_id} accepts no more operations: {self._closed}")
            if seq < self._next_seq:
                raise Conflict(f"run {self.run_id}: seq {seq} was already executed")
            if seq >= self._next_seq + self._max_ahead:
                raise Conflict(
                    f"run {self.run_id}: seq {seq} is more than {self._max_ahead} ahead of the "
                    f"next one to execute ({self._next_seq}); send the missing ones first"
                )
            queued = sum(1 for op in self._by_seq.values() if op.status == "queued")
            if queued >= self._max_queued:
                raise TooManyRequests(
                    f"run {self.run_id}: {queued} operations queued (limit {self._max_queued}); "
                    "wait for some to finish"
                )
            operation = Operation(self.run_id, seq, primitive, body_fingerprint, request)
            self._by_seq[seq] = operation
            self._lock.notify_all()
            return operation, True

    def refuse(
        self, seq: int, primitive: str, body_fingerprint: str, why: str
    ) -> tuple[Operation, bool]:
        """Fill ``seq`` with a refusal: a failed operation (category "user") that never runs
        and that the worker steps over, so later numbers do not wait for it. Returns
        ``(operation, created)``; a retry of the same refused request gets the same one.
        Raises ``Conflict`` as ``submit`` does when ``seq`` cannot take it (used by another
        payload, already executed, the queue closed)."""
        with self._lock:
            existing = self._by_seq.get(seq)
            if existing is not None:
                if existing.fingerprint != body_fingerprint or existing.primitive != primitive:
                    raise Conflict(
                        f"run {self.run_id}: seq {seq} was already used by a different "
                        f"{existing.primitive} request"
                    )
                return existing, False
            if seq < self._next_seq:
                raise Conflict(f"run {self.run_id}: seq {seq} was already executed")
            if self._closed is not None:
                raise Conflict(f"run {self.run_id} accepts no more operations: {self._closed}")
            if seq >= self._next_seq + self._max_ahead:
                raise Conflict(
                    f"run {self.run_id}: seq {seq} is more than {self._max_ahead} ahead of the "
                    f"next one to execute ({self._next_seq}); send the missing ones first"
                )
            operation = Operation(self.run_id, seq, primitive, body_fingerprint, None,
                                  refused=True)
            operation.finish("failed", error=why, error_category="user")
            self._by_seq[seq] = operation
            self._lock.notify_all()
            return operation, True

    # ------------------------------------------------------------ state

    @property
    def next_seq(self) -> int:
        """The sequence number that runs next (everything before it has run)."""
        with self._lock:
            return self._next_seq

    def counts(self) -> dict[str, int]:
        """How many operations are in each state."""
        with self._lock:
            counts: dict[str, int] = {}
            for op in self._by_seq.values():
                counts[op.status] = counts.get(op.status, 0) + 1
            return counts

    def forget_finished(self, finished_before: float) -> list[Operation]:
        """Drop executed operations that ended before ``finished_before`` (epoch seconds);
        returns them. A retry of a forgotten ``seq`` then gets a ``Conflict`` ("already
        executed"), never a second execution."""
        with self._lock:
            old = [op for seq, op in self._by_seq.items()
                   if seq < self._next_seq and op.terminal and op.finished_at is not None
                   and op.finished_at < finished_before]
            for op in old:
                del self._by_seq[op.seq]
            return old

    def waiting_for(self) -> int | None:
        """The missing ``seq`` that holds queued later ones back, if any."""
        with self._lock:
            if self._next_seq in self._by_seq or self._running is not None:
                return None
            return self._next_seq if any(s > self._next_seq for s in self._by_seq) else None

    @property
    def idle(self) -> bool:
        """True when the worker has stopped (after close) or has nothing to run."""
        with self._lock:
            return self._running is None and (
                self._closed is not None or self._next_seq not in self._by_seq
            )

    def close(self, why: str, *, cancel_queued: bool) -> list[Operation]:
        """Accept nothing more; with ``cancel_queued``, cancel everything not yet started.

        Returns the cancelled operations. The running one, if any, is left to finish.
        """
        with self._lock:
            if self._closed is None:
                self._closed = why
            cancelled = []
            if cancel_queued:
                for op in self._by_seq.values():
                    if op.status == "queued":
                        op.finish("cancelled", error=f"cancelled: {why}")
                        cancelled.append(op)
            self._lock.notify_all()
            return cancelled

    def join(self, timeout: float | None = None) -> bool:
        """Wait for the worker to stop (only after ``close``); True when it has."""
        self._worker.join(timeout)
        return not self._worker.is_alive()

    # ------------------------------------------------------------ the worker

    def _work(self) -> None:
        try:
            self._loop()
        finally:
            if self._on_stop is not None:
                self._on_stop()

    def _loop(self) -> None:
        while True:
            with self._lock:
                while True:
                    operation = self._by_seq.get(self._next_seq)
                    if operation is not None and operation.status == "queued":
                        break
                    if operation is not None and operation.refused:
                        self._next_seq += 1  # nothing to run; its number is used
                        continue
                    if self._closed is not None:
                        return
                    self._lock.wait()
                operation.status = "running"
                operation.started_at = time.time()
                self._running = operation
            try:
                result = self._execute(operation)
            except Exception as error:  # the operation fails; the worker keeps going
                category = "user" if isinstance(error, CALLER_ERRORS) else "server"
                operation.finish("failed",
                                 error=self._public_text(str(error) or type(error).__name__),
                                 error_category=category)
            else:
                operation.finish("succeeded", result=result)
            operation.request = None  # retries compare fingerprints; the body can go
            stop = self._after(operation)
            with self._lock:
                self._running = None
                self._next_seq += 1
                if stop:
                    return
