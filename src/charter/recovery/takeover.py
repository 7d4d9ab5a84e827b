"""Recovery's takeover (R1-R6): a new segment becomes the run's owner.

It reads and fences, in one transaction under the mission's gate (the store's
clock read with the gate, F1): it refuses a segment ID the run has used and a
live lease unless forced by a principal with ``stop``; it increments the epoch;
it voids PREPARED attempts of older epochs and marks DISPATCHED ones UNKNOWN,
keeping every hold; and it says whether the run needs a person. It never
dispatches and never resumes (R6).
"""

from __future__ import annotations

import contextlib
import json

from charter.attempts import settlement
from charter.attempts.model import Attempt, AttemptStatus
from charter.attempts.store import list_attempts, load
from charter.clock import seconds_us
from charter.contracts.contract import Contract
from charter.contracts.principals import Principal, Right
from charter.errors import LeaseHeld, NotAuthorized, SegmentReused
from charter.plans import store as plans_store
from charter.recovery import store as recovery_store
from charter.recovery.state import RecoveryState, build
from charter.runs import run as runs
from charter.runs import store as run_store
from charter.runs.liveness import owner_dead
from charter.runs.run import Run, RunStatus
from charter.runtime import Runtime
from charter.storage import Tx
from charter.waits import approvals


def recover(
    runtime: Runtime,
    run_id: str,
    segment_id: str,
    *,
    force: bool = False,
    by: Principal | None = None,
) -> RecoveryState:
    """See :meth:`charter.engine.coordinator.Coordinator.recover`."""
    with runtime.db.read() as tx:
        mission_id = runs.load(tx, run_id).mission_id
    with runtime.db.transaction(gate=mission_id) as tx:
        run = runs.load(tx, run_id)
        contract = runtime.authority.current(tx, run.mission_id)
        if run.status.terminal:
            return build(tx, run, contract, [])
        actor, dead = _may_take(runtime, tx, run, segment_id, force=force, by=by)
        epoch = _take(runtime, tx, run, segment_id, actor=actor, force=force, dead=dead)
        voided, uncertain, written_off = _fence(
            tx, run_id, epoch, contract, actor=actor, segment=segment_id
        )
        ending = runs.load(tx, run_id).status.ending  # a void may have ended a stop
        expired = approvals.renew_expired(
            tx, run_id, actor=actor, epoch=epoch, ask_again=not ending
        )
        run = _assess(tx, run_id, contract, uncertain, actor=actor, segment=segment_id)
        state = build(tx, run, contract, voided, expired)
    _told(runtime, written_off)
    return state


def _told(runtime: Runtime, settled: list[Attempt]) -> None:
    """Tell the engine's observer what recovery settled, once it is committed
    (no node reports it); an observer's error is not recovery's."""
    observer = runtime.observer
    if observer is None:
        return
    for attempt in settled:
        with contextlib.suppress(Exception):
            observer.attempt_settled(attempt)


def _may_take(
    runtime: Runtime, tx: Tx, run: Run, segment_id: str, *, force: bool, by: Principal | None
) -> tuple[str, str | None]:
    """R1: a new segment, and the owner's lease expired, or its process is provably
    gone (see :mod:`charter.runs.liveness`), or a forced takeover by a principal
    with ``stop``; the actor to record, and the dead owner's process if that was why."""
    if run_store.segment_used(tx, run.id, segment_id):
        raise SegmentReused(
            f"segment {segment_id!r} was already used by run {run.id}; every "
            "continuation needs a new segment ID",
            run_id=run.id,
            segment_id=segment_id,
        )
    if by is not None:
        runtime.authority.vouch(tx, by, mission_id=run.mission_id, entity=run.id)
    if run.lease_expires_us > tx.now_us:
        holder = run_store.owner_process(tx, run.id)
        if owner_dead(holder):
            return (by.name if by is not None else f"segment:{segment_id}"), holder
        if not force:
            raise LeaseHeld(
                f"run {run.id} is owned by segment {run.owner_segment} until its lease "
                f"expires in {(run.lease_expires_us - tx.now_us) / 1e6:.1f}s; wait, or "
                "force the takeover (audited) if that owner is known dead",
                run_id=run.id,
                lease_expires_us=run.lease_expires_us,
            )
        if by is None:
            raise NotAuthorized("forcing a takeover needs an authenticated principal with 'stop'")
        runtime.authority.authorize(tx, by, run.mission_id, Right.STOP, entity=run.id)
    return (by.name if by is not None else f"segment:{segment_id}"), None


