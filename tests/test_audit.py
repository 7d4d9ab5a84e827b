"""S1: every transition appends an audit event in its own transaction, hash-chained per mission.

The store is inspected and tampered with through the database's own client
(``sqlite3`` or ``psycopg``, see ``_raw.py``), as an operator — or an attacker —
with access to it would: every test runs on both stores.
"""

from __future__ import annotations

import json
from collections import Counter
from collections.abc import Callable
from dataclasses import dataclass
from typing import Any

import pytest

import charter
from _raw import RawStore
from charter.hashing import HASHED_FIELDS, canonical, digest, event_hash, genesis
from charter.testing import ManualClock, RecordingAdapter
from conftest import Principals, default_contract

APPROVAL_CONTRACT = default_contract(approvals={"required": ["recorder.charge"]})

#: Every column of ``audit_events`` that a chain check must cover (``mission_id``
#: and ``seq`` are checked by their own tests: they place a row in a chain).
TAMPERABLE = (
    "at_us",
    "actor",
    "segment",
    "epoch",
    "kind",
    "entity",
    "before",
    "after",
    "payload",
    "payload_hash",
    "prev_hash",
    "hash",
)


# -- the store, seen from outside ------------------------------------------------------


def verdict(engine: charter.Engine, chain: str) -> charter.audit.chain.Verification:
    (result,) = engine.verify_audit(chain)
    return result


# -- a mission that went through every kind of transition -----------------------------


@dataclass
class History:
    mission: str
    run: str
    succeeded: str
    unknown: str
    approved: str
    approval: str
    overrun: str
    incident: str
    voided: str


def _step(
    raw: RawStore,
    clock: ManualClock,
    action: Callable[[], object],
    *,
    kinds: list[str],
    changes_state: bool = True,
    raises: type[BaseException] | None = None,
) -> object:
    """Run one API call and check the events it appended against the state it changed."""
    clock.advance(1)
    before_state, before_events = raw.state(), raw.events()
    result: object = None
    if raises is None:
        result = action()
    else:
        with pytest.raises(raises) as info:
            action()
        result = info.value
    after_state, after_events = raw.state(), raw.events()
    new = [e for e in after_events if e not in before_events]
    assert Counter(e["kind"] for e in new) == Counter(kinds)
    assert all(e["at_us"] == clock.now_us() for e in new), "an event outside its transaction"
    assert (after_state != before_state) is changes_state
    assert raw.heads() == raw.ends(), "a chain's head was not moved with its events"
    return result


def make_history(
    engine: charter.Engine,
    who: Principals,
    adapter: RecordingAdapter,
    raw: RawStore,
    clock: ManualClock,
) -> History:
    """Drive one mission through every transition, checking each step's events."""
    alice, bob, agent = who.alice, who.bob, who.agent

    mission = _step(
        raw,
        clock,
        lambda: engine.create_mission(APPROVAL_CONTRACT, by=alice),
        kinds=["mission.created", "contract.version"],
    )
    assert isinstance(mission, str)
    ex = _step(
        raw,
        clock,
        lambda: engine.start_run(mission, by=agent, segment_id="seg-1"),
        kinds=["run.started"],
    )
    assert isinstance(ex, charter.Executor)
    succeeded = _step(
        raw,
        clock,
        lambda: ex.perform(adapter, "write", {"n": 1}, effect_key="w1"),
        kinds=["attempt.prepared", "attempt.dispatched", "attempt.settled"],
    )
    assert isinstance(succeeded, charter.Attempt)

    def lost(send: charter.Dispatch) -> charter.Outcome:
        raise TimeoutError("no answer")

    adapter.script["read"] = lost
    unknown = _step(
        raw,
        clock,
        lambda: ex.perform(adapter, "read", {"n": 2}, effect_key="r1"),
        kinds=["attempt.prepared", "attempt.dispatched", "attempt.unknown"],
    )
    assert isinstance(unknown, charter.Attempt)
    assert unknown.status is charter.AttemptStatus.UNKNOWN

    waiting = _step(
        raw,
        clock,
        lambda: ex.perform(adapter, "charge", {"n": 3}, effect_key="c1"),
        kinds=["approval.requested", "attempt.prepared"],
        raises=charter.ApprovalRequired,
    )
    assert isinstance(waiting, charter.ApprovalRequired)
    approved_id = waiting.details["attempt_id"]
    (pending,) = engine.approvals(run_id=ex.run_id, pending=True)
    _step(
        raw,
        clock,
        lambda: engine.approve(pending.id, by=bob),
        kinds=["approval.decided"],
    )
    _step(
        raw,
        clock,
        lambda: ex.dispatch(approved_id, adapter),
        kinds=["attempt.dispatched", "attempt.settled"],
    )

    adapter.script["write"] = lambda send: charter.Outcome.succeeded(
        {"ok": True}, cost={"usd": 9_000, "calls": 1}, receipt={"id": "over"}
    )
    overrun = _step(
        raw,
        clock,
        lambda: ex.perform(adapter, "write", {"n": 4}, effect_key="w2"),
        kinds=["attempt.prepared", "attempt.dispatched", "attempt.settled", "incident.opened"],
    )
    assert isinstance(overrun, charter.Attempt)
    (incident,) = engine.incidents(mission, open_only=True)

    # Refusals change nothing but are recorded.
    _step(
        raw,
        clock,
        lambda: engine.raise_limit(mission, "usd", 2_000_000, by=bob),
        kinds=["authorization.refused"],
        changes_state=False,
        raises=charter.NotAuthorized,
    )
    _step(
        raw,
        clock,
        lambda: ex.perform(adapter, "read", {"n": 5}, effect_key="r2"),
        kinds=["run.status", "admission.refused"],  # L7: paused while an incident is open
        raises=charter.AllowanceExceeded,
    )
    _step(
        raw,
        clock,
        lambda: engine.close_incident(incident["id"], by=alice, note="priced wrong; fixed"),
        kinds=["incident.closed", "run.status"],  # closing it unpauses the run
    )
    _step(
        raw,
        clock,
        lambda: engine.raise_limit(mission, "usd", 2_000_000, by=alice),
        kinds=["contract.version"],
    )
    voided = _step(
        raw,
        clock,
        lambda: ex.admit(adapter, "write", {"n": 6}, effect_key="w3"),
        kinds=["attempt.prepared"],
    )
    assert isinstance(voided, charter.Attempt)
    _step(
        raw,
        clock,
        lambda: engine.stop_run(ex.run_id, by=alice),
        kinds=["attempt.voided", "run.status"],
    )
    _step(
        raw,
        clock,
        lambda: engine.authenticate("alice:not-the-secret"),
        kinds=["auth.refused"],
        changes_state=False,
        raises=charter.AuthenticationError,
    )
    return History(
        mission=mission,
        run=ex.run_id,
        succeeded=succeeded.id,
        unknown=unknown.id,
        approved=approved_id,
        approval=pending.id,
        overrun=overrun.id,
        incident=incident["id"],
        voided=voided.id,
    )


