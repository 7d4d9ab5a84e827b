"""Workers as real processes, killed, paused, stopped and cut off from their store (K1, K4).

Each test runs ``python tests/_worker_plans.py`` processes that carry submitted
runs of the paying plan against the payments sandbox (in this process, with
its own records), and treats them as an operator's machine would: SIGKILL (a
crash, or a power cut with the database), SIGSTOP past the lease (a stalled
VM), SIGTERM (a deploy). Nothing is touched afterwards but restarting what was
stopped; the runs must carry on by themselves. What is checked is what the
sandbox took and what the store recorded (see ``_fleet.violations``), and the
times that matter are printed: how long a run another worker crashed out of
waits for a new owner, and how long one a stopping worker let go of does.

``CHARTER_FLEET_SECONDS`` runs the chaos test for that long (default 25 s).
"""

from __future__ import annotations

import json
import os
import random
import signal
import time
from collections import Counter, defaultdict
from pathlib import Path
from typing import Any

import pytest

import charter
from _fleet import (
    CONTRACT,
    Cluster,
    Fleet,
    audit_verify_cli,
    fleet,
    left_unknown,
    settled,
    submit,
    unwatched,
    violations,
    wait_paid,
    wait_settled,
)
from _raw import RawStore
from charter import AttemptStatus, RunStatus
from charter.sandbox import Sandbox
from conftest import Principals

Creds = tuple[dict[str, str], dict[str, str]]
LEASE = 2.0
DEADLINE = 1.0
#: The sandbox's refusals of a send by an owner the run has left (F3's fence).
FENCED = ("stale_fencing_token", "idempotency_key_closed")


def engine_config(creds: Creds, lease: float = LEASE, deadline: float = DEADLINE) -> Any:
    return charter.EngineConfig(
        credentials=creds[1],
        lease_seconds=lease,
        send_deadline_seconds=deadline,
        evidence_settles="auto",
        resume="automatic",
    )


def worker_config(store: str, creds: Creds, box: Sandbox, **overrides: Any) -> dict[str, Any]:
    """What each worker process is started with (see ``_worker_plans.main``)."""
    return {
        "store": store,
        "digests": creds[1],
        "sandbox": box.url,
        "lease_seconds": LEASE,
        "send_deadline_seconds": DEADLINE,
        "evidence_settles": "auto",
        "concurrency": 3,
        "poll_seconds": 0.2,
        **overrides,
    }


def takeovers(engine: charter.Engine, mission: str) -> int:
    return sum(e["kind"] == "run.recovered" for e in engine.audit_events(mission))


def stop_all(crew: Fleet) -> None:
    """SIGTERM every live worker (K4) and wait for it to end."""
    for w in crew.alive:
        w.signal(signal.SIGCONT)
        w.signal(signal.SIGTERM)
    for w in crew.workers:
        w.proc.wait(30)


