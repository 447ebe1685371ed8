"""A small Python client for ``posttrain serve`` (standard library only).

::

    client = ServiceClient("http://127.0.0.1:8400")
    with client.create_session() as session:           # heartbeats on a background thread
        run = session.create_run(rank=8, seed=0)
        run.save_weights_for_sampler(0)                  # returns an Operation at once
        sample = run.sample(0, prompt_ids, num_samples=4, max_tokens=32, seed=1).result()
        run.forward_backward(data, "importance_sampling")
        run.optim_step(AdamParams(1e-4, 0.9, 0.95, 1e-8, 0.0, 1.0)).result()

Every primitive returns an ``Operation`` immediately; ``.result(timeout_s)`` long-polls
until it ends and returns its result, or raises ``OperationFailed`` /
``OperationCancelled`` / ``TimeoutError``. Submitting several before waiting on any is the
fast way: the server runs a run's operations in the order they were numbered here.

A ``Run`` numbers its operations ``seq`` 1, 2, 3, ... itself. A request that hits a
connection error is resent with the same ``seq``, which the server treats as the same
operation (never executed twice); a 4xx answer raises ``ServiceRequestError`` at once.
"""

from __future__ import annotations

import http.client
import json
import threading
import time
import urllib.error
import urllib.request
from typing import Any

from posttrain.errors import PosttrainError
from posttrain.service.schema import (
    API_PREFIX,
    TERMINAL_OPERATION_STATES,
    TERMINAL_RUN_STATES,
    AdamParams,
)

LONG_POLL_S = 10.0


class ServiceRequestError(PosttrainError):
    """The server refused a request: ``status`` (HTTP) and its ``message``."""

    def __init__(self, status: int, message: str, method: str, path: str):
        super().__init__(f"{method} {path}: {status}: {message}")
        self.status, self.message, self.method, self.path = status, message, method, path


class ServiceUnavailable(PosttrainError):
    """The server could not be reached after the retries."""


class OperationFailed(PosttrainError):
    """An operation ended ``failed``; ``operation`` is what the server reported."""

    def __init__(self, operation: dict[str, Any]):
        self.operation = operation
        super().__init__(
            f"{operation['primitive']} (run {operation['run_id']}, seq {operation['seq']}) "
            f"{operation['status']}: {operation.get('error')}"
        )


class OperationCancelled(OperationFailed):
    """An operation was cancelled before it ran (the run was cancelled or ended)."""


class ServiceClient:
    """Talks to one server. ``token`` is sent as a bearer token when given."""

    def __init__(
        self,
        url: str,
        token: str | None = None,
        *,
        timeout_s: float = 120.0,
        retries: int = 3,
        retry_backoff_s: float = 0.2,
    ):
        self.url = url.rstrip("/")
        self.token = token
        self.timeout_s = timeout_s
        self.retries = retries
        self.retry_backoff_s = retry_backoff_s

    # ------------------------------------------------------------ plumbing

    def request(
        self, method: str, path: str, body: Any = None, *, timeout_s: float | None = None,
        retry: bool = True,
    ) -> Any:
        """Send one request and return the decoded JSON answer.

        Connection failures are retried (``retries`` times, growing back-off) when
        ``retry``; callers pass ``retry=False`` for requests that are not idempotent.
        """
        data = None if body is None else json.dumps(body).encode()
        headers = {"Content-Type": "application/json"}
        if self.token:
            headers["Authorization"] = f"Bearer {self.token}"
        attempts = 1 + (self.retries if retry else 0)
        last_error: Exception | None = None
        for attempt in range(attempts):
            if attempt:
                time.sleep(self.retry_backoff_s * 2 ** (attempt - 1))
            request = urllib.request.Request(
                self.url + API_PREFIX + path, data=data, method=method, headers=headers
            )
            try:
                with urllib.request.urlopen(request, timeout=timeout_s or self.timeout_s) as answer:
                    return json.loads(answer.read() or b"null")
            except urllib.error.HTTPError as error:
                message = _error_message(error)
                if error.code >= 500 and retry and attempt + 1 < attempts:
                    last_error = ServiceRequestError(error.code, message, method, path)
                    continue
                raise ServiceRequestError(error.code, message, method, path) from None
            except (urllib.error.URLError, http.client.HTTPException, ConnectionError,
                    TimeoutError) as error:
                last_error = error
        raise ServiceUnavailable(
            f"{method} {self.url}{API_PREFIX}{path}: no answer after {attempts} attempt(s): "
            f"{last_error}"
        )

    # ------------------------------------------------------------ server-level calls

    def health(self) -> dict[str, Any]:
        return self.request("GET", "/health")

    def capabilities(self) -> dict[str, Any]:
        """Primitives, losses with inputs/config keys/defaults, base model, limits."""
        return self.request("GET", "/capabilities")

    def tokenize(self, *, messages: list[dict[str, str]] | None = None,
                 text: str | None = None) -> list[int]:
        """Token ids of a chat (template applied, ready for the reply) or of plain text."""
        body = {"messages": messages} if messages is not None else {"text": text}
        return self.request("POST", "/tokenize", body)["token_ids"]

    def detokenize(self, token_ids: list[int]) -> str:
        """Text of ``token_ids`` (special tokens skipped)."""
        return self.request("POST", "/detokenize", {"token_ids": list(token_ids)})["text"]

    def create_session(self, heartbeat_timeout_s: float = 60.0, *,
                       heartbeat: bool = True) -> Session:
        """Open a session; with ``heartbeat`` a daemon thread keeps it alive until closed."""
        info = self.request("POST", "/sessions", {"heartbeat_timeout_s": heartbeat_timeout_s},
                            retry=False)
        return Session(self, info["session_id"], heartbeat_timeout_s, heartbeat=heartbeat)

    def operation(self, operation_id: str) -> dict[str, Any]:
        """The server's view of an operation, without waiting."""
        return self.request("GET", f"/operations/{operation_id}")

    def run(self, run_id: str, *, next_seq: int = 1) -> Run:
        """A handle on an existing run (numbering from ``next_seq``)."""
        return Run(self, run_id, next_seq=next_seq)


