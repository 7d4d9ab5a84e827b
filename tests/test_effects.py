"""The one decider of what to do with an effect, as a table (A4, A6, A7, N6).

Every case of the effect's newest recorded attempt, by the effect class and the
call in hand, and the decision it gets: replay the record, send a first try,
dispatch a PREPARED attempt, retry as a new linked attempt, or refuse a call
that asks for something else than was recorded. The driver
(``dispatch.performing``) and the admission's check under the gate both use
this rule; the other tests show them doing so on a real store.
"""

from __future__ import annotations

from dataclasses import replace
from typing import Any

import pytest

from charter import AttemptStatus, EffectClass
from charter.attempts.effects import Decision, InHand, check_admissible, decide
from charter.attempts.model import Attempt, Effect
from charter.errors import AttemptAlreadySettled, NonDeterminismError, StateError

S = AttemptStatus
RUN, NODE, KEY, HASH = "run-1", "pay", "k:inv-1", "hash-1"


def call(
    effect: EffectClass = EffectClass.UNSAFE, *, execution: int = 1, retries: int = 2, **kw: Any
) -> InHand:
    fields: dict[str, Any] = {
        "run_id": RUN,
        "node_id": NODE,
        "execution": execution,
        "key": KEY,
        "request_hash": HASH,
        "scope": "bank.pay",
        "effect_class": effect,
        "retries": retries,
    }
    return InHand(**{**fields, **kw})


def recorded(status: AttemptStatus, effect: EffectClass = EffectClass.UNSAFE, **kw: Any) -> Attempt:
    fields: dict[str, Any] = {
        "id": "att-1",
        "mission_id": "m",
        "run_id": RUN,
        "node_id": NODE,
        "execution": 1,
        "effect_key": KEY,
        "adapter": "bank",
        "operation": "pay",
        "effect_class": effect.value,
        "status": status,
        "principal": "agent",
        "admitted_epoch": 1,
        "dispatched_epoch": 1,
        "idempotency_key": "key-1",
        "request_hash": HASH,
        "request": {},
        "estimate": {"usd": 5},
        "actual": None,
        "result": {"ok": True} if status is S.SUCCEEDED else None,
        "receipt": None,
        "price_source": None,
        "retry_of": None,
        "reason": None,
        "send_deadline_us": 1,
        "prepared_at_us": 0,
        "dispatched_at_us": 0,
        "settled_at_us": 0,
        "generation": 1,
        "answered": True,
    }
    return Attempt(**{**fields, **kw})


R, W, U = EffectClass.READ_ONLY, EffectClass.IDEMPOTENT_KEYED, EffectClass.UNSAFE
#: (case, newest attempt, call, expected decision, generation of a new try)
TABLE: list[tuple[str, Attempt | None, InHand, Decision, int]] = [
    ("first call", None, call(), Decision.SEND, 1),
    # -- in this node execution (a node re-entered after a wait or a person) ---
    ("succeeded: replayed", recorded(S.SUCCEEDED), call(), Decision.REPLAY, 0),
    ("read succeeded: replayed", recorded(S.SUCCEEDED, R), call(R), Decision.REPLAY, 0),
    ("failed, seen: replayed as the failure", recorded(S.FAILED), call(), Decision.REPLAY, 0),
    (
        "failed unseen (a person): retried",
        recorded(S.FAILED, answered=False),
        call(),
        Decision.RETRY,
        2,
    ),
    (
        "failed unseen, policy spent: replayed",
        recorded(S.FAILED, answered=False, generation=3),
        call(retries=2),
        Decision.REPLAY,
        0,
    ),
    ("unknown: replayed (the node blocks)", recorded(S.UNKNOWN), call(), Decision.REPLAY, 0),
    ("dispatched: replayed (the node blocks)", recorded(S.DISPATCHED), call(), Decision.REPLAY, 0),
    (
        "read unknown: replayed (the node blocks)",
        recorded(S.UNKNOWN, R),
        call(R),
        Decision.REPLAY,
        0,
    ),
    ("prepared: dispatched", recorded(S.PREPARED), call(), Decision.DISPATCH, 0),
    ("voided: admitted again", recorded(S.VOIDED), call(), Decision.RETRY, 2),
    ("payment written off: replayed", recorded(S.WRITTEN_OFF), call(), Decision.REPLAY, 0),
    ("keyed written off: replayed", recorded(S.WRITTEN_OFF, W), call(W), Decision.REPLAY, 0),
    ("read written off: asked again", recorded(S.WRITTEN_OFF, R), call(R), Decision.RETRY, 2),
    (
        "read settled without its answer: asked again",
        recorded(S.SUCCEEDED, R, answered=False, result=None),
        call(R),
        Decision.RETRY,
        2,
    ),
    (
        "payment settled without its answer: replayed (AnswerNotRecorded)",
        recorded(S.SUCCEEDED, answered=False, result=None),
        call(),
        Decision.REPLAY,
        0,
    ),
    # -- by an earlier execution of the node (a node retry, a re-run) ---------
    (
        "earlier: succeeded payment replayed",
        recorded(S.SUCCEEDED),
        call(execution=2),
        Decision.REPLAY,
        0,
    ),
    (
        "earlier: keyed succeeded replayed",
        recorded(S.SUCCEEDED, W),
        call(W, execution=2),
        Decision.REPLAY,
        0,
    ),
    (
        "earlier: read performed again",
        recorded(S.SUCCEEDED, R),
        call(R, execution=2),
        Decision.RETRY,
        1,
    ),
    ("earlier: failed tried again", recorded(S.FAILED), call(execution=2), Decision.RETRY, 1),
    ("earlier: voided tried again", recorded(S.VOIDED), call(execution=2), Decision.RETRY, 1),
    ("earlier: unknown blocks", recorded(S.UNKNOWN), call(execution=2), Decision.REPLAY, 0),
    (
        "earlier: written off replayed",
        recorded(S.WRITTEN_OFF),
        call(execution=2),
        Decision.REPLAY,
        0,
    ),
    # -- by the run this one continues (N4) ------------------------------------
    (
        "linked run: succeeded replayed",
        recorded(S.SUCCEEDED, run_id="run-0"),
        call(),
        Decision.REPLAY,
        0,
    ),
    (
        "linked run: failed tried again",
        recorded(S.FAILED, run_id="run-0"),
        call(),
        Decision.RETRY,
        1,
    ),
]