def _take(
    runtime: Runtime,
    tx: Tx,
    run: Run,
    segment_id: str,
    *,
    actor: str,
    force: bool,
    dead: str | None,
) -> int:
    """R2: the epoch moves on and the segment owns the run, idle (no executor
    holds it until a resume); the new epoch."""
    epoch = run.epoch + 1
    expires = tx.now_us + seconds_us(runtime.config.lease_seconds)
    run_store.take_over(
        tx,
        run.id,
        from_epoch=run.epoch,
        epoch=epoch,
        segment_id=segment_id,
        lease_expires_us=expires,
        forced=force,
    )
    tx.audit(
        run.mission_id,
        "run.recovered",
        run.id,
        actor=actor,
        segment=segment_id,
        epoch=epoch,
        before=str(run.epoch),
        after=str(epoch),
        payload={
            "previous_segment": run.owner_segment,
            "forced": force,
            **({} if dead is None else {"owner_dead": json.loads(dead)}),
        },
    )
    return epoch


def _fence(
    tx: Tx, run_id: str, epoch: int, contract: Contract, *, actor: str, segment: str
) -> tuple[list[str], int, list[Attempt]]:
    """R3, R4: older PREPARED attempts voided, DISPATCHED ones UNKNOWN with their
    holds (a ``read_only`` one then written off at its hold if the contract
    opts in, A7, as a live send's would be); the voided IDs, how many
    attempts are uncertain, and those written off."""
    voided: list[str] = []
    written_off: list[Attempt] = []
    uncertain = 0
    for a in list_attempts(tx, run_id=run_id, unresolved=True):
        if a.status is AttemptStatus.PREPARED and a.admitted_epoch < epoch:
            settlement.void(
                tx,
                a,
                f"fenced by recovery (epoch {epoch})",
                actor=actor,
                segment=segment,
                epoch=epoch,
            )
            voided.append(a.id)
        elif a.status is AttemptStatus.DISPATCHED:
            settlement.mark_unknown(tx, a, "owner lost", actor=actor, segment=segment, epoch=epoch)
            lost = "owner lost at recovery"
            if settlement.write_off_read_only(
                tx, a, contract, why=lost, segment=segment, epoch=epoch
            ):
                written_off.append(load(tx, a.id))
            else:
                recovery_store.count_takeover(tx, a.id, run_id)
                uncertain += 1
        elif a.status is AttemptStatus.UNKNOWN:
            recovery_store.count_takeover(tx, a.id, run_id)
            uncertain += 1
    return voided, uncertain, written_off


def _assess(
    tx: Tx, run_id: str, contract: Contract, uncertain: int, *, actor: str, segment: str
) -> Run:
    """R6: an effect lost in too many takeovers (K1: counted per unresolved
    effect, not per run), a node that crashed its process too often, or uncertain
    attempts need a person; a stopping run stays stopping (N5)."""
    crashed = plans_store.running(tx, run_id)
    plans_store.count_crashes(tx, run_id)
    run = runs.load(tx, run_id)
    reason = None
    most = recovery_store.most_takeovers(tx, run_id)
    if most > contract.max_recoveries:
        reason = (
            f"an attempt was left unresolved by {most} takeovers, more than the "
            f"contract's limit of {contract.max_recoveries}"
        )
    elif any(r["crashes"] + 1 >= contract.max_node_crashes for r in crashed):
        reason = f"a node crashed its process {contract.max_node_crashes} times in a row"
    elif uncertain:
        reason = f"{uncertain} attempt(s) with uncertain outcome"
    # A stopping run stays stopping: its people asked for it to end, and the
    # recovery state already names what they must settle first (N5).
    if reason is not None and not (run.status.terminal or run.status is RunStatus.STOPPING):
        runs.set_status(tx, run, RunStatus.NEEDS_INTERVENTION, reason, actor=actor, segment=segment)
        run = runs.load(tx, run_id)
    return run
