"""The executor: the owner of one segment of a run, and the attempt path.

An :class:`Executor` is what ``Engine.start_run`` (and, after a crash,
``Coordinator.resume``) hands back. It holds the segment's epoch and performs
attempts in the order the rules demand:

1. **admission** (A1): authority under the current contract, run status, stop
   conditions and the allowance, checked and held in one transaction (L3);
2. **dispatch commit** (A2): DISPATCHED is committed *before* the adapter is
   called, conditioned on this executor's epoch, segment and unexpired lease,
   and on a valid approval when one is required (W2). When no approval wait
   comes between them, admission and dispatch share one transaction and the
   attempt still records both phases;
3. **send**: the adapter gets the attempt's idempotency key, the epoch as a
   fencing token and a send deadline no later than the lease (A5, F3);
4. **settlement**: a result settles the hold; a proven non-application is
   FAILED; any other exception, a timeout or a lost response is UNKNOWN and
   keeps its hold (A3, L4).

A process killed between any two of these steps leaves a state that
``Coordinator.recover`` knows how to fence (see :mod:`charter.crashpoints`).
"""

from __future__ import annotations

import contextlib
import json
from dataclasses import dataclass
from typing import TYPE_CHECKING, Any

from charter import admission, approvals, ledger, runs, secret, sending, settlement
from charter.adapters import Adapter, Dispatch, EffectClass, Estimate, Evidence
from charter.approvals import ApprovalStatus
from charter.attempts import (
    Attempt,
    AttemptStatus,
    Effect,
    count_unresolved,
    idempotency_key_for,
    load,
)
from charter.clock import seconds_us
from charter.errors import (
    AdapterError,
    AdmissionRefused,
    AmountOverflow,
    ApprovalRequired,
    Blocked,
    CharterError,
    Fenced,
    NotAuthorized,
    NotFound,
    StateError,
    StoreConflict,
)
from charter.hashing import canonical, digest
from charter.incidents import open_incident
from charter.principals import Right
from charter.runs import RunStatus
from charter.secret import Secret
from charter.storage import Row, Tx

if TYPE_CHECKING:
    from charter.engine import Engine
    from charter.nodes import Plan

#: Requests are recorded as canonical JSON; NaN and infinities are refused.
#: Requests are recorded (and hashed) with each secret as its name only (S3).
_REQUEST_JSON = json.JSONEncoder(
    sort_keys=True, separators=(",", ":"), allow_nan=False, default=secret.placeholder
)

#: Run statuses in which a same-key replay may be sent: a replay can perform the
#: effect for the first time, so a paused, stopping or ended run sends none.
_REPLAYABLE = frozenset({RunStatus.ACTIVE, RunStatus.WAITING, RunStatus.NEEDS_INTERVENTION})

_OWNER_SQL = (
    "SELECT r.status, r.epoch, r.owner_segment, r.owner_claim, r.lease_expires_us, r.linked_from, "
    "m.contract_version, "
    "m.attempts_admitted, m.attempts_failed, "
    "(SELECT COUNT(*) FROM incidents i WHERE i.mission_id = r.mission_id "
    "AND i.status = 'open') AS open_incidents, "
    # "unit:amount,..." (units are plain names): one statement, one round trip.
    "(SELECT {group_concat}(a.unit || ':' || a.available, ',') FROM allowances a "
    "WHERE a.mission_id = r.mission_id) AS available "
    # No row locks: the caller holds the mission's gate.
    "FROM missions m JOIN runs r ON m.id = r.mission_id WHERE r.id = ?"
)

_INSERT_ATTEMPT = (
    "INSERT INTO attempts (id, mission_id, run_id, node_id, execution, effect_key, generation, "
    "adapter, operation, effect_class, status, principal, admitted_epoch, dispatched_epoch, "
    "idempotency_key, request_hash, request, estimate, price_source, retry_of, "
    "send_deadline_us, prepared_at_us, dispatched_at_us) "
    "VALUES (?, ?, ?, ?, ?, ?, ?, ?, ?, ?, ?, ?, ?, ?, ?, ?, ?, ?, ?, ?, ?, ?, ?)"
)


@dataclass(frozen=True)
class Call:
    """One intended effect, before admission: what the caller asked for."""

    adapter: Adapter
    operation: str
    request: Any
    request_json: str
    request_hash: str
    effect_class: EffectClass
    estimate: Estimate

    @property
    def scope(self) -> str:
        return f"{self.adapter.name}.{self.operation}"

    @property
    def secrets(self) -> list[Secret]:
        """The request's secrets (S3); found without a search when it has none."""
        if f'"{secret.MARK}"' not in self.request_json:
            return []
        return list(secret.found(self.request))


