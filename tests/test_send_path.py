"""The one send path, under the faults an outside review injected (A2, A4, A8, A9, F3, L5).

Each test names the rule it proves and asserts on what the target received
and what the store holds, on both stores.
"""

from __future__ import annotations

import json
import sqlite3
import threading
from collections.abc import Callable, Iterator
from contextlib import closing, contextmanager
from typing import Any

import pytest

import charter
from charter import AttemptStatus, RunStatus
from charter.adapters import Dispatch, Evidence, Outcome
from charter.clock import seconds_us
from charter.plans.lineage import EXECUTIONS_AHEAD
from charter.testing import ManualClock, RecordingAdapter, SkewedClock
from conftest import Principals, default_contract, stored

#: Every test taking ``adapter`` runs with a synchronous and an async one.
ADAPTER_KINDS = ("sync", "async")

MakeEngine = Callable[..., charter.Engine]
LEASE = 30.0


def evidence_of(engine: charter.Engine, attempt_id: str) -> list[dict[str, Any]]:
    """The attempt's evidence rows, their JSON decoded."""
    rows = engine.evidence(attempt_id)
    for r in rows:
        for name in ("outcome", "detail"):
            r[name] = None if r[name] is None else json.loads(r[name])
    return rows


def start(engine: charter.Engine, who: Principals, mission: str) -> charter.Executor:
    return engine.start_run(mission, by=who.agent, segment_id="seg-1")


@contextmanager
def write_lock_held(backend: str, store: str, mission: str) -> Iterator[None]:
    """Another worker holds what a settlement of ``mission`` must take."""
    if backend == "sqlite":
        con_ = sqlite3.connect(store, isolation_level=None, check_same_thread=False)
        with closing(con_) as con:
            con.execute("BEGIN IMMEDIATE")
            yield
            con.execute("ROLLBACK")
        return
    import psycopg

    with psycopg.connect(store, autocommit=True) as con:
        con.execute("BEGIN")
        con.execute("SELECT pg_advisory_xact_lock(hashtextextended(%s, 0))", (mission,))
        yield
        con.execute("ROLLBACK")


def never_answers(send: Dispatch) -> Outcome:
    """A target whose answer never arrives."""
    raise TimeoutError("lost")


def applied_then_busy(
    backend: str, store: str, mission: str, *, let_go_after: float | None = None
) -> tuple[Callable[[Dispatch], Outcome], list[Any]]:
    """A target that applies the effect while another worker takes the lock its
    settlement needs (and lets go after ``let_go_after`` seconds, if given); the
    script and the locks it holds, for the test to release."""
    holding: list[Any] = []

    def script(send: Dispatch) -> Outcome:
        held = write_lock_held(backend, store, mission)
        held.__enter__()
        holding.append(held)
        if let_go_after is not None:
            threading.Timer(let_go_after, held.__exit__, (None, None, None)).start()
        return Outcome.succeeded({"paid": True}, cost={"usd": 5_000, "calls": 1}, receipt="r-1")

    return script, holding


# -- A4: a settlement that cannot be committed is an uncertainty ------------------------


def test_A4_a_settlement_the_busy_store_refuses_leaves_the_attempt_unresolved(
    backend: str,
    store_address: str,
    make_engine: MakeEngine,
    who: Principals,
    adapter: RecordingAdapter,
) -> None:
    """Broken A4: the target applied the effect, the settlement commit raised
    StoreBusy, the node counted that as its own failure and its retry sent the
    effect again under a fresh attempt."""
    engine = make_engine(busy_timeout_seconds=0.5)
    who = Principals(who.credentials, who.digests, engine)
    mission = engine.create_mission(default_contract(), by=who.alice)
    # The other worker keeps the lock longer than the busy timeout, then lets go.
    adapter.script["write"], _ = applied_then_busy(
        backend, store_address, mission, let_go_after=0.8
    )

    @charter.node(retries=1)
    def pay(ctx: charter.Context, value: Any) -> Any:
        return ctx.attempt(adapter, "write", {"invoice": 1})

    ex = start(engine, who, mission)
    with pytest.raises(charter.Blocked):
        ex.execute(charter.Plan("pay", (pay,)))

    assert len(adapter.sent) == 1  # never sent again
    (attempt,) = engine.attempts(mission_id=mission)
    assert attempt.status is AttemptStatus.DISPATCHED  # unresolved, hold kept
    assert attempt.retry_of is None and attempt.generation == 1
    assert engine.balances(mission)["usd"].held == 5_000
    assert engine.run(ex.run_id).status is RunStatus.NEEDS_INTERVENTION
    assert engine.check_ledger(mission) == []


