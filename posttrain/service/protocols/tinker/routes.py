"""The tinker SDK's wire protocol (SDK 0.38.x) on ``posttrain serve``: ``/api/v1/...``.

The unmodified ``tinker`` SDK, pointed here with ``TINKER_BASE_URL`` and any ``tml-`` key,
trains and samples on the same engine as the ``/v1/training`` routes. This module holds
the routes, sessions and sampling sessions; the rest lives beside it:

- a tinker **session** is an engine session (heartbeat timeout ``session_timeout_s``; the
  SDK heartbeats every 10 s); ``sessions/{id}/finish`` closes it and cancels its runs;
- **training clients** and their ``seq_id``'d requests: ``training`` beside this module;
- **sampling sessions** sample the base model, a run's snapshot, or a saved adapter
  (``sampling``) on the compute thread;
- submissions answer a future at once and ``retrieve_future`` long-polls it
  (``futures``); forward, forward_backward and sample results
  are protobuf (``proto``); JSON bodies are checked in
  ``requests``.

Errors: a malformed request that cannot be tied to a ``seq`` is a 4xx with the service's
envelope (never 409: the SDK retries that for five minutes; 429 only when it should back
off); a refused or failed operation is a 200 ``{"error", "category"}`` from
``retrieve_future``, which the SDK raises as ``RequestFailedError``.
"""

from __future__ import annotations

import random
import threading
import uuid
from collections.abc import Callable
from dataclasses import dataclass, field, replace
from pathlib import Path
from typing import Any

from posttrain.access import Caller
from posttrain.http_core import HttpError, Request, Response, json_bytes, json_response
from posttrain.service.engine.errors import BadRequest, Conflict, NotFound, ServiceError
from posttrain.service.engine.sessions import new_session_id
from posttrain.service.protocols.long_polls import LongPollGate
from posttrain.service.protocols.tinker.futures import (
    Answer,
    FutureStore,
    digest_of,
    new_request_id,
    task_waiter,
)
from posttrain.service.protocols.tinker.journal import SESSION_EXPIRED, Choices, Entry, Journal
from posttrain.service.protocols.tinker.proto import ProtoError
from posttrain.service.protocols.tinker.requests import (
    body_object,
    check_sdk_version,
    checkpoint_path,
    parse_sample,
    text,
    whole,
)
from posttrain.service.protocols.tinker.rest import CHECKPOINT_ROUTE, TinkerRest
from posttrain.service.protocols.tinker.sampling import SamplerSource, TinkerSampling
from posttrain.service.protocols.tinker.training import TinkerTraining
from posttrain.text import echo

PREFIX = "/api/v1"


@dataclass(frozen=True)
class TinkerSettings:
    """How the tinker routes behave."""

    long_poll_s: float = field(default=25.0, metadata={
        "help": "longest wait of one retrieve_future before a 408 try-again (the SDK's poll "
        "times out at 45 s); how many wait at once is the server's long-poll gate's "
        "(posttrain.service.protocols.long_polls)"})
    session_timeout_s: float = field(default=600.0, metadata={
        "help": "a session silent this long is reaped (the SDK heartbeats every 10 s)"})
    max_pending_samples: int = field(default=512, metadata={
        "help": "asample requests waiting at once; past it the SDK is told 429 and backs off"})


@dataclass(frozen=True)
class SamplingSession:
    sampling_session_id: str
    session_id: str
    source: SamplerSource


def tokenizer_source(engine: Any) -> str:
    """The base model's local folder (what the SDK hands ``AutoTokenizer``); the engine's
    model name when the weights came from the hub cache. The SDK cuts names at the first
    ``:``, so a folder holding one cannot be used."""
    folder = getattr(engine.policy, "source", None)
    return str(folder) if folder and ":" not in str(folder) else engine.base_model


def _same_folder(name: str, folder: str) -> bool:
    """Does ``name`` point at ``folder`` (another spelling of the same path)?"""
    try:
        return Path(name).expanduser().resolve() == Path(folder).resolve()
    except (OSError, RuntimeError):
        return False


def tinker_available() -> bool:
    """Can the tinker routes run here? They need the ``tinker`` package (its protobuf
    schema): ``pip install 'posttrain[tinker]'``."""
    try:
        import tinker.proto.tinker_public_pb2  # noqa: F401
    except Exception:  # not installed, or an install that does not import
        return False
    return True


Handler = Callable[[Request], Any]
JournaledHandler = Callable[[Request, Choices], Any]


