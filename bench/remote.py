"""The remote attempt protocol's round trip (X1): admit + report over HTTP on
loopback, beside the same attempt performed in-process.

``measure(url, ...)`` runs in a process of its own (``bench/worker.py``). It
starts ``charter serve``'s application in another process (``python
bench/remote.py serve CONFIG.json``) over the store at ``url`` and, in each
round, times ``attempts`` effects two ways on that store:

- **in-process**: ``executor.perform`` with an adapter that answers at once
  (admission, the dispatch commit, the send, the settlement);
- **remote**: a client holding a claimed segment sends ``POST /runs/{id}/attempts``
  then ``POST /attempts/{id}/report`` for each effect (one keep-alive HTTP
  connection): the same admission, dispatch commit and settlement, with the
  send in the client.

Each figure is the time per attempt; the ratio says what the wire costs.
"""

from __future__ import annotations

import json
import os
import signal
import subprocess
import sys
import tempfile
import threading
from pathlib import Path
from typing import Any, ClassVar

import httpx
from timing import Sample, clock

import charter
from charter.testing import credential

HERE = Path(__file__).resolve()
CONTRACT: dict[str, Any] = {
    "objective": "measure the remote attempt protocol",
    "principals": {"agent": {"run": ["pay.*"]}, "alice": ["resolve", "stop"]},
    "allowance": {"usd": 10**15},
}


class Instant:
    """An adapter whose target answers at once: what is measured is the engine."""

    name = "pay"
    operations: ClassVar = {"transfer": charter.Operation(charter.EffectClass.UNSAFE)}

    def estimate(self, operation: str, request: Any) -> charter.Estimate:
        return charter.Estimate({"usd": 1}, "bench")

    def dispatch(self, send: charter.Dispatch) -> charter.Outcome:
        return charter.Outcome.succeeded({"ok": True}, cost={"usd": 1})

    def reconcile(self, attempt: charter.RecordedAttempt) -> charter.Evidence:
        return charter.Evidence.indeterminate()


def serve(config_path: str) -> None:
    """The server process: the API over the store until SIGTERM."""
    from charter.server import serving

    cfg = json.loads(Path(config_path).read_text())
    stop = threading.Event()
    signal.signal(signal.SIGTERM, lambda *_: stop.set())
    with (
        charter.Engine.open(
            cfg["url"], config=charter.EngineConfig(credentials=cfg["digests"])
        ) as engine,
        serving(engine) as url,
    ):
        print(url, flush=True)
        stop.wait()


def _in_process(executor: charter.Executor, adapter: Instant, tag: str, n: int) -> float:
    started = clock()
    for i in range(n):
        executor.perform(adapter, "transfer", {"n": i}, effect_key=f"{tag}-{i}")
    return (clock() - started) / n


def _remote(http: httpx.Client, held: dict[str, Any], tag: str, n: int) -> float:
    segment = {k: held[k] for k in ("segment", "epoch", "claim")}
    admit = {
        **segment,
        "adapter": "pay",
        "operation": "transfer",
        "effect_class": "unsafe",
        "estimate": {"usd": 1},
    }
    report = {**segment, "outcome": "succeeded", "cost": {"usd": 1}, "result": {"ok": True}}
    path = f"/api/v1/runs/{held['run_id']}/attempts"
    started = clock()
    for i in range(n):
        order = http.post(path, json={**admit, "effect_key": f"{tag}-{i}", "request": {"n": i}})
        done = http.post(f"/api/v1/attempts/{order.json()['attempt_id']}/report", json=report)
        if done.status_code != 200:
            raise SystemExit(f"the report was refused: {done.text}")
    return (clock() - started) / n


def measure(url: str, attempts: int = 200, warmup: int = 1, reps: int = 3) -> dict[str, Any]:
    pairs = {n: credential(n) for n in ("agent", "alice")}
    digests = {n: d for n, (_, d) in pairs.items()}
    scratch = Path(tempfile.mkdtemp(prefix="charter-remote-"))
    (scratch / "config.json").write_text(json.dumps({"url": url, "digests": digests}))
    config = charter.EngineConfig(credentials=digests)
    with charter.Engine.open(url, config=config) as engine:
        alice = engine.authenticate(pairs["alice"][0])
        agent = engine.authenticate(pairs["agent"][0])
        mission = engine.create_mission(CONTRACT, by=alice)
        local = engine.start_run(mission, by=agent, segment_id="local")
        env = {**os.environ, "PYTHONPATH": str(HERE.parent)}
        server = subprocess.Popen(
            [sys.executable, str(HERE), "serve", str(scratch / "config.json")],
            stdout=subprocess.PIPE,
            text=True,
            env=env,
        )
        try:
            assert server.stdout is not None
            base = server.stdout.readline().strip()
            headers = {"Authorization": f"Bearer {pairs['agent'][0]}"}
            with httpx.Client(base_url=base, headers=headers, timeout=30) as http:
                held = http.post(f"/api/v1/missions/{mission}/runs", json={"segment": "remote"})
                ours, wire = Sample("s"), Sample("s")
                for r in range(warmup + reps):
                    keep = ours.warmup if r < warmup else ours.values
                    keep.append(_in_process(local, Instant(), f"l{r}", attempts))
                    keep = wire.warmup if r < warmup else wire.values
                    keep.append(_remote(http, held.json(), f"r{r}", attempts))
        finally:
            server.send_signal(signal.SIGTERM)
            server.wait(30)
    return {
        "attempts": attempts,
        "in_process": {"sample": ours.to_dict()},
        "remote": {"sample": wire.to_dict()},
        "sample": wire.to_dict(),
    }


if __name__ == "__main__":
    if len(sys.argv) == 3 and sys.argv[1] == "serve":
        serve(sys.argv[2])
    else:
        print(
            json.dumps(
                measure(sys.argv[1], attempts=int(sys.argv[2]) if len(sys.argv) > 2 else 100)
            )
        )
