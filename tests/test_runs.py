"""Run states (N4, N5) and the owner's hold on node state (F2), on a real store
of each backend.

A stop is a request to end the run once what was sent has settled: new
admissions are refused at once, in-flight attempts settle (by their owner,
by evidence or by a person) and the run then ends STOPPED, whoever settled
the last one. An admission refused because the run left ``active`` (paused
by an exhausted allowance, stopping, stopped) is not a failure of the node
that asked: the node waits, and the run keeps the status its people decide on.
"""

from __future__ import annotations

import json
import signal
import subprocess
import sys
from collections import Counter
from typing import Any

import pytest

import charter
from charter import AttemptStatus, RunStatus
from charter.adapters import Dispatch, Outcome
from charter.clock import MICROS, SystemClock
from charter.testing import RecordingAdapter
from charter.waits.approvals import ApprovalStatus
from conftest import Principals, default_contract, stored


def run_events(engine: charter.Engine, mission: str, run_id: str) -> list[tuple[str, str, str]]:
    """The run's status changes, as the audit chain recorded them."""
    return [
        (e["before"], e["after"], e["actor"])
        for e in engine.audit_events(mission)
        if e["kind"] == "run.status" and e["entity"] == run_id
    ]


def node_statuses(engine: charter.Engine, run_id: str) -> list[tuple[str, int, str]]:
    state = engine.coordinator.state(run_id)
    return [(n["node_id"], n["execution"], n["status"]) for n in state.nodes]


def held(engine: charter.Engine, mission: str) -> dict[str, int]:
    return {u: b.held for u, b in engine.balances(mission).items()}


def three_writes(adapter: RecordingAdapter, *, retries: int = 2) -> charter.Plan:
    """One node making three journaled writes, retried on failure, then a second node."""

    @charter.node(retries=retries)
    def write(ctx: charter.Context, value: Any) -> int:
        for n in range(3):
            ctx.attempt(adapter, "write", {"n": n})
        return 3

    @charter.node
    def after(ctx: charter.Context, value: Any) -> int:
        return int(value) + 1

    return charter.Plan("three-writes", (write, after))


# -- N5: stopping ends stopped -------------------------------------------------------------


def test_N5_a_run_stopped_mid_node_ends_stopped_once_its_in_flight_attempt_settles(
    engine: charter.Engine, who: Principals, mission: str, adapter: RecordingAdapter
) -> None:
    """Breaking N5 looks like a stopped run staying ``stopping`` after its last
    attempt settled, its node being retried against refusals, or the run ending
    ``failed`` instead of ``stopped``."""
    ex = engine.start_run(mission, by=who.agent, segment_id="seg-1")

    def stop_while_sending(send: Dispatch) -> Outcome:
        # The operator stops the run while this attempt is in flight.
        assert engine.stop_run(ex.run_id, by=who.alice).status is RunStatus.STOPPING
        return Outcome.succeeded({"ok": True}, cost={"usd": 4_000, "calls": 1})

    adapter.script["write"] = stop_while_sending
    with pytest.raises(charter.Blocked) as blocked:
        ex.execute(three_writes(adapter))

    assert "stopped" in blocked.value.reason
    run = engine.run(ex.run_id)
    assert (run.status, run.status_reason) == (RunStatus.STOPPED, "stopped")
    assert run_events(engine, mission, ex.run_id) == [
        ("active", "stopping", "alice"),
        ("stopping", "stopped", "agent"),  # the owner settled the last attempt
    ]
    [attempt] = engine.attempts(run_id=ex.run_id)
    assert (attempt.status, attempt.actual) == (AttemptStatus.SUCCEEDED, {"usd": 4_000, "calls": 1})
    assert [s.request for s in adapter.sent] == [{"n": 0}]
    assert node_statuses(engine, ex.run_id) == [("write", 1, "blocked")]
    assert held(engine, mission) == {"usd": 0, "calls": 0}
    assert engine.check_ledger(mission) == []
    with pytest.raises(charter.RunTerminal):
        engine.coordinator.resume(ex.run_id, "seg-2", by=who.agent)


