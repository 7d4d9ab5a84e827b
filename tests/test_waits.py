"""Durable waits beside approvals (W1): human input, timers, named events.

Each kind is shown in one process, then across a real crash: a child process
is killed by SIGKILL with the wait pending, the answer, the timer or the
signal arrives while no process runs the mission, and a fresh process resumes
the run to its end.
"""

from __future__ import annotations

import json
import os
import signal
import subprocess
import sys
import time
from pathlib import Path
from typing import Any

import pytest

import charter
from charter import RunStatus
from charter.testing import ManualClock
from conftest import Principals, default_contract, stored

HERE = Path(__file__).resolve().parent
CHILD_CODE = "import sys, _graph_plans; sys.exit(_graph_plans.main(sys.argv[1:]))"


@pytest.fixture
def mission(engine: charter.Engine, who: Principals) -> str:
    """``bob`` answers questions and signals events; ``mallory`` may do neither."""
    contract = default_contract()
    contract["principals"]["bob"] = {"approve": ["input.*"], "run": ["signal.*"]}
    return engine.create_mission(contract, by=who.alice)


def child(tmp_path: Path, cfg: dict[str, Any], *, killed: bool) -> list[dict[str, Any]]:
    """Run ``_graph_plans.main`` in a fresh process; its JSON lines."""
    path = tmp_path / f"child-{time.monotonic_ns()}.json"
    path.write_text(json.dumps(cfg))
    src = str(Path(charter.__file__).resolve().parent.parent)
    env = {**os.environ, "PYTHONPATH": os.pathsep.join((str(HERE), src))}
    proc = subprocess.run(
        [sys.executable, "-c", CHILD_CODE, str(path)],
        capture_output=True,
        text=True,
        timeout=60,
        env=env,
    )
    want = -signal.SIGKILL if killed else 0
    assert proc.returncode == want, (proc.returncode, proc.stdout, proc.stderr)
    return [json.loads(line) for line in proc.stdout.splitlines()]


@pytest.mark.parametrize(
    ("plan", "kind"),
    [("ask_plan", "input"), ("nap_plan", "timer"), ("hear_plan", "event")],
)
def test_W1_crash_with_each_wait_pending_then_a_fresh_process_resumes_after_it_arrives(
    engine: charter.Engine,
    mission: str,
    who: Principals,
    store_address: str,
    creds: tuple[dict[str, str], dict[str, str]],
    tmp_path: Path,
    plan: str,
    kind: str,
) -> None:
    base = {"store": store_address, "digests": creds[1], "credential": creds[0]["agent"]}
    first = child(
        tmp_path,
        {
            **base,
            "mission_id": mission,
            "plan": f"_graph_plans:{plan}",
            "kill_point": "wait.pending",
        },
        killed=True,
    )
    run_id = first[0]["run_id"]
    (w,) = engine.waits(run_id)
    assert (w.kind.value, w.status.value) == (kind, "pending")
    assert [x["kind"] for x in engine.coordinator.state(run_id).waits] == [kind]

    # A fresh process before anything arrived: the node waits again, nothing else.
    again = child(tmp_path, {**base, "run_id": run_id, "segment_id": "seg-2"}, killed=False)
    assert "blocked" in again[-1]
    assert engine.run(run_id).status is RunStatus.WAITING

    expected: dict[str, Any]
    if kind == "input":
        engine.answer(run_id, "budget", 250, by=who.bob)
        expected = {"budget": 250}
    elif kind == "timer":
        assert w.due_at_us is not None
        time.sleep(max(0.0, w.due_at_us / 1e6 - time.time()) + 0.2)
        expected = {"slept": True}
    else:
        assert engine.signal(run_id, "shipment.arrived", {"crates": 3}, by=who.bob) == [w.id]
        expected = {"heard": {"crates": 3}}

    last = child(tmp_path, {**base, "run_id": run_id}, killed=False)
    assert last[-1] == {"result": expected}
    assert engine.run(run_id).status is RunStatus.COMPLETED
    assert [x.status.value for x in engine.waits(run_id)] == ["consumed"]
    kinds = [e["kind"] for e in engine.audit_events(mission)]
    assert kinds.count("wait.requested") == 1
    assert kinds.count("wait.satisfied") == 1


def test_W1_a_question_answered_in_process_with_a_typed_answer(
    engine: charter.Engine, mission: str, who: Principals, clock: ManualClock
) -> None:
    from _graph_plans import ask_plan

    ex = engine.start_run(mission, by=who.agent, segment_id="seg-1", plan=ask_plan)
    with pytest.raises(charter.WaitPending):
        ex.execute(ask_plan)
    assert engine.run(ex.run_id).status is RunStatus.WAITING
    assert engine.due() == []

    before = stored(engine, mission)
    with pytest.raises(charter.WaitError, match="asks for a int answer"):
        engine.answer(ex.run_id, "budget", "lots", by=who.alice)
    with pytest.raises(charter.WaitError, match="asks for a int answer"):
        engine.answer(ex.run_id, "budget", True, by=who.alice)
    with pytest.raises(charter.NotAuthorized):
        engine.answer(ex.run_id, "budget", 5, by=who.mallory)
    with pytest.raises(charter.NotFound):
        engine.answer(ex.run_id, "nope", 5, by=who.alice)
    assert stored(engine, mission) == before
    assert [w.status.value for w in engine.waits(ex.run_id)] == ["pending"]

    engine.answer(ex.run_id, "budget", 90, by=who.alice)
    with pytest.raises(charter.WaitError, match="already"):
        engine.answer(ex.run_id, "budget", 91, by=who.alice)
    assert [d["run_id"] for d in engine.due() if d["ready"]] == [ex.run_id]
    ex2 = engine.coordinator.resume(ex.run_id, "seg-1", by=who.agent)
    assert ex2.execute() == {"budget": 90}
    assert engine.due() == []


def test_W1_a_timer_is_due_by_the_store_clock_and_a_signal_nobody_waits_for_is_refused(
    engine: charter.Engine, mission: str, who: Principals, clock: ManualClock
) -> None:
    from _graph_plans import hear_plan, nap_plan

    ex = engine.start_run(mission, by=who.agent, segment_id="seg-1", plan=nap_plan)
    with pytest.raises(charter.WaitPending):
        ex.execute(nap_plan)
    (due,) = engine.due()
    assert due["ready"] is False
    clock.advance(2.1)
    assert engine.due()[0]["ready"] is True
    resumed = engine.coordinator.resume(ex.run_id, "seg-1", by=who.agent)
    assert resumed.execute() == {"slept": True}

    run2 = engine.start_run(mission, by=who.agent, segment_id="seg-9", plan=hear_plan)
    before = stored(engine, mission)
    with pytest.raises(charter.WaitError, match="no wait"):
        engine.signal(run2.run_id, "shipment.arrived", {}, by=who.bob)
    assert stored(engine, mission) == before
