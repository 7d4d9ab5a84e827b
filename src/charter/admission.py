"""Admission checks (A1, A4, L3, L7): what must hold before an attempt is recorded.

Each check runs inside the executor's admission transaction, after ownership
was checked, and either returns or raises a refusal that is audited; the
refusals that the rules say must change the run (a stop condition makes it
stopping, an exhausted allowance pauses it) keep that change.
"""

from __future__ import annotations

from typing import TYPE_CHECKING

from charter import runs, settlement
from charter.contracts import Contract
from charter.errors import AdmissionRefused, AllowanceExceeded, AttemptAlreadySettled, StateError
from charter.runs import RunStatus
from charter.storage import Row, Tx

if TYPE_CHECKING:
    from charter.attempts import Effect
    from charter.executor import Call, Executor


def check_effect(ex: Executor, tx: Tx, effect: Effect) -> None:
    """A4: an effect's generation is performed once; a retry follows a proven end."""
    rows = tx.all(
        "SELECT id, status, generation FROM attempts WHERE run_id = ? AND node_id = ? "
        "AND execution = ? AND effect_key = ?",
        ex.run_id,
        effect.node_id,
        effect.execution,
        effect.key,
    )
    for r in rows:
        if r["generation"] == effect.generation:
            raise AttemptAlreadySettled(
                f"effect {effect.key!r} already has attempt {r['id']} "
                f"({r['status']}) at generation {effect.generation}; a retry is a new generation",
                attempt_id=r["id"],
                status=r["status"],
            )
        if r["status"] in ("prepared", "dispatched", "unknown"):
            raise StateError(
                f"effect {effect.key!r} has attempt {r['id']} still {r['status']}; it is "
                "never retried on a guess — reconcile or resolve it first",
                attempt_id=r["id"],
                status=r["status"],
            )
    retry_of = effect.retry_of
    if retry_of is not None:
        prior = next((r for r in rows if r["id"] == retry_of), None) or tx.one(
            "SELECT id, status FROM attempts WHERE id = ? AND run_id = ? AND node_id = ? "
            "AND execution < ? AND effect_key = ?",
            retry_of,
            ex.run_id,
            effect.node_id,
            effect.execution,
            effect.key,
        )
        ended = {"failed", "written_off", "voided"}
        if prior is not None and prior["id"] not in {r["id"] for r in rows}:
            ended.add("succeeded")  # a new node execution re-does a settled effect
        if prior is None or prior["status"] not in ended:
            raise StateError(
                f"retry_of {retry_of!r} must name a FAILED, WRITTEN_OFF or VOIDED attempt "
                f"of the same effect {effect.key!r} (or its attempt in an earlier node "
                "execution)",
                retry_of=retry_of,
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
