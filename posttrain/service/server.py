"""The server of ``posttrain serve``: one engine behind the routes of its three protocol wings.

- posttrain's own primitives under ``/v1/training`` (``posttrain.service.protocols.native``);
- OpenAI's ``/v1/chat/completions`` and ``/v1/models`` (``posttrain.service.protocols.openai``);
- when the ``tinker`` package is installed, the tinker SDK's wire protocol under ``/api/v1/``
  (``posttrain.service.protocols.tinker``).

The server binds 127.0.0.1 unless told otherwise and refuses to bind anywhere else
without a token; with a token every request needs ``Authorization: Bearer <token>``.
Bodies over the published ``max_body_bytes`` are refused (413) before they are read.
Whatever a request holds, the answer is a 4xx with a message or a result: an unexpected
exception is a bug, answered 500 with its message, and the server keeps serving.
"""

from __future__ import annotations

import sys
import threading
from collections.abc import Mapping
from pathlib import Path
from typing import Any

from posttrain.errors import PosttrainError
from posttrain.http_core import READ_TIMEOUT_SECONDS, HttpServer, Rules
from posttrain.http_core import check_bind as check_core_bind
from posttrain.interrupts import interruptible
from posttrain.runs.claim import RunClaim, try_claim
from posttrain.service.engine.engine import Engine
from posttrain.service.engine.errors import ServiceError
from posttrain.service.engine.requests import Limits
from posttrain.service.protocols.long_polls import LongPollGate
from posttrain.service.protocols.native.routes import PREFIX, service_routes
from posttrain.service.protocols.openai.routes import openai_routes
from posttrain.service.protocols.tinker.journal import Journal
from posttrain.service.protocols.tinker.replay import replay_journal
from posttrain.service.protocols.tinker.routes import TinkerService, tinker_available

#: held by the server using a state folder (``serve``)
SERVE_LOCK = "serve.lock"


def default_state_dir() -> Path:
    """``~/.cache/posttrain/service`` (read at call time)."""
    return Path.home() / ".cache/posttrain/service"


class RunningServer:
    """A server on a background thread: ``url``, ``port``, ``engine``, ``stop()``."""

    def __init__(self, server: HttpServer, engine: Engine):
        self._server = server
        self.engine = engine
        self.port = server.port
        self.url = server.url
        server.start()

    @property
    def http(self) -> HttpServer:
        """The HTTP server itself (to add routes to)."""
        return self._server

    def stop(self, *, shutdown_engine: bool = True) -> None:
        """Stop answering; with ``shutdown_engine`` also stop the engine's workers."""
        self._server.shutdown()
        self._server.server_close()
        if shutdown_engine:
            self.engine.shutdown()


def check_bind(host: str, token: str | None) -> None:
    """Refuse to bind beyond loopback without a token (anyone could train on the box)."""
    check_core_bind(host, token, "the service")


def start_server(
    engine: Engine,
    host: str = "127.0.0.1",
    port: int = 8400,
    token: str | None = None,
    *,
    verbose: bool = False,
    read_timeout_s: float = READ_TIMEOUT_SECONDS,
    tokens: Mapping[str, str] | None = None,
    journal: bool = True,
    state_store: str | None = None,
) -> RunningServer:
    """Serve ``engine`` on a background thread (port 0 picks a free port). A client that
    stalls for ``read_timeout_s`` inside its request is dropped. ``tokens``: a tokens
    file's ``{token: name}`` (``posttrain.access``) beside the administrator's ``token``.

    With ``journal`` the tinker routes keep every submission in the state store (SQLite
    in the state folder, or the PostgreSQL database ``state_store`` names) and, when it
    holds some from an earlier server, replay them before listening (their clients'
    requests wait in the SDK's retries meanwhile): see ``protocols.tinker.journal``."""
    check_bind(host, token or ("named tokens" if tokens else None))
    # one cap on long polls for every wing: they all hold threads of the same pool
    long_polls = LongPollGate.from_limits(engine.limits)
    routes = [*service_routes(engine, long_polls), *openai_routes(engine)]
    if tinker_available():
        tinker = TinkerService(engine, long_polls=long_polls,
                               journal=open_journal(engine, state_store) if journal else None)
        if tinker.journal is not None:
            replay_before_serving(tinker, verbose)
        routes += tinker.routes()
    server = HttpServer(host, port, Rules(token=token or None, tokens=tokens or None,
                                          max_body_bytes=engine.limits.max_body_bytes,
                                          read_timeout_s=read_timeout_s,
                                          name="posttrain serve", verbose=verbose,
                                          public_text=engine.public_text))
    for method, path, handler in routes:
        server.add_route(method, path, handler)
    return RunningServer(server, engine)


