"""Every commit of a workload, interrupted (A1-A4, F1-F3, L0, R1-R8, S1).

Two workloads (``_sweep_workloads.py``), each against the payments sandbox: a
payment mission with an approval, whose executor runs in a child process and
pays four invoices, the last to a new payee that needs an approval; and an
agent loop that, each turn, makes a ``read_only`` call and a payment, through
an ``idempotent_keyed`` operation and an ``unsafe`` one in turn; and a graph
that saves the invoices as an artifact, pays three of them in three concurrent
nodes that use it, and pays the fourth and saves a report in the fan-in. A first run counts
its physical commits (K). Then, for every k in 1..K, a fresh mission is run
again with the child stopped at commit k — SIGKILLed just before it or just
after it, or with the commit failing before it or after it succeeded (the
connection lost once the server had committed), or paused (SIGSTOP) just
after it until another segment has taken its run over, then resumed
(SIGCONT): it must be fenced, and send nothing more (F2, F3). Each time an operator then
finishes the mission through the public API, as a person would: recover
(a dead owner is taken over at once), reconcile what is uncertain by the
sandbox's lookup, confirm it, approve, resume. After each case the invariants
are checked against the store and against what the sandbox applied.

A failure names its case, so it replays alone: ``-k`` with the mode, and the
``k`` printed in the message.
"""

from __future__ import annotations

import contextlib
import json
import os
import signal
import subprocess
import sys
import threading
import time
from collections import Counter
from collections.abc import Iterator
from dataclasses import dataclass
from pathlib import Path
from typing import Any

import pytest

import charter
from _sweep_workloads import WORKLOADS
from charter import AttemptStatus
from charter.cli.demo import INVOICES
from charter.sandbox import Sandbox
from charter.testing import RecordingAdapter
from conftest import LONG, Principals

HERE = Path(__file__).resolve().parent
CHILD_TIMEOUT = 60
#: The paused worker's lease (s): the other segment waits this long to take over.
#: Its sends must start within half of it (F3). At one second, a machine whose
#: commits slowed under load (the suite runs beside the sweep) had the engine
#: refuse three sends in a row as late, each a not-applied attempt counted by
#: the operation's retry policy (A4), and the payment's node ended failed.
PAUSED_LEASE = 2.0
Creds = tuple[dict[str, str], dict[str, str]]

CONTRACT = {
    "objective": "Pay this week's invoices",
    "principals": {
        "agent": {"run": ["payments.*"]},
        "alice": ["resolve", "stop", "run"],
        "bob": {"approve": ["payments.pay_new_payee"]},
    },
    "allowance": {"usd": 100_00},
    "approvals": {"required": ["payments.pay_new_payee"], "ttl_seconds": 3600},
}


@dataclass
class World:
    engine: charter.Engine
    who: Principals
    box: Sandbox
    store: str
    creds: Creds
    dir: Path
    workload: str = "payments"

    forks: ForkServer | None = None

    def child(self, mission: str, k: int, when: str = "before", what: str = "kill") -> Any:
        """Run the agent's executor in a child process stopped at commit ``k``."""
        if self.forks is None:
            self.forks = ForkServer()
        config = self._config(mission, k, when, what)
        code = self.forks.run(config, timeout=CHILD_TIMEOUT)
        out, err = (Path(f"{config}.{part}").read_text() for part in ("out", "err"))
        return code, [json.loads(line) for line in out.splitlines()], err

    def paused_child(self, mission: str, k: int) -> subprocess.Popen[str]:
        """The agent's executor with a short lease, paused just after commit ``k``."""
        env = {**os.environ, "PYTHONPATH": os.pathsep.join([str(HERE), *sys.path])}
        command = self._command(mission, k, "after", "pause", lease_seconds=PAUSED_LEASE)
        return subprocess.Popen(
            command, stdout=subprocess.PIPE, stderr=subprocess.PIPE, text=True, env=env
        )

    def _command(self, mission: str, k: int, when: str, what: str, **extra: float) -> list[str]:
        config = self._config(mission, k, when, what, **extra)
        return [sys.executable, str(HERE / "_sweep_child.py"), str(config)]

    def _config(self, mission: str, k: int, when: str, what: str, **extra: float) -> Path:
        config = self.dir / f"child-{mission}.json"
        config.write_text(
            json.dumps(
                {
                    "store": self.store,
                    "digests": self.creds[1],
                    "credential": self.creds[0]["agent"],
                    "url": self.box.url,
                    "mission": mission,
                    "invoices": list(INVOICES),
                    "k": k,
                    "when": when,
                    "what": what,
                    "workload": self.workload,
                    "artifacts": str(self.dir / "artifacts"),
                    "workspace": str(self.dir / "work"),
                    **extra,
                }
            )
        )
        return config


