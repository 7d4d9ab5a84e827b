"""The executor: the owner of one segment of a run, as its users hold it.

An :class:`Executor` is what ``Engine.start_run`` (and, after a crash,
``Coordinator.resume``) hands back. It holds a
:class:`~charter.runs.ownership.Segment` (epoch, claim, lease: fencing) and
offers the attempt path and the plan runner as methods, each written once in
its own room. It *has* a segment rather than *being* one: the segment's
methods work inside a store transaction (``own(tx)``, ``set_status(tx, ...)``),
which is the engine's business and never the user's, so the executor hands
its segment to the rooms that need it (the attempt path, the plan runner, a
node's :class:`~charter.plans.nodes.Context`) and shows its users only what
they act on:

1. **admission** (A1, :mod:`charter.attempts.admission`): authority under the current
   contract, run status, stop conditions and the allowance, checked and held
   in one transaction (L3);
2. **dispatch commit** (A2, :mod:`charter.attempts.dispatch`): DISPATCHED is committed
   *before* the adapter is called, conditioned on this executor's epoch,
   claim and unexpired lease, and on a valid approval when one is required
   (W2). When no approval wait comes between them, admission and dispatch
   share one transaction and the attempt still records both phases;
3. **send** (:func:`charter.attempts.dispatch.send`): the one send path, for a live
   dispatch and a same-key replay alike (A5, A8, F3);
4. **settlement** (:mod:`charter.attempts.settlement`, in the format of
   :mod:`charter.attempts.evidence`): a result settles the hold; a proven
   non-application is FAILED; any other exception, a timeout or a lost
   response is UNKNOWN and keeps its hold (A3, L4).

A process killed between any two of these steps leaves a state that
``Coordinator.recover`` knows how to fence (see :mod:`charter.crashpoints`).
"""

from __future__ import annotations

import json
from collections.abc import Mapping
from typing import Any

from charter.adapters import Adapter, EffectClass, Evidence
from charter.attempts import calls, dispatch, driver, handed
from charter.attempts.admission import admission
from charter.attempts.handed import Declared, RemoteAdmission, RemoteReport
from charter.attempts.model import Attempt, AttemptStatus, Effect, Lineage
from charter.config import import_path
from charter.engine import observed
from charter.errors import Blocked, NonDeterminismError, NotFound, StateError
from charter.ids import check_text
from charter.plans import remote as remote_nodes
from charter.plans import runner
from charter.plans.lineage import check_execution, lineage
from charter.plans.nodes import Plan
from charter.runs import store as run_store
from charter.runs.ownership import Segment
from charter.runs.run import RunStatus
from charter.runtime import Runtime