# -- the power outage --------------------------------------------------------------------
def outage(
    tmp_path: Path, creds: Creds, store: str, *, workers: int, cluster: Cluster | None
) -> None:
    """30 runs of three invoices each; while the workers pay (every answer slow,
    so sends are in flight), every worker is killed and, if there is one, the
    database stopped at the same instant; then the database and the workers
    start again and nothing else is done."""
    with Sandbox(tmp_path / "sandbox.db") as box, fleet(tmp_path, {}) as crew:
        crew.config = worker_config(store, creds, box)
        with charter.Engine.open(store, config=engine_config(creds)) as engine:
            who = Principals(*creds, engine)
            mission = engine.create_mission(CONTRACT, by=who.alice)
            runs = submit(engine, who.agent, mission, box, 30, invoices=3)
        box.fault("slow", times=10_000, seconds=0.15)
        for _ in range(workers):
            crew.spawn()
        wait_paid(box, 30, timeout=60)
        crew.kill_all()
        if cluster is not None:
            cluster.stop("immediate")
        cut = len(box.payments())
        if cluster is not None:
            cluster.start()
        started = time.monotonic()
        for _ in range(workers):
            crew.spawn()
        with charter.Engine.open(store, config=engine_config(creds)) as engine:
            ended = wait_settled(engine, mission, timeout=120)
            seconds = time.monotonic() - started
            stop_all(crew)
            found = violations(engine, mission, box)
            ends = Counter(r.status.value for r in ended)
            uncertain = engine.attempts(mission_id=mission, unresolved=True)
            print(
                f"\npower outage ({workers} workers, {'postgresql' if cluster else 'sqlite'}): "
                f"{cut} payments before the cut, {len(box.payments())} after; runs {dict(ends)}; "
                f"{takeovers(engine, mission)} takeovers; all settled {seconds:.1f}s after restart"
            )
            assert len(ended) == len(runs)
            assert found == []
            assert unwatched(engine, mission) == []
            assert all(settled(r) for r in ended)
            # Nothing the sandbox can be asked about is left to a person.
            assert uncertain == [], [(a.id, a.status) for a in uncertain]
            assert ends == {"completed": len(runs)}
            assert len(box.payments()) == 90
        status, out = audit_verify_cli(store)
        assert status == 0, out


@pytest.mark.crash
@pytest.mark.timeout(300)
def test_K1_power_outage_on_postgresql(tmp_path: Path, creds: Creds) -> None:
    try:
        cluster = Cluster()
    except FileNotFoundError as exc:
        pytest.skip(str(exc))
    try:
        cluster.start()
        outage(tmp_path, creds, cluster.url, workers=3, cluster=cluster)
    finally:
        cluster.remove()


@pytest.mark.crash
@pytest.mark.timeout(300)
def test_K1_power_outage_on_sqlite(tmp_path: Path, creds: Creds) -> None:
    outage(tmp_path, creds, str(tmp_path / "charter.db"), workers=2, cluster=None)


# -- a crashed worker and a stopping one ---------------------------------------------------
def holder(raw: RawStore, run_id: str) -> int | None:
    """The pid of the process holding the run now (``None``: no process holds it)."""
    (row,) = raw.rows("SELECT owner_claim, owner_process FROM runs WHERE id = ?", run_id)
    if row["owner_claim"] is None or row["owner_process"] is None:
        return None
    return int(json.loads(row["owner_process"])["pid"])


def wait_for(check: Any, timeout: float, what: str) -> float:
    """Poll ``check`` until true; the monotonic time it first was."""
    deadline = time.monotonic() + timeout
    while not check():
        assert time.monotonic() < deadline, f"{what} not within {timeout}s"
        time.sleep(0.01)
    return time.monotonic()