class ForkServer:
    """``_sweep_child.py --serve``: a process that has imported the child's code
    once and forks a child for each case (about 0.2 s of imports saved a case)."""

    def __init__(self) -> None:
        env = {**os.environ, "PYTHONPATH": os.pathsep.join([str(HERE), *sys.path])}
        self.proc = subprocess.Popen(
            [sys.executable, str(HERE / "_sweep_child.py"), "--serve"],
            stdin=subprocess.PIPE,
            stdout=subprocess.PIPE,
            text=True,
            env=env,
        )

    def run(self, config: Path, timeout: float) -> int:
        """The child's exit code (``-9``: SIGKILLed). A child that outlives
        ``timeout`` is killed and fails the case: its ``-9`` is not the kill
        the case asked for."""
        assert self.proc.stdin is not None and self.proc.stdout is not None
        self.proc.stdin.write(f"{config}\n")
        self.proc.stdin.flush()
        pid = json.loads(self.proc.stdout.readline())["pid"]
        late = threading.Event()

        def overdue() -> None:
            late.set()
            os.kill(pid, signal.SIGKILL)

        timer = threading.Timer(timeout, overdue)
        timer.start()
        try:
            line = self.proc.stdout.readline()
        finally:
            timer.cancel()
        if not line:
            raise AssertionError(f"the fork server ended ({self.proc.poll()})")
        if late.is_set():
            raise AssertionError(f"the child of {config} ran past {timeout} s and was killed")
        return int(json.loads(line)["code"])

    def close(self) -> None:
        if self.proc.stdin is not None:
            self.proc.stdin.close()
        try:
            self.proc.wait(timeout=10)
        except subprocess.TimeoutExpired:
            self.proc.kill()
            self.proc.wait()
        if self.proc.stdout is not None:
            self.proc.stdout.close()


@pytest.fixture(params=sorted(WORKLOADS))
def world(
    store_address: str, creds: Creds, tmp_path: Path, request: pytest.FixtureRequest
) -> Iterator[World]:
    config = charter.EngineConfig(
        credentials=creds[1],
        artifacts=str(tmp_path / "artifacts"),
        workspace=str(tmp_path / "work"),
    )
    engine = charter.Engine.open(store_address, config=config)
    with Sandbox(tmp_path / "sandbox.db") as box:
        world = World(
            engine, Principals(*creds, engine), box, store_address, creds, tmp_path, request.param
        )
        try:
            yield world
        finally:
            if world.forks is not None:
                world.forks.close()
    engine.close()


def finish(world: World, mission: str) -> str:
    """What an operator does until the mission's run has completed; its run."""
    engine, who = world.engine, world.who
    make_adapter, make_plan = WORKLOADS[world.workload]
    with make_adapter(world.box.url) as payments:
        plan = make_plan(payments)
        runs = engine.runs(mission)
        if not runs:  # the worker died before its run existed: start it again
            ex = engine.start_run(
                mission, by=who.agent, segment_id="op-start", plan=plan, input=list(INVOICES)
            )
            run_id = ex.run_id
            with contextlib.suppress(charter.Blocked):  # the approval: it lets go of the run
                ex.execute(plan)
        else:
            [run] = runs
            run_id = run.id
        for turn in range(8):
            if engine.run(run_id).status.terminal:
                return run_id
            segment = _take_over(world, run_id, f"op-{turn}")
            for attempt in engine.attempts(run_id=run_id, unresolved=True):
                if attempt.status is not AttemptStatus.UNKNOWN:
                    continue
                if attempt.effect_class == "read_only":  # a look with no lookup: written off
                    engine.coordinator.resolve(
                        attempt.id,
                        by=who.alice,
                        outcome="written_off",
                        evidence="a read with no effect; its answer was lost",
                    )
                    continue
                evidence = engine.coordinator.reconcile(attempt.id, payments, by=who.alice)
                assert evidence.conclusive, evidence  # the lookup by key always proves
                engine.coordinator.confirm(attempt.id, by=who.alice)
            for approval in engine.approvals(run_id=run_id, pending=True):
                engine.approve(approval.id, by=who.bob)
            ex = engine.coordinator.resume(run_id, segment, by=who.alice)
            try:
                ex.execute(plan)
            except charter.Blocked:
                continue
            except charter.AttemptFailed:  # the run ended failed: violations() says why
                return run_id
    return run_id


