"""A node never receives an answer nobody recorded (N6).

An attempt can settle SUCCEEDED without its answer: a lookup that proves what
was billed but not what was said (a model provider's usage lookup), or a
person who resolves it without ``result=``. Replaying the node must not hand
it ``None`` as if that were the answer. A ``read_only`` effect is asked again
as a new attempt linked to the settled one, admitted against the allowance;
any other is never performed again, and the node gets
:class:`charter.AnswerNotRecorded`, which it may catch.
"""

from __future__ import annotations

from typing import Any

import pytest

import charter
from charter import AttemptStatus, Dispatch, Evidence, Outcome, RunStatus
from charter.testing import RecordingAdapter
from conftest import Principals


def lost_once(answer: dict[str, Any]) -> Any:
    """A send whose first answer is lost after it was sent, then ``answer``."""
    answers: list[Exception] = [TimeoutError("no answer")]

    def send(order: Dispatch) -> Outcome:
        if answers:
            raise answers.pop()
        return Outcome.succeeded(answer, cost={"calls": 1})

    return send


def test_N6_an_effect_resolved_without_its_answer_gives_the_node_answer_not_recorded(
    engine: charter.Engine, mission: str, who: Principals
) -> None:
    """The payment went out once and a person confirmed it without saying
    what the target answered: the replayed node is told so, typed, and the
    payment is not made again."""
    target = RecordingAdapter(script={"write": lost_once({"line": 1})})
    got: list[Any] = []

    @charter.node
    def pay(ctx: charter.Context, _: Any) -> Any:
        try:
            got.append(ctx.attempt(target, "write", {"to": "gazette"}, key="pay"))
        except charter.AnswerNotRecorded as exc:
            got.append(exc.details)
        return "went on"

    plan = charter.Plan("pay", (pay,))
    ex = engine.start_run(mission, by=who.agent, segment_id="seg-1", plan=plan)
    with pytest.raises(charter.Blocked):
        ex.execute(plan)
    [sent] = engine.attempts(run_id=ex.run_id)
    engine.coordinator.resolve(
        sent.id, by=who.alice, outcome="succeeded", evidence="seen at the bank", cost={"calls": 1}
    )

    assert engine.coordinator.resume(ex.run_id, "seg-1", by=who.agent).execute(plan) == "went on"
    assert got == [{"attempt_id": sent.id, "scope": "recorder.write", "status": "succeeded"}]
    assert [a.id for a in engine.attempts(run_id=ex.run_id)] == [sent.id]  # nothing again
    assert len(target.sent) == 1
    assert engine.check_ledger(mission) == []


def test_N6_a_node_that_does_not_catch_it_stops_for_a_person_and_gets_no_value(
    engine: charter.Engine, mission: str, who: Principals
) -> None:
    target = RecordingAdapter(script={"write": lost_once({"line": 1})})
    got: list[Any] = []

    @charter.node
    def pay(ctx: charter.Context, _: Any) -> Any:
        got.append(ctx.attempt(target, "write", {"to": "gazette"}, key="pay"))
        return got[-1]

    plan = charter.Plan("pay", (pay,))
    ex = engine.start_run(mission, by=who.agent, segment_id="seg-1", plan=plan)
    with pytest.raises(charter.Blocked):
        ex.execute(plan)
    [sent] = engine.attempts(run_id=ex.run_id)
    engine.coordinator.resolve(sent.id, by=who.alice, outcome="succeeded", evidence="seen")

    resumed = engine.coordinator.resume(ex.run_id, "seg-1", by=who.agent)
    with pytest.raises((charter.Blocked, charter.AnswerNotRecorded)):
        resumed.execute(plan)
    assert got == []  # the node never received a value
    assert engine.run(ex.run_id).status is not RunStatus.COMPLETED
    assert len(target.sent) == 1


def test_N6_a_read_settled_by_a_lookup_without_its_answer_is_asked_again_as_a_linked_attempt(
    engine: charter.Engine, mission: str, who: Principals
) -> None:
    """A usage lookup proves the call was billed, not what it answered: the
    read is asked again as a new attempt linked to the settled one, admitted
    against the allowance, and the node goes on with that answer."""
    model = RecordingAdapter(script={"read": lost_once({"text": "hello"})})

    @charter.node
    def ask(ctx: charter.Context, _: Any) -> Any:
        return ctx.attempt(model, "read", {"prompt": "hi"}, key="ask")["text"]

    plan = charter.Plan("ask", (ask,))
    ex = engine.start_run(mission, by=who.agent, segment_id="seg-1", plan=plan)
    with pytest.raises(charter.Blocked):
        ex.execute(plan)
    [lost] = engine.attempts(run_id=ex.run_id)
    billed = Outcome.succeeded(None, cost={"calls": 1}, receipt={"usage": "billed"})
    model.evidence[lost.id] = Evidence.applied(billed)
    assert engine.coordinator.reconcile(lost.id, model, by=who.alice).conclusive
    engine.coordinator.confirm(lost.id, by=who.alice)

    assert engine.coordinator.resume(ex.run_id, "seg-1", by=who.agent).execute(plan) == "hello"
    first, second = sorted(engine.attempts(run_id=ex.run_id), key=lambda a: a.generation)
    assert (first.status, first.result) == (AttemptStatus.SUCCEEDED, None)
    assert (second.retry_of, second.generation, second.status) == (
        first.id,
        2,
        AttemptStatus.SUCCEEDED,
    )
    assert len(model.sent) == 2
    assert engine.balances(mission)["calls"].spent == 2  # both calls, as billed
    assert engine.check_ledger(mission) == []
