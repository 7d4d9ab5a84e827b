"""Worker processes on PostgreSQL: each on a mission of its own, or all on one
mission with escrow (L10).

The same attempt loop as the other rows (``Executor.perform`` on the recorder
adapter, admission + dispatch commit, no-op send, settlement), in 1, 2 and 4
processes with an engine (one connection) each, started together at a
barrier; the figure is every attempt made over the wall time from the first
start to the last finish. ``separate``: one mission per process; ``shared``:
one mission, each process admitting against its own slice of it
(:class:`charter.workers.escrow.Escrow`); ``shared, no escrow``: one mission
through its gate, as before escrow. The ledger (L0-L2) and every chain (S1)
are checked afterwards.

    python3 bench/fleet.py [postgresql://...]     # prints the table and the JSON

Without a URL a throwaway server is started (see :mod:`pg`).
"""

from __future__ import annotations

import json
import multiprocessing
import sys
import time
from pathlib import Path
from typing import Any

sys.path.insert(0, str(Path(__file__).resolve().parent))

from charter_bench import CONTRACT, setup

import charter
from charter.testing import RecordingAdapter

#: What each process leases of the mission at a time (calls are 1 each).
SLICE = {"calls": 5_000}
LAYOUTS = ("separate", "shared", "shared, no escrow")


def _worker(job: dict[str, Any], barrier: Any, out: Any) -> None:
    from charter.workers.escrow import Escrow

    config = charter.EngineConfig(credentials={"agent": job["digest"]})
    engine = charter.Engine.open(job["url"], config=config)
    agent = engine.authenticate(job["credential"])
    ex = engine.start_run(job["mission"], by=agent, segment_id=f"seg-{job['tag']}")
    adapter = RecordingAdapter()
    escrow = Escrow(engine, SLICE, holder=f"w-{job['tag']}") if job["escrow"] else None

    def perform(k: Any) -> None:
        key = f"e{k}"
        if escrow is None:
            ex.perform(adapter, "write", {"k": k}, effect_key=key)
        else:
            escrow.perform(ex, adapter, "write", {"k": k}, effect_key=key)

    perform("warm")  # statements prepared, the slice leased
    barrier.wait()
    t0 = time.perf_counter()
    n = 0
    while time.perf_counter() - t0 < job["seconds"]:
        perform(n)
        n += 1
    t1 = time.perf_counter()
    if escrow is not None:
        escrow.close()
    ex.finish()
    engine.close()
    out.put((t0, t1, n))


def measure(url: str, layout: str, processes: int, seconds: float) -> dict[str, Any]:
    """Attempts a second of ``processes`` processes in ``layout`` on a fresh store."""
    engine, agent, mission, cred = setup(url)
    shared = layout != "separate"
    missions = [
        mission if shared or p == 0 else engine.create_mission(CONTRACT, by=agent)
        for p in range(processes)
    ]
    engine.close()
    ctx = multiprocessing.get_context("spawn")
    barrier, out = ctx.Barrier(processes), ctx.Queue()
    procs = [
        ctx.Process(
            target=_worker,
            args=(
                {
                    **cred,
                    "url": url,
                    "mission": missions[p],
                    "tag": f"{processes}-{p}",
                    "escrow": layout == "shared",
                    "seconds": seconds,
                },
                barrier,
                out,
            ),
        )
        for p in range(processes)
    ]
    for p in procs:
        p.start()
    spans = [out.get(timeout=600) for _ in procs]
    for p in procs:
        p.join()
        assert p.exitcode == 0, p.exitcode
    attempts = sum(n for _, _, n in spans)
    wall = max(t1 for _, t1, _ in spans) - min(t0 for t0, _, _ in spans)
    config = charter.EngineConfig(credentials={"agent": cred["digest"]})
    with charter.Engine.open(url, config=config) as check:
        problems = [p for m in set(missions) for p in check.check_ledger(m)]
        audit_ok = all(v.ok for v in check.verify_audit())
    assert problems == [] and audit_ok, (problems, audit_ok)
    return {"attempts": attempts, "seconds": wall, "per_second": attempts / wall}


def fleet(
    url_for: Any, *, processes: tuple[int, ...] = (1, 2, 4), seconds: float = 5.0
) -> dict[str, Any]:
    """Every layout at every count of processes; ``url_for(name)`` gives a fresh
    database's URL."""
    out: dict[str, Any] = {}
    for layout in LAYOUTS:
        for n in processes:
            name = f"fleet_{layout.replace(', ', '_').replace(' ', '_')}_{n}"
            out[f"{layout}, {n}"] = measure(url_for(name), layout, n, seconds)
    return out


def table(results: dict[str, Any], processes: tuple[int, ...] = (1, 2, 4)) -> str:
    lines = [f"{'attempts/s':<20}" + "".join(f"{n} proc".rjust(10) for n in processes)]
    for layout in LAYOUTS:
        rates = [results[f"{layout}, {n}"]["per_second"] for n in processes]
        lines.append(f"{layout:<20}" + "".join(f"{r:10.0f}" for r in rates))
    top = processes[-1]
    ratio = results[f"shared, {top}"]["per_second"] / results[f"separate, {top}"]["per_second"]
    lines.append(f"shared (escrow) / separate at {top} processes: {ratio:.0%}")
    return "\n".join(lines)


def main(argv: list[str]) -> int:
    import pg

    def run(base: str | None) -> dict[str, Any]:
        if base is not None:
            srv = pg.Server(base.rsplit("/", 1)[0], "given")
            return fleet(lambda name: pg.fresh_database(srv, name))
        with pg.server() as found:
            if found is None:
                raise SystemExit("no PostgreSQL server (set CHARTER_BENCH_POSTGRES)")
            return fleet(lambda name: pg.fresh_database(found, name))

    results = run(argv[0] if argv else None)
    print(table(results))
    print(json.dumps(results, indent=2))
    return 0


if __name__ == "__main__":
    sys.exit(main(sys.argv[1:]))
