"""Runs whose node code runs in another process, in any language (X1).

Mixed into :class:`~charter.engine.engine.Engine`. A remote client holds a
segment of a run as three values (its name, the epoch, the claim token); each
of its calls comes in alone, so the engine rebuilds the segment's executor
from them (:meth:`RemoteSegments.segment_executor`) and every write checks them again,
under the mission's gate, as it checks a local executor's (F1, F2): the
executor is the same object, its methods the same code. Evidence the client's
own adapter found goes through ``coordinator.reconcile`` itself, as the
answer of :meth:`RemoteSegments.client_lookup`.
"""

from __future__ import annotations

from charter.adapters import Adapter, EffectClass, Evidence
from charter.attempts import store
from charter.attempts.handed import Declared, RemoteReport
from charter.contracts.authority import Authority
from charter.contracts.principals import Principal, Right
from charter.engine.executor import Executor
from charter.errors import Fenced
from charter.ids import check_text
from charter.runs import run as runs
from charter.runs import store as run_store
from charter.runtime import Runtime
from charter.storage import Database


class RemoteSegments:
    """A remote client's segment of a run, and what it found (see the module docstring)."""

    _db: Database
    _authority: Authority
    _runtime: Runtime

    def segment_executor(
        self, run_id: str, *, segment_id: str, epoch: int, claim: str, by: Principal
    ) -> Executor:
        """The executor of ``run_id``'s segment ``segment_id`` at ``epoch`` holding
        ``claim``, as a remote client names it.

        The claim must be one the store issued to that segment at that epoch
        (X3), else :class:`Fenced` before anything is written: a stranger's
        guess, another run's claim or another epoch's is refused alike. Whether
        the segment still holds the run is checked by every write it makes, in
        its own transaction (a stale one is fenced there), so a proven segment
        taken over since may still report what it sent (F2). ``by``, who calls,
        is the run's principal or one the mission grants ``run`` (refusals
        audited): a claim is a secret, not a right."""
        check_text("run id", run_id)
        check_text("segment id", segment_id)
        check_text("claim", claim)
        with self._db.read() as tx:
            run = runs.load(tx, run_id)
            proven = run_store.claim_proves(
                tx, run_id, epoch=epoch, segment_id=segment_id, claim=claim
            )
        if not proven:
            raise Fenced(
                f"segment {segment_id!r} of run {run_id} was issued no such claim at epoch "
                f"{epoch}; only the segment a claim was issued to speaks for it",
                run_id=run_id,
                epoch=epoch,
                current_epoch=run.epoch,
            )
        if by.name != run.principal:
            with self._db.transaction() as tx:
                self._authority.authorize_run(tx, by, run.mission_id, entity=run_id)
        return Executor(
            self._runtime,
            run_id=run.id,
            mission_id=run.mission_id,
            segment_id=segment_id,
            epoch=epoch,
            principal=run.principal,
            lease_expires_us=run.lease_expires_us,
            claim=claim,
        )

    def report_send(
        self,
        run_id: str,
        attempt_id: str,
        evidence: Evidence,
        *,
        segment_id: str,
        epoch: int,
        claim: str,
        by: Principal,
        reason: str | None = None,
    ) -> RemoteReport:
        """What a remote client's send of ``attempt_id`` did, reported by the
        segment that dispatched it (:meth:`Executor.report`, which checks that
        its claim proves it, X3). ``by`` needs ``run`` on the attempt's
        operation (refusals audited): a claim leaked to someone without the
        right settles nothing."""
        check_text("attempt id", attempt_id)
        executor = self.segment_executor(
            run_id, segment_id=segment_id, epoch=epoch, claim=claim, by=by
        )
        with self._db.read() as tx:
            attempt = store.load(tx, attempt_id)
            allowed = self._authority.current(tx, attempt.mission_id).allows(
                by.name, Right.RUN, attempt.scope
            )
        if not allowed:
            with self._db.transaction() as tx:
                self._authority.authorize(
                    tx, by, attempt.mission_id, Right.RUN, attempt.scope, entity=attempt_id
                )
        return executor.report(attempt_id, evidence, reason=reason)

    def client_lookup(self, attempt_id: str, found: Evidence) -> Adapter:
        """An adapter whose lookup (R7, A8) answers with ``found``, evidence a
        remote client's own adapter found: handed to ``coordinator.reconcile``,
        it is checked, stored and settles exactly where any adapter's evidence
        would (``evidence_settles``). It never sends: nothing is replayed."""
        check_text("attempt id", attempt_id)
        with self._db.read() as tx:
            attempt = store.load(tx, attempt_id)
        effect = EffectClass(attempt.effect_class)
        # A declared keyed operation needs a window; without an executor no replay is sent.
        window = 1 if effect is EffectClass.IDEMPOTENT_KEYED else None
        return Declared(
            attempt.adapter, attempt.operation, effect, attempt.estimate, window, found=found
        )