def test_A4_a_direct_caller_gets_settlement_unrecorded_and_cannot_retry_the_effect(
    backend: str,
    store_address: str,
    make_engine: MakeEngine,
    who: Principals,
    adapter: RecordingAdapter,
) -> None:
    engine = make_engine(busy_timeout_seconds=0.3)
    who = Principals(who.credentials, who.digests, engine)
    mission = engine.create_mission(default_contract(), by=who.alice)
    adapter.script["write"], holding = applied_then_busy(backend, store_address, mission)
    ex = start(engine, who, mission)
    try:
        with pytest.raises(charter.SettlementUnrecorded) as info:
            ex.perform(adapter, "write", {"invoice": 1}, effect_key="pay")
    finally:
        for held in holding:
            held.__exit__(None, None, None)
    first = info.value.details["attempt_id"]
    assert engine.get_attempt(first).status is AttemptStatus.DISPATCHED
    before = stored(engine, mission)
    for generation, retry_of in ((1, None), (2, None), (2, first)):
        with pytest.raises(charter.StateError):
            ex.perform(
                adapter,
                "write",
                {"invoice": 1},
                effect_key="pay",
                generation=generation,
                retry_of=retry_of,
            )
    assert len(adapter.sent) == 1
    assert stored(engine, mission) == before


def _broken_cost(send: Dispatch) -> Outcome:
    outcome = Outcome.succeeded({"paid": True}, cost={"usd": 5_000, "calls": 1})
    object.__setattr__(outcome, "cost", {"usd": 2**64, "calls": 1})  # past the protocol's check
    return outcome


def _out_of_range(send: Dispatch) -> Outcome:
    return Outcome.succeeded({"paid": True}, cost={"usd": 2**63, "calls": 1})


def _mixed_keys(send: Dispatch) -> Outcome:
    return Outcome.succeeded({1: "one", "two": 2}, cost={"usd": 5_000, "calls": 1})


def _not_an_outcome(send: Dispatch) -> Any:
    return {"status": "ok", "amount": 5_000}


def _nan(send: Dispatch) -> Outcome:
    return Outcome.succeeded({"rate": float("nan")}, cost={"usd": 5_000, "calls": 1})


@pytest.mark.parametrize(
    "answer",
    [_out_of_range, _broken_cost, _mixed_keys, _not_an_outcome, _nan],
    ids=["cost-2^63", "cost-2^64-forged", "mixed-key-types", "not-an-outcome", "nan"],
)
def test_A9_a_report_the_store_cannot_hold_settles_nothing_and_is_kept_as_text(
    engine: charter.Engine,
    who: Principals,
    mission: str,
    adapter: RecordingAdapter,
    answer: Callable[[Dispatch], Any],
) -> None:
    """Broken A9: an adapter's garbage raised from the settlement commit (a raw
    OverflowError or TypeError) and left the node to retry, or was dropped."""
    adapter.script["write"] = answer
    ex = start(engine, who, mission)

    attempt = ex.perform(adapter, "write", {"invoice": 1}, effect_key="pay")

    assert attempt.status is AttemptStatus.UNKNOWN
    recorded = engine.get_attempt(attempt.id)
    assert recorded.status is AttemptStatus.UNKNOWN and recorded.actual is None
    assert "cannot be recorded" in (recorded.reason or "")
    (kept,) = evidence_of(engine, attempt.id)
    assert kept["verdict"] == "indeterminate" and not kept["settled"]
    assert kept["detail"]["unrecordable_report"]  # the raw report, as text
    assert engine.balances(mission)["usd"].held == 5_000
    assert engine.balances(mission)["usd"].spent == 0
    assert engine.check_ledger(mission) == []
    assert len(adapter.sent) == 1


