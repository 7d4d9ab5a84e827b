"""P1 and S3 for sign-ins: a credential checked once and held as a session, kept
in the store by digest, so every server process over the store knows it and
ending it ends it everywhere.

The engine's part is tested on each backend; the servers' part runs
``charter serve --workers 2`` as real processes on loopback and finds, through
``/proc``, which worker holds each connection, so a sign-in made on one worker
is shown to be used, and ended, on the other.
"""

from __future__ import annotations

import asyncio
import hashlib
import http.client
import os
import re
import signal
import socket
import subprocess
import sys
import time
import urllib.parse
from collections.abc import Callable, Iterator
from pathlib import Path
from typing import Any

import httpx
import pytest

import charter
from _raw import RawStore
from charter.clock import ManualClock
from conftest import default_contract

SRC = Path(__file__).resolve().parents[1] / "src"


@pytest.fixture
def desk(make_engine: Callable[..., charter.Engine]) -> charter.Engine:
    return make_engine()


def test_P1_a_sign_in_proves_its_principal_and_is_stored_only_by_digest(
    desk: charter.Engine, raw: RawStore, creds: tuple[dict[str, str], dict[str, str]]
) -> None:
    """Broken S3: the sign-in's ID (a bearer secret) is stored as given; broken P1:
    the principal a sign-in yields is not one the engine accepts for decisions."""
    held = desk.sign_in(creds[0]["alice"], seconds=60)
    again = desk.signed_in(held.id)
    assert again is not None and again.principal.name == "alice" and again.csrf == held.csrf
    mission = desk.create_mission(default_contract(), by=again.principal)
    assert desk.mission(mission).id == mission
    rows = raw.rows("SELECT * FROM sign_ins")
    assert [r["id_digest"] for r in rows] == [hashlib.sha256(held.id.encode()).hexdigest()]
    assert held.id not in repr(raw.dump()) and held.id not in repr(held)


def test_P1_signing_out_or_signing_in_again_ends_the_sign_in_for_every_engine(
    make_engine: Callable[..., charter.Engine], creds: tuple[dict[str, str], dict[str, str]]
) -> None:
    """Broken P1: a sign-in ended by one server process still works on another, or
    the ID held before a new sign-in survives it (session fixation)."""
    one, other = make_engine(), make_engine()
    first = one.sign_in(creds[0]["alice"], seconds=60)
    assert other.signed_in(first.id) is not None
    second = other.sign_in(creds[0]["alice"], seconds=60, replacing=first.id)
    assert second.id != first.id and second.csrf != first.csrf
    assert one.signed_in(first.id) is None and one.signed_in(second.id) is not None
    assert other.sign_out(second.id) is True
    assert one.signed_in(second.id) is None and other.sign_out(second.id) is False


def test_P1_a_sign_in_ends_at_its_time_by_the_stores_clock(
    desk: charter.Engine,
    raw: RawStore,
    clock: ManualClock,
    creds: tuple[dict[str, str], dict[str, str]],
) -> None:
    """Broken P1: a sign-in outlives the time it was given, or ended ones pile up."""
    held = desk.sign_in(creds[0]["alice"], seconds=30)
    clock.advance(29)
    assert desk.signed_in(held.id) is not None
    clock.advance(1)
    assert desk.signed_in(held.id) is None
    desk.sign_in(creds[0]["bob"], seconds=30)  # a sign-in forgets the ended ones
    assert [r["principal"] for r in raw.rows("SELECT principal FROM sign_ins")] == ["bob"]


def test_P1_a_sign_in_ends_when_its_credential_leaves_the_configuration(
    desk: charter.Engine,
    store_url: str,
    clock: ManualClock,
    creds: tuple[dict[str, str], dict[str, str]],
) -> None:
    """Broken P1: a principal whose credential was removed keeps acting through a
    sign-in made before."""
    held = desk.sign_in(creds[0]["alice"], seconds=60)
    without = charter.EngineConfig(credentials={n: d for n, d in creds[1].items() if n != "alice"})
    with charter.Engine.open(store_url, config=without, clock=clock, store_clock=clock) as later:
        assert later.signed_in(held.id) is None
    assert desk.signed_in(held.id) is not None


