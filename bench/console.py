"""The operator's desk under load: its pages with 10,000 finished runs in the
store, 50 concurrent clients.

    python bench/console.py [--runs 10000] [--clients 50] [--seconds 20]
                            [--workers 2] [--warmup 3]

The store is built by bulk copy (``charter_bench.build_runs_store``: completed
runs of a one-node, one-attempt plan, ledger and audit chain intact). The
server runs as users run it, ``charter serve`` in a process of its own
(``--workers`` of them). The clients are kept-alive HTTP/1.1 connections on
one event loop of this process, each signed in to the console with its own
session, each asking as soon as its last answer came (a closed loop: the
figures include queueing behind the other clients). The requests go round the
desk's pages (``--pages``, all by default): the runs list (``/console/runs``,
the first page), a run page (``/console/runs/{id}``, a run drawn at random),
the approvals inbox, the reconciliation queue, the mission's ledger, the
audit page and a search by an effect key. The clients run ``--warmup``
seconds before the measured ``--seconds``: the steady state is measured, not
the first second, when fifty connections arrive at once and are dealt out to
the workers. Latency is from send to the last byte; the answer must be 200.
Printed as JSON: p50, p95, p99 and max per page and overall, requests per
second, failures, and what the machine was doing meanwhile: the load average
before and after, the CPU seconds the server and this load generator spent
(both share the machine's cores), and the server's CPU per request. Run it
with ``--clients 1`` too: that is the cost of one request with no queueing.
"""

from __future__ import annotations

import argparse
import asyncio
import json
import os
import random
import re
import socket
import subprocess
import sys
import tempfile
import time
from collections.abc import Callable
from pathlib import Path
from typing import Any

import httpx
from charter_bench import build_runs_store
from timing import clock


def _free_port() -> int:
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        return int(s.getsockname()[1])


def _serve(store: Path, digest: str, workers: int = 1) -> tuple[subprocess.Popen[bytes], str]:
    config = store.with_name("charter.toml")
    config.write_text(f'store = "{store}"\n[credentials]\nagent = "{digest}"\n')
    port = _free_port()
    cmd = [sys.executable, "-m", "charter", "serve", "--config", str(config), "--port", str(port)]
    cmd += ["--workers", str(workers)]
    proc = subprocess.Popen(cmd, stdout=subprocess.DEVNULL, stderr=subprocess.PIPE)
    base = f"http://127.0.0.1:{port}"
    deadline = time.monotonic() + 30
    while time.monotonic() < deadline:
        try:
            httpx.get(base + "/console/login", timeout=1)
            return proc, base
        except httpx.TransportError:
            time.sleep(0.1)
    proc.kill()
    said = proc.stderr.read().decode(errors="replace") if proc.stderr else ""
    raise RuntimeError(f"charter serve did not start: {said}")


def _cpu_seconds(pid: int) -> float | None:
    """User plus system CPU seconds process ``pid`` and its live descendants (the
    server's workers) have used (Linux ``/proc``)."""
    total, found = 0.0, False
    for each in _tree(pid):
        try:
            fields = Path(f"/proc/{each}/stat").read_text().rsplit(")", 1)[1].split()
        except OSError:
            continue
        total += (int(fields[11]) + int(fields[12])) / os.sysconf("SC_CLK_TCK")
        found = True
    return total if found else None


def _tree(pid: int) -> list[int]:
    """``pid`` and its descendants, from each thread's ``children`` list."""
    out, todo = [], [pid]
    while todo:
        each = todo.pop()
        out.append(each)
        for task in Path(f"/proc/{each}/task").glob("*/children"):
            try:
                todo += [int(c) for c in task.read_text().split()]
            except OSError:
                continue
    return out


def _percentiles(values: list[float]) -> dict[str, float]:
    ordered = sorted(values) or [0.0]

    def at(q: float) -> float:
        return ordered[min(len(ordered) - 1, int(q * len(ordered)))] * 1000

    return {
        "n": len(ordered),
        "p50_ms": round(at(0.50), 1),
        "p95_ms": round(at(0.95), 1),
        "p99_ms": round(at(0.99), 1),
        "max_ms": round(ordered[-1] * 1000, 1),
    }