# -- A4: retries across node executions ---------------------------------------------------


def test_A4_a_later_generation_must_name_the_attempt_it_follows(
    engine: charter.Engine, who: Principals, mission: str, adapter: RecordingAdapter
) -> None:
    """Broken A4: the public Executor.perform accepted a later generation without
    ``retry_of``, so a caller could perform a settled effect again."""
    ex = start(engine, who, mission)
    first = ex.perform(adapter, "write", {"to": "x"}, effect_key="send")
    assert first.status is AttemptStatus.SUCCEEDED
    before = stored(engine, mission)
    with pytest.raises(charter.StateError):
        ex.perform(adapter, "write", {"to": "x"}, effect_key="send", generation=2)
    with pytest.raises(charter.AttemptAlreadySettled):
        ex.perform(
            adapter, "write", {"to": "x"}, effect_key="send", generation=2, retry_of=first.id
        )
    assert stored(engine, mission) == before
    assert len(adapter.sent) == 1


@pytest.mark.timeout(20)
def test_A4_an_execution_number_nobody_was_given_is_refused_in_process_at_once(
    engine: charter.Engine, who: Principals, mission: str, adapter: RecordingAdapter
) -> None:
    """Broken A4: ``Executor.perform(..., execution=N)`` read the effect's earlier
    tries execution by execution from N down, so N = 10**12 held the calling
    thread for ever (the HTTP path was bounded, the in-process one was not)."""
    ex = start(engine, who, mission)
    ex.perform(adapter, "write", {"to": "x"}, effect_key="k", node_id="n", execution=1)
    before = stored(engine, mission)
    with pytest.raises(charter.UsageError, match="past the newest one known") as refused:
        ex.perform(adapter, "write", {"to": "y"}, effect_key="j", node_id="n", execution=10**12)
    assert refused.value.details["most"] == 1 + EXECUTIONS_AHEAD
    assert stored(engine, mission) == before
    assert len(adapter.sent) == 1
    near = ex.perform(
        adapter, "write", {"to": "y"}, effect_key="j", node_id="n", execution=1 + EXECUTIONS_AHEAD
    )
    assert near.status is AttemptStatus.SUCCEEDED  # within the bound, as before


def test_A4_no_admission_while_an_earlier_execution_left_the_effect_unresolved(
    engine: charter.Engine, who: Principals, mission: str, adapter: RecordingAdapter
) -> None:
    """Broken A4: the unresolved check looked at the current node execution only, so
    a new execution admitted an effect whose earlier attempt was UNKNOWN."""
    adapter.script["write"] = never_answers
    ex = start(engine, who, mission)
    lost = ex.perform(adapter, "write", {"to": "x"}, effect_key="k", node_id="n", execution=1)
    assert lost.status is AttemptStatus.UNKNOWN
    before = stored(engine, mission)
    for retry_of in (None, lost.id):
        with pytest.raises(charter.StateError):
            ex.perform(
                adapter,
                "write",
                {"to": "x"},
                effect_key="k",
                node_id="n",
                execution=2,
                retry_of=retry_of,
            )
    assert stored(engine, mission) == before
    assert len(adapter.sent) == 1


def test_A4_a_new_node_execution_replays_a_settled_unsafe_effect_and_reruns_a_read(
    engine: charter.Engine, who: Principals, mission: str, adapter: RecordingAdapter
) -> None:
    calls: list[int] = []

    @charter.node(retries=1)
    def work(ctx: charter.Context, value: Any) -> Any:
        calls.append(ctx.execution)
        found = ctx.attempt(adapter, "read", {"q": "invoices"})
        paid = ctx.attempt(adapter, "write", {"invoice": 1})
        if ctx.execution == 1:
            raise RuntimeError("a bug after paying")
        return {"found": found, "paid": paid}

    ex = start(engine, who, mission)
    ex.execute(charter.Plan("work", (work,)))

    assert calls == [1, 2]
    assert [s.operation for s in adapter.sent] == ["read", "write", "read"]
    by_execution = sorted(
        (a.execution, a.operation, a.status, a.retry_of is not None)
        for a in engine.attempts(run_id=ex.run_id)
    )
    assert by_execution == [
        (1, "read", AttemptStatus.SUCCEEDED, False),
        (1, "write", AttemptStatus.SUCCEEDED, False),
        (2, "read", AttemptStatus.SUCCEEDED, True),
    ]