@pytest.fixture
def history(
    engine: charter.Engine,
    who: Principals,
    adapter: RecordingAdapter,
    raw: RawStore,
    clock: ManualClock,
) -> History:
    return make_history(engine, who, adapter, raw, clock)


# -- every transition, one event, same transaction ------------------------------------------


def test_S1_canonical_json_is_the_standard_encoding_with_sorted_keys() -> None:
    """What a hash covers is exactly ``json.dumps`` with sorted keys and no spaces
    (what any verifier can recompute), whichever encoder the engine runs; a value
    that contains itself is refused as the standard encoder refuses it."""
    import json
    from decimal import Decimal

    values: list[Any] = [
        {"b": 1, "a": [1, 2.5, None, True, False, 'é\u2028\x00"q"', -(2**70)]},
        "text",
        0,
        None,
        [],
        {},
        {"z": {"y": float("inf"), "x": float("nan"), "w": 1e-300}, "": [[], {}]},
        {"n": Decimal("1.10"), "t": (1, 2)},  # default=str; tuples are arrays
        {"emoji": "\U0001f600", "deep": [[[[["x"]]]]]},
    ]
    for value in values:
        expected = json.dumps(value, sort_keys=True, separators=(",", ":"), default=str)
        assert canonical(value) == expected
    looped: list[Any] = []
    looped.append(looped)
    with pytest.raises(ValueError, match="Circular"):
        canonical({"loop": looped})
    assert canonical({"after": "a failure"}) == '{"after":"a failure"}'


def test_S1_every_transition_appends_its_events_and_refusals_only_events(
    history: History, engine: charter.Engine
) -> None:
    # make_history checked every step; the result is a chain that verifies.
    assert all(v.ok for v in engine.verify_audit())
    assert {v.mission_id for v in engine.verify_audit()} == {history.mission, "engine"}


