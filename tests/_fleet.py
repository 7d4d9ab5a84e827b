"""Helpers for the fleet tests: worker processes, a PostgreSQL cluster to stop, the checks.

A fleet is real worker processes (``python tests/_worker_plans.py CONFIG.json``)
carrying submitted runs of the paying plan against the payments sandbox, which
runs in the test's own process and keeps the ground truth: every payment it
applied and every request it received, with the fencing token it came with.
What the tests check is written once here (:func:`violations`), against that
ground truth and the store's own records.
"""

from __future__ import annotations

import json
import os
import shutil
import signal
import socket
import subprocess
import sys
import tempfile
import threading
import time
from collections import Counter
from collections.abc import Iterator, Mapping
from contextlib import contextmanager
from datetime import UTC, datetime
from pathlib import Path
from typing import Any

import charter
from charter import AttemptStatus, RunStatus
from charter.sandbox import Sandbox

HERE = Path(__file__).resolve().parent
SRC = HERE.parent / "src"
AMOUNT = 1_00  # cents per invoice

CONTRACT: dict[str, Any] = {
    "objective": "Pay the suppliers' invoices",
    "principals": {"agent": {"run": ["payments.*"]}, "alice": ["resolve", "stop"]},
    "allowance": {"usd_cents": 10_000_000},
}


class WorkerProcess:
    """One worker process: started, and its JSON lines read as they come."""

    def __init__(self, folder: Path, name: str, config: dict[str, Any]) -> None:
        self.name = name
        path = folder / f"{name}.json"
        path.write_text(json.dumps({**config, "name": name}))
        env = {**os.environ, "PYTHONPATH": os.pathsep.join([str(HERE), str(SRC), *sys.path])}
        self.log = folder / f"{name}.log"
        with self.log.open("ab") as err:
            self.proc = subprocess.Popen(
                [sys.executable, str(HERE / "_worker_plans.py"), str(path)],
                stdout=subprocess.PIPE,
                stderr=err,
                text=True,
                env=env,
            )
        self.lines: list[dict[str, Any]] = []
        self.started = threading.Event()
        self._reader = threading.Thread(target=self._read, daemon=True)
        self._reader.start()
        if not self.started.wait(60):
            self.kill()
            raise AssertionError(f"worker {name} did not start: {self.log.read_text()[-2000:]}")

    def _read(self) -> None:
        assert self.proc.stdout is not None
        for line in self.proc.stdout:
            event = json.loads(line)
            self.lines.append(event)
            if "started" in event:
                self.started.set()

    @property
    def alive(self) -> bool:
        return self.proc.poll() is None

    def signal(self, sig: int) -> None:
        if self.alive:
            self.proc.send_signal(sig)

    def kill(self) -> None:
        """SIGKILL: the process ends with no chance to say anything (a crash)."""
        self.signal(signal.SIGKILL)
        self.proc.wait(10)

    def close(self) -> None:
        if self.alive:
            self.proc.send_signal(signal.SIGCONT)
            self.kill()
        self._reader.join(5)
        if self.proc.stdout is not None:
            self.proc.stdout.close()


class Fleet:
    """Worker processes on one store, each with the same engine configuration."""

    def __init__(self, folder: Path, config: dict[str, Any]) -> None:
        self.folder = folder
        self.config = config
        self.workers: list[WorkerProcess] = []
        self._names = 0

    def spawn(self, **overrides: Any) -> WorkerProcess:
        self._names += 1
        worker = WorkerProcess(self.folder, f"w{self._names}", {**self.config, **overrides})
        self.workers.append(worker)
        return worker

    @property
    def alive(self) -> list[WorkerProcess]:
        return [w for w in self.workers if w.alive]

    def kill_all(self) -> None:
        """SIGKILL every live worker at once (then reap them)."""
        live = self.alive
        for w in live:
            w.signal(signal.SIGKILL)
        for w in live:
            w.proc.wait(10)

    def close(self) -> None:
        for w in self.workers:
            w.close()


@contextmanager
def fleet(folder: Path, config: dict[str, Any]) -> Iterator[Fleet]:
    """A fleet whose every worker is killed when the test ends, however it ends."""
    made = Fleet(folder, config)
    try:
        yield made
    finally:
        made.close()


