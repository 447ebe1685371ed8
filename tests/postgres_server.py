"""A real PostgreSQL server for the tests: its own cluster in a temp folder, on a free
loopback port, started once per test session (``postgres_server`` fixture).

PostgreSQL refuses to run as root: when the tests run as root the server is run as the
``postgres`` user through ``runuser``. Where no PostgreSQL binaries are installed the
tests that need one are skipped, saying so.
"""

from __future__ import annotations

import glob
import os
import shutil
import socket
import subprocess
import tempfile
import uuid
from dataclasses import dataclass, field
from pathlib import Path

import pytest

USER = "posttrain"


def _binary(name: str) -> str | None:
    found = shutil.which(name)
    if found:
        return found
    candidates = sorted(glob.glob(f"/usr/lib/postgresql/*/bin/{name}"))
    return candidates[-1] if candidates else None


def _free_port() -> int:
    with socket.socket() as probe:
        probe.bind(("127.0.0.1", 0))
        return probe.getsockname()[1]


@dataclass
class PostgresServer:
    """One running cluster: ``url(database)``, ``new_database()``, ``stop()``, ``start()``."""

    folder: Path
    port: int
    as_user: list[str]
    pg_ctl: str
    durable: bool = False
    databases: list[str] = field(default_factory=list)

    def url(self, database: str = "postgres", password: str | None = None) -> str:
        secret = f":{password}" if password else ""
        return f"postgresql://{USER}{secret}@127.0.0.1:{self.port}/{database}"

    def _ctl(self, *arguments: str) -> None:
        subprocess.run([*self.as_user, self.pg_ctl, "-D", str(self.folder / "data"),
                        *arguments], check=True, capture_output=True, timeout=120)

    def start(self) -> None:
        options = (f"-p {self.port} -c listen_addresses=127.0.0.1 "
                   f"-c unix_socket_directories={self.folder} -c max_connections=100")
        if not self.durable:  # tests need no crash safety from the disk: faster commits
            options += " -c fsync=off -c synchronous_commit=off"
        self._ctl("-o", options, "-l", str(self.folder / "server.log"), "-w", "start")

    def stop(self, mode: str = "fast") -> None:
        self._ctl("-m", mode, "-w", "stop")

    def new_database(self) -> str:
        """A new, empty database; returns its URL."""
        import psycopg

        name = f"t_{uuid.uuid4().hex[:12]}"
        with psycopg.connect(self.url(), autocommit=True) as connection:
            connection.execute(f'CREATE DATABASE "{name}"')
        self.databases.append(name)
        return self.url(name)


def start_server(durable: bool = False) -> PostgresServer:
    """initdb and start a server; ``durable``: the server's own commit settings (a
    benchmark's), else fsync off (the tests')."""
    initdb, pg_ctl = _binary("initdb"), _binary("pg_ctl")
    if initdb is None or pg_ctl is None:
        pytest.skip("no PostgreSQL server binaries (initdb, pg_ctl) on this machine")
    pytest.importorskip("psycopg", reason="psycopg is not installed (pip install -e .[dev])")
    folder = Path(tempfile.mkdtemp(prefix="posttrain-pg-"))
    as_user: list[str] = []
    if os.geteuid() == 0:  # postgres will not run as root
        runuser = shutil.which("runuser")
        if runuser is None:
            pytest.skip("running as root without runuser: cannot start PostgreSQL")
        shutil.chown(folder, user="postgres")
        as_user = [runuser, "-u", "postgres", "--"]
    subprocess.run([*as_user, initdb, "-D", str(folder / "data"), "-U", USER,
                    "--auth=trust", "--encoding=UTF8", "--no-sync"],
                   check=True, capture_output=True, timeout=300)
    server = PostgresServer(folder, _free_port(), as_user, pg_ctl, durable)
    server.start()
    return server


@pytest.fixture(scope="session")
def postgres_server():
    server = start_server()
    yield server
    try:
        server.stop("immediate")
    finally:
        shutil.rmtree(server.folder, ignore_errors=True)


@pytest.fixture
def postgres_url(postgres_server: PostgresServer) -> str:
    """A new, empty database on the session's server."""
    return postgres_server.new_database()