def test_A4_a_changed_request_for_a_settled_effect_in_a_new_execution_needs_a_person(
    engine: charter.Engine, who: Principals, mission: str, adapter: RecordingAdapter
) -> None:
    """A node retry that asks for a settled payment with another request is not
    allowed to guess whether it is the same payment: the run needs a person."""

    @charter.node(retries=1)
    def work(ctx: charter.Context, value: Any) -> Any:
        ctx.attempt(adapter, "write", {"invoice": 1, "try": ctx.execution})
        if ctx.execution == 1:
            raise RuntimeError("a bug after paying")
        return "done"

    ex = start(engine, who, mission)
    with pytest.raises(charter.NonDeterminismError):
        ex.execute(charter.Plan("work", (work,)))
    assert len(adapter.sent) == 1
    assert engine.run(ex.run_id).status is RunStatus.NEEDS_INTERVENTION


# -- A8: a replay is a send through the one path -----------------------------------------


def _recovered_unknown(
    engine: charter.Engine, who: Principals, mission: str, adapter: RecordingAdapter, clock: Any
) -> charter.Attempt:
    adapter.script["charge"] = never_answers
    ex = start(engine, who, mission)
    lost = ex.perform(adapter, "charge", {"amount": 1}, effect_key="c")
    clock.advance(LEASE + 1)
    engine.coordinator.recover(ex.run_id, "seg-2")
    del adapter.script["charge"]
    return lost


def test_A8_a_replay_never_sends_an_attempt_a_person_settled_meanwhile(
    engine: charter.Engine,
    who: Principals,
    mission: str,
    adapter: RecordingAdapter,
    clock: ManualClock,
) -> None:
    """Broken A8: the replay's transaction checked epoch, lease and window but not
    that the attempt was still unresolved: a person resolved it during the lookup
    and the replay sent it anyway."""
    lost = _recovered_unknown(engine, who, mission, adapter, clock)

    def lookup_while_a_person_resolves(attempt: charter.Attempt) -> Evidence:
        engine.coordinator.resolve(
            attempt.id, by=who.alice, outcome="failed", evidence="the bank says: never arrived"
        )
        return Evidence.indeterminate({"lookup": "nothing found"})

    adapter.reconcile = lookup_while_a_person_resolves  # type: ignore[method-assign]
    with pytest.raises(charter.AttemptAlreadySettled):
        engine.coordinator.reconcile(lost.id, adapter, segment_id="seg-2")

    assert [s.attempt_id for s in adapter.sent] == [lost.id]  # the first send only
    assert engine.get_attempt(lost.id).status is AttemptStatus.FAILED
    kept = [e["detail"] for e in evidence_of(engine, lost.id)]
    assert {"lookup": "nothing found"} in kept  # what the lookup found is kept


def test_A8_what_a_replay_reports_after_a_settlement_is_kept_and_a_contradiction_opens_an_incident(
    engine: charter.Engine,
    who: Principals,
    mission: str,
    adapter: RecordingAdapter,
    clock: ManualClock,
) -> None:
    """Broken A8: the replay's "applied" was dropped because a person had settled the
    attempt as not applied while the replay was on the wire."""
    lost = _recovered_unknown(engine, who, mission, adapter, clock)
    adapter.evidence[lost.id] = Evidence.indeterminate({"lookup": "nothing"})

    def applied_while_a_person_says_failed(send: Dispatch) -> Outcome:
        engine.coordinator.resolve(
            send.attempt_id, by=who.alice, outcome="failed", evidence="looked lost"
        )
        return Outcome.succeeded({"charged": 1}, cost={"usd": 20_000, "calls": 1}, receipt="ch_1")

    adapter.script["charge"] = applied_while_a_person_says_failed
    with pytest.raises(charter.AttemptAlreadySettled):
        engine.coordinator.reconcile(lost.id, adapter, segment_id="seg-2")

    assert len(adapter.sent) == 2  # the first send and the one replay
    # a person's settlement stands
    assert engine.get_attempt(lost.id).status is AttemptStatus.FAILED
    replayed = [e for e in evidence_of(engine, lost.id) if e["source"] == "same-key replay"]
    assert [e["verdict"] for e in replayed] == ["applied"]
    (incident,) = engine.incidents(mission, open_only=True)
    assert incident["kind"] == "conflicting_evidence"
    assert incident["attempt_id"] == lost.id