def submit(
    engine: charter.Engine,
    agent: charter.Principal,
    mission: str,
    box: Sandbox,
    runs: int,
    *,
    invoices: int,
    first: int = 0,
) -> list[str]:
    """Submit ``runs`` runs of the paying plan, ``invoices`` distinct invoices each
    (``inv-<run>-<invoice>``, runs numbered from ``first``)."""
    return [
        engine.submit(
            mission,
            by=agent,
            plan="_worker_plans:PAY",
            input={
                "sandbox": box.url,
                "amount": AMOUNT,
                "invoices": [f"inv-{r}-{i}" for i in range(invoices)],
            },
        ).id
        for r in range(first, first + runs)
    ]


def settled(run: charter.Run) -> bool:
    """The run finished, or waits for a person who is told why."""
    return run.status.terminal or (
        run.status is RunStatus.NEEDS_INTERVENTION and bool(run.status_reason)
    )


def wait_settled(engine: charter.Engine, mission: str, timeout: float) -> list[charter.Run]:
    """Wait until every run of the mission finished or waits for a person, no
    worker meaning to look at it again by itself (a lookup due later, K5)."""
    deadline = time.monotonic() + timeout
    while True:
        runs = engine.runs(mission)
        if all(settled(r) and not looking(engine, r) for r in runs):
            return runs
        if time.monotonic() > deadline:
            left = [stuck(engine, r) for r in runs if not settled(r)]
            raise AssertionError(f"runs still on their way after {timeout}s: {left}")
        time.sleep(0.2)


def looking(engine: charter.Engine, run: charter.Run) -> bool:
    """Whether a run not ended falls due by itself: a worker looks at it again."""
    queued = None if run.status.terminal else engine.queued_run(run.id)
    return queued is not None and queued["due_at_us"] is not None


def stuck(engine: charter.Engine, run: charter.Run) -> dict[str, Any]:
    """What a run that is not moving on looks like: for the failure's message."""
    return {
        "run": run.id,
        "status": run.status.value,
        "reason": run.status_reason,
        "epoch": run.epoch,
        "segment": run.owner_segment,
        "lease_left_s": (run.lease_expires_us - engine.now_us()) / 1e6,
        "queue": engine.queued_run(run.id),
        "attempts": [(a.request, a.status.value) for a in engine.attempts(run_id=run.id)],
    }


def wait_paid(box: Sandbox, count: int, timeout: float) -> None:
    """Wait until the sandbox applied at least ``count`` payments."""
    deadline = time.monotonic() + timeout
    while len(box.payments()) < count:
        assert time.monotonic() < deadline, f"fewer than {count} payments after {timeout}s"
        time.sleep(0.02)


def violations(
    engine: charter.Engine,
    mission: str,
    box: Sandbox,
    paused: Mapping[str, list[tuple[int, int]]] | None = None,
) -> list[str]:
    """What the sandbox took and what the store recorded, against the rules.

    A4: no invoice paid twice. A2: no key sent twice. F3: each create came with
    the epoch its attempt was dispatched under, and reached the sandbox before
    its send deadline, unless the worker that dispatched it was paused at that
    deadline (``paused``: each worker's SIGSTOP and SIGCONT, wall-clock µs) by a
    pause that began as the send was checked: a pause between the last check
    and the first byte sends late, which no check can stop, and the target's
    fence is what refuses it then (:func:`_paused_sending`). A send the
    sandbox refused although it arrived in time is the target's order (its
    lookup for a new owner decided first), not a late send. L0-L2: what the
    ledger spent is what the sandbox took for settled attempts; a payment the
    store does not know as settled is still held. S1: every audit chain verifies.
    """
    found: list[str] = []
    attempts = {a.idempotency_key: a for a in engine.attempts(mission_id=mission)}
    paid = [p for p in box.payments() if p["idempotency_key"] in attempts]
    twice = [ref for ref, n in Counter(p["reference"] for p in paid).items() if n > 1]
    if twice:
        found.append(f"A4: paid twice {twice}")
    creates = [r for r in box.requests() if r["kind"] == "create"]
    sends = Counter(r["idempotency_key"] for r in creates)
    if any(n > 1 for n in sends.values()):
        found.append(f"A2: sent twice {[k for k, n in sends.items() if n > 1]}")
    dispatchers = {
        e["entity"]: e["segment"]
        for e in engine.audit_events(mission)
        if e["kind"] == "attempt.dispatched"
    }
    for r in creates:
        a = attempts.get(r["idempotency_key"])
        if a is None:
            found.append(f"A1: a send of no recorded attempt: {r}")
            continue
        if r["fencing_token"] != f"{a.run_id}:{a.dispatched_epoch}":
            found.append(
                f"F3: {a.id} sent as {r['fencing_token']}, dispatched at {a.dispatched_epoch}"
            )
        if _us(r["received_at"]) > (a.send_deadline_us or 0) and not _paused_sending(
            a, str(dispatchers.get(a.id, "")), paused or {}
        ):
            found.append(f"F3: a send after its deadline: {story(engine, box, mission, a)}")
    by_status = {p["idempotency_key"]: attempts[p["idempotency_key"]].status for p in paid}
    wrong = [k for k, s in by_status.items() if s not in (AttemptStatus.SUCCEEDED, *UNRESOLVED)]
    if wrong:
        found.append(f"A3: payments the store settled as not applied: {wrong}")
    claimed = [
        a.id
        for k, a in attempts.items()
        if a.status is AttemptStatus.SUCCEEDED and k not in by_status
    ]
    if claimed:
        found.append(f"A3: attempts settled as paid that the sandbox never took: {claimed}")
    took = sum(
        p["amount"] for p in paid if by_status[p["idempotency_key"]] is AttemptStatus.SUCCEEDED
    )
    (balance,) = engine.balances(mission).values()
    held = sum(a.estimate.get("usd_cents", 0) for a in attempts.values() if a.status in UNRESOLVED)
    if (balance.spent, balance.held) != (took, held):
        found.append(
            f"L1/L2: spent {balance.spent} held {balance.held}; the sandbox took {took} "
            f"for settled attempts and {held} is unresolved"
        )
    found += [f"L0: {p}" for p in engine.check_ledger(mission)]
    found += [f"S1: chain {v.chain} broken" for v in engine.verify_audit() if not v.ok]
    return found