def _take_over(world: World, run_id: str, segment: str) -> str:
    """Recover as a new segment (a dead owner is taken over at once). When the
    worker stopped by itself, its lease still runs: with an attempt left in
    flight (its settlement was lost) the operator, who saw the worker exit,
    forces the takeover (audited); otherwise goes on as the worker's segment."""
    engine = world.engine
    try:
        engine.coordinator.recover(run_id, segment)
    except charter.LeaseHeld:
        in_flight = engine.attempts(run_id=run_id, unresolved=True)
        if not any(a.status is AttemptStatus.DISPATCHED for a in in_flight):
            return engine.run(run_id).owner_segment
        engine.coordinator.recover(run_id, segment, force=True, by=world.who.alice)
    return segment


def violations(world: World, mission: str, run_id: str) -> list[str]:
    """Each invariant, named by its rule, against the store and the sandbox."""
    engine = world.engine
    found: list[str] = []
    run = engine.run(run_id)
    attempts = engine.attempts(run_id=run_id)
    if run.status is not charter.RunStatus.COMPLETED:
        tries = [
            f"{a.scope} gen {a.generation} {a.status.value}: {a.reason}"
            for a in attempts
            if a.status is not AttemptStatus.SUCCEEDED
        ]
        found.append(f"N1: run ended {run.status.value}, not completed; tries {tries}")
    keys = {a.idempotency_key for a in attempts}
    paid = [p for p in world.box.payments() if p["idempotency_key"] in keys]
    per_invoice = Counter(p["reference"] for p in paid)
    if sorted(per_invoice) != sorted(i["invoice"] for i in INVOICES):
        found.append(f"A4: invoices paid {dict(per_invoice)}")
    if any(n > 1 for n in per_invoice.values()):
        found.append(f"A4: an invoice paid twice {dict(per_invoice)}")
    sends = Counter(
        r["idempotency_key"]
        for r in world.box.requests()
        if r["kind"] == "create" and r["idempotency_key"] in keys
    )
    if any(n > 1 for n in sends.values()):
        found.append(f"A2: an attempt sent twice {dict(sends)}")
    if [a.id for a in attempts if a.status.unresolved]:
        found.append("R7: attempts left unresolved")
    spent = engine.balances(mission)["usd"]
    if spent.spent != sum(p["amount"] for p in paid) or spent.held != 0:
        found.append(f"L0: ledger spent {spent.spent} held {spent.held} vs sandbox {paid}")
    found += [f"L0: {p}" for p in engine.check_ledger(mission)]
    found += [f"S1: chain {v.chain} broken" for v in engine.verify_audit(mission) if not v.ok]
    found += [f"N2: artifact {a}" for a in engine.verify_artifacts(run_id) if not a["ok"]]
    return found


def violations_after(world: World, mission: str) -> list[str]:
    """Finish the mission as an operator would, then check it."""
    return violations(world, mission, finish(world, mission))


def one_case(world: World, k: int, when: str, what: str) -> list[str]:
    mission = world.engine.create_mission(CONTRACT, by=world.who.alice, name=f"{what}-{when}-{k}")
    code, lines, stderr = world.child(mission, k, when, what)
    expected = -9 if what == "kill" else 0
    # Concurrent nodes share commits as they happen to meet, so a graph's run
    # may make fewer commits than the one that counted them: k was not reached.
    unreached = code == 0 and lines and lines[-1].get("commits", k) < k
    if code != expected and not unreached:
        return [f"k={k}: the child ended {code}, not {expected}: {stderr[-400:]}"]
    run_id = finish(world, mission)
    return [f"k={k} {what} {when}: {v}" for v in violations(world, mission, run_id)]


def _stopped(proc: subprocess.Popen[str]) -> bool:
    """Whether the process is stopped by a signal (state T in /proc)."""
    try:
        stat = Path(f"/proc/{proc.pid}/stat").read_text()
    except OSError:
        return False
    return stat.rsplit(")", 1)[1].split()[0] in ("T", "t")


def _take_over_paused(world: World, run_id: str) -> int | None:
    """Recover the paused worker's run as soon as its lease has run out (its
    process is alive, so nothing earlier may take it); the new epoch. ``None``
    when the store stays busy: another thread of the paused worker was inside a
    transaction, and holds the store's lock (SQLite's writer lock, or the
    mission's gate) until it is resumed; the wait is bounded and typed."""
    deadline = time.monotonic() + CHILD_TIMEOUT
    while True:
        try:
            return world.engine.coordinator.recover(run_id, "op-paused").epoch
        except charter.StoreBusy:
            return None
        except charter.LeaseHeld:
            if time.monotonic() > deadline:
                raise
            time.sleep(0.05)


