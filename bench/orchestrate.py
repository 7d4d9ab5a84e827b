"""The order of a bench run; each measurement is a process of its own.

1. start-up (``import charter``, ``charter --help``), while the machine is quiet;
2. attempt overhead in interleaved rounds — every round measures the raw
   floor, Charter, DBOS and LangGraph in turn, on SQLite then PostgreSQL — so
   that a slow minute of the disk falls on every framework alike; then the
   PostgreSQL rows again through a proxy that adds a network's latency;
3. ``recover()`` on runs holding 1,000 / 10,000 / 100,000 settled attempts;
4. a fresh process resuming after SIGKILL, interleaved across frameworks;
5. peak RSS of a process that executes one more run on a 10,000-run store;
6. ``charter audit verify`` on one mission of a million audit events.
"""

from __future__ import annotations

import argparse
import contextlib
import json
import os
import shutil
import subprocess
import sys
import tempfile
from dataclasses import dataclass
from pathlib import Path
from typing import Any
from urllib.parse import urlsplit

import killresume
import latency
import page
import pg
import report
import slowsync
from timing import Sample

HERE = Path(__file__).resolve().parent


@dataclass(frozen=True)
class Plan:
    steps: int
    rounds: int
    warmup: int
    reps_per_round: int
    sizes: tuple[int, ...]
    unresolved: int
    recovery_reps: int
    resume_reps: int
    startup_reps: int
    memory_runs: int
    memory_reps: int
    concurrent_attempts: int
    audit_events: int
    audit_reps: int


FULL = Plan(
    steps=200,
    rounds=3,
    warmup=1,
    reps_per_round=3,
    sizes=(1_000, 10_000, 100_000),
    unresolved=10,
    recovery_reps=7,
    resume_reps=5,
    startup_reps=10,
    memory_runs=10_000,
    memory_reps=5,
    concurrent_attempts=400,
    audit_events=1_000_000,
    audit_reps=3,
)
QUICK = Plan(
    steps=50,
    rounds=1,
    warmup=1,
    reps_per_round=2,
    sizes=(1_000, 10_000),
    unresolved=10,
    recovery_reps=2,
    resume_reps=2,
    startup_reps=3,
    memory_runs=1_000,
    memory_reps=2,
    concurrent_attempts=80,
    audit_events=100_000,
    audit_reps=1,
)


def say(text: str) -> None:
    print(f"· {text}", file=sys.stderr, flush=True)


class Runner:
    """Runs worker tasks in fresh processes of one interpreter."""

    def __init__(self, python: str, scratch: Path) -> None:
        self.python = python
        self.scratch = scratch
        self._n = 0

    def dir(self, name: str) -> Path:
        self._n += 1
        d = self.scratch / f"{self._n:03d}-{name}"
        d.mkdir(parents=True)
        return d

    def task(self, name: str, env: dict[str, str] | None = None, **kwargs: Any) -> dict[str, Any]:
        d = self.dir(name.replace(".", "-") + "-io")
        (d / "args.json").write_text(json.dumps(kwargs))
        with (d / "log").open("w") as log:
            proc = subprocess.run(
                [
                    self.python,
                    str(HERE / "worker.py"),
                    name,
                    str(d / "out.json"),
                    str(d / "args.json"),
                ],
                check=False,
                stdout=log,
                stderr=subprocess.STDOUT,
                cwd=HERE,
                env=None if env is None else {**os.environ, **env},
            )
        if proc.returncode != 0:
            tail = (d / "log").read_text()[-4000:]
            raise SystemExit(f"bench task {name} failed (exit {proc.returncode}):\n{tail}")
        result: dict[str, Any] = json.loads((d / "out.json").read_text())
        return result


def _is_sample(value: Any) -> bool:
    return isinstance(value, dict) and "values" in value and "unit" in value


def _merge(parts: list[dict[str, Any]]) -> dict[str, Any]:
    """One sample from several rounds (values and warm-ups concatenated)."""
    merged = Sample(parts[0]["unit"])
    for p in parts:
        merged.values.extend(p["values"])
        merged.warmup.extend(p["warmup"])
    return merged.to_dict()


def _merged(results: list[dict[str, Any]]) -> dict[str, Any]:
    """Samples merged over the rounds, at any depth; other fields from the last round."""
    out = dict(results[-1])
    for key, value in results[-1].items():
        if not all(key in r for r in results):
            continue
        if _is_sample(value):
            out[key] = _merge([r[key] for r in results])
        elif isinstance(value, dict):
            out[key] = _merged([r[key] for r in results])
    return out


def _combine(results: list[dict[str, Any]]) -> dict[str, Any]:
    """The rounds of one framework: samples merged, other fields from the last round."""
    out = _merged(results)
    # The load around every round's process, not only the last one's.
    out["load"] = [x for r in results for x in r.get("load", [])]
    return out


