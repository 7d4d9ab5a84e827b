"""The edges of a handover (S5): a send in flight when the source is fenced, and
a file the target would refuse.

A handover fences the source, then hands a signed file to the target. Two things
can go wrong at its edges. A send that was under way when the source was fenced
reports afterwards: its answer must be kept, as after any takeover (F2), though
the source's chain is sealed. And the file may be one the target refuses (an
entry too large, a chain that does not verify): the export must find that out
before it fences anything, or the mission is left sealed where it was and
refused where it was going. Each test runs on SQLite and on PostgreSQL.
"""

from __future__ import annotations

import json
import threading
from collections.abc import Callable
from typing import Any

import pytest

import charter
import charter.errors
from _raw import RawStore
from charter.attempts.model import AttemptStatus
from charter.audit import archive
from charter.hashing import ENGINE_CHAIN
from charter.testing import RecordingAdapter
from conftest import Principals, default_contract

MakeEngine = Callable[..., charter.Engine]
Creds = tuple[dict[str, str], dict[str, str]]
WAIT = 30  # seconds a test thread waits for the other before the test fails


# -- a send in flight at the handover ------------------------------------------------------


def paid(send: charter.Dispatch) -> charter.Outcome:
    return charter.Outcome.succeeded(
        {"paid": "inv-1"}, cost={"usd": 5_000, "calls": 1}, receipt={"charge": "ch_1"}
    )


def cut_off(send: charter.Dispatch) -> charter.Outcome:
    raise charter.OutcomeUnknown("connection reset", evidence={"charge": "ch_1?"})


#: What a send reports after the fence -> the evidence the source keeps of it.
REPORTS = {
    "paid": (paid, "applied", {"paid": "inv-1"}),
    "cut_off": (cut_off, "indeterminate", None),
}


@pytest.mark.parametrize("report", sorted(REPORTS))
def test_S5_a_result_that_arrives_after_the_handover_is_kept_as_late_evidence(
    make_engine: MakeEngine, creds: Creds, key: str, target: charter.Engine, report: str
) -> None:
    """Broken S5 looked like this: the adapter reported the payment made after the
    handover had fenced and sealed the source, the fenced executor wrote nothing,
    and the attempt stayed DISPATCHED with no evidence on either store, the
    payment's answer lost. A takeover keeps such a result as late evidence; a
    handover must too, on the source, without settling anything there, whether
    the report is an answer or an uncertain one with something to show."""
    answer, verdict, result = REPORTS[report]
    source = make_engine(signing_key=key)
    sender = make_engine(signing_key=key)  # the executor's own connection
    who = Principals(creds[0], creds[1], source)
    mission = source.create_mission(default_contract(), by=who.alice)
    # The target system: what it received is the truth.
    system = RecordingAdapter(costs={"write": {"usd": 5_000, "calls": 1}})
    sending, fenced = threading.Event(), threading.Event()

    def paid_after_the_fence(send: charter.Dispatch) -> charter.Outcome:
        sending.set()
        assert fenced.wait(WAIT), "the handover never fenced the source"
        return answer(send)

    system.script["write"] = paid_after_the_fence

    @charter.node
    def pay(ctx: charter.Context, value: Any) -> str:
        ctx.attempt(system, "write", {"invoice": 1}, key="pay")
        return "paid"

    plan = charter.Plan("pay", (pay,))
    agent = Principals(creds[0], creds[1], sender).agent
    ex = sender.start_run(mission, by=agent, segment_id="seg-1", plan=plan)
    outcome: list[BaseException] = []

    def execute() -> None:
        try:
            ex.execute(plan)
        except BaseException as exc:  # Blocked and Fenced are BaseExceptions
            outcome.append(exc)

    worker = threading.Thread(target=execute, daemon=True)
    worker.start()
    assert sending.wait(WAIT), f"the send never started: {outcome}"
    (attempt,) = source.attempts(mission_id=mission)
    assert attempt.status is AttemptStatus.DISPATCHED
    file = source.export_snapshot(mission, handover_to=target.store_id(), by=who.alice)
    fenced.set()
    worker.join(WAIT)
    assert not worker.is_alive()

    # The source: the answer is kept as evidence, from the old epoch; nothing settled.
    (kept,) = source.evidence(attempt.id)
    assert (kept["verdict"], kept["epoch"], kept["settled"]) == (verdict, 1, 0)
    if result is not None:
        assert json.loads(kept["outcome"])["result"] == result
        assert json.loads(kept["outcome"])["receipt"] == {"charge": "ch_1"}
    else:
        assert json.loads(kept["detail"]) == {"charge": "ch_1?"}
    assert source.get_attempt(attempt.id).status is AttemptStatus.UNKNOWN
    assert source.balances(mission)["usd"].held == 5_000  # the hold is kept (L4)
    assert source.run(ex.run_id).status.value == "handed_off"
    # ... recorded on the engine's chain, since the mission's takes no event; every
    # chain still verifies, and the mission stays sealed.
    late = [e for e in source.audit_events(ENGINE_CHAIN) if e["entity"] == attempt.id]
    assert [e["kind"] for e in late] == ["evidence.recorded"]
    assert json.loads(late[0]["payload"])["mission_id"] == mission
    assert all(v.ok for v in source.verify_audit())
    with pytest.raises(charter.MissionSealed):
        source.start_run(mission, by=who.agent, segment_id="seg-9")
    report = source.handoff(mission_id=mission)
    (unresolved,) = report["unresolved"]
    assert [e["verdict"] for e in unresolved["evidence"]] == [verdict]

    # The target: the attempt arrives uncertain with its hold; nothing is sent again.
    on_target = Principals(creds[0], creds[1], target)
    assert target.import_snapshot(file) == mission
    (linked,) = target.adopt(mission, by=on_target.alice, segment_id="seg-t")
    assert target.get_attempt(attempt.id).status is AttemptStatus.UNKNOWN
    assert target.balances(mission)["usd"].held == 5_000
    with pytest.raises(charter.Blocked):  # the payment waits for a person
        linked.execute(plan)
    assert [s.attempt_id for s in system.sent] == [attempt.id]  # exactly one send
    # The executor in flight went no further: it learnt that it was fenced.
    assert [type(o) for o in outcome] == [charter.Fenced]


