"""Group commit: writers on one connection share a commit, and nothing is
acknowledged before that commit is durable.

Threads writing through one engine do not each pay for a commit: a transaction
that finishes while another writer waits leaves its changes in the open
transaction, the next runs inside it as a savepoint, and the last commits for
all. These tests pin down what that must never change: a member's failure or
refusal undoes only its own changes, a failed commit fails every member and
stores nothing, and concurrent attempts still settle each effect once with the
ledger and the audit chain intact. PostgreSQL commits each transaction alone;
the same tests run there.
"""

from __future__ import annotations

import os
import signal
import subprocess
import sys
import threading
import time
from collections.abc import Callable
from pathlib import Path

import pytest

import charter
from charter.errors import AdmissionRefused
from charter.storage import Database
from charter.testing import RecordingAdapter
from conftest import Principals


def _events(engine: charter.Engine, mission: str) -> int:
    return engine.verify_audit(mission)[0].events


def _rename(db: Database, mission: str, name: str, *, hold: bool = False) -> None:
    """Rename the mission (audited); with ``hold``, finish only once another
    writer waits, so that a store that groups puts both in one commit."""
    with db.transaction(gate=mission) as tx:
        tx.run("UPDATE missions SET name = ? WHERE id = ?", name, mission)
        tx.audit(mission, "mission.renamed", mission, actor="alice", after=name)
        deadline = time.monotonic() + 5
        while hold and db._waiting[True] < 1 and time.monotonic() < deadline:
            time.sleep(0.001)


def _pair(
    db: Database, first: Callable[[], None], second: Callable[[], None]
) -> list[BaseException | None]:
    """Run ``first`` in one thread and, once it holds the connection, ``second``."""
    errors: list[BaseException | None] = [None, None]

    def run(i: int, body: Callable[[], None]) -> None:
        try:
            body()
        except BaseException as exc:  # reported to the test
            errors[i] = exc

    threads = [threading.Thread(target=run, args=(i, f)) for i, f in enumerate((first, second))]
    threads[0].start()
    deadline = time.monotonic() + 5
    while not db._busy and time.monotonic() < deadline:
        time.sleep(0.001)
    threads[1].start()
    for t in threads:
        t.join(10)
        assert not t.is_alive()
    return errors


def test_two_writers_share_one_commit_where_the_store_groups(
    backend: str, engine: charter.Engine, mission: str
) -> None:
    db = engine._db
    before = db.commits, _events(engine, mission)
    errors = _pair(
        db, lambda: _rename(db, mission, "first", hold=True), lambda: _rename(db, mission, "second")
    )
    assert errors == [None, None]
    assert engine.mission(mission).name == "second"
    assert db.commits - before[0] == (1 if backend == "sqlite" else 2)
    assert _events(engine, mission) == before[1] + 2
    assert all(v.ok for v in engine.verify_audit(mission))


def test_a_failing_member_undoes_only_its_own_changes(
    backend: str, engine: charter.Engine, mission: str
) -> None:
    db = engine._db
    events = _events(engine, mission)

    def failing() -> None:
        with db.transaction(gate=mission) as tx:
            tx.run("UPDATE missions SET name = 'second' WHERE id = ?", mission)
            tx.audit(mission, "mission.renamed", mission, actor="alice", after="second")
            raise KeyError("the second transaction fails")

    errors = _pair(db, lambda: _rename(db, mission, "first", hold=True), failing)
    assert errors[0] is None and isinstance(errors[1], KeyError)
    assert engine.mission(mission).name == "first"
    assert _events(engine, mission) == events + 1
    assert all(v.ok for v in engine.verify_audit(mission))


def test_a_refused_member_keeps_only_its_refusal(
    backend: str, engine: charter.Engine, mission: str
) -> None:
    db = engine._db
    events = _events(engine, mission)

    def refused() -> None:
        with db.transaction(gate=mission) as tx:
            tx.run("UPDATE missions SET name = 'second' WHERE id = ?", mission)
            raise tx.refused(
                AdmissionRefused("refused for the test"),
                mission_id=mission,
                kind="admission.refused",
                entity=mission,
                actor="agent",
            )

    errors = _pair(db, lambda: _rename(db, mission, "first", hold=True), refused)
    assert errors[0] is None and isinstance(errors[1], AdmissionRefused)
    assert engine.mission(mission).name == "first"
    kinds = [e["kind"] for e in engine.audit_events(mission)][-2:]
    assert kinds == ["mission.renamed", "admission.refused"]
    assert _events(engine, mission) == events + 2


