"""How soon workers act (K1, K2): a timer's lateness, and a takeover after SIGKILL.

``measure(url, ...)`` runs in a process of its own (``bench/worker.py``) and
starts real worker processes (``python bench/wakes.py serve CONFIG.json``) on
the store at ``url``:

- **timers**: runs that sleep on a durable timer, due at staggered times; each
  one's lateness is when its run completed minus its timer's due time, both by
  the store's clock (on PostgreSQL, the server's);
- **takeover, same host**: a worker carrying a run is SIGKILLed; another worker,
  already running, carries the run on. Measured from the kill to the run's new
  epoch, with a lease (30 s) far longer than the result, so the figure is the
  dead owner recognised on its host (R1), not the lease waited out;
- **takeover, another host**: the same, with the owner recorded as a process of
  another machine (nothing this host can prove): the lease decides (K4). The
  figure is in leases; a worker takes over within its lease and a poll.
"""

from __future__ import annotations

import json
import random
import signal
import sqlite3
import statistics
import subprocess
import sys
import tempfile
import time
from pathlib import Path
from typing import Any

import charter
from charter.testing import credential

HERE = Path(__file__).resolve()
NAMES = ("agent", "alice")


@charter.node
def nap(ctx: charter.Context, value: dict[str, Any]) -> str:
    ctx.sleep("nap", float(value["seconds"]))
    return "rested"


@charter.node
def hold(ctx: charter.Context, value: dict[str, Any]) -> str:
    """Holds its run (its lease renewed) until the process is killed."""
    time.sleep(float(value["seconds"]))
    return "held"


NAP = charter.Plan("bench-nap", (nap,), ref="wakes:NAP")
HOLD = charter.Plan("bench-hold", (hold,), ref="wakes:HOLD")


def _config(digests: dict[str, str], lease: float) -> charter.EngineConfig:
    return charter.EngineConfig(
        credentials=digests,
        resume="automatic",
        lease_seconds=lease,
        send_deadline_seconds=min(5.0, lease),
    )


def serve(config_path: str) -> None:
    """A worker process: carries NAP and HOLD runs until SIGTERM."""
    cfg = json.loads(Path(config_path).read_text())
    with charter.Engine.open(cfg["url"], config=_config(cfg["digests"], cfg["lease"])) as engine:
        worker = charter.Worker(
            engine, [NAP, HOLD], concurrency=cfg["concurrency"], poll_seconds=cfg["poll"]
        )
        print("ready", flush=True)
        worker.run()


class _Fleet:
    def __init__(self, url: str, digests: dict[str, str], lease: float, poll: float) -> None:
        self.scratch = Path(tempfile.mkdtemp(prefix="charter-wakes-"))
        self.url, self.lease = url, lease
        self.cfg = {"url": url, "digests": digests, "lease": lease, "poll": poll}
        self.procs: list[subprocess.Popen[str]] = []

    def start(self, concurrency: int = 16) -> subprocess.Popen[str]:
        path = self.scratch / f"worker-{len(self.procs)}.json"
        path.write_text(json.dumps({**self.cfg, "concurrency": concurrency}))
        proc = subprocess.Popen(
            [sys.executable, str(HERE), "serve", str(path)],
            cwd=HERE.parent,
            stdout=subprocess.PIPE,
            text=True,
        )
        assert proc.stdout is not None and proc.stdout.readline().strip() == "ready"
        self.procs.append(proc)
        return proc

    def stop(self) -> None:
        for proc in self.procs:
            if proc.poll() is None:
                proc.send_signal(signal.SIGTERM)
        for proc in self.procs:
            try:
                proc.wait(30)
            except subprocess.TimeoutExpired:
                proc.kill()
            if proc.stdout is not None:
                proc.stdout.close()


def _wait(predicate: Any, timeout: float) -> None:
    deadline = time.monotonic() + timeout
    while not predicate():
        if time.monotonic() > deadline:
            raise TimeoutError("the workers did not get there in time")
        time.sleep(0.005)


def _timers(engine: charter.Engine, mission: str, agent: charter.Principal, n: int) -> list[float]:
    runs = [
        engine.submit(mission, by=agent, plan=NAP, input={"seconds": 1.0 + 0.13 * i})
        for i in range(n)
    ]
    _wait(lambda: all(engine.run(r.id).status.terminal for r in runs), 60 + n)
    late = []
    for r in runs:
        [timer] = [w for w in engine.waits(r.id) if w.kind.value == "timer"]
        assert timer.due_at_us is not None
        late.append((engine.run(r.id).updated_at_us - timer.due_at_us) / 1e6)
    return late