class _Connection:
    """One client's keep-alive HTTP/1.1 connection, as lean as a client can be,
    so the load generator's CPU (on the server's cores) stays small beside the
    server's: a GET with the session cookie, then the status line, the headers
    and a ``Content-Length`` body read off the socket; connected again, as any
    client does, when the server answers ``Connection: close``."""

    def __init__(self, host: str, port: int, cookie: str) -> None:
        self.host, self.port, self.cookie = host, port, cookie
        self.reader: asyncio.StreamReader | None = None
        self.writer: asyncio.StreamWriter | None = None

    async def get(self, path: str) -> tuple[int, bytes]:
        if self.writer is None:
            self.reader, self.writer = await asyncio.open_connection(self.host, self.port)
        assert self.reader is not None
        self.writer.write(
            f"GET {path} HTTP/1.1\r\nHost: {self.host}:{self.port}\r\n"
            f"Cookie: {self.cookie}\r\n\r\n".encode()
        )
        head = await self.reader.readuntil(b"\r\n\r\n")
        lines = head.decode("latin-1").split("\r\n")
        status = int(lines[0].split(" ", 2)[1])
        headers = dict(line.split(": ", 1) for line in lines[1:] if ": " in line)
        lowered = {k.lower(): v for k, v in headers.items()}
        length = lowered.get("content-length")
        if length is None:
            raise RuntimeError(f"{path}: an answer without Content-Length")
        body = await self.reader.readexactly(int(length))
        if lowered.get("connection", "").lower() == "close":  # the server asks: reconnect
            self.close()
            self.reader = self.writer = None
        return status, body

    def close(self) -> None:
        if self.writer is not None:
            self.writer.close()


def _session_cookie(base: str, credential: str) -> str:
    """Sign in through the console's own form; the session cookie it sets."""
    with httpx.Client(base_url=base, follow_redirects=False, timeout=60) as http:
        form = http.get("/console/login").text
        token = re.search(r'name="csrf" value="([^"]+)"', form)
        assert token is not None
        answer = http.post(
            "/console/login", data={"csrf": token.group(1), "credential": credential}
        )
        assert answer.status_code == 303, answer.text
        return "; ".join(f"{k}={v}" for k, v in http.cookies.items() if k == "charter_session")


#: The desk's pages: each a URL from the run IDs (a random one for a run page),
#: the mission and an effect key to search for.
PAGES: dict[str, Callable[[random.Random, list[str], str, str], str]] = {
    "runs_list": lambda rng, runs, mission, key: "/console/runs",
    "run_page": lambda rng, runs, mission, key: f"/console/runs/{rng.choice(runs)}",
    "inbox": lambda rng, runs, mission, key: "/console/inbox",
    "queue": lambda rng, runs, mission, key: "/console/queue",
    "ledger": lambda rng, runs, mission, key: f"/console/ledger?mission={mission}",
    "audit": lambda rng, runs, mission, key: f"/console/audit?mission={mission}",
    "search": lambda rng, runs, mission, key: f"/console/search?q={key}",
}