def test_N5_a_stopping_run_ends_stopped_when_a_person_resolves_its_last_unknown_attempt(
    engine: charter.Engine, who: Principals, mission: str, adapter: RecordingAdapter
) -> None:
    """Breaking N5 looks like a run left ``stopping`` forever once nothing is in
    flight, or ended while an attempt is still unresolved."""

    def lost(send: Dispatch) -> Outcome:
        raise TimeoutError(f"no answer for {send.attempt_id}")

    adapter.script["write"] = lost
    ex = engine.start_run(mission, by=who.agent, segment_id="seg-1")
    first = ex.perform(adapter, "write", {"n": 1}, effect_key="first")
    second = ex.perform(adapter, "write", {"n": 2}, effect_key="second")
    assert {first.status, second.status} == {AttemptStatus.UNKNOWN}
    assert engine.stop_run(ex.run_id, by=who.alice, reason="operator").status is (
        RunStatus.STOPPING
    )

    engine.coordinator.resolve(
        first.id, by=who.alice, outcome="succeeded", evidence="dashboard", cost={"usd": 5_000}
    )
    assert engine.run(ex.run_id).status is RunStatus.STOPPING  # the second is in flight
    assert held(engine, mission) == {"usd": 5_000, "calls": 1}

    engine.coordinator.resolve(second.id, by=who.alice, outcome="written_off", evidence="unknown")
    run = engine.run(ex.run_id)
    assert (run.status, run.status_reason) == (RunStatus.STOPPED, "operator")
    assert run_events(engine, mission, ex.run_id) == [
        ("active", "stopping", "alice"),
        ("stopping", "stopped", "alice"),
    ]
    assert held(engine, mission) == {"usd": 0, "calls": 0}
    assert engine.check_ledger(mission) == []
    assert len(adapter.sent) == 2


def test_N5_a_stop_condition_with_nothing_in_flight_stops_the_run_at_once(
    engine: charter.Engine, who: Principals, adapter: RecordingAdapter
) -> None:
    """Breaking N5 looks like a stop condition leaving the run ``stopping`` with
    nothing left to settle, or admitting the call that met it."""
    mission = engine.create_mission(
        default_contract(stop_conditions={"max_attempts": 1}), by=who.alice
    )
    ex = engine.start_run(mission, by=who.agent, segment_id="seg-1")
    ex.perform(adapter, "write", {"n": 1}, effect_key="one")
    before = stored(engine, mission, runs=False)

    with pytest.raises(charter.AdmissionRefused) as refused:
        ex.perform(adapter, "write", {"n": 2}, effect_key="two")

    assert refused.value.details["stop_condition"]
    run = engine.run(ex.run_id)
    assert run.status is RunStatus.STOPPED
    assert run_events(engine, mission, ex.run_id) == [
        ("active", "stopping", "agent"),
        ("stopping", "stopped", "agent"),
    ]
    assert stored(engine, mission, runs=False) == before
    assert len(adapter.sent) == 1


# -- N5 and L7: a paused run waits for its people ------------------------------------------


def test_N5_exhausted_allowance_mid_node_pauses_the_run_and_a_raised_limit_lets_it_finish(
    engine: charter.Engine, who: Principals, adapter: RecordingAdapter
) -> None:
    """Breaking N5 (and L7) looks like the node being retried against the refusal
    and the run ending ``failed``, which takes the raise-or-stop decision away."""
    mission = engine.create_mission(
        default_contract(allowance={"usd": 1_000_000, "calls": 2}), by=who.alice
    )
    plan = three_writes(adapter)
    ex = engine.start_run(mission, by=who.agent, segment_id="seg-1")

    with pytest.raises(charter.Blocked):
        ex.execute(plan)

    assert engine.run(ex.run_id).status is RunStatus.PAUSED
    assert node_statuses(engine, ex.run_id) == [("write", 1, "blocked")]
    assert [s.request for s in adapter.sent] == [{"n": 0}, {"n": 1}]

    engine.raise_limit(mission, "calls", 3, by=who.alice)
    assert engine.run(ex.run_id).status is RunStatus.ACTIVE
    assert ex.execute(plan) == 4

    assert engine.run(ex.run_id).status is RunStatus.COMPLETED
    # The node ran again as the same execution: its settled writes replayed.
    assert [s.request for s in adapter.sent] == [{"n": 0}, {"n": 1}, {"n": 2}]
    assert sorted(node_statuses(engine, ex.run_id)) == [
        ("after", 1, "completed"),
        ("write", 1, "completed"),
    ]
    assert engine.check_ledger(mission) == []


# -- N4: a terminal run is never reopened ----------------------------------------------------