#: How long after its dispatch commit (the store's time of it) a send's last
#: check is taken to have passed: a pause that began later cannot be the one
#: between that check and the first byte, so it does not excuse a late send.
CHECKED_WITHIN_US = 250_000


def _paused_sending(
    attempt: Any, segment: str, paused: Mapping[str, list[tuple[int, int]]]
) -> bool:
    """Whether the worker that dispatched ``attempt`` (its segment is the worker's
    name, a dash and a suffix) was paused across its send deadline, by a pause
    that began as its send was checked (F3's one window no check closes)."""
    dispatched, deadline = attempt.dispatched_at_us or 0, attempt.send_deadline_us or 0
    return any(
        dispatched <= stop <= dispatched + CHECKED_WITHIN_US and stop <= deadline <= cont
        for stop, cont in paused.get(segment.rsplit("-", 1)[0], [])
    )


def _us(iso: str) -> int:
    """A time the sandbox recorded, in µs since the epoch (the store's unit)."""
    return int(datetime.fromisoformat(iso).timestamp() * 1_000_000)


def story(engine: charter.Engine, box: Sandbox, mission: str, attempt: Any) -> str:
    """What an attempt's send went through, on one clock (the machine's wall
    clock, which the store, the workers and the sandbox all read): the
    attempt's dispatch and deadline, every request with its key, creates and
    lookups (received and decided), and its run's ownership events."""

    def at(us: int | None) -> str:
        return "-" if us is None else datetime.fromtimestamp(us / 1e6, UTC).isoformat()

    key = attempt.idempotency_key
    sent = [
        f"{r['kind']} {r['fencing_token']} {r['verdict']} received {r['received_at']} "
        f"decided {r['at']}"
        for r in box.requests()
        if r["idempotency_key"] == key
    ]
    owning = [
        f"{e['kind']} epoch {e['epoch']} by {e['segment']} at {at(e['at_us'])}"
        for e in engine.audit_events(mission)
        if e["entity"] in (attempt.run_id, attempt.id) and e["kind"] != "run.lease_renewed"
    ]
    return (
        f"{attempt.id} {attempt.status.value} ({attempt.reason}): dispatched at "
        f"{at(attempt.dispatched_at_us)} epoch {attempt.dispatched_epoch}, deadline "
        f"{at(attempt.send_deadline_us)}; requests {sent}; events {owning}"
    )


UNRESOLVED = (AttemptStatus.PREPARED, AttemptStatus.DISPATCHED, AttemptStatus.UNKNOWN)