@pytest.mark.parametrize("seconds", [0, -1, 7 * 24 * 3600 + 1, float("nan"), "60", True, None])
def test_a_sign_in_of_no_time_or_too_long_is_refused_and_stores_nothing(
    desk: charter.Engine,
    raw: RawStore,
    creds: tuple[dict[str, str], dict[str, str]],
    seconds: float,
) -> None:
    """Broken: a sign-in that never lasts, lasts for ever, or lasts for something
    that is not a number of seconds is opened (or fails untyped)."""
    before = raw.dump()
    with pytest.raises(charter.UsageError):
        desk.sign_in(creds[0]["alice"], seconds=seconds)
    assert raw.dump() == before


def test_P1_a_bad_credential_opens_no_sign_in_and_is_audited(
    desk: charter.Engine, raw: RawStore
) -> None:
    """Broken P1: a wrong secret opens a sign-in, or its refusal goes unrecorded."""
    with pytest.raises(charter.AuthenticationError):
        desk.sign_in("alice:" + "x" * 43, seconds=60)
    assert raw.rows("SELECT * FROM sign_ins") == []
    assert [e["actor"] for e in desk.audit_events("engine") if e["kind"] == "auth.refused"] == [
        "alice"
    ]
    for unknown in ("", None, "never-issued"):
        assert desk.signed_in(unknown) is None


# -- several server processes -------------------------------------------------------------


@pytest.fixture
def workers(
    desk: charter.Engine,
    store_url: str,
    creds: tuple[dict[str, str], dict[str, str]],
    tmp_path: Path,
) -> Iterator[tuple[str, subprocess.Popen[bytes]]]:
    """``charter serve --workers 2`` on the test store, as users run it."""
    config = tmp_path / "charter.toml"
    lines = [f'store = "{store_url}"', "[credentials]"]
    lines += [f'{name} = "{digest}"' for name, digest in creds[1].items()]
    config.write_text("\n".join(lines) + "\n")
    env = {**os.environ, "PYTHONPATH": str(SRC)}
    command = ["serve", "--config", str(config), "--port", "0", "--workers", "2"]
    log = tmp_path / "serve.log"
    with log.open("wb") as out:
        proc = subprocess.Popen(
            [sys.executable, "-m", "charter", *command], env=env, stdout=subprocess.PIPE, stderr=out
        )
    assert proc.stdout is not None
    said = proc.stdout.readline().decode()  # once both workers serve, on the port chosen
    if not said.startswith("serving http://"):
        proc.kill()
        proc.wait(30)
        proc.stdout.close()
        raise RuntimeError(f"charter serve --workers 2 did not start: {log.read_text()}")
    base = said.split()[1].removesuffix("/api/v1")
    assert len(_children(proc.pid)) == 2 and _answers(base)
    try:
        yield base, proc
    finally:
        proc.terminate()
        proc.wait(30)
        proc.stdout.close()


def _answers(base: str) -> bool:
    try:
        return httpx.get(base + "/console/login", timeout=2).status_code == 200
    except httpx.TransportError:
        return False


def _children(pid: int) -> list[int]:
    """The server's worker processes (not the helper that tracks their semaphores)."""
    found: list[int] = []
    for task in Path(f"/proc/{pid}/task").glob("*/children"):
        for child in task.read_text().split():
            try:
                command = Path(f"/proc/{child}/cmdline").read_bytes()
            except OSError:
                continue
            if b"spawn_main" in command:
                found.append(int(child))
    return found


def _holder(client_port: int, server_port: int, pids: list[int]) -> int | None:
    """The worker whose socket is the server end of the connection from
    ``client_port``: its inode in ``/proc/net/tcp``, then whose descriptor it is."""
    inode = None
    for line in Path("/proc/net/tcp").read_text().splitlines()[1:]:
        fields = line.split()
        local, remote = fields[1].split(":")[1], fields[2].split(":")[1]
        if int(local, 16) == server_port and int(remote, 16) == client_port:
            inode = fields[9]
    for pid in pids:
        for fd in Path(f"/proc/{pid}/fd").iterdir():
            try:
                if str(fd.readlink()) == f"socket:[{inode}]":
                    return pid
            except OSError:
                continue
    return None