def test_S1_the_recorded_state_is_what_the_audit_trail_says(
    history: History, engine: charter.Engine, raw: RawStore
) -> None:
    trail = raw.events(history.mission)

    def last_after(entity: str, prefix: str) -> str | None:
        afters = [
            e["after"]
            for e in trail
            if e["entity"] == entity and e["kind"].startswith(prefix) and e["after"] is not None
        ]
        return afters[-1] if afters else None

    attempts = raw.rows("SELECT * FROM attempts")
    runs = raw.rows("SELECT * FROM runs")
    approvals = raw.rows("SELECT * FROM approvals")
    incidents = raw.rows("SELECT * FROM incidents")
    versions = raw.rows("SELECT * FROM contract_versions")
    missions = raw.rows("SELECT * FROM missions")

    assert len(attempts) == 5
    for a in attempts:
        kinds = [e["kind"] for e in trail if e["entity"] == a["id"]]
        assert kinds.count("attempt.prepared") == 1
        assert kinds.count("attempt.dispatched") == (a["dispatched_at_us"] is not None)
        assert last_after(a["id"], "attempt.") == a["status"]
        (prepared,) = (
            e for e in trail if e["entity"] == a["id"] and e["kind"] == "attempt.prepared"
        )
        assert prepared["at_us"] == a["prepared_at_us"]
        if a["settled_at_us"] is not None:
            (done,) = (
                e
                for e in trail
                if e["entity"] == a["id"] and e["kind"] in ("attempt.settled", "attempt.voided")
            )
            assert done["at_us"] == a["settled_at_us"]
    assert {a["id"]: a["status"] for a in attempts} == {
        history.succeeded: "succeeded",
        history.unknown: "unknown",
        history.approved: "succeeded",
        history.overrun: "succeeded",
        history.voided: "voided",
    }
    (run,) = runs
    starts = [e for e in trail if e["kind"] == "run.started"]
    assert [(e["entity"], e["at_us"], e["actor"]) for e in starts] == [
        (run["id"], run["created_at_us"], run["principal"])
    ]
    assert last_after(run["id"], "run.") == run["status"] == "stopping"
    (approval,) = approvals
    assert last_after(approval["id"], "approval.") == approval["status"] == "approved"
    (incident,) = incidents
    assert last_after(incident["id"], "incident.") == incident["status"] == "closed"
    assert [int(e["after"]) for e in trail if e["kind"] == "contract.version"] == sorted(
        v["version"] for v in versions
    )
    (mission,) = missions
    created = [e for e in trail if e["kind"] == "mission.created"]
    assert [(e["entity"], e["at_us"], e["actor"]) for e in created] == [
        (mission["id"], mission["created_at_us"], mission["created_by"])
    ]
    assert mission["contract_version"] == 2
    refusals = raw.events("engine")
    assert [(e["kind"], e["actor"]) for e in refusals] == [("auth.refused", "alice")]


def test_S1_events_carry_segment_epoch_and_the_payload_hash(
    history: History, raw: RawStore
) -> None:
    trail = raw.events(history.mission)
    for e in trail:
        assert e["payload_hash"] == digest(e["payload"])
    on_run = [e for e in trail if e["kind"].startswith("attempt.") and e["actor"] == "agent"]
    assert on_run
    assert all(e["segment"] == "seg-1" and e["epoch"] == 1 for e in on_run)


@pytest.mark.parametrize("operation", ["create_mission", "start_run", "attempt", "approve"])
def test_S1_a_transition_whose_event_cannot_be_written_does_not_happen(
    operation: str,
    engine: charter.Engine,
    who: Principals,
    adapter: RecordingAdapter,
    raw: RawStore,
) -> None:
    mission = engine.create_mission(APPROVAL_CONTRACT, by=who.alice)
    ex = engine.start_run(mission, by=who.agent, segment_id="seg-1")
    with pytest.raises(charter.ApprovalRequired):
        ex.perform(adapter, "charge", {"n": 1}, effect_key="c1")
    (pending,) = engine.approvals(pending=True)
    actions: dict[str, Callable[[], object]] = {
        "create_mission": lambda: engine.create_mission(default_contract(), by=who.alice),
        "start_run": lambda: engine.start_run(mission, by=who.agent, segment_id="seg-2"),
        "attempt": lambda: ex.perform(adapter, "write", {"n": 2}, effect_key="w1"),
        "approve": lambda: engine.approve(pending.id, by=who.bob),
    }
    before_state, before_events = raw.state(), raw.events()
    with raw.refusing("audit_events", "INSERT"), pytest.raises(charter.StoreError):
        actions[operation]()
    assert raw.state() == before_state
    assert raw.events() == before_events
    assert adapter.sent == []  # nothing reached the target either
    assert all(v.ok for v in engine.verify_audit())


def test_S1_a_transaction_that_fails_after_staging_events_leaves_none(
    engine: charter.Engine,
    who: Principals,
    adapter: RecordingAdapter,
    raw: RawStore,
) -> None:
    mission = engine.create_mission(default_contract(), by=who.alice)
    ex = engine.start_run(mission, by=who.agent, segment_id="seg-1")
    prepared = ex.admit(adapter, "write", {"n": 1}, effect_key="w1")
    before_state, before_events = raw.state(), raw.events()
    # stop_run voids the PREPARED attempt (an event is staged), then its status
    # change fails: the void and its event must both disappear.
    with raw.refusing("runs", "UPDATE OF status"), pytest.raises(charter.StoreError):
        engine.stop_run(ex.run_id, by=who.alice)
    assert raw.state() == before_state
    assert raw.events() == before_events
    assert engine.get_attempt(prepared.id).status is charter.AttemptStatus.PREPARED
    assert engine.check_ledger(mission) == []