@pytest.mark.parametrize("status", ["stopping", "paused"])
def test_A8_a_replay_is_not_sent_for_a_run_that_may_not_send(
    engine: charter.Engine,
    who: Principals,
    mission: str,
    adapter: RecordingAdapter,
    clock: ManualClock,
    status: str,
) -> None:
    """Confirmed: a replay ignored the run's status, so a stopping or paused run
    could still send. A replay can perform the effect for the first time."""
    lost = _recovered_unknown(engine, who, mission, adapter, clock)
    adapter.evidence[lost.id] = Evidence.indeterminate({"lookup": "nothing"})
    if status == "stopping":
        engine.stop_run(lost.run_id, by=who.alice)
    else:
        with engine._db.transaction(gate=mission) as tx:
            tx.run("UPDATE runs SET status = 'paused' WHERE id = ?", lost.run_id)
    assert engine.run(lost.run_id).status.value == status

    evidence = engine.coordinator.reconcile(lost.id, adapter, segment_id="seg-2")

    assert evidence.verdict == "indeterminate"
    assert [s.attempt_id for s in adapter.sent] == [lost.id]
    assert engine.get_attempt(lost.id).status is AttemptStatus.UNKNOWN


# -- F3: deadlines on the sending process's monotonic clock --------------------------------


@pytest.mark.parametrize("skew", [-20.0, 20.0], ids=["worker-behind", "worker-ahead"])
def test_F3_a_worker_with_a_skewed_clock_never_sends_after_its_lease(
    make_engine: MakeEngine,
    who: Principals,
    adapter: RecordingAdapter,
    clock: ManualClock,
    skew: float,
) -> None:
    """Broken F3: the deadline was set by the store's clock and checked against the
    worker's wall clock; a worker 20 s behind sent after its lease had expired and
    another owner had recovered the run."""
    worker = make_engine(process_clock=SkewedClock(clock, skew), lease_seconds=LEASE)
    other = make_engine(process_clock=clock, lease_seconds=LEASE)
    who = Principals(who.credentials, who.digests, worker)
    mission = worker.create_mission(default_contract(), by=who.alice)
    ex = worker.start_run(mission, by=who.agent, segment_id="seg-1")
    assert ex.perform(adapter, "write", {"n": 1}, effect_key="on-time").status is (
        AttemptStatus.SUCCEEDED
    )

    delivered: list[Any] = []

    def stalled(send: Dispatch) -> Outcome:
        # The worker stalls past its lease; another owner recovers the run.
        clock.advance(LEASE + 1)
        other.coordinator.recover(send.run_id, "seg-2")
        send.check_deadline()  # right before the bytes would go out
        delivered.append(send.request)
        return Outcome.succeeded()

    adapter.script["write"] = stalled
    late = ex.perform(adapter, "write", {"n": 2}, effect_key="late")

    assert delivered == []
    assert engine_status(other, late.id) in (AttemptStatus.FAILED, AttemptStatus.UNKNOWN)
    assert (other.run(ex.run_id).epoch, other.run(ex.run_id).owner_segment) == (2, "seg-2")


def engine_status(engine: charter.Engine, attempt_id: str) -> AttemptStatus:
    return engine.get_attempt(attempt_id).status


