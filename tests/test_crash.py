"""Crash behaviour proven by killing and pausing real processes (A2, F1-F3, R1-R4, L0-L6).

A child process (``_crash_child.py``) owns a run on the test's store (SQLite or
PostgreSQL, whichever the test runs on) and is killed
with SIGKILL at each durable boundary of the attempt path, or paused while this
process takes its run over. This process plays the outside world: a real HTTP
target on 127.0.0.1 that records every send it receives, by idempotency key.
After each crash the run is recovered from the store alone, and the tests check
the recorded attempts, the ledger, the audit chain and what the target received.
"""

from __future__ import annotations

import json
import os
import queue
import signal
import subprocess
import sys
import threading
import time
from collections import Counter
from collections.abc import Callable, Iterator
from dataclasses import dataclass
from http.server import BaseHTTPRequestHandler, ThreadingHTTPServer
from pathlib import Path
from typing import IO, Any

import pytest

import charter
from _crash_child import HttpTarget
from charter import AttemptStatus, RunStatus
from charter.clock import SystemClock
from charter.engine.coordinator import Resolution
from charter.sandbox.server import POLL_SECONDS
from charter.testing import ManualClock, RecordingAdapter, credential

CHILD = Path(__file__).with_name("_crash_child.py")
COST = {"usd": 5_000, "calls": 1}
LEASE_SECONDS = 1.0
CHILD_TIMEOUT = 30.0
CONTRACT: dict[str, Any] = {
    "objective": "crash tests",
    "principals": {
        "agent": {"run": ["target.*"]},
        "alice": ["resolve", "stop"],
    },
    "allowance": {"usd": 1_000_000, "calls": 100},
}

Entries = list[tuple[str, str, int]]


# -- the outside world: a real target ------------------------------------------------


@dataclass(frozen=True)
class Received:
    """One request as the target received it."""

    key: str
    attempt_id: str
    fencing_token: str
    send_deadline_us: int
    received_us: int

    @property
    def epoch(self) -> int:
        """The epoch in the fencing token ``"<run_id>:<epoch>"``."""
        return int(self.fencing_token.rpartition(":")[2])


class Target:
    """An HTTP server on 127.0.0.1 that records every request it receives."""

    def __init__(self) -> None:
        self._lock = threading.Lock()
        self._received: list[Received] = []
        target = self

        class Handler(BaseHTTPRequestHandler):
            def do_POST(self) -> None:
                body = json.loads(self.rfile.read(int(self.headers["Content-Length"])))
                seq = target._record(
                    Received(
                        key=self.headers["Idempotency-Key"],
                        attempt_id=body["attempt_id"],
                        fencing_token=self.headers["X-Fencing-Token"],
                        send_deadline_us=int(self.headers["X-Send-Deadline-Us"]),
                        received_us=SystemClock().now_us(),
                    )
                )
                answer = json.dumps({"seq": seq}).encode()
                self.send_response(200)
                self.send_header("Content-Type", "application/json")
                self.send_header("Content-Length", str(len(answer)))
                self.end_headers()
                self.wfile.write(answer)

            def log_message(self, format: str, *args: Any) -> None:
                return

        self._server = ThreadingHTTPServer(("127.0.0.1", 0), Handler)
        self._thread = threading.Thread(
            target=self._server.serve_forever, args=(POLL_SECONDS,), daemon=True
        )
        self._thread.start()

    def _record(self, received: Received) -> int:
        with self._lock:
            self._received.append(received)
            return len(self._received)

    @property
    def url(self) -> str:
        host, port = self._server.server_address[:2]
        return f"http://{host!s}:{port}/send"

    def received(self) -> list[Received]:
        with self._lock:
            return list(self._received)

    def counts(self) -> Counter[str]:
        return Counter(r.key for r in self.received())

    def close(self) -> None:
        self._server.shutdown()
        self._server.server_close()
        self._thread.join()


# -- the store, the principals and the child processes ---------------------------------


@dataclass
class World:
    engine: charter.Engine
    store: str
    mission: str
    credentials: dict[str, str]
    digests: dict[str, str]
    target: Target
    tmp: Path

    def principal(self, name: str) -> charter.Principal:
        return self.engine.authenticate(self.credentials[name])

    def child_config(self, **scenario: Any) -> Path:
        config = {
            "store": self.store,
            "digests": self.digests,
            "credential": self.credentials["agent"],
            "mission_id": self.mission,
            "target": self.target.url,
            "lease_seconds": LEASE_SECONDS,
            **scenario,
        }
        path = self.tmp / f"child-{len(list(self.tmp.glob('child-*.json')))}.json"
        path.write_text(json.dumps(config))
        return path


