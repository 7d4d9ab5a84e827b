"""Transactions that decide on what the engine remembers of a mission.

On PostgreSQL an executor's transaction does not read the run's standing and
the chain's head before deciding: it recalls them as its last commit on the
mission read them, and sends guards with its writes that abort it, before any
write, if a recalled row or the estimated clock no longer holds; it then runs
again on fresh reads (``charter.storage.recall``). These tests change the
mission under a remembering engine by every way another worker or a person
could, and assert on what was stored and what the target received. On SQLite,
where every read is fresh, the same stories must end the same way.
"""

from __future__ import annotations

from collections.abc import Callable
from dataclasses import dataclass
from typing import Any

import pytest

import charter
from _raw import RawStore
from charter.clock import ManualClock
from charter.errors import StoreChanged
from charter.runs import store as runs_store
from charter.storage import recall
from charter.testing import RecordingAdapter
from conftest import Principals, default_contract


def _warm(ex: charter.Executor, adapter: RecordingAdapter, n: int = 2) -> None:
    """Attempts that leave the engine's memory of the mission as its last commit read it."""
    for k in range(n):
        assert ex.perform(adapter, "write", {"k": k}, effect_key=f"warm-{k}").status.value == (
            "succeeded"
        )


def _doubted(engine: charter.Engine, mission: str) -> bool:
    """Whether a guard of the engine's failed on ``mission`` (PostgreSQL only)."""
    memories = getattr(engine._db.driver, "_memories", None)
    return memories is not None and mission in memories._doubt


@dataclass
class Owned:
    """Two engines on one store; ``first`` owns run ``ex`` of ``mission``, which
    has made two attempts (so ``first`` remembers the mission as its last
    commit there left it)."""

    first: charter.Engine
    second: charter.Engine
    mission: str
    ex: charter.Executor


@pytest.fixture
def owned(
    engine: charter.Engine,
    make_engine: Callable[..., charter.Engine],
    who: Principals,
    adapter: RecordingAdapter,
) -> Owned:
    mission = engine.create_mission(default_contract(), by=who.alice)
    ex = engine.start_run(mission, by=who.agent, segment_id="seg-1")
    _warm(ex, adapter)
    return Owned(engine, make_engine(), mission, ex)


def test_F1_F2_an_executor_whose_run_was_taken_over_meanwhile_is_fenced_and_sends_nothing(
    owned: Owned, clock: ManualClock, adapter: RecordingAdapter, backend: str
) -> None:
    """Another worker recovers the run between two attempts of its owner: the
    owner's next admission, decided on the standing it remembers, is refused
    by the store, runs again on fresh reads and is fenced. Nothing of it is
    stored and the target receives nothing more."""
    first, second, mission, ex = owned.first, owned.second, owned.mission, owned.ex
    clock.advance(31)  # past the lease
    second.coordinator.recover(ex.run_id, "seg-2")
    events = len(first.audit_events(mission))
    with pytest.raises(charter.Fenced):
        ex.perform(adapter, "write", {"k": 9}, effect_key="after-takeover")
    assert len(adapter.sent) == 2
    assert sorted(a.effect_key for a in first.attempts(run_id=ex.run_id)) == ["warm-0", "warm-1"]
    assert len(first.audit_events(mission)) == events  # a fence records nothing
    assert first.run(ex.run_id).epoch == 2
    assert _doubted(first, mission) is (backend == "postgresql")


def test_A1_N5_an_admission_after_a_person_stopped_the_run_meanwhile_is_refused(
    owned: Owned, who: Principals, adapter: RecordingAdapter
) -> None:
    """A person stops the run through another engine between two attempts: the
    owner's next admission sees the stopped run, not the active one it
    remembers, and records only its refusal."""
    first, second, mission, ex = owned.first, owned.second, owned.mission, owned.ex
    alice = second.authenticate(who.credentials["alice"])
    second.stop_run(ex.run_id, by=alice, reason="enough")
    with pytest.raises(charter.AdmissionRefused) as refused:
        ex.perform(adapter, "write", {"k": 9}, effect_key="after-stop")
    assert refused.value.details["run_status"] == "stopped"
    assert len(adapter.sent) == 2
    assert len(first.attempts(run_id=ex.run_id)) == 2
    assert first.audit_events(mission)[-1]["kind"] == "admission.refused"
    assert first.check_ledger(mission) == []


