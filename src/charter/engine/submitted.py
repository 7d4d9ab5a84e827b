"""Runs submitted to be run by whichever worker is free, and the queue they wait in (K1, K2).

Mixed into :class:`~charter.engine.engine.Engine`. ``submit`` records a run
with no owner yet (``queued``), its plan by reference and its input; a worker
(:mod:`charter.workers`) takes it from the queue and begins it as its first
segment. The queue's methods below are what a worker uses: take what is due,
hold it while carrying it, park it until its next wake, let it go when it ends.
The queue only says when to look; who may act is decided by the run's epoch and
lease as for any owner (F1), so a worker that took a run another worker also
took is refused or fenced, never a second sender.
"""

from __future__ import annotations

from collections.abc import Sequence
from typing import Any

from charter.clock import seconds_us
from charter.config import EngineConfig
from charter.contracts.authority import Authority
from charter.contracts.principals import Principal
from charter.engine.executor import Executor
from charter.engine.runs import first_owner, recorded_input
from charter.errors import LeaseHeld, StateError
from charter.ids import check_text
from charter.plans.nodes import Plan
from charter.queue import store as run_queue
from charter.runs import run as runs
from charter.runs import store as run_store
from charter.runs.liveness import owner_dead, process_json
from charter.runs.run import Run, RunStatus
from charter.runtime import Runtime
from charter.storage import Database, Tx
from charter.waits import store as waits_store

#: The queue a run goes to when its submitter names none.
DEFAULT_QUEUE = "default"


def plan_ref(plan: Plan | str) -> str:
    """The ``module:attribute`` reference a worker loads the plan by."""
    ref = plan if isinstance(plan, str) else plan.ref
    if not ref or ":" not in ref:
        raise StateError(
            "a submitted run's plan must be importable by the workers: give the Plan a "
            "ref ('module:attribute') or pass that reference",
            plan=getattr(plan, "name", plan),
        )
    check_text("plan reference", ref)
    return ref


def carried_and_let_go(tx: Tx, run: Run) -> None:
    """A go-ahead is for a run workers carry, begun, and held by no live executor
    (one that holds it is carrying it on already); raises otherwise."""
    if run_queue.queued(tx, run.id) is None:
        raise StateError(
            f"run {run.id} is not carried by workers: continue it with resume, as a segment",
            run_id=run.id,
        )
    if run.status is RunStatus.QUEUED:
        raise StateError(
            f"run {run.id} is not begun yet: a worker begins it without a go-ahead",
            run_id=run.id,
        )
    if run_store.held_alive(tx, run):
        raise LeaseHeld(
            f"run {run.id} is being carried by an executor until its lease expires: it "
            "needs no go-ahead",
            run_id=run.id,
            lease_expires_us=run.lease_expires_us,
        )