def end(engine: charter.Engine, who: Principals, ex: charter.Executor, status: RunStatus) -> None:
    if status is RunStatus.STOPPED:
        engine.stop_run(ex.run_id, by=who.alice)
    else:
        ex.finish(status)


@pytest.mark.parametrize(
    "status", [RunStatus.COMPLETED, RunStatus.FAILED, RunStatus.CANCELLED, RunStatus.STOPPED]
)
def test_N4_a_terminal_run_is_never_reopened(
    engine: charter.Engine,
    who: Principals,
    mission: str,
    adapter: RecordingAdapter,
    status: RunStatus,
) -> None:
    """Breaking N4 looks like any way back into a terminal run: ending it again
    with another status, stopping it, resuming it, or admitting a new attempt."""
    ex = engine.start_run(mission, by=who.agent, segment_id="seg-1")
    ex.perform(adapter, "write", {"n": 1}, effect_key="one")
    end(engine, who, ex, status)
    before = stored(engine, mission)

    for other in (RunStatus.COMPLETED, RunStatus.FAILED):
        with pytest.raises(charter.RunTerminal):
            ex.finish(other)
    with pytest.raises(charter.RunTerminal):
        engine.stop_run(ex.run_id, by=who.alice)
    with pytest.raises(charter.RunTerminal):
        engine.coordinator.resume(ex.run_id, "seg-2", by=who.agent)
    with pytest.raises(charter.AdmissionRefused) as refused:
        ex.perform(adapter, "write", {"n": 2}, effect_key="two")

    assert refused.value.details["run_status"] == status.value
    assert stored(engine, mission) == before
    assert engine.run(ex.run_id).status is status
    assert len(adapter.sent) == 1


# -- F2: a fenced owner changes no node execution ---------------------------------------------


@pytest.mark.parametrize("ending", ["completes", "raises"])
def test_F2_a_node_that_ends_after_a_takeover_changes_nothing(
    make_engine: Any, creds: Any, clock: Any, ending: str
) -> None:
    """Breaking F2 looks like the old owner, fenced by a recovery while its node
    ran, still recording the node completed or failed (and auditing it with its
    stale epoch) under the new owner's feet."""
    engine = make_engine()
    other = make_engine()
    who = Principals(creds[0], creds[1], engine)
    mission = engine.create_mission(default_contract(), by=who.alice)
    ex = engine.start_run(mission, by=who.agent, segment_id="seg-1")

    @charter.node(retries=2)
    def slow(ctx: charter.Context, value: Any) -> int:
        clock.advance(31)  # the owner stalls past its lease; somebody recovers the run
        other.coordinator.recover(ex.run_id, "seg-2")
        if ending == "raises":
            raise RuntimeError("the node's own bug")
        return 1

    with pytest.raises(charter.Fenced):
        ex.execute(charter.Plan("slow", (slow,)))

    run = engine.run(ex.run_id)
    assert (run.status, run.epoch, run.owner_segment) == (RunStatus.ACTIVE, 2, "seg-2")
    assert node_statuses(engine, ex.run_id) == [("slow", 1, "running")]
    stale = [
        e["kind"]
        for e in engine.audit_events(mission)
        if e["kind"].startswith("node.") and e["epoch"] == 1
    ]
    assert stale == ["node.started"]


def test_F2_a_fenced_owner_journals_no_value(make_engine: Any, creds: Any, clock: Any) -> None:
    """Breaking F2 looks like an old owner, fenced while its node ran, recording a
    journaled value that the new owner's replay of the same execution then reads."""
    engine = make_engine()
    other = make_engine()
    who = Principals(creds[0], creds[1], engine)
    mission = engine.create_mission(default_contract(), by=who.alice)
    ex = engine.start_run(mission, by=who.agent, segment_id="seg-1")
    values: list[str] = []

    @charter.node
    def stalls(ctx: charter.Context, value: Any) -> str:
        if not values and ctx.epoch == 1:
            clock.advance(31)  # the owner stalls past its lease and is recovered
            other.coordinator.recover(ex.run_id, "seg-2")
        values.append(ctx.uuid())
        return values[-1]

    with pytest.raises(charter.Fenced):
        ex.execute(charter.Plan("stalls", (stalls,)))
    assert values == []  # the fenced owner got no value to act on
    new_owner = other.coordinator.resume(
        ex.run_id, "seg-2", by=Principals(creds[0], creds[1], other).agent
    )

    assert new_owner.execute(charter.Plan("stalls", (stalls,))) == values[0]
    assert len(values) == 1
    assert engine.run(ex.run_id).status is RunStatus.COMPLETED