def test_S1_a_failed_decision_leaves_no_event(
    engine: charter.Engine,
    who: Principals,
    adapter: RecordingAdapter,
    raw: RawStore,
) -> None:
    mission = engine.create_mission(default_contract(), by=who.alice)
    ex = engine.start_run(mission, by=who.agent, segment_id="seg-1")
    adapter.script["write"] = lambda send: charter.Outcome.succeeded(
        cost={"usd": 50_000, "calls": 1}
    )
    ex.perform(adapter, "write", {"n": 1}, effect_key="w1")
    (incident,) = engine.incidents(mission, open_only=True)
    before_state, before_events = raw.state(), raw.events()
    with pytest.raises(charter.StateError):
        engine.close_incident(incident["id"], by=who.alice, note="   ")
    with pytest.raises(charter.ContractError):
        engine.amend_contract(
            mission, default_contract(allowance={"usd": 1_000_000}), by=who.alice, reason="x"
        )
    with pytest.raises(charter.ContractError):
        engine.raise_limit(mission, "usd", 10, by=who.alice)
    assert raw.state() == before_state
    assert raw.events() == before_events


class SimulatedCrash(BaseException):
    """The executor's process dies at a durable boundary."""


def _crash_at(point: str) -> Callable[[str], None]:
    def hook(name: str) -> None:
        if name == point:
            raise SimulatedCrash(point)

    return hook


def test_S1_recovery_and_resolution_append_their_events(
    engine: charter.Engine,
    who: Principals,
    adapter: RecordingAdapter,
    raw: RawStore,
    clock: ManualClock,
) -> None:
    mission = engine.create_mission(default_contract(), by=who.alice)
    doomed = charter.Engine.open(
        raw.url,
        config=charter.EngineConfig(credentials=who.digests),
        clock=clock,
        crash_hook=_crash_at("dispatch.after"),
    )
    try:
        ex = doomed.start_run(
            mission, by=doomed.authenticate(who.credentials["agent"]), segment_id="seg-1"
        )
        prepared = ex.admit(adapter, "write", {"n": 1}, effect_key="later")
        with pytest.raises(SimulatedCrash):
            ex.perform(adapter, "write", {"n": 2}, effect_key="now")
    finally:
        doomed.close()
    (dispatched,) = (
        a for a in engine.attempts(run_id=ex.run_id) if a.status is charter.AttemptStatus.DISPATCHED
    )
    clock.advance(60)  # the lease expires
    _step(
        raw,
        clock,
        lambda: engine.coordinator.recover(ex.run_id, "seg-2"),
        kinds=["run.recovered", "attempt.voided", "attempt.unknown", "run.status"],
    )
    trail = engine.audit_events(mission)
    by_entity = {e["entity"]: e for e in trail if e["at_us"] == clock.now_us()}
    assert by_entity[prepared.id]["kind"] == "attempt.voided"
    assert by_entity[dispatched.id]["kind"] == "attempt.unknown"
    assert (by_entity[ex.run_id]["segment"], by_entity[ex.run_id]["epoch"]) == ("seg-2", 2)
    _step(
        raw,
        clock,
        lambda: engine.coordinator.resolve(
            dispatched.id, by=who.alice, outcome="failed", evidence="no such payment"
        ),
        kinds=["attempt.settled", "evidence.recorded"],
    )
    _step(
        raw,
        clock,
        lambda: engine.coordinator.resolve(
            dispatched.id, by=who.bob, outcome="succeeded", evidence="it went through"
        ),
        kinds=["authorization.refused"],
        changes_state=False,
        raises=charter.NotAuthorized,
    )
    assert engine.get_attempt(dispatched.id).status is charter.AttemptStatus.FAILED
    assert all(v.ok for v in engine.verify_audit())
    assert engine.check_ledger(mission) == []


# -- the chain ---------------------------------------------------------------------------


def test_S1_the_chain_links_every_event_to_the_one_before(history: History, raw: RawStore) -> None:
    """From a genesis of the mission's own, each hash covering the mission's id,
    to the head recorded on the mission's row."""
    assert genesis(history.mission) != genesis("engine")
    for chain in (history.mission, "engine"):
        trail = raw.events(chain)
        assert [e["seq"] for e in trail] == list(range(1, len(trail) + 1))
        prev = genesis(chain)
        for e in trail:
            assert e["prev_hash"] == prev
            assert e["hash"] == event_hash(prev, {k: e[k] for k in HASHED_FIELDS})
            assert "mission_id" in HASHED_FIELDS
            prev = e["hash"]
        assert len({e["hash"] for e in trail}) == len(trail)
        assert raw.heads()[chain] == (len(trail), prev)