# -- a file the target would refuse ----------------------------------------------------------


def lost(send: charter.Dispatch) -> charter.Outcome:
    raise TimeoutError("no answer")


def working_mission(source: charter.Engine, creds: Creds) -> tuple[str, Any]:
    """A mission under way on the source: a settled payment, an uncertain one,
    and the run still held by its executor. The bounds are lowered to its size
    in the one place they live, so it stands for a mission too large to move."""
    who = Principals(creds[0], creds[1], source)
    mission = source.create_mission(default_contract(), by=who.alice)
    system = RecordingAdapter(costs={"write": {"usd": 5_000, "calls": 1}})
    system.script["write"] = lambda send: charter.Outcome.succeeded(
        {"statement": "x" * 200}, cost={"usd": 5_000, "calls": 1}
    )
    ex = source.start_run(mission, by=who.agent, segment_id="seg-1")
    ex.perform(system, "write", {"invoice": 1}, effect_key="one")
    system.script["write"] = lost
    ex.perform(system, "write", {"invoice": 2}, effect_key="two")
    return mission, ex


def largest_entry(data: bytes) -> int:
    return max(len(content) for content in archive.read(data).values())


Cause = Callable[[bytes, RawStore, str, pytest.MonkeyPatch], None]


def _entry_too_large(plain: bytes, raw: RawStore, mission: str, at: pytest.MonkeyPatch) -> None:
    at.setattr(archive, "MAX_ENTRY_BYTES", largest_entry(plain) - 1)


def _too_large_once_fenced(
    plain: bytes, raw: RawStore, mission: str, at: pytest.MonkeyPatch
) -> None:
    # The file fits as it is; with the events the fence adds to its chain it would not.
    entries = archive.read(plain)
    assert largest_entry(plain) == len(entries["audit.jsonl"])
    at.setattr(archive, "MAX_ENTRY_BYTES", len(entries["audit.jsonl"]) + 16)


def _file_too_large(plain: bytes, raw: RawStore, mission: str, at: pytest.MonkeyPatch) -> None:
    at.setattr(archive, "MAX_FILE_BYTES", len(plain) - 1)


