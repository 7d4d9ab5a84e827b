"""A child of ``test_chaos.py``: one worker paying its invoices through the sandbox.

Run as ``python _chaos_worker.py '<json>'``. It owns a run of the shared
mission and pays ``count`` invoices, one attempt each, printing one JSON line
per event: ``paid`` (with the attempt's wall time), ``busy`` (the store stayed
busy past its bounded wait: nothing recorded, tried again), and ``end`` (how it
stopped: ``done``, ``fenced`` when it lost its run while paused, or an error).
The parent SIGSTOPs, SIGCONTs and SIGKILLs it at random.
"""

from __future__ import annotations

import json
import sys
import time

import charter
from charter.cli.demo import payments_adapter


def emit(**event: object) -> None:
    print(json.dumps(event), flush=True)


def main() -> None:
    job = json.loads(sys.argv[1])
    config = charter.EngineConfig(
        credentials=job["digests"],
        lease_seconds=job["lease_seconds"],
        send_deadline_seconds=job["lease_seconds"] / 2,
        busy_timeout_seconds=job["busy_timeout_seconds"],
    )
    end = "done"
    with charter.Engine.open(job["store"], config=config) as engine:
        agent = engine.authenticate(job["credential"])
        ex = engine.start_run(job["mission"], by=agent, segment_id=f"w{job['worker']}")
        emit(run_id=ex.run_id)
        with payments_adapter(job["url"]) as payments:
            i = 0
            while i < job["count"]:
                ref = f"w{job['worker']}-{i}"
                request = {"amount": 1_00, "currency": "usd", "payee": "acme", "reference": ref}
                started = time.monotonic()
                try:
                    attempt = ex.perform(payments, "pay", request, effect_key=ref)
                except charter.StoreBusy:
                    emit(busy=time.monotonic() - started)
                    continue
                except charter.Fenced:
                    end = "fenced"
                    break
                except charter.CharterError as exc:
                    end = f"{exc.code}: {exc.message}"
                    break
                emit(paid=ref, status=attempt.status.value, seconds=time.monotonic() - started)
                i += 1
        if end == "done":
            try:
                ex.finish()
            except charter.Fenced:
                end = "fenced"
    emit(end=end)


if __name__ == "__main__":
    main()
