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


def get_json(url: str, timeout_s: float, what: str) -> Any:
    """The JSON document at ``url``; ``PosttrainError`` in one line naming ``what`` when the
    server is down, slow, answers an error status or something that is not JSON."""
    try:
        with urllib.request.urlopen(url, timeout=timeout_s) as answer:
            body = answer.read(1 << 22)
    except urllib.error.HTTPError as error:
        raise PosttrainError(f"{what}: {url} answered HTTP {error.code}") from None
    except (urllib.error.URLError, OSError) as error:
        reason = getattr(error, "reason", error)
        raise PosttrainError(f"{what}: no answer from {url} ({short_line(reason)}); is the "
                             "server running?") from None
    try:
        return json.loads(body)
    except ValueError:
        raise PosttrainError(f"{what}: {url} did not answer JSON (it begins "
                             f"{body[:60]!r})") from None


def check_health(base_url: str, timeout_s: float, what: str) -> None:
    """``/health`` answers: the server is up (one line when not)."""
    get_json(f"{base_url}/health", timeout_s, what)


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