def test_N5_a_node_cannot_swallow_the_pause_and_complete_the_run(
    engine: charter.Engine, who: Principals, adapter: RecordingAdapter
) -> None:
    """Breaking N5 looks like a node that catches every exception around its call
    carrying on, and the run its people must decide on ending ``completed``."""
    mission = engine.create_mission(
        default_contract(allowance={"usd": 1_000_000, "calls": 1}), by=who.alice
    )

    @charter.node
    def careless(ctx: charter.Context, value: Any) -> str:
        for n in range(2):
            try:
                ctx.attempt(adapter, "write", {"n": n})
            except Exception:  # the careless node under test
                return "fallback"
        return "sent"

    ex = engine.start_run(mission, by=who.agent, segment_id="seg-1")
    with pytest.raises(charter.Blocked):
        ex.execute(charter.Plan("careless", (careless,)))

    assert engine.run(ex.run_id).status is RunStatus.PAUSED
    assert node_statuses(engine, ex.run_id) == [("careless", 1, "blocked")]
    assert [s.request for s in adapter.sent] == [{"n": 0}]


# -- N4: a reviewed new linked run ------------------------------------------------------------


def two_nodes(adapter: RecordingAdapter, broken: dict[str, bool]) -> charter.Plan:
    """``first`` sends; ``second`` sends (with a journaled stamp), then declares
    its step failed while ``broken`` says so (only a declared failure ends a run,
    N6: a bug leaves it resumable), then reads."""

    @charter.node
    def first(ctx: charter.Context, value: Any) -> int:
        ctx.attempt(adapter, "write", {"step": "first"})
        return 1

    @charter.node
    def second(ctx: charter.Context, value: Any) -> int:
        stamp = ctx.uuid()
        ctx.attempt(adapter, "write", {"step": "second", "stamp": stamp, "to": broken["to"]})
        if broken["bug"]:
            raise charter.NodeFailed("the step failed after the send")
        ctx.attempt(adapter, "read", {"step": "after"})
        return int(value) + 1

    return charter.Plan("two", (first, second))


def test_N4_a_linked_run_carries_on_and_performs_nothing_settled_again(
    engine: charter.Engine, who: Principals, mission: str, adapter: RecordingAdapter
) -> None:
    """Breaking N4 looks like the follow-up of a failed run sending again what the
    failed run had sent and settled, or the failed run being reopened."""
    broken = {"bug": True, "to": "x"}
    plan = two_nodes(adapter, broken)
    ex = engine.start_run(mission, by=who.agent, segment_id="seg-1")
    with pytest.raises(charter.NodeFailed):
        ex.execute(plan)
    assert engine.run(ex.run_id).status is RunStatus.FAILED
    old = stored(engine, mission)["runs"]

    broken["bug"] = False  # the reviewed fix
    linked = engine.new_linked_run(ex.run_id, reviewed_by=who.alice, segment_id="seg-1")
    assert linked.execute(plan) == 2

    assert [s.request["step"] for s in adapter.sent] == ["first", "second", "after"]
    run = engine.run(linked.run_id)
    assert (run.status, run.linked_from, run.principal) == (
        RunStatus.COMPLETED,
        ex.run_id,
        "agent",
    )
    assert [r for r in stored(engine, mission)["runs"] if r["id"] == ex.run_id] == old
    per_run = Counter(a.run_id for a in engine.attempts(mission_id=mission))
    assert per_run == {ex.run_id: 2, linked.run_id: 1}
    [linking] = [e for e in engine.audit_events(mission) if e["kind"] == "run.linked"]
    assert (linking["entity"], linking["actor"]) == (linked.run_id, "alice")
    assert engine.check_ledger(mission) == []


def test_N4_a_linked_run_that_changes_a_settled_request_needs_intervention(
    engine: charter.Engine, who: Principals, mission: str, adapter: RecordingAdapter
) -> None:
    """Breaking N4 looks like a follow-up run sending a settled effect again because
    its request changed (to another recipient, say), instead of stopping for a person."""
    broken = {"bug": True, "to": "x"}
    plan = two_nodes(adapter, broken)
    ex = engine.start_run(mission, by=who.agent, segment_id="seg-1")
    with pytest.raises(charter.NodeFailed):
        ex.execute(plan)
    broken.update(bug=False, to="y")

    linked = engine.new_linked_run(ex.run_id, reviewed_by=who.alice, segment_id="seg-1")
    with pytest.raises(charter.NonDeterminismError):
        linked.execute(plan)

    assert [s.request["step"] for s in adapter.sent] == ["first", "second"]
    assert engine.run(linked.run_id).status is RunStatus.NEEDS_INTERVENTION


