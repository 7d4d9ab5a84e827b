"""``charter audit verify`` on one mission of a million events: time and peak RSS.

The chain is built by bulk insert of correctly chained events (see
:func:`storebuild.append_events`); the command then runs as a user runs it,
in a process of its own, timed from start to exit, its peak resident set size
read by that process itself as it exits (see :mod:`peakrss`). The same
command on the same mission before the bulk insert (a handful of events) is
the baseline: verification streams the chain, so the two should be close.
"""

from __future__ import annotations

import json
from pathlib import Path
from typing import Any

import peakrss
import storebuild
from charter_bench import checkpoint, remove_store, setup
from timing import Sample, clock, repeat


def _verify(store: Path, mission: str) -> tuple[float, int, list[dict[str, Any]]]:
    """Wall seconds, peak RSS (bytes) and the JSON answer of one ``charter audit verify``."""
    args = ["-m", "charter", "audit", "verify", "--store", str(store), "--mission", mission]
    done = peakrss.run_python([*args, "--json"], cwd=store.parent, env=peakrss.installed_env())
    if done.returncode != 0:
        raise RuntimeError(f"charter audit verify failed: {done.stderr}{done.stdout}")
    answer: list[dict[str, Any]] = json.loads(done.stdout)
    return done.seconds, done.peak_bytes, answer


def audit_verify(workdir: str, events: int, warmup: int, reps: int) -> dict[str, Any]:
    """Build one mission of ``events`` audit events, then time ``charter audit verify``."""
    store = Path(workdir) / "audit.db"
    engine, _, mission, _ = setup(store)
    engine.close()
    small_rss = Sample("bytes")
    for i in range(warmup + reps):
        _, small_peak, _ = _verify(store, mission)
        (small_rss.warmup if i < warmup else small_rss.values).append(float(small_peak))
    small_events = _verify(store, mission)[2][0]["events"]
    t0 = clock()
    storebuild.append_events(store, mission, events - small_events)
    build_seconds = clock() - t0
    checkpoint(store)
    rss = Sample("bytes")
    answers: list[dict[str, Any]] = []

    def once(i: int) -> float:
        seconds, peak, answer = _verify(store, mission)
        (rss.warmup if i < warmup else rss.values).append(float(peak))
        answers.extend(answer)
        return seconds

    sample = repeat(once, warmup=warmup, reps=reps, unit="s")
    size = store.stat().st_size
    remove_store(store)
    assert all(a["ok"] and a["events"] == events for a in answers), answers
    return {
        "events": events,
        "sample": sample.to_dict(),
        "rss": rss.to_dict(),
        "small": {"events": small_events, "rss": small_rss.to_dict()},
        "build_seconds": build_seconds,
        "size_bytes": size,
    }
