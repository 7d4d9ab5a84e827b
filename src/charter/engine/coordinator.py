"""The coordinator: recover, reconcile, confirm, resolve, resume (R1-R9).

``recover`` reads and fences; it never dispatches and never resumes (R6).
``reconcile`` asks an adapter for evidence and stores it; under the default
``evidence_settles = "confirm"`` a person confirms it (``confirm``) before it
settles anything. ``resolve`` is a person's settlement with evidence.
``resume`` continues a run only when nothing uncertain, expired, revoked,
stopped or exhausted stands in the way, under the engine's resume policy.
"""

from __future__ import annotations

import inspect
from collections.abc import Mapping
from typing import Any, Literal

from charter import secret
from charter.adapters import Adapter, Evidence, Outcome
from charter.adapters.protocol import blocking
from charter.attempts import late, settlement
from charter.attempts.evidence import Report, record, recordable
from charter.attempts.model import Attempt, AttemptStatus
from charter.attempts.store import conclusive_rows, evidence_from_row, load, settled_by
from charter.clock import seconds_us
from charter.contracts.contract import Contract, ResumeMode
from charter.contracts.principals import Principal, Right
from charter.engine import observed
from charter.engine.executor import Executor
from charter.engine.submitted import carried_and_let_go
from charter.errors import (
    AttemptAlreadySettled,
    LeaseHeld,
    NeedsIntervention,
    NotApplied,
    RunTerminal,
    StateError,
)
from charter.ids import check_text
from charter.queue import store as run_queue
from charter.recovery import policy, takeover
from charter.recovery import state as recovery
from charter.recovery.state import RecoveryState
from charter.runs import run as runs
from charter.runs import store as run_store
from charter.runs.liveness import process_json
from charter.runs.run import Run, RunStatus
from charter.runtime import Runtime
from charter.storage import Tx
from charter.waits import approvals

Resolution = Literal["succeeded", "failed", "written_off"]