def test_L3_an_admission_spends_from_a_limit_raised_by_another_worker_meanwhile(
    engine: charter.Engine,
    make_engine: Callable[..., charter.Engine],
    who: Principals,
    adapter: RecordingAdapter,
) -> None:
    """The allowance a remembering engine decided on changed under it: an
    admission that needs the raised limit is admitted on it, and the balances
    stored are the fresh ones moved by this attempt."""
    first, second = engine, make_engine()
    contract = default_contract(allowance={"usd": 10_000, "calls": 100})
    mission = first.create_mission(contract, by=who.alice)
    ex = first.start_run(mission, by=who.agent, segment_id="seg-1")
    _warm(ex, adapter)  # 2 x 5,000 usd: nothing is left
    second.raise_limit(mission, "usd", 15_000, by=second.authenticate(who.credentials["alice"]))
    attempt = ex.perform(adapter, "write", {"k": 9}, effect_key="after-raise")
    assert attempt.status.value == "succeeded"
    usd = first.balances(mission)["usd"]
    assert (usd.limit, usd.spent, usd.held, usd.available) == (15_000, 15_000, 0, 0)
    assert first.check_ledger(mission) == []
    assert len(adapter.sent) == 3


def test_A4_a_row_changed_from_outside_is_seen_by_the_next_attempt(
    engine: charter.Engine,
    mission: str,
    who: Principals,
    adapter: RecordingAdapter,
    raw: RawStore,
    backend: str,
) -> None:
    """An operator changes the run's row by hand (its status) without going
    through Charter, so the chain's head does not move: the guard compares
    the row itself, and the admission sees the change."""
    ex = engine.start_run(mission, by=who.agent, segment_id="seg-1")
    _warm(ex, adapter)
    raw.execute("UPDATE runs SET status = 'paused' WHERE id = ?", ex.run_id)
    with pytest.raises(charter.AdmissionRefused) as refused:
        ex.perform(adapter, "write", {"k": 9}, effect_key="after-edit")
    assert refused.value.details["run_status"] == "paused"
    assert len(adapter.sent) == 2
    assert _doubted(engine, mission) is (backend == "postgresql")


@pytest.mark.networked
def test_a_transaction_on_a_copy_that_changed_raises_StoreChanged_and_writes_nothing(
    owned: Owned, who: Principals, backend: str
) -> None:
    """Opened by hand with ``recall=True``, a transaction whose recalled row
    changed is refused whole (typed, retryable); ``transact`` runs its body
    again on fresh reads, and its write lands once."""
    first, second, mission, ex = owned.first, owned.second, owned.mission, owned.ex
    second.stop_run(ex.run_id, by=second.authenticate(who.credentials["alice"]))
    seen: list[str] = []
    with (
        pytest.raises(StoreChanged) as changed,
        first._db.transaction(gate=mission, recall=True) as tx,
    ):
        row = runs_store.standing(tx, mission, ex.run_id)  # what the last commit read again
        assert row is not None
        seen.append(row["status"])
        tx.write("UPDATE missions SET name = 'renamed' WHERE id = ?", mission)
    assert changed.value.details["retryable"] is True
    assert seen == ["active"]  # decided on the copy ...
    assert first.mission(mission).name != "renamed"  # ... and nothing of it was stored

    def body(tx: Any) -> str:
        row = runs_store.standing(tx, mission, ex.run_id)
        seen.append(row["status"])
        tx.write("UPDATE missions SET name = name || '+' WHERE id = ?", mission)
        return str(row["status"])

    name = first.mission(mission).name
    assert first._db.transact(body, gate=mission) == "stopped"
    assert first.mission(mission).name == name + "+"