def test_S1_changing_any_field_of_any_event_breaks_the_chain_there(
    history: History, engine: charter.Engine, raw: RawStore
) -> None:
    trail = raw.events(history.mission)
    assert len(trail) >= 20
    for row in trail:
        for column in TAMPERABLE:
            original = row[column]
            if isinstance(original, int):
                forged: Any = original + 1
            elif original is None:
                forged = 1 if column == "epoch" else "forged"
            elif column == "payload":
                forged = canonical({"forged": True})
            else:
                forged = original[:-1] + ("0" if original[-1:] != "0" else "1")
            raw.execute(
                f"UPDATE audit_events SET {column} = ? WHERE mission_id = ? AND seq = ?",
                forged,
                history.mission,
                row["seq"],
            )
            result = verdict(engine, history.mission)
            assert (result.ok, result.broken_at) == (False, row["seq"]), (column, row["seq"])
            raw.execute(
                f"UPDATE audit_events SET {column} = ? WHERE mission_id = ? AND seq = ?",
                original,
                history.mission,
                row["seq"],
            )
    assert verdict(engine, history.mission).ok
    assert raw.events(history.mission) == trail


def test_S1_a_payload_rewritten_with_its_own_hash_is_detected(
    history: History, engine: charter.Engine, raw: RawStore
) -> None:
    trail = raw.events(history.mission)
    settled = next(e for e in trail if e["kind"] == "attempt.settled")
    forged = canonical({**json.loads(settled["payload"]), "actual": {"usd": 1}})
    raw.execute(
        "UPDATE audit_events SET payload = ?, payload_hash = ? WHERE mission_id = ? AND seq = ?",
        forged,
        digest(forged),
        history.mission,
        settled["seq"],
    )
    result = verdict(engine, history.mission)
    assert (result.ok, result.broken_at) == (False, settled["seq"])


def test_S1_a_fully_rehashed_event_breaks_the_link_to_the_next(
    history: History, engine: charter.Engine, raw: RawStore
) -> None:
    trail = raw.events(history.mission)
    target = next(e for e in trail if e["kind"] == "approval.decided")
    assert target["seq"] < len(trail)
    fields = {k: target[k] for k in HASHED_FIELDS}
    fields["actor"] = "mallory"
    raw.execute(
        "UPDATE audit_events SET actor = ?, hash = ? WHERE mission_id = ? AND seq = ?",
        "mallory",
        event_hash(target["prev_hash"], fields),
        history.mission,
        target["seq"],
    )
    result = verdict(engine, history.mission)
    assert (result.ok, result.broken_at) == (False, target["seq"] + 1)


def test_S1_deleting_an_event_is_detected(
    history: History, engine: charter.Engine, raw: RawStore
) -> None:
    trail = raw.events(history.mission)
    columns = list(trail[0])
    for row in trail:
        raw.execute(
            "DELETE FROM audit_events WHERE mission_id = ? AND seq = ?",
            history.mission,
            row["seq"],
        )
        result = verdict(engine, history.mission)
        assert not result.ok
        assert result.broken_at in (row["seq"], row["seq"] + 1)
        raw.execute(
            f"INSERT INTO audit_events ({', '.join(columns)}) "
            f"VALUES ({', '.join('?' for _ in columns)})",
            *(row[c] for c in columns),
        )
    assert verdict(engine, history.mission).ok


@pytest.mark.parametrize("cut", [1, 3])
def test_S1_a_truncated_tail_is_detected(
    cut: int, history: History, engine: charter.Engine, raw: RawStore
) -> None:
    trail = raw.events(history.mission)
    raw.execute(
        "DELETE FROM audit_events WHERE mission_id = ? AND seq > ?",
        history.mission,
        len(trail) - cut,
    )
    result = verdict(engine, history.mission)
    assert (result.ok, result.broken_at) == (False, len(trail) - cut + 1)
    assert result.problem is not None and f"head records {len(trail)}" in result.problem


def test_S1_a_truncated_tail_stays_detected_after_new_events(
    history: History, engine: charter.Engine, who: Principals, raw: RawStore
) -> None:
    """The next event links to the recorded head, not to what is left of the log."""
    trail = raw.events(history.mission)
    raw.execute(
        "DELETE FROM audit_events WHERE mission_id = ? AND seq = ?", history.mission, len(trail)
    )
    engine.raise_limit(history.mission, "calls", 500, by=who.alice)
    (appended,) = raw.events(history.mission)[len(trail) - 1 :]
    assert appended["seq"] == len(trail) + 1  # after the deleted one
    assert appended["prev_hash"] == trail[-1]["hash"]
    result = verdict(engine, history.mission)
    assert (result.ok, result.broken_at) == (False, len(trail) + 1)


def test_S1_a_whole_deleted_chain_is_detected(
    history: History, engine: charter.Engine, raw: RawStore
) -> None:
    trail = raw.events(history.mission)
    raw.execute("DELETE FROM audit_events WHERE mission_id = ?", history.mission)
    result = verdict(engine, history.mission)
    assert (result.ok, result.broken_at, result.events) == (False, 1, 0)
    everything = {v.mission_id: v for v in engine.verify_audit()}
    assert (everything[history.mission].ok, everything["engine"].ok) == (False, True)
    assert raw.heads()[history.mission] == (len(trail), trail[-1]["hash"])


def test_S1_a_deleted_engine_chain_is_detected(
    history: History, engine: charter.Engine, raw: RawStore
) -> None:
    raw.execute("DELETE FROM audit_events WHERE mission_id = 'engine'")
    result = verdict(engine, "engine")
    assert (result.ok, result.broken_at) == (False, 1)
    assert verdict(engine, history.mission).ok


