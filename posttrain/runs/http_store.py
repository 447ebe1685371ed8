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

A server is input too (issue #32): a URL that is not ``http(s)://host[:port]`` is refused
when the store is made (``check_server_url``, which the recipes call before any model
loads); a 200 answer that is not the run server's acknowledgment (a proxy's HTML page,
JSON of another shape) drops the batch with one warning quoting the first 200
characters; and if the sender thread itself fails, it says so once and stops, so
``submit`` and ``close`` never wait on a dead thread. None of it touches the run folder,
which the run handle writes on its own.
"""

from __future__ import annotations

import atexit
import http.client
import json
import sys
import threading
import time
import urllib.error
import urllib.parse
import urllib.request
import uuid
from collections import deque
from collections.abc import Mapping
from typing import Any, TextIO

from posttrain.errors import PosttrainError
from posttrain.foreign_answers import quoted
from posttrain.http_core import error_text
from posttrain.jsonl import to_jsonable
from posttrain.runs.ops import OpWriter, RunStoreError, validate_op

INGEST_PATH = "/api/ingest"
#: the most of an answer the sender reads: the acknowledgment is a few dozen bytes
MAX_ANSWER_BYTES = 64 * 1024


def check_server_url(url: str, source: str = "POSTTRAIN_SERVER") -> str:
    """``url`` without a trailing slash when it is ``http(s)://host[:port][/path]``.

    Raises ``PosttrainError`` naming ``source`` (where the URL came from) for anything
    else: another scheme, no host, a port that is not a number from 1 to 65535, spaces,
    a query or a fragment (the store appends ``/api/ingest`` to the URL)."""
    example = "e.g. http://127.0.0.1:8765, the address `posttrain ui` prints"
    try:
        parts = urllib.parse.urlsplit(url)
        port = parts.port
    except ValueError as error:
        raise PosttrainError(f"{source}={url!r} is not a URL ({error}): give the run "
                             f"server's address, {example}") from None
    problem = None
    if parts.scheme not in ("http", "https"):
        problem = "it does not start with http:// or https://"
    elif not parts.hostname:
        problem = "it names no host"
    elif port == 0:
        problem = "port 0 is not a server's port"
    elif parts.query or parts.fragment or any(char.isspace() for char in url):
        problem = "it has a query, a fragment or spaces"
    if problem:
        raise PosttrainError(f"{source}={url!r} is not a run server's URL ({problem}): "
                             f"give its address, {example}")
    return url.rstrip("/")


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
        self.server_url = check_server_url(server_url, source="server_url")
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
        self.refusal: tuple[int, str] | None = None  # the last refusal's status and words
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
        """Send until closed; a bug or a failure nobody foresaw ends sending with one
        line, not a traceback, and nothing waits on the dead thread afterwards."""
        try:
            self._send_until_closed()
        except Exception as error:
            with self._wake:
                self._disabled = True
                lost = len(self._queue) + (len(self._inflight[1]) if self._inflight else 0)
                self.dropped += lost
                self._queue.clear()
                self._inflight = None
            self._warn_once("sender", f"posttrain: run store server {self.server_url}: the "
                            f"sender stopped ({type(error).__name__}: {quoted(str(error))}); "
                            f"{lost} record(s) and the rest of this run are not sent (the run "
                            "folder still has config.json, metrics.jsonl and the summary)")

    def _send_until_closed(self) -> None:
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

    def create_run(self, name: str, config: Mapping[str, Any],
                   started: float | None = None) -> None:
        """Start run ``name``. Its ``create`` is sent now, not batched: a server that
        refuses it (a token it does not know, a name another person's run holds) stops
        the command before anything trains (``RunStoreError``, exit 2), rather than
        training a run nobody will see. An unreachable server is retried in the
        background, as every op is (training goes on)."""
        op = validate_op({"op": "create", "run": name, "config": to_jsonable(dict(config)),
                          "time": started})
        try:
            outcome = self._post(uuid.uuid4().hex, [op], say_refusal=False)
        except Exception:  # a failure nobody foresaw: the sender meets it and says so once
            outcome = "unreachable"
        if outcome == "sent":
            self.sent += 1
            return
        if outcome == "unreachable":
            self.submit(op)
            return
        code, message = self.refusal or (None, "its answer was not an acknowledgment")
        raise RunStoreError(
            f"run store server {self.server_url} refused run {name!r}"
            f"{f' (HTTP {code})' if code else ''}: {message}; nothing was trained. "
            + ("Check POSTTRAIN_TOKEN, or choose another --run-name." if code in (401, 403)
               else "Is POSTTRAIN_SERVER the address `posttrain ui` printed?"))

    def _post(self, batch_id: str, ops: list[dict[str, Any]], say_refusal: bool = True) -> str:
        """Post one batch: "sent", "refused" (4xx or an answer that is not the run
        server's acknowledgment: do not retry; said on stderr unless ``say_refusal`` is
        False, kept in ``refusal`` either way) or "unreachable" (retry)."""
        body = json.dumps({"batch": batch_id, "ops": ops}).encode("utf-8")
        try:
            request = urllib.request.Request(self.server_url + INGEST_PATH, data=body,
                                             method="POST")
            request.add_header("Content-Type", "application/json")
            if self.token:
                request.add_header("Authorization", f"Bearer {self.token}")
            with urllib.request.urlopen(request, timeout=self.request_timeout) as response:
                answer = response.read(MAX_ANSWER_BYTES + 1)
        except urllib.error.HTTPError as error:
            self.errors += 1
            if error.code >= 500:
                self._warn_unreachable(f"HTTP {error.code}")
                return "unreachable"
            message = _error_message(error)
            self.refusal = (error.code, message)
            if not say_refusal:
                return "refused"
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
        except (OSError, ValueError, http.client.HTTPException) as error:
            # URLError, timeouts, resets, and answers cut short or not HTTP at all
            self.errors += 1
            self._warn_unreachable(type(error).__name__ + (f": {quoted(str(error))}"
                                                           if str(error) else ""))
            return "unreachable"
        if not _is_acknowledgment(answer):
            self.errors += 1
            self.refusal = None
            if not say_refusal:
                return "refused"
            self._warn_once("garbage", f"posttrain: run store server {self.server_url} "
                            "answered something that is not a posttrain run server's "
                            f"acknowledgment: {quoted(answer)}; a batch of {len(ops)} "
                            "record(s) was dropped (later ones are not shown). Is "
                            "POSTTRAIN_SERVER the address `posttrain ui` printed?")
            return "refused"
        return "sent"

    def _warn_unreachable(self, reason: str) -> None:
        self._warn_once(
            "unreachable",
            f"posttrain: run store server {self.server_url} unreachable ({reason}); "
            f"training continues, buffering up to {self.max_buffer} records and retrying "
            "in the background"
        )


def _is_acknowledgment(answer: bytes) -> bool:
    """Whether ``answer`` is the run server's ``{"ok": true, ...}`` to an ingest."""
    try:
        payload = json.loads(answer)
    except ValueError:
        return False
    return isinstance(payload, dict) and payload.get("ok") is True


def _error_message(error: urllib.error.HTTPError) -> str:
    """The message of an error answer, bounded: the run server's envelope, else the
    start of whatever else answered."""
    try:
        body = error.read(MAX_ANSWER_BYTES).decode("utf-8", "replace")
    except (OSError, http.client.HTTPException):
        return str(error.reason)
    try:
        return quoted(error_text(json.loads(body or "{}"), str(error.reason)))
    except ValueError:
        return quoted(body) if body else str(error.reason)
