"""A throwaway PostgreSQL server: for the bench's PostgreSQL rows and the tests.

Standard library only at import time, so ``tasks.py`` can use it before any
virtualenv exists. ``CHARTER_BENCH_POSTGRES=postgresql://...`` points the bench at an existing
server (it creates and drops its own databases there). Otherwise, when
``initdb`` and ``pg_ctl`` are installed, a throwaway cluster is started in a
temporary directory on 127.0.0.1 with the server's default durability
(``fsync=on``, ``synchronous_commit=on``) and removed afterwards. When neither
is possible the PostgreSQL rows are reported as pending.
"""

from __future__ import annotations

import contextlib
import os
import pwd
import shutil
import socket
import subprocess
import tempfile
from collections.abc import Iterator
from dataclasses import dataclass
from pathlib import Path
from urllib.parse import urlsplit

ENV = "CHARTER_BENCH_POSTGRES"


@dataclass(frozen=True)
class Server:
    """A reachable server: a base URL without a database name, and how we got it."""

    base_url: str  # e.g. postgresql://bench@127.0.0.1:54321
    origin: str  # "throwaway cluster" or "CHARTER_BENCH_POSTGRES"

    def url(self, database: str) -> str:
        return f"{self.base_url}/{database}"


def _binary(name: str) -> str | None:
    found = shutil.which(name)
    if found:
        return found
    candidates = sorted(Path("/usr/lib/postgresql").glob(f"*/bin/{name}"), reverse=True)
    return str(candidates[0]) if candidates else None


def _free_port() -> int:
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        return int(s.getsockname()[1])


def _as_server_user() -> tuple[list[str], int | None]:
    """PostgreSQL refuses to run as root: run its binaries as ``postgres`` then."""
    if os.geteuid() != 0:
        return [], None
    runuser = shutil.which("runuser")
    try:
        uid = pwd.getpwnam("postgres").pw_uid
    except KeyError:
        return [], None
    if runuser is None:
        return [], None
    return [runuser, "-u", "postgres", "--"], uid


@contextlib.contextmanager
def server(env_var: str | None = ENV) -> Iterator[Server | None]:
    """Yield a server to use, or ``None`` when none can be had.

    ``env_var`` names a variable that may point at an existing server instead.
    """
    env = os.environ.get(env_var) if env_var else None
    if env:
        parts = urlsplit(env)
        yield Server(f"{parts.scheme}://{parts.netloc}", ENV)
        return
    initdb, pg_ctl = _binary("initdb"), _binary("pg_ctl")
    prefix, uid = _as_server_user()
    if initdb is None or pg_ctl is None or (os.geteuid() == 0 and uid is None):
        yield None
        return
    root = Path(tempfile.mkdtemp(prefix="charter-bench-pg-"))
    data = root / "data"
    if uid is not None:
        os.chown(root, uid, -1)
    port = _free_port()
    started = False
    try:
        subprocess.run(
            [*prefix, initdb, "-D", str(data), "-A", "trust", "-U", "bench", "--no-sync"],
            check=True,
            capture_output=True,
        )
        # Room for the suite's two pytest processes and their children at once.
        options = (
            f"-c listen_addresses=127.0.0.1 -c port={port} -c unix_socket_directories={root} "
            "-c max_connections=200"
        )
        subprocess.run(
            [
                *prefix,
                pg_ctl,
                "-D",
                str(data),
                "-o",
                options,
                "-l",
                str(root / "log"),
                "-w",
                "start",
            ],
            check=True,
            capture_output=True,
        )
        started = True
        yield Server(f"postgresql://bench@127.0.0.1:{port}", "throwaway cluster")
    except subprocess.CalledProcessError:
        if not started:
            yield None
        else:
            raise
    finally:
        if started:
            subprocess.run(
                [*prefix, pg_ctl, "-D", str(data), "-m", "fast", "-w", "stop"],
                check=False,
                capture_output=True,
            )
        shutil.rmtree(root, ignore_errors=True)


def version(srv: Server) -> str:
    import psycopg

    with psycopg.connect(srv.url("postgres")) as conn:
        row = conn.execute("SHOW server_version").fetchone()
        assert row is not None
        return str(row[0])


def fresh_database(srv: Server, name: str) -> str:
    """Drop and create database ``name``; return its URL."""
    import psycopg

    with psycopg.connect(srv.url("postgres"), autocommit=True) as conn:
        conn.execute(f'DROP DATABASE IF EXISTS "{name}"')
        conn.execute(f'CREATE DATABASE "{name}"')
    return srv.url(name)
