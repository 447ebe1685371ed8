"""Where an OpenEnv environment runs: a server already running (``openenv:http://HOST:PORT``)
or an app posttrain starts itself (``openenv:MODULE:APP``).

``local_server(target)`` imports the app (a FastAPI app, as OpenEnv's ``create_app``
builds it, or a function that returns one), serves it with uvicorn on a free loopback
port in a daemon thread for the run's life, waits until ``/health`` answers (and says
where it serves, on standard error), and stops it when the run ends (``stop()``; also at
interpreter exit, so Ctrl-C and a failed run leave no server behind).
``check_health(url)`` says in one line when a server does not answer.
"""

from __future__ import annotations

import atexit
import json
import socket
import sys
import threading
import time
import urllib.error
import urllib.request
from dataclasses import dataclass, field
from typing import Any

from posttrain.errors import PosttrainError
from posttrain.plugins import load_object
from posttrain.text import short_line

#: how long a local app may take to answer /health after it starts
START_TIMEOUT_S = 30.0


def free_port() -> int:
    """A free TCP port on 127.0.0.1 (the OS picks it)."""
    with socket.socket() as probe:
        probe.bind(("127.0.0.1", 0))
        return int(probe.getsockname()[1])


def get_json(url: str, timeout_s: float, what: str,
             headers: dict[str, str] | None = None) -> Any:
    """The JSON document at ``url``; ``PosttrainError`` in one line naming ``what`` when the
    server is down, answers an error status or something that is not JSON, redirects to
    another host, or takes longer than ``timeout_s`` for the whole answer (a deadline for
    all of it, not each read: a server trickling a byte a second is cut at the deadline).
    ``headers``: sent with the request (a served environment's token)."""
    deadline = time.monotonic() + timeout_s
    request = urllib.request.Request(url, headers=headers or {})
    opener = urllib.request.build_opener(SameHostRedirects(what))
    try:
        with opener.open(request, timeout=timeout_s) as answer:
            body = read_by(answer, deadline, MAX_ANSWER_BYTES, what, url)
    except urllib.error.HTTPError as error:
        raise PosttrainError(f"{what}: {url} answered HTTP {error.code}") from None
    except (urllib.error.URLError, OSError) as error:
        reason = getattr(error, "reason", error)
        raise PosttrainError(f"{what}: no answer from {url} ({short_line(reason)}); is the "
                             "server running?") from None
    try:
        return json.loads(body)
    except (ValueError, RecursionError):
        raise PosttrainError(f"{what}: {url} did not answer JSON (it begins "
                             f"{body[:60]!r})") from None


#: the most of an answer read (a /schema is a few kilobytes)
MAX_ANSWER_BYTES = 1 << 22


def read_by(answer: Any, deadline: float, limit: int, what: str, url: str) -> bytes:
    """At most ``limit`` bytes of ``answer``, all of them before ``deadline``."""
    chunks: list[bytes] = []
    size = 0
    while size < limit:
        left = deadline - time.monotonic()
        if left <= 0:
            raise late(what, url, size)
        # the next read waits no longer than the deadline (http.client keeps the socket
        # in its reader; without it a silent server holds each read for the full timeout)
        sock = getattr(getattr(answer.fp, "raw", None), "_sock", None)
        if sock is not None:
            sock.settimeout(left)
        try:
            chunk = answer.read1(min(65536, limit - size))
        except TimeoutError:  # the deadline came inside a read
            raise late(what, url, size) from None
        if not chunk:
            break
        chunks.append(chunk)
        size += len(chunk)
    return b"".join(chunks)


def late(what: str, url: str, size: int) -> PosttrainError:
    return PosttrainError(f"{what}: {url} did not finish its answer in time ({size} bytes "
                          "read); raise --env-arg timeout_s")