def test_N4_a_linked_run_is_refused_for_a_live_run_an_unknown_run_or_without_link(
    engine: charter.Engine, who: Principals, mission: str, adapter: RecordingAdapter
) -> None:
    """Breaking N4 looks like a second run started beside a live one, or one started
    by a principal nobody gave ``link``; either way nothing may change."""
    ex = engine.start_run(mission, by=who.agent, segment_id="seg-1")
    ex.perform(adapter, "write", {"n": 1}, effect_key="one")
    before = stored(engine, mission)

    with pytest.raises(charter.StateError):
        engine.new_linked_run(ex.run_id, reviewed_by=who.alice, segment_id="seg-2")
    with pytest.raises(charter.NotFound):
        engine.new_linked_run("run_x", reviewed_by=who.alice, segment_id="seg-2")
    assert stored(engine, mission) == before
    ex.finish(RunStatus.FAILED)
    before = stored(engine, mission)
    with pytest.raises(charter.NotAuthorized):
        engine.new_linked_run(ex.run_id, reviewed_by=who.agent, segment_id="seg-2")

    assert stored(engine, mission) == before
    refusals = [e for e in engine.audit_events(mission) if e["kind"] == "authorization.refused"]
    assert [(e["actor"], e["entity"]) for e in refusals] == [("agent", ex.run_id)]


def test_N4_a_link_of_a_link_still_replays_what_the_first_run_settled(
    engine: charter.Engine, who: Principals, mission: str, adapter: RecordingAdapter
) -> None:
    """Breaking it looks like the third run in a chain of follow-ups sending again
    what the first one settled, because it looked only one link back."""
    broken = {"bug": True, "to": "x"}
    plan = two_nodes(adapter, broken)
    first = engine.start_run(mission, by=who.agent, segment_id="seg-1")
    with pytest.raises(charter.NodeFailed):
        first.execute(plan)
    second = engine.new_linked_run(first.run_id, reviewed_by=who.alice, segment_id="seg-1")
    with pytest.raises(charter.NodeFailed):  # the review missed the cause
        second.execute(plan)
    broken["bug"] = False
    third = engine.new_linked_run(second.run_id, reviewed_by=who.alice, segment_id="seg-1")

    assert third.execute(plan) == 2
    assert [s.request["step"] for s in adapter.sent] == ["first", "second", "after"]
    assert engine.run(third.run_id).linked_from == second.run_id
    assert engine.check_ledger(mission) == []

    # A second follower of the same run would send again what its sibling sent.
    before = stored(engine, mission)
    with pytest.raises(charter.StateError):
        engine.new_linked_run(second.run_id, reviewed_by=who.alice, segment_id="seg-9")
    assert stored(engine, mission) == before


# -- N5 and R2: recovering a stopping run keeps the stop -------------------------------------

KILLED_MID_ATTEMPT = """
import json, sys, charter
from charter.testing import RecordingAdapter, kill_at
cfg = json.loads(sys.argv[1])
config = charter.EngineConfig(credentials=cfg["digests"])
engine = charter.Engine.open(cfg["store"], config=config, crash_hook=kill_at("settlement.before"))
ex = engine.start_run(cfg["mission"], by=engine.authenticate(cfg["agent"]), segment_id="seg-1")
print(ex.run_id, flush=True)
ex.perform(RecordingAdapter(), "write", {"n": 1}, effect_key="k")
"""