@pytest.mark.networked
def test_after_a_guard_fails_the_mission_is_read_fresh_for_a_while_then_recalled_again(
    owned: Owned, who: Principals, adapter: RecordingAdapter, backend: str
) -> None:
    """Workers sharing a mission change it under each other: after a failed
    guard, the next transaction there reads first (no round trip wasted on a
    guess), and once one holds, an attempt is two round trips again."""
    first, second, mission, ex = owned.first, owned.second, owned.mission, owned.ex
    other = second.start_run(
        mission, by=second.authenticate(who.credentials["agent"]), segment_id="o"
    )
    other.perform(adapter, "write", {}, effect_key="other")  # moves the chain's head
    driver: Any = first._db.driver
    sends: list[str] = []
    send = driver._send

    def counting(last: Any = None) -> Any:
        sends.append("COMMIT" if last and last[0] == "COMMIT" else "read")
        return send(last)

    driver._send = counting
    ex.perform(adapter, "write", {}, effect_key="guessed-wrong")
    # The admission's guess failed (1), it ran on fresh reads (2), the
    # settlement read first as well (2).
    assert sends == ["COMMIT", "read", "COMMIT", "read", "COMMIT"]
    sends.clear()
    ex.perform(adapter, "write", {}, effect_key="recalled-again")
    assert sends == ["COMMIT", "COMMIT"]
    assert first.check_ledger(mission) == []
    assert [a.status.value for a in first.attempts(run_id=ex.run_id)] == ["succeeded"] * 4


@pytest.mark.networked
def test_F1_F3_a_stray_clock_estimate_is_never_recorded(
    store_address: str,
    creds: tuple[dict[str, str], dict[str, str]],
    backend: str,
) -> None:
    """With the server's clock (not an injected one), a transaction estimates
    the server's time from its last reading. An estimate off by more than
    the slack (here 5 s ahead, as after the server's clock was stepped back) is
    refused by the clock's guard; the attempt is admitted again with the clock
    read after the gate, and what is stored is the server's time."""
    import psycopg

    engine = charter.Engine.open(store_address, config=charter.EngineConfig(credentials=creds[1]))
    try:
        alice = engine.authenticate(creds[0]["alice"])
        agent = engine.authenticate(creds[0]["agent"])
        mission = engine.create_mission(default_contract(), by=alice)
        ex = engine.start_run(mission, by=agent, segment_id="seg-1")
        adapter = RecordingAdapter()
        _warm(ex, adapter)
        driver: Any = engine._db.driver
        server, sent = driver._base
        driver._base = (server + 5_000_000, sent)
        with psycopg.connect(store_address, autocommit=True) as con:
            row = con.execute("SELECT (EXTRACT(EPOCH FROM clock_timestamp()) * 1e6)::BIGINT")
            before = row.fetchone()
        attempt = ex.perform(adapter, "write", {}, effect_key="estimated")
        assert before is not None
        assert attempt.dispatched_at_us is not None
        assert 0 <= attempt.dispatched_at_us - before[0] < 1_000_000
        assert _doubted(engine, mission)
        # The next attempt estimates from a fresh reading, within the slack: its
        # settlement commits on the copy, and the doubt is gone.
        later = ex.perform(adapter, "write", {}, effect_key="later")
        assert later.prepared_at_us is not None and later.settled_at_us is not None
        assert later.settled_at_us >= later.prepared_at_us >= attempt.dispatched_at_us
        assert not _doubted(engine, mission)
    finally:
        engine.close()


