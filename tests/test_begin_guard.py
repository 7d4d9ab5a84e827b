"""A submitted run is begun once: a second begin takes nothing from its owner (K1, F1).

Two workers can both take the same queued run (the first one's hold on it
lapsed before it began it); the queue only says when to look. Whoever begins
it second must get nothing: the run's owner, its epoch and its claim stay the
first worker's, and the first worker's executor goes on sending. Each test
reads the run's row and its segments as stored, and what the adapter received.
"""

from __future__ import annotations

from collections.abc import Callable
from typing import Any

import pytest

import _worker_plans as plans
import charter
from _raw import RawStore
from charter.runs.model import RunStatus
from charter.testing import ManualClock, RecordingAdapter
from conftest import Principals, default_contract

MakeEngine = Callable[..., charter.Engine]
Creds = tuple[dict[str, str], dict[str, str]]
PAY = plans.PAY.ref or ""


@pytest.fixture
def engine(make_engine: MakeEngine) -> charter.Engine:
    return make_engine(lease_seconds=30.0)


def owner(raw: RawStore, run_id: str) -> dict[str, Any]:
    """The run's ownership as stored: status, epoch, segment, claim, lease."""
    [row] = raw.rows(
        "SELECT status, epoch, owner_segment, owner_claim, lease_expires_us FROM runs WHERE id = ?",
        run_id,
    )
    return dict(row)


def segments(raw: RawStore, run_id: str) -> list[tuple[str, int]]:
    rows = raw.rows("SELECT segment_id, epoch FROM segments WHERE run_id = ?", run_id)
    return sorted((r["segment_id"], int(r["epoch"])) for r in rows)


def started(engine: charter.Engine, mission: str) -> list[dict[str, Any]]:
    return [e for e in engine.audit_events(mission) if e["kind"] == "run.started"]


def test_K1_F1_item22_a_second_worker_that_took_the_same_run_cannot_begin_it_again(
    engine: charter.Engine,
    who: Principals,
    raw: RawStore,
    clock: ManualClock,
    adapter: RecordingAdapter,
) -> None:
    mission = engine.create_mission(default_contract(), by=who.alice)
    run = engine.submit(mission, by=who.agent, plan=PAY)
    take = {"queues": ["default"], "plans": [PAY], "limit": 1, "hold_seconds": 1.0}
    assert engine.take_runs(token="first", **take) == [run.id]
    clock.advance(2.0)  # the first worker's hold lapsed before it began the run
    assert engine.take_runs(token="second", **take) == [run.id]

    first = engine.begin(run.id, "first-seg")
    assert first is not None
    held = owner(raw, run.id)
    assert (held["status"], held["epoch"], held["owner_segment"]) == ("active", 1, "first-seg")
    assert held["owner_claim"]

    assert engine.begin(run.id, "second-seg") is None

    assert owner(raw, run.id) == held
    assert segments(raw, run.id) == [("first-seg", 1)]
    assert [e["segment"] for e in started(engine, mission)] == ["first-seg"]
    sent = first.perform(adapter, "write", {"n": 1}, effect_key="after-the-second-begin")
    assert sent.status is charter.AttemptStatus.SUCCEEDED
    assert [(s.run_id, s.epoch) for s in adapter.sent] == [(run.id, 1)]


def test_K1_F1_item22_a_submitted_run_stopped_before_any_worker_began_it_is_never_begun(
    engine: charter.Engine, who: Principals, raw: RawStore
) -> None:
    mission = engine.create_mission(default_contract(), by=who.alice)
    run = engine.submit(mission, by=who.agent, plan=PAY)
    assert engine.stop_run(run.id, by=who.alice).status is RunStatus.STOPPED
    stopped = owner(raw, run.id)

    assert engine.begin(run.id, "late-seg") is None

    assert owner(raw, run.id) == stopped
    assert (stopped["status"], stopped["epoch"], stopped["owner_claim"]) == ("stopped", 0, None)
    assert segments(raw, run.id) == []
    assert started(engine, mission) == []


def test_K1_F1_item22_a_late_begin_of_a_run_taken_over_leaves_its_new_owner_and_epoch(
    engine: charter.Engine, who: Principals, raw: RawStore, clock: ManualClock
) -> None:
    mission = engine.create_mission(default_contract(), by=who.alice)
    run = engine.submit(mission, by=who.agent, plan=PAY)
    assert engine.begin(run.id, "first-seg") is not None
    clock.advance(31.0)  # the first worker died: its lease ended
    engine.coordinator.recover(run.id, "new-seg")
    taken = owner(raw, run.id)
    assert (taken["epoch"], taken["owner_segment"]) == (2, "new-seg")

    assert engine.begin(run.id, "late-seg") is None

    assert owner(raw, run.id) == taken
    assert segments(raw, run.id) == [("first-seg", 1), ("new-seg", 2)]