def test_N5_recovering_a_stopping_run_keeps_it_stopping_until_it_ends_stopped(
    engine: charter.Engine, who: Principals, mission: str, store_address: str, clock: Any
) -> None:
    """The owner is killed with an attempt in flight; an operator stops the run; a
    recovery fences the dead owner. Breaking N5 looks like the recovery turning the
    stop into ``needs_intervention``, so that once the attempt is resolved the run
    can be resumed and go on, against the operator's stop."""
    child = subprocess.run(
        [
            sys.executable,
            "-c",
            KILLED_MID_ATTEMPT,
            json.dumps(
                {
                    "store": store_address,
                    "digests": who.digests,
                    "agent": who.credentials["agent"],
                    "mission": mission,
                }
            ),
        ],
        capture_output=True,
        text=True,
        timeout=60,
    )
    assert child.returncode == -signal.SIGKILL, child.stderr
    run_id = child.stdout.split()[0]
    [attempt] = engine.attempts(run_id=run_id)
    assert attempt.status is AttemptStatus.DISPATCHED
    assert engine.stop_run(run_id, by=who.alice, reason="operator").status is RunStatus.STOPPING

    clock.advance((SystemClock().now_us() - clock.now_us()) / MICROS + 86_400)
    state, unresolved = engine.coordinator.recover(run_id, "seg-2")

    assert (state.run.status, state.run.status_reason) == (RunStatus.STOPPING, "operator")
    assert unresolved == [attempt.id]
    assert engine.get_attempt(attempt.id).status is AttemptStatus.UNKNOWN
    with pytest.raises(charter.NeedsIntervention):
        engine.coordinator.resume(run_id, "seg-2", by=who.agent)
    engine.coordinator.resolve(attempt.id, by=who.alice, outcome="written_off", evidence="?")
    run = engine.run(run_id)
    assert (run.status, run.status_reason) == (RunStatus.STOPPED, "operator")
    with pytest.raises(charter.RunTerminal):
        engine.coordinator.resume(run_id, "seg-2", by=who.agent)
    assert engine.check_ledger(mission) == []


def test_N5_a_stop_condition_voids_what_was_never_sent_and_the_run_ends_stopped(
    engine: charter.Engine, who: Principals, adapter: RecordingAdapter
) -> None:
    """Breaking N5 looks like an attempt waiting for approval keeping its hold (and
    the run ``stopping``) forever after a stop condition, with nothing in flight."""
    mission = engine.create_mission(
        default_contract(
            approvals={"required": ["recorder.write"]}, stop_conditions={"max_attempts": 2}
        ),
        by=who.alice,
    )
    ex = engine.start_run(mission, by=who.agent, segment_id="seg-1")
    with pytest.raises(charter.ApprovalRequired) as waiting:
        ex.perform(adapter, "write", {"n": 1}, effect_key="gated")
    ex.perform(adapter, "read", {"n": 2}, effect_key="read")

    with pytest.raises(charter.AdmissionRefused):
        ex.perform(adapter, "read", {"n": 3}, effect_key="over")

    assert engine.run(ex.run_id).status is RunStatus.STOPPED
    gated = engine.get_attempt(waiting.value.details["attempt_id"])
    assert gated.status is AttemptStatus.VOIDED
    assert held(engine, mission) == {"usd": 0, "calls": 0}
    assert engine.approvals(pending=True) == []
    assert [s.request for s in adapter.sent] == [{"n": 2}]
    assert engine.check_ledger(mission) == []


class OwnerDies(BaseException):
    """The owner's process ends right after the send (nothing settles it)."""


def test_N5_an_approval_that_expires_on_a_stopping_run_is_not_asked_again(
    engine: charter.Engine, who: Principals, adapter: RecordingAdapter, clock: Any
) -> None:
    """Breaking N5 (with W2) looks like a recovery opening a new approval request
    for an effect of a run that is stopping and will never send it."""
    mission = engine.create_mission(
        default_contract(approvals={"required": ["recorder.write"], "ttl_seconds": 60}),
        by=who.alice,
    )
    ex = engine.start_run(mission, by=who.agent, segment_id="seg-1")

    def dies(send: Dispatch) -> Outcome:
        raise OwnerDies

    adapter.script["charge"] = dies
    with pytest.raises(OwnerDies):
        ex.perform(adapter, "charge", {"n": 1}, effect_key="in-flight")
    with pytest.raises(charter.ApprovalRequired):
        ex.perform(adapter, "write", {"n": 2}, effect_key="gated")
    [request] = engine.approvals(pending=True)
    engine.approve(request.id, by=who.bob)
    assert engine.stop_run(ex.run_id, by=who.alice).status is RunStatus.STOPPING

    clock.advance(3_600)  # the approval expires, and so does the dead owner's lease
    state, unresolved = engine.coordinator.recover(ex.run_id, "seg-2")

    assert state.run.status is RunStatus.STOPPING
    assert len(unresolved) == 1
    assert engine.approvals(pending=True) == []
    assert {a.status for a in engine.approvals(run_id=ex.run_id)} == {ApprovalStatus.EXPIRED}