def attempt_rounds(run: Runner, plan: Plan, server: pg.Server | None) -> dict[str, dict[str, Any]]:
    kw: dict[str, Any] = {"steps": plan.steps, "warmup": plan.warmup, "reps": plan.reps_per_round}
    got: dict[str, dict[str, list[dict[str, Any]]]] = {"sqlite": {}, "postgresql": {}}

    def keep(backend: str, who: str, result: dict[str, Any]) -> None:
        got[backend].setdefault(who, []).append(result)

    for r in range(plan.rounds):
        tag = f"round {r + 1}/{plan.rounds}"
        say(f"attempt overhead, {tag}: raw floor, Charter, DBOS, LangGraph on SQLite")
        keep("sqlite", "floor", run.task("floor.sqlite", workdir=str(run.dir("floor")), **kw))
        keep(
            "sqlite", "charter", run.task("charter.attempts", workdir=str(run.dir("charter")), **kw)
        )
        url = f"sqlite:///{run.dir('dbos') / 'dbos.sqlite'}"
        keep("sqlite", "dbos", run.task("dbos", url=url, **kw))
        url = f"sqlite:///{run.dir('dbos-wal') / 'dbos.sqlite'}"
        keep("sqlite", "dbos_wal", run.task("dbos", url=url, wal=True, **kw))
        keep(
            "sqlite",
            "langgraph",
            run.task("langgraph.sqlite", workdir=str(run.dir("langgraph")), **kw),
        )
        if TMPFS.is_dir():
            # The same attempts where a sync costs nothing: what is left is CPU.
            scratch = Path(tempfile.mkdtemp(prefix="charter-bench-", dir=TMPFS))
            try:
                keep(
                    "sqlite",
                    "charter_tmpfs",
                    run.task("charter.attempts", workdir=str(scratch), **kw),
                )
            finally:
                shutil.rmtree(scratch, ignore_errors=True)
        if server is None:
            continue
        say(f"attempt overhead, {tag}: the same on PostgreSQL")
        keep(
            "postgresql",
            "floor",
            run.task("floor.postgres", url=pg.fresh_database(server, f"bench_floor_{r}"), **kw),
        )
        keep(
            "postgresql",
            "floor_read",
            run.task(
                "floor.postgres",
                url=pg.fresh_database(server, f"bench_floor_read_{r}"),
                read_first=True,
                **kw,
            ),
        )
        # Charter as it is, then with every transaction reading first.
        for who, read_first in (("charter", False), ("charter_read_first", True)):
            url = pg.fresh_database(server, f"bench_{who}_{r}")
            kw_who = {**kw, "read_first": read_first, "workdir": str(run.dir(f"{who}-pg"))}
            keep("postgresql", who, run.task("charter.attempts", url=url, **kw_who))
        keep(
            "postgresql",
            "dbos",
            run.task("dbos", url=pg.fresh_database(server, f"bench_dbos_{r}"), **kw),
        )
        keep(
            "postgresql",
            "langgraph",
            run.task("langgraph.postgres", url=pg.fresh_database(server, f"bench_lg_{r}"), **kw),
        )
    return {
        backend: {who: _combine(results) for who, results in by_who.items()}
        for backend, by_who in got.items()
    }


#: What the latency proxy holds every byte for, each way (see latency.py): with
#: its own hand-offs, a round trip of about half a millisecond, as between two
#: machines of one data centre.
NETWORK_DELAY_US = 150


def network_rounds(run: Runner, plan: Plan, server: pg.Server) -> dict[str, Any]:
    """The PostgreSQL attempt rows again, every connection through a proxy that
    adds a network's latency: what a server on another machine would cost."""
    kw: dict[str, Any] = {"steps": plan.steps, "warmup": plan.warmup, "reps": plan.reps_per_round}
    port = int(urlsplit(server.base_url).port or 5432)
    got: dict[str, list[dict[str, Any]]] = {}
    with latency.proxy(port, NETWORK_DELAY_US) as far:
        away = pg.Server(server.base_url.replace(f":{port}", f":{far}"), server.origin)
        trips = Sample("s", values=latency.round_trips(away.url("postgres"), 300))
        for r in range(plan.rounds):
            say(f"attempt overhead on PostgreSQL behind the latency proxy, round {r + 1}")
            tasks: list[tuple[str, str, dict[str, Any]]] = [
                ("floor", "floor.postgres", {}),
                ("charter", "charter.attempts", {"workdir": str(run.dir("charter-far"))}),
                (
                    "charter_read_first",
                    "charter.attempts",
                    {"workdir": str(run.dir("charter-far-read-first")), "read_first": True},
                ),
                ("dbos", "dbos", {}),
                ("langgraph", "langgraph.postgres", {}),
            ]
            for who, task, extra in tasks:
                pg.fresh_database(server, f"bench_far_{who}_{r}")
                url = away.url(f"bench_far_{who}_{r}")
                got.setdefault(who, []).append(run.task(task, url=url, **extra, **kw))
    return {
        "delay_us": NETWORK_DELAY_US,
        "round_trip": trips.to_dict(),
        "attempts": {who: _combine(results) for who, results in got.items()},
    }


