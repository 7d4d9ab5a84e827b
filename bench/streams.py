"""Attempts in flight at once on PostgreSQL: several worker processes, one store.

Each stream is a process of its own with its own engine (one connection) and
its own run, as several workers of one deployment are: each on a mission of
its own (independent agents), or all on one mission, whose gate lets one
transaction at a time change it. The processes start together at a barrier;
the figure is the wall time from the first start to the last finish, divided
by every attempt made. Compared with one stream, it says how much throughput
more connections buy.
"""

from __future__ import annotations

import multiprocessing
import time
from typing import Any

from charter_bench import CONTRACT, setup
from timing import repeat

import charter
from charter.testing import RecordingAdapter


def _stream(job: dict[str, Any], barrier: Any, out: Any) -> None:
    url, mission, n, tag = job["url"], job["mission"], job["n"], job["tag"]
    config = charter.EngineConfig(credentials={"agent": job["digest"]})
    engine = charter.Engine.open(url, config=config)
    agent = engine.authenticate(job["credential"])
    ex = engine.start_run(mission, by=agent, segment_id=f"seg-{tag}")
    adapter = RecordingAdapter()
    ex.perform(adapter, "write", {"k": -1}, effect_key="warm")  # statements prepared
    barrier.wait()
    t0 = time.perf_counter()
    for k in range(n):
        ex.perform(adapter, "write", {"k": k}, effect_key=f"e{k}")
    t1 = time.perf_counter()
    ex.finish()
    engine.close()
    out.put((t0, t1, len(adapter.sent) - 1))


def postgres_streams(
    url: str, streams: int, attempts: int, warmup: int, reps: int, *, one_mission: bool = False
) -> dict[str, Any]:
    """``attempts`` attempts split over ``streams`` processes on one PostgreSQL store."""
    engine, agent, mission, cred = setup(url)
    missions = [
        mission if one_mission or s == 0 else engine.create_mission(CONTRACT, by=agent)
        for s in range(streams)
    ]
    engine.close()
    ctx = multiprocessing.get_context("spawn")
    each = attempts // streams

    def once(i: int) -> float:
        barrier, out = ctx.Barrier(streams), ctx.Queue()
        procs = [
            ctx.Process(
                target=_stream,
                args=(
                    {**cred, "url": url, "mission": missions[s], "n": each, "tag": f"{i}-{s}"},
                    barrier,
                    out,
                ),
            )
            for s in range(streams)
        ]
        for p in procs:
            p.start()
        spans = [out.get(timeout=600) for _ in procs]
        for p in procs:
            p.join()
            assert p.exitcode == 0, p.exitcode
        assert sum(n for _, _, n in spans) == each * streams
        wall = max(t1 for _, t1, _ in spans) - min(t0 for t0, _, _ in spans)
        return float(wall) / (each * streams)

    sample = repeat(once, warmup=warmup, reps=reps, unit="s")
    with charter.Engine.open(
        url, config=charter.EngineConfig(credentials={"agent": cred["digest"]})
    ) as check:
        problems = [p for m in set(missions) for p in check.check_ledger(m)]
    assert problems == [], problems
    return {
        "sample": sample.to_dict(),
        "streams": streams,
        "attempts": each * streams,
        "missions": len(set(missions)),
    }