class Coordinator:
    """Recovery operations over one engine's store."""

    def __init__(self, runtime: Runtime) -> None:
        self._runtime = runtime
        self._authority = runtime.authority
        self._db = runtime.db

    # -- recover (R1-R6) -------------------------------------------------------
    def recover(
        self,
        run_id: str,
        segment_id: str,
        *,
        force: bool = False,
        by: Principal | None = None,
    ) -> RecoveryState:
        """Make ``segment_id`` the owner of ``run_id`` and return the recovery state.

        Refuses a segment ID the run has used (R1) and a live lease unless
        ``force`` (audited; needs a principal with ``stop``). Increments the
        epoch (R2), voids older PREPARED attempts (R3), marks DISPATCHED ones
        of older owners UNKNOWN keeping every hold (R4). Reads only the store:
        nothing is sent and nothing resumes (R6). ``by`` needs ``recover`` (P3;
        it comes with ``run`` or ``resolve``); without ``by`` the engine acts.
        """
        check_text("run id", run_id)
        check_text("segment id", segment_id)  # A10: stored as given, or refused
        self._check_right(by, Right.RECOVER, run_id)
        return takeover.recover(self._runtime, run_id, segment_id, force=force, by=by)

    def _check_right(self, by: Principal | None, right: Right, entity: str) -> None:
        """P3: ``by`` holds ``right`` on the run (``recover``) or on the scope of the
        attempt (``reconcile``) ``entity`` names, or is refused, audited, changing
        nothing else. ``None`` is the engine acting for itself: code that holds the
        engine holds its store; the rights bind principals (every HTTP call)."""
        if by is None:
            return
        with self._db.transaction() as tx:
            if right is Right.RECOVER:
                mission_id, scope = runs.load(tx, entity).mission_id, "*"
            else:
                attempt = load(tx, entity)
                mission_id, scope = attempt.mission_id, attempt.scope
            self._authority.authorize(tx, by, mission_id, right, scope, entity=entity)

    def state(self, run_id: str) -> RecoveryState:
        """The recovery state without taking ownership (a read)."""
        with self._db.read() as tx:
            run = runs.load(tx, run_id)
            return recovery.build(tx, run, self._contract(tx, run.mission_id), [])

    # -- reconcile (R7, A8) ------------------------------------------------------
    def reconcile(
        self,
        attempt_id: str,
        adapter: Adapter,
        *,
        by: Principal | None = None,
        executor: Executor | None = None,
        segment_id: str | None = None,
    ) -> Evidence:
        """Ask for evidence on an uncertain attempt; store it; settle only if allowed.

        Strategies in order (A8): the adapter's lookup by key or reference;
        then, for an ``idempotent_keyed`` operation inside its dedupe window and
        only when ``executor`` owns the run (a replay is a send and needs the
        A2 condition), a same-key replay. Otherwise the evidence is
        indeterminate and a person decides. After a crash, ``segment_id`` names
        the segment that :meth:`recover` installed; the replay is sent as it.
        ``by`` needs ``reconcile`` on the attempt's scope (P3; it comes with
        ``run`` or ``resolve`` there); without ``by`` the engine acts.
        """
        self._check_right(by, Right.RECONCILE, attempt_id)
        with self._db.read() as tx:
            attempt = load(tx, attempt_id)
            self._check_reconcilable(tx, attempt)
            if segment_id is not None and executor is None:
                executor = self._owner(tx, attempt.run_id, segment_id)
        if adapter.name != attempt.adapter:
            raise StateError(
                f"attempt {attempt_id} belongs to adapter {attempt.adapter!r}, not {adapter.name!r}"
            )
        actor = by.name if by is not None else "engine:reconcile"
        try:
            found = adapter.reconcile(attempt)
            evidence = blocking(found) if inspect.isawaitable(found) else found
        except NotApplied as exc:
            evidence = Evidence.not_applied({"reason": exc.reason, **exc.evidence})
        except Exception as exc:
            evidence = Evidence.indeterminate({"lookup_error": f"{type(exc).__name__}: {exc}"})
        if not isinstance(evidence, Evidence):
            evidence = Evidence.indeterminate({"lookup_error": f"reconcile returned {evidence!r}"})
        hidden = list(secret.found(attempt.request))
        evidence = recordable(Report(evidence), hidden, self._runtime.config.answer_bytes).evidence
        if not evidence.conclusive and executor is not None:
            evidence = executor.replay(attempt, adapter) or evidence
        with self._db.transaction(gate=attempt.mission_id) as tx:
            current = load(tx, attempt_id)
            contract = self._contract(tx, current.mission_id)
            if current.status.settled or current.status is AttemptStatus.VOIDED:
                # Settled while we asked (a person, another reconcile): what the
                # lookup or the replay found is kept, and a contradiction opens
                # an incident (A8, F2).
                late.record_late(
                    tx,
                    current,
                    evidence,
                    units=contract.allowance.keys(),
                    actor=actor,
                    segment=None,
                    epoch=None,
                    source=evidence.source,
                    may_settle=False,
                )
                settled_meanwhile = True
            else:
                settled_meanwhile = False
                auto = self._auto and late.settles_by_itself(evidence)
                why = "evidence settled automatically (evidence_settles=auto)"
                settle = auto and self._apply(
                    tx, current, evidence, contract, actor=actor, reason=why
                )
                record(tx, current, evidence, actor=actor, epoch=None, settled=settle)
                done = load(tx, attempt_id) if settle else None
                if settle and executor is None:  # K2, K5: as a person's settlement
                    run_queue.wake(tx, current.run_id)  # (an owner goes on by itself)
        if settled_meanwhile:
            raise _settled_meanwhile(current)
        if done is not None:
            observed.told(self._runtime.observer, done, current.status)
        return evidence

    @property
    def _auto(self) -> bool:
        """Whether the contract's evidence settles by itself where it proves enough (R7)."""
        return self._runtime.config.evidence_settles == "auto"

    def _owner(self, tx: Tx, run_id: str, segment_id: str) -> Executor:
        """The executor of the segment that owns ``run_id`` (its lease is checked
        again, under the gate, before anything is sent)."""
        run = runs.load(tx, run_id)
        if run.owner_segment != segment_id:
            raise StateError(
                f"segment {segment_id!r} does not own run {run_id} (its owner is "
                f"{run.owner_segment!r}, epoch {run.epoch}); recover it as a new segment first",
                run_id=run_id,
                segment_id=segment_id,
            )
        if run.lease_expires_us <= tx.now_us:
            raise StateError(
                f"segment {segment_id!r} no longer holds run {run_id}: its lease expired by the "
                "store's clock; recover the run as a new segment and reconcile right after",
                run_id=run_id,
                segment_id=segment_id,
            )
        # Acts for the owner while no executor holds it (a live one fences it).
        return self._as_owner(run, segment_id, run.lease_expires_us, None)

    def _as_owner(
        self, run: Run, segment_id: str, lease_expires_us: int, claim: str | None
    ) -> Executor:
        """An executor acting as the run's owning segment (checked again by every write)."""
        return Executor(
            self._runtime,
            run_id=run.id,
            mission_id=run.mission_id,
            segment_id=segment_id,
            epoch=run.epoch,
            principal=run.principal,
            lease_expires_us=lease_expires_us,
            claim=claim,
        )

    def _check_reconcilable(self, tx: Tx, attempt: Attempt) -> None:
        if attempt.status.settled or attempt.status is AttemptStatus.VOIDED:
            raise AttemptAlreadySettled(
                f"attempt {attempt.id} is already {attempt.status.value}; it is never "
                "performed or settled again",
                attempt_id=attempt.id,
                status=attempt.status.value,
            )
        if attempt.status is AttemptStatus.PREPARED:
            raise StateError(
                f"attempt {attempt.id} is PREPARED: it was never sent, there is "
                "nothing to reconcile",
                attempt_id=attempt.id,
            )
        if attempt.status is AttemptStatus.DISPATCHED:
            run = runs.load(tx, attempt.run_id)
            if run.epoch == attempt.dispatched_epoch and run.lease_expires_us > tx.now_us:
                raise StateError(
                    f"attempt {attempt.id} is DISPATCHED by a live owner (segment "
                    f"{run.owner_segment}); its result may still arrive — reconcile after "
                    "the lease expires or after recover",
                    attempt_id=attempt.id,
                )

    # -- settlement by evidence or a person (R7, R8) -----------------------------
    def confirm(self, attempt_id: str, *, by: Principal, evidence_id: str | None = None) -> Attempt:
        """Settle an uncertain attempt on recorded conclusive evidence (needs ``resolve``)."""
        with self._db.transaction() as tx:
            attempt = load(tx, attempt_id)
            contract = self._authority.authorize(
                tx, by, attempt.mission_id, Right.RESOLVE, attempt.scope, entity=attempt_id
            )
            self._check_reconcilable(tx, attempt)
            rows = conclusive_rows(tx, attempt_id)
            if evidence_id is not None:
                rows = [r for r in rows if r["id"] == evidence_id]
            if not rows:
                raise StateError(
                    f"attempt {attempt_id} has no conclusive evidence to confirm; run "
                    "`charter reconcile` or resolve it with evidence of your own",
                    attempt_id=attempt_id,
                )
            row = rows[0]
            evidence = evidence_from_row(row)
            if not self._apply(
                tx,
                attempt,
                evidence,
                contract,
                actor=by.name,
                reason=f"confirmed evidence {row['id']}",
            ):
                raise _settled_meanwhile(attempt)
            settled_by(tx, row["id"])
            run_queue.wake(tx, attempt.run_id)  # K2: a person's settlement
            done = load(tx, attempt_id)
        return observed.told(self._runtime.observer, done, attempt.status)

    def resolve(
        self,
        attempt_id: str,
        *,
        by: Principal,
        outcome: Resolution,
        evidence: str | Mapping[str, Any],
        cost: Mapping[str, int] | None = None,
        result: Any = None,
        confirm_above_hold: bool = False,
        adapter: Adapter | None = None,
    ) -> Attempt:
        """A person settles an uncertain attempt with evidence (R8, L9).

        ``written_off`` settles at the full hold; ``succeeded``/``failed`` at
        ``cost`` as reported (an overrun opens an incident, L5). ``cost`` is the
        person's input: anything but amounts is a ``UsageError``, and so is a
        cost more than ten times the hold in some unit unless
        ``confirm_above_hold`` (a typo caught before it is recorded).
        ``result`` is what the node gets on replay; given the attempt's
        ``adapter``, it is checked and put in the form that adapter reads
        (:func:`~charter.attempts.settlement.person_result`).
        """
        reported = settlement.person_cost(cost)
        if outcome not in ("succeeded", "failed", "written_off"):
            raise StateError("outcome must be 'succeeded', 'failed' or 'written_off'")
        if not evidence:
            raise StateError("a resolution needs evidence: what was seen, and where")
        with self._db.transaction() as tx:
            attempt = load(tx, attempt_id)
            contract = self._authority.authorize(
                tx, by, attempt.mission_id, Right.RESOLVE, attempt.scope, entity=attempt_id
            )
            self._check_reconcilable(tx, attempt)
            result = settlement.person_result(adapter, attempt, outcome, result)
            status = AttemptStatus(outcome)
            actual = dict(attempt.estimate) if status is AttemptStatus.WRITTEN_OFF else reported
            if status is not AttemptStatus.WRITTEN_OFF and not confirm_above_hold:
                settlement.refuse_far_above_hold(attempt, actual)
            detail = evidence if isinstance(evidence, str) else dict(evidence)
            applied = Outcome(
                "succeeded" if status is AttemptStatus.SUCCEEDED else "failed",
                result,
                actual,
                {"resolution": detail},
            )
            verdict: Literal["applied", "not_applied", "indeterminate"] = (
                "indeterminate" if status is AttemptStatus.WRITTEN_OFF else "applied"
            )
            kept = Evidence(
                verdict, applied if verdict == "applied" else None, detail, source="person"
            )
            if not settlement.settle(
                tx,
                attempt,
                status,
                actual=actual,
                result=result,
                receipt={"resolution": detail},
                price_source=f"resolution by {by.name}",
                reason=f"resolved by {by.name}",
                units=contract.allowance.keys(),
                actor=by.name,
                segment=None,
                epoch=None,
                from_statuses=(AttemptStatus.DISPATCHED, AttemptStatus.UNKNOWN),
            ):
                raise _settled_meanwhile(attempt)
            record(tx, attempt, kept, actor=by.name, epoch=None, settled=True)
            run_queue.wake(tx, attempt.run_id)  # K2: a person's settlement
            done = load(tx, attempt_id)
        return observed.told(self._runtime.observer, done, attempt.status)

    def _apply(
        self,
        tx: Tx,
        attempt: Attempt,
        evidence: Evidence,
        contract: Contract,
        *,
        actor: str,
        reason: str,
    ) -> bool:
        return settlement.settle_by_evidence(
            tx,
            attempt,
            evidence,
            reason=reason,
            units=contract.allowance.keys(),
            actor=actor,
            segment=None,
            epoch=None,
            from_statuses=(AttemptStatus.DISPATCHED, AttemptStatus.UNKNOWN),
        )

    # -- resume (R9) -----------------------------------------------------------------
    def resume(
        self,
        run_id: str,
        segment_id: str,
        *,
        by: Principal | None = None,
        force: bool = False,
    ) -> Executor:
        """Continue a run as ``segment_id`` under the engine's resume policy.

        ``segment_id`` is either the owner that ``recover`` installed, or a new
        segment (a takeover under R1, epoch incremented). No mode continues past
        an unresolved attempt, an expired approval, revoked authority, a stop
        condition or an exhausted limit. ``human`` mode needs ``by``: a
        principal with ``run`` rights in the mission.
        """
        check_text("run id", run_id)
        check_text("segment id", segment_id)  # A10: stored as given, or refused
        with self._db.read() as tx:
            run = runs.load(tx, run_id)
        if run.status.terminal:
            raise RunTerminal(
                f"run {run_id} is {run.status.value}; a terminal run is never reopened — "
                "start a reviewed new linked run",
                run_id=run_id,
            )
        if by is not None:
            with self._db.transaction() as tx:
                self._authority.vouch(tx, by, mission_id=run.mission_id, entity=run_id)
        if run.owner_segment != segment_id:
            self.recover(run_id, segment_id, force=force, by=by)
        if by is not None:  # the continuation, authorised as any decision is (audited)
            with self._db.transaction() as tx:
                if self._mode(self._authority.current(tx, run.mission_id)) == "human":
                    self._authority.authorize_run(tx, by, run.mission_id, entity=run_id)
        actor = by.name if by is not None else f"segment:{segment_id}"
        with self._db.transaction(gate=run.mission_id) as tx:
            run = runs.load(tx, run_id)
            approvals.renew_expired(
                tx, run_id, actor=actor, epoch=run.epoch, ask_again=not run.status.ending
            )
        run, contract, mode, ahead, blockers = self._judged(run_id, by)
        with self._db.transaction(gate=run.mission_id) as tx:
            now = runs.load(tx, run_id)
            shown = False
            if (now.epoch, now.owner_segment) != (run.epoch, segment_id):
                blockers.append(f"the run was taken over meanwhile (epoch {now.epoch})")
            else:  # what may have changed since the view was read, under the gate
                blockers += policy.blockers(recovery.build(tx, now, contract, []), contract)
                # K5 (a run another continuation raced us to is that one's)
                shown = policy.shown_waiting(tx, now, list(dict.fromkeys(blockers)), actor)
            if not blockers and not run_queue.use_go_ahead(tx, run_id, ahead):
                blockers.append("the go-ahead was used by another continuation meanwhile")
            if blockers:
                found = list(dict.fromkeys(blockers))
                raise tx.refused(
                    NeedsIntervention(
                        f"run {run_id} cannot resume: " + "; ".join(found),
                        run_id=run_id,
                        blockers=found,
                        mode=mode,
                    ),
                    mission_id=run.mission_id,
                    kind="resume.refused",
                    entity=run_id,
                    actor=actor,
                    payload={"blockers": found, "mode": mode},
                    keep_changes=shown,
                )
            expires, claim = self._claim(
                tx, now, segment_id, actor=actor, mode=mode, force=force, ahead=ahead
            )
        return self._as_owner(now, segment_id, expires, claim)

    def _judged(
        self, run_id: str, by: Principal | None
    ) -> tuple[Run, Contract, ResumeMode, str | None, list[str]]:
        """The run, its contract, the resume mode, the go-ahead a continuation
        without a person uses, and what stands in the way by the policy (R9).
        Judged on a read-only view, outside any write: a resume rule may read
        the engine (a write held here would deadlock it)."""
        with self._db.read() as tx:
            run = runs.load(tx, run_id)
            contract = self._contract(tx, run.mission_id)
            state = recovery.build(tx, run, contract, [])
            row = run_queue.queued(tx, run_id) if by is None else None
            let_go = run_store.let_go(tx, run_id)
        ahead = None if row is None else row["go_ahead_by"]
        mode = self._mode(contract)
        rules = self._runtime.config.resume_rules
        who = ahead if by is None else by.name
        blockers = policy.judge(state, contract, mode, who, rules, let_go=let_go)
        return run, contract, mode, ahead, blockers

    def go_ahead(self, run_id: str, *, by: Principal) -> Run:
        """``by``'s word that the workers carrying ``run_id`` may continue it: what
        ``resume`` by that person would allow (R9's ``human`` policy needs it),
        done by the next worker that takes the run, with its plans and adapters,
        not in the deciding process. Recorded and audited; the run is due at
        once (K2). One go-ahead is used by one continuation. Refused, typed and
        changing nothing but the refusal's record, where ``resume`` would be
        (what no mode passes, no ``run`` right), and for a run no worker
        carries, one not begun yet, or one an executor holds now."""
        check_text("run id", run_id)
        with self._db.read() as tx:
            run = runs.load(tx, run_id)
        if run.status.terminal:
            raise RunTerminal(
                f"run {run_id} is {run.status.value}: it never goes on", run_id=run_id
            )
        with self._db.transaction() as tx:
            self._authority.vouch(tx, by, mission_id=run.mission_id, entity=run_id)
            self._authority.authorize_run(tx, by, run.mission_id, entity=run_id)
        run, contract, mode, _, blockers = self._judged(run_id, by)
        with self._db.transaction(gate=run.mission_id) as tx:
            now = runs.load(tx, run_id)
            carried_and_let_go(tx, now)
            blockers += policy.blockers(recovery.build(tx, now, contract, []), contract)
            if blockers:
                found = list(dict.fromkeys(blockers))
                raise tx.refused(
                    NeedsIntervention(
                        f"run {run_id} cannot go on: " + "; ".join(found),
                        run_id=run_id,
                        blockers=found,
                        mode=mode,
                    ),
                    mission_id=run.mission_id,
                    kind="go_ahead.refused",
                    entity=run_id,
                    actor=by.name,
                    payload={"blockers": found, "mode": mode},
                )
            run_queue.give_go_ahead(tx, run_id, by.name)
            tx.audit(
                run.mission_id,
                "run.go_ahead",
                run_id,
                actor=by.name,
                epoch=now.epoch,
                payload={"mode": mode},
            )
            return runs.load(tx, run_id)

    def _claim(
        self,
        tx: Tx,
        run: Run,
        segment_id: str,
        *,
        actor: str,
        mode: str,
        force: bool,
        ahead: str | None,
    ) -> tuple[int, str]:
        """Make the returned executor the one holding the run (F1); its lease and claim.

        The owner's segment is held by at most one live executor. One that is
        still holding it (its claim is set and its lease runs) is not displaced
        by naming the segment, unless forced; once it stopped (blocked: it let
        go of its claim) or its lease expired, the new executor takes the claim
        and any older executor of the segment is fenced at its next write.
        """
        if not force and run_store.held_alive(tx, run):
            raise tx.refused(
                LeaseHeld(
                    f"segment {segment_id!r} of run {run.id} is being executed by another "
                    "executor until its lease expires; wait, or force the resume (audited) if "
                    "that executor is known dead",
                    run_id=run.id,
                    segment_id=segment_id,
                    lease_expires_us=run.lease_expires_us,
                ),
                mission_id=run.mission_id,
                kind="resume.refused",
                entity=run.id,
                actor=actor,
                payload={"segment": segment_id, "reason": "segment_held"},
            )
        claim = tx.ids.new("clm")
        run_store.hold(tx, run.id, run.epoch, claim, process_json())
        if run.status is not RunStatus.ACTIVE:
            runs.set_status(
                tx, run, RunStatus.ACTIVE, f"resumed ({mode})", actor=actor, segment=segment_id
            )
        # The owner continues: its lease starts afresh (same owner, same epoch).
        expires = tx.now_us + seconds_us(self._runtime.config.lease_seconds)
        run_store.restart_lease(tx, run.id, run.epoch, expires)
        tx.audit(
            run.mission_id,
            "run.resumed",
            run.id,
            actor=actor,
            segment=segment_id,
            epoch=run.epoch,
            payload={"mode": mode} if ahead is None else {"mode": mode, "go_ahead_by": ahead},
        )
        return expires, claim

    def _mode(self, contract: Contract) -> ResumeMode:
        return policy.mode(self._runtime.config.resume, contract)

    def _contract(self, tx: Tx, mission_id: str) -> Contract:
        return self._authority.current(tx, mission_id)


def _settled_meanwhile(attempt: Attempt) -> AttemptAlreadySettled:
    """Another worker settled the attempt between our read and our write."""
    return AttemptAlreadySettled(
        f"attempt {attempt.id} was settled by someone else meanwhile; it is never settled "
        "twice (see `charter attempts`)",
        attempt_id=attempt.id,
    )