@pytest.fixture
def world(tmp_path: Path, store_address: str) -> Iterator[World]:
    """The store (the real clock is its clock: the server's on PostgreSQL), a
    mission on it and the target."""
    pairs = {name: credential(name) for name in ("agent", "alice")}
    credentials = {name: c for name, (c, _) in pairs.items()}
    digests = {name: d for name, (_, d) in pairs.items()}
    target = Target()
    engine = charter.Engine.open(store_address, config=charter.EngineConfig(credentials=digests))
    try:
        mission = engine.create_mission(CONTRACT, by=engine.authenticate(credentials["alice"]))
        yield World(engine, store_address, mission, credentials, digests, target, tmp_path)
    finally:
        engine.close()
        target.close()


def _child_command(config: Path) -> list[str]:
    return [sys.executable, str(CHILD), str(config)]


def _child_env() -> dict[str, str]:
    env = dict(os.environ)
    src = str(Path(charter.__file__).resolve().parent.parent)
    env["PYTHONPATH"] = os.pathsep.join(p for p in (src, env.get("PYTHONPATH")) if p)
    return env


def run_until_killed(world: World, **scenario: Any) -> dict[str, Any]:
    """Run a crash child to its death; return its ``ready`` report."""
    config = world.child_config(mode="crash", **scenario)
    proc = subprocess.run(
        _child_command(config),
        capture_output=True,
        text=True,
        timeout=CHILD_TIMEOUT,
        env=_child_env(),
        check=False,
    )
    assert proc.returncode == -signal.SIGKILL, (proc.returncode, proc.stdout, proc.stderr)
    reports = [json.loads(line) for line in proc.stdout.splitlines()]
    assert [r["event"] for r in reports] == ["ready"], proc.stdout
    return dict(reports[0])


class Child:
    """A live child process; its stdout reports arrive on a queue."""

    def __init__(self, config: Path) -> None:
        self.proc = subprocess.Popen(
            _child_command(config),
            stdin=subprocess.PIPE,
            stdout=subprocess.PIPE,
            stderr=subprocess.PIPE,
            text=True,
            env=_child_env(),
        )
        self._lines: queue.Queue[str] = queue.Queue()
        self._stderr: list[str] = []
        assert self.proc.stdout is not None and self.proc.stderr is not None
        self._readers = [
            threading.Thread(target=self._pump, args=(self.proc.stdout, self._lines.put)),
            threading.Thread(target=self._pump, args=(self.proc.stderr, self._stderr.append)),
        ]
        for reader in self._readers:
            reader.start()

    @staticmethod
    def _pump(stream: IO[str], sink: Callable[[str], None]) -> None:
        for line in stream:
            sink(line)
        sink("")

    def expect(self, event: str) -> dict[str, Any]:
        try:
            line = self._lines.get(timeout=CHILD_TIMEOUT)
        except queue.Empty:
            pytest.fail(f"no {event!r} report from the child within {CHILD_TIMEOUT}s")
        if not line:
            self.proc.wait(timeout=CHILD_TIMEOUT)
            pytest.fail(
                f"the child exited ({self.proc.returncode}) before {event!r}:\n"
                + "".join(self._stderr)
            )
        report = json.loads(line)
        assert report["event"] == event, (report, "".join(self._stderr))
        return dict(report)

    def go(self) -> None:
        assert self.proc.stdin is not None
        self.proc.stdin.write("go\n")
        self.proc.stdin.flush()

    def wait(self) -> int:
        code = self.proc.wait(timeout=CHILD_TIMEOUT)
        assert code == 0, (code, "".join(self._stderr))
        return code

    def close(self) -> None:
        if self.proc.poll() is None:
            self.proc.kill()
        self.proc.wait(timeout=CHILD_TIMEOUT)
        for reader in self._readers:
            reader.join(timeout=CHILD_TIMEOUT)
        for stream in (self.proc.stdin, self.proc.stdout, self.proc.stderr):
            if stream is not None:
                stream.close()


