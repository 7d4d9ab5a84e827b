"""A send handed to a remote client (X1): the one send path, stopped at the send.

A process in another language runs its node code and its adapters itself;
the engine keeps every rule. So a remote effect goes through the same driver
as a local one (:func:`charter.attempts.driver.calling`: decide, admit, the
dispatch commit), driven by :func:`hand_over`, which stops at the first
:class:`~charter.attempts.dispatch.Send` instead of calling an adapter and
hands its order (the attempt's id, idempotency key, fencing token and send
deadline) to the client. What the client then reports is settled by
:func:`report`, through :func:`~charter.attempts.dispatch.settle_sent`, the
settlement of every live send: fencing, late evidence and incidents (F2) are
written once.

The client declares its adapter's operation (:class:`Declared`): its effect
class and its estimate, as a Python adapter declares them; a declared adapter
is never asked to send.
"""

from __future__ import annotations

from collections.abc import Mapping
from dataclasses import dataclass, field
from functools import partial
from typing import Any

from charter.adapters import (
    Dispatch,
    EffectClass,
    Estimate,
    Evidence,
    Operation,
    Outcome,
    RecordedAttempt,
)
from charter.attempts import store
from charter.attempts.dispatch import Sending, settle_sent
from charter.attempts.evidence import Report, recordable
from charter.attempts.late import late_report_settles
from charter.attempts.model import Attempt, AttemptStatus
from charter.errors import AdapterError, ApprovalRequired
from charter.runs import store as run_store
from charter.runs.ownership import Segment
from charter.waits import approvals


@dataclass(frozen=True)
class Declared:
    """An adapter as a remote client declares it: one operation, its effect
    class and its estimate (an upper bound, L3). It never sends: the engine
    stops before the send (:func:`hand_over`); ``found`` is what the client's
    own lookup reported, when it is used to reconcile (R7)."""

    name: str
    operation: str
    effect: EffectClass
    amounts: Mapping[str, int]
    dedupe_window_seconds: int | None = None
    price_source: str = "client estimate"
    found: Evidence | None = None
    operations: Mapping[str, Operation] = field(init=False)

    def __post_init__(self) -> None:
        spec = Operation(self.effect, self.dedupe_window_seconds)
        object.__setattr__(self, "operations", {self.operation: spec})

    def estimate(self, operation: str, request: Any) -> Estimate:
        return Estimate(self.amounts, self.price_source)

    def dispatch(self, send: Dispatch) -> Outcome:
        raise AdapterError(
            f"adapter {self.name!r} is a remote client's: the client sends, the engine never does"
        )

    def reconcile(self, attempt: RecordedAttempt) -> Evidence:
        return self.found or Evidence.indeterminate({"lookup": "the client reported nothing"})


