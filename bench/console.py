"""The operator's desk under load: the runs list and a run page with 10,000
finished runs in the store, 50 concurrent clients.

    python bench/console.py [--runs 10000] [--clients 50] [--seconds 20]

The store is built by bulk copy (``charter_bench.build_runs_store``: completed
runs of a one-node, one-attempt plan, ledger and audit chain intact). The
server runs as users run it, ``charter serve`` in a process of its own; the
clients are threads of this process, each signed in to the console with its
own session, each asking as soon as its last answer came (a closed loop: the
figures include queueing behind the other clients). Half the requests are the
runs list (``/console/runs``, the first page), half a run page
(``/console/runs/{id}``, a run drawn at random). Latency is from send to the
last byte; the answer must be 200. Printed as JSON: p50, p95, p99 and max per
page and overall, requests per second, failures, and what the machine was
doing meanwhile: the load average before and after, the CPU seconds the
server and this load generator spent (both share the machine's cores), and
the server's CPU per request. Run it with ``--clients 1`` too: that is the
cost of one request with no queueing.
"""

from __future__ import annotations

import argparse
import json
import os
import random
import re
import socket
import subprocess
import sys
import tempfile
import threading
import time
from pathlib import Path
from typing import Any

import httpx
from charter_bench import build_runs_store
from timing import clock


def _free_port() -> int:
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        return int(s.getsockname()[1])


def _serve(store: Path, digest: str) -> tuple[subprocess.Popen[bytes], str]:
    config = store.with_name("charter.toml")
    config.write_text(f'store = "{store}"\n[credentials]\nagent = "{digest}"\n')
    port = _free_port()
    cmd = [sys.executable, "-m", "charter", "serve", "--config", str(config), "--port", str(port)]
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
    raise RuntimeError(f"charter serve did not start: {proc.stderr.read() if proc.stderr else ''}")


def _signed_in(base: str, credential: str) -> httpx.Client:
    http = httpx.Client(base_url=base, follow_redirects=True, timeout=60)
    form = http.get("/console/login").text
    token = re.search(r'name="csrf" value="([^"]+)"', form)
    assert token is not None
    http.post("/console/login", data={"csrf": token.group(1), "credential": credential})
    return http


def _cpu_seconds(pid: int) -> float | None:
    """User plus system CPU seconds process ``pid`` has used (Linux ``/proc``)."""
    try:
        fields = Path(f"/proc/{pid}/stat").read_text().rsplit(")", 1)[1].split()
    except OSError:
        return None
    return (int(fields[11]) + int(fields[12])) / os.sysconf("SC_CLK_TCK")


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


def load(
    base: str, credential: str, run_ids: list[str], clients: int, seconds: float, *, server: int
) -> Any:
    """``clients`` closed-loop clients for ``seconds``; latencies per page, and the
    CPU the server (process ``server``) and this process spent meanwhile."""
    sessions: list[httpx.Client] = []
    times: dict[str, list[float]] = {"runs_list": [], "run_page": []}
    failures: list[str] = []
    lock = threading.Lock()
    ready, go = threading.Barrier(clients + 1), threading.Event()
    stop_at: list[float] = []

    def client(k: int) -> None:
        # Each signs in just before the start: a connection left idle while the
        # others sign in one by one would outlive the server's keep-alive.
        http, rng = _signed_in(base, credential), random.Random(k)
        with lock:
            sessions.append(http)
        ready.wait()
        go.wait()
        i = k
        while clock() < stop_at[0]:
            page = "runs_list" if i % 2 == 0 else "run_page"
            url = "/console/runs" if page == "runs_list" else f"/console/runs/{rng.choice(run_ids)}"
            t0 = clock()
            try:
                answer = http.get(url)
                failed = answer.status_code != 200 or answer.url.path.endswith("/login")
                why = str(answer.status_code)
            except httpx.TransportError as exc:
                failed, why = True, repr(exc)
            elapsed = clock() - t0
            with lock:
                if failed:
                    failures.append(f"{url}: {why}")
                times[page].append(elapsed)
            i += 1

    threads = [threading.Thread(target=client, args=(k,)) for k in range(clients)]
    for t in threads:
        t.start()
    ready.wait()  # every client signed in
    load_before = os.getloadavg()
    server_cpu, own_cpu = _cpu_seconds(server), time.process_time()
    stop_at.append(clock() + seconds)
    go.set()
    for t in threads:
        t.join()
    own_cpu = time.process_time() - own_cpu
    server_end = _cpu_seconds(server)
    server_cpu = None if server_cpu is None or server_end is None else server_end - server_cpu
    for http in sessions:
        http.close()
    every = times["runs_list"] + times["run_page"]
    served = max(1, len(every))
    return {
        "clients": clients,
        "seconds": seconds,
        "requests_per_second": round(len(every) / seconds, 1),
        "runs_list": _percentiles(times["runs_list"]),
        "run_page": _percentiles(times["run_page"]),
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
    args = p.parse_args(argv)
    with tempfile.TemporaryDirectory() as tmp:
        store = Path(tmp) / "desk.db"
        built = build_runs_store(store, args.runs)
        import sqlite3  # the run IDs to ask for, read from outside the server

        with sqlite3.connect(str(store)) as conn:
            run_ids = [r[0] for r in conn.execute("SELECT id FROM runs")]
        proc, base = _serve(store, built["credential"]["digest"])
        try:
            result = load(
                base,
                built["credential"]["credential"],
                run_ids,
                args.clients,
                args.seconds,
                server=proc.pid,
            )
        finally:
            proc.terminate()
            proc.wait(10)
    result.update(runs_in_store=len(run_ids), cpus=os.cpu_count())
    print(json.dumps(result, indent=2))
    return 0


if __name__ == "__main__":
    raise SystemExit(main(sys.argv[1:]))