@pytest.fixture
def spawn(world: World) -> Iterator[Callable[..., Child]]:
    children: list[Child] = []

    def start(**scenario: Any) -> Child:
        child = Child(world.child_config(mode="zombie", **scenario))
        children.append(child)
        return child

    yield start
    for child in children:
        child.close()


# -- reading the store ---------------------------------------------------------------------


def wait_for_lease_expiry(engine: charter.Engine, run_id: str) -> int:
    """Sleep until the run's lease has expired by the store's (system) clock."""
    lease = engine.run(run_id).lease_expires_us
    while (now := SystemClock().now_us()) <= lease:
        time.sleep(min(0.05, (lease - now) / 1e6 + 0.001))
    return lease


def entries(world: World, attempt_id: str) -> Entries:
    """The ledger entries of one attempt, as (kind, unit, amount), sorted."""
    return sorted(
        (e["kind"], e["unit"], e["amount"])
        for e in world.engine.ledger_entries(world.mission)
        if e["attempt_id"] == attempt_id
    )


def expected_entries(*kinds: str, cost: dict[str, int] = COST) -> Entries:
    return sorted((kind, unit, amount) for kind in kinds for unit, amount in cost.items())


def by_key(engine: charter.Engine, run_id: str) -> dict[str, charter.Attempt]:
    return {a.effect_key: a for a in engine.attempts(run_id=run_id)}


def audited(world: World, kind: str, entity: str) -> list[dict[str, Any]]:
    return [
        e
        for e in world.engine.audit_events(world.mission)
        if e["kind"] == kind and e["entity"] == entity
    ]


def assert_store_holds(world: World) -> None:
    assert world.engine.check_ledger(world.mission) == []
    assert all(v.ok for v in world.engine.verify_audit())


# -- 1. a real SIGKILL at every durable boundary of the attempt path ----------------------

P, D, S = AttemptStatus.PREPARED, AttemptStatus.DISPATCHED, AttemptStatus.SUCCEEDED

#: (path, crash point, last durable phase of the crashed attempt, reached the target)
BOUNDARIES = [
    ("two_phase", "admission.before", None, False),
    ("two_phase", "admission.after", P, False),
    ("two_phase", "dispatch.before", P, False),
    ("two_phase", "dispatch.after", D, False),
    ("two_phase", "adapter", D, True),
    ("two_phase", "settlement.before", D, True),
    ("two_phase", "settlement.after", S, True),
    ("one_shot", "admission.before", None, False),
    ("one_shot", "dispatch.after", D, False),
    ("one_shot", "adapter", D, True),
    ("one_shot", "settlement.before", D, True),
    ("one_shot", "settlement.after", S, True),
]