@pytest.mark.parametrize("skew", [-20.0, 20.0], ids=["worker-behind", "worker-ahead"])
def test_F3_the_engine_checks_the_deadline_itself_before_calling_the_adapter(
    store_address: str,
    creds: tuple[dict[str, str], dict[str, str]],
    who: Principals,
    clock: ManualClock,
    skew: float,
) -> None:
    """An adapter that forgets ``check_deadline`` is still never called late."""
    stall: list[float] = []

    def hook(point: str) -> None:
        if point == "dispatch.after" and stall:
            clock.advance(stall.pop())

    config = charter.EngineConfig(credentials=creds[1], lease_seconds=LEASE)
    with charter.Engine.open(
        store_address,
        config=config,
        clock=SkewedClock(clock, skew),
        store_clock=clock,
        crash_hook=hook,
    ) as engine:
        people = {n: engine.authenticate(c) for n, c in creds[0].items()}
        mission = engine.create_mission(default_contract(), by=people["alice"])
        called: list[Dispatch] = []
        careless = RecordingAdapter()
        careless.dispatch = lambda send: called.append(send) or Outcome.succeeded()  # type: ignore[method-assign]
        ex = engine.start_run(mission, by=people["agent"], segment_id="seg-1")
        stall.append(LEASE + 1)
        # Unsent, the effect is tried again (A4); past its lease the executor is fenced.
        with pytest.raises(charter.Fenced):
            ex.perform(careless, "write", {"n": 1}, effect_key="late")
        assert called == []
        [late] = engine.attempts(run_id=ex.run_id)
        assert late.status is AttemptStatus.FAILED
        assert "deadline" in (late.reason or "")
        (proof,) = engine.evidence(late.id)
        assert proof["verdict"] == "not_applied"


def test_A4_F3_an_effect_left_unsent_past_its_deadline_is_tried_again_within_the_lease(
    store_address: str,
    creds: tuple[dict[str, str], dict[str, str]],
    clock: ManualClock,
) -> None:
    """Found by pausing a worker after each commit: paused past its send deadline
    (not its lease), it recorded its own refusal to send as the target's answer,
    and the node failed though nothing had been sent. A4: an effect settled as not
    applied is tried again as a new attempt, under the operation's retry policy."""
    stall: list[float] = []

    def hook(point: str) -> None:
        if point == "dispatch.after" and stall:
            clock.advance(stall.pop())

    config = charter.EngineConfig(
        credentials=creds[1], lease_seconds=LEASE, send_deadline_seconds=LEASE / 3
    )
    with charter.Engine.open(store_address, config=config, clock=clock, crash_hook=hook) as engine:
        people = {n: engine.authenticate(c) for n, c in creds[0].items()}
        mission = engine.create_mission(default_contract(), by=people["alice"])
        target = RecordingAdapter()
        ex = engine.start_run(mission, by=people["agent"], segment_id="seg-1")
        stall.append(LEASE / 2)  # past the send deadline, within the lease
        done = ex.perform(target, "write", {"n": 1}, effect_key="paused")

        assert done.status is AttemptStatus.SUCCEEDED
        [first, second] = sorted(engine.attempts(run_id=ex.run_id), key=lambda a: a.generation)
        assert (first.status, first.answered) == (AttemptStatus.FAILED, False)
        assert (second.id, second.retry_of, second.generation) == (done.id, first.id, 2)
        assert [s.attempt_id for s in target.sent] == [second.id]
        assert engine.balances(mission)["calls"].spent == 1
        assert engine.check_ledger(mission) == []