def _takeover(
    engine: charter.Engine,
    mission: str,
    who: tuple[charter.Principal, charter.Principal],
    fleet: _Fleet,
    elsewhere: str,
) -> float:
    """Seconds from SIGKILL of a run's worker to another worker owning the run.
    The victim is alone when the run is submitted, so it is the one carrying it;
    the rescuer is started (and ready) before the kill."""
    agent, alice = who
    victim = fleet.start(concurrency=1)
    run = engine.submit(mission, by=agent, plan=HOLD, input={"seconds": 3600})
    _wait(lambda: engine.run(run.id).status.value == "active", 30)
    fleet.start()
    if elsewhere:
        _rehome(fleet.url, run.id, elsewhere)
    time.sleep(random.uniform(0.5, 1.5))  # the kill falls anywhere in the rescuer's rhythm
    victim.kill()
    victim.wait()
    killed = time.monotonic()
    _wait(lambda: engine.run(run.id).epoch > 1, 3 * fleet.lease + 30)
    took = time.monotonic() - killed
    engine.stop_run(run.id, by=alice, reason="measured")
    return took


def _rehome(url: str, run_id: str, host: str) -> None:
    """Record the run's executing process as one of another machine."""
    owner = json.dumps({"host": host, "pid": 4_194_305, "started": "1"})
    sql = "UPDATE runs SET owner_process = ? WHERE id = ?"
    if url.startswith("postgresql://"):
        import psycopg

        with psycopg.connect(url, autocommit=True) as conn:
            conn.execute(sql.replace("?", "%s"), (owner, run_id))
    else:
        with sqlite3.connect(url) as conn:
            conn.execute(sql, (owner, run_id))


def measure(
    url: str,
    *,
    timers: int = 20,
    lease: float = 30.0,
    other_lease: float = 3.0,
    poll: float = 1.0,
    reps: int = 3,
) -> dict[str, Any]:
    """Timer lateness with two workers, and takeovers after SIGKILL (see the module)."""
    pairs = {n: credential(n) for n in NAMES}
    digests = {n: d for n, (_, d) in pairs.items()}
    contract = {
        "objective": "wake-up bench",
        "principals": {"agent": {"run": ["*"]}, "alice": ["stop"]},
        "allowance": {"calls": 1_000_000},
    }
    out: dict[str, Any] = {"poll_seconds": poll, "lease_seconds": lease}
    with charter.Engine.open(url, config=_config(digests, lease)) as engine:
        alice = engine.authenticate(pairs["alice"][0])
        agent = engine.authenticate(pairs["agent"][0])
        mission = engine.create_mission(contract, by=alice)
        fleet = _Fleet(url, digests, lease, poll)
        try:
            fleet.start()
            fleet.start()
            late = _timers(engine, mission, agent, timers)
            out["timer_late_seconds"] = {
                "median": statistics.median(late),
                "max": max(late),
                "min": min(late),
                "n": len(late),
            }
        finally:
            fleet.stop()
        same = []
        for _ in range(reps):
            fleet = _Fleet(url, digests, lease, poll)
            try:
                same.append(_takeover(engine, mission, (agent, alice), fleet, ""))
            finally:
                fleet.stop()
    out["takeover_same_host_seconds"] = {"median": statistics.median(same), "max": max(same)}
    with charter.Engine.open(url, config=_config(digests, other_lease)) as engine:
        agent = engine.authenticate(pairs["agent"][0])
        alice = engine.authenticate(pairs["alice"][0])
        mission = engine.create_mission(contract, by=alice)
        fleet = _Fleet(url, digests, other_lease, poll)
        try:
            took = _takeover(engine, mission, (agent, alice), fleet, "elsewhere/boot/pid:[1]")
        finally:
            fleet.stop()
    out["takeover_other_host_seconds"] = took
    out["other_host_lease_seconds"] = other_lease
    return out


if __name__ == "__main__":
    if sys.argv[1:2] == ["serve"]:
        sys.path.insert(0, str(HERE.parent))
        serve(sys.argv[2])
    else:  # a quick look: python bench/wakes.py [STORE]
        store = sys.argv[1] if len(sys.argv) > 1 else str(Path(tempfile.mkdtemp()) / "w.db")
        print(json.dumps(measure(store, timers=8), indent=2))