class _Connection:
    """One kept-alive HTTP connection (the standard library's), whose socket shows
    which worker accepted it; cookies are sent as given, never kept."""

    def __init__(self, port: int) -> None:
        self.http = http.client.HTTPConnection("127.0.0.1", port, timeout=30)
        self.http.connect()

    def ask(
        self, method: str, path: str, cookies: dict[str, str], form: dict[str, str] | None = None
    ) -> tuple[int, http.client.HTTPMessage, str]:
        headers = {"Cookie": "; ".join(f"{k}={v}" for k, v in cookies.items())}
        body = None
        if form is not None:
            body = urllib.parse.urlencode(form)
            headers["Content-Type"] = "application/x-www-form-urlencoded"
        self.http.request(method, path, body=body, headers=headers)
        answer = self.http.getresponse()
        return answer.status, answer.headers, answer.read().decode()


def _on_each_worker(base: str, proc: subprocess.Popen[bytes]) -> list[_Connection]:
    """A connection held by each worker (new connections until both hold one)."""
    port, pids = int(base.rsplit(":", 1)[1]), _children(proc.pid)
    held: dict[int, _Connection] = {}
    for _ in range(200):
        conn = _Connection(port)
        conn.ask("GET", "/console/login", {})  # the worker has accepted it by now
        if conn.http.sock is None:  # a crowded worker asked it to reconnect
            continue
        pid = _holder(conn.http.sock.getsockname()[1], port, pids)
        if pid is not None and pid not in held:
            held[pid] = conn
            if len(held) == len(pids):
                break
        else:
            conn.http.close()
    assert len(held) == 2, "no connection reached the second worker"
    return list(held.values())


def _cookie(headers: http.client.HTTPMessage, name: str) -> str:
    for value in headers.get_all("set-cookie") or []:
        if value.startswith(name + "="):
            return value.split(";", 1)[0].split("=", 1)[1]
    raise AssertionError(f"no {name} cookie set: {headers}")


def _csrf(html: str) -> str:
    found = re.search(r'name="csrf" value="([^"]+)"', html)
    assert found is not None, html
    return found.group(1)


def test_P1_a_console_sign_in_made_on_one_worker_is_used_and_ended_on_another(
    workers: tuple[str, subprocess.Popen[bytes]],
    raw: RawStore,
    creds: tuple[dict[str, str], dict[str, str]],
) -> None:
    """Broken P1 with several server processes: a sign-in form served by one worker
    is refused by the other, a session made on one is unknown to the other, or
    signing out on one leaves the session alive on the other."""
    one, other = _on_each_worker(*workers)
    status, headers, text = one.ask("GET", "/console/login", {})
    signin = {"charter_signin": _cookie(headers, "charter_signin")}
    form = {"csrf": _csrf(text), "credential": creds[0]["alice"]}
    status, headers, text = other.ask("POST", "/console/login", signin, form)
    assert status == 303, text
    session = {"charter_session": _cookie(headers, "charter_session")}
    status, _, page = one.ask("GET", "/console/inbox", session)
    assert status == 200 and 'id="me">alice<' in page
    assert len(raw.rows("SELECT * FROM sign_ins")) == 1
    status, _, _ = other.ask("POST", "/console/logout", session, {"csrf": _csrf(page)})
    assert status == 303
    for conn in (one, other):
        status, headers, _ = conn.ask("GET", "/console/inbox", session)
        assert status == 303 and headers["location"].startswith("/console/login")
        conn.http.close()
    assert raw.rows("SELECT * FROM sign_ins") == []


@pytest.mark.parametrize("workers", ["0", "65", "two", "-1"])
def test_serve_with_no_or_too_many_workers_is_refused_before_serving(workers: str) -> None:
    """Broken: ``charter serve`` starts with no worker, or with a count it cannot mean."""
    run = subprocess.run(
        [sys.executable, "-m", "charter", "serve", "--workers", workers, "--json"],
        env={**os.environ, "PYTHONPATH": str(SRC)},
        capture_output=True,
        text=True,
        timeout=60,
    )
    assert run.returncode == 2 and "worker processes" in run.stdout + run.stderr


