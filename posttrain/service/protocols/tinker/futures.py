"""Futures of the tinker wire protocol: what a submission answers at once and
``POST /api/v1/retrieve_future`` long-polls.

Every submission (``create_model``, ``forward_backward``, ``asample``, ...) is answered at
once with ``{"request_id", ...}``; the SDK then polls ``retrieve_future`` until the
result is there. A ``TinkerFuture`` holds a *waiter*, ``wait(seconds) -> Answer | None``,
that blocks up to ``seconds`` for the outcome; two kinds exist:

- ``operation_waiter``: an engine operation (the training primitives, which the run's
  ordered queue executes), its result converted to the tinker shape;
- ``task_waiter``: work run on a daemon thread of its own (model creation, sampling), so
  the HTTP handler returns before the compute thread gets to it.

Submissions are idempotent by a *key* (a model and its ``seq_id``, a sampling session and
its ``seq_id``, a session and its ``model_seq_id``): the SDK retries a submission whose
answer it did not get, and the retry must find the first future, not start the work
twice. A retry under a used key with another payload is refused. Finished futures are
forgotten ``retention_s`` after they finished (the engine forgets its operations on the
same schedule); pending ones are kept.
"""

from __future__ import annotations

import concurrent.futures
import hashlib
import json
import threading
import time
import uuid
from collections.abc import Callable
from dataclasses import dataclass, field
from typing import Any

from posttrain.http_core import json_bytes
from posttrain.service.engine.errors import BadRequest, NotFound, ServiceError


@dataclass(frozen=True)
class Answer:
    """The HTTP answer of a finished future (status 200 in every case, as the SDK expects:
    a failure is ``{"error", "category"}`` in a 200)."""

    body: bytes
    content_type: str = "application/json"

    @staticmethod
    def json(payload: dict[str, Any]) -> Answer:
        return Answer(json_bytes(payload))

    @staticmethod
    def proto(payload: bytes) -> Answer:
        return Answer(payload, "application/x-protobuf")

    @staticmethod
    def failure(message: str, category: str) -> Answer:
        """A failed future; ``category`` is "user" (the request) or "server"."""
        return Answer.json({"error": message, "category": category})


Waiter = Callable[[float], "Answer | None"]


@dataclass
class TinkerFuture:
    """One submission's outcome, as ``retrieve_future`` serves it."""

    request_id: str
    request_type: str  # the SDK's name for it: ForwardBackward, Sample, CreateModel, ...
    waiter: Waiter
    digest: str
    created_at: float = field(default_factory=time.time)
    answer: Answer | None = None
    finished_at: float | None = None
    kept: bool = False  # its answer is in the journal (samples: a replay hands it back)

    def wait(self, seconds: float) -> Answer | None:
        """The answer, waiting up to ``seconds`` for it; None while it is still pending."""
        if self.answer is None:
            answer = self.waiter(seconds)
            if answer is not None:
                self.answer, self.finished_at = answer, time.time()
        return self.answer


def new_request_id() -> str:
    return "req-" + uuid.uuid4().hex


def digest_of(payload: Any) -> str:
    """SHA-256 of ``payload`` as canonical JSON (bytes are hashed as they are)."""
    if isinstance(payload, bytes):
        return hashlib.sha256(payload).hexdigest()
    text = json.dumps(payload, sort_keys=True, separators=(",", ":"), default=str)
    return hashlib.sha256(text.encode()).hexdigest()


def failure_category(error: BaseException) -> str:
    """"user" for what the request caused (a refused value, an unknown name), else "server"."""
    if isinstance(error, ServiceError):
        return "user" if error.status < 500 else "server"
    return "user" if isinstance(error, (ValueError, LookupError)) else "server"


def operation_waiter(engine: Any, operation_id: str,
                     convert: Callable[[dict[str, Any]], Answer]) -> Waiter:
    """A waiter on engine operation ``operation_id``; ``convert`` turns its result into
    the tinker answer. A failed or cancelled operation becomes a failure answer."""

    def wait(seconds: float) -> Answer | None:
        try:
            operation = engine.get_operation(operation_id, seconds)
        except NotFound as error:
            return Answer.failure(error.message, "server")
        if operation["status"] == "succeeded":
            try:
                return convert(operation["result"])
            except Exception as error:  # a result that does not convert is our bug
                return Answer.failure(f"{type(error).__name__}: {error}", "server")
        if operation["status"] == "failed":
            return Answer.failure(operation["error"], operation.get("error_category") or "server")
        if operation["status"] == "cancelled":
            # cancelled because the client finished its session or an earlier request of
            # the same training client failed
            return Answer.failure(operation["error"], "user")
        return None

    return wait