@pytest.mark.networked
def test_guards_hold_exactly_when_the_row_read_again_is_the_row_recalled(
    raw: RawStore, backend: str
) -> None:
    """The guard is the read, compared column by column on the server with the
    row the transaction decided on: equal rows pass; a difference in any
    column, NULL against a value, an empty text against NULL, a missing or an
    extra row each fail (division by zero), with text of every kind."""
    raw.execute(
        "CREATE TABLE guarded (id TEXT PRIMARY KEY, n BIGINT, s TEXT, b BOOLEAN, k INTEGER)"
    )
    text = "quote ' and \" and back\\slash, 日本語, emoji 🙂, tab\t"
    raw.execute("INSERT INTO guarded VALUES ('a', 9007199254740993, ?, true, NULL)", text)
    raw.execute("INSERT INTO guarded VALUES ('b', -1, '', false, 7)")
    read = "SELECT n, s, b, k FROM guarded WHERE id = %s"
    rows = {
        "a": {"n": 9007199254740993, "s": text, "b": True, "k": None},
        "b": {"n": -1, "s": "", "b": False, "k": 7},
    }

    def holds(key: str, row: dict[str, Any] | None, sql: str = read) -> bool:
        guard = recall.matching(sql, (key,), row)
        assert guard is not None
        try:
            raw.rows(guard[0].replace("%s", "?"), *guard[1])
        except Exception as exc:  # psycopg's DivisionByZero
            assert type(exc).__name__ == "DivisionByZero"
            return False
        return True

    assert holds("a", rows["a"]) and holds("b", rows["b"])
    assert holds("missing", None)
    assert not holds("a", None)
    assert not holds("missing", rows["a"])
    # Each column against NULL and against another value of its type.
    others: dict[str, list[Any]] = {
        "n": [None, 9007199254740992, -1, 0],
        "s": [None, "", text[:-1], text.upper(), " "],
        "b": [None, True, False],
        "k": [None, 0, 7, -7],
    }
    for key, row in rows.items():
        for column, value in row.items():
            for other in others[column]:
                if other == value and type(other) is type(value):
                    continue
                assert not holds(key, {**row, column: other}), (key, column, other)
    assert not holds("a", rows["a"], "SELECT n, s, b, k FROM guarded WHERE id <> %s OR true")
    assert recall.matching(read, ("a",), {"n": 1.5}) is None  # not comparable as sent


@pytest.mark.networked
def test_a_one_row_write_assumed_is_refused_when_it_changes_none_or_several(
    raw: RawStore, backend: str
) -> None:
    """A conditional write whose count a transaction assumed (one row) is sent
    as a guard of it: it passes only when exactly one row changed."""
    raw.execute("CREATE TABLE counted (id TEXT PRIMARY KEY, n BIGINT)")
    raw.execute("INSERT INTO counted VALUES ('a', 1), ('b', 1)")

    def assumed(sql: str, *params: Any) -> bool:
        wrapped = recall.asserting(sql)
        assert wrapped is not None
        try:
            raw.rows(wrapped.replace("%s", "?"), *params)
        except Exception as exc:
            assert type(exc).__name__ == "DivisionByZero"
            return False
        return True

    assert assumed("UPDATE counted SET n = n + 1 WHERE id = %s AND n = %s", "a", 1)
    assert not assumed("UPDATE counted SET n = n + 1 WHERE id = %s AND n = %s", "a", 1)
    assert not assumed("UPDATE counted SET n = 0 WHERE n >= %s", 0)  # two rows
    # The refused writes changed nothing: only the first one stands.
    assert raw.rows("SELECT n FROM counted ORDER BY id") == [{"n": 2}, {"n": 1}]
    assert recall.asserting("SELECT 1") is None
    assert recall.asserting("UPDATE counted SET n = 1 RETURNING id") is None