def _error_message(error: urllib.error.HTTPError) -> str:
    try:
        payload = json.loads(error.read() or b"{}")
        return payload["error"]["message"]
    except (ValueError, KeyError, TypeError):
        return error.reason or f"HTTP {error.code}"


class Session:
    """A server session; close it (or use ``with``) when done."""

    def __init__(self, client: ServiceClient, session_id: str, heartbeat_timeout_s: float,
                 *, heartbeat: bool = True):
        self.client = client
        self.id = session_id
        self.heartbeat_timeout_s = heartbeat_timeout_s
        self._stop = threading.Event()
        self._thread: threading.Thread | None = None
        self.heartbeat_error: Exception | None = None
        if heartbeat:
            self._thread = threading.Thread(target=self._beat, name=f"heartbeat-{session_id}",
                                            daemon=True)
            self._thread.start()

    def _beat(self) -> None:
        interval = max(self.heartbeat_timeout_s / 3, 0.1)
        while not self._stop.wait(interval):
            try:
                self.heartbeat()
            except PosttrainError as error:  # remembered; the caller's next call will fail
                self.heartbeat_error = error
                if isinstance(error, ServiceRequestError):
                    return

    def heartbeat(self) -> dict[str, Any]:
        return self.client.request("POST", f"/sessions/{self.id}/heartbeat", {})

    def stop_heartbeat(self) -> None:
        """Stop the background heartbeat (tests use it to let a session lapse)."""
        self._stop.set()

    def create_run(self, rank: int = 16, alpha: float | None = None,
                   target_modules: list[str] | None = None, seed: int = 0) -> Run:
        """A new LoRA run on the server's base model (alpha defaults to 2 * rank)."""
        body: dict[str, Any] = {"session_id": self.id, "rank": rank, "seed": seed}
        if alpha is not None:
            body["alpha"] = alpha
        if target_modules is not None:
            body["target_modules"] = list(target_modules)
        info = self.client.request("POST", "/runs", body, retry=False)
        return Run(self.client, info["run_id"], info=info)

    def resume_run(self, run_id: str) -> Run:
        """Resume a dormant run (after a server restart) in this session."""
        info = self.client.request("POST", f"/runs/{run_id}/resume", {"session_id": self.id},
                                   retry=False)
        return Run(self.client, run_id, next_seq=info["next_seq"], info=info)

    def close(self) -> dict[str, Any]:
        """Close the session (its active runs are cancelled by the server). Idempotent."""
        self._stop.set()
        return self.client.request("POST", f"/sessions/{self.id}/close", {})

    def __enter__(self) -> Session:
        return self

    def __exit__(self, *exc: Any) -> None:
        try:
            self.close()
        except PosttrainError:
            if exc[0] is None:
                raise


class Operation:
    """A submitted primitive; ``result()`` waits for it."""

    def __init__(self, client: ServiceClient, info: dict[str, Any]):
        self.client = client
        self.id: str = info["operation_id"]
        self.seq: int = info["seq"]
        self.primitive: str = info["primitive"]
        self.info = info

    def poll(self, wait_s: float = 0.0) -> dict[str, Any]:
        """The operation's state, waiting up to ``wait_s`` for it to end."""
        self.info = self.client.request(
            "GET", f"/operations/{self.id}?wait={wait_s:g}", timeout_s=wait_s + 30
        )
        return self.info

    @property
    def done(self) -> bool:
        return self.info["status"] in TERMINAL_OPERATION_STATES

    def result(self, timeout_s: float | None = 600.0) -> dict[str, Any]:
        """The result once the operation succeeds.

        Raises ``OperationFailed`` / ``OperationCancelled`` when it did not, and
        ``TimeoutError`` when it is still queued or running after ``timeout_s``.
        """
        deadline = None if timeout_s is None else time.monotonic() + timeout_s
        while not self.done:
            left = LONG_POLL_S if deadline is None else deadline - time.monotonic()
            if left <= 0:
                raise TimeoutError(
                    f"{self.primitive} (seq {self.seq}) still {self.info['status']} after "
                    f"{timeout_s:g} s"
                )
            self.poll(min(LONG_POLL_S, left))
        if self.info["status"] == "succeeded":
            return self.info["result"]
        if self.info["status"] == "cancelled":
            raise OperationCancelled(self.info)
        raise OperationFailed(self.info)