def task_waiter(work: Callable[[], Answer], *, public_text: Callable[[str], str]) -> Waiter:
    """Start ``work`` on a daemon thread now; the waiter waits for its answer. An exception
    it raises becomes a failure answer (``failure_category`` decides who is to blame)
    whose message is ``public_text`` of the exception's (the engine's hides its folders).

    A daemon thread, not a pool: work blocked on a compute thread that has stopped must not
    keep the interpreter from exiting."""
    outcome: concurrent.futures.Future = concurrent.futures.Future()

    def run() -> None:
        try:
            outcome.set_result(work())
        except ServiceError as error:
            outcome.set_result(Answer.failure(error.message, failure_category(error)))
        except Exception as error:
            outcome.set_result(Answer.failure(public_text(str(error) or type(error).__name__),
                                              failure_category(error)))

    threading.Thread(target=run, name="tinker-task", daemon=True).start()

    def wait(seconds: float) -> Answer | None:
        try:
            return outcome.result(timeout=seconds)
        except concurrent.futures.TimeoutError:
            return None

    return wait


class FutureStore:
    """Futures by request id, idempotent submissions by key; thread-safe."""

    def __init__(self, retention_s: float, clock: Callable[[], float] = time.time):
        self.retention_s = retention_s
        self._clock = clock
        self._lock = threading.Lock()
        self._by_id: dict[str, TinkerFuture] = {}
        self._by_key: dict[tuple[Any, ...], str] = {}
        self._preset: dict[str, Answer] = {}

    def preset(self, answers: dict[str, Answer]) -> None:
        """Answers to give the futures of these request ids when they are submitted again
        (a replay of the journal: samples a client collected are not sampled twice)."""
        with self._lock:
            self._preset.update(answers)

    def submit(self, key: tuple[Any, ...], digest: str, request_type: str,
               start: Callable[[], Waiter], new_id: Callable[[], str] = new_request_id
               ) -> tuple[TinkerFuture, bool]:
        """The future of submission ``key``: the existing one for a retry with the same
        ``digest`` (``created`` False), else a new one whose work ``start()`` launches and
        returns a waiter for. ``start`` runs under the store's lock, so two racing retries
        start the work once; it must only queue work, never do it. A used key with another
        digest is a ``BadRequest`` (not a 409: the SDK retries those). ``new_id`` gives a
        new future its request id (a replay hands back the journaled one); an id whose
        answer ``preset`` holds gets that answer and ``start`` is never called."""
        with self._lock:
            self._forget_old()
            existing_id = self._by_key.get(key)
            if existing_id is not None and existing_id in self._by_id:
                existing = self._by_id[existing_id]
                if existing.digest != digest:
                    raise BadRequest(f"{describe_key(key)} was already used by another request; "
                                     "a retry must resend the same payload")
                return existing, False
            request_id = new_id()
            kept = self._preset.pop(request_id, None)
            if kept is not None:
                future = TinkerFuture(request_id, request_type, lambda seconds: kept, digest,
                                      answer=kept, finished_at=self._clock(), kept=True)
            else:
                future = TinkerFuture(request_id, request_type, start(), digest)
            self._by_id[future.request_id] = future
            self._by_key[key] = future.request_id
            return future, True

    def get(self, request_id: str) -> TinkerFuture | None:
        with self._lock:
            return self._by_id.get(request_id)

    def pending(self, request_type: str) -> int:
        """How many futures of ``request_type`` have no answer yet."""
        with self._lock:
            return sum(1 for future in self._by_id.values()
                       if future.request_type == request_type and future.answer is None)

    def _forget_old(self) -> None:
        cutoff = self._clock() - self.retention_s
        old = [request_id for request_id, future in self._by_id.items()
               if future.finished_at is not None and future.finished_at < cutoff]
        for request_id in old:
            del self._by_id[request_id]
        if old:
            gone = set(old)
            self._by_key = {key: rid for key, rid in self._by_key.items() if rid not in gone}


def describe_key(key: tuple[Any, ...]) -> str:
    """A submission key in words, for messages."""
    kind, owner, number = key
    names = {"train": f"seq_id {number} of model {owner}",
             "sample": f"seq_id {number} of sampling session {owner}",
             "model": f"model_seq_id {number} of session {owner}"}
    return names.get(kind, f"{kind} {owner} {number}")