def test_A4_F3_a_node_whose_sends_the_engine_kept_refusing_as_late_is_told_why(
    store_address: str,
    creds: tuple[dict[str, str], dict[str, str]],
    clock: ManualClock,
) -> None:
    """Broken: a process too slow for its send deadline has every try refused as
    late; once the retry policy is spent the node sees ``AttemptFailed`` saying
    only "settled failed", as if the target had refused a payment it never
    received. The failure names its generation and the engine's own reason."""

    def hook(point: str) -> None:
        if point == "dispatch.after":
            clock.advance(LEASE / 2)  # every try: past the send deadline

    config = charter.EngineConfig(
        credentials=creds[1], lease_seconds=LEASE * 10, send_deadline_seconds=LEASE / 3
    )
    with charter.Engine.open(store_address, config=config, clock=clock, crash_hook=hook) as engine:
        people = {n: engine.authenticate(c) for n, c in creds[0].items()}
        mission = engine.create_mission(default_contract(), by=people["alice"])
        target = RecordingAdapter()
        retries = target.operations["write"].retries

        @charter.node
        def pay(ctx: charter.Context, _: Any) -> Any:
            return ctx.attempt(target, "write", {"n": 1}, key="pay")

        plan = charter.Plan("slow", (pay,))
        ex = engine.start_run(mission, by=people["agent"], segment_id="seg-1", plan=plan)
        with pytest.raises(charter.AttemptFailed) as failed:
            ex.execute(plan)

        tries = sorted(engine.attempts(run_id=ex.run_id), key=lambda a: a.generation)
        assert [a.status for a in tries] == [AttemptStatus.FAILED] * (retries + 1)
        assert target.sent == []  # not one byte went out
        assert f"generation {retries + 1} settled failed" in failed.value.message
        assert "send deadline passed before the engine called the adapter" in failed.value.message
        assert failed.value.details["reason"] == tries[-1].reason
        assert engine.balances(mission)["calls"].spent == 0


def test_F1_recover_sets_the_lease_by_the_store_clock_not_the_process_clock(
    make_engine: MakeEngine, who: Principals, clock: ManualClock
) -> None:
    """Broken F1 (hidden while every test's clocks agreed): a lease taken by a
    worker whose clock is off must still end at store time + lease."""
    first = make_engine(lease_seconds=LEASE)
    who = Principals(who.credentials, who.digests, first)
    mission = first.create_mission(default_contract(), by=who.alice)
    ex = first.start_run(mission, by=who.agent, segment_id="seg-1")
    clock.advance(LEASE + 1)
    for skew, segment in ((-20.0, "seg-2"), (20.0, "seg-3")):
        worker = make_engine(process_clock=SkewedClock(clock, skew), lease_seconds=LEASE)
        worker.coordinator.recover(
            ex.run_id, segment, force=True, by=worker.authenticate(who.credentials["alice"])
        )
        assert worker.run(ex.run_id).lease_expires_us == clock.now_us() + seconds_us(LEASE)


# -- L5 / F2: a late result above the hold of a written-off attempt ----------------------


def test_L5_a_late_result_above_the_hold_after_a_write_off_opens_an_incident_and_pauses(
    engine: charter.Engine,
    who: Principals,
    adapter: RecordingAdapter,
    clock: ManualClock,
) -> None:
    """Broken L5/F2: 400,000 reported against a 100,000 hold after a person wrote the
    attempt off: no incident, spent stayed at the hold, the next admission passed."""
    mission = engine.create_mission(default_contract(allowance={"usd": 1_000_000}), by=who.alice)
    adapter.costs = {"write": {"usd": 100_000}}
    ex = start(engine, who, mission)

    def slow(send: Dispatch) -> Outcome:
        # While the target works, the owner is presumed dead and a person writes it off.
        clock.advance(LEASE + 1)
        engine.coordinator.recover(send.run_id, "seg-2")
        engine.coordinator.resolve(
            send.attempt_id, by=who.alice, outcome="written_off", evidence="owner died"
        )
        return Outcome.succeeded({"ok": True}, cost={"usd": 400_000}, receipt={"billed": 400_000})

    adapter.script["write"] = slow
    attempt = ex.perform(adapter, "write", {"job": 1}, effect_key="job")

    assert engine.get_attempt(attempt.id).status is AttemptStatus.WRITTEN_OFF
    late = [e for e in evidence_of(engine, attempt.id) if e["source"].startswith("late")]
    assert [e["outcome"]["cost"] for e in late] == [{"usd": 400_000}]  # kept as evidence
    (incident,) = engine.incidents(mission, open_only=True)
    assert incident["attempt_id"] == attempt.id
    assert engine.balances(mission)["usd"].spent == 100_000  # nothing edited (L5)
    assert engine.check_ledger(mission) == []
    # L7: while the incident is open, the run goes no further.
    with pytest.raises(charter.NeedsIntervention, match="open incident"):
        engine.coordinator.resume(ex.run_id, "seg-2", by=who.agent)


