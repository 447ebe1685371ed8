"""The primitives engine: one base model, sessions, LoRA runs, and their ordered operations.

The protocol wings (``posttrain.service.protocols``) are thin translations onto this
class's public methods; tests and the benchmark can drive it in-process. It takes typed
requests (``posttrain.service.engine.requests``), never a wire format. What it guarantees:

- **Validation first.** Every request is checked (``posttrain.service.engine.checks``)
  before it is queued; a bad one raises a ``ServiceError`` (4xx) and nothing changes.
- **Order.** Each run has one FIFO worker executing its operations in sequence-number
  order; retries are idempotent by ``seq`` (``posttrain.service.engine.operations``).
- **One computation at a time.** All torch work of all runs runs on one compute thread
  (``posttrain.service.engine.compute``): on a few CPU cores, two runs computing at once only
  fight for the same cores.
- **Sessions.** A session lives while it heartbeats; one silent for longer than its
  ``heartbeat_timeout_s`` is reaped (state ``expired``) and its runs are cancelled, like
  an explicit close.
- **Restarts.** Runs are recorded on disk; a restarted engine lists runs that were active
  as ``dormant`` and ``resume_run`` brings one back from its last ``save_state``.
"""

from __future__ import annotations

import sys
import threading
import time
import uuid
from dataclasses import replace
from pathlib import Path
from typing import Any

from posttrain.access import Caller, made_by
from posttrain.policy.loading import load_policy
from posttrain.service.engine import checks, state
from posttrain.service.engine.capabilities import PRIMITIVES, capabilities_of
from posttrain.service.engine.compute import ComputeThread
from posttrain.service.engine.errors import (
    BadRequest,
    Conflict,
    Damaged,
    Forbidden,
    NotFound,
    TooManyRequests,
    hide_folders,
)
from posttrain.service.engine.lora_model import (
    LoraModel,
    linear_module_names,
    unembedding_module_name,
)
from posttrain.service.engine.operations import Operation
from posttrain.service.engine.requests import Limits, LoraSpec
from posttrain.service.engine.runs import Run
from posttrain.service.engine.sampler_models import SamplerModels
from posttrain.service.engine.sessions import Session, Sessions
from posttrain.service.engine.text_encoding import Encoder

DEFAULT_HEARTBEAT_TIMEOUT_S = checks.DEFAULT_HEARTBEAT_TIMEOUT_S


def new_run_id() -> str:
    """A fresh run id (``run-`` and 16 hex digits)."""
    return "run-" + uuid.uuid4().hex[:16]


