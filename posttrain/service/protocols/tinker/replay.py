"""Rebuilding the tinker routes' state after a restart: the journal replayed on a fresh engine.

``replay_journal`` hands every journaled submission (``journal``) back to the handler that
took it, with the choices it made, in the order they were made: sessions, training clients
(engine runs under their old ids), sampling sessions and futures (under their old request
ids) come back, and each run's adapter, AdamW moments and pending gradients are computed
again, step by step, to the same tensors (one compute thread, same requests, same machine).
A training client's next ``forward_backward`` then continues from its last step, a future
that finished before the kill answers as it did, and one that was in flight is computed and
answered, so the SDK's polls (which retry while the server is down) simply get their
result. Samples a client had collected are handed back from the journal, not sampled again.

Order is kept where it matters and not waited for where it does not: the primitives of a
training client go to its run's queue, which orders them by ``seq`` (the SDK sends the
chunks of a large batch last-first); everything else (a session, a new client, a sampling
session, a sample, a deletion, a session's end) waits until what came before it has
finished, so it sees the runs and saves as the original did. Entries of sessions that were
finished, or whose heartbeat lapsed, are dropped, not replayed: their runs had ended.
"""

from __future__ import annotations

import json
import time
from collections.abc import Callable
from dataclasses import dataclass, field
from typing import Any

from posttrain.access import Caller
from posttrain.http_core import HttpError, Request
from posttrain.service.engine.errors import ServiceError
from posttrain.service.protocols.tinker.futures import Answer
from posttrain.service.protocols.tinker.journal import (
    ENDS_A_SESSION,
    Choices,
    Entry,
    Journal,
    ReplayMismatch,
)
from posttrain.service.protocols.tinker.proto import ProtoError

# the primitives of a training client: its run's queue orders them by seq
SEQUENCED = frozenset({"forward_backward", "optim_step", "save_weights",
                       "save_weights_for_sampler", "save_weights_external"})


@dataclass
class ReplayReport:
    """What a replay did: how many submissions, in how long, and what did not replay."""

    submissions: int = 0
    dropped: int = 0  # entries of finished sessions, forgotten
    seconds: float = 0.0
    failures: list[str] = field(default_factory=list)

    def line(self) -> str:
        if not self.submissions:
            return "nothing to replay" + (f" ({self.dropped} entries of finished sessions "
                                          "dropped)" if self.dropped else "")
        text = f"replayed {self.submissions} tinker submission(s) in {self.seconds:.1f} s"
        if self.dropped:
            text += f" ({self.dropped} of finished sessions dropped)"
        if self.failures:
            text += f"; {len(self.failures)} did not replay"
        return text


def _in_place(entry: Entry) -> bool:
    """Is a ``load_weights`` entry a client's own ``load_state`` (sequenced), not a new
    client from a save?"""
    try:
        return json.loads(entry.body).get("model_id") is not None
    except (ValueError, AttributeError):
        return False


def replay_journal(service: Any, journal: Journal,
                   say: Callable[[str], None] = lambda text: None) -> ReplayReport:
    """Replay ``journal`` into ``service`` (a ``TinkerService`` on a fresh engine, before
    it answers anyone); returns what happened. ``say`` gets progress lines."""
    started = time.monotonic()
    entries = journal.entries()
    damaged = list(journal.damaged)  # said in the report, the rest still replays
    finished = {entry.session_id for entry in entries
                if entry.route in ENDS_A_SESSION and entry.session_id}
    report = ReplayReport(dropped=journal.forget_sessions(finished), failures=damaged)
    entries = [entry for entry in entries if entry.session_id not in finished]
    if not entries:
        return report
    kept = journal.answers()
    service.futures.preset({request_id: Answer(body, content_type)
                            for request_id, (content_type, body) in kept.items()})
    handlers = service.journaled_routes()
    say(f"replaying {len(entries)} tinker submission(s) from {journal.location}")
    pending: list[tuple[str, str | None]] = []  # (request id, run id) of unanswered futures
    alive = _KeepAlive(service.engine)
    replayed: set[str] = set()  # every replayed future's request id
    for number, entry in enumerate(entries, 1):
        sequenced = entry.route in SEQUENCED or (entry.route == "load_weights"
                                                 and _in_place(entry))
        if not sequenced:
            pending = _settle(service, pending, alive)
        if entry.route not in handlers:  # written by a newer posttrain
            report.failures.append(f"entry {entry.position}: unknown submission "
                                   f"{entry.route!r}")
            continue
        method, path, handler = handlers[entry.route]
        headers = {"content-encoding": entry.content_encoding} if entry.content_encoding else {}
        request = Request(method, path, entry.path_match, {}, headers, entry.body,
                          Caller(entry.caller))
        try:
            result = handler(request, Choices.replay(entry.choices, entry.session_id))
        except (ServiceError, HttpError, ProtoError, ReplayMismatch) as error:
            # e.g. a sampling session on a save deleted since: the rest still replays
            message = getattr(error, "message", None) or str(error)
            report.failures.append(f"entry {entry.position} ({entry.route}): {message}")
            continue
        request_id = result.get("request_id") if isinstance(result, dict) else None
        if request_id:
            model_id = result.get("model_id")
            run_id = service.training.run_of_model(model_id) if sequenced else None
            pending.append((request_id, run_id))
            replayed.add(request_id)
        if not sequenced:  # a new client exists before its primitives
            pending = _settle(service, pending, alive)
        if number % 100 == 0:
            say(f"  {number}/{len(entries)} replayed")
    _settle(service, pending, alive)
    journal.forget_answers(set(kept) - replayed)
    report.submissions = len(entries)
    report.seconds = time.monotonic() - started
    return report


class _KeepAlive:
    """Heartbeats every open session, at most once a ``every_s``: the replayed sessions'
    clients cannot heartbeat until the replay is over. Once per entry would make a replay
    quadratic in the sessions (3,000 took 20 s, 20,000 never started listening)."""

    def __init__(self, engine: Any, every_s: float = 1.0) -> None:
        self.engine = engine
        self.every_s = every_s
        self.last = float("-inf")

    def __call__(self) -> None:
        now = time.monotonic()
        if now - self.last >= self.every_s:
            self.last = now
            _keep_sessions_alive(self.engine)


def _settle(service: Any, pending: list[tuple[str, str | None]], alive: _KeepAlive
            ) -> list[tuple[str, str | None]]:
    """Wait until every replayed future has its answer, except those of runs held back by
    a missing ``seq`` (a request the client had not sent when the server stopped: it
    sends it again, and the run goes on); returns those still unanswered. Meanwhile the
    replayed sessions are kept alive (``alive``)."""
    if not pending:
        alive()
        return pending
    while True:
        alive()
        waiting, left = False, []
        for request_id, run_id in pending:
            future = service.futures.get(request_id)
            if future is None or future.answer is not None:
                continue
            left.append((request_id, run_id))
            if run_id is not None and _held_back(service.engine, run_id):
                continue
            if future.wait(0.5) is None:
                waiting = True
        if not waiting:
            return left


def _keep_sessions_alive(engine: Any) -> None:
    for session in engine.sessions():
        if session["status"] == "open":
            try:
                engine.heartbeat(session["session_id"])
            except ServiceError:  # closed meanwhile
                pass


def _held_back(engine: Any, run_id: str) -> bool:
    try:
        return engine.get_run(run_id).get("waiting_for_seq") is not None
    except ServiceError:
        return False