class Executor:
    """The owner of one segment of one run.

    RemoteAdmission out by the engine (``Engine.start_run``, ``Coordinator.resume``,
    ``Engine.new_linked_run``), not built by its users: its constructor takes
    the engine's runtime.
    """

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
        self._segment = Segment(
            runtime,
            run_id=run_id,
            mission_id=mission_id,
            segment_id=segment_id,
            epoch=epoch,
            principal=principal,
            lease_expires_us=lease_expires_us,
            claim=claim,
        )
        self._runtime = runtime

    def __repr__(self) -> str:
        seg = self._segment
        return f"<Executor run={seg.run_id} segment={seg.segment_id} epoch={seg.epoch}>"

    # -- what the executor owns (read-only: the segment keeps them) -------------
    @property
    def run_id(self) -> str:
        return self._segment.run_id

    @property
    def mission_id(self) -> str:
        return self._segment.mission_id

    @property
    def segment_id(self) -> str:
        return self._segment.segment_id

    @property
    def epoch(self) -> int:
        """The run's epoch this executor writes at (R2); a takeover fences it."""
        return self._segment.epoch

    @property
    def principal(self) -> str:
        """The principal the run acts as (whoever started it)."""
        return self._segment.principal

    @property
    def lease_expires_us(self) -> int:
        """When this executor's lease ends by the store's clock, as it last saw it (F1)."""
        return self._segment.lease_expires_us

    @property
    def claim(self) -> str | None:
        """The token that makes this executor the one holding its segment (F1):
        a remote client sends it with every call it makes as the segment (X1)."""
        return self._segment.claim

    def lease_left_us(self) -> int:
        """How long this executor's lease runs on, by the store's clock, now: a
        duration a remote client can count on its own monotonic clock (X1, F3)."""
        with self._runtime.db.read() as tx:
            return max(0, self._segment.lease_expires_us - int(tx.now_us))

    def renew_lease(self) -> int:
        """Extend the lease (fenced by epoch and claim); returns the new expiry in µs."""
        return self._segment.renew_lease()

    def release(self) -> bool:
        """Stop holding the run, so its segment can be resumed at once (best effort;
        see :meth:`~charter.runs.ownership.Segment.release`); whether it held it."""
        return self._segment.release()

    def park(self, status: RunStatus, reason: str) -> None:
        """Record why the run cannot go on (``waiting`` for an approval,
        ``needs_intervention`` for evidence or a person) and let go of it, so it
        is in the inbox with its reason and its next owner may claim it at once
        (K5); fenced like every write."""
        self._segment.mark(status, reason)
        self._segment.release()

    def drain(self) -> None:
        """Start no new effect (K4): the plan's nodes stop at their next attempt,
        :meth:`execute` raises :class:`~charter.errors.Blocked` and lets go of the
        run, and another executor carries it on; sends under way settle first."""
        self._segment.draining = True

    # -- effects ---------------------------------------------------------------
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
        later. The combined path is :meth:`perform`.
        """
        call = calls.prepare(adapter, operation, request)
        self._runtime.crash("admission.before")
        lines = self._lineage(node_id, execution)
        effect = Effect(node_id, execution, effect_key, generation, retry_of, lines)
        attempt = admission(self._segment, call, effect, dispatch=False).attempt
        self._runtime.crash("admission.after")
        if self._runtime.observer is not None:
            observed.report(self._runtime.observer, attempt)
        return attempt

    def dispatch(self, attempt_id: str, adapter: Adapter, *, request: Any = None) -> Attempt:
        """Commit DISPATCHED for a PREPARED attempt of this epoch, send it, settle it.

        ``request`` is the live request, with its secrets' values (S3), when the
        caller has it (a replayed node does); it must be the recorded one. Without
        it the request is rebuilt from the record.
        """
        attempt = dispatch.dispatch_prepared(self._segment, attempt_id, adapter, request=request)
        if self._runtime.observer is not None:
            observed.report(self._runtime.observer, attempt, AttemptStatus.PREPARED)
        return attempt

    def perform(
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
        """Admit, dispatch, send and settle one effect; return the recorded attempt.

        The returned attempt is SUCCEEDED, FAILED or UNKNOWN. A required approval
        that is not yet given raises :class:`~charter.errors.ApprovalRequired`
        with the attempt left PREPARED and its hold kept; a settlement the store
        refuses raises :class:`~charter.errors.SettlementUnrecorded`.
        """
        if node_id:  # its earlier tries are read execution by execution: bounded
            check_execution(self._segment, node_id, execution)
        attempt = driver.perform(
            self._segment,
            adapter,
            operation,
            request,
            effect_key=effect_key,
            node_id=node_id,
            execution=execution,
            generation=generation,
            retry_of=retry_of,
            lineage=self._lineage(node_id, execution),
        )
        if self._runtime.observer is not None:
            observed.report(self._runtime.observer, attempt)
        return attempt

    async def acall(
        self, adapter: Adapter, operation: str, request: Any, *, effect_key: str
    ) -> Attempt:
        """The effect ``effect_key`` of this run, called by name and awaited on the
        caller's event loop (the store's commits in a worker thread): through the
        one driver, so the same effect called again replays its record, waits
        on its unresolved attempt, or sends its approved PREPARED attempt, and
        is never sent twice (A4, A6). Returns the recorded attempt (an
        unresolved one is returned, not raised); a missing approval raises
        :class:`~charter.errors.ApprovalRequired` with the attempt PREPARED."""
        check_text("effect key", effect_key)
        at = Effect("", 0, effect_key, lineage=self._lineage("", 0))
        steps = driver.calling(self._segment, adapter, operation, request, at)
        attempt: Attempt = await dispatch.adrive(steps)
        if self._runtime.observer is not None:
            observed.report(self._runtime.observer, attempt)
        return attempt

    def hand(
        self,
        adapter: str,
        operation: str,
        request: Any,
        *,
        effect_class: EffectClass,
        estimate: Mapping[str, int],
        effect_key: str,
        node_id: str = "",
        execution: int = 0,
        dedupe_window_seconds: int | None = None,
        price_source: str | None = None,
    ) -> RemoteAdmission:
        """Admit an effect a remote client will send itself (X1): the one driver
        of an effect (decide, admit, the dispatch commit), stopped where the
        engine would call its adapter. The client declares its operation (its
        effect class, its estimate) as a Python adapter does. The answer is the
        order to send, or the record that answers the call (a settled effect
        replays, an unresolved one blocks: nothing is sent twice, A4, A6)."""
        declared = Declared(
            adapter,
            operation,
            effect_class,
            estimate,
            dedupe_window_seconds,
            price_source or "client estimate",
        )
        check_execution(self._segment, node_id, execution)
        lines = self._lineage(node_id, execution)
        at = Effect(node_id, execution, effect_key, 1, None, lines)
        steps = driver.calling(self._segment, declared, operation, request, at)
        try:
            return handed.hand_over(self._segment, steps)
        except NonDeterminismError as exc:  # as the plan runner marks it (A6)
            self._segment.mark(
                RunStatus.NEEDS_INTERVENTION, f"non-determinism in node {node_id}: {exc.message}"
            )
            raise

    def report(
        self, attempt_id: str, evidence: Evidence, *, reason: str | None = None
    ) -> RemoteReport:
        """Settle what a remote client reports of a send it made as this segment
        (X1), with the live settlement's own code (see :func:`handed.report`)."""
        return handed.report(self._segment, attempt_id, evidence, reason)

    def start_node(self, node_id: str) -> int:
        """The execution of ``node_id`` a remote client runs now (X1): the same one
        after a crash, a new one after a failure, as the plan runner decides."""
        check_text("node id", node_id)
        return remote_nodes.start(self._segment, node_id)

    def complete_node(self, node_id: str, execution: int, result: Any) -> str:
        """Record a remote client's node result (N1, fenced, F2); its hash."""
        check_text("node id", node_id)
        return remote_nodes.complete(self._segment, node_id, execution, result)

    def _lineage(self, node_id: str, execution: int) -> Lineage | None:
        """Where a node's effect was tried before (a node's context hands it down
        itself; an attempt outside any node has only its own execution)."""
        if not node_id:
            return None
        with self._runtime.db.read() as tx:
            return lineage(tx, self.run_id, node_id, execution)

    def replay(self, attempt: Attempt, adapter: Adapter) -> Evidence | None:
        """A8: send an uncertain ``idempotent_keyed`` attempt again with its own key
        (see :func:`charter.attempts.dispatch.replay`); ``None`` when nothing was sent."""
        return dispatch.replay(self._segment, attempt, adapter)

    # -- the plan ----------------------------------------------------------------
    def execute(self, plan: Plan | None = None, input: Any = None) -> Any:
        """Run the plan's remaining nodes as this segment; complete the run.

        Without ``plan``, the plan recorded on the run (its ``ref``) is
        imported, so a fresh process can resume; the run's recorded input
        feeds the first node. An executor whose nodes block lets go of the
        run, so its segment can be resumed at once (F1).
        """
        with self._runtime.db.read() as tx:
            row = run_store.recorded_plan(tx, self.run_id)
        if row is None:
            raise NotFound(f"no run {self.run_id!r} in this store", run_id=self.run_id)
        if plan is None:
            if not row["plan"]:
                raise StateError(f"run {self.run_id} records no plan reference; pass plan=")
            plan = import_path(row["plan"])
            if not isinstance(plan, Plan):
                raise StateError(f"{row['plan']} is not a charter.Plan")
        value = input if input is not None or row["input"] is None else json.loads(row["input"])
        seg, observer = self._segment, self._runtime.observer
        try:
            if observer is None:
                return runner.execute(seg, plan, value)
            with observed.observed_run(seg, observer, plan):
                return runner.execute(seg, observed.observed_plan(seg, observer, plan), value)
        except Blocked:
            seg.release()
            raise

    def finish(self, status: RunStatus = RunStatus.COMPLETED, reason: str | None = None) -> None:
        """End the run (fenced); refused while any attempt of the run is unresolved."""
        runner.finish(self._segment, status, reason)