def load(
    base: str,
    credential: str,
    run_ids: list[str],
    clients: int,
    seconds: float,
    *,
    server: int,
    warmup: float = 0.0,
    pages: list[str] | None = None,
    mission: str = "",
    key: str = "",
) -> Any:
    """``clients`` closed-loop clients for ``warmup`` then ``seconds`` more, each
    going round ``pages`` (of :data:`PAGES`; the runs list and a run page unless
    given); the latencies of the requests sent after the warm-up, per page, and
    the CPU the server (process ``server``) and this process spent meanwhile."""
    cookies = [_session_cookie(base, credential) for _ in range(clients)]
    host, port = base.removeprefix("http://").split(":")
    rounds = pages or ["runs_list", "run_page"]
    times: dict[str, list[float]] = {name: [] for name in rounds}
    failures: list[str] = []

    async def client(k: int, start_at: float, stop_at: float) -> None:
        conn, rng, i = _Connection(host, int(port), cookies[k]), random.Random(k), k
        try:
            while clock() < stop_at:
                page = rounds[i % len(rounds)]
                url = PAGES[page](rng, run_ids, mission, key)
                t0 = clock()
                try:
                    status, body = await conn.get(url)
                    failed, why = status != 200 or b'action="/console/login"' in body, str(status)
                except (OSError, asyncio.IncompleteReadError, RuntimeError) as exc:
                    failed, why = True, repr(exc)
                    conn.close()
                    conn = _Connection(host, int(port), cookies[k])
                if t0 >= start_at:
                    times[page].append(clock() - t0)
                if failed:
                    failures.append(f"{url}: {why}")
                i += 1
        finally:
            conn.close()

    async def everyone() -> tuple[list[float], float | None, float]:
        before = list(os.getloadavg())
        start_at = clock() + warmup
        stop_at = start_at + seconds
        running = asyncio.gather(*(client(k, start_at, stop_at) for k in range(clients)))
        await asyncio.sleep(warmup)
        server_cpu, own_cpu = _cpu_seconds(server), time.process_time()
        await running
        own = time.process_time() - own_cpu
        end = _cpu_seconds(server)
        return before, (None if server_cpu is None or end is None else end - server_cpu), own

    load_before, server_cpu, own_cpu = asyncio.run(everyone())
    every = [t for page in times.values() for t in page]
    served = max(1, len(every))
    return {
        "clients": clients,
        "warmup_seconds": warmup,
        "seconds": seconds,
        "requests_per_second": round(len(every) / seconds, 1),
        **{page: _percentiles(t) for page, t in times.items()},
        "all": _percentiles(every),
        "failures": failures[:5],
        "failed": len(failures),
        "load_average_before": [round(x, 2) for x in load_before],
        "load_average_after": [round(x, 2) for x in os.getloadavg()],
        "server_cpu_seconds": None if server_cpu is None else round(server_cpu, 2),
        "server_cpu_ms_per_request": (
            None if server_cpu is None else round(server_cpu * 1000 / served, 2)
        ),
        "load_generator_cpu_seconds": round(own_cpu, 2),
        "load_generator_cpu_ms_per_request": round(own_cpu * 1000 / served, 2),
    }


def main(argv: list[str]) -> int:
    p = argparse.ArgumentParser(prog="bench/console.py", description=__doc__.split("\n\n")[0])
    p.add_argument("--runs", type=int, default=10_000, help="finished runs in the store")
    p.add_argument("--clients", type=int, default=50, help="concurrent clients")
    p.add_argument("--seconds", type=float, default=20.0, help="how long the load lasts")
    p.add_argument("--workers", type=int, default=1, help="charter serve --workers")
    p.add_argument(
        "--warmup", type=float, default=3.0, help="seconds of load before the measured ones"
    )
    p.add_argument(
        "--pages", default=",".join(PAGES), help=f"pages to go round, of {', '.join(PAGES)}"
    )
    args = p.parse_args(argv)
    with tempfile.TemporaryDirectory() as tmp:
        store = Path(tmp) / "desk.db"
        built = build_runs_store(store, args.runs)
        import sqlite3  # the run IDs to ask for, read from outside the server

        with sqlite3.connect(str(store)) as conn:
            run_ids = [r[0] for r in conn.execute("SELECT id FROM runs")]
            [(key,)] = conn.execute("SELECT effect_key FROM attempts ORDER BY id LIMIT 1")
        proc, base = _serve(store, built["credential"]["digest"], args.workers)
        try:
            result = load(
                base,
                built["credential"]["credential"],
                run_ids,
                args.clients,
                args.seconds,
                server=proc.pid,
                warmup=args.warmup,
                pages=args.pages.split(","),
                mission=built["mission_id"],
                key=key,
            )
        finally:
            proc.terminate()
            proc.wait(10)
    result.update(runs_in_store=len(run_ids), workers=args.workers, cpus=os.cpu_count())
    print(json.dumps(result, indent=2))
    return 0


if __name__ == "__main__":
    raise SystemExit(main(sys.argv[1:]))