def paused_case(world: World, k: int) -> list[str]:
    """The worker paused just after commit ``k``, its run taken over, then resumed."""
    engine = world.engine
    mission = engine.create_mission(CONTRACT, by=world.who.alice, name=f"pause-{k}")
    proc = world.paused_child(mission, k)
    try:
        deadline = time.monotonic() + CHILD_TIMEOUT
        while not _stopped(proc):
            if proc.poll() == 0:  # k not reached this time (see one_case)
                proc.communicate()
                return [f"k={k} pause after: {v}" for v in violations_after(world, mission)]
            if proc.poll() is not None or time.monotonic() > deadline:
                proc.kill()
                _, stderr = proc.communicate()
                return [f"k={k} pause: the child did not pause ({proc.poll()}): {stderr[-400:]}"]
            time.sleep(0.01)
        runs = engine.runs(mission)
        sent_before = len(world.box.requests())
        fenced: tuple[str, dict[str, str]] | None = None
        epoch = _take_over_paused(world, runs[0].id) if runs else None
        if epoch is not None:
            dispatched = {
                a.id: a.idempotency_key
                for a in engine.attempts(run_id=runs[0].id)
                if a.dispatched_epoch == epoch - 1
            }
            fenced = (f"{runs[0].id}:{epoch - 1}", dispatched)
        os.kill(proc.pid, signal.SIGCONT)
        _, stderr = proc.communicate(timeout=CHILD_TIMEOUT)
    finally:
        if proc.poll() is None:
            proc.kill()
            proc.communicate()
    if proc.returncode != 0:
        return [f"k={k} pause: the child ended {proc.returncode}: {stderr[-400:]}"]
    found = []
    if fenced is not None:
        token, dispatched = fenced
        # F3: a paused owner may still send what it had dispatched and checked
        # against its deadline before the pause (no store can stop bytes already
        # on their way; the fencing token is for targets that check it); any
        # other send of the old epoch after the takeover is a violation.
        keys = set(dispatched.values())
        late = [
            r
            for r in world.box.requests()[sent_before:]
            if r["fencing_token"] == token and r["idempotency_key"] not in keys
        ]
        if late:
            found.append(f"F3: the fenced worker sent what it had not dispatched: {late}")
        again = [
            a.id
            for a in engine.attempts(run_id=runs[0].id)
            if a.dispatched_epoch == int(token.rsplit(":", 1)[1]) and a.id not in dispatched
        ]
        if again:
            found.append(f"F2: dispatch commits from the fenced epoch: {again}")
    run_id = finish(world, mission)
    found += violations(world, mission, run_id)
    return [f"k={k} pause after: {v}" for v in found]


#: The fast profile interrupts every commit of the payment mission, and every
#: third commit of the longer workloads (each mode starting at another one, so
#: the four modes together reach every commit); ``--long`` every commit of all.
STRIDE = {"payments": 1, "agent": 3, "fanout": 3}


def commits_to_sweep(world: World, commits: int, offset: int = 0) -> range:
    stride = 1 if LONG else STRIDE[world.workload]
    return range(1 + offset % stride, commits + 1, stride)


def workload_commits(world: World) -> int:
    """K: the commits the worker makes when nothing goes wrong (to its approval wait)."""
    mission = world.engine.create_mission(CONTRACT, by=world.who.alice, name="count")
    code, lines, stderr = world.child(mission, 0)
    assert code == 0, stderr
    assert lines[-1]["end"].startswith("blocked"), lines
    run_id = finish(world, mission)
    assert violations(world, mission, run_id) == []
    return int(lines[-1]["commits"])


@pytest.mark.crash
@pytest.mark.timeout(900)
@pytest.mark.parametrize(
    ("what", "when"),
    [("kill", "before"), ("kill", "after"), ("fail", "before"), ("fail", "after")],
    ids=["killed-before-commit", "killed-after-commit", "commit-fails", "commit-lost-after"],
)
def test_A2_A4_F1_R1_L0_every_commit_of_each_workload_interrupted_is_recovered(
    world: World, what: str, when: str
) -> None:
    commits = workload_commits(world)
    assert commits >= 10  # start, admissions, dispatches, settlements, node steps
    mode = ["kill", "fail"].index(what) * 2 + ["before", "after"].index(when)
    found = [
        v for k in commits_to_sweep(world, commits, mode) for v in one_case(world, k, when, what)
    ]
    assert found == [], "\n".join(found)