def test_a_worker_killed_is_replaced_and_the_sessions_survive_it(
    workers: tuple[str, subprocess.Popen[bytes]],
    creds: tuple[dict[str, str], dict[str, str]],
) -> None:
    """Broken: a server worker that dies leaves the port served by fewer workers
    for good, or its death signs people out."""
    base, proc = workers
    port = int(base.rsplit(":", 1)[1])
    for serving in _on_each_worker(base, proc):  # both serve: killed now, one is replaced
        serving.http.close()
    conn = _Connection(port)
    status, headers, text = conn.ask("GET", "/console/login", {})
    signin = {"charter_signin": _cookie(headers, "charter_signin")}
    form = {"csrf": _csrf(text), "credential": creds[0]["alice"]}
    _, headers, _ = conn.ask("POST", "/console/login", signin, form)
    session = {"charter_session": _cookie(headers, "charter_session")}
    conn.http.close()
    before = _children(proc.pid)
    os.kill(before[0], signal.SIGKILL)
    deadline = time.monotonic() + 30
    while not (len(now := _children(proc.pid)) == 2 and before[0] not in now):
        assert time.monotonic() < deadline, "the killed worker was not replaced"
        time.sleep(0.1)
    assert before[1] in now and proc.poll() is None
    for _ in range(20):  # new connections, dealt to either worker
        fresh = _Connection(port)
        status, _, page = fresh.ask("GET", "/console/inbox", session)
        fresh.http.close()
        assert status == 200 and 'id="me">alice<' in page


def test_a_worker_that_cannot_start_stops_the_server_with_its_error(
    desk: charter.Engine, tmp_path: Path
) -> None:
    """Broken: workers that fail at start are restarted for ever, and the command
    never says why (here the store does not exist)."""
    command = ["serve", "--workers", "2", "--port", "0"]
    run = subprocess.run(
        [sys.executable, "-m", "charter", *command, "--store", str(tmp_path / "missing.db")],
        env={**os.environ, "PYTHONPATH": str(SRC)},
        capture_output=True,
        text=True,
        timeout=120,
    )
    assert run.returncode == 1, run.stdout + run.stderr
    assert "store" in (run.stdout + run.stderr).lower()


def test_serving_on_a_port_already_taken_is_refused_with_a_typed_error(
    desk: charter.Engine,
) -> None:
    """Broken: a taken port gives a traceback or an exit code and no error, or
    workers that never serve; or the port is announced as served."""
    from charter.server import serve
    from charter.server.workers import Spec, supervise

    with socket.socket() as taken:
        taken.bind(("127.0.0.1", 0))
        taken.listen()
        port = taken.getsockname()[1]
        with pytest.raises(charter.ConfigError, match="cannot serve on"):
            supervise(
                Spec(None, None, secure=False, key=b"k" * 32),
                host="127.0.0.1",
                port=port,
                workers=2,
            )
        announced: list[str] = []
        with pytest.raises(charter.ConfigError, match="cannot serve on"):
            serve(desk, port=port, announce=announced.append)
        assert announced == []


def test_a_crowded_worker_asks_one_client_to_reconnect_then_waits() -> None:
    """Broken: a worker holding more kept-alive connections than another keeps
    them all (its clients wait longer for good), or sheds them all at once."""
    from charter.server.workers import RESPREAD_SECONDS, Seat, _Spread

    asked: list[list[tuple[bytes, bytes]]] = []

    async def app(scope: Any, receive: Any, send: Any) -> None:
        await send({"type": "http.response.start", "status": 200, "headers": []})
        await send({"type": "http.response.body", "body": b""})

    async def send(message: Any) -> None:
        if message["type"] == "http.response.start":
            asked.append(message["headers"])

    async def ask(spread: _Spread) -> bool:
        await spread({"type": "http"}, None, send)
        return (b"connection", b"close") in asked[-1]

    held = [0, 0]
    spread = _Spread(app, Seat(held, 0))
    spread.connections = {object() for _ in range(13)}
    held[1] = 12
    assert not asyncio.run(ask(spread)) and held[0] == 13  # one above: fair enough
    held[1] = 11
    assert asyncio.run(ask(spread))  # two above: one client is asked to go
    assert not asyncio.run(ask(spread))  # the next waits for that one to have gone
    time.sleep(RESPREAD_SECONDS)
    assert asyncio.run(ask(spread))
    assert asyncio.run(_passes_other_scopes(spread))


async def _passes_other_scopes(spread: Any) -> bool:
    seen: list[str] = []

    async def app(scope: Any, receive: Any, send: Any) -> None:
        seen.append(scope["type"])

    spread.app = app
    await spread({"type": "lifespan"}, None, None)
    return seen == ["lifespan"]
