"""Nodes, replay and node recovery (A4, A6, N1, R5, R6), on a real store.

Crash tests kill a real child process (``_node_plans.py``) with SIGKILL in the
middle of a node, then recover and replay the run in this process. The target
is a file, so what was really sent can be counted across processes; the child
opens the test's store, on either backend. This
process's clock runs a day ahead of the real one, so the child's lease has
always expired by the time it is recovered here.
"""

from __future__ import annotations

import asyncio
import hashlib
import json
import os
import signal
import subprocess
import sys
import threading
from collections import Counter
from collections.abc import Callable
from dataclasses import dataclass, field
from datetime import UTC, datetime
from pathlib import Path
from typing import Any

import pytest

import _node_plans as plans
import charter
from _raw import RawStore
from charter import AttemptStatus, RunStatus
from charter.adapters import Dispatch, Outcome
from charter.clock import MICROS, SystemClock
from charter.recovery.state import NEXT_ACTIONS
from charter.testing import ManualClock, RecordingAdapter
from conftest import Principals, default_contract

HERE = Path(__file__).resolve().parent
CHILD_CODE = "import sys, _node_plans; sys.exit(_node_plans.main(sys.argv[1:]))"
CHILD_TIMEOUT = 60.0
GATE_SECONDS = 1.0


# -- fixtures --------------------------------------------------------------------------


@pytest.fixture
def clock() -> ManualClock:
    """A day ahead of the real clock: every lease a child took has expired here."""
    return ManualClock(SystemClock().now_us() + 86_400 * MICROS)