#: A memory file system, for the attempt loop without the disk's syncs.
TMPFS = Path("/dev/shm")

#: The slower disk of the concurrency diagnostic (see slowsync.py).
SLOW_FSYNC_US = 2_000


def concurrent_rounds(runner: Runner, plan: Plan) -> dict[str, Any]:
    """Eight threads on one engine, with and without shared commits, on this
    disk and on a disk whose every sync takes 2 ms longer."""
    shim, how = slowsync.build(runner.dir("slowsync"))
    disks: dict[str, dict[str, str] | None] = {"this disk": {}}
    if shim is not None:
        disks[f"sync + {SLOW_FSYNC_US / 1000:g} ms"] = {
            "LD_PRELOAD": str(shim),
            "CHARTER_BENCH_FSYNC_DELAY_US": str(SLOW_FSYNC_US),
        }
    out: dict[str, Any] = {"shim": how, "disks": {}}
    for disk, env in disks.items():
        rows = {}
        for label, threads, shared in (
            ("1 thread", 1, True),
            ("8 threads, shared commits", 8, True),
            ("8 threads, one commit per transaction", 8, False),
        ):
            rows[label] = runner.task(
                "charter.concurrent",
                env=env,
                workdir=str(runner.dir("concurrent")),
                threads=threads,
                attempts=plan.concurrent_attempts,
                shared=shared,
                warmup=plan.warmup,
                reps=plan.reps_per_round,
            )
        out["disks"][disk] = rows
    return out


def postgres_streams(runner: Runner, plan: Plan, server: pg.Server) -> dict[str, Any]:
    """One stream, then eight processes with a connection each, on one store:
    each on its own mission, then all on one."""
    out = {}
    for label, streams, one in (("1", 1, True), ("8", 8, False), ("8, one mission", 8, True)):
        out[label] = runner.task(
            "charter.streams.postgres",
            url=pg.fresh_database(server, f"bench_streams_{streams}_{int(one)}"),
            streams=streams,
            attempts=plan.concurrent_attempts,
            warmup=plan.warmup,
            reps=plan.reps_per_round,
            one_mission=one,
        )
    return out


def fleet_rounds(runner: Runner, plan: Plan, server: pg.Server) -> dict[str, Any]:
    """1, 2 and 4 worker processes: a mission each, one mission with escrow (L10),
    one mission without (see bench/fleet.py)."""
    seconds = 1.0 if plan is QUICK else 5.0
    out = {}
    for layout in ("separate", "shared", "shared, no escrow"):
        for n in (1, 2, 4):
            name = f"bench_fleet_{layout.replace(', ', '_').replace(' ', '_')}_{n}"
            out[f"{layout}, {n}"] = runner.task(
                "charter.fleet.postgres",
                url=pg.fresh_database(server, name),
                layout=layout,
                processes=n,
                seconds=seconds,
            )
    return out


def wake_rounds(runner: Runner, plan: Plan, server: pg.Server | None) -> dict[str, Any]:
    """Timers' lateness and takeovers after SIGKILL, with worker processes (K1, K2;
    see bench/wakes.py), on SQLite and, with a server, PostgreSQL."""
    timers = 8 if plan is QUICK else 20
    reps = 1 if plan is QUICK else 3
    out = {
        "sqlite": runner.task(
            "charter.wakes", url=str(runner.dir("wakes") / "store.db"), timers=timers, reps=reps
        )
    }
    if server is not None:
        url = pg.fresh_database(server, "bench_wakes")
        out["postgresql"] = runner.task("charter.wakes", url=url, timers=timers, reps=reps)
    return out


def remote_rounds(runner: Runner, plan: Plan, server: pg.Server | None) -> dict[str, Any]:
    """Admit + report over HTTP on loopback beside the same attempt in-process
    (X1, see bench/remote.py), on SQLite and, with a server, PostgreSQL."""
    kw: dict[str, Any] = {
        "attempts": plan.steps,
        "warmup": plan.warmup,
        "reps": plan.rounds * plan.reps_per_round,
    }
    out = {"sqlite": runner.task("charter.remote", url=str(runner.dir("remote") / "s.db"), **kw)}
    if server is not None:
        out["postgresql"] = runner.task(
            "charter.remote", url=pg.fresh_database(server, "bench_remote"), **kw
        )
    return out