def open_journal(engine: Engine, state_store: str | None) -> Journal:
    """The tinker routes' journal; ``PosttrainError`` (one line, what to do) when the state
    store cannot be opened."""
    try:
        return Journal(engine.state_dir, state_store)
    except ServiceError as error:
        raise PosttrainError(f"posttrain serve: {error.message}") from None


def replay_before_serving(tinker: TinkerService, verbose: bool) -> None:
    """Rebuild the tinker routes' state from their journal (what a stopped server held),
    saying so on stderr (the progress lines only when ``verbose``)."""
    def say(text: str) -> None:
        print(f"posttrain serve: {text}", file=sys.stderr, flush=True)

    assert tinker.journal is not None
    report = replay_journal(tinker, tinker.journal, say if verbose else lambda text: None)
    if report.submissions or report.dropped:  # said even with --quiet: it is no request log
        say(report.line())
    for failure in report.failures:
        say(failure)


def serve(
    base_model: str,
    host: str = "127.0.0.1",
    port: int = 8400,
    token: str | None = None,
    state_dir: str | Path | None = None,
    *,
    verbose: bool = True,
    torch_threads: int | None = None,
    limits: Limits | None = None,
    tokens: Mapping[str, str] | None = None,
    journal: bool = True,
    state_store: str | None = None,
) -> None:
    """Load ``base_model`` and serve the primitives until Ctrl-C (blocking). One server per
    state folder: the folder's ``serve.lock`` is held for the server's life (the kernel
    lets it go when the process dies), and a second server on it stops before loading."""
    check_bind(host, token or ("named tokens" if tokens else None))
    folder = Path(state_dir or default_state_dir())
    claim = claim_state_folder(folder)
    try:
        _serve_claimed(base_model, host, port, token, folder, verbose=verbose,
                       torch_threads=torch_threads, limits=limits, tokens=tokens,
                       journal=journal, state_store=state_store)
    finally:
        claim.release()


def claim_state_folder(folder: Path) -> RunClaim:
    """The state folder's lock, or ``PosttrainError`` saying another server holds it (two
    servers on one folder would replay one journal and write the same runs)."""
    try:
        folder.mkdir(parents=True, exist_ok=True)
        claim = try_claim(folder, SERVE_LOCK)
    except OSError as error:
        raise PosttrainError(f"posttrain serve: cannot use the state folder {folder} "
                             f"({error.strerror or error})") from None
    if claim is None:
        raise PosttrainError(f"posttrain serve: another server is using the state folder "
                             f"{folder} (it holds {folder / SERVE_LOCK}); stop it, or give "
                             "this one its own --state-dir")
    return claim


def _serve_claimed(base_model: str, host: str, port: int, token: str | None, state_dir: Path,
                   *, verbose: bool, torch_threads: int | None, limits: Limits | None,
                   tokens: Mapping[str, str] | None, journal: bool,
                   state_store: str | None) -> None:
    engine = Engine(base_model, state_dir, torch_threads=torch_threads, limits=limits)
    running = start_server(engine, host, port, token, verbose=verbose, tokens=tokens,
                           journal=journal, state_store=state_store)
    dormant = [r for r in engine_runs(engine) if r["status"] == "dormant"]
    print(f"posttrain serve: {base_model} on {running.url}{PREFIX} (state in {engine.state_dir})",
          flush=True)
    print(f"  OpenAI-compatible route: {running.url}/v1 (model {base_model!r}; docs/service.md, "
          "'Use it as an OpenAI endpoint')", flush=True)
    if tinker_available():
        key = ("<your token, which must start with tml->" if token or tokens
               else "tml-local")
        print(f"  tinker SDK route: TINKER_BASE_URL={running.url} TINKER_API_KEY={key} "
              "(docs/service.md, 'Use it with the tinker SDK')", flush=True)
    else:
        print("  the tinker SDK route is off: pip install 'posttrain[tinker]' turns it on",
              flush=True)
    if dormant:
        print(f"  {len(dormant)} dormant run(s) can be resumed: "
              + ", ".join(r["run_id"] for r in dormant), flush=True)
    try:
        with interruptible():  # Ctrl-C and SIGTERM, even when started with SIGINT ignored
            threading.Event().wait()
    except KeyboardInterrupt:
        pass
    finally:
        running.stop()


def engine_runs(engine: Engine) -> list[dict[str, Any]]:
    """Every run the engine knows (for the start-up banner)."""
    return [engine.get_run(run_id) for run_id in engine.run_ids()]
