"""The run store over HTTP: ops queued in memory and posted in batches by a background thread.

Used when ``POSTTRAIN_SERVER`` is set (``posttrain.runs.store.default_store``). Training
never waits on the network: ``submit`` appends to a bounded queue and returns. A sender
thread posts up to ``max_batch`` ops every ``flush_seconds`` to ``POST /api/ingest``.

When the server cannot be reached (refused, timed out, 5xx) the batch is kept and retried
with exponential backoff (0.5 s doubling to ``max_backoff``); one warning line says so.
When the queue is full the oldest ops are dropped (never the run's ``create``) and the
count is reported. A 4xx answer (bad token, malformed batch) will not get better by
retrying: the batch is dropped with one warning, and a 401/403 stops sending for good.
``close()`` (called by ``RunHandle.finish``) delivers what is left, waiting at most
``close_timeout`` seconds, then says how many ops were not delivered.
"""

from __future__ import annotations

import atexit
import json
import sys
import threading
import time
import urllib.error
import urllib.request
import uuid
from collections import deque
from typing import Any, TextIO

from posttrain.http_core import error_text
from posttrain.runs.ops import OpWriter, validate_op

INGEST_PATH = "/api/ingest"


class HttpRunStore(OpWriter):
    """Write-only run store that posts batched ops to a posttrain server.

    ``server_url`` is the server's base URL (``http://127.0.0.1:8765``); ``token`` is
    sent as ``Authorization: Bearer <token>`` when given. All sizes are in ops.
    """

    def __init__(
        self,
        server_url: str,
        token: str | None = None,
        *,
        max_batch: int = 500,
        max_buffer: int = 200_000,
        flush_seconds: float = 0.5,
        request_timeout: float = 5.0,
        max_backoff: float = 30.0,
        close_timeout: float = 10.0,
        warn_stream: TextIO | None = None,
    ) -> None:
        self.server_url = server_url.rstrip("/")
        self.token = token
        self.max_batch, self.max_buffer = max_batch, max_buffer
        self.flush_seconds, self.request_timeout = flush_seconds, request_timeout
        self.max_backoff, self.close_timeout = max_backoff, close_timeout
        self._warn_stream = warn_stream
        self._queue: deque[dict[str, Any]] = deque()
        self._inflight: tuple[str, list[dict[str, Any]]] | None = None
        self._wake = threading.Condition()
        self._closing = False
        self._disabled = False
        self._warned: set[str] = set()  # kinds of warning already printed
        self._closed = False
        self.dropped = 0  # ops lost to a full buffer or a refused batch
        self.sent = 0
        self.errors = 0
        self._thread = threading.Thread(target=self._send_loop, name="posttrain-run-sender",
                                        daemon=True)
        self._thread.start()
        atexit.register(self.close)  # a script that never finishes its run still delivers

    # --- called from the training thread ----------------------------------------------

    def submit(self, op: dict[str, Any]) -> None:
        """Check one op and queue it; never blocks on the network and never raises for it.

        An invalid op raises ``RunStoreError`` here, as the SQLite store would, rather
        than poisoning a whole batch on the server.
        """
        op = validate_op(op)
        with self._wake:
            if self._disabled or self._closing:
                return
            self._queue.append(op)
            while len(self._queue) > self.max_buffer:
                self._drop_oldest()
            if len(self._queue) >= self.max_batch:
                self._wake.notify()

    def _drop_oldest(self) -> None:
        # keep a queued create: without it the server would not know the run's config
        for index, queued in enumerate(self._queue):
            if queued["op"] != "create":
                del self._queue[index]
                self.dropped += 1
                return
        self._queue.popleft()
        self.dropped += 1

    @property
    def pending(self) -> int:
        """Ops not yet acknowledged by the server."""
        with self._wake:
            return len(self._queue) + (len(self._inflight[1]) if self._inflight else 0)

    def close(self) -> None:
        """Deliver what is queued (at most ``close_timeout`` seconds), then stop the sender.

        Safe to call twice; also runs at interpreter exit if never called.
        """
        with self._wake:
            if self._closed:
                return
            self._closed = True
            self._closing = True
            self._wake.notify()
        self._thread.join(self.close_timeout + self.request_timeout + 1.0)
        atexit.unregister(self.close)
        left = self.pending
        if left:
            self._say(f"posttrain: run store server {self.server_url}: {left} record(s) "
                      "could not be delivered before the timeout; they are lost "
                      "(the run folder's metrics.jsonl still has the metrics)")

    # --- sender thread ------------------------------------------------------------------

    def _say(self, line: str) -> None:
        print(line, file=self._warn_stream or sys.stderr, flush=True)

    def _warn_once(self, kind: str, line: str) -> None:
        if kind not in self._warned:
            self._warned.add(kind)
            self._say(line)

    def _next_batch(self) -> tuple[str, list[dict[str, Any]]] | None:
        with self._wake:
            if self._inflight is None and self._queue:
                count = min(self.max_batch, len(self._queue))
                ops = [self._queue.popleft() for _ in range(count)]
                self._inflight = (uuid.uuid4().hex, ops)
            return self._inflight

    def _send_loop(self) -> None:
        backoff = 0.0  # seconds to wait before retrying an unreachable server
        deadline: float | None = None  # set once close() is called
        while True:
            with self._wake:
                if self._closing:
                    wait = 0.0
                elif backoff:
                    wait = backoff
                else:  # a full batch goes at once (draining a backlog), else every tick
                    wait = 0.0 if len(self._queue) >= self.max_batch else self.flush_seconds
                if wait:
                    self._wake.wait(wait)
                closing = self._closing
            if closing and deadline is None:
                deadline = time.monotonic() + self.close_timeout
            batch = None if self._disabled else self._next_batch()
            if batch is None:
                if closing:
                    return
                backoff = 0.0
                continue
            if deadline is not None and time.monotonic() > deadline:
                return
            outcome = self._post(*batch)
            if outcome == "unreachable":
                backoff = min(self.max_backoff, max(0.5, backoff * 2))
                if deadline is not None:  # closing: retry briskly until the deadline
                    time.sleep(min(0.2, max(0.0, deadline - time.monotonic())))
                continue
            with self._wake:
                if outcome == "sent":
                    self.sent += len(batch[1])
                else:
                    self.dropped += len(batch[1])
                self._inflight = None
            backoff = 0.0

    def _post(self, batch_id: str, ops: list[dict[str, Any]]) -> str:
        """Post one batch: "sent", "refused" (4xx, do not retry) or "unreachable" (retry)."""
        body = json.dumps({"batch": batch_id, "ops": ops}).encode("utf-8")
        request = urllib.request.Request(self.server_url + INGEST_PATH, data=body, method="POST")
        request.add_header("Content-Type", "application/json")
        if self.token:
            request.add_header("Authorization", f"Bearer {self.token}")
        try:
            with urllib.request.urlopen(request, timeout=self.request_timeout) as response:
                response.read()
            return "sent"
        except urllib.error.HTTPError as error:
            self.errors += 1
            if error.code >= 500:
                self._warn_unreachable(f"HTTP {error.code}")
                return "unreachable"
            message = _error_message(error)
            if error.code in (401, 403):
                with self._wake:
                    self._disabled = True
                    self.dropped += len(self._queue)
                    self._queue.clear()
                self._warn_once("token", f"posttrain: run store server {self.server_url} "
                                f"refused the token (HTTP {error.code}: {message}); this run "
                                "is not being sent. Check POSTTRAIN_TOKEN.")
            else:
                self._warn_once("refused", f"posttrain: run store server {self.server_url} "
                                f"refused a batch of {len(ops)} record(s) (HTTP {error.code}: "
                                f"{message}); dropped (later refusals are not shown)")
            return "refused"
        except (OSError, ValueError) as error:  # URLError, timeouts, resets, bad URL
            self.errors += 1
            self._warn_unreachable(type(error).__name__ + (f": {error}" if str(error) else ""))
            return "unreachable"

    def _warn_unreachable(self, reason: str) -> None:
        self._warn_once(
            "unreachable",
            f"posttrain: run store server {self.server_url} unreachable ({reason}); "
            f"training continues, buffering up to {self.max_buffer} records and retrying "
            "in the background"
        )


def _error_message(error: urllib.error.HTTPError) -> str:
    try:
        payload = json.loads(error.read().decode("utf-8", "replace") or "{}")
        return error_text(payload, str(error.reason))
    except (ValueError, OSError, AttributeError):
        return str(error.reason)