def request_hash(adapter: str, operation: str, request_json: str) -> str:
    """The identity of a request: adapter, operation and canonical JSON body."""
    return digest(f"{adapter}\n{operation}\n{request_json}")


class Executor:
    """The owner of one segment of one run."""

    def __init__(
        self,
        engine: Engine,
        *,
        run_id: str,
        mission_id: str,
        segment_id: str,
        epoch: int,
        principal: str,
        lease_expires_us: int,
        claim: str | None = None,
    ) -> None:
        self.engine = engine
        self.run_id = run_id
        self.mission_id = mission_id
        self.segment_id = segment_id
        self.epoch = epoch
        self.principal = principal
        self._lease_expires_us = lease_expires_us
        #: Which executor of the segment this is (F1): ``None`` acts for an idle
        #: owner (a reconcile as the recovered segment), never beside a live one.
        self._claim = claim
        self._db = engine._db
        #: The units budgeted by the contract version this executor last admitted under.
        self._budget_units: frozenset[str] | None = None

    def __repr__(self) -> str:
        return f"<Executor run={self.run_id} segment={self.segment_id} epoch={self.epoch}>"

    # -- ownership (F1, F2) -------------------------------------------------
    def _fenced(self, why: str, current_epoch: int) -> Fenced:
        return Fenced(
            f"executor of run {self.run_id} (segment {self.segment_id}, epoch {self.epoch}) "
            f"is fenced: {why}; it must send nothing more",
            run_id=self.run_id,
            epoch=self.epoch,
            current_epoch=current_epoch,
        )

    def _own(self, tx: Tx) -> Row:
        """Check ownership in ``tx`` (under the mission's gate); renew the lease if
        half of it is used."""
        tx.lock_mission(self.mission_id)
        row = tx.one(_OWNER_SQL, self.run_id)
        if row is None:
            raise self._fenced("the run no longer exists", -1)
        if row["epoch"] != self.epoch or row["owner_segment"] != self.segment_id:
            raise self._fenced(f"the run was taken over (epoch {row['epoch']})", row["epoch"])
        if row["owner_claim"] != self._claim:
            raise self._fenced("another executor resumed its segment", row["epoch"])
        if row["lease_expires_us"] <= tx.now_us:
            raise self._fenced("its lease expired by the store's clock", row["epoch"])
        lease_us = seconds_us(self.engine.config.lease_seconds)
        if row["lease_expires_us"] - tx.now_us < lease_us // 2:
            self._lease_expires_us = tx.now_us + lease_us
            tx.write(
                "UPDATE runs SET lease_expires_us = ? WHERE id = ? AND epoch = ?",
                self._lease_expires_us,
                self.run_id,
                self.epoch,
            )
            self._audit_lease(tx, row["lease_expires_us"], self._lease_expires_us)
        else:
            self._lease_expires_us = row["lease_expires_us"]
        return row

    def renew_lease(self) -> int:
        """Extend the lease (fenced by epoch); returns the new expiry in µs."""
        lease_us = seconds_us(self.engine.config.lease_seconds)
        with self._db.transaction(gate=self.mission_id) as tx:
            expires = tx.now_us + lease_us
            changed = tx.run(
                "UPDATE runs SET lease_expires_us = ? WHERE id = ? AND epoch = ? "
                "AND owner_segment = ? AND COALESCE(owner_claim, '') = ? "
                "AND lease_expires_us > ?",
                expires,
                self.run_id,
                self.epoch,
                self.segment_id,
                self._claim or "",
                tx.now_us,
            )
            if not changed:
                row = tx.one("SELECT epoch FROM runs WHERE id = ?", self.run_id)
                raise self._fenced(
                    "its lease expired or the run was taken over", row["epoch"] if row else -1
                )
            self._audit_lease(tx, self._lease_expires_us, expires)
        self._lease_expires_us = expires
        return expires

    def _audit_lease(self, tx: Tx, before: int, after: int) -> None:
        """A renewal changes the run's row, so it is a transition like any other (S1)."""
        tx.audit(
            self.mission_id,
            "run.lease_renewed",
            self.run_id,
            actor=self.principal,
            segment=self.segment_id,
            epoch=self.epoch,
            before=str(before),
            after=str(after),
        )

    # -- the attempt path ---------------------------------------------------
    def prepare_call(self, adapter: Adapter, operation: str, request: Any) -> Call:
        """Validate a call and estimate it, outside any transaction."""
        spec = adapter.operations.get(operation)
        if spec is None:
            raise AdmissionRefused(
                f"adapter {adapter.name!r} has no operation {operation!r}; it declares "
                f"{sorted(adapter.operations)}",
                adapter=adapter.name,
                operation=operation,
            )
        try:
            request_json = _REQUEST_JSON.encode(request)
        except (TypeError, ValueError) as exc:
            raise AdmissionRefused(
                f"the request for {adapter.name}.{operation} must be JSON-serialisable ({exc}); "
                "it is recorded before it is sent"
            ) from None
        if not _text_keys(request):
            raise AdmissionRefused(
                f"the request for {adapter.name}.{operation} has a key that is not a string; "
                "it is recorded as JSON, where {1: x} and {'1': x} are one request, so a send "
                "rebuilt from the record would differ from the first: use string keys"
            )
        if f'"{secret.MARK}"' in request_json and secret.has_reserved_key(request):
            raise AdmissionRefused(
                f"the request for {adapter.name}.{operation} uses the key {secret.MARK!r}, "
                "which marks a recorded secret; wrap secret values in charter.Secret instead"
            )
        estimate = adapter.estimate(operation, request)
        if not isinstance(estimate, Estimate):
            raise AdapterError(f"adapter {adapter.name!r} estimate() must return an Estimate")
        return Call(
            adapter,
            operation,
            request,
            request_json,
            request_hash(adapter.name, operation, request_json),
            spec.effect,
            estimate,
        )

    def _admission(self, call: Call, effect: Effect, *, dispatch: bool = True) -> Attempt:
        """The admission transaction; a repeat of an effect's generation is reported
        as such, and records nothing."""
        try:
            with self._db.transaction(gate=self.mission_id) as tx:
                return self._admit(tx, call, effect, dispatch=dispatch)
        except StoreConflict:
            # The unique index refused the row (it may travel with COMMIT): say
            # which attempt the effect already has.
            with self._db.read() as tx:
                admission.check_effect(self, tx, effect)
            raise

    def _admit(self, tx: Tx, call: Call, effect: Effect, *, dispatch: bool = True) -> Attempt:
        """A1 + (when no approval wait intervenes) A2, in the caller's transaction."""
        row = self._own(tx)
        contract = self.engine._contracts.get(tx, self.mission_id, row["contract_version"])
        actor = self.principal
        status = RunStatus(row["status"])
        if status is not RunStatus.ACTIVE:
            raise tx.refused(
                AdmissionRefused(
                    f"run {self.run_id} is {status.value}; "
                    + (
                        "a terminal run admits nothing more (start a reviewed new linked run)"
                        if status.terminal
                        else "nothing new is admitted until it is active again "
                        "(see `charter show RUN`)"
                    ),
                    run_status=status.value,
                ),
                mission_id=self.mission_id,
                kind="admission.refused",
                entity=self.run_id,
                actor=actor,
                payload={"scope": call.scope, "run_status": status.value},
            )
        if not contract.allows(self.principal, Right.RUN, call.scope):
            raise tx.refused(
                NotAuthorized(
                    f"principal {self.principal!r} has no 'run' right on {call.scope} under "
                    f"contract v{row['contract_version']}",
                    principal=self.principal,
                    scope=call.scope,
                ),
                mission_id=self.mission_id,
                kind="admission.refused",
                entity=self.run_id,
                actor=actor,
                payload={"scope": call.scope, "reason": "not_authorized"},
            )
        admission.check_stop(self, tx, contract, row, call)
        admission.check_allowance(self, tx, contract, row, call)

        if effect.followed(row["linked_from"]):
            admission.check_effect(self, tx, effect)
        self._budget_units = frozenset(contract.allowance)
        attempt_id = tx.ids.new("att")
        needs_approval = contract.approvals.requires(call.scope)
        dispatch_now = dispatch
        standing = ApprovalStatus.APPROVED
        if needs_approval:
            standing, _ = approvals.standing(
                tx,
                contract,
                mission_id=self.mission_id,
                run_id=self.run_id,
                effect=approvals.effect_id(
                    self.run_id, effect.node_id, effect.execution, effect.key
                ),
                scope=call.scope,
                request_hash=call.request_hash,
                actor=actor,
                epoch=self.epoch,
            )
            dispatch_now = dispatch and standing is ApprovalStatus.APPROVED
        now = tx.now_us
        deadline = self._send_deadline(now) if dispatch_now else None
        attempt = Attempt(
            id=attempt_id,
            mission_id=self.mission_id,
            run_id=self.run_id,
            node_id=effect.node_id,
            execution=effect.execution,
            effect_key=effect.key,
            adapter=call.adapter.name,
            operation=call.operation,
            effect_class=call.effect_class.value,
            status=AttemptStatus.DISPATCHED if dispatch_now else AttemptStatus.PREPARED,
            principal=self.principal,
            admitted_epoch=self.epoch,
            dispatched_epoch=self.epoch if dispatch_now else None,
            idempotency_key=idempotency_key_for(attempt_id),
            request_hash=call.request_hash,
            request=call.request,
            estimate=dict(call.estimate.amounts),
            actual=None,
            result=None,
            receipt=None,
            price_source=call.estimate.price_source,
            retry_of=effect.retry_of,
            reason=None,
            send_deadline_us=deadline,
            prepared_at_us=now,
            dispatched_at_us=now if dispatch_now else None,
            settled_at_us=None,
            generation=effect.generation,
        )
        tx.write(
            _INSERT_ATTEMPT,
            attempt.id,
            attempt.mission_id,
            attempt.run_id,
            effect.node_id,
            effect.execution,
            effect.key,
            effect.generation,
            attempt.adapter,
            attempt.operation,
            attempt.effect_class,
            attempt.status.value,
            attempt.principal,
            self.epoch,
            attempt.dispatched_epoch,
            attempt.idempotency_key,
            attempt.request_hash,
            call.request_json,
            canonical(attempt.estimate),
            attempt.price_source,
            effect.retry_of,
            deadline,
            now,
            attempt.dispatched_at_us,
        )
        ledger.record(
            tx, self.mission_id, attempt.id, ledger.hold(attempt.estimate), attempt.price_source
        )
        tx.write(
            "UPDATE missions SET attempts_admitted = attempts_admitted + 1 WHERE id = ?",
            self.mission_id,
        )
        tx.audit(
            self.mission_id,
            "attempt.prepared",
            attempt.id,
            actor=actor,
            segment=self.segment_id,
            epoch=self.epoch,
            after="prepared",
            payload={
                "scope": call.scope,
                "node_id": effect.node_id,
                "execution": effect.execution,
                "effect_key": effect.key,
                "generation": effect.generation,
                "request_hash": call.request_hash,
                "estimate": attempt.estimate,
                "price_source": attempt.price_source,
                "retry_of": effect.retry_of,
            },
        )
        if dispatch_now:
            self._audit_dispatched(tx, attempt)
        elif standing is ApprovalStatus.DENIED:
            settlement.void(
                tx,
                attempt,
                "approval denied",
                actor=actor,
                segment=self.segment_id,
                epoch=self.epoch,
            )
            attempt = _with(attempt, status=AttemptStatus.VOIDED, reason="approval denied")
        return attempt

    def _set_status(self, tx: Tx, row: Row, status: RunStatus, reason: str) -> None:
        runs.change_status(
            tx,
            run_id=self.run_id,
            mission_id=self.mission_id,
            epoch=self.epoch,
            before=RunStatus(row["status"]),
            after=status,
            reason=reason,
            actor=self.principal,
            segment=self.segment_id,
        )

    def _send_deadline(self, now_us: int) -> int:
        return min(
            now_us + seconds_us(self.engine.config.send_deadline_seconds), self._lease_expires_us
        )

    def _audit_dispatched(self, tx: Tx, attempt: Attempt) -> None:
        tx.audit(
            self.mission_id,
            "attempt.dispatched",
            attempt.id,
            actor=self.principal,
            segment=self.segment_id,
            epoch=self.epoch,
            before="prepared",
            after="dispatched",
            payload={
                "idempotency_key": attempt.idempotency_key,
                "send_deadline_us": attempt.send_deadline_us,
            },
        )

    def admit(
        self,
        adapter: Adapter,
        operation: str,
        request: Any,
        *,
        effect_key: str,
        node_id: str = "",
        execution: int = 0,
        generation: int = 1,
        retry_of: str | None = None,
    ) -> Attempt:
        """Admit an attempt and record it PREPARED, without dispatching it.

        For two-phase use (an approval wait, a batch): call :meth:`dispatch`
        later. The combined path is :meth:`attempt`.
        """
        call = self.prepare_call(adapter, operation, request)
        self._crash("admission.before")
        attempt = self._admission(
            call, Effect(node_id, execution, effect_key, generation, retry_of), dispatch=False
        )
        self._crash("admission.after")
        return attempt

    def dispatch(self, attempt_id: str, adapter: Adapter, *, request: Any = None) -> Attempt:
        """Commit DISPATCHED for a PREPARED attempt of this epoch, send it, settle it.

        ``request`` is the live request, with its secrets' values (S3), when the
        caller has it (a replayed node does); it must be the recorded one. Without
        it the request is rebuilt from the record.
        """
        self._crash("dispatch.before")
        started = self.engine.clock.monotonic_us()  # before the dispatch commit (F3)
        with self._db.transaction(gate=self.mission_id) as tx:
            attempt = self._commit_dispatch(tx, attempt_id, adapter, request)
        if attempt.status is AttemptStatus.VOIDED:
            return attempt
        return self._send_and_settle(attempt, adapter, started)

    def _commit_dispatch(self, tx: Tx, attempt_id: str, adapter: Adapter, request: Any) -> Attempt:
        row = self._own(tx)
        attempt = load(tx, attempt_id)
        if attempt.run_id != self.run_id:
            raise StateError(
                f"attempt {attempt_id} belongs to run {attempt.run_id}, not {self.run_id}"
            )
        if request is not None:
            live = request_hash(attempt.adapter, attempt.operation, _REQUEST_JSON.encode(request))
            if live != attempt.request_hash:
                raise StateError(
                    f"the request given for attempt {attempt_id} is not the one recorded; "
                    "nothing is sent",
                    attempt_id=attempt_id,
                )
            attempt = _with(attempt, request=request)
        for hidden in secret.found(attempt.request):
            hidden.reveal()  # one that cannot be had here stops the send before it commits
        if attempt.adapter != adapter.name:
            raise StateError(
                f"attempt {attempt_id} is for adapter {attempt.adapter!r}, not {adapter.name!r}"
            )
        if attempt.status is not AttemptStatus.PREPARED or attempt.admitted_epoch != self.epoch:
            raise StateError(
                f"attempt {attempt_id} is {attempt.status.value} (admitted in epoch "
                f"{attempt.admitted_epoch}); only a PREPARED attempt of this epoch "
                f"({self.epoch}) can be dispatched",
                status=attempt.status.value,
            )
        status = RunStatus(row["status"])
        if status not in (RunStatus.ACTIVE, RunStatus.WAITING):
            raise StateError(f"run {self.run_id} is {status.value}; nothing is dispatched")
        contract = self.engine._contracts.get(tx, self.mission_id, row["contract_version"])
        self._budget_units = frozenset(contract.allowance)
        if not contract.allows(self.principal, Right.RUN, attempt.scope):
            raise tx.refused(
                NotAuthorized(
                    f"principal {self.principal!r} lost the 'run' right on {attempt.scope}",
                    principal=self.principal,
                ),
                mission_id=self.mission_id,
                kind="dispatch.refused",
                entity=attempt.id,
                actor=self.principal,
                payload={"reason": "not_authorized"},
            )
        if contract.approvals.requires(attempt.scope):
            standing, approval_id = approvals.standing(
                tx,
                contract,
                mission_id=self.mission_id,
                run_id=self.run_id,
                effect=approvals.effect_id(
                    self.run_id, attempt.node_id, attempt.execution, attempt.effect_key
                ),
                scope=attempt.scope,
                request_hash=attempt.request_hash,
                actor=self.principal,
                epoch=self.epoch,
            )
            if standing is ApprovalStatus.DENIED:
                settlement.void(
                    tx,
                    attempt,
                    "approval denied",
                    actor=self.principal,
                    segment=self.segment_id,
                    epoch=self.epoch,
                )
                return _with(attempt, status=AttemptStatus.VOIDED, reason="approval denied")
            if standing is not ApprovalStatus.APPROVED:
                raise tx.refused(
                    ApprovalRequired(
                        f"attempt {attempt.id} ({attempt.scope}) waits for approval "
                        f"{approval_id}; decide it with `charter approve {approval_id}`",
                        approval_id=approval_id,
                        attempt_id=attempt.id,
                    ),
                    mission_id=None,
                    kind="",
                    entity="",
                    actor=self.principal,
                    keep_changes=True,
                )
        deadline = self._send_deadline(tx.now_us)
        changed = tx.run(
            "UPDATE attempts SET status = 'dispatched', dispatched_epoch = ?, "
            "dispatched_at_us = ?, send_deadline_us = ? WHERE id = ? AND status = 'prepared'",
            self.epoch,
            tx.now_us,
            deadline,
            attempt.id,
        )
        if not changed:  # voided concurrently: it must never be sent
            raise StateError(f"attempt {attempt.id} is no longer PREPARED; nothing is sent")
        attempt = _with(
            attempt,
            status=AttemptStatus.DISPATCHED,
            dispatched_epoch=self.epoch,
            dispatched_at_us=tx.now_us,
            send_deadline_us=deadline,
        )
        self._audit_dispatched(tx, attempt)
        return attempt

    def attempt(
        self,
        adapter: Adapter,
        operation: str,
        request: Any,
        *,
        effect_key: str,
        node_id: str = "",
        execution: int = 0,
        generation: int = 1,
        retry_of: str | None = None,
        call: Call | None = None,
    ) -> Attempt:
        """Admit, dispatch, send and settle one effect; return the recorded attempt.

        The returned attempt is SUCCEEDED, FAILED or UNKNOWN. A required approval
        that is not yet given raises :class:`~charter.errors.ApprovalRequired`
        with the attempt left PREPARED and its hold kept.
        """
        if call is None:
            call = self.prepare_call(adapter, operation, request)
        effect = Effect(node_id, execution, effect_key, generation, retry_of)
        retries = 0
        while True:
            self._crash("admission.before")
            started = self.engine.clock.monotonic_us()  # before the dispatch commit (F3)
            attempt = self._admission(call, effect)
            if attempt.status is AttemptStatus.VOIDED:
                return attempt
            if attempt.status is AttemptStatus.PREPARED:
                self._crash("admission.after")
                raise ApprovalRequired(
                    f"{call.scope} needs an approval before it is sent; attempt {attempt.id} "
                    "is PREPARED with its hold kept (see `charter approvals`)",
                    attempt_id=attempt.id,
                )
            attempt = self._send_and_settle(attempt, adapter, started, call.secrets)
            # A target that never answers cannot drain the budget: the
            # operation's retry policy bounds the A7 write-off retries.
            limit = call.adapter.operations[call.operation].retries
            if retries >= limit or not self._write_off_read_only(attempt, call):
                return attempt
            retries += 1
            effect = effect.retried_after(attempt.id)

    def _write_off_read_only(self, attempt: Attempt, call: Call) -> bool:
        """A7 opt-in: write off a read-only UNKNOWN at its full hold so it can be retried."""
        if attempt.status is not AttemptStatus.UNKNOWN or call.effect_class is not (
            EffectClass.READ_ONLY
        ):
            return False
        with self._db.transaction(gate=self.mission_id) as tx:
            row = self._own(tx)  # a fenced executor settles nothing (F2)
            contract = self.engine._contracts.get(tx, self.mission_id, row["contract_version"])
            if contract.read_only_unknown != "write_off":
                return False
            return settlement.settle(
                tx,
                attempt,
                AttemptStatus.WRITTEN_OFF,
                actual=attempt.estimate,
                result=None,
                receipt=None,
                price_source=attempt.price_source,
                reason="read_only UNKNOWN written off at its full hold (contract opt-in)",
                units=contract.allowance.keys(),
                actor="engine:read_only_policy",
                segment=self.segment_id,
                epoch=self.epoch,
                from_statuses=(AttemptStatus.UNKNOWN,),
            )

    # -- send and settle ----------------------------------------------------
    def _order(
        self, attempt: Attempt, *, deadline_us: int, now_us: int, started_us: int
    ) -> Dispatch:
        """What the adapter is told. The deadline on this process's monotonic clock
        is the time the store left (``deadline_us - now_us``, both by the store's
        clock) counted from ``started_us``, taken before the dispatch commit was
        sent: a skewed wall clock cannot move it, and it can only err early (F3)."""
        return Dispatch(
            attempt_id=attempt.id,
            operation=attempt.operation,
            request=attempt.request,
            idempotency_key=attempt.idempotency_key,
            run_id=self.run_id,
            epoch=self.epoch,
            send_deadline_us=deadline_us,
            deadline_monotonic_us=started_us + (deadline_us - now_us),
            clock=self.engine.clock,
        )

    def _send_and_settle(
        self,
        attempt: Attempt,
        adapter: Adapter,
        started_us: int,
        hidden: list[Secret] | None = None,
    ) -> Attempt:
        """Send through the one send path, then settle. ``hidden``: the request's
        secrets, when the caller already knows them (otherwise it is searched)."""
        if attempt.send_deadline_us is None or attempt.dispatched_at_us is None:
            raise StateError(f"attempt {attempt.id} has no dispatch commit; nothing is sent")
        self._crash("dispatch.after")
        order = self._order(
            attempt,
            deadline_us=attempt.send_deadline_us,
            now_us=attempt.dispatched_at_us,
            started_us=started_us,
        )
        if hidden is None:
            hidden = list(secret.found(attempt.request))
        report = sending.send(adapter, order, hidden)
        self._crash("settlement.before")
        try:
            try:
                with self._db.transaction(gate=self.mission_id) as tx:
                    settled = self._record(tx, attempt, report)
            except AmountOverflow as exc:  # a valid cost the ledger's sums cannot take (A9)
                settled = self._unaddable(attempt, report, exc)
        except Exception as exc:  # A4: an unrecordable settlement is an uncertainty
            raise sending.unrecorded(attempt.id, report, exc) from exc
        self._crash("settlement.after")
        return settled

    def _unaddable(self, attempt: Attempt, report: sending.Report, exc: AmountOverflow) -> Attempt:
        """A report whose cost the ledger cannot add settles nothing (A9): the
        attempt is UNKNOWN with its hold, the report is kept as evidence and an
        incident asks a person (whose resolution must fit the ledger)."""
        with self._db.transaction(gate=self.mission_id) as tx:
            settlement.mark_unknown(
                tx,
                attempt,
                f"the reported cost cannot be added to the ledger ({exc.message})",
                actor=self.principal,
                segment=self.segment_id,
                epoch=self.epoch,
            )
            settlement.record_evidence(
                tx, attempt, report.evidence, actor=self.principal, epoch=self.epoch, settled=False
            )
            outcome = report.evidence.outcome
            open_incident(
                tx,
                self.mission_id,
                "amount_overflow",
                {
                    "actual": None if outcome is None else dict(outcome.cost),
                    "receipt": None if outcome is None else outcome.receipt,
                    **exc.details,
                },
                actor=self.principal,
                run_id=self.run_id,
                attempt_id=attempt.id,
                epoch=self.epoch,
            )
            return load(tx, attempt.id)

    def _record(self, tx: Tx, attempt: Attempt, report: sending.Report) -> Attempt:
        """Settle what the live send reported (it was DISPATCHED by this executor)."""
        units = self._budget_units
        if units is None:
            raise StateError(f"attempt {attempt.id} is settled without its dispatch commit")
        evidence = report.evidence
        kw: dict[str, Any] = {
            "units": units,
            "actor": self.principal,
            "segment": self.segment_id,
            "epoch": self.epoch,
        }
        if not evidence.conclusive:
            marked = settlement.mark_unknown(
                tx,
                attempt,
                report.reason or "outcome unknown",
                actor=self.principal,
                segment=self.segment_id,
                epoch=self.epoch,
            )
            if report.keep:  # all there is of a report the store cannot hold (A9)
                settlement.record_evidence(
                    tx, attempt, evidence, actor=self.principal, epoch=self.epoch, settled=False
                )
            if marked:
                return _with(attempt, status=AttemptStatus.UNKNOWN, reason=report.reason)
            return load(tx, attempt.id)
        not_applied = evidence.verdict == "not_applied"
        reason = report.reason if not_applied else None
        if not settlement.settle_by_evidence(
            tx,
            attempt,
            evidence,
            reason=reason,
            from_statuses=(AttemptStatus.DISPATCHED,),
            answered=True,
            **kw,
        ):
            settlement.record_late(
                tx,
                load(tx, attempt.id),
                evidence,
                source=f"late settlement (epoch {self.epoch})",
                may_settle=True,
                **kw,
            )
            return load(tx, attempt.id)
        if not_applied:  # the proof is kept as evidence (A3)
            settlement.record_evidence(
                tx, attempt, evidence, actor=self.principal, epoch=self.epoch, settled=True
            )
        o = evidence.outcome
        return _with(
            attempt,
            status=AttemptStatus.FAILED if o is None else AttemptStatus(o.status),
            actual={} if o is None else dict(o.cost),
            result=None if o is None else o.result,
            receipt=None if o is None else o.receipt,
            price_source=(o.price_source if o is not None else None) or attempt.price_source,
            reason=reason if reason is not None else attempt.reason,
            settled_at_us=tx.now_us,
            answered=True,
        )

    def replay(self, attempt: Attempt, adapter: Adapter) -> Evidence | None:
        """A8: send an uncertain ``idempotent_keyed`` attempt again, with its own key.

        A replay is a send: it goes through the one send path after a commit
        that checks, under the mission's gate, this executor's epoch and lease,
        that the attempt is *still* unresolved (UNKNOWN, or DISPATCHED by an
        earlier epoch), that the run may send (active, waiting or needing
        intervention; not paused, stopping or ended), the principal's authority,
        and the target's dedupe window. Returns the replay's evidence, or
        ``None`` when no replay was sent (a person decides then).
        """
        op = adapter.operations.get(attempt.operation)
        if op is None or op.effect is not EffectClass.IDEMPOTENT_KEYED:
            return None
        window_us = seconds_us(op.dedupe_window_seconds or 0)
        started = self.engine.clock.monotonic_us()
        try:
            with self._db.transaction(gate=self.mission_id) as tx:
                sendable = self._commit_replay(tx, attempt.id, window_us)
        except Fenced:
            return None  # an executor that no longer owns the run sends nothing (R7)
        if sendable is None:
            return None
        attempt, deadline, now = sendable
        hidden = list(secret.found(attempt.request))
        order = self._order(attempt, deadline_us=deadline, now_us=now, started_us=started)
        report = sending.send(adapter, order, hidden)
        evidence = report.evidence
        if evidence.verdict == "applied":
            return Evidence("applied", evidence.outcome, {"replay": True}, source="same-key replay")
        # Refused before sending, lost, or unrecordable: it proves nothing about the first send.
        detail = {"replay": True, "replay_reason": report.reason, "report": evidence.detail}
        return Evidence("indeterminate", None, detail, source="same-key replay")

    def _commit_replay(
        self, tx: Tx, attempt_id: str, window_us: int
    ) -> tuple[Attempt, int, int] | None:
        """The replay's dispatch commit (A2 + "still unresolved"); ``None``: no send."""
        row = self._own(tx)
        attempt = load(tx, attempt_id)
        if attempt.run_id != self.run_id or secret.missing(attempt.request):
            return None  # a secret this process cannot have (S3): a person decides
        unresolved = attempt.status is AttemptStatus.UNKNOWN or (
            attempt.status is AttemptStatus.DISPATCHED and attempt.dispatched_epoch != self.epoch
        )
        if not unresolved or RunStatus(row["status"]) not in _REPLAYABLE:
            return None
        contract = self.engine._contracts.get(tx, self.mission_id, row["contract_version"])
        if not contract.allows(self.principal, Right.RUN, attempt.scope):
            return None
        sent_at = attempt.dispatched_at_us or attempt.prepared_at_us
        if tx.now_us - sent_at > window_us:
            return None
        deadline = self._send_deadline(tx.now_us)
        tx.audit(
            attempt.mission_id,
            "attempt.replayed",
            attempt.id,
            actor=self.principal,
            segment=self.segment_id,
            epoch=self.epoch,
            payload={"idempotency_key": attempt.idempotency_key, "send_deadline_us": deadline},
        )
        return attempt, deadline, tx.now_us

    def _crash(self, point: str) -> None:
        hook = self.engine._crash_hook
        if hook is not None:
            hook(point)

    # -- run status and plans ---------------------------------------------------
    def _mark(self, status: str, reason: str) -> None:
        """Record why the run cannot go on (waiting, needs_intervention); fenced."""
        with self._db.transaction(gate=self.mission_id) as tx:
            self._set_status_tx(tx, status, reason)

    def _set_status_tx(self, tx: Tx, status: str, reason: str) -> None:
        row = self._own(tx)
        if row["status"] != status:
            self._set_status(tx, row, RunStatus(status), reason)

    def execute(self, plan: Plan | None = None, input: Any = None) -> Any:
        """Run the plan's remaining nodes as this segment; complete the run.

        Without ``plan``, the plan recorded on the run (its ``ref``) is
        imported, so a fresh process can resume; the run's recorded input
        feeds the first node.
        """
        from charter.config import import_path
        from charter.nodes import Plan, execute

        with self._db.read() as tx:
            row = tx.one("SELECT plan, input FROM runs WHERE id = ?", self.run_id)
        if row is None:
            raise NotFound(f"no run {self.run_id!r} in this store", run_id=self.run_id)
        if plan is None:
            if not row["plan"]:
                raise StateError(f"run {self.run_id} records no plan reference; pass plan=")
            plan = import_path(row["plan"])
            if not isinstance(plan, Plan):
                raise StateError(f"{row['plan']} is not a charter.Plan")
        value = input if input is not None or row["input"] is None else json.loads(row["input"])
        try:
            return execute(self, plan, value)
        except Blocked:
            self._release()
            raise

    def _release(self) -> None:
        """This executor stops holding the run (its nodes wait for a person, an
        approval or evidence), so the owner's segment can be resumed at once.
        Best effort: an executor that cannot say so keeps the run until its
        lease expires, as a crashed one does."""
        with contextlib.suppress(CharterError):
            with self._db.transaction(gate=self.mission_id) as tx:
                tx.run(
                    "UPDATE runs SET owner_claim = NULL WHERE id = ? AND epoch = ? "
                    "AND owner_claim = ?",
                    self.run_id,
                    self.epoch,
                    self._claim,
                )
            self._claim = None

    # -- finishing ------------------------------------------------------------
    def finish(self, status: RunStatus = RunStatus.COMPLETED, reason: str | None = None) -> None:
        """End the run (fenced); refused while any attempt of the run is unresolved."""
        if not status.terminal:
            raise StateError(f"{status.value} is not a terminal status")
        with self._db.transaction(gate=self.mission_id) as tx:
            row = self._own(tx)
            unresolved = count_unresolved(tx, self.run_id)
            if unresolved:
                raise StateError(
                    f"run {self.run_id} has {unresolved} unresolved attempt(s); settle or "
                    "resolve them before ending the run",
                    unresolved=unresolved,
                )
            self._set_status(tx, row, status, reason or status.value)


def _with(attempt: Attempt, **changes: Any) -> Attempt:
    """``dataclasses.replace`` without re-running ``__init__`` (on the attempt path,
    a tenth of its cost): an Attempt has no ``__post_init__`` to re-run."""
    unknown = changes.keys() - attempt.__dict__.keys()
    if unknown:
        raise TypeError(f"Attempt has no field(s) {sorted(unknown)}")
    new = object.__new__(Attempt)
    new.__dict__.update(attempt.__dict__, **changes)
    return new


def _text_keys(value: Any) -> bool:
    """Whether every mapping key in ``value`` is a string (JSON would silently
    turn the others into strings, and a record would not read back as sent)."""
    if isinstance(value, dict):
        return all(isinstance(k, str) and _text_keys(v) for k, v in value.items())
    if isinstance(value, list | tuple):
        return all(_text_keys(v) for v in value)
    return True