@pytest.mark.crash
@pytest.mark.timeout(120)
@pytest.mark.parametrize("how", ["SIGKILL", "SIGSTOP"])
def test_K1_a_killed_worker_s_run_is_taken_over_after_its_lease(
    how: str, store_address: str, raw: RawStore, creds: Creds, tmp_path: Path
) -> None:
    """The owner dies (SIGKILL) or stalls (SIGSTOP) while its payment's answer is
    on its way. The other worker takes the run over: at once when it can see on
    this host that the owner's process is gone, once the lease ends when the
    owner is alive as far as anyone can tell (as one on another host always is).
    It finds the payment by the sandbox's lookup, settles it from that evidence
    and pays the rest: each invoice once. A stalled owner let go on finds
    itself fenced and sends nothing more."""
    lease, poll = 3.0, 0.2
    with (
        Sandbox(tmp_path / "sandbox.db") as box,
        fleet(tmp_path, {}) as crew,
        charter.Engine.open(store_address, config=engine_config(creds, lease)) as engine,
    ):
        crew.config = worker_config(
            store_address, creds, box, lease_seconds=lease, poll_seconds=poll
        )
        who = Principals(*creds, engine)
        mission = engine.create_mission(CONTRACT, by=who.alice)
        box.fault("slow", seconds=30, reference="inv-0-1")  # applied; the answer never comes
        first = crew.spawn()
        (run_id,) = submit(engine, who.agent, mission, box, 1, invoices=3)
        wait_for(lambda: holder(raw, run_id) == first.proc.pid, 30, "the first worker's hold")
        other = crew.spawn()
        wait_for(lambda: len(box.payments()) == 2, 30, "the second payment")
        first.signal(getattr(signal, how))
        lost_at = time.monotonic()
        taken = wait_for(lambda: holder(raw, run_id) == other.proc.pid, 30, "a takeover")
        wait_for(lambda: engine.run(run_id).status.terminal, 30, "the run's end")
        print(f"\ntakeover after {how} on this host: {taken - lost_at:.2f}s (lease {lease}s)")
        if how == "SIGSTOP":  # alive, as far as anyone can tell: the lease decides
            assert taken - lost_at > lease * 2 / 3 - 0.1  # renewed every third of it
            first.signal(signal.SIGCONT)
            time.sleep(lease)  # its sleeping threads wake, fenced
            assert first.alive
        assert taken - lost_at <= lease + poll + 0.5
        run = engine.run(run_id)
        assert run.status is RunStatus.COMPLETED
        assert run.epoch == 2
        (lost,) = [a for a in engine.attempts(run_id=run_id) if a.request["reference"] == "inv-0-1"]
        assert lost.status is AttemptStatus.SUCCEEDED and not lost.answered
        assert lost.dispatched_epoch == 1
        lookups = [r for r in box.requests() if r["kind"] == "lookup"]
        assert [r["verdict"] for r in lookups] == ["found"]
        found = [e for e in engine.evidence(lost.id) if e["settled"]]
        assert [(e["source"], e["verdict"], e["actor"]) for e in found] == [
            ("adapter", "applied", "engine:reconcile")
        ]
        assert json.loads(found[0]["detail"])["lookup"].endswith(lost.idempotency_key)
        assert sorted(p["reference"] for p in box.payments()) == ["inv-0-0", "inv-0-1", "inv-0-2"]
        assert engine.incidents(mission) == []
        assert violations(engine, mission, box) == []
        assert unwatched(engine, mission) == []


@pytest.mark.crash
@pytest.mark.timeout(120)
def test_K1_a_worker_fenced_on_one_run_keeps_the_leases_of_the_others(
    store_address: str, creds: Creds, tmp_path: Path
) -> None:
    """A worker stalled past a lease comes back to find one run taken from it. Its
    lease keeper must go on keeping the leases of the runs it carries after that:
    a run whose first node works for longer than a lease without a word to the
    store completes as its first owner (epoch 1), never taken from a live worker
    that is carrying it.

    (Before: the keeper's thread ended on the first ``Fenced``, a signal that is
    no ``CharterError``. Every later run of that worker lost its lease while it
    was carried: that run was taken over by the same worker three times and
    then waited for a person, "a node crashed its process 3 times in a row".)"""
    with (
        Sandbox(tmp_path / "sandbox.db") as box,
        fleet(tmp_path, worker_config(store_address, creds, box)) as crew,
        charter.Engine.open(store_address, config=engine_config(creds)) as engine,
    ):
        who = Principals(*creds, engine)
        mission = engine.create_mission(CONTRACT, by=who.alice)
        box.fault("slow", seconds=30, reference="inv-0-1")
        worker = crew.spawn()
        (fenced,) = submit(engine, who.agent, mission, box, 1, invoices=3)
        wait_for(lambda: len(box.payments()) == 2, 30, "the second payment")
        worker.signal(signal.SIGSTOP)
        wait_for(
            lambda: engine.run(fenced).lease_expires_us < engine.now_us(), 10, "the lease's end"
        )
        engine.coordinator.recover(fenced, "operator")  # the run is no longer the worker's
        worker.signal(signal.SIGCONT)
        time.sleep(LEASE)  # its keeper has met the fence by now
        carried = engine.submit(
            mission,
            by=who.agent,
            plan="_worker_plans:THINK_THEN_PAY",
            input={
                "sandbox": box.url,
                "amount": 1_00,
                "invoices": ["inv-1-0", "inv-1-1"],
                "think_seconds": LEASE * 2.5,  # no word to the store meanwhile
            },
        ).id
        wait_for(lambda: engine.run(carried).status.terminal, 30, "the carried run's end")
        assert worker.alive
        run = engine.run(carried)
        assert (run.status, run.epoch) == (RunStatus.COMPLETED, 1), worker.log.read_text()[-6000:]
        assert sorted(p["reference"] for p in box.payments())[-2:] == ["inv-1-0", "inv-1-1"]
        assert settled(engine.run(fenced))
        assert violations(engine, mission, box) == []
        assert unwatched(engine, mission) == []