class SameHostRedirects(urllib.request.HTTPRedirectHandler):
    """Redirects followed only to the same scheme, host and port (a server that sends
    posttrain elsewhere would get its headers, the token among them)."""

    def __init__(self, what: str) -> None:
        self.what = what

    def redirect_request(self, req: Any, fp: Any, code: int, msg: str, headers: Any,
                         newurl: str) -> Any:
        from urllib.parse import urljoin, urlsplit

        target = urlsplit(urljoin(req.full_url, newurl))
        source = urlsplit(req.full_url)
        if (target.scheme, target.netloc) != (source.scheme, source.netloc):
            raise PosttrainError(f"{self.what}: {req.full_url} redirected to another host "
                                 f"({target.scheme}://{target.netloc[:80]}); not followed")
        return super().redirect_request(req, fp, code, msg, headers, newurl)


def check_health(base_url: str, timeout_s: float, what: str) -> None:
    """``/health`` answers: the server is up (one line when not)."""
    get_json(f"{base_url}/health", timeout_s, what)


#: the token ``posttrain env serve`` asks for, which posttrain's OpenEnv client sends to the
#: URL ``--env openenv:URL`` names (not POSTTRAIN_TOKEN, the dashboard's: that must never
#: go to a URL the user names)
SERVE_TOKEN_ENV = "POSTTRAIN_ENV_TOKEN"


def token_headers() -> dict[str, str]:
    """The Authorization header of ``$POSTTRAIN_ENV_TOKEN``, when it is set."""
    import os

    token = os.environ.get(SERVE_TOKEN_ENV)
    return {"Authorization": f"Bearer {token}"} if token else {}


@dataclass
class LocalServer:
    """An OpenEnv app served by uvicorn in a daemon thread of this process."""

    target: str
    app: Any
    port: int = field(default_factory=free_port)
    _server: Any = None
    _thread: threading.Thread | None = None

    @property
    def url(self) -> str:
        return f"http://127.0.0.1:{self.port}"

    def start(self, timeout_s: float = START_TIMEOUT_S) -> LocalServer:
        import uvicorn

        self._server = uvicorn.Server(uvicorn.Config(self.app, host="127.0.0.1",
                                                     port=self.port, log_level="warning"))
        self._thread = threading.Thread(target=self._server.run, daemon=True,
                                        name=f"openenv {self.target}")
        self._thread.start()
        deadline = time.monotonic() + timeout_s
        while True:
            try:
                check_health(self.url, 1.0, f"openenv:{self.target}")
                break
            except PosttrainError:
                if not self._thread.is_alive() or time.monotonic() > deadline:
                    self.stop()
                    raise PosttrainError(
                        f"--env openenv:{self.target}: the app did not answer /health within "
                        f"{timeout_s:g} s of starting on {self.url}") from None
                time.sleep(0.05)
        atexit.register(self.stop)
        # on standard error: a --json summary on standard output stays JSON
        print(f"openenv: serving {self.target} on {self.url} for this run", file=sys.stderr,
              flush=True)
        return self

    def stop(self) -> None:
        """Ask uvicorn to finish (its lifespan's shutdown runs) and wait for the thread."""
        if self._server is not None:
            self._server.should_exit = True
        if self._thread is not None and self._thread is not threading.current_thread():
            self._thread.join(timeout=10)


def local_server(target: str) -> LocalServer:
    """Start the app ``target`` (``module:attribute`` or ``file.py:attribute``) names."""
    app = load_object(target, "--env openenv:", "my_env.server:app")
    if callable(app) and not hasattr(app, "routes"):
        try:  # a factory of the app
            app = app()
        except Exception as error:  # the user's factory: one line
            raise PosttrainError(f"--env openenv:{target}: calling it to build the app "
                                 f"raised {type(error).__name__}: {short_line(error)}") from None
    if not hasattr(app, "routes"):
        raise PosttrainError(f"--env openenv:{target} is not an ASGI app (OpenEnv's "
                             f"create_app(...) builds one); it is a {type(app).__name__}")
    return LocalServer(target, app).start()