class Submissions:
    """Submit runs; the queue workers take them from (see the module docstring)."""

    _db: Database
    _authority: Authority
    _runtime: Runtime
    config: EngineConfig

    def submit(
        self,
        mission_id: str,
        *,
        by: Principal,
        plan: Plan | str,
        input: Any = None,
        queue: str = DEFAULT_QUEUE,
    ) -> Run:
        """Submit a run of ``plan`` to ``queue``; the first free worker that knows the
        plan starts it. ``by`` needs a ``run`` grant, as for :meth:`start_run`.
        Returns the run, ``queued`` until a worker begins it."""
        check_text("mission id", mission_id)
        check_text("queue", queue)
        ref = plan_ref(plan)
        input_json = recorded_input(input)
        with self._db.transaction() as tx:
            self._authority.authorize_run(tx, by, mission_id)
            run_id = tx.ids.new("run")
            run_store.insert_queued(
                tx,
                run_id,
                mission_id=mission_id,
                principal=by.name,
                plan=ref,
                input_json=input_json,
            )
            run_queue.enqueue(tx, run_id, queue=queue, plan=ref, due_us=tx.now_us)
            tx.audit(
                mission_id,
                "run.submitted",
                run_id,
                actor=by.name,
                after=RunStatus.QUEUED.value,
                payload={"queue": queue, "plan": ref},
            )
            return runs.load(tx, run_id)

    def begin(self, run_id: str, segment_id: str) -> Executor | None:
        """Begin a submitted run as its first segment (epoch 1), held by the
        returned executor; ``None`` if it was begun or stopped meanwhile."""
        check_text("run id", run_id)
        check_text("segment id", segment_id)
        with self._db.read() as tx:
            mission_id = runs.load(tx, run_id).mission_id
        with self._db.transaction(gate=mission_id) as tx:
            run = runs.load(tx, run_id)
            claim = tx.ids.new("clm")
            expires = tx.now_us + seconds_us(self.config.lease_seconds)
            if not run_store.begin(
                tx,
                run_id,
                segment_id=segment_id,
                claim=claim,
                process=process_json(),
                expires_us=expires,
            ):
                return None
            run_store.expect_attempts(tx, mission_id, run_id)
            tx.audit(
                mission_id,
                "run.started",
                run_id,
                actor=f"segment:{segment_id}",
                segment=segment_id,
                epoch=1,
                before=RunStatus.QUEUED.value,
                after=RunStatus.ACTIVE.value,
                payload={"lease_expires_us": expires, "submitted": True},
            )
        return first_owner(
            self._runtime,
            run_id=run_id,
            mission_id=mission_id,
            segment_id=segment_id,
            principal=run.principal,
            lease_expires_us=expires,
            claim=claim,
        )

    # -- the queue ----------------------------------------------------------------------
    def take_runs(
        self,
        *,
        queues: Sequence[str],
        plans: Sequence[str],
        limit: int,
        token: str,
        hold_seconds: float,
    ) -> list[str]:
        """Take up to ``limit`` due runs of these queues and plans for ``token``,
        each held for ``hold_seconds`` (then it falls due again)."""
        if limit <= 0 or not queues or not plans:
            return []
        with self._db.transaction() as tx:
            return run_queue.take_due(
                tx,
                queues=queues,
                plans=plans,
                limit=limit,
                token=token,
                hold_until_us=tx.now_us + seconds_us(hold_seconds),
            )

    def hold_run(self, run_id: str, *, token: str, until_us: int) -> bool:
        """Keep holding a taken run until ``until_us``; ``False`` if it was taken by another."""
        with self._db.transaction() as tx:
            return run_queue.hold_taken(tx, run_id, token=token, until_us=until_us)

    def park_run(self, run_id: str, *, token: str, due_us: int | None) -> bool:
        """Let go of a taken run until ``due_us`` (``None``: until a wake)."""
        with self._db.transaction() as tx:
            return run_queue.park(tx, run_id, token=token, due_us=due_us)

    def unqueue(self, run_id: str) -> None:
        """The run ended: workers look at it no more."""
        with self._db.transaction() as tx:
            run_queue.dequeue(tx, run_id)

    def wake_orphans(self) -> list[str]:
        """Make due now every held run whose executing process is provably gone
        (on this host only, R1): a worker killed here is taken over at once,
        not after its lease. Returns those runs."""
        with self._db.read() as tx:
            held = run_queue.held_owners(tx)
        gone = [r["run_id"] for r in held if owner_dead(r["owner_process"])]
        if gone:
            with self._db.transaction() as tx:
                run_queue.due_now(tx, gone)
        return gone

    def held(self, run_id: str) -> bool:
        """Whether an executor holds the run now (one that let go of it, blocked on
        a wait, does not): its own segment may then be continued at once (F1)."""
        with self._db.read() as tx:
            return run_store.owner_claim(tx, run_id) is not None

    def queued_run(self, run_id: str) -> dict[str, Any] | None:
        """The run's place in the queue (``None``: no worker carries it)."""
        with self._db.read() as tx:
            row = run_queue.queued(tx, run_id)
            return None if row is None else dict(row)

    def queues(self) -> list[dict[str, Any]]:
        """Per queue: runs due now, held by a worker, parked until a decision."""
        with self._db.read() as tx:
            return [dict(r) for r in run_queue.queue_counts(tx)]

    def next_due_us(self, *, queues: Sequence[str], plans: Sequence[str]) -> int | None:
        """When the soonest of these runs falls due, by the store's clock."""
        if not queues or not plans:
            return None
        with self._db.read() as tx:
            return run_queue.next_due(tx, queues=queues, plans=plans)

    def wake_at_us(self, run_id: str) -> int | None:
        """When a run that stopped to wait should be looked at again: now if what it
        waits for has come, a timer's due time, an approval's expiry (asked again,
        W2); ``None`` when only a person or a service can move it on (K2)."""
        with self._db.read() as tx:
            return waits_store.wake_at(tx, run_id)

    def now_us(self) -> int:
        """The store's clock (leases and timers are measured by it, F1)."""
        with self._db.read() as tx:
            now: int = tx.now_us
            return now