@pytest.mark.crash
@pytest.mark.timeout(120)
def test_K4_sigterm_during_sends_releases_every_lease(
    store_address: str, raw: RawStore, creds: Creds, tmp_path: Path
) -> None:
    """A worker told to stop while its answers are slow lets each send settle by
    its own answer, lets go of every run, and exits; the worker beside it goes on
    with them at once, not after their 30-second lease."""
    lease, slow = 30.0, 1.0
    with (
        Sandbox(tmp_path / "sandbox.db") as box,
        fleet(tmp_path, {}) as crew,
        charter.Engine.open(store_address, config=engine_config(creds, lease, 5.0)) as engine,
    ):
        crew.config = worker_config(
            store_address, creds, box, lease_seconds=lease, send_deadline_seconds=5.0
        )
        who = Principals(*creds, engine)
        mission = engine.create_mission(CONTRACT, by=who.alice)
        box.fault("slow", times=10_000, seconds=slow)
        stopping = crew.spawn()
        runs = submit(engine, who.agent, mission, box, 3, invoices=3)
        wait_for(
            lambda: all(holder(raw, r) == stopping.proc.pid for r in runs),
            30,
            "the first worker's holds",
        )
        other = crew.spawn()
        wait_for(
            lambda: len(engine.attempts(mission_id=mission, unresolved=True)) == 3,
            30,
            "three sends in flight",
        )
        in_flight = {a.id for a in engine.attempts(mission_id=mission, unresolved=True)}
        stopping.signal(signal.SIGTERM)
        told = time.monotonic()
        stopping.proc.wait(30)
        exited = time.monotonic()
        assert stopping.proc.returncode == 0
        stopped = [line for line in stopping.lines if "stopped" in line]
        assert stopped and stopped[0]["counts"].get("handed_on") == 3, stopping.lines
        for attempt_id in in_flight:
            sent = engine.get_attempt(attempt_id)
            assert sent.status is AttemptStatus.SUCCEEDED and sent.answered, sent
        taken = {
            r: wait_for(lambda r=r: holder(raw, r) == other.proc.pid, 10, "the hand-on")
            for r in runs
        }
        for run_id in runs:
            wait_for(lambda r=run_id: engine.run(r).status.terminal, 60, "the run's end")
        waits = [t - told for t in taken.values()]
        print(
            f"\nSIGTERM to exit {exited - told:.2f}s (answers take {slow}s); "
            f"SIGTERM to the other worker going on: {min(waits):.2f}-{max(waits):.2f}s "
            f"(lease {lease}s)"
        )
        assert max(waits) < slow + 1.0
        assert [engine.run(r).status for r in runs] == [RunStatus.COMPLETED] * 3
        assert all(engine.run(r).epoch == 1 for r in runs)  # handed on, not taken over
        assert takeovers(engine, mission) == 0
        assert len(box.payments()) == 9
        assert violations(engine, mission, box) == []
        assert unwatched(engine, mission) == []
        stop_all(crew)


# -- chaos -------------------------------------------------------------------------------------
SECONDS = float(os.environ.get("CHARTER_FLEET_SECONDS", "25"))