@dataclass(frozen=True)
class RemoteAdmission:
    """What admitting a remote effect came to: ``order`` is the send the client
    must make now (the attempt DISPATCHED), or ``None`` when nothing is to be
    sent and ``attempt`` says why (settled: its record replays; unresolved:
    the node blocks; voided: never sent)."""

    attempt: Attempt
    order: Dispatch | None = None

    @property
    def action(self) -> str:
        if self.order is not None:
            return "send"
        status = self.attempt.status
        if status.settled:
            return "replay"
        return "voided" if status is AttemptStatus.VOIDED else "blocked"

    @property
    def send_deadline_ms(self) -> int | None:
        """The time left for the send, by this process's monotonic clock, now:
        counted by the client from when it sent its request, it can only err
        early (F3)."""
        if self.order is None:
            return None
        left = self.order.deadline_monotonic_us - self.order.clock.monotonic_us()
        return max(0, left // 1000)


def hand_over(seg: Segment, steps: Sending[Attempt]) -> RemoteAdmission:
    """Drive ``steps`` to the first send and stop there: the dispatch commit is
    made, the adapter is not called, the order is handed to the client; or to
    the end, when the driver decides that nothing is sent."""
    try:
        step = next(steps)
    except StopIteration as done:
        attempt: Attempt = done.value
        return RemoteAdmission(attempt)
    except ApprovalRequired as waiting:
        raise _naming_approval(seg, waiting) from None
    steps.close()  # the settlement is the client's report's (report)
    with seg.runtime.db.read() as tx:
        attempt = store.load(tx, step.order.attempt_id)
    return RemoteAdmission(attempt, step.order)


def _naming_approval(seg: Segment, waiting: ApprovalRequired) -> ApprovalRequired:
    """``waiting`` with the approval it waits for named (``approval_id``): a
    remote client has no other way to point a person at it."""
    attempt_id = waiting.details.get("attempt_id")
    if "approval_id" in waiting.details or not isinstance(attempt_id, str):
        return waiting
    with seg.runtime.db.read() as tx:
        a = store.load(tx, attempt_id)
        effect = approvals.effect_id(a.run_id, a.node_id, a.execution, a.effect_key)
        found = approvals.latest(tx, effect, a.request_hash)
    if found is None:
        return waiting
    return ApprovalRequired(waiting.message, **waiting.details, approval_id=found.id)


@dataclass(frozen=True)
class RemoteReport:
    """A report, as settled: the attempt after it, and whether the report came
    after the attempt left DISPATCHED by this segment (kept as late evidence,
    F2) rather than settling a live send."""

    attempt: Attempt
    late: bool


def report(seg: Segment, attempt_id: str, evidence: Evidence, reason: str | None) -> RemoteReport:
    """Settle what a remote client reports of the send of ``attempt_id`` that
    segment ``seg`` (its epoch and claim) dispatched.

    A report proves where it comes from (X3): ``seg``'s claim must be one the
    store issued to that segment at that epoch, and the attempt one that epoch
    dispatched, whichever segment holds the run now; anything else is
    :class:`Fenced` and writes nothing. A proven report from a segment taken
    over meanwhile (the recovery made the attempt UNKNOWN, R4) is late
    evidence (F2): kept, and settling only as evidence the contract lets settle
    by itself would (R7, :func:`~charter.attempts.late.late_report_settles`). The same
    report twice settles once: the second answers the record.
    """
    with seg.runtime.db.read() as tx:
        attempt = store.load(tx, attempt_id)
        proven = seg.claim is not None and run_store.claim_proves(
            tx, attempt.run_id, epoch=seg.epoch, segment_id=seg.segment_id, claim=seg.claim
        )
        epoch = run_store.current_epoch(tx, attempt.run_id)
        units = frozenset(seg.runtime.authority.current(tx, attempt.mission_id).allowance)
    # The claim is proven for the attempt's own run: another run's claim proves nothing.
    if attempt.dispatched_epoch != seg.epoch or not proven:
        raise seg.fenced(
            f"it did not dispatch attempt {attempt_id} under a claim it was issued; only the "
            "segment that sent an attempt reports it",
            -1 if epoch is None else epoch,
        )
    kept = recordable(Report(evidence, reason, keep=not evidence.conclusive), [], _limit(seg))
    if _repeated(attempt, kept):
        return RemoteReport(attempt, late=False)
    late = attempt.status is not AttemptStatus.DISPATCHED
    mode = seg.runtime.config.evidence_settles
    settled = settle_sent(
        seg, attempt, kept, units=units, late_settles=partial(late_report_settles, mode)
    )
    return RemoteReport(settled, late=late)


def _limit(seg: Segment) -> int:
    return seg.runtime.config.answer_bytes


def _repeated(attempt: Attempt, kept: Report) -> bool:
    """Whether ``kept`` is the report that already settled (or marked) ``attempt``:
    answered again as recorded, nothing recorded twice."""
    evidence = kept.evidence
    if attempt.status is AttemptStatus.UNKNOWN:
        return not evidence.conclusive and attempt.reason == kept.reason
    if not attempt.answered or not attempt.status.settled:
        return False
    if evidence.verdict == "not_applied":
        return attempt.status is AttemptStatus.FAILED and attempt.reason == kept.reason
    o = evidence.outcome
    return (
        o is not None
        and attempt.status.value == o.status
        and (attempt.actual or {}) == dict(o.cost)
        and attempt.result == o.result
        and attempt.receipt == o.receipt
    )