class Run:
    """A LoRA run. Primitives are numbered here, in call order, and return ``Operation``s."""

    def __init__(self, client: ServiceClient, run_id: str, *, next_seq: int = 1,
                 info: dict[str, Any] | None = None):
        self.client = client
        self.id = run_id
        self.info = info or {}
        self._next_seq = next_seq
        self._seq_lock = threading.Lock()

    # ------------------------------------------------------------ plumbing

    def submit(self, primitive: str, body: dict[str, Any], *, seq: int | None = None) -> Operation:
        """Send one primitive with the next sequence number (or ``seq``, for a deliberate
        resend). Numbering and sending happen under one lock, so threads sharing a run
        still reach the server in number order."""
        with self._seq_lock:
            if seq is None:
                seq, self._next_seq = self._next_seq, self._next_seq + 1
            info = self.client.request("POST", f"/runs/{self.id}/{primitive}", {"seq": seq, **body})
        return Operation(self.client, info)

    @property
    def next_seq(self) -> int:
        return self._next_seq

    # ------------------------------------------------------------ primitives

    def save_weights_for_sampler(self, version: int) -> Operation:
        return self.submit("save_weights_for_sampler", {"version": version})

    def sample(self, version: int, prompt_token_ids: list[int], *, num_samples: int = 1,
               max_tokens: int, temperature: float = 1.0, top_p: float = 1.0, top_k: int = 0,
               seed: int | None = None, stop: list[str] | tuple[str, ...] = ()) -> Operation:
        """Sample from sampler version ``version``; sample ``i`` uses seed ``seed + i``."""
        params: dict[str, Any] = {"max_tokens": max_tokens, "temperature": temperature,
                                  "top_p": top_p, "top_k": top_k, "stop": list(stop)}
        if seed is not None:
            params["seed"] = seed
        return self.submit("sample", {
            "version": version, "prompt": {"token_ids": list(prompt_token_ids)},
            "num_samples": num_samples, "sampling_params": params,
        })

    def logprobs(self, sequences: list[list[int]], version: int | None = None) -> Operation:
        """Per-token logprobs (entry 0 is None); ``version`` None = current trainer weights."""
        return self.submit("logprobs", {"sequences": [list(s) for s in sequences],
                                        "version": version})

    def forward(self, data: list[dict[str, Any]], loss_function: str,
                loss_config: dict[str, float] | None = None) -> Operation:
        return self.submit("forward", {"data": data, "loss_function": loss_function,
                                       "loss_config": loss_config or {}})

    def forward_backward(self, data: list[dict[str, Any]], loss_function: str,
                         loss_config: dict[str, float] | None = None) -> Operation:
        """Add the gradient of the summed loss; it accumulates until ``optim_step``."""
        return self.submit("forward_backward", {"data": data, "loss_function": loss_function,
                                                "loss_config": loss_config or {}})

    def forward_backward_payload(self, payload: dict[str, Any]) -> Operation:
        """``forward_backward`` from a payload built by ``rl.forward_backward_payload``."""
        return self.submit("forward_backward", payload)

    def optim_step(self, adam: AdamParams) -> Operation:
        return self.submit("optim_step", {"adam_params": adam.to_json()})

    def save_state(self, name: str) -> Operation:
        return self.submit("save_state", {"name": name})

    def load_state(self, name: str, run_id: str | None = None) -> Operation:
        body: dict[str, Any] = {"name": name}
        if run_id is not None:
            body["run_id"] = run_id
        return self.submit("load_state", body)

    def export_lora(self, name: str) -> Operation:
        return self.submit("export_lora", {"name": name})

    def finish(self) -> Operation:
        return self.submit("finish", {})

    # ------------------------------------------------------------ lifecycle

    def status(self) -> dict[str, Any]:
        self.info = self.client.request("GET", f"/runs/{self.id}")
        return self.info

    def cancel(self) -> dict[str, Any]:
        """Cancel the run now (not numbered: it jumps the queue); queued operations end
        ``cancelled``, the running one finishes."""
        self.info = self.client.request("POST", f"/runs/{self.id}/cancel", {})
        return self.info

    def wait_terminal(self, timeout_s: float = 60.0, poll_s: float = 0.1) -> dict[str, Any]:
        """Poll until the run is finished, cancelled, failed or lost; returns its status."""
        deadline = time.monotonic() + timeout_s
        while True:
            info = self.status()
            if info["status"] in TERMINAL_RUN_STATES:
                return info
            if time.monotonic() > deadline:
                raise TimeoutError(f"run {self.id} still {info['status']} after {timeout_s:g} s")
            time.sleep(poll_s)