def unwatched(engine: charter.Engine, mission: str) -> list[str]:
    """K5: no run is ``active`` without a live lease or a due wake (a worker holds
    it, or it falls due by itself), and every run that cannot go on without a
    person (``paused``, ``needs_intervention``) says why and is in the inbox."""
    found: list[str] = []
    now = engine.now_us()
    inbox = {r.id for r in engine.runs_needing_people(limit=10_000)}
    for run in engine.runs(mission):
        queued = engine.queued_run(run.id)
        due = queued is not None and queued["due_at_us"] is not None
        if run.status is RunStatus.ACTIVE and run.lease_expires_us <= now and not due:
            found.append(f"K5: active with no live lease and no wake: {stuck(engine, run)}")
        if run.status in (RunStatus.PAUSED, RunStatus.NEEDS_INTERVENTION):
            if not run.status_reason:
                found.append(f"K5: {run.status.value} with no reason: {stuck(engine, run)}")
            if run.id not in inbox:
                found.append(f"K5: {run.status.value} and not in the inbox: {stuck(engine, run)}")
    return found


def left_unknown(engine: charter.Engine, mission: str) -> list[str]:
    """K5: the UNKNOWN attempts left, where the sandbox answers every lookup (so a
    worker that holds its adapter settles each): none should be left."""
    return [
        f"K5: {a.id} ({a.request['reference']}) is UNKNOWN though its lookup settles it"
        for a in engine.attempts(mission_id=mission, unresolved=True)
        if a.status is AttemptStatus.UNKNOWN
    ]


def audit_verify_cli(store: str) -> tuple[int, str]:
    """``charter audit verify`` against the store, as an operator runs it."""
    env = {**os.environ, "PYTHONPATH": os.pathsep.join([str(SRC), *sys.path])}
    done = subprocess.run(
        [sys.executable, "-m", "charter", "--json", "--store", store, "audit", "verify"],
        capture_output=True,
        text=True,
        env=env,
        timeout=120,
    )
    return done.returncode, done.stdout + done.stderr


class Cluster:
    """A throwaway PostgreSQL cluster of this test's own, that can be stopped
    hard (``pg_ctl -m immediate``: no checkpoint, crash recovery at the next
    start) and started again on the same port and data."""

    def __init__(self) -> None:
        self.pg_ctl = _binary("pg_ctl")
        initdb = _binary("initdb")
        if self.pg_ctl is None or initdb is None:
            raise FileNotFoundError("initdb and pg_ctl are needed for a cluster of the test's own")
        self.prefix: list[str] = []
        self.root = Path(tempfile.mkdtemp(prefix="charter-fleet-pg-"))
        if os.geteuid() == 0:  # PostgreSQL refuses to run as root
            import pwd

            runuser = shutil.which("runuser")
            if runuser is None:
                raise FileNotFoundError("runuser is needed to run PostgreSQL as root")
            self.prefix = [runuser, "-u", "postgres", "--"]
            os.chown(self.root, pwd.getpwnam("postgres").pw_uid, -1)
        self.data = self.root / "data"
        with socket.socket() as s:
            s.bind(("127.0.0.1", 0))
            self.port = int(s.getsockname()[1])
        subprocess.run(
            [*self.prefix, initdb, "-D", str(self.data), "-A", "trust", "-U", "fleet", "--no-sync"],
            check=True,
            capture_output=True,
        )
        self.url = f"postgresql://fleet@127.0.0.1:{self.port}/postgres"

    def start(self) -> None:
        options = (
            f"-c listen_addresses=127.0.0.1 -c port={self.port} "
            f"-c unix_socket_directories={self.root} -c max_connections=100"
        )
        subprocess.run(
            [
                *self.prefix,
                self.pg_ctl,
                "-D",
                str(self.data),
                "-o",
                options,
                "-l",
                str(self.root / "log"),
                "-w",
                "start",
            ],
            check=True,
            capture_output=True,
        )

    def stop(self, mode: str = "fast") -> None:
        subprocess.run(
            [*self.prefix, self.pg_ctl, "-D", str(self.data), "-m", mode, "-w", "stop"],
            check=False,
            capture_output=True,
        )

    def remove(self) -> None:
        self.stop("immediate")
        shutil.rmtree(self.root, ignore_errors=True)


def _binary(name: str) -> str | None:
    found = shutil.which(name)
    if found:
        return found
    candidates = sorted(Path("/usr/lib/postgresql").glob(f"*/bin/{name}"), reverse=True)
    return str(candidates[0]) if candidates else None