def test_S1_a_deleted_engine_chain_head_is_detected(
    history: History, engine: charter.Engine, raw: RawStore
) -> None:
    raw.execute("DELETE FROM audit_chains WHERE id = 'engine'")
    results = {v.mission_id: v for v in engine.verify_audit()}
    assert (results["engine"].ok, results["engine"].broken_at) == (False, 1)
    assert results[history.mission].ok


def test_S1_swapping_two_missions_whole_chains_is_detected(
    history: History, engine: charter.Engine, who: Principals, raw: RawStore
) -> None:
    other = engine.create_mission(default_contract(), by=who.alice)
    ex = engine.start_run(other, by=who.agent, segment_id="seg-other")
    for i in range(3):
        ex.perform(RecordingAdapter(), "write", {"i": i}, effect_key=f"w{i}")
    rename = "UPDATE audit_events SET mission_id = ? WHERE mission_id = ?"
    raw.execute(rename, "swap", history.mission)
    raw.execute(rename, history.mission, other)
    raw.execute(rename, other, "swap")
    for mission in (history.mission, other):
        result = verdict(engine, mission)
        assert (result.ok, result.broken_at) == (False, 1), mission
    # Moving the heads along with the chains does not help: the hashes name their mission.
    swap_heads = "UPDATE missions SET audit_seq = ?, audit_hash = ? WHERE id = ?"
    heads = raw.heads()
    raw.execute(swap_heads, *heads[other], history.mission)
    raw.execute(swap_heads, *heads[history.mission], other)
    for mission in (history.mission, other):
        result = verdict(engine, mission)
        assert (result.ok, result.broken_at) == (False, 1), mission


def test_S1_a_chain_moved_to_a_mission_that_does_not_exist_is_reported(
    history: History, engine: charter.Engine, raw: RawStore
) -> None:
    raw.execute(
        "UPDATE audit_events SET mission_id = 'msn_ghost' WHERE mission_id = ?", history.mission
    )
    results = {v.mission_id: v for v in engine.verify_audit()}
    assert (results["msn_ghost"].ok, results["msn_ghost"].broken_at) == (False, 1)
    assert results["msn_ghost"].problem is not None
    assert "no head" in results["msn_ghost"].problem
    assert (results[history.mission].ok, results[history.mission].broken_at) == (False, 1)