@pytest.mark.crash
@pytest.mark.parametrize(
    ("path", "point", "phase", "reached_target"),
    [pytest.param(*b, id=f"{b[0]}-{b[1]}") for b in BOUNDARIES],
)
def test_F1_R2_R3_R4_a_process_killed_at_a_durable_boundary_is_recovered_to_a_safe_state(
    world: World,
    path: str,
    point: str,
    phase: AttemptStatus | None,
    reached_target: bool,
) -> None:
    engine = world.engine
    ready = run_until_killed(world, path=path, point=point)
    run_id, child_epoch = ready["run_id"], ready["epoch"]
    assert child_epoch == 1

    # The store as the killed process left it: the crash happened at this boundary.
    before = by_key(engine, run_id)
    crashed = before.get("crash")
    if phase is None:
        assert crashed is None
    else:
        assert crashed is not None and crashed.status is phase
    assert before["settled"].status is AttemptStatus.SUCCEEDED
    assert before["parked"].status is AttemptStatus.PREPARED
    assert engine.check_ledger(world.mission) == []
    lease = wait_for_lease_expiry(engine, run_id)

    # The target: every key at most once, and only attempts that reached the adapter (A2).
    received = world.target.counts()
    assert set(received.values()) == {1}, received
    sent = {before["settled"].idempotency_key}
    if reached_target:
        assert crashed is not None
        sent.add(crashed.idempotency_key)
    assert set(received) == sent
    stored = {a.id: a for a in before.values()}
    for r in world.target.received():
        a = stored[r.attempt_id]
        assert r.key == a.idempotency_key
        assert r.fencing_token == f"{a.run_id}:{a.dispatched_epoch}"
        assert r.epoch == child_epoch
        assert r.send_deadline_us == a.send_deadline_us
        assert r.received_us <= r.send_deadline_us <= lease

    state, unresolved = engine.coordinator.recover(run_id, "seg-2")

    # R2: a new owner with a higher epoch.
    run = engine.run(run_id)
    assert state.epoch == run.epoch == 2 > child_epoch
    assert run.owner_segment == "seg-2"
    after = by_key(engine, run_id)
    assert {a.admitted_epoch for a in after.values()} == {child_epoch}

    # Settled stays settled, untouched.
    assert after["settled"] == before["settled"]
    assert entries(world, after["settled"].id) == expected_entries("hold", "spend")

    # R3 + L6: PREPARED of the old epoch is VOIDED and releases exactly its hold.
    voided = {after["parked"].id}
    uncertain: set[str] = set()
    assert after["parked"].status is AttemptStatus.VOIDED
    assert after["parked"].dispatched_epoch is None
    if phase is None:
        assert "crash" not in after
    else:
        assert crashed is not None
        now = after["crash"]
        if phase is AttemptStatus.PREPARED:
            assert now.status is AttemptStatus.VOIDED and now.dispatched_epoch is None
            voided.add(now.id)
        elif phase is AttemptStatus.DISPATCHED:
            # R4 + L4: UNKNOWN, 100% of the hold kept, nothing zeroed.
            assert now.status is AttemptStatus.UNKNOWN
            assert now.dispatched_epoch == child_epoch
            assert now.actual is None
            assert entries(world, now.id) == expected_entries("hold")
            uncertain.add(now.id)
        else:
            assert now == crashed
            assert entries(world, now.id) == expected_entries("hold", "spend")
    for attempt_id in voided:
        assert entries(world, attempt_id) == expected_entries("hold", "release")
        [event] = audited(world, "attempt.voided", attempt_id)
        assert event["epoch"] == 2
    for attempt_id in uncertain:
        [event] = audited(world, "attempt.unknown", attempt_id)
        assert event["epoch"] == 2

    assert set(state.voided) == voided
    assert set(unresolved) == set(state.unresolved) == uncertain
    assert {(n.id, n.phase) for n in state.next_actions if n.kind == "attempt"} == (
        {(i, "prepared") for i in voided} | {(i, "unknown") for i in uncertain}
    )
    balances = engine.balances(world.mission)
    assert {u: b.held for u, b in balances.items()} == {
        u: c * len(uncertain) for u, c in COST.items()
    }
    assert run.status is (RunStatus.NEEDS_INTERVENTION if uncertain else RunStatus.ACTIVE)
    assert_store_holds(world)
    # R6: recovery sent nothing.
    assert world.target.counts() == received


@pytest.mark.crash
def test_R1_F1_a_live_owner_s_lease_is_taken_over_only_by_force_by_a_principal_with_stop(
    world: World, spawn: Callable[..., Child]
) -> None:
    engine = world.engine
    child = spawn(pause="before_send", lease_seconds=30)
    ready = child.expect("ready")
    paused = child.expect("paused")
    run_id = ready["run_id"]

    # R1: the owner is alive and its lease is live.
    with pytest.raises(charter.LeaseHeld):
        engine.coordinator.recover(run_id, "seg-2")
    with pytest.raises(charter.NotAuthorized):
        engine.coordinator.recover(run_id, "seg-2", force=True)
    with pytest.raises(charter.NotAuthorized):
        engine.coordinator.recover(run_id, "seg-2", force=True, by=world.principal("agent"))
    run = engine.run(run_id)
    assert (run.epoch, run.owner_segment) == (1, "seg-1")
    assert engine.get_attempt(paused["attempt_id"]).status is AttemptStatus.DISPATCHED
    assert audited(world, "run.recovered", run_id) == []
    [refusal] = audited(world, "authorization.refused", run_id)
    assert refusal["actor"] == "agent"

    alice = world.principal("alice")
    state, unresolved = engine.coordinator.recover(run_id, "seg-2", force=True, by=alice)
    assert state.epoch == engine.run(run_id).epoch == 2
    assert unresolved == [paused["attempt_id"]]
    assert engine.get_attempt(paused["attempt_id"]).status is AttemptStatus.UNKNOWN
    assert engine.get_attempt(ready["parked"]).status is AttemptStatus.VOIDED
    [event] = audited(world, "run.recovered", run_id)
    assert (event["actor"], event["epoch"]) == ("alice", 2)
    assert json.loads(event["payload"])["forced"] is True
    assert "owner_dead" not in json.loads(event["payload"])

    # R1: a segment ID is never used twice.
    for segment in ("seg-1", "seg-2"):
        with pytest.raises(charter.SegmentReused):
            engine.coordinator.recover(run_id, segment, force=True, by=alice)
    assert engine.run(run_id).epoch == 2
    # The old owner was alive: its send, committed before the forced takeover and
    # inside its deadline, still goes out and is kept as late evidence; after it,
    # fenced, it admits and dispatches nothing more.
    child.go()
    assert child.expect("settled")["attempt_id"] == paused["attempt_id"]
    _assert_fenced(world, child, ready)
    assert_store_holds(world)