@pytest.mark.parametrize(
    ("case", "prior", "hand", "want", "generation"), TABLE, ids=[t[0] for t in TABLE]
)
def test_A4_A6_A7_N6_the_decision_for_each_recorded_lineage_and_call(
    case: str, prior: Attempt | None, hand: InHand, want: Decision, generation: int
) -> None:
    step = decide(prior, hand)
    assert step.decision is want, case
    if want in (Decision.SEND, Decision.RETRY):
        assert step.generation == generation
        assert step.retry_of == (None if prior is None else prior.id)
    else:
        assert step.prior is prior


def test_A4_after_a_try_a_failure_the_call_saw_is_final_and_one_it_did_not_is_retried() -> None:
    """The driver tells the decider whether the call saw its try's outcome: a
    refusal the target answered is final; a send the engine itself did not make
    (its deadline had passed) is tried again, within the policy."""
    failed = recorded(S.FAILED, answered=False)
    assert decide(failed, call(), seen=True).decision is Decision.REPLAY
    assert decide(failed, call(), seen=False).decision is Decision.RETRY
    assert decide(replace(failed, generation=3), call(), seen=False).decision is Decision.REPLAY


@pytest.mark.parametrize(
    "status", [S.SUCCEEDED, S.UNKNOWN, S.DISPATCHED, S.PREPARED, S.WRITTEN_OFF]
)
def test_A6_a_replayed_call_with_another_request_is_refused(status: AttemptStatus) -> None:
    with pytest.raises(NonDeterminismError):
        decide(recorded(status), call(request_hash="other"))
    with pytest.raises(NonDeterminismError):
        decide(recorded(status), call(scope="bank.refund"))


def test_A6_a_new_execution_may_ask_differently_for_what_was_not_performed() -> None:
    """A failed or voided effect, or a read, is a fresh call in a new execution."""
    for prior in (recorded(S.FAILED), recorded(S.VOIDED), recorded(S.SUCCEEDED, R)):
        assert decide(
            prior, call(prior_class(prior), execution=2, request_hash="other")
        ).decision is (Decision.RETRY)


def prior_class(prior: Attempt) -> EffectClass:
    return EffectClass(prior.effect_class)


# -- the same rule under the gate -------------------------------------------------------


def effect(generation: int = 1, retry_of: str | None = None, execution: int = 1) -> Effect:
    return Effect(NODE, execution, KEY, generation, retry_of)


def test_A4_under_the_gate_a_first_try_is_admitted_once() -> None:
    check_admissible([], effect(), RUN)
    with pytest.raises(StateError):
        check_admissible([], effect(2, "att-0"), RUN)
    with pytest.raises(AttemptAlreadySettled):
        check_admissible([recorded(S.FAILED)], effect(), RUN)


def test_A4_under_the_gate_nothing_is_admitted_beside_an_unresolved_attempt() -> None:
    for status in (S.PREPARED, S.DISPATCHED, S.UNKNOWN):
        with pytest.raises(StateError, match="never retried on a guess"):
            check_admissible([recorded(status)], effect(2, "att-1"), RUN)


def test_A4_under_the_gate_a_retry_follows_the_newest_and_never_a_performed_effect() -> None:
    check_admissible([recorded(S.FAILED)], effect(2, "att-1"), RUN)
    with pytest.raises(StateError, match="retry_of"):
        check_admissible([recorded(S.FAILED)], effect(2, "att-0"), RUN)
    with pytest.raises(AttemptAlreadySettled):
        check_admissible([recorded(S.SUCCEEDED)], effect(1, "att-1", execution=2), RUN)
    check_admissible([recorded(S.SUCCEEDED, R)], effect(1, "att-1", execution=2), RUN)