@pytest.mark.crash
@pytest.mark.timeout(900)
def test_F2_F3_A2_a_worker_paused_after_every_commit_is_fenced_once_taken_over(
    world: World,
) -> None:
    """SIGSTOP just after each commit k, past the worker's lease; another segment
    takes the run over; SIGCONT. The resumed worker commits nothing more under
    its old epoch and sends nothing; the operator finishes the mission."""
    commits = workload_commits(world)
    found = [v for k in commits_to_sweep(world, commits) for v in paused_case(world, k)]
    assert found == [], "\n".join(found)


class FailNextCommit:
    """Fails the next physical commit once armed (a store that refused it)."""

    def __init__(self) -> None:
        self.armed = False

    def __call__(self, name: str) -> None:
        if self.armed and name == "commit.before":
            self.armed = False
            raise charter.StoreBusy("the store stayed busy (injected)", retryable=True)


def test_A4_R4_a_failed_admission_commit_blocks_the_node_and_the_run_resumes(
    store_address: str, creds: Creds
) -> None:
    """Confirmed by the sweep: a store that failed an admission commit ended the
    run FAILED, as if the node had failed; nothing was stored or sent."""
    hook = FailNextCommit()
    config = charter.EngineConfig(credentials=creds[1])
    with charter.Engine.open(store_address, config=config, crash_hook=hook) as engine:
        who = Principals(*creds, engine)
        mission = engine.create_mission(
            {
                **CONTRACT,
                "principals": {"agent": {"run": ["recorder.*"]}, "alice": ["run"]},
                "allowance": {"usd": 100_00, "calls": 10},
            },
            by=who.alice,
        )
        target = RecordingAdapter()
        runs: list[int] = []

        @charter.node
        def pay(ctx: charter.Context, _: Any) -> str:
            hook.armed = not runs  # the store fails the first execution's admission
            runs.append(1)
            return str(ctx.attempt(target, "write", {"to": "acme"}, key="pay")["ok"])

        plan = charter.Plan("one-payment", (pay,))
        ex = engine.start_run(mission, by=who.agent, segment_id="seg-1", plan=plan)
        with pytest.raises(charter.Blocked):
            ex.execute(plan)

        run = engine.run(ex.run_id)
        assert run.status is charter.RunStatus.NEEDS_INTERVENTION
        assert engine.attempts(run_id=ex.run_id) == [] and target.sent == []
        resumed = engine.coordinator.resume(ex.run_id, "seg-1", by=who.alice)
        assert resumed.execute(plan) == "True"
        assert engine.run(ex.run_id).status is charter.RunStatus.COMPLETED
        assert len(target.sent) == 1


def test_A4_N2_a_failed_commit_inside_a_node_blocks_it_and_the_run_resumes(
    store_address: str, creds: Creds, tmp_path: Path
) -> None:
    """Found by sweeping the graph workload: a store that failed the commit of an
    artifact's record (``ctx.save``) failed the node as if its code had, and the
    run ended failed, terminal, with nothing paid. A store failure inside a node
    is the engine's to sort out: the node blocks, the run needs a person, and a
    resume goes on."""
    hook = FailNextCommit()
    config = charter.EngineConfig(
        credentials=creds[1], artifacts=str(tmp_path / "a"), workspace=str(tmp_path / "w")
    )
    with charter.Engine.open(store_address, config=config, crash_hook=hook) as engine:
        who = Principals(*creds, engine)
        mission = engine.create_mission(
            {**CONTRACT, "principals": {"agent": {"run": ["recorder.*"]}, "alice": ["run"]}},
            by=who.alice,
        )
        saves: list[int] = []

        @charter.node
        def write(ctx: charter.Context, _: Any) -> dict[str, Any]:
            ctx.workspace.mkdir(parents=True, exist_ok=True)
            (ctx.workspace / "out.txt").write_text("done\n")
            hook.armed = not saves  # the store fails the first save's commit
            saves.append(1)
            return ctx.save("out.txt")

        plan = charter.Plan("one-artifact", (write,))
        ex = engine.start_run(mission, by=who.agent, segment_id="seg-1", plan=plan)
        with pytest.raises(charter.Blocked):
            ex.execute(plan)

        assert engine.run(ex.run_id).status is charter.RunStatus.NEEDS_INTERVENTION
        assert engine.artifacts(ex.run_id) == []
        resumed = engine.coordinator.resume(ex.run_id, "seg-1", by=who.alice)
        assert resumed.execute(plan)["artifact"] == "out.txt"
        assert engine.run(ex.run_id).status is charter.RunStatus.COMPLETED
        assert [a["ok"] for a in engine.verify_artifacts(ex.run_id)] == [True]
