"""Waits beside approvals (W1): human input, timers and named events.

A node asks for one through its context with a key of its own; the wait is
a row, so it survives a crash and costs no process. A question is answered
by a person with the ``approve`` right (the answer checked against the type
the node asked for), a named event is signalled by a principal with the
``run`` right, and a timer is due by the store's clock. The node, replayed on
resume, reads what arrived; a replay that asks for something else under the
same key is a non-determinism error.
"""

from __future__ import annotations

import json
from typing import Any

from charter.errors import NonDeterminismError, NotFound, WaitError
from charter.storage import Tx
from charter.waits import store
from charter.waits.model import ANSWER_TYPES, Wait, WaitKind, WaitStatus

__all__ = ["Wait", "WaitKind", "WaitStatus", "answer", "arrived", "load", "request", "signal"]


def load(tx: Tx, run_id: str, key: str) -> Wait:
    found = store.wait(tx, run_id, key)
    if found is None:
        raise NotFound(
            f"run {run_id} has no wait {key!r}; `charter show {run_id}` lists its waits",
            run_id=run_id,
            key=key,
        )
    return found


def request(
    tx: Tx,
    *,
    mission_id: str,
    run_id: str,
    node_id: str,
    key: str,
    kind: WaitKind,
    prompt: str | None = None,
    answer_type: str | None = None,
    seconds: float | None = None,
    actor: str,
    segment: str,
    epoch: int,
) -> Wait:
    """The node's wait under ``key``: the one recorded, or a new pending one."""
    found = store.wait(tx, run_id, key)
    if found is not None:
        asked = (node_id, kind, prompt, answer_type)
        if (found.node_id, found.kind, found.prompt, found.answer_type) != asked:
            raise NonDeterminismError(
                f"node {node_id} asked for wait {key!r} as {kind.value} {prompt!r}, where "
                f"{found.kind.value} {found.prompt!r} of node {found.node_id} was recorded",
                wait_id=found.id,
            )
        return found
    if answer_type is not None and answer_type not in ANSWER_TYPES:
        raise WaitError(
            f"answer type {answer_type!r} is not one of {sorted(ANSWER_TYPES)}",
            answer_type=answer_type,
        )
    due = None if seconds is None else tx.now_us + round(seconds * 1_000_000)
    wait_id = tx.ids.new("wt")
    store.insert_wait(
        tx,
        wait_id,
        mission_id=mission_id,
        run_id=run_id,
        node_id=node_id,
        key=key,
        kind=kind,
        prompt=prompt,
        answer_type=answer_type,
        due_at_us=due,
    )
    tx.audit(
        mission_id,
        "wait.requested",
        wait_id,
        actor=actor,
        segment=segment,
        epoch=epoch,
        after="pending",
        payload={"run_id": run_id, "key": key, "kind": kind.value, "prompt": prompt, "due": due},
    )
    found = store.wait(tx, run_id, key)
    assert found is not None
    return found


def arrived(tx: Tx, w: Wait, *, actor: str) -> tuple[bool, Any]:
    """Whether what the node waits for has arrived, and its value; the node has
    read it from now on (a due timer is satisfied here, by the store's clock)."""
    if w.status is WaitStatus.PENDING and w.kind is WaitKind.TIMER:
        assert w.due_at_us is not None
        if w.due_at_us > tx.now_us:
            return False, None
        _satisfy(tx, w, None, by=actor)
    elif w.status is WaitStatus.PENDING:
        return False, None
    store.consume(tx, w.id)
    now = store.wait(tx, w.run_id, w.key)
    assert now is not None
    return True, now.value


def answer(tx: Tx, w: Wait, value: Any, *, by: str) -> None:
    """A person's answer to a question, of the type the node asked for."""
    if w.kind is not WaitKind.INPUT:
        raise WaitError(
            f"wait {w.key!r} of run {w.run_id} is a {w.kind.value}, not a question: "
            + (
                "signal its event instead" if w.kind is WaitKind.EVENT else "it comes due by itself"
            ),
            wait_id=w.id,
        )
    allowed = ANSWER_TYPES[w.answer_type or "json"]
    wrong_bool = isinstance(value, bool) and bool not in allowed
    if wrong_bool or not isinstance(value, allowed):
        raise WaitError(
            f"the question {w.key!r} asks for a {w.answer_type} answer; got "
            f"{type(value).__name__} {value!r}",
            wait_id=w.id,
            answer_type=w.answer_type,
        )
    _satisfy(tx, w, value, by=by)


def signal(tx: Tx, run_id: str, event: str, payload: Any, *, by: str) -> list[str]:
    """Deliver a named event to every wait of the run pending on it; their IDs.

    A signal no wait is pending on is refused, not kept: send it again when the
    node waits (``charter show`` lists the run's waits).
    """
    pending = store.pending_events(tx, run_id, event)
    if not pending:
        raise WaitError(
            f"no wait of run {run_id} is pending on event {event!r}; nothing recorded",
            run_id=run_id,
            event=event,
        )
    for w in pending:
        _satisfy(tx, w, payload, by=by)
    return [w.id for w in pending]


def _satisfy(tx: Tx, w: Wait, value: Any, *, by: str) -> None:
    if w.status is not WaitStatus.PENDING or not store.satisfy(
        tx, w.id, value=None if value is None else json.dumps(value, sort_keys=True), by=by
    ):
        raise WaitError(
            f"wait {w.key!r} of run {w.run_id} is already {WaitStatus.SATISFIED.value}; "
            "an answer is given once",
            wait_id=w.id,
        )
    tx.audit(
        w.mission_id,
        "wait.satisfied",
        w.id,
        actor=by,
        before="pending",
        after="satisfied",
        payload={"run_id": w.run_id, "key": w.key, "kind": w.kind.value, "value": value},
    )