@pytest.mark.crash
def test_R1_an_owner_killed_on_this_host_is_taken_over_at_once_without_force(
    world: World,
) -> None:
    """Its process is provably gone (its pid is dead), so its lease is not waited out."""
    engine = world.engine
    ready = run_until_killed(world, path="two_phase", point="dispatch.after", lease_seconds=30)
    run_id = ready["run_id"]
    crashed = by_key(engine, run_id)["crash"]
    before = engine.run(run_id)
    assert before.lease_expires_us > SystemClock().now_us() + 20_000_000  # 20 s and more to go

    state, unresolved = engine.coordinator.recover(run_id, "seg-2")

    assert state.epoch == engine.run(run_id).epoch == 2
    assert unresolved == [crashed.id]
    assert engine.get_attempt(crashed.id).status is AttemptStatus.UNKNOWN
    assert engine.get_attempt(ready["parked"]).status is AttemptStatus.VOIDED
    [event] = audited(world, "run.recovered", run_id)
    payload = json.loads(event["payload"])
    assert (event["actor"], payload["forced"]) == ("segment:seg-2", False)
    assert payload["owner_dead"]["pid"] == ready["pid"]
    assert world.target.counts() == Counter({by_key(engine, run_id)["settled"].idempotency_key: 1})
    assert_store_holds(world)


# -- 2. a paused owner (a zombie) and a takeover ----------------------------------------------


def _pause_recover(world: World, child: Child) -> tuple[dict[str, Any], charter.Attempt, int]:
    """Let the paused child's lease expire, recover as seg-2; return (ready, attempt, takeover)."""
    engine = world.engine
    ready = child.expect("ready")
    paused = child.expect("paused")
    run_id = ready["run_id"]
    run = engine.run(run_id)
    attempt = engine.get_attempt(paused["attempt_id"])
    # A2: DISPATCHED is committed by the owner's epoch before the adapter is called.
    assert attempt.status is AttemptStatus.DISPATCHED
    assert attempt.dispatched_epoch == run.epoch == ready["epoch"] == 1
    assert attempt.send_deadline_us is not None
    assert attempt.send_deadline_us <= run.lease_expires_us

    wait_for_lease_expiry(engine, run_id)
    state, unresolved = engine.coordinator.recover(run_id, "seg-2")
    takeover_us = SystemClock().now_us()
    assert state.epoch == 2
    assert unresolved == [attempt.id]
    assert engine.get_attempt(attempt.id).status is AttemptStatus.UNKNOWN
    assert entries(world, attempt.id) == expected_entries("hold")
    assert engine.get_attempt(ready["parked"]).status is AttemptStatus.VOIDED
    return ready, attempt, takeover_us


def _assert_fenced(
    world: World, child: Child, ready: dict[str, Any], *, current_epoch: int = 2
) -> None:
    """F1/F2: once it lost the run the old owner admitted and dispatched nothing."""
    done = child.expect("done")
    child.wait()
    assert [
        (r["op"], r["fenced"], r.get("epoch"), r.get("current_epoch")) for r in done["results"]
    ] == [
        ("dispatch", True, 1, current_epoch),
        ("attempt", True, 1, current_epoch),
        ("renew_lease", True, 1, current_epoch),
    ]
    attempts = world.engine.attempts(run_id=ready["run_id"])
    assert sorted(a.effect_key for a in attempts) == ["parked", "zombie"]
    assert [a for a in attempts if a.status is AttemptStatus.DISPATCHED] == []
    parked = world.engine.get_attempt(ready["parked"])
    assert parked.dispatched_epoch is None
    run = world.engine.run(ready["run_id"])
    if current_epoch == 1:
        assert parked.status is AttemptStatus.PREPARED
        assert (run.epoch, run.owner_segment) == (1, "seg-1")
    else:
        assert parked.status is AttemptStatus.VOIDED
        assert (run.epoch, run.owner_segment) == (current_epoch, "seg-2")