class Engine:
    """Holds the base model and every session and run; thread-safe."""

    def __init__(
        self,
        base_model: str,
        state_dir: str | Path,
        *,
        limits: Limits | None = None,
        policy: Any = None,
        reap_interval_s: float = 1.0,
        torch_threads: int | None = None,
        clock: Any = time.monotonic,
    ):
        self.base_model = base_model
        self.state_dir = Path(state_dir).expanduser()
        self.state_dir.mkdir(parents=True, exist_ok=True)
        self.limits = limits or Limits()
        self.policy = policy or load_policy(base_model, device="cpu", show_progress=False)
        for parameter in self.policy.model.parameters():
            parameter.requires_grad_(False)
        config = self.policy.model.config
        self.vocab_size = int(config.vocab_size)
        context = int(getattr(config, "max_position_embeddings", self.limits.max_sequence_tokens))
        if context < self.limits.max_sequence_tokens:
            self.limits = replace(self.limits, max_sequence_tokens=context)
        # client text is checked for length before it is tokenised, and tokenised in
        # linear time (a long unbroken run made one request cost hours)
        self.encoder = Encoder.for_tokenizer(self.policy.tokenizer,
                                             self.limits.max_sequence_tokens)
        self.module_names = linear_module_names(self.policy.model)
        # LoRA may also go on the unembedding when asked by name (never by default)
        unembedding = unembedding_module_name(self.policy.model)
        self.optional_lora_targets = (unembedding,) if unembedding else ()
        self.compute = ComputeThread(torch_threads)
        # what the protocol wings sample: the base, live runs' snapshots, saved adapters
        self.sampler_models = SamplerModels(base_model, self.policy, self.state_dir,
                                            self.run_models)
        self._lock = threading.RLock()
        self._sessions = Sessions(self._lock, clock, self._cancel_runs_of)
        self._runs: dict[str, Run] = {}
        self._operations: dict[str, Operation] = {}
        self._damaged_runs: dict[str, state.DamagedRecord] = {}
        self._stopping = threading.Event()
        self._session_end_listeners: list[Any] = []
        self._load_run_records()
        self._reaper = threading.Thread(
            target=self._reap_loop, args=(reap_interval_s,), name="session-reaper", daemon=True
        )
        self._reaper.start()

    # ------------------------------------------------------------ capabilities

    def capabilities(self) -> dict[str, Any]:
        """Primitives, losses (inputs, config keys, defaults), base model, limits
        (``capabilities.capabilities_of``)."""
        return capabilities_of(self)

    # ------------------------------------------------------------ tokenizer helpers

    def tokenize_text(self, text: str) -> list[int]:
        """Token ids of plain text (no special tokens added), its length checked first
        (``text_encoding``)."""
        return self.encoder.encode(text, "text")

    def tokenize_chat(self, messages: list[dict[str, Any]]) -> list[int]:
        """Token ids of a chat through the chat template, ready for the reply, its length
        checked first (``text_encoding``)."""
        return self.encoder.encode_chat(messages)

    def detokenize(self, token_ids: Any) -> str:
        """The text of ``token_ids`` (special tokens skipped); ``BadRequest`` for an id
        outside the vocabulary."""
        ids = checks.token_ids(token_ids, "token_ids", self.vocab_size,
                               self.limits.max_sequence_tokens)
        return self.policy.tokenizer.decode(list(ids), skip_special_tokens=True)

    # ------------------------------------------------------------ sessions

    def create_session(self, heartbeat_timeout_s: float = DEFAULT_HEARTBEAT_TIMEOUT_S,
                       session_id: str | None = None, owner: str | None = None
                       ) -> dict[str, Any]:
        """Open a session; ``heartbeat_timeout_s`` (0.5 s to a day) is how long it may stay
        silent. ``session_id``: the id to give it (a wing rebuilding the sessions a restart
        lost chooses them itself, ``sessions.new_session_id``); by default a fresh one.
        ``owner``: the tokens-file name opening it; the runs created in it are that name's
        (``check_change``)."""
        return self._sessions.create(checks.heartbeat_timeout(heartbeat_timeout_s),
                                     session_id, owner)

    def check_change(self, caller: Caller, *, session_id: Any = None,
                     run_id: Any = None) -> None:
        """``Forbidden`` unless ``caller`` may change session ``session_id`` and run
        ``run_id`` (those given): the administrator may change anything, a tokens-file name
        only what it created. Every route that changes a session or a run calls this
        first, before it parses the rest of the request. An unknown id is left to the
        action itself (its 404)."""
        if not caller.restricted:
            return
        owners = []
        if isinstance(session_id, str):
            with self._lock:
                known = self._sessions.find(session_id)
            if known is not None:
                owners.append(("session", session_id, known.owner))
        if isinstance(run_id, str):
            with self._lock:
                run = self._runs.get(run_id)
            if run is not None:
                owners.append(("run", run_id, run.owner))
        for kind, ident, owner in owners:
            if not caller.may_change(owner):
                raise Forbidden(f"{kind} {ident} was {made_by(owner)}; a token changes only "
                                "its own sessions and runs (the server's --token changes any)")

    def heartbeat(self, session_id: str) -> dict[str, Any]:
        """Keep a session alive (``Conflict`` once it is closed or expired)."""
        return self._sessions.heartbeat(session_id)

    def close_session(self, session_id: str) -> dict[str, Any]:
        """Close a session; its runs that are still active are cancelled. Idempotent."""
        return self._sessions.close(session_id)

    def sessions(self) -> list[dict[str, Any]]:
        """Every session this engine has seen (open, closed or expired)."""
        return self._sessions.all()

    def get_session(self, session_id: str) -> dict[str, Any]:
        """A session in any state (``NotFound`` for an unknown id)."""
        return self._sessions.get(session_id)

    def on_session_end(self, listener: Any) -> None:
        """Call ``listener(session_id, status)`` when a session is closed or expires
        (under the engine's lock: it must be quick and must not call back into the
        engine). The tinker wing journals expiries with it."""
        self._session_end_listeners.append(listener)

    def _cancel_runs_of(self, session: Session, why: str) -> None:
        for listener in self._session_end_listeners:
            listener(session.session_id, session.status)
        for run_id in session.run_ids:
            run = self._runs.get(run_id)
            if run is not None and not run.terminal:
                run.cancel(why)

    def forget_old_operations(self, now: float | None = None) -> int:
        """Drop operations that finished more than ``limits.operation_retention_s`` ago
        (results included) from memory; returns how many went. Without this a long-lived
        server keeps every sample it ever returned."""
        cutoff = (time.time() if now is None else now) - self.limits.operation_retention_s
        with self._lock:
            runs = list(self._runs.values())
        forgotten = [op for run in runs if run.queue is not None
                     for op in run.queue.forget_finished(cutoff)]
        with self._lock:
            for op in forgotten:
                self._operations.pop(op.id, None)
            # operations of queues that are gone (a run whose worker stopped) age out too
            for op_id, op in list(self._operations.items()):
                if op.terminal and op.finished_at is not None and op.finished_at < cutoff:
                    del self._operations[op_id]
                    forgotten.append(op)
        return len(forgotten)

    def reap(self) -> list[str]:
        """Expire sessions whose heartbeat lapsed and cancel their runs; returns their ids.
        Also forgets operations older than the retention limit."""
        self.forget_old_operations()
        return self._sessions.expire_silent()

    def _reap_loop(self, interval: float) -> None:
        while not self._stopping.wait(interval):
            self.reap()

    # ------------------------------------------------------------ runs

    def _new_run(self, run_id: str, session_id: str | None, spec: LoraSpec,
                 created_at: float | None = None, owner: str | None = None) -> Run:
        return Run(
            run_id,
            session_id,
            spec,
            state_dir=self.state_dir,
            base_model=self.base_model,
            compute=self.compute,
            max_queued=self.limits.max_queued_operations,
            max_ahead=self.limits.max_seq_ahead,
            created_at=created_at,
            public_text=self.public_text,
            owner=owner,
        )

    def new_lora_model(self, spec: LoraSpec) -> LoraModel:
        """A fresh ``LoraModel`` (a run's tensors) for ``spec``, built on the compute thread;
        the engine's runs get theirs here, and the benchmark drives one in-process."""
        return self.compute.run(LoraModel, self.policy.model, self.policy.tokenizer, spec)

    def _check_capacity(self) -> None:
        live = sum(1 for run in self._runs.values() if run.status in ("active", "cancelling"))
        if live >= self.limits.max_runs:
            raise TooManyRequests(
                f"{live} runs are live (limit {self.limits.max_runs}); finish or cancel one"
            )

    def create_run(self, session_id: Any, spec: LoraSpec, run_id: str | None = None
                   ) -> dict[str, Any]:
        """A new LoRA run with adapter ``spec`` in open session ``session_id``. ``BadRequest``
        for a spec this model cannot take, ``NotFound`` / ``Conflict`` for a session that is
        unknown or not open, ``TooManyRequests`` past ``limits.max_runs``. ``run_id``: the
        id to give it (``new_run_id``; a replay re-creating a run a restart made dormant
        takes its id back), by default a fresh one."""
        if run_id is not None:  # a replayed journal's value: data, never a path
            checks.state_name(run_id, "run id")
        spec = checks.lora_spec(spec.rank, spec.alpha, spec.seed, spec.target_modules,
                                self.limits, self.module_names, self.optional_lora_targets)
        self._sessions.open(session_id)
        with self._lock:
            self._check_capacity()
        model = self.new_lora_model(spec)  # the slow part, outside the lock
        return self._start_new_run(session_id, spec, model, run_id).describe()

    def _start_new_run(self, session_id: Any, spec: LoraSpec, model: LoraModel,
                       run_id: str | None = None) -> Run:
        """Register and start a new run on ``model`` (numbered from seq 1) in the session,
        if it is still open and the run table still has room. A given ``run_id`` may name
        a dormant or ended run (it is replaced), never a live one."""
        with self._lock:
            session = self._sessions.open(session_id)  # still open?
            self._check_capacity()
            known = self._runs.get(run_id) if run_id else None
            if known is not None and known.status in ("active", "cancelling", "resuming"):
                raise Conflict(f"run {run_id} is {known.status}; a live run is not replaced")
            self._damaged_runs.pop(run_id or "", None)
            run = self._new_run(run_id or new_run_id(), session.session_id, spec,
                                owner=session.owner)
            self._runs[run.run_id] = run
            session.run_ids.append(run.run_id)
            run.start(model, first_seq=1)
        return run

    def create_run_from_state(self, session_id: str, source_run_id: str, name: str, *,
                              optimizer: bool, run_id: str | None = None) -> dict[str, Any]:
        """A new run in an open session that starts from saved state ``name`` of run
        ``source_run_id`` (any run under the state folder: live, ended, or from before a
        restart): its LoRA spec, adapter, step and, with ``optimizer``, its AdamW moments.
        The state is loaded before the run's queue opens, and the run numbers from seq 1
        (what the tinker SDK's ``create_training_client_from_state*`` expects).

        ``NotFound`` when there is no such state, ``BadRequest`` when it was saved on
        another base model. ``run_id`` as in ``create_run``."""
        source_run_id = checks.state_name(source_run_id, "run_id")
        name = checks.state_name(name, "name")
        if run_id is not None:
            checks.state_name(run_id, "run id")
        folder = state.run_folder(self.state_dir, source_run_id) / "states" / name
        try:
            info = state.read_state_info(folder)
        except LookupError as error:
            raise NotFound(str(error)) from None
        if info.get("base_model") != self.base_model:
            raise BadRequest(f"state {name} of run {source_run_id} was saved on base "
                             f"model {info.get('base_model')!r}; this server runs "
                             f"{self.base_model!r}")
        spec = state.lora_from_json(info["lora"])
        self._sessions.open(session_id)
        with self._lock:
            self._check_capacity()
        model = self.new_lora_model(spec)
        try:
            self.compute.run(state.load_state, folder, model, base_model=self.base_model,
                             with_optimizer=optimizer)
        except (LookupError, ValueError) as error:
            raise BadRequest(str(error)) from None
        run = self._start_new_run(session_id, spec, model, run_id)
        return {**run.describe(), "loaded_from": {"run_id": source_run_id, "name": name,
                                                  "step": info["step"],
                                                  "optimizer": optimizer}}

    def _run(self, run_id: str) -> Run:
        with self._lock:
            run = self._runs.get(run_id)
            damaged = self._damaged_runs.get(run_id)
        if damaged is not None:
            raise Damaged(damaged.message())
        if run is None:
            raise NotFound(f"no run {run_id!r}")
        return run

    def run_models(self) -> dict[str, Any]:
        """Each live run's ``LoraModel`` (trainer adapter and sampler versions), by run id
        (what ``sampler_models`` resolves a run's snapshots in)."""
        with self._lock:
            return {run_id: run.model for run_id, run in self._runs.items()
                    if run.model is not None}

    def damaged_runs(self) -> list[dict[str, str]]:
        """The runs whose ``run.json`` could not be read at start-up: ``run_id``, ``file``
        (relative to the state folder) and ``message``."""
        with self._lock:
            return [{"run_id": run_id, "file": damaged.file, "message": damaged.message()}
                    for run_id, damaged in self._damaged_runs.items()]

    def public_text(self, text: str) -> str:
        """``text`` (an exception's message bound for a client) without this server's
        folders: a path under the state folder reads relative to it, the base model's
        folder as ``<base model name>``, the home folder as ``~``."""
        folders = {str(Path.home()): "~"}
        for folder in {self.state_dir, self.state_dir.resolve()}:
            folders[f"{folder}/"] = ""
            folders[str(folder)] = "the state folder"
        model_folder = getattr(self.policy, "source", None)
        if model_folder:
            for folder in {Path(model_folder), Path(model_folder).resolve()}:
                folders[str(folder)] = f"<{self.base_model}>"
        return hide_folders(text, folders)

    def run_ids(self) -> list[str]:
        """Every run this engine knows, live, terminal or dormant."""
        with self._lock:
            return list(self._runs)

    def get_run(self, run_id: str) -> dict[str, Any]:
        """A run's status (``NotFound`` for an unknown id)."""
        return self._run(run_id).describe()

    def require_run(self, run_id: str) -> None:
        """``NotFound`` unless this engine knows run ``run_id`` (live, ended or dormant)."""
        self._run(run_id)

    def cancel_run(self, run_id: str) -> dict[str, Any]:
        """Cancel a run: queued operations are cancelled, the running one finishes. Idempotent."""
        run = self._run(run_id)
        cancelled = run.cancel("cancelled by the client")
        return {**run.describe(), "cancelled_operations": [op.id for op in cancelled]}

    def resume_run(self, run_id: str, session_id: Any) -> dict[str, Any]:
        """Bring a ``dormant`` run (active when the server stopped) back from its last
        ``save_state``, attached to open session ``session_id``; numbering continues after
        that save."""
        run = self._run(run_id)
        with self._lock:
            session = self._sessions.open(session_id)
            if run.status != "dormant":
                raise Conflict(f"run {run_id} is {run.status}; only a dormant run can be resumed")
            self._check_capacity()
            run.status = "resuming"
        try:
            model = self.new_lora_model(run.spec)
            folder = state.run_folder(self.state_dir, run_id) / "states" / run.last_state["name"]
            self.compute.run(state.load_state, folder, model, base_model=self.base_model)
        except Exception:
            run.status = "dormant"
            raise
        with self._lock:
            try:
                session = self._sessions.open(session.session_id)  # closed meanwhile?
            except Exception:
                run.status = "dormant"
                raise
            run.session_id = session.session_id
            session.run_ids.append(run_id)
            run.start(model, first_seq=run.last_state["seq"] + 1)
        return {**run.describe(), "resumed_from": dict(run.last_state)}

    def _load_run_records(self) -> None:
        records, damaged = state.read_run_records(self.state_dir)
        for entry in damaged:
            # said once, here; a client asking for the run gets the same message (a 409)
            print(f"posttrain service: {entry.message()}", file=sys.stderr, flush=True)
            self._damaged_runs[entry.run_id] = entry
        for record in records:
            if record.get("base_model") != self.base_model:
                continue
            run = self._new_run(
                record["run_id"], None, state.lora_from_json(record["lora"]),
                record.get("created_at"),
            )
            run.restore(record)
            self._runs[run.run_id] = run

    # ------------------------------------------------------------ operations

    def submit(self, run_id: str, primitive: str, request: Any, *, seq: int | None = None,
               fingerprint: str) -> tuple[dict[str, Any], bool]:
        """Check and queue one primitive's typed request (``requests.REQUEST_TYPES``) as
        number ``seq`` of the run (None: the next one); returns ``(operation json,
        created)``. ``fingerprint`` identifies what the client sent (``operations.
        fingerprint``): a retry of ``seq`` with the same one gets the first operation back,
        ``created`` False; with another, a ``Conflict``."""
        run = self._run(run_id)
        if primitive not in PRIMITIVES:
            raise NotFound(
                f"no primitive {primitive!r}; the primitives are {', '.join(PRIMITIVES)}"
            )
        request = checks.check_request(primitive, request, self.vocab_size, self.limits)
        seq = checks.sequence_number(seq)
        operation, created = run.submit(seq, primitive, fingerprint, request)
        with self._lock:
            self._operations[operation.id] = operation
        return operation.to_json(), created

    def refuse(self, run_id: str, seq: int, primitive: str, why: str, *, fingerprint: str
               ) -> dict[str, Any]:
        """Record sequence number ``seq`` of a run as refused with message ``why``: a failed
        operation that never runs, so the operations numbered after it do not wait for it
        (see ``OrderedQueue.refuse``). For a client that numbers every request itself and
        goes on counting after a refusal. Returns the operation json."""
        run = self._run(run_id)
        operation, _ = run.refuse(seq, primitive, fingerprint, why)
        with self._lock:
            self._operations[operation.id] = operation
        return operation.to_json()

    def get_operation(self, operation_id: str, wait_s: float = 0.0) -> dict[str, Any]:
        """An operation's state; waits up to ``wait_s`` (capped) for it to end."""
        with self._lock:
            operation = self._operations.get(operation_id)
        if operation is None:
            raise NotFound(
                f"no operation {operation_id!r} (a finished operation is kept for "
                f"{self.limits.operation_retention_s:g} s, then forgotten)"
            )
        if wait_s > 0 and not operation.terminal:
            operation.done.wait(min(wait_s, self.limits.max_wait_s))
        return operation.to_json()

    # ------------------------------------------------------------ shutdown

    def shutdown(self) -> None:
        """Stop the reaper and every run's worker (queued operations are cancelled).

        Run records stay as they are on disk, so a new engine on the same state folder
        sees the active ones as dormant.
        """
        self._stopping.set()
        with self._lock:
            runs = list(self._runs.values())
        for run in runs:
            if run.queue is not None:
                run.queue.close("the server is shutting down", cancel_queued=True)
        for run in runs:
            if run.queue is not None:
                run.queue.join(timeout=30)
        self.compute.stop()
