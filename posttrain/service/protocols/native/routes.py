"""posttrain's own protocol: the ``/v1/training`` routes of the primitives engine.

Endpoints (JSON in, JSON out; errors are ``{"error": {"status", "message"}}``)::

    GET  /v1/training/health
    GET  /v1/training/capabilities
    POST /v1/training/tokenize                  {"messages": [...]} | {"text": ...}
    POST /v1/training/detokenize                {"token_ids": [...]}
    POST /v1/training/sessions                  {"heartbeat_timeout_s"?}
    GET  /v1/training/sessions/<id>
    POST /v1/training/sessions/<id>/heartbeat
    POST /v1/training/sessions/<id>/close
    POST /v1/training/runs                      {"session_id", "rank", "alpha",
                                                 "target_modules", "seed"}
    GET  /v1/training/runs/<id>
    POST /v1/training/runs/<id>/cancel
    POST /v1/training/runs/<id>/resume          {"session_id"}
    POST /v1/training/runs/<id>/<primitive>     {"seq"?, ...}: 202 + operation (200 on a retry)
    GET  /v1/training/operations/<id>?wait=<s>  long-poll until the operation ends (or wait s;
                                                 past max_long_polls waiting, crowded_poll_s)

Every route parses its JSON body here (``posttrain.service.protocols.native.parsing``)
into the engine's typed requests; the engine's errors become the core's error envelope.
"""

from __future__ import annotations

import re
from collections.abc import Callable
from typing import Any

from posttrain.http_core import HttpError, Request, Response, json_response
from posttrain.service.engine.capabilities import PRIMITIVES
from posttrain.service.engine.engine import Engine
from posttrain.service.engine.errors import NotFound, ServiceError
from posttrain.service.engine.operations import fingerprint
from posttrain.service.protocols.json_bodies import body_of
from posttrain.service.protocols.long_polls import LongPollGate
from posttrain.service.protocols.native.parsing import (
    parse_create_run,
    parse_detokenize,
    parse_primitive,
    parse_resume,
    parse_session,
    parse_tokenize,
    sequence_number,
)
from posttrain.service.schema import API_PREFIX

PREFIX = API_PREFIX
ID = re.compile(r"^[A-Za-z0-9_-]{1,64}$")
# ?wait= above this is a mistake, not a long poll: refused. Below it, a wait is cut to the
# engine's max_wait_s (30 s by default), as the endpoint table says.
LONGEST_WAIT_ASKED_S = 3600.0


def service_call(call: Callable[[Request], tuple[int, Any]]) -> Callable[[Request], Response]:
    """A route handler from ``call(request) -> (status, payload)``; the engine's errors
    become the core's error envelope."""

    def handle(request: Request) -> Response:
        for name, value in request.match.items():
            if not ID.match(value) and name != "primitive":
                raise HttpError(404, f"no {name.replace('_', ' ')} {value!r}")
        try:
            status, payload = call(request)
        except ServiceError as error:
            raise HttpError(error.status, error.message) from None
        return json_response(payload, status)

    return handle


def service_routes(engine: Engine, long_polls: LongPollGate | None = None
                   ) -> list[tuple[str, str, Callable[[Request], Response]]]:
    """(method, path, handler) of every endpoint; operation waits go through ``long_polls``
    (the server's gate, which its other wings share; by default one from the limits)."""
    long_polls = long_polls or LongPollGate.from_limits(engine.limits)

    def ok(payload: Any) -> tuple[int, Any]:
        return 200, payload

    def tokenize(request: Request) -> tuple[int, Any]:
        text_or_messages = parse_tokenize(body_of(request))
        if isinstance(text_or_messages, str):
            return ok({"token_ids": engine.tokenize_text(text_or_messages)})
        return ok({"token_ids": engine.tokenize_chat(text_or_messages)})

    def detokenize(request: Request) -> tuple[int, Any]:
        ids = parse_detokenize(body_of(request), engine.vocab_size, engine.limits)
        return ok({"text": engine.detokenize(ids)})

    def create_run(request: Request) -> tuple[int, Any]:
        body = body_of(request)
        engine.check_change(request.caller, session_id=body.get("session_id"))
        spec = parse_create_run(body, engine.limits, engine.module_names,
                                optional_modules=engine.optional_lora_targets)
        return ok(engine.create_run(body.get("session_id"), spec))

    def submit(request: Request) -> tuple[int, Any]:
        primitive = request.match["primitive"]
        if primitive not in PRIMITIVES:
            raise NotFound(f"no primitive {primitive!r}; the primitives are "
                           f"{', '.join(PRIMITIVES)}")
        body = body_of(request)
        run_id = request.match["run_id"]
        engine.require_run(run_id)  # an unknown run is a 404 whatever the body holds
        engine.check_change(request.caller, run_id=run_id)
        typed = parse_primitive(primitive, body, engine.vocab_size, engine.limits)
        operation, created = engine.submit(run_id, primitive, typed, seq=sequence_number(body),
                                           fingerprint=fingerprint(primitive, body))
        return (202 if created else 200), operation

    def poll(request: Request) -> tuple[int, Any]:
        wait_s = request.number_param("wait", 0.0, 0.0, LONGEST_WAIT_ASKED_S)
        with long_polls.admit(wait_s) as allowed_s:
            return ok(engine.get_operation(request.match["operation_id"], allowed_s))

    def session_change(change: Callable[[str], Any]) -> Callable[[Request], tuple[int, Any]]:
        def call(request: Request) -> tuple[int, Any]:
            engine.check_change(request.caller, session_id=request.match["session_id"])
            return ok(change(request.match["session_id"]))
        return call

    def create_session(request: Request) -> tuple[int, Any]:
        timeout_s = parse_session(body_of(request))
        return ok(engine.create_session(timeout_s, owner=request.caller.name or None))

    def cancel(request: Request) -> tuple[int, Any]:
        engine.check_change(request.caller, run_id=request.match["run_id"])
        return ok(engine.cancel_run(request.match["run_id"]))

    def resume(request: Request) -> tuple[int, Any]:
        session_id = parse_resume(body_of(request))
        engine.check_change(request.caller, run_id=request.match["run_id"],
                            session_id=session_id)
        return ok(engine.resume_run(request.match["run_id"], session_id))

    table: list[tuple[str, str, Callable[[Request], tuple[int, Any]]]] = [
        ("GET", "/health", lambda r: ok({"status": "ok"})),
        ("GET", "/capabilities", lambda r: ok(engine.capabilities())),
        ("POST", "/tokenize", tokenize),
        ("POST", "/detokenize", detokenize),
        ("POST", "/sessions", create_session),
        ("GET", "/sessions/{session_id}", lambda r: ok(engine.get_session(r.match["session_id"]))),
        ("POST", "/sessions/{session_id}/heartbeat", session_change(engine.heartbeat)),
        ("POST", "/sessions/{session_id}/close", session_change(engine.close_session)),
        ("POST", "/runs", create_run),
        ("GET", "/runs/{run_id}", lambda r: ok(engine.get_run(r.match["run_id"]))),
        ("POST", "/runs/{run_id}/cancel", cancel),
        ("POST", "/runs/{run_id}/resume", resume),
        ("POST", "/runs/{run_id}/{primitive}", submit),
        ("GET", "/operations/{operation_id}", poll),
    ]
    return [(method, PREFIX + path, service_call(call)) for method, path, call in table]