def _books_edited(plain: bytes, raw: RawStore, mission: str, at: pytest.MonkeyPatch) -> None:
    [row] = raw.rows("SELECT books FROM missions WHERE id = ?", mission)
    books = json.loads(row["books"])
    books["usd"][1:4:2] = [books["usd"][1] - 1, books["usd"][3] + 1]  # available, spent
    raw.execute("UPDATE missions SET books = ? WHERE id = ?", json.dumps(books), mission)


def _chain_edited(plain: bytes, raw: RawStore, mission: str, at: pytest.MonkeyPatch) -> None:
    raw.execute(
        "UPDATE audit_events SET actor = 'mallory' WHERE mission_id = ? AND seq = 2", mission
    )


#: How each refusal is brought about (from the mission's plain snapshot, in the
#: store, or in the one set of bounds), the error and the import's problem.
REFUSALS: dict[str, tuple[Cause, type, str | None]] = {
    "an entry over the bound": (_entry_too_large, charter.errors.ExportRefused, "too_large"),
    "an entry the fence would push over": (
        _too_large_once_fenced,
        charter.errors.ExportRefused,
        "too_large",
    ),
    "a file over the bound": (_file_too_large, charter.errors.ExportRefused, "too_large"),
    "books that do not add up": (_books_edited, charter.errors.ExportRefused, "ledger"),
    "a chain that does not verify": (_chain_edited, charter.AuditError, None),
}


@pytest.mark.parametrize("refusal", list(REFUSALS))
def test_S5_an_export_the_import_would_refuse_fences_nothing(
    make_engine: MakeEngine,
    creds: Creds,
    key: str,
    target: charter.Engine,
    raw: RawStore,
    monkeypatch: pytest.MonkeyPatch,
    refusal: str,
) -> None:
    """Broken S5 looked like this: the export fenced and sealed the source, then
    built a file the target refused (one large answer was enough), leaving the
    mission sealed here and refused there, with only `adopt` to unseal it. The
    export must find out first, with the import's own checks and bounds, and
    change nothing: no epoch, no seal, no event."""
    source = make_engine(signing_key=key)
    mission, ex = working_mission(source, creds)
    who = Principals(creds[0], creds[1], source)
    plain = source.export_snapshot(mission)
    cause, error, problem = REFUSALS[refusal]
    cause(plain, raw, mission, monkeypatch)
    to = target.store_id()
    before = raw.dump()

    with pytest.raises(error) as refused:
        source.export_snapshot(mission, handover_to=to, by=who.alice)

    if problem is not None:
        assert refused.value.details["problem"] == problem, refused.value.message
        assert refused.value.details["fenced"] is False
        assert "nothing was fenced" in refused.value.message
    assert raw.dump() == before  # no epoch, no status, no seal, no event
    run = source.run(ex.run_id)
    assert (run.status.value, run.epoch) == ("active", 1)
    assert source.handoff(mission_id=mission)["source"]["sealed"] is None
    # The executor still owns its run here: the mission goes on.
    system = RecordingAdapter()
    assert ex.perform(system, "read", {"q": 1}, effect_key="on").status.value == "succeeded"


def test_S5_export_and_import_hold_a_snapshot_to_one_set_of_bounds(
    make_engine: MakeEngine,
    creds: Creds,
    key: str,
    target: charter.Engine,
    monkeypatch: pytest.MonkeyPatch,
) -> None:
    """The bounds live in one place: lowered there, the same file is refused by
    the import and not made by the export, with the same problem."""
    source = make_engine(signing_key=key)
    mission, _ = working_mission(source, creds)
    plain = source.export_snapshot(mission)
    monkeypatch.setattr(archive, "MAX_ENTRY_BYTES", largest_entry(plain) - 1)
    with pytest.raises(charter.SnapshotMalformed) as imported:
        target.import_snapshot(plain)
    with pytest.raises(charter.errors.ExportRefused) as exported:
        source.export_snapshot(mission)
    assert imported.value.details["problem"] == exported.value.details["problem"] == "too_large"
    with pytest.raises(charter.NotFound):
        target.mission(mission)
