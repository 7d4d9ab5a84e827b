"""Reading what a run's nodes recorded: ``Engine.node_executions`` and
``Engine.journal`` (N1, A6, N4), on every store."""

from __future__ import annotations

import dataclasses
import hashlib
import json
from datetime import UTC, datetime
from typing import Any

import pytest

import charter
from charter.clock import MICROS
from charter.testing import ManualClock, RecordingAdapter
from conftest import Principals, stored


def _journaling_run(
    engine: charter.Engine, mission: str, who: Principals, adapter: RecordingAdapter
) -> tuple[str, dict[str, Any]]:
    """``pick`` fails its check once, then passes; ``stamp`` journals one value of each kind."""

    @charter.node(check=lambda result: result["execution"] == 2, retries=1)
    def pick(ctx: charter.Context, value: Any) -> dict[str, Any]:
        return {"execution": ctx.execution, "sent": ctx.attempt(adapter, "read", {"q": 1})}

    @charter.node
    def stamp(ctx: charter.Context, value: Any) -> dict[str, Any]:
        return {"now": ctx.now().isoformat(), "random": ctx.random(), "uuid": ctx.uuid()}

    ex = engine.start_run(mission, by=who.agent, segment_id="seg-1")
    return ex.run_id, ex.execute(charter.Plan("journaled", (pick, stamp)))


def test_N1_node_executions_read_every_execution_with_its_checked_result_and_hash(
    engine: charter.Engine,
    mission: str,
    who: Principals,
    adapter: RecordingAdapter,
    clock: ManualClock,
) -> None:
    run_id, result = _journaling_run(engine, mission, who, adapter)

    now = clock.now_us()
    first, second, stamp = engine.node_executions(run_id)
    assert first.error is not None and "failed its check" in first.error
    assert dataclasses.replace(first, error=None) == charter.NodeExecution(
        run_id=run_id,
        node_id="pick",
        execution=1,
        status="failed",
        result=None,
        result_hash=None,
        error=None,
        started_epoch=1,
        crashes=0,
        started_at_us=now,
        completed_at_us=None,
        inherited_run=None,
        inherited_execution=None,
    )
    assert (second.node_id, second.execution, second.status) == ("pick", 2, "completed")
    assert second.error is None
    assert second.completed_at_us == now
    assert (stamp.node_id, stamp.execution, stamp.status) == ("stamp", 1, "completed")
    assert stamp.result == result
    # The hash is of the stored JSON text of the checked result (N1).
    for done in (second, stamp):
        text = json.dumps(done.result, sort_keys=True, separators=(",", ":"))
        assert done.result_hash == hashlib.sha256(text.encode()).hexdigest()


def test_A6_journal_reads_the_values_a_replay_returns(
    engine: charter.Engine, mission: str, who: Principals, adapter: RecordingAdapter
) -> None:
    run_id, result = _journaling_run(engine, mission, who, adapter)

    entries = engine.journal(run_id)
    assert entries == engine.journal(run_id, "stamp")  # only stamp journaled anything
    assert engine.journal(run_id, "pick") == []
    assert engine.journal(run_id, "no-such-node") == []
    assert [(e.run_id, e.node_id, e.execution, e.seq, e.kind) for e in entries] == [
        (run_id, "stamp", 1, 1, "now"),
        (run_id, "stamp", 1, 2, "random"),
        (run_id, "stamp", 1, 3, "uuid"),
    ]
    now_us, rnd, uid = (e.value for e in entries)
    assert result == {
        "now": datetime.fromtimestamp(now_us / MICROS, tz=UTC).isoformat(),
        "random": rnd,
        "uuid": uid,
    }


def test_N4_a_linked_runs_node_executions_name_the_execution_they_continue(
    engine: charter.Engine, mission: str, who: Principals, adapter: RecordingAdapter
) -> None:
    bug = {"present": True}

    @charter.node
    def done(ctx: charter.Context, value: Any) -> str:
        return "done"

    @charter.node
    def stamp(ctx: charter.Context, value: Any) -> str:
        ctx.uuid()
        if bug["present"]:
            raise charter.NodeFailed("fix me")  # a declared failure ends the run (N6)
        return "stamped"

    plan = charter.Plan("linked", (done, stamp))
    first = engine.start_run(mission, by=who.agent, segment_id="seg-1")
    with pytest.raises(charter.NodeFailed):
        first.execute(plan)
    (failed,) = [n for n in engine.node_executions(first.run_id) if n.node_id == "stamp"]
    assert failed.status == "failed"
    assert failed.error is not None and "fix me" in failed.error

    follow = engine.new_linked_run(first.run_id, reviewed_by=who.alice, segment_id="seg-2")
    carried = engine.node_executions(follow.run_id)
    assert [
        (n.node_id, n.execution, n.status, n.result, n.inherited_run, n.inherited_execution)
        for n in carried
    ] == [
        ("done", 1, "completed", "done", first.run_id, 1),
        ("stamp", 1, "blocked", None, first.run_id, 1),
    ]
    # The unfinished node's journal came along: its replay gets the same values.
    assert [(e.kind, e.value) for e in engine.journal(follow.run_id, "stamp")] == [
        (e.kind, e.value) for e in engine.journal(first.run_id, "stamp")
    ]
    bug["present"] = False
    assert follow.execute(plan) == "stamped"
    assert len(engine.journal(follow.run_id, "stamp")) == 1


def test_reading_the_nodes_or_journal_of_an_unknown_run_is_not_found_and_changes_nothing(
    engine: charter.Engine, mission: str
) -> None:
    before = stored(engine, mission)
    with pytest.raises(charter.NotFound, match="no run 'run-nope'"):
        engine.node_executions("run-nope")
    with pytest.raises(charter.NotFound, match="no run 'run-nope'"):
        engine.journal("run-nope")
    with pytest.raises(charter.NotFound, match="no run 'run-nope'"):
        engine.journal("run-nope", "a-node")
    assert stored(engine, mission) == before
