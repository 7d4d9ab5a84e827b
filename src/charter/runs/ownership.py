"""Ownership of a run (F1, F2, F3): the one place fencing lives.

A :class:`Segment` is one stretch of execution of a run by one executor: the
run's owning segment, at an epoch, holding the run by a claim, under a lease
measured by the store's clock. Every write an executor makes is checked here
first (:meth:`Segment.own`), under the mission's gate and in the same
transaction: an executor whose run was taken over, whose segment another
executor resumed, or whose lease expired is :class:`~charter.errors.Fenced`
and must send nothing more. Its statements are in :mod:`~charter.runs.store`.
"""

from __future__ import annotations

import contextlib
import os

from charter.clock import seconds_us
from charter.errors import CharterError, Fenced
from charter.runs import run as runs
from charter.runs import store
from charter.runs.run import RunStatus
from charter.runtime import Runtime
from charter.storage import Row, Tx


class Segment:
    """The owner of one segment of one run, as one executor holds it."""

    def __init__(
        self,
        runtime: Runtime,
        *,
        run_id: str,
        mission_id: str,
        segment_id: str,
        epoch: int,
        principal: str,
        lease_expires_us: int,
        claim: str | None = None,
    ) -> None:
        self.runtime = runtime
        self.run_id = run_id
        self.mission_id = mission_id
        self.segment_id = segment_id
        self.epoch = epoch
        self.principal = principal
        self.lease_expires_us = lease_expires_us
        #: Which executor of the segment this is (F1): ``None`` acts for an idle
        #: owner (a reconcile as the recovered segment), never beside a live one.
        self.claim = claim
        #: The process holding the run (R1): a forked child is another process,
        #: which must not write for a parent whose death may be proven.
        self.pid = os.getpid()
        #: Set when the process holding the run is stopping (K4): its nodes start
        #: no new effect and stop at their next one, so the run can be carried on
        #: elsewhere; what is already sent settles as usual.
        self.draining = False

    def __repr__(self) -> str:
        kind = type(self).__name__
        return f"<{kind} run={self.run_id} segment={self.segment_id} epoch={self.epoch}>"

    def fenced(self, why: str, current_epoch: int) -> Fenced:
        return Fenced(
            f"executor of run {self.run_id} (segment {self.segment_id}, epoch {self.epoch}) "
            f"is fenced: {why}; it must send nothing more",
            run_id=self.run_id,
            epoch=self.epoch,
            current_epoch=current_epoch,
        )

    def _check_process(self) -> None:
        if os.getpid() != self.pid:
            raise self.fenced(f"it belongs to process {self.pid}, not to this one (a fork)", -1)

    def own(self, tx: Tx) -> Row:
        """Check ownership in ``tx`` (under the mission's gate) and return the run's
        standing; renew the lease if half of it is used."""
        self._check_process()
        tx.lock_mission(self.mission_id)
        row = store.standing(tx, self.mission_id, self.run_id)
        if row is None:
            raise self.fenced("the run no longer exists", -1)
        if row["epoch"] != self.epoch or row["owner_segment"] != self.segment_id:
            raise self.fenced(f"the run was taken over (epoch {row['epoch']})", row["epoch"])
        if row["owner_claim"] != self.claim:
            raise self.fenced("another executor resumed its segment", row["epoch"])
        if row["lease_expires_us"] <= tx.now_us:
            raise self.fenced("its lease expired by the store's clock", row["epoch"])
        lease_us = seconds_us(self.runtime.config.lease_seconds)
        if row["lease_expires_us"] - tx.now_us < lease_us // 2:
            self.lease_expires_us = tx.now_us + lease_us
            store.extend_lease(tx, self.run_id, self.epoch, self.lease_expires_us)
            self._audit_lease(tx, row["lease_expires_us"], self.lease_expires_us)
        else:
            self.lease_expires_us = row["lease_expires_us"]
        return row

    def renew_lease(self) -> int:
        """Extend the lease (fenced by epoch and claim); returns the new expiry in µs."""
        self._check_process()
        lease_us = seconds_us(self.runtime.config.lease_seconds)
        with self.runtime.db.transaction(gate=self.mission_id) as tx:
            expires = tx.now_us + lease_us
            renewed = store.renew_lease(
                tx,
                self.run_id,
                epoch=self.epoch,
                segment_id=self.segment_id,
                claim=self.claim,
                expires_us=expires,
            )
            if not renewed:
                epoch = store.current_epoch(tx, self.run_id)
                raise self.fenced(
                    "its lease expired or the run was taken over", -1 if epoch is None else epoch
                )
            self._audit_lease(tx, self.lease_expires_us, expires)
        self.lease_expires_us = expires
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

    def send_deadline(self, now_us: int) -> int:
        """The latest a send may start, by the store's clock: within the lease (F3)."""
        budget = seconds_us(self.runtime.config.send_deadline_seconds)
        return min(now_us + budget, self.lease_expires_us)

    def set_status(self, tx: Tx, row: Row, status: RunStatus, reason: str) -> None:
        """Change the run's status (``row`` is its standing from :meth:`own`)."""
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

    def mark(self, status: RunStatus, reason: str) -> None:
        """Record why the run cannot go on (waiting, needs_intervention); fenced."""
        with self.runtime.db.transaction(gate=self.mission_id) as tx:
            self.mark_in(tx, status, reason)

    def mark_in(self, tx: Tx, status: RunStatus, reason: str) -> None:
        """:meth:`mark`, in the caller's transaction."""
        row = self.own(tx)
        if row["status"] != status.value:
            self.set_status(tx, row, status, reason)

    def release(self) -> bool:
        """Stop holding the run (its nodes wait for a person, an approval or
        evidence), so the owner's segment can be resumed at once. Best effort:
        an executor that cannot say so keeps the run until its lease expires,
        as a crashed one does. Returns whether this executor held the run and
        let go of it (one taken over, or released already, held nothing)."""
        released = False
        with contextlib.suppress(CharterError):
            with self.runtime.db.transaction(gate=self.mission_id) as tx:
                released = store.release(tx, self.run_id, self.epoch, self.claim)
            self.claim = None
        return released