def test_A4_L6_a_settlement_whose_attempt_was_changed_by_hand_meanwhile_settles_it_once(
    engine: charter.Engine,
    mission: str,
    who: Principals,
    raw: RawStore,
    backend: str,
) -> None:
    """While the target handles the send, an operator marks the attempt UNKNOWN
    by hand (the chain's head does not move). The settlement assumed its
    decisive update changes the attempt's row; the store refuses that, the
    settlement runs again on fresh reads, finds the attempt UNKNOWN and settles
    it from the report as late evidence: one spend, nothing lost."""
    ex = engine.start_run(mission, by=who.agent, segment_id="seg-1")
    costs = {"write": {"usd": 5_000, "calls": 1}}
    _warm(ex, RecordingAdapter(costs=costs))

    class Meddled(RecordingAdapter):
        def dispatch(self, send: charter.Dispatch) -> charter.Outcome:
            raw.execute("UPDATE attempts SET status = 'unknown' WHERE id = ?", send.attempt_id)
            return super().dispatch(send)

    target = Meddled(costs=costs)
    attempt = ex.perform(target, "write", {"k": 9}, effect_key="meddled")
    assert len(target.sent) == 1
    assert attempt.status.value == "succeeded"
    [late] = engine.evidence(attempt.id)
    assert (late["source"], late["settled"], late["epoch"]) == ("late settlement (epoch 1)", 1, 1)
    kinds = [e["kind"] for e in engine.ledger_entries(mission) if e["attempt_id"] == attempt.id]
    assert sorted(kinds) == ["hold", "hold", "spend", "spend"]  # usd and calls, once each
    assert engine.check_ledger(mission) == []
    assert _doubted(engine, mission) is (backend == "postgresql")


@pytest.mark.networked
def test_guards_sent_together_fail_when_any_one_of_them_fails(raw: RawStore, backend: str) -> None:
    """Consecutive guards travel as one statement: it fails when any of them
    fails, wherever it stands (the server must compute every guard, not only
    the columns it returns)."""
    raw.execute("CREATE TABLE pair (id TEXT PRIMARY KEY, n BIGINT)")
    raw.execute("INSERT INTO pair VALUES ('a', 1), ('b', 2)")
    read = "SELECT n FROM pair WHERE id = %s"

    def guard(key: str, n: int) -> tuple[str, list[Any], Any]:
        found = recall.matching(read, (key,), {"n": n})
        assert found is not None
        return found[0], found[1], recall.GUARD

    clock = ("SELECT 7 AS now, 1 AS ok", [], recall.Guard(lambda result: None))
    for failing in (None, 0, 1, 2):
        members = [clock, guard("a", 1), guard("b", 2)]
        if failing is not None:
            members[failing] = (
                guard("a", 5) if failing else ("SELECT 7 AS now, 1 / 0 AS ok", [], members[0][2])
            )
        [(sql, params, _)] = recall.merged(members)
        try:
            rows = raw.rows(sql.replace("%s", "?"), *params)
        except Exception as exc:
            assert type(exc).__name__ == "DivisionByZero", exc
            assert failing is not None
            continue
        assert failing is None
        assert rows == [{"now": 7, "ok": 3}]


@pytest.mark.networked
def test_a_commit_leaves_no_copy_older_than_itself(
    owned: Owned, adapter: RecordingAdapter, backend: str
) -> None:
    """A transaction that makes every repeated read itself and moves the
    chain's head reads nothing again at its commit; the copy from before it
    must not outlive it, or the next transaction would decide on it and fail
    its guards (a round trip wasted, and the mission doubted)."""
    first, mission, ex = owned.first, owned.mission, owned.ex

    def both(tx: Any) -> None:
        assert runs_store.standing(tx, mission, ex.run_id) is not None
        assert runs_store.status_ahead(tx, mission, ex.run_id).row is not None
        tx.audit(mission, "run.noted", ex.run_id, actor="test")

    first._db.transact(both, gate=mission)
    attempt = ex.perform(adapter, "write", {}, effect_key="after-both")
    assert attempt.status.value == "succeeded"
    assert not _doubted(first, mission)
    assert all(v.ok for v in first.verify_audit(mission))