@pytest.mark.crash
@pytest.mark.timeout(int(SECONDS) + 240)
def test_K1_a_fleet_under_chaos(store_address: str, creds: Creds, tmp_path: Path) -> None:
    """Four workers; at random one is SIGKILLed (and a new one started) or
    SIGSTOPped past its lease and let go on. New runs keep coming. Afterwards
    every run finished or waits for a person, no invoice was paid twice, no
    key was sent twice or after its deadline (but by a worker paused as it
    sent), and the ledger holds."""
    seed = int(os.environ.get("CHARTER_CHAOS_SEED", random.randrange(2**32)))
    rng = random.Random(seed)
    counts: Counter[str] = Counter()
    paused: defaultdict[str, list[tuple[int, int]]] = defaultdict(list)
    print(f"\nchaos seed {seed}")
    with (
        Sandbox(tmp_path / "sandbox.db") as box,
        fleet(tmp_path, {}) as crew,
        charter.Engine.open(store_address, config=engine_config(creds)) as engine,
    ):
        crew.config = worker_config(store_address, creds, box, concurrency=2)
        who = Principals(*creds, engine)
        mission = engine.create_mission(CONTRACT, by=who.alice)
        # One payment in seven loses its answer while its worker lives (K5): armed
        # before the rest, for references the runs will have, so that it comes first.
        for ref in [f"inv-{r}-{i}" for r in range(400) for i in range(4)]:
            if rng.random() < 0.14:
                box.fault("drop_after_apply", reference=ref)
        box.fault("slow", times=100_000, seconds=0.3)  # every worker always has sends in flight
        for _ in range(4):
            crew.spawn()
        batches = 0
        end = time.monotonic() + SECONDS
        while time.monotonic() < end:
            if sum(not r.status.terminal for r in engine.runs(mission)) < 12:
                input_runs = submit(
                    engine, who.agent, mission, box, 8, invoices=4, first=counts["runs"]
                )
                counts["runs"] += len(input_runs)
                batches += 1
            live = crew.alive
            victim = rng.choice(live)
            if rng.random() < 0.4:
                victim.kill()
                crew.spawn()
                counts["kills"] += 1
            else:
                stopped_us = time.time_ns() // 1_000
                victim.signal(signal.SIGSTOP)
                time.sleep(LEASE * rng.choice([0.25, 1.5]))
                victim.signal(signal.SIGCONT)
                paused[victim.name].append((stopped_us, time.time_ns() // 1_000))
                counts["stops"] += 1
            time.sleep(rng.uniform(0.2, 1.0))
        ended = wait_settled(engine, mission, timeout=120)
        stop_all(crew)
        counts["takeovers"] = takeovers(engine, mission)
        found = violations(engine, mission, box, paused)
        ends = Counter(r.status.value for r in ended)
        print(f"\nchaos seed {seed}: {dict(counts)}; runs {dict(ends)}; {len(box.payments())} paid")
        for r in ended:  # what each run left for a person is waiting on
            if r.status is not charter.RunStatus.COMPLETED:
                print(f"  {r.id} {r.status.value}: {r.status_reason}")
        assert found == [], f"seed {seed}: " + "; ".join(found)
        assert all(settled(r) for r in ended), f"seed {seed}"
        assert len(ended) == counts["runs"]
        # K5: no run active without a live lease or a due wake, and every UNKNOWN
        # the sandbox's lookup settles settled by a worker.
        assert unwatched(engine, mission) == [], f"seed {seed}"
        assert left_unknown(engine, mission) == [], f"seed {seed}"
        fenced = [r for r in box.requests() if r["verdict"] in FENCED]
        print(f"  {len(fenced)} sends the sandbox's fence refused: {fenced}")
        lost = [r for r in box.requests() if r["verdict"] == "applied_response_dropped"]
        print(f"  {len(lost)} answers lost while their worker lived, each looked up")