@pytest.mark.crash
def test_F2_an_owner_whose_lease_expired_is_fenced_even_without_a_takeover(
    world: World, spawn: Callable[..., Child]
) -> None:
    engine = world.engine
    child = spawn(pause="after_send")
    ready = child.expect("ready")
    paused = child.expect("paused")
    wait_for_lease_expiry(engine, ready["run_id"])
    expired_us = SystemClock().now_us()

    child.go()
    settled = child.expect("settled")
    # Its own DISPATCHED attempt still settles (nobody else owns it) ...
    assert settled["status"] == engine.get_attempt(paused["attempt_id"]).status.value == "succeeded"
    # ... but with its lease expired by the store's clock it admits and dispatches nothing.
    _assert_fenced(world, child, ready, current_epoch=1)
    [received] = world.target.received()
    assert received.attempt_id == paused["attempt_id"]
    assert received.received_us < expired_us
    assert_store_holds(world)


@pytest.mark.crash
def test_F2_a_paused_owner_is_fenced_and_its_late_settlement_is_kept_as_evidence(
    world: World, spawn: Callable[..., Child]
) -> None:
    engine = world.engine
    child = spawn(pause="after_send")
    ready, attempt, takeover_us = _pause_recover(world, child)
    [received] = world.target.received()
    # F3: the adapter got the epoch as fencing token and a deadline within the lease.
    assert received.key == attempt.idempotency_key
    assert received.fencing_token == f"{attempt.run_id}:1"
    assert attempt.dispatched_epoch == 1
    assert received.send_deadline_us == attempt.send_deadline_us
    assert received.received_us <= received.send_deadline_us < takeover_us

    child.go()
    settled = child.expect("settled")
    _assert_fenced(world, child, ready)
    # The old owner's adapter was never called again after the takeover.
    assert world.target.received() == [received]

    # F2: the late settlement is evidence with its epoch, and settles the UNKNOWN attempt.
    final = engine.get_attempt(attempt.id)
    assert settled["status"] == final.status.value == "succeeded"
    assert final.actual == COST
    [evidence] = engine.evidence(attempt.id)
    assert (evidence["epoch"], evidence["verdict"], evidence["settled"]) == (1, "applied", 1)
    assert json.loads(evidence["outcome"])["cost"] == COST
    [event] = audited(world, "attempt.settled", attempt.id)
    assert event["epoch"] == 1
    assert entries(world, attempt.id) == expected_entries("hold", "spend")
    assert engine.incidents(world.mission) == []
    assert_store_holds(world)

    # The new owner continues under epoch 2: its sends carry the new fencing token.
    agent = world.principal("agent")
    ex = engine.coordinator.resume(ready["run_id"], "seg-2", by=agent)
    assert ex.epoch == 2
    after = ex.perform(HttpTarget(world.target.url), "write", {"n": 4}, effect_key="next")
    assert after.status is AttemptStatus.SUCCEEDED
    latest = world.target.received()[-1]
    assert (latest.key, latest.fencing_token) == (after.idempotency_key, f"{after.run_id}:2")
    assert latest.send_deadline_us <= engine.run(ready["run_id"]).lease_expires_us
    assert set(world.target.counts().values()) == {1}
    assert_store_holds(world)


@pytest.mark.crash
def test_F3_a_paused_owner_refuses_to_send_after_its_deadline(
    world: World, spawn: Callable[..., Child]
) -> None:
    engine = world.engine
    child = spawn(pause="before_send")
    ready, attempt, _ = _pause_recover(world, child)
    assert world.target.received() == []

    child.go()
    settled = child.expect("settled")
    _assert_fenced(world, child, ready)
    # F3: past its send deadline the old owner sent nothing at all.
    assert world.target.received() == []
    # Its proof of non-application is kept with its epoch and settles the attempt FAILED.
    final = engine.get_attempt(attempt.id)
    assert settled["status"] == final.status.value == "failed"
    assert final.actual == {}
    [evidence] = engine.evidence(attempt.id)
    assert (evidence["epoch"], evidence["verdict"], evidence["settled"]) == (1, "not_applied", 1)
    assert entries(world, attempt.id) == expected_entries("hold", "release")
    assert_store_holds(world)


