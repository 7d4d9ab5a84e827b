"""Admission checks (A1, A4, L3, L7): what must hold before an attempt is recorded.

Each check runs inside the executor's admission transaction, after ownership
was checked, and either returns or raises a refusal that is audited; the
refusals that the rules say must change the run (a stop condition makes it
stopping, an exhausted allowance pauses it) keep that change.
"""

from __future__ import annotations

from typing import TYPE_CHECKING

from charter import attempts, runs, settlement
from charter.adapters import EffectClass
from charter.attempts import AttemptStatus
from charter.contracts import Contract
from charter.errors import AdmissionRefused, AllowanceExceeded, AttemptAlreadySettled, StateError
from charter.runs import RunStatus
from charter.storage import Row, Tx

if TYPE_CHECKING:
    from charter.attempts import Effect
    from charter.executor import Call, Executor


#: Statuses whose effect is, or may be, performed: a retry never follows them
#: unless the effect only reads (A4, A7).
_PERFORMED = frozenset({AttemptStatus.SUCCEEDED, AttemptStatus.WRITTEN_OFF})


def check_effect(ex: Executor, tx: Tx, effect: Effect) -> None:
    """A4: one effect, one performance.

    A generation is admitted once; no attempt is admitted while any attempt of
    the same effect (same node and effect key, across node executions and the
    runs this one continues) is unresolved; an effect that was performed, or
    may have been (SUCCEEDED, WRITTEN_OFF), is never admitted again unless it
    only reads; and a retry names the settled attempt it follows: the newest
    of the effect, FAILED or VOIDED.
    """
    lines = attempts.lineage(tx, ex.run_id, effect.node_id, effect.execution)
    rows = attempts.effect_attempts(tx, lines, effect.node_id, effect.key)
    for r in rows:
        if (r.run_id, r.execution, r.generation) == (
            ex.run_id,
            effect.execution,
            effect.generation,
        ):
            raise AttemptAlreadySettled(
                f"effect {effect.key!r} already has attempt {r.id} "
                f"({r.status.value}) at generation {effect.generation}; a retry is a new "
                "generation",
                attempt_id=r.id,
                status=r.status.value,
            )
        if r.status.holds:
            raise StateError(
                f"effect {effect.key!r} has attempt {r.id} still {r.status.value}; it is "
                "never retried on a guess — reconcile or resolve it first",
                attempt_id=r.id,
                status=r.status.value,
            )
    if not rows:
        if effect.retry_of is not None or effect.generation > 1:
            raise StateError(
                f"effect {effect.key!r} has no earlier attempt: a first try is generation 1 "
                "and follows nothing",
                retry_of=effect.retry_of,
            )
        return
    newest = rows[0]
    if effect.retry_of != newest.id:
        raise StateError(
            f"effect {effect.key!r} was tried before (attempt {newest.id}, "
            f"{newest.status.value}): a retry must name it as retry_of",
            retry_of=effect.retry_of,
            attempt_id=newest.id,
        )
    if newest.status in _PERFORMED and newest.effect_class != EffectClass.READ_ONLY:
        raise AttemptAlreadySettled(
            f"effect {effect.key!r} was settled {newest.status.value} by attempt {newest.id}; "
            "a settled effect is never performed again — its record is replayed",
            attempt_id=newest.id,
            status=newest.status.value,
        )


def check_stop(ex: Executor, tx: Tx, contract: Contract, row: Row, call: Call) -> None:
    stop = contract.stop_conditions
    why = None
    if stop.deadline_us is not None and tx.now_us >= stop.deadline_us:
        why = "the contract's deadline has passed"
    elif stop.max_attempts is not None and row["attempts_admitted"] >= stop.max_attempts:
        why = f"the contract's limit of {stop.max_attempts} attempts is reached"
    elif (
        stop.max_failed_attempts is not None and row["attempts_failed"] >= stop.max_failed_attempts
    ):
        why = f"the contract's limit of {stop.max_failed_attempts} failed attempts is reached"
    if why is None:
        return
    ex._set_status(tx, row, RunStatus.STOPPING, f"stop condition: {why}")
    settlement.void_prepared(
        tx, ex.run_id, "run stopping", actor=ex.principal, segment=ex.segment_id, epoch=ex.epoch
    )
    runs.conclude_stop(tx, ex.run_id, actor=ex.principal, segment=ex.segment_id)
    raise tx.refused(
        AdmissionRefused(f"stop condition holds: {why}; the run is stopping", stop_condition=why),
        mission_id=ex.mission_id,
        kind="admission.refused",
        entity=ex.run_id,
        actor=ex.principal,
        payload={"scope": call.scope, "stop_condition": why},
        keep_changes=True,
    )


def check_allowance(ex: Executor, tx: Tx, contract: Contract, row: Row, call: Call) -> None:
    """L3 and L7: all units or none; exhausted or incident -> pause and ask."""
    estimate = call.estimate.amounts
    unbudgeted = sorted(set(estimate) - set(contract.allowance))
    if unbudgeted:
        raise tx.refused(
            AdmissionRefused(
                f"{call.scope} is estimated in unit(s) {unbudgeted} that the contract does "
                f"not budget; add them to the contract's allowance",
                units=unbudgeted,
            ),
            mission_id=ex.mission_id,
            kind="admission.refused",
            entity=ex.run_id,
            actor=ex.principal,
            payload={"scope": call.scope, "units": unbudgeted},
        )
    # Read with ownership, under the mission's gate: no other admission can
    # hold from the same allowance until this transaction ends.
    available = {
        unit: int(amount)
        for unit, _, amount in (pair.partition(":") for pair in (row["available"] or "").split(","))
        if unit
    }
    short = {
        u: {"estimate": a, "available": available.get(u, 0)}
        for u, a in estimate.items()
        if a > available.get(u, 0)
    }
    if not short and not row["open_incidents"]:
        return
    if row["open_incidents"]:
        why = f"{row['open_incidents']} open incident(s) on the mission"
    else:
        why = "allowance exhausted: " + ", ".join(
            f"{u} needs {v['estimate']}, {v['available']} available"
            for u, v in sorted(short.items())
        )
    ex._set_status(tx, row, RunStatus.PAUSED, why)
    raise tx.refused(
        AllowanceExceeded(
            f"admission of {call.scope} refused ({why}); the run is paused until a "
            "principal with raise_limit raises the limit or the incident is closed, or "
            "the run is stopped",
            short=short,
            open_incidents=row["open_incidents"],
        ),
        mission_id=ex.mission_id,
        kind="admission.refused",
        entity=ex.run_id,
        actor=ex.principal,
        payload={"scope": call.scope, "short": short, "open_incidents": row["open_incidents"]},
        keep_changes=True,
    )