# -- the record is the request ---------------------------------------------------------------


@pytest.mark.parametrize(
    "request_", [{1: "x"}, {"a": [{2.5: "y"}]}, {"a": {None: 1}}], ids=["int", "float", "none"]
)
def test_A6_a_request_with_a_key_that_is_not_a_string_is_refused_and_changes_nothing(
    engine: charter.Engine,
    who: Principals,
    mission: str,
    adapter: RecordingAdapter,
    request_: Any,
) -> None:
    """Confirmed: ``{1: x}`` and ``{"1": x}`` had the same request hash, and a send
    rebuilt from the record carried ``"1"`` where the first carried ``1``."""
    ex = start(engine, who, mission)
    before = stored(engine, mission)
    with pytest.raises(charter.AdmissionRefused, match="not a string"):
        ex.perform(adapter, "write", request_, effect_key="k")
    assert stored(engine, mission) == before
    assert adapter.sent == []


def test_F2_a_fenced_executor_writes_nothing_off(
    engine: charter.Engine,
    who: Principals,
    adapter: RecordingAdapter,
    clock: ManualClock,
) -> None:
    """Confirmed: the A7 read-only write-off ran without the ownership check, so an
    executor that had lost the run still settled its attempt and retried it. The
    recovery that took the run over writes the read off itself (A7 holds where
    recovery makes an attempt UNKNOWN): the fenced executor settles nothing and
    retries nothing: asking for the read again is its next write, and it is
    fenced there, within the same call."""
    mission = engine.create_mission(default_contract(read_only_unknown="write_off"), by=who.alice)
    ex = start(engine, who, mission)

    def lost_while_taken_over(send: Dispatch) -> Outcome:
        clock.advance(LEASE + 1)
        engine.coordinator.recover(send.run_id, "seg-2")
        raise TimeoutError("no answer")

    adapter.script["read"] = lost_while_taken_over
    with pytest.raises(charter.Fenced):
        ex.perform(adapter, "read", {"q": 1}, effect_key="q")
    (attempt,) = engine.attempts(mission_id=mission)
    assert attempt.status is AttemptStatus.WRITTEN_OFF
    [settled] = [e for e in engine.audit_events(mission) if e["kind"] == "attempt.settled"]
    assert (settled["actor"], settled["segment"], settled["epoch"]) == (
        "engine:read_only_policy",
        "seg-2",
        2,
    )
    assert len(adapter.sent) == 1
    with pytest.raises(charter.Fenced):
        ex.perform(adapter, "read", {"q": 2}, effect_key="q2")
    assert len(adapter.sent) == 1


def test_A8_a_replay_is_sent_under_the_run_principals_current_authority(
    engine: charter.Engine,
    who: Principals,
    mission: str,
    adapter: RecordingAdapter,
    clock: ManualClock,
) -> None:
    """Decided: reconcile needs no principal of its own to look up, but its replay
    is a send made as the run's owner, so it needs that principal's ``run`` right
    under the current contract; revoked, nothing is sent and a person decides."""
    lost = _recovered_unknown(engine, who, mission, adapter, clock)
    adapter.evidence[lost.id] = Evidence.indeterminate({"lookup": "nothing"})
    revoked = default_contract()
    revoked["principals"] = {**revoked["principals"], "agent": {"run": ["recorder.read"]}}
    engine.amend_contract(mission, revoked, by=who.alice, reason="agent may only read now")

    evidence = engine.coordinator.reconcile(lost.id, adapter, segment_id="seg-2")

    assert evidence.verdict == "indeterminate"
    assert [s.attempt_id for s in adapter.sent] == [lost.id]  # no replay
    assert engine.get_attempt(lost.id).status is AttemptStatus.UNKNOWN
    kinds = [e["kind"] for e in engine.audit_events(mission)]
    assert "attempt.replayed" not in kinds and "evidence.recorded" in kinds