def gateway_rounds(runner: Runner, plan: Plan, server: pg.Server | None) -> dict[str, Any]:
    """A read-only MCP tool call through ``charter gateway`` beside the same call
    on its upstream, interleaved (G2, see bench/gateway.py), on SQLite and, with
    a server, PostgreSQL."""
    kw: dict[str, Any] = {"calls": 50 if plan is QUICK else 300, "warmup": 20}
    out = {"sqlite": runner.task("charter.gateway", url=str(runner.dir("gateway") / "g.db"), **kw)}
    if server is not None:
        url = pg.fresh_database(server, "bench_gateway")
        out["postgresql"] = runner.task("charter.gateway", url=url, **kw)
    return out


def run(args: argparse.Namespace) -> int:
    plan = QUICK if args.quick else FULL
    # Child processes may write bytecode caches, as an installed package has them:
    # without them every fresh process would compile Charter from source (the
    # peers' site-packages come with their caches).
    no_cache = os.environ.pop("PYTHONDONTWRITEBYTECODE", None) is not None
    scratch = Path(tempfile.mkdtemp(prefix="charter-bench-", dir=args.workdir))
    runner = Runner(sys.executable, scratch)
    results: dict[str, Any] = {
        "quick": args.quick,
        "plan": plan.__dict__,
        "machine": report.machine(scratch),
        "environment": {"PYTHONDONTWRITEBYTECODE_removed_for_children": no_cache},
    }
    try:
        say("start-up: import charter, charter --help")
        results["startup"] = runner.task(
            "charter.startup", warmup=plan.warmup, reps=plan.startup_reps
        )
        server_cm = contextlib.nullcontext(None) if args.no_postgres else pg.server()
        with server_cm as server:
            results["postgresql"] = (
                {"origin": server.origin, "version": pg.version(server)}
                if server is not None
                else {"pending": "no PostgreSQL server (set CHARTER_BENCH_POSTGRES)"}
            )
            results["attempts"] = attempt_rounds(runner, plan, server)
            if server is not None:
                say("attempts in flight on PostgreSQL: one stream, eight processes")
                results["streams_postgres"] = postgres_streams(runner, plan, server)
                say("worker processes on one PostgreSQL mission: escrow (L10)")
                results["fleet_postgres"] = fleet_rounds(runner, plan, server)
                results["network"] = network_rounds(runner, plan, server)
            say("workers: a timer's lateness, takeovers after SIGKILL")
            results["wakes"] = wake_rounds(runner, plan, server)
            say("the remote attempt protocol: admit + report over HTTP, and in-process")
            results["remote"] = remote_rounds(runner, plan, server)
            say("the MCP gateway: a read-only tool call through it and on its upstream")
            results["gateway"] = gateway_rounds(runner, plan, server)
        say("concurrent attempts on one engine: shared commits or one per transaction")
        results["concurrent"] = concurrent_rounds(runner, plan)
        say("recover() on big runs (the stores are built first)")
        results["recovery"] = runner.task(
            "charter.recovery",
            workdir=str(runner.dir("recovery")),
            sizes=list(plan.sizes),
            unresolved=plan.unresolved,
            warmup=plan.warmup,
            reps=plan.recovery_reps,
        )
        say("fresh process after SIGKILL: Charter, DBOS, LangGraph")
        results["resume"] = killresume.measure(
            ["charter", "dbos", "langgraph"],
            sys.executable,
            runner.dir("resume"),
            plan.warmup,
            plan.resume_reps,
        )
        say(f"peak RSS on a store of {plan.memory_runs:,} finished runs")
        results["memory"] = runner.task(
            "charter.memory",
            workdir=str(runner.dir("memory")),
            runs=plan.memory_runs,
            warmup=plan.warmup,
            reps=plan.memory_reps,
        )
        say(f"charter audit verify on one mission of {plan.audit_events:,} events")
        results["audit"] = runner.task(
            "charter.audit_verify",
            workdir=str(runner.dir("audit")),
            events=plan.audit_events,
            warmup=plan.warmup,
            reps=plan.audit_reps,
        )
        profile = None
        if args.profile:
            say("cProfile of the attempt loop")
            profile = runner.task(
                "charter.profile", workdir=str(runner.dir("profile")), steps=1_000
            )
    finally:
        shutil.rmtree(scratch, ignore_errors=True)
    results["versions"] = report.versions()
    results["rows"] = report.rows(results)
    print(report.text_table(results["rows"]))
    args.json.parent.mkdir(parents=True, exist_ok=True)
    args.json.write_text(json.dumps(results, indent=2, sort_keys=True) + "\n")
    print(f"\nall figures: {args.json}")
    if profile is not None:
        (args.json.parent / "profile.txt").write_text(str(profile))
        print(profile)
    if args.quick:
        print(f"a quick run: {args.doc} is left as it was")
    else:
        args.doc.write_text(page.markdown(results))
        print(f"regenerated {args.doc}")
    return 0