class TinkerService:
    """The state behind the tinker routes: training clients, sampling sessions, futures.

    With a ``journal`` (``journal.Journal``), every submission that changes them is kept
    before it is answered, and ``replay.replay_journal`` rebuilds them after a restart."""

    def __init__(self, engine: Any, settings: TinkerSettings | None = None,
                 long_polls: LongPollGate | None = None, journal: Journal | None = None):
        self.engine = engine
        self.journal = journal
        # one submission at a time between handling and journaling: the journal's order
        # is then the order in which they changed the service, which a replay repeats
        self._submitting = threading.Lock()
        self.settings = settings or TinkerSettings()
        # the server passes the gate its other wings share (they share its threads)
        self.long_polls = long_polls or LongPollGate.from_limits(engine.limits)
        self.futures = FutureStore(engine.limits.operation_retention_s)
        self.sampling = TinkerSampling(engine)
        self.model_name = tokenizer_source(engine)
        self.training = TinkerTraining(
            engine, self.futures, model_name=self.model_name, open_session=self._open_session,
            check_base_model=self._check_base_model,
            register_sampling=self._register_sampling)
        self._lock = threading.Lock()
        self._sampling_sessions: dict[str, SamplingSession] = {}
        self._sampling_keys: dict[tuple[str, int], str] = {}
        self.rest = TinkerRest(engine, run_of_model=self.training.run_of_model,
                               samplers_of=self._samplers_of)
        if journal is not None:
            engine.on_session_end(self._journal_expiry)

    def _journal_expiry(self, session_id: str, status: str) -> None:
        """A session that lapsed ends in the journal too (a finish is journaled as the
        request it is): nothing of it is replayed at the next start."""
        if status == "expired" and self.journal is not None:
            self.journal.append(Entry(SESSION_EXPIRED, {}, b"", None, None, [], session_id))

    # ------------------------------------------------------------ routes

    def journaled_routes(self) -> dict[str, tuple[str, str, JournaledHandler]]:
        """The submissions that change the service, by name: (method, path, handler). The
        name is what the journal keeps and a replay dispatches on."""
        training = self.training
        return {
            "create_session": ("POST", "/create_session", self.create_session),
            "finish_session": ("POST", "/sessions/{session_id}/finish", self.finish_session),
            "create_model": ("POST", "/create_model", training.create_model),
            "forward_backward": ("POST", "/forward_backward", training.forward_backward),
            "optim_step": ("POST", "/optim_step", training.optim_step),
            "save_weights": ("POST", "/save_weights", training.save_weights),
            "save_weights_for_sampler": ("POST", "/save_weights_for_sampler",
                                         training.save_weights_for_sampler),
            "save_weights_external": ("POST", "/save_weights_external",
                                      training.save_weights_external),
            "load_weights": ("POST", "/load_weights", training.load_weights),
            "create_sampling_session": ("POST", "/create_sampling_session",
                                        self.create_sampling_session),
            "asample": ("POST", "/asample", self.asample),
            "delete_checkpoint": ("DELETE", CHECKPOINT_ROUTE, self.rest.delete_checkpoint),
        }

    def routes(self) -> list[tuple[str, str, Callable[[Request], Response]]]:
        """(method, path, handler) of every tinker endpoint."""
        table: list[tuple[str, str, Handler]] = [
            ("POST", "/client/config", self.client_config),
            ("POST", "/client/dynamic_config", lambda r: {"refresh_interval_sec": 300,
                                                          "sample_cancel_enabled": False}),
            ("POST", "/session_heartbeat", self.session_heartbeat),
            ("POST", "/telemetry", lambda r: {"status": "accepted"}),
            ("GET", "/healthz", lambda r: {"status": "ok"}),
            ("GET", "/get_server_capabilities", self.capabilities),
            ("POST", "/get_info", self.training.get_info),
            ("GET", "/samplers/{sampler_id}", self.get_sampler),
            ("POST", "/retrieve_future", self.retrieve_future),
            *[(method, path, self._journaled(name, call))
              for name, (method, path, call) in self.journaled_routes().items()],
            *self.rest.routes(),
        ]
        return [(method, PREFIX + path, self._answer(call)) for method, path, call in table]

    def _journaled(self, name: str, call: JournaledHandler) -> Handler:
        """``call`` with fresh ``Choices``, its submission journaled before it is answered
        (a request refused with an error changed nothing and is not kept)."""
        def handle(request: Request) -> Any:
            choices = Choices()
            with self._submitting:
                result = call(request, choices)
                if self.journal is not None:
                    self.journal.append(Entry(
                        name, dict(request.match), request.body,
                        request.headers.get("content-encoding"), request.caller.name,
                        choices.values, choices.session_id))
            return result
        return handle

    @staticmethod
    def _answer(call: Callable[[Request], Any]) -> Callable[[Request], Response]:
        def handle(request: Request) -> Response:
            try:
                result = call(request)
            except ProtoError as error:
                raise HttpError(400, str(error)) from None
            except ServiceError as error:
                # 409 would be retried by the SDK for five minutes: a conflict is final here
                raise HttpError(400 if error.status == 409 else error.status,
                                error.message) from None
            return result if isinstance(result, Response) else json_response(result)
        return handle

    # ------------------------------------------------------------ lookups

    def _open_session(self, session_id: Any, caller: Caller) -> str:
        """``session_id`` when it names an open session that ``caller`` may change."""
        if not isinstance(session_id, str):
            raise BadRequest("session_id: expected a string")
        self.engine.check_change(caller, session_id=session_id)
        status = self.engine.get_session(session_id)["status"]
        if status != "open":
            raise BadRequest(f"session {session_id} is {status}; create a new ServiceClient")
        return session_id

    def _check_base_model(self, name: Any, where: str = "base_model") -> None:
        names = {self.engine.base_model, self.model_name}
        if isinstance(name, str) and (name in names or _same_folder(name, self.model_name)):
            return
        # the served model by the name it was started with, never by its folder's
        # absolute path (docs/security.md): get_info hands the folder to a client that asks
        raise BadRequest(f"{where}: this server serves {self.engine.base_model!r}, not "
                         f"{echo(name)}; pass base_model={self.engine.base_model!r} (the "
                         "one model get_server_capabilities lists)")

    def _register_sampling(self, session_id: str, seq: int, source: SamplerSource,
                           choices: Choices) -> str:
        with self._lock:
            known = self._sampling_keys.get((session_id, seq))
            if known is not None:
                if self._sampling_sessions[known].source != source:
                    raise BadRequest(f"sampling_session_seq_id {seq} of session {session_id} "
                                     "already names another sampler")
                return known
            sampling_session_id = choices.pick(lambda: "samp-" + uuid.uuid4().hex[:16])
            self._sampling_sessions[sampling_session_id] = SamplingSession(
                sampling_session_id, session_id, source)
            self._sampling_keys[(session_id, seq)] = sampling_session_id
            return sampling_session_id

    def _samplers_of(self, session_id: str) -> list[str]:
        with self._lock:
            return [entry.sampling_session_id for entry in self._sampling_sessions.values()
                    if entry.session_id == session_id]

    def _sampling_session(self, sampling_session_id: Any) -> SamplingSession:
        with self._lock:
            found = self._sampling_sessions.get(sampling_session_id) \
                if isinstance(sampling_session_id, str) else None
        if found is None:
            raise NotFound(f"no sampling session {sampling_session_id!r} here")
        return found

    # ------------------------------------------------------------ bootstrap and sessions

    def client_config(self, request: Request) -> dict[str, Any]:
        """``POST /client/config``: the feature flags, after checking the SDK version."""
        check_sdk_version(request.json(empty={}))
        limits = self.engine.limits
        return {
            "pjwt_auth_enabled": False,
            "parallel_fwdbwd_chunks": True,
            "proto_compress_fwdbwd": False,
            "fwdbwd_max_chunk_len": limits.max_datums,
            # a chunk must fit the body limit and the per-call token limit (every token
            # costs at least 12 bytes: an int32 input and an int64 target)
            "fwdbwd_max_chunk_bytes_count": min(5_000_000, limits.max_body_bytes // 2,
                                                limits.max_tokens_per_call * 12),
            "sample_max_concurrent_requests": self.settings.max_pending_samples,
            "sample_use_retrieve_futures": False,
            "custom_loss_server_side": False,
            "sample_join_sampling_session": False,
        }

    def create_session(self, request: Request, choices: Choices) -> dict[str, Any]:
        """``POST /create_session``: an engine session with a long heartbeat timeout."""
        check_sdk_version(request.json(empty={}))
        choices.session_id = choices.pick(new_session_id)
        session = self.engine.create_session(self.settings.session_timeout_s,
                                             session_id=choices.session_id,
                                             owner=request.caller.name or None)
        return {"session_id": session["session_id"], "type": "create_session"}

    def session_heartbeat(self, request: Request) -> dict[str, Any]:
        """``POST /session_heartbeat``; 410 for a finished or unknown session."""
        session_id = body_object(request.json(empty={})).get("session_id")
        self.engine.check_change(request.caller, session_id=session_id)
        try:
            self.engine.heartbeat(session_id)
        except (NotFound, Conflict) as error:
            raise HttpError(410, error.message) from None  # 410 stops the SDK's heartbeat
        return {"type": "session_heartbeat"}

    def finish_session(self, request: Request, choices: Choices) -> dict[str, Any]:
        """``POST /sessions/{id}/finish``: close the session (its runs are cancelled). The
        session's journal entries are dropped at the next start: nothing of it is replayed."""
        session_id = request.match["session_id"]
        self.engine.check_change(request.caller, session_id=session_id)
        session = self.engine.close_session(session_id)
        choices.session_id = session_id
        with self._lock:
            for sampling_session_id, entry in list(self._sampling_sessions.items()):
                if entry.session_id == session_id:
                    del self._sampling_sessions[sampling_session_id]
        return {"session_id": session_id, "status": session["status"]}

    def capabilities(self, request: Request) -> dict[str, Any]:
        """``GET /get_server_capabilities``: the one model served."""
        return {"supported_models": [{
            "model_name": self.engine.base_model,
            "max_context_length": self.engine.limits.max_sequence_tokens,
            "trainable": True, "sampleable": True}]}

    # ------------------------------------------------------------ sampling

    def create_sampling_session(self, request: Request, choices: Choices) -> dict[str, Any]:
        """``POST /create_sampling_session``: from a ``tinker://`` save or the base model."""
        body = body_object(request.json())
        session_id = self._open_session(body.get("session_id"), request.caller)
        choices.session_id = session_id
        seq = whole(body, "sampling_session_seq_id", low=0)
        if body.get("base_model") is not None:
            self._check_base_model(body["base_model"])
        if body.get("model_path") is not None:
            saved = checkpoint_path(body["model_path"], "model_path")
            source = SamplerSource(saved.kind, saved.run_id, name=saved.name)
            self.sampling.check_saved(source)
        elif body.get("base_model") is not None:
            source = SamplerSource("base")
        else:
            raise BadRequest("body: send model_path (a tinker:// path) or base_model")
        return {"sampling_session_id": self._register_sampling(session_id, seq, source,
                                                               choices),
                "type": "create_sampling_session"}

    def get_sampler(self, request: Request) -> dict[str, Any]:
        """``GET /samplers/{id}``: its base model (the tokenizer's folder) and path."""
        entry = self._sampling_session(request.match["sampler_id"])
        return {"sampler_id": entry.sampling_session_id, "base_model": self.model_name,
                "model_path": entry.source.model_path}

    def asample(self, request: Request, choices: Choices) -> dict[str, Any]:
        """``POST /asample``: a future, with one sequence id per sample. A request without
        a seed is given one here (kept in the journal, so a replay samples the same)."""
        body = body_object(request.json())
        entry = self._sampling_session(text(body, "sampling_session_id"))
        self._open_session(entry.session_id, request.caller)
        choices.session_id = entry.session_id
        seq = whole(body, "seq_id", low=0)
        job = parse_sample(body, self.engine.vocab_size, self.engine.limits)
        if job.seed is None:
            job = replace(job, seed=choices.pick(lambda: random.SystemRandom().randrange(2**62)))
        if self.futures.pending("Sample") >= self.settings.max_pending_samples:
            raise ServiceError(f"{self.settings.max_pending_samples} samples are waiting; "
                               "retry in a moment", status=429)
        future, _ = self.futures.submit(
            ("sample", entry.sampling_session_id, seq), digest_of(body), "Sample",
            lambda: task_waiter(lambda: Answer.proto(self.sampling.sample(entry.source, job)),
                                public_text=self.engine.public_text),
            lambda: choices.pick(new_request_id))
        return {"request_id": future.request_id,
                "sample_sequence_ids": [f"{future.request_id}-{index}"
                                        for index in range(job.num_samples)]}

    # ------------------------------------------------------------ futures

    def retrieve_future(self, request: Request) -> Response:
        """``POST /retrieve_future``: the answer, or a 408 try-again after the long poll."""
        request_id = text(body_object(request.json()), "request_id")
        future = self.futures.get(request_id)
        if future is None:
            raise NotFound(f"no future {request_id!r} (a finished one is kept "
                           f"{self.futures.retention_s:g} s; a restart forgets them all)")
        with self.long_polls.admit(self.settings.long_poll_s) as wait_s:
            answer = future.wait(wait_s)
        if answer is None:  # the SDK re-polls at once on 408, without logging a warning
            return Response(408, json_bytes({"type": "try_again", "request_id": request_id,
                                             "queue_state": "active"}))
        if self.journal is not None and future.request_type == "Sample" and not future.kept:
            # a replay hands a collected sample back instead of sampling it again
            future.kept = True
            self.journal.keep_answer(request_id, answer.content_type, answer.body)
        return Response(200, answer.body, answer.content_type)