@pytest.fixture
def workdir(tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> Path:
    path = tmp_path / "work"
    path.mkdir()
    monkeypatch.setenv(plans.DIR_ENV, str(path))
    return path


def node_contract(**overrides: Any) -> dict[str, Any]:
    contract = default_contract(**overrides)
    contract["principals"] = {
        **contract["principals"],
        "agent": {"run": ["recorder.*", "outbox.*"]},
    }
    return contract


@pytest.fixture
def new_mission(engine: charter.Engine, who: Principals) -> Callable[..., str]:
    def make(**overrides: Any) -> str:
        return engine.create_mission(node_contract(**overrides), by=who.alice)

    return make


@dataclass
class Children:
    """Starts child processes on the test's store and expects each to die by SIGKILL."""

    store: str
    credential: str
    digests: dict[str, str]
    workdir: Path
    started: int = 0

    def run(
        self,
        *,
        segment_id: str,
        mission_id: str | None = None,
        plan: str | None = None,
        run_id: str | None = None,
        kill_point: str | None = None,
        kill_skip: int = 0,
        die_in: tuple[str, ...] = (),
        link_from: str | None = None,
        reviewer: str | None = None,
    ) -> str:
        """Run a child to its death; return the run it owned. With ``link_from``
        the child starts a linked run after that one, reviewed by ``reviewer``
        (a credential)."""
        self.started += 1
        config = self.workdir.parent / f"child-{self.started}.json"
        config.write_text(
            json.dumps(
                {
                    "store": self.store,
                    "digests": self.digests,
                    "credential": self.credential,
                    "mission_id": mission_id,
                    "plan": plan,
                    "input": {"start": True},
                    "run_id": run_id,
                    "segment_id": segment_id,
                    "kill_point": kill_point,
                    "kill_skip": kill_skip,
                    "die_in": list(die_in),
                    "link_from": link_from,
                    "reviewer": reviewer,
                }
            )
        )
        src = str(Path(charter.__file__).resolve().parent.parent)
        env = {
            **os.environ,
            "PYTHONPATH": os.pathsep.join((str(HERE), src)),
            plans.DIR_ENV: str(self.workdir),
        }
        proc = subprocess.run(
            [sys.executable, "-c", CHILD_CODE, str(config)],
            capture_output=True,
            text=True,
            timeout=CHILD_TIMEOUT,
            env=env,
        )
        assert proc.returncode == -signal.SIGKILL, (proc.returncode, proc.stdout, proc.stderr)
        reports = [json.loads(line) for line in proc.stdout.splitlines()]
        assert len(reports) == 1, proc.stdout
        return str(reports[0]["run_id"])


@pytest.fixture
def children(
    store_address: str, creds: tuple[dict[str, str], dict[str, str]], workdir: Path
) -> Children:
    return Children(store_address, creds[0]["agent"], creds[1], workdir)


# -- reading the store -------------------------------------------------------------------


def node_states(engine: charter.Engine, run_id: str) -> list[tuple[str, int, str]]:
    return [(n.node_id, n.execution, n.status) for n in engine.node_executions(run_id)]


def journal(engine: charter.Engine, run_id: str, node_id: str) -> list[tuple[int, int, str, Any]]:
    return [(j.execution, j.seq, j.kind, j.value) for j in engine.journal(run_id, node_id)]


def outbox() -> list[dict[str, Any]]:
    return [json.loads(line) for line in plans.lines("outbox.jsonl")]


def side() -> list[str]:
    return plans.lines("side.txt")


def attempts_of(engine: charter.Engine, run_id: str) -> list[charter.Attempt]:
    return sorted(
        engine.attempts(run_id=run_id), key=lambda a: (a.node_id, a.execution, a.effect_key)
    )


def assert_one_send_per_attempt(engine: charter.Engine, run_id: str) -> None:
    """Every attempt reached the target exactly once, and nothing else did."""
    keys = Counter(m["key"] for m in outbox())
    assert keys == Counter(a.idempotency_key for a in engine.attempts(run_id=run_id))
    assert set(keys.values()) == {1}


# -- A6: replay after a real crash ---------------------------------------------------------


def test_A6_sigkill_mid_node_replays_from_first_line_in_the_same_execution(
    engine: charter.Engine,
    who: Principals,
    new_mission: Callable[..., str],
    children: Children,
) -> None:
    run_id = children.run(
        segment_id="seg-1",
        mission_id=new_mission(),
        plan="_node_plans:replay_plan",
        die_in=("replay",),
    )
    # The child died inside the node, after its first effect settled and its
    # journaled values were taken, before its second effect.
    (first,) = attempts_of(engine, run_id)
    assert first.status is AttemptStatus.SUCCEEDED
    assert side() == ["replay"]
    assert len(outbox()) == 1
    recorded = journal(engine, run_id, "replay")
    assert [(execution, kind) for execution, _, kind, _ in recorded] == [
        (1, "now"),
        (1, "random"),
        (1, "uuid"),
    ]
    assert node_states(engine, run_id) == [("replay", 1, "running")]

    coordinator = engine.coordinator
    coordinator.recover(run_id, "seg-2")
    result = coordinator.resume(run_id, "seg-2", by=who.agent).execute()

    # Bare code ran again from the node's first line ...
    assert side() == ["replay", "replay"]
    # ... but the settled effect was not sent again: one send per effect.
    attempts = attempts_of(engine, run_id)
    assert [(a.node_id, a.effect_key, a.status) for a in attempts] == [
        ("finish", "#1", AttemptStatus.SUCCEEDED),
        ("replay", "#1", AttemptStatus.SUCCEEDED),
        ("replay", "#2", AttemptStatus.SUCCEEDED),
    ]
    assert attempts[1].id == first.id
    assert_one_send_per_attempt(engine, run_id)
    assert Counter(json.dumps(m["request"], sort_keys=True) for m in outbox()) == Counter(
        json.dumps({"effect": e}) for e in ("first", "second", "third")
    )
    # The settled attempt returned its recorded result; the values journaled
    # by the dead process came back unchanged (this process's clock and
    # randomness differ from the child's).
    assert result["first"] == first.result
    assert result["second"] == attempts[2].result
    assert result["third"] == attempts[0].result  # the async node ran
    now_us, rnd, uid = (value for _, _, _, value in recorded)
    assert result["now"] == datetime.fromtimestamp(now_us / MICROS, tz=UTC).isoformat()
    assert result["random"] == rnd
    assert result["uuid"] == uid
    assert journal(engine, run_id, "replay") == recorded
    # A node re-run after a crash replays the same execution.
    assert node_states(engine, run_id) == [
        ("finish", 1, "completed"),
        ("replay", 1, "completed"),
    ]
    assert {(a.node_id, a.execution) for a in attempts} == {("finish", 1), ("replay", 1)}
    assert engine.run(run_id).status is RunStatus.COMPLETED


def test_A6_sigkill_before_completion_replays_recorded_results_and_sends_nothing_again(
    engine: charter.Engine,
    who: Principals,
    new_mission: Callable[..., str],
    children: Children,
) -> None:
    run_id = children.run(
        segment_id="seg-1",
        mission_id=new_mission(),
        plan="_node_plans:replay_plan",
        kill_point="node.completed.before",
    )
    before = {a.effect_key: a for a in attempts_of(engine, run_id)}
    assert set(before) == {"#1", "#2"}
    assert all(a.status is AttemptStatus.SUCCEEDED for a in before.values())
    assert len(outbox()) == 2

    engine.coordinator.recover(run_id, "seg-2")
    result = engine.coordinator.resume(run_id, "seg-2", by=who.agent).execute()

    assert side() == ["replay", "replay"]
    assert result["first"] == before["#1"].result
    assert result["second"] == before["#2"].result
    replay_attempts = [a for a in attempts_of(engine, run_id) if a.node_id == "replay"]
    assert [a.id for a in replay_attempts] == [before["#1"].id, before["#2"].id]
    assert len(outbox()) == 3  # the two replayed effects once, the next node's once
    assert_one_send_per_attempt(engine, run_id)
    assert node_states(engine, run_id) == [
        ("finish", 1, "completed"),
        ("replay", 1, "completed"),
    ]


def test_A6_replayed_request_that_differs_is_non_determinism_and_nothing_is_sent(
    engine: charter.Engine,
    who: Principals,
    new_mission: Callable[..., str],
    children: Children,
) -> None:
    run_id = children.run(
        segment_id="seg-1",
        mission_id=new_mission(),
        plan="_node_plans:drift_plan",
        kill_point="node.completed.before",
    )
    (recorded,) = attempts_of(engine, run_id)
    sent_before = outbox()

    engine.coordinator.recover(run_id, "seg-2")
    ex = engine.coordinator.resume(run_id, "seg-2", by=who.agent)
    with pytest.raises(charter.NonDeterminismError) as raised:
        ex.execute()

    assert raised.value.details["attempt_id"] == recorded.id
    assert raised.value.details["recorded_hash"] == recorded.request_hash
    assert raised.value.details["replayed_hash"] != recorded.request_hash
    assert engine.run(run_id).status is RunStatus.NEEDS_INTERVENTION
    assert [a.id for a in attempts_of(engine, run_id)] == [recorded.id]
    assert outbox() == sent_before
    assert node_states(engine, run_id) == [("drift", 1, "blocked")]
    # R9: no resume clears it; a person has to intervene (stop, and a reviewed new run).
    with pytest.raises(charter.NeedsIntervention):
        engine.coordinator.resume(run_id, "seg-2", by=who.agent)
    assert engine.run(run_id).status is RunStatus.NEEDS_INTERVENTION


def test_A6_replayed_journal_value_of_another_kind_is_non_determinism_and_needs_intervention(
    engine: charter.Engine,
    who: Principals,
    new_mission: Callable[..., str],
    children: Children,
) -> None:
    run_id = children.run(
        segment_id="seg-1",
        mission_id=new_mission(),
        plan="_node_plans:wobble_plan",
        kill_point="node.completed.before",
    )
    recorded = journal(engine, run_id, "wobble")
    assert [kind for _, _, kind, _ in recorded] == ["now"]

    engine.coordinator.recover(run_id, "seg-2")
    ex = engine.coordinator.resume(run_id, "seg-2", by=who.agent)
    with pytest.raises(charter.NonDeterminismError):
        ex.execute()

    assert journal(engine, run_id, "wobble") == recorded
    assert node_states(engine, run_id) == [("wobble", 1, "blocked")]
    assert engine.run(run_id).status is RunStatus.NEEDS_INTERVENTION


def test_A6_unknown_attempt_blocks_replayed_node_until_a_person_resolves_it(
    engine: charter.Engine,
    who: Principals,
    new_mission: Callable[..., str],
    children: Children,
) -> None:
    mission = new_mission()
    run_id = children.run(
        segment_id="seg-1",
        mission_id=mission,
        plan="_node_plans:pay_plan",
        kill_point="settlement.before",
    )
    assert len(outbox()) == 1  # the target got it; the outcome was never recorded

    state, unresolved = engine.coordinator.recover(run_id, "seg-2")
    (uncertain,) = attempts_of(engine, run_id)
    assert unresolved == [uncertain.id]
    assert uncertain.status is AttemptStatus.UNKNOWN
    assert engine.run(run_id).status is RunStatus.NEEDS_INTERVENTION
    with pytest.raises(charter.NeedsIntervention):
        engine.coordinator.resume(run_id, "seg-2", by=who.agent)

    # Even the recovered owner, executing anyway, cannot get past it: the
    # replayed node blocks on the unresolved attempt and sends nothing.
    owner = charter.Executor(
        engine._runtime,
        run_id=run_id,
        mission_id=mission,
        segment_id="seg-2",
        epoch=state.epoch,
        principal="agent",
        lease_expires_us=state.run.lease_expires_us,
    )
    with pytest.raises(charter.Blocked) as blocked:
        owner.execute()
    assert blocked.value.attempt_id == uncertain.id
    assert engine.get_attempt(uncertain.id).status is AttemptStatus.UNKNOWN
    assert [a.id for a in attempts_of(engine, run_id)] == [uncertain.id]
    assert len(outbox()) == 1
    assert engine.run(run_id).status is RunStatus.NEEDS_INTERVENTION
    assert node_states(engine, run_id) == [("pay", 1, "blocked")]

    # A person settles it; the replay then returns the settled result.
    engine.coordinator.resolve(
        uncertain.id,
        by=who.alice,
        outcome="succeeded",
        evidence={"outbox_line": 1},
        cost={"calls": 1},
        result={"line": 1},
    )
    result = engine.coordinator.resume(run_id, "seg-2", by=who.agent).execute()
    assert result == {"paid": {"line": 1}}
    assert len(outbox()) == 1
    assert side() == ["pay", "pay", "pay"]
    assert node_states(engine, run_id) == [("pay", 1, "completed")]
    assert engine.run(run_id).status is RunStatus.COMPLETED


# -- A6: in one process ----------------------------------------------------------------------


def test_A6_unknown_attempt_blocks_the_node_and_the_run_needs_intervention(
    engine: charter.Engine, mission: str, who: Principals
) -> None:
    def lost(send: Dispatch) -> Outcome:
        raise TimeoutError("no answer")

    target = RecordingAdapter(script={"write": lost})

    @charter.node
    def send(ctx: charter.Context, value: Any) -> Any:
        return ctx.attempt(target, "write", {"n": 1})

    @charter.node
    def after(ctx: charter.Context, value: Any) -> Any:
        return ctx.attempt(target, "write", {"n": 2})

    ex = engine.start_run(mission, by=who.agent, segment_id="seg-1")
    with pytest.raises(charter.Blocked) as blocked:
        ex.execute(charter.Plan("lost", (send, after)))

    (attempt,) = engine.attempts(run_id=ex.run_id)
    assert attempt.status is AttemptStatus.UNKNOWN
    assert blocked.value.attempt_id == attempt.id
    assert len(target.sent) == 1
    assert engine.run(ex.run_id).status is RunStatus.NEEDS_INTERVENTION
    assert node_states(engine, ex.run_id) == [("send", 1, "blocked")]


def test_A4_A7_a_read_whose_lost_answer_a_person_wrote_off_is_read_again_on_replay(
    engine: charter.Engine, mission: str, who: Principals
) -> None:
    """Found by sweeping an agent loop: a read-only call's answer was lost, an
    operator wrote it off (the only settlement a read with no lookup has), and
    the replayed node failed on the write-off although reading again has no
    effect anywhere. A read-only effect written off is read again as a new
    attempt, under the operation's retry policy (A7), and the node goes on."""
    answers = [TimeoutError("no answer")]

    def flaky(send: Dispatch) -> Outcome:
        if answers:
            raise answers.pop()
        return Outcome.succeeded(result={"text": "hello"}, cost={"usd": 1})

    model = RecordingAdapter(script={"read": flaky})

    @charter.node
    def ask(ctx: charter.Context, value: Any) -> Any:
        return ctx.attempt(model, "read", {"prompt": "hi"}, key="ask")["text"]

    plan = charter.Plan("ask", (ask,))
    ex = engine.start_run(mission, by=who.agent, segment_id="seg-1", plan=plan)
    with pytest.raises(charter.Blocked):
        ex.execute(plan)
    (lost,) = engine.attempts(run_id=ex.run_id)
    engine.coordinator.resolve(
        lost.id, by=who.alice, outcome="written_off", evidence="the answer was lost"
    )

    assert engine.coordinator.resume(ex.run_id, "seg-1", by=who.agent).execute(plan) == "hello"
    assert engine.run(ex.run_id).status is RunStatus.COMPLETED
    first, second = sorted(engine.attempts(run_id=ex.run_id), key=lambda a: a.generation)
    assert (first.status, second.status) == (AttemptStatus.WRITTEN_OFF, AttemptStatus.SUCCEEDED)
    assert (second.retry_of, second.generation) == (first.id, 2)
    assert len(model.sent) == 2
    assert engine.check_ledger(mission) == []


@dataclass
class GateAdapter(RecordingAdapter):
    """A recorder whose sends wait (bounded) for a second concurrent send."""

    gate: threading.Barrier = field(
        default_factory=lambda: threading.Barrier(2, timeout=GATE_SECONDS)
    )
    met: list[bool] = field(default_factory=list)

    def dispatch(self, send: Dispatch) -> Outcome:
        try:
            self.gate.wait()
            self.met.append(True)
        except threading.BrokenBarrierError:
            self.met.append(False)
        return super().dispatch(send)


def test_A6_concurrent_unkeyed_calls_are_refused(
    engine: charter.Engine, mission: str, who: Principals
) -> None:
    target = GateAdapter()

    @charter.node
    async def fan_out(ctx: charter.Context, value: Any) -> dict[str, int]:
        results = await asyncio.gather(
            ctx.aattempt(target, "write", {"n": 1}),
            ctx.aattempt(target, "write", {"n": 2}),
            return_exceptions=True,
        )
        refused = sum(isinstance(r, charter.StateError) for r in results)
        return {"refused": refused, "ok": sum(isinstance(r, dict) for r in results)}

    ex = engine.start_run(mission, by=who.agent, segment_id="seg-1")
    assert ex.execute(charter.Plan("fan", (fan_out,))) == {"refused": 1, "ok": 1}

    (attempt,) = engine.attempts(run_id=ex.run_id)
    assert attempt.effect_key == "#1"
    assert [s.attempt_id for s in target.sent] == [attempt.id]
    assert target.met == [False]  # the refused call never reached the target


def test_A6_concurrent_keyed_calls_run_concurrently_in_an_async_node(
    engine: charter.Engine, mission: str, who: Principals
) -> None:
    target = GateAdapter()

    @charter.node
    async def fan_out(ctx: charter.Context, value: Any) -> list[Any]:
        await asyncio.sleep(0)
        return list(
            await asyncio.gather(
                ctx.aattempt(target, "write", {"n": 1}, key="a"),
                ctx.aattempt(target, "write", {"n": 2}, key="b"),
            )
        )

    ex = engine.start_run(mission, by=who.agent, segment_id="seg-1")
    result = ex.execute(charter.Plan("fan", (fan_out,)))

    attempts = {a.effect_key: a for a in engine.attempts(run_id=ex.run_id)}
    assert set(attempts) == {"k:a", "k:b"}
    assert all(a.status is AttemptStatus.SUCCEEDED for a in attempts.values())
    assert result == [attempts["k:a"].result, attempts["k:b"].result]
    assert target.met == [True, True]  # both sends were in flight at once
    assert sorted(s.attempt_id for s in target.sent) == sorted(a.id for a in attempts.values())
    assert node_states(engine, ex.run_id) == [("fan_out", 1, "completed")]
    assert engine.run(ex.run_id).status is RunStatus.COMPLETED


# -- N1: checked results -----------------------------------------------------------------------


def test_N1_failing_check_retries_as_new_executions_until_it_passes(
    engine: charter.Engine, mission: str, who: Principals, adapter: RecordingAdapter
) -> None:
    checked: list[Any] = []

    def passes(result: Any) -> bool:
        checked.append(result)
        return bool(result["execution"] >= 3)

    @charter.node(check=passes, retries=2)
    def draft(ctx: charter.Context, value: Any) -> dict[str, int]:
        return {"execution": ctx.execution}

    ex = engine.start_run(mission, by=who.agent, segment_id="seg-1")
    assert ex.execute(charter.Plan("draft", (draft,))) == {"execution": 3}

    assert checked == [{"execution": 1}, {"execution": 2}, {"execution": 3}]
    rows = engine.node_executions(ex.run_id)
    assert [(r.execution, r.status) for r in rows] == [
        (1, "failed"),
        (2, "failed"),
        (3, "completed"),
    ]
    assert [r.result_hash for r in rows[:2]] == [None, None]
    assert [r.result for r in rows] == [None, None, {"execution": 3}]
    assert engine.run(ex.run_id).status is RunStatus.COMPLETED


def test_N1_exhausted_retries_fail_the_node_and_nothing_downstream_runs(
    engine: charter.Engine, mission: str, who: Principals, adapter: RecordingAdapter
) -> None:
    downstream: list[Any] = []

    @charter.node(check=lambda result: False, retries=2)
    def draft(ctx: charter.Context, value: Any) -> Any:
        # A draft only reads (a model call): a node retry may run it again (A4).
        return ctx.attempt(adapter, "read", {"execution": ctx.execution})

    @charter.node
    def publish(ctx: charter.Context, value: Any) -> Any:
        downstream.append(value)
        return ctx.attempt(adapter, "write", {"publish": value})

    ex = engine.start_run(mission, by=who.agent, segment_id="seg-1")
    with pytest.raises(Exception):  # noqa: B017 - the node's failure, whatever its type
        ex.execute(charter.Plan("draft", (draft, publish)))

    assert node_states(engine, ex.run_id) == [
        ("draft", 1, "failed"),
        ("draft", 2, "failed"),
        ("draft", 3, "failed"),
    ]
    assert all(r.result_hash is None for r in engine.node_executions(ex.run_id))
    assert downstream == []
    assert [s.request for s in adapter.sent] == [
        {"execution": 1},
        {"execution": 2},
        {"execution": 3},
    ]
    assert {a.node_id for a in engine.attempts(run_id=ex.run_id)} == {"draft"}
    # Retries exhausted and nothing in flight: the run fails, and no resume re-runs it.
    assert engine.run(ex.run_id).status is RunStatus.FAILED
    with pytest.raises(charter.RunTerminal):
        engine.coordinator.resume(ex.run_id, ex.segment_id, by=who.agent)
    assert len(node_states(engine, ex.run_id)) == 3


def test_N1_checked_result_and_its_hash_are_stored_before_the_next_node_starts(
    engine: charter.Engine,
    make_engine: Callable[..., charter.Engine],
    mission: str,
    who: Principals,
) -> None:
    other = make_engine()
    seen: list[charter.NodeExecution] = []

    @charter.node(check=lambda result: result["total"] == 6)
    def produce(ctx: charter.Context, value: Any) -> dict[str, Any]:
        return {"total": sum(value["items"]), "items": value["items"]}

    @charter.node
    def consume(ctx: charter.Context, value: dict[str, Any]) -> dict[str, Any]:
        # What the store holds, read by another connection, as this node starts.
        seen.extend(r for r in other.node_executions(ctx.run_id) if r.node_id == "produce")
        return {"consumed": value["total"]}

    ex = engine.start_run(mission, by=who.agent, segment_id="seg-1")
    assert ex.execute(charter.Plan("handoff", (produce, consume)), {"items": [1, 2, 3]}) == {
        "consumed": 6
    }

    (row,) = seen
    assert row.status == "completed"
    assert row.execution == 1
    assert row.result == {"total": 6, "items": [1, 2, 3]}
    stored_text = json.dumps(row.result, sort_keys=True, separators=(",", ":"))
    assert row.result_hash == hashlib.sha256(stored_text.encode()).hexdigest()


def _tampered_handoff(
    engine: charter.Engine,
    who: Principals,
    new_mission: Callable[..., str],
    children: Children,
    raw: RawStore,
) -> tuple[str, str]:
    """Crash right after ``produce`` completed, edit its stored result, replay."""
    mission = new_mission()
    run_id = children.run(
        segment_id="seg-1",
        mission_id=mission,
        plan="_node_plans:handoff_plan",
        kill_point="node.completed.after",
    )
    assert node_states(engine, run_id) == [("produce", 1, "completed")]
    raw.execute(
        "UPDATE node_executions SET result = ? WHERE run_id = ? AND node_id = 'produce'",
        json.dumps({"value": 43}, separators=(",", ":")),
        run_id,
    )
    assert engine.node_executions(run_id)[0].result == {"value": 43}

    engine.coordinator.recover(run_id, "seg-2")
    ex = engine.coordinator.resume(run_id, "seg-2", by=who.agent)
    with pytest.raises(charter.Blocked):
        ex.execute()
    return mission, run_id


def test_N1_tampered_result_is_caught_and_the_consumer_does_not_start(
    engine: charter.Engine,
    who: Principals,
    new_mission: Callable[..., str],
    children: Children,
    raw: RawStore,
) -> None:
    _, run_id = _tampered_handoff(engine, who, new_mission, children, raw)

    assert node_states(engine, run_id) == [("produce", 1, "completed")]
    assert "consume" not in side()
    assert outbox() == []
    assert engine.attempts(run_id=run_id) == []


def test_N1_tampered_result_opens_a_hash_mismatch_incident_and_the_run_needs_intervention(
    engine: charter.Engine,
    who: Principals,
    new_mission: Callable[..., str],
    children: Children,
    raw: RawStore,
) -> None:
    mission, run_id = _tampered_handoff(engine, who, new_mission, children, raw)

    incidents = engine.incidents(mission, open_only=True)
    assert [(i["kind"], i["run_id"]) for i in incidents] == [("hash_mismatch", run_id)]
    assert incidents[0]["detail"] == {"node_id": "produce", "execution": 1}
    assert engine.run(run_id).status is RunStatus.NEEDS_INTERVENTION
    assert all(v.ok for v in engine.verify_audit(mission))


# -- R5 / R6: node rows of the recovery table, crash limits -------------------------------------


def test_R5_recovery_state_names_next_actions_for_running_and_completed_nodes(
    engine: charter.Engine,
    who: Principals,
    new_mission: Callable[..., str],
    children: Children,
) -> None:
    run_id = children.run(
        segment_id="seg-1",
        mission_id=new_mission(),
        plan="_node_plans:crashy_plan",
        die_in=("crashy",),
    )
    state = engine.coordinator.recover(run_id, "seg-2")

    assert state.unresolved == []
    assert state.run.status is RunStatus.ACTIVE
    assert [(n["node_id"], n["execution"], n["status"], n["crashes"]) for n in state.nodes] == [
        ("prepare", 1, "completed", 0),
        ("crashy", 1, "running", 1),
    ]
    node_actions = {a.id: (a.phase, a.action) for a in state.next_actions if a.kind == "node"}
    assert node_actions == {
        "prepare#1": ("node_completed", NEXT_ACTIONS["node_completed"]),
        "crashy#1": ("no_admission", NEXT_ACTIONS["no_admission"]),
    }

    result = engine.coordinator.resume(run_id, "seg-2", by=who.agent).execute()
    assert result["crashy"] is True
    assert len(outbox()) == 1  # the completed node was not run again
    assert_one_send_per_attempt(engine, run_id)
    assert side() == ["crashy", "crashy"]


def test_R6_node_that_crashed_its_process_max_node_crashes_times_in_a_row_needs_intervention(
    engine: charter.Engine,
    who: Principals,
    new_mission: Callable[..., str],
    children: Children,
) -> None:
    run_id = children.run(
        segment_id="seg-1",
        mission_id=new_mission(max_node_crashes=2),
        plan="_node_plans:crashy_plan",
        die_in=("crashy",),
    )
    first = engine.coordinator.recover(run_id, "seg-2")
    assert first.run.status is RunStatus.ACTIVE  # one crash is below the limit

    # The recovered owner resumes in a fresh process; the node crashes it again.
    children.run(segment_id="seg-2", run_id=run_id, die_in=("crashy",))
    second = engine.coordinator.recover(run_id, "seg-3")

    assert second.run.status is RunStatus.NEEDS_INTERVENTION
    assert engine.run(run_id).status is RunStatus.NEEDS_INTERVENTION
    crashy = [n for n in second.nodes if n["node_id"] == "crashy"]
    assert [(n["execution"], n["status"], n["crashes"]) for n in crashy] == [(1, "running", 2)]
    with pytest.raises(charter.NeedsIntervention):
        engine.coordinator.resume(run_id, "seg-3", by=who.agent)
    assert side() == ["crashy", "crashy"]
    assert len(outbox()) == 1
    assert_one_send_per_attempt(engine, run_id)


# -- retry policy: new executions, new attempts --------------------------------------------------


def _flaky_run(
    engine: charter.Engine, mission: str, who: Principals, adapter: RecordingAdapter
) -> str:
    """A node whose first execution's effect is refused by the target; its retry succeeds."""
    refusals = [charter.NotApplied("rejected before processing")]

    def write(send: Dispatch) -> Outcome:
        if refusals:
            raise refusals.pop()
        return Outcome.succeeded({"written": True}, cost={"usd": 5_000, "calls": 1})

    adapter.script["write"] = write

    @charter.node(retries=1)
    def flaky(ctx: charter.Context, value: Any) -> dict[str, Any]:
        return {"sent": ctx.attempt(adapter, "write", {"n": 1}), "execution": ctx.execution}

    ex = engine.start_run(mission, by=who.agent, segment_id="seg-1")
    assert ex.execute(charter.Plan("flaky", (flaky,))) == {
        "sent": {"written": True},
        "execution": 2,
    }
    return ex.run_id


def test_A4_retry_policy_runs_a_new_execution_whose_attempts_are_new(
    engine: charter.Engine, mission: str, who: Principals, adapter: RecordingAdapter
) -> None:
    run_id = _flaky_run(engine, mission, who, adapter)

    assert node_states(engine, run_id) == [("flaky", 1, "failed"), ("flaky", 2, "completed")]
    one, two = sorted(engine.attempts(run_id=run_id), key=lambda a: a.execution)
    assert (one.execution, one.status) == (1, AttemptStatus.FAILED)
    assert (two.execution, two.status) == (2, AttemptStatus.SUCCEEDED)
    assert one.effect_key == two.effect_key == "#1"
    assert one.request_hash == two.request_hash
    assert one.id != two.id
    assert one.idempotency_key != two.idempotency_key
    assert [(s.attempt_id, s.idempotency_key) for s in adapter.sent] == [
        (one.id, one.idempotency_key),
        (two.id, two.idempotency_key),
    ]


def test_A4_retry_policy_attempt_is_linked_to_the_failed_one_before(
    engine: charter.Engine, mission: str, who: Principals, adapter: RecordingAdapter
) -> None:
    run_id = _flaky_run(engine, mission, who, adapter)

    one, two = sorted(engine.attempts(run_id=run_id), key=lambda a: a.execution)
    assert one.status is AttemptStatus.FAILED
    assert one.retry_of is None
    assert two.retry_of == one.id


# -- N4: a linked run killed mid-node ---------------------------------------------------------


def test_N4_a_linked_run_killed_mid_node_recovers_and_sends_each_effect_once(
    engine: charter.Engine,
    who: Principals,
    new_mission: Callable[..., str],
    children: Children,
    workdir: Path,
) -> None:
    """A run's node declares failure after a send (the run fails, N6); the fixed
    follow-up, started in another process, is killed mid-node; a third process
    recovers it. Breaking N4 (or A6 across the link) looks like the first run's
    send going out again."""
    (workdir / "bug.txt").write_text("present\n")
    first = engine.start_run(
        new_mission(), by=who.agent, segment_id="seg-1", plan=plans.linked_plan
    )
    with pytest.raises(charter.NodeFailed):
        first.execute()
    assert engine.run(first.run_id).status is RunStatus.FAILED
    assert [m["request"]["effect"] for m in outbox()] == ["one", "two-a"]

    (workdir / "bug.txt").unlink()  # the reviewed fix
    linked = children.run(
        segment_id="seg-1",
        link_from=first.run_id,
        reviewer=who.credentials["alice"],
        die_in=("two",),
    )
    assert engine.run(linked).linked_from == first.run_id
    assert [m["request"]["effect"] for m in outbox()] == ["one", "two-a"]  # nothing again

    engine.coordinator.recover(linked, "seg-2")
    result = engine.coordinator.resume(linked, "seg-2", by=who.agent).execute()

    assert result == {"two": "done"}
    assert [m["request"]["effect"] for m in outbox()] == ["one", "two-a", "two-b"]
    assert engine.run(linked).status is RunStatus.COMPLETED
    assert engine.run(first.run_id).status is RunStatus.FAILED


# -- A4: a node's loop of payments, killed mid-way -----------------------------------------


@pytest.mark.crash
@pytest.mark.parametrize("keyed", [False, True], ids=["positional", "keyed"])
@pytest.mark.parametrize("retries", [0, 1], ids=["no-node-retry", "one-node-retry"])
@pytest.mark.parametrize("sent", [False, True], ids=["killed-before-send", "killed-after-send"])
def test_A4_a_loop_of_ten_invoices_killed_at_the_fifth_pays_each_invoice_once(
    engine: charter.Engine,
    who: Principals,
    new_mission: Callable[..., str],
    children: Children,
    workdir: Path,
    sent: bool,
    retries: int,
    keyed: bool,
) -> None:
    """Broken A4: after an operator settles the lost invoice, resume either ends the
    run ``failed`` (invoices 5-9 never paid) or a node retry pays 0-3 again."""
    plan = f"_node_plans:invoices_{retries}_{'keyed' if keyed else 'plain'}"
    run_id = children.run(
        segment_id="seg-1",
        mission_id=new_mission(),
        plan=plan,
        # Invoices 0-3 pass each point once; invoice 4 dies there.
        kill_point="settlement.before" if sent else "dispatch.after",
        kill_skip=4,
    )
    assert len(outbox()) == (5 if sent else 4)
    state = engine.coordinator.recover(run_id, "seg-2")
    (lost,) = state.unresolved
    assert engine.get_attempt(lost).status is AttemptStatus.UNKNOWN
    engine.coordinator.reconcile(lost, plans.Outbox(), by=who.alice)  # indeterminate
    if sent:  # the operator finds invoice 4 in the target's log
        engine.coordinator.resolve(
            lost,
            by=who.alice,
            outcome="succeeded",
            evidence="outbox line 5",
            cost={"calls": 1},
            result={"line": 5},
        )
    else:  # ... or proves it never arrived
        engine.coordinator.resolve(
            lost, by=who.alice, outcome="failed", evidence="no invoice 4 in the outbox"
        )
    if retries:
        (workdir / "bug.txt").write_text("fail once\n")  # the node fails after seven

    result = engine.coordinator.resume(run_id, "seg-2", by=who.agent).execute()

    assert engine.run(run_id).status is RunStatus.COMPLETED
    paid = Counter(m["request"]["invoice"] for m in outbox())
    assert paid == Counter(range(10))  # each invoice received exactly once
    performed = [a for a in engine.attempts(run_id=run_id) if a.status is AttemptStatus.SUCCEEDED]
    assert sorted(m["key"] for m in outbox()) == sorted(a.idempotency_key for a in performed)
    assert result == {"lines": [json.loads(json.dumps(r))["line"] for r in _lines_by_invoice()]}
    if not sent:
        retried = [a for a in engine.attempts(run_id=run_id) if a.retry_of == lost]
        assert [(a.status, a.generation) for a in retried] == [(AttemptStatus.SUCCEEDED, 2)]
        assert engine.get_attempt(lost).answered is False
    assert engine.check_ledger(engine.run(run_id).mission_id) == []


def _lines_by_invoice() -> list[dict[str, int]]:
    """The outbox line on which each invoice arrived, in invoice order."""
    where = {m["request"]["invoice"]: {"line": n} for n, m in enumerate(outbox(), start=1)}
    return [where[i] for i in range(10)]


# -- N6: node code that raises is not the world's answer -----------------------------------

ACCOUNT = "CHARTER_TEST_N6_ACCOUNT"


def _payments(adapter: RecordingAdapter, stamps: list[str]) -> charter.Plan:
    """Four payments, then a read of the operator's environment, then a fifth."""

    @charter.node
    def pay(ctx: charter.Context, value: Any) -> dict[str, Any]:
        stamps.append(ctx.uuid())  # journaled: a replay of this execution sees it again
        for n in range(4):
            ctx.attempt(adapter, "write", {"invoice": n})
        account = os.environ[ACCOUNT]
        ctx.attempt(adapter, "write", {"invoice": 4, "account": account})
        return {"paid": 5, "stamp": stamps[-1]}

    return charter.Plan("payments", (pay,))


def test_N6_a_node_that_raises_leaves_the_run_resumable_and_its_resume_pays_each_once(
    engine: charter.Engine,
    mission: str,
    who: Principals,
    adapter: RecordingAdapter,
    monkeypatch: pytest.MonkeyPatch,
) -> None:
    """Broken N6: a missing environment variable after four payments ended the run
    ``failed`` for good (node retries default to 0), the fifth never paid."""
    monkeypatch.delenv(ACCOUNT, raising=False)
    stamps: list[str] = []
    plan = _payments(adapter, stamps)
    ex = engine.start_run(mission, by=who.agent, segment_id="seg-1")
    with pytest.raises(charter.Blocked) as blocked:
        ex.execute(plan)

    assert isinstance(blocked.value.__cause__, KeyError)  # the bug, for whoever debugs it
    run = engine.run(ex.run_id)
    assert run.status is RunStatus.NEEDS_INTERVENTION
    assert run.status_reason is not None and f"KeyError: '{ACCOUNT}'" in run.status_reason
    [execution] = engine.node_executions(ex.run_id)
    assert (execution.execution, execution.status) == (1, "blocked")
    error = execution.error or ""
    assert error.startswith(f"KeyError: '{ACCOUNT}'\nTraceback, last frames")
    assert "test_nodes.py" in error and "in pay" in error and "os.environ[ACCOUNT]" in error
    assert "runner.py" not in error  # the engine's own frames are left out
    state = engine.coordinator.state(ex.run_id)
    assert [n["error"] for n in state.nodes] == [error]
    [event] = [e for e in engine.audit_events(mission) if e["kind"] == "node.blocked"]
    assert json.loads(event["payload"])["error"] == error
    assert [s.request["invoice"] for s in adapter.sent] == [0, 1, 2, 3]

    monkeypatch.setenv(ACCOUNT, "acct-7")  # the operator fixes the environment
    resumed = engine.coordinator.resume(ex.run_id, "seg-1", by=who.agent)
    assert resumed.execute(plan) == {"paid": 5, "stamp": stamps[0]}

    assert [s.request["invoice"] for s in adapter.sent] == [0, 1, 2, 3, 4]  # each once
    assert node_states(engine, ex.run_id) == [("pay", 1, "completed")]  # the same execution
    assert stamps == [stamps[0], stamps[0]]
    assert engine.run(ex.run_id).status is RunStatus.COMPLETED
    assert engine.check_ledger(mission) == []


def test_N6_a_declared_failure_ends_the_run_failed(
    engine: charter.Engine, mission: str, who: Principals, adapter: RecordingAdapter
) -> None:
    @charter.node
    def order(ctx: charter.Context, value: Any) -> Any:
        ctx.attempt(adapter, "write", {"order": 1})
        raise charter.NodeFailed("the supplier has no stock: the order cannot be placed")

    ex = engine.start_run(mission, by=who.agent, segment_id="seg-1")
    with pytest.raises(charter.NodeFailed):
        ex.execute(charter.Plan("order", (order,)))

    assert engine.run(ex.run_id).status is RunStatus.FAILED
    [execution] = engine.node_executions(ex.run_id)
    assert execution.status == "failed"
    assert execution.error == "NodeFailed: the supplier has no stock: the order cannot be placed"
    with pytest.raises(charter.RunTerminal):
        engine.coordinator.resume(ex.run_id, "seg-1", by=who.agent)
    assert len(adapter.sent) == 1


def test_N6_an_effect_the_target_settled_failed_is_the_worlds_answer_and_fails_the_run(
    engine: charter.Engine, mission: str, who: Principals, adapter: RecordingAdapter
) -> None:
    adapter.script["write"] = lambda send: Outcome.failed({"declined": True})

    @charter.node
    def charge(ctx: charter.Context, value: Any) -> Any:
        return ctx.attempt(adapter, "write", {"card": "4242"})  # AttemptFailed, uncaught

    ex = engine.start_run(mission, by=who.agent, segment_id="seg-1")
    with pytest.raises(charter.AttemptFailed):
        ex.execute(charter.Plan("charge", (charge,)))
    assert engine.run(ex.run_id).status is RunStatus.FAILED
    assert node_states(engine, ex.run_id) == [("charge", 1, "failed")]


def test_N6_an_unexpected_exception_under_a_retry_policy_fails_the_run_once_retries_are_spent(
    engine: charter.Engine, mission: str, who: Principals, adapter: RecordingAdapter
) -> None:
    """A plan that declares retries says how often a bug may be tried again."""

    @charter.node(retries=1)
    def parse(ctx: charter.Context, value: Any) -> Any:
        ctx.attempt(adapter, "write", {"parsed": True})
        return int("not a number")

    ex = engine.start_run(mission, by=who.agent, segment_id="seg-1")
    with pytest.raises(ValueError, match="not a number"):
        ex.execute(charter.Plan("parse", (parse,)))

    assert engine.run(ex.run_id).status is RunStatus.FAILED
    executions = engine.node_executions(ex.run_id)
    assert [(n.execution, n.status) for n in executions] == [(1, "failed"), (2, "failed")]
    assert all("Traceback, last frames" in (n.error or "") for n in executions)
    assert len(adapter.sent) == 1  # the retry replayed the settled write (A4)


def test_N6_a_raising_nodes_recorded_error_is_bounded_and_holds_no_secret(
    engine: charter.Engine, mission: str, who: Principals, adapter: RecordingAdapter
) -> None:
    """What a node raised is kept for people to read: never a secret of this
    process (S3), and never without bound, however long the message or deep the
    stack."""
    key = charter.Secret("sk-live-n6-0123456789", name="payments-key")

    def deep(n: int) -> None:
        if n:
            deep(n - 1)
        raise ValueError(f"the target refused key {key.reveal()}: " + "x" * 100_000)

    @charter.node
    def leak(ctx: charter.Context, value: Any) -> Any:
        deep(50)

    ex = engine.start_run(mission, by=who.agent, segment_id="seg-1")
    with pytest.raises(charter.Blocked):
        ex.execute(charter.Plan("leak", (leak,)))

    run = engine.run(ex.run_id)
    [execution] = engine.node_executions(ex.run_id)
    error = execution.error or ""
    for text in (error, run.status_reason or "", json.dumps(engine.audit_events(mission))):
        assert "sk-live-n6-0123456789" not in text
    assert error.startswith("ValueError: the target refused key ***: xxx")
    assert "(46 earlier frames left out)" in error  # leak, then 51 calls of deep
    assert len(error) < 4_000
    assert run.status is RunStatus.NEEDS_INTERVENTION


def test_N6_telemetry_reports_a_raising_node_as_the_store_records_it(
    tmp_path: Path, creds: tuple[dict[str, str], dict[str, str]]
) -> None:
    """Broken: an observer was told ``failed`` for a node the runner kept
    ``blocked``, so a trace showed a failure where the run waited for a fix."""

    class Seen(charter.Observer):
        def __init__(self) -> None:
            self.nodes: list[tuple[str, str]] = []

        def node_finished(self, node: charter.ObservedNode, status: str) -> None:
            self.nodes.append((node.node_id, status))

    @charter.node
    def broken(ctx: charter.Context, value: Any) -> Any:
        return {}["LEDGER_ACCOUNT"]

    @charter.node
    def refused(ctx: charter.Context, value: Any) -> Any:
        raise charter.NodeFailed("the supplier has no stock")

    seen = Seen()
    config = charter.EngineConfig(credentials=creds[1])
    with charter.Engine.open(str(tmp_path / "seen.db"), config=config, observer=seen) as engine:
        who = Principals(creds[0], creds[1], engine)
        mission = engine.create_mission(default_contract(), by=who.alice)
        stored = []
        for n, step in enumerate((broken, refused)):
            ex = engine.start_run(mission, by=who.agent, segment_id=f"seg-{n}")
            with pytest.raises((charter.Blocked, charter.NodeFailed)):
                ex.execute(charter.Plan(step.name, (step,)))
            stored += [(e.node_id, e.status) for e in engine.node_executions(ex.run_id)]

    assert seen.nodes == stored == [("broken", "blocked"), ("refused", "failed")]
