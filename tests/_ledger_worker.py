"""A child process for the ledger tests: admits attempts against a shared store.

Run as ``python _ledger_worker.py '<json>'``. The JSON names the store, the
mission, the agent's credential, the credential digests to configure and a
``mode``:

- ``race``: wait for the ``go`` file, then admit attempts (alternating the
  combined path and two-phase admission, pausing ``pause`` seconds between
  them) until the allowance refuses one; print a JSON report of what was
  admitted and how it ended (L3);
- ``crash``: admit one attempt two-phase and dispatch it, with a crash hook
  that SIGKILLs this process at ``point`` (L2 after a crash).
"""

from __future__ import annotations

import json
import sys
import time
from pathlib import Path
from typing import Any

import charter
from charter.testing import RecordingAdapter, kill_at

COSTS = {
    "read": {"usd": 1_000, "calls": 1},
    "write": {"usd": 5_000, "calls": 1},
    "charge": {"usd": 20_000, "calls": 1},
}


def _open(job: dict[str, Any], **kwargs: Any) -> charter.Engine:
    config = charter.EngineConfig(credentials=job["digests"], busy_timeout_seconds=60.0)
    return charter.Engine.open(job["store"], config=config, **kwargs)


def race(job: dict[str, Any]) -> dict[str, Any]:
    adapter = RecordingAdapter(costs=COSTS)
    with _open(job) as engine:
        agent = engine.authenticate(job["credential"])
        ex = engine.start_run(job["mission"], by=agent, segment_id=job["segment"])
        go = Path(job["go"])
        deadline = time.monotonic() + 30
        while not go.exists():
            if time.monotonic() > deadline:
                return {"error": "never started"}
            time.sleep(0.001)
        admitted: list[str] = []
        ended = "limit"
        for i in range(job["tries"]):
            try:
                if i % 2:
                    attempt = ex.admit(adapter, "read", {"i": i}, effect_key=f"k{i}")
                else:
                    attempt = ex.perform(adapter, "read", {"i": i}, effect_key=f"k{i}")
            except charter.AllowanceExceeded:
                ended = "allowance_exceeded"
                break
            except charter.CharterError as exc:
                ended = exc.code
                break
            admitted.append(attempt.id)
            time.sleep(job["pause"])  # let the others at the write lock between admissions
        return {"run_id": ex.run_id, "admitted": admitted, "ended": ended}


def crash(job: dict[str, Any]) -> dict[str, Any]:
    adapter = RecordingAdapter(costs=COSTS)
    with _open(job, crash_hook=kill_at(job["point"])) as engine:
        agent = engine.authenticate(job["credential"])
        ex = engine.start_run(job["mission"], by=agent, segment_id=job["segment"])
        attempt = ex.admit(adapter, "write", {"to": "x"}, effect_key="send")
        settled = ex.dispatch(attempt.id, adapter)
        return {"run_id": ex.run_id, "attempt": settled.id, "status": settled.status.value}


def main() -> None:
    job = json.loads(sys.argv[1])
    report = race(job) if job["mode"] == "race" else crash(job)
    print(json.dumps(report))


if __name__ == "__main__":
    main()