def test_S1_moving_an_event_to_another_chain_is_detected_on_both(
    history: History, engine: charter.Engine, who: Principals, raw: RawStore
) -> None:
    other = engine.create_mission(default_contract(), by=who.alice)
    trail = raw.events(history.mission)
    victim = trail[len(trail) // 2]
    raw.execute(
        "UPDATE audit_events SET mission_id = ?, seq = ? WHERE mission_id = ? AND seq = ?",
        other,
        len(raw.events(other)) + 1,
        history.mission,
        victim["seq"],
    )
    source = verdict(engine, history.mission)
    assert not source.ok
    assert source.broken_at in (victim["seq"], victim["seq"] + 1)
    target = verdict(engine, other)
    assert (target.ok, target.broken_at) == (False, len(raw.events(other)))


def test_S1_inserting_a_well_formed_event_is_detected(
    history: History, engine: charter.Engine, raw: RawStore
) -> None:
    trail = raw.events(history.mission)
    at = trail[len(trail) // 2]["seq"]
    # Make room at ``at`` (two steps: the primary key forbids overlapping seqs).
    raw.execute(
        "UPDATE audit_events SET seq = seq + 100000 WHERE mission_id = ? AND seq >= ?",
        history.mission,
        at,
    )
    raw.execute(
        "UPDATE audit_events SET seq = seq - 99999 WHERE mission_id = ? AND seq >= 100000",
        history.mission,
    )
    prev = trail[at - 2]["hash"]
    forged = {
        "mission_id": history.mission,
        "seq": at,
        "at_us": trail[at - 2]["at_us"],
        "actor": "alice",
        "segment": None,
        "epoch": None,
        "kind": "approval.decided",
        "entity": "apr_forged",
        "before": "pending",
        "after": "approved",
        "payload": canonical({}),
    }
    forged["payload_hash"] = digest(forged["payload"])
    h = event_hash(prev, {k: forged[k] for k in HASHED_FIELDS})
    raw.execute(
        "INSERT INTO audit_events (mission_id, seq, at_us, actor, segment, epoch, kind, entity, "
        "before, after, payload, payload_hash, prev_hash, hash) "
        "VALUES (?, ?, ?, ?, ?, ?, ?, ?, ?, ?, ?, ?, ?, ?)",
        history.mission,
        *(forged[k] for k in ("seq", "at_us", "actor", "segment", "epoch", "kind", "entity")),
        *(forged[k] for k in ("before", "after", "payload", "payload_hash")),
        prev,
        h,
    )
    result = verdict(engine, history.mission)
    assert (result.ok, result.broken_at) == (False, at + 1)


def test_S1_appending_an_event_with_a_made_up_hash_is_detected(
    history: History, engine: charter.Engine, raw: RawStore
) -> None:
    trail = raw.events(history.mission)
    last = trail[-1]
    raw.execute(
        "INSERT INTO audit_events (mission_id, seq, at_us, actor, segment, epoch, kind, entity, "
        "before, after, payload, payload_hash, prev_hash, hash) "
        "VALUES (?, ?, ?, 'alice', NULL, NULL, 'incident.closed', 'inc_x', 'open', 'closed', "
        "'{}', ?, ?, ?)",
        history.mission,
        last["seq"] + 1,
        last["at_us"],
        digest("{}"),
        last["hash"],
        "f" * 64,
    )
    result = verdict(engine, history.mission)
    assert (result.ok, result.broken_at) == (False, last["seq"] + 1)


def _swap(raw: RawStore, mission: str, k: int) -> None:
    """Exchange the positions of events ``k`` and ``k + 1`` (through a free slot)."""
    move = "UPDATE audit_events SET seq = ? WHERE mission_id = ? AND seq = ?"
    raw.execute(move, -1, mission, k)
    raw.execute(move, k, mission, k + 1)
    raw.execute(move, k + 1, mission, -1)


def test_S1_reordering_events_is_detected(
    history: History, engine: charter.Engine, raw: RawStore
) -> None:
    trail = raw.events(history.mission)
    for k in (1, len(trail) // 2, len(trail) - 1):
        _swap(raw, history.mission, k)
        moved = raw.events(history.mission)
        assert moved[k - 1]["hash"] == trail[k]["hash"]  # really swapped
        result = verdict(engine, history.mission)
        assert (result.ok, result.broken_at) == (False, k)
        _swap(raw, history.mission, k)
        assert verdict(engine, history.mission).ok


def test_S1_verification_reads_a_chain_a_page_at_a_time(
    history: History, engine: charter.Engine, raw: RawStore, monkeypatch: pytest.MonkeyPatch
) -> None:
    """What verification holds does not grow with the chain: no read of the log
    returns more than a page of events, and a break past the first page is
    found where it is."""
    monkeypatch.setattr(charter.audit.chain, "PAGE", 4)
    pages: list[int] = []
    read = charter.storage.Tx.all

    def counting(tx: charter.storage.Tx, sql: str, *params: Any) -> list[Any]:
        rows = read(tx, sql, *params)
        if "FROM audit_events" in sql:
            pages.append(len(rows))
        return rows

    monkeypatch.setattr(charter.storage.Tx, "all", counting)
    trail = raw.events(history.mission)
    assert len(trail) > 3 * 4
    assert verdict(engine, history.mission).ok
    assert max(pages) == 4 and sum(pages) == len(trail)
    raw.execute(
        "UPDATE audit_events SET actor = 'mallory' WHERE mission_id = ? AND seq = ?",
        history.mission,
        len(trail) - 1,
    )
    assert verdict(engine, history.mission).broken_at == len(trail) - 1


def test_S1_the_engine_chain_is_verified_like_a_mission_chain(
    history: History, engine: charter.Engine, raw: RawStore
) -> None:
    raw.execute(
        "UPDATE audit_events SET actor = 'bob' WHERE mission_id = 'engine' AND seq = 1",
    )
    results = {v.mission_id: v for v in engine.verify_audit()}
    assert (results["engine"].ok, results["engine"].broken_at) == (False, 1)
    assert results[history.mission].ok


# -- one chain per mission -----------------------------------------------------------------


def test_S1_chains_are_per_mission(
    engine: charter.Engine,
    who: Principals,
    adapter: RecordingAdapter,
    raw: RawStore,
    clock: ManualClock,
) -> None:
    first = engine.create_mission(default_contract(), by=who.alice)
    second = engine.create_mission(default_contract(objective="second"), by=who.alice)
    ex1 = engine.start_run(first, by=who.agent, segment_id="seg-a")
    ex2 = engine.start_run(second, by=who.agent, segment_id="seg-b")
    for i in range(3):  # interleaved work on both missions
        clock.advance(1)
        ex1.perform(adapter, "write", {"i": i}, effect_key=f"a{i}")
        ex2.perform(adapter, "read", {"i": i}, effect_key=f"b{i}")
    engine.raise_limit(second, "calls", 500, by=who.alice)

    owned = {
        first: {first, ex1.run_id} | {a.id for a in engine.attempts(mission_id=first)},
        second: {second, ex2.run_id} | {a.id for a in engine.attempts(mission_id=second)},
    }
    for mission, entities in owned.items():
        trail = raw.events(mission)
        assert [e["seq"] for e in trail] == list(range(1, len(trail) + 1))
        assert trail[0]["prev_hash"] == genesis(mission)
        assert {e["entity"] for e in trail} <= entities
        assert {e["entity"] for e in trail} == entities
    assert len(raw.events(first)) == 2 + 1 + 3 * 3
    assert len(raw.events(second)) == 2 + 1 + 3 * 3 + 1
    results = {v.mission_id: v for v in engine.verify_audit()}
    assert set(results) == {first, second, "engine"}  # the engine chain, empty, is checked too
    assert results["engine"].events == 0
    assert all(v.ok for v in results.values())
    assert results[first].events == len(raw.events(first))

    raw.execute(
        "UPDATE audit_events SET payload = '{}' WHERE mission_id = ? AND seq = 2",
        first,
    )
    assert (verdict(engine, first).ok, verdict(engine, first).broken_at) == (False, 2)
    assert verdict(engine, second).ok


def test_S1_verifying_an_unknown_mission_is_not_found(
    engine: charter.Engine, raw: RawStore
) -> None:
    with pytest.raises(charter.NotFound) as info:
        engine.verify_audit("msn_nope")
    assert info.value.details["mission_id"] == "msn_nope"
    assert raw.events() == []


# -- a store whose chains began before schema 6 ------------------------------------------


def _as_before_schema_6(raw: RawStore) -> None:
    """Make the store what schema 5 left: chains hashed without the mission's id
    from an all-zero genesis, and no heads anywhere."""
    for chain in {e["mission_id"] for e in raw.events()}:
        prev = charter.hashing.LEGACY_GENESIS
        for e in raw.events(chain):
            h = event_hash(prev, {k: e[k] for k in charter.hashing.LEGACY_HASHED_FIELDS})
            raw.execute(
                "UPDATE audit_events SET prev_hash = ?, hash = ? WHERE mission_id = ? AND seq = ?",
                prev,
                h,
                chain,
                e["seq"],
            )
            prev = h
    raw.books_as_before_schema_23()
    raw.attempts_as_before_schema_25()
    for column in ("audit_seq", "audit_hash", "audit_legacy_seq", "audit_sealed"):
        raw.execute(f"ALTER TABLE missions DROP COLUMN {column}")
    for table in ("audit_chains", "audit_checkpoints", "store_identity"):
        raw.execute(f"DROP TABLE {table}")
    # ... and what came after it, so that upgrading replays them all.
    raw.execute("ALTER TABLE attempts DROP COLUMN answered")
    raw.execute("ALTER TABLE runs DROP COLUMN owner_claim")
    raw.execute("ALTER TABLE runs DROP COLUMN owner_process")
    raw.execute("DROP INDEX approvals_run")
    raw.execute("DROP INDEX runs_created")
    raw.execute("DROP INDEX audit_events_entity")
    for table in ("waits", "artifacts", "plan_versions", "sign_ins"):
        raw.execute(f"DROP TABLE {table}")
    for table in ("escrow_holds", "escrow_slices"):
        raw.execute(f"DROP TABLE {table}")
    for table in (
        "gateway_calls",
        "run_claims",
        "runs_let_go",
        "run_queue",
        "effect_takeovers",
        "notice_deliveries",
        "notices",
    ):
        raw.execute(f"DROP TABLE {table}")
    raw.execute("DROP INDEX runs_need_people")
    raw.execute("DELETE FROM schema_migrations WHERE version >= 6")


def test_S1_upgrading_a_store_keeps_its_events_and_records_where_each_chain_ends(
    history: History,
    raw: RawStore,
    make_engine: Callable[..., charter.Engine],
    creds: tuple[dict[str, str], dict[str, str]],
) -> None:
    _as_before_schema_6(raw)
    legacy = raw.events()
    upgraded = make_engine()  # migrates to schema 6 and on
    assert raw.events() == legacy  # not one event rehashed
    assert raw.heads() == raw.ends()
    lengths = {r["id"]: r["audit_legacy_seq"] for r in raw.rows("SELECT * FROM missions")}
    assert lengths == {history.mission: len(raw.events(history.mission))}
    assert all(v.ok for v in upgraded.verify_audit())

    # New events are hashed the current way, continuing the old chain.
    alice = upgraded.authenticate(creds[0]["alice"])
    upgraded.raise_limit(history.mission, "calls", 500, by=alice)
    old_end, new = raw.events(history.mission)[lengths[history.mission] - 1 :]
    assert new["prev_hash"] == old_end["hash"]
    assert new["hash"] == event_hash(new["prev_hash"], {k: new[k] for k in HASHED_FIELDS})
    assert all(v.ok for v in upgraded.verify_audit())

    # An old event is still checked the old way, and the recorded head catches a cut.
    raw.execute(
        "UPDATE audit_events SET actor = 'mallory' WHERE mission_id = ? AND seq = 2",
        history.mission,
    )
    assert verdict(upgraded, history.mission).broken_at == 2
    raw.execute("DELETE FROM audit_events WHERE mission_id = 'engine'")
    engine_chain = verdict(upgraded, "engine")
    assert (engine_chain.ok, engine_chain.broken_at) == (False, 1)