def test_a_failed_shared_commit_fails_every_member_and_stores_nothing(
    backend: str, engine: charter.Engine, mission: str, monkeypatch: pytest.MonkeyPatch
) -> None:
    db = engine._db
    before = engine.mission(mission).name, _events(engine, mission)
    commit = db.driver.commit

    def failing_commit() -> None:
        monkeypatch.setattr(db.driver, "commit", commit)  # once
        raise charter.StoreError("the disk is full (for the test)")

    monkeypatch.setattr(db.driver, "commit", failing_commit)
    errors = _pair(
        db, lambda: _rename(db, mission, "first", hold=True), lambda: _rename(db, mission, "second")
    )
    if backend == "sqlite":  # one commit for both: both fail
        assert all(isinstance(e, charter.StoreError) for e in errors), errors
        assert (engine.mission(mission).name, _events(engine, mission)) == before
    else:  # each commits alone: only the first fails
        assert isinstance(errors[0], charter.StoreError) and errors[1] is None
        assert engine.mission(mission).name == "second"
    assert all(v.ok for v in engine.verify_audit(mission))


def test_concurrent_attempts_settle_every_effect_once_sharing_commits(
    backend: str, engine: charter.Engine, who: Principals, mission: str
) -> None:
    """Six threads, each owning a run, make 15 attempts each through one engine."""
    db = engine._db
    adapter = RecordingAdapter()
    executors = [engine.start_run(mission, by=who.agent, segment_id=f"seg-{i}") for i in range(6)]
    before = db.commits
    failures: list[BaseException] = []

    def work(ex: charter.Executor) -> None:
        try:
            for k in range(15):
                attempt = ex.perform(adapter, "read", {"k": k}, effect_key=f"e{k}")
                assert attempt.status is charter.AttemptStatus.SUCCEEDED
        except BaseException as exc:  # reported to the test
            failures.append(exc)

    threads = [threading.Thread(target=work, args=(ex,)) for ex in executors]
    for t in threads:
        t.start()
    for t in threads:
        t.join(60)
    assert failures == []
    attempts = engine.attempts(mission_id=mission)
    assert len(attempts) == 90
    assert {a.status for a in attempts} == {charter.AttemptStatus.SUCCEEDED}
    assert sorted(s.idempotency_key for s in adapter.sent) == sorted(
        a.idempotency_key for a in attempts
    )
    assert engine.check_ledger(mission) == []
    assert all(v.ok for v in engine.verify_audit(mission))
    commits = db.commits - before
    if backend == "sqlite":
        assert commits < 2 * 90  # some attempts shared their commits
    else:
        assert commits == 2 * 90


CHILD = Path(__file__).with_name("_group_child.py")


@pytest.mark.parametrize("after", [0.05, 0.3])
def test_a_kill_amid_shared_commits_leaves_no_send_unrecorded(
    after: float,
    *,
    store_address: str,
    engine: charter.Engine,
    who: Principals,
    mission: str,
    creds: tuple[dict[str, str], dict[str, str]],
    tmp_path: Path,
) -> None:
    """SIGKILL a process whose threads are sharing commits: every effect a
    target received has its dispatch on record (A2: nothing is sent before its
    write-ahead commit is durable, shared or not), the ledger and the audit
    chain hold, and recovery finds the rest."""
    sends = tmp_path / "sends.log"
    env = dict(os.environ)
    src = str(Path(charter.__file__).resolve().parent.parent)
    env["PYTHONPATH"] = os.pathsep.join(p for p in (src, env.get("PYTHONPATH")) if p)
    proc = subprocess.Popen(
        [
            sys.executable,
            str(CHILD),
            store_address,
            creds[1]["agent"],
            creds[0]["agent"],
            mission,
            str(sends),
        ],
        stdout=subprocess.PIPE,
        text=True,
        env=env,
    )
    assert proc.stdout is not None
    assert proc.stdout.readline().strip() == "ready"
    time.sleep(after)
    proc.send_signal(signal.SIGKILL)
    assert proc.wait(10) == -signal.SIGKILL
    proc.stdout.close()

    sent = sends.read_text().splitlines()
    by_key = {a.idempotency_key: a for a in engine.attempts(mission_id=mission)}
    assert len(sent) >= 4 and len(set(sent)) == len(sent)
    for key in sent:
        assert key in by_key, f"{key} was sent but its attempt is not on record"
        assert by_key[key].status is not charter.AttemptStatus.PREPARED
    assert engine.check_ledger(mission) == []
    assert all(v.ok for v in engine.verify_audit(mission))
    runs = [r for r in engine.runs(mission) if r.owner_segment.startswith("seg-")]
    assert len(runs) == 4
    for run in runs:
        state = engine.coordinator.recover(run.id, f"recover-{run.id}", force=True, by=who.alice)
        assert all(a.status.unresolved for a in state.attempts)
    assert engine.check_ledger(mission) == []