@pytest.mark.crash
@pytest.mark.parametrize(
    ("resolution", "cost", "conflict"),
    [
        pytest.param("failed", {}, True, id="resolved-differently"),
        pytest.param("succeeded", COST, False, id="resolved-alike"),
    ],
)
def test_F2_a_late_settlement_after_a_persons_resolution(
    world: World,
    spawn: Callable[..., Child],
    resolution: Resolution,
    cost: dict[str, int],
    conflict: bool,
) -> None:
    engine = world.engine
    child = spawn(pause="after_send")
    ready, attempt, _ = _pause_recover(world, child)
    resolved = engine.coordinator.resolve(
        attempt.id,
        by=world.principal("alice"),
        outcome=resolution,
        evidence={"seen": "target console"},
        cost=cost,
    )
    assert resolved.status.value == resolution

    child.go()
    settled = child.expect("settled")
    _assert_fenced(world, child, ready)
    assert len(world.target.received()) == 1

    # The person's settlement stands; the late one is kept as evidence with its epoch.
    final = engine.get_attempt(attempt.id)
    assert settled["status"] == final.status.value == resolution
    assert final.actual == cost
    evidence = engine.evidence(attempt.id)
    assert len(evidence) == 2
    [person] = [e for e in evidence if e["epoch"] is None]
    [late] = [e for e in evidence if e["epoch"] == 1]
    assert (person["source"], person["settled"]) == ("person", 1)
    assert (late["verdict"], late["settled"]) == ("applied", 0)
    assert json.loads(late["outcome"])["cost"] == COST
    incidents = engine.incidents(world.mission)
    if conflict:
        [incident] = incidents
        assert incident["kind"] == "conflicting_evidence"
        assert (incident["attempt_id"], incident["run_id"]) == (attempt.id, ready["run_id"])
        assert incident["status"] == "open"
        assert entries(world, attempt.id) == expected_entries("hold", "release")
    else:
        assert incidents == []
        assert entries(world, attempt.id) == expected_entries("hold", "spend")
    assert_store_holds(world)


def test_F3_no_send_is_possible_at_the_instant_another_owner_may_take_over(
    store_address: str,
) -> None:
    """F3 at the boundary: the send deadline ends no later than the lease, exclusively.

    The lease counts as expired at ``lease_expires_us`` (``recover`` may take the run
    over then), so a send must be refused from that instant on, not only after it.
    """
    clock = ManualClock()
    pairs = {name: credential(name) for name in ("agent", "alice")}
    config = charter.EngineConfig(
        credentials={name: d for name, (_, d) in pairs.items()},
        lease_seconds=LEASE_SECONDS,
        send_deadline_seconds=LEASE_SECONDS,
    )
    with (
        charter.Engine.open(store_address, config=config, clock=clock) as old,
        charter.Engine.open(store_address, config=config, clock=clock) as new,
    ):
        mission = old.create_mission(CONTRACT, by=old.authenticate(pairs["alice"][0]))
        ex = old.start_run(mission, by=old.authenticate(pairs["agent"][0]), segment_id="seg-1")
        took_over: list[int] = []
        deadline_and_lease: list[tuple[int, int]] = []

        class AtTheDeadline(RecordingAdapter):
            def dispatch(self, send: charter.Dispatch) -> charter.Outcome:
                lease = old.run(ex.run_id).lease_expires_us
                deadline_and_lease.append((send.send_deadline_us, lease))
                clock.advance((send.send_deadline_us - clock.now_us()) / 1e6)
                try:
                    state, _ = new.coordinator.recover(ex.run_id, "seg-2")
                except charter.LeaseHeld:
                    pass
                else:
                    took_over.append(state.epoch)
                return super().dispatch(send)

        adapter = AtTheDeadline(name="target")
        attempt = ex.perform(adapter, "write", {"n": 1}, effect_key="edge")
        # The deadline is the lease itself here: the boundary under test.
        [(deadline, lease)] = deadline_and_lease
        assert deadline == lease
        # Exactly one of the two may happen at that instant: a takeover, or a send.
        assert (took_over, len(adapter.sent)) in (([2], 0), ([], 1)), (took_over, adapter.sent)
        expected = AttemptStatus.FAILED if took_over else AttemptStatus.SUCCEEDED
        assert old.get_attempt(attempt.id).status is expected
        assert old.check_ledger(mission) == []
