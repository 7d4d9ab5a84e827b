"""Runs begun from the engine: a first run of a mission, and a linked run that
follows an ended one (N4).

Mixed into :class:`~charter.engine.engine.Engine`; :func:`follow` is also how an
adopted handover continues each handed-off run (:mod:`~charter.engine.snapshots`).
Each returns the :class:`~charter.engine.executor.Executor` of the new run's
first segment (epoch 1). Stopping a run is a decision
(:mod:`~charter.engine.decisions`); recovering and resuming one is the
coordinator's.
"""

from __future__ import annotations

import json
from typing import Any

from charter.calls import store as calls_store
from charter.config import EngineConfig
from charter.contracts.authority import Authority
from charter.contracts.principals import Principal, Right
from charter.engine.executor import Executor
from charter.errors import StateError, UsageError
from charter.hashing import canonical
from charter.ids import check_text
from charter.plans import runner
from charter.plans.nodes import Plan
from charter.runs import run as runs
from charter.runs import store as run_store
from charter.runs.run import Run
from charter.runtime import Runtime
from charter.storage import Database, Tx


def recorded_input(value: Any) -> str | None:
    """A run's input as it is recorded (canonical JSON), so that any process can
    resume the run with it; anything JSON cannot carry exactly (an object, a NaN)
    is refused before anything is stored."""
    if value is None:
        return None
    try:
        json.dumps(value, allow_nan=False, default=_not_json)
    except (TypeError, ValueError) as exc:
        raise UsageError(f"a run's input must be plain JSON (it is recorded): {exc}") from None
    return canonical(value)


def _not_json(value: Any) -> Any:
    raise TypeError(f"{type(value).__name__} is not JSON")


class Runs:
    """Start a run, or follow an ended one (see the module docstring)."""

    _db: Database
    _authority: Authority
    _runtime: Runtime
    config: EngineConfig

    def start_run(
        self,
        mission_id: str,
        *,
        by: Principal,
        segment_id: str,
        plan: Plan | None = None,
        input: Any = None,
    ) -> Executor:
        """Start a run owned by a first segment (epoch 1); ``by`` needs a ``run`` grant.

        ``plan`` (with its ``ref``) and ``input`` are recorded so that a fresh
        process can resume the run; run it with ``executor.execute(plan)``.
        """
        check_text("mission id", mission_id)
        check_text("segment id", segment_id)
        input_json = recorded_input(input)
        ref = None if plan is None else (plan.ref or plan.name)
        with self._db.transaction() as tx:
            return self._started(tx, mission_id, by, segment_id, plan=ref, input_json=input_json)

    def _started(
        self,
        tx: Tx,
        mission_id: str,
        by: Principal,
        segment_id: str,
        *,
        plan: str | None,
        input_json: str | None,
    ) -> Executor:
        """A new run in ``tx``: authorised, inserted with its first segment, audited."""
        self._authority.authorize_run(tx, by, mission_id)
        run_id, expires, claim = runs.insert(
            tx,
            lease_seconds=self.config.lease_seconds,
            mission_id=mission_id,
            principal=by.name,
            segment_id=segment_id,
            plan=plan,
            input_json=input_json,
            linked_from=None,
        )
        tx.audit(
            mission_id,
            "run.started",
            run_id,
            actor=by.name,
            segment=segment_id,
            epoch=1,
            after="active",
            payload={"lease_expires_us": expires},
        )
        return first_owner(
            self._runtime,
            run_id=run_id,
            mission_id=mission_id,
            segment_id=segment_id,
            principal=by.name,
            lease_expires_us=expires,
            claim=claim,
        )

    def start_call(
        self,
        mission_id: str,
        *,
        by: Principal,
        segment_id: str,
        call_key: str,
        window_seconds: int | None,
        tool: str,
    ) -> tuple[str, Executor | None]:
        """The run that carries a client's call ``call_key`` through the MCP
        gateway (G3): the one already carrying it (and ``None``), or, in one
        transaction with the call's identity, a new run started as
        :meth:`start_run` starts one (and its executor). ``window_seconds``: the
        call is the same within that many seconds of its first, a new one after."""
        check_text("call key", call_key)
        check_text("tool", tool)
        check_text("segment id", segment_id)
        try:
            with self._db.transaction() as tx:
                found = calls_store.run_of(tx, mission_id, by.name, call_key, window_seconds)
                if found is not None:
                    return found, None
                executor = self._started(tx, mission_id, by, segment_id, plan=None, input_json=None)
                carrying = calls_store.claim(
                    tx, mission_id, by.name, call_key, window_seconds,
                    run_id=executor.run_id, tool=tool,
                )  # fmt: skip
                if carrying != executor.run_id:  # claimed meanwhile: this run never was
                    raise _Carried(carrying)
        except _Carried as other:
            return other.run_id, None
        return carrying, executor

    def unfinished_calls(self, mission_id: str) -> list[str]:
        """The runs of the mission's gateway calls still active (G3): what a
        gateway starting looks up, in case the one before it died mid-call."""
        check_text("mission id", mission_id)
        with self._db.read() as tx:
            return calls_store.unfinished(tx, mission_id)

    def forget_call(self, run_id: str) -> None:
        """A gateway call refused before anything moved is no call (G3): the same
        call asked again is admitted afresh, after a raised limit for instance."""
        check_text("run id", run_id)
        with self._db.transaction() as tx:
            calls_store.forget(tx, run_id)

    def new_linked_run(
        self,
        from_run: str,
        *,
        reviewed_by: Principal,
        segment_id: str,
        plan: Plan | None = None,
        input: Any = None,
    ) -> Executor:
        """Follow a terminal run with a new one, reviewed by a principal with ``link`` (N4).

        The ended run is never reopened. The new run belongs to the same mission,
        so it draws on the same allowance, and runs as the same principal under
        the current contract. It carries on from where the old run ended, so
        nothing settled is performed again: nodes the old run completed are not
        run (their checked results are reused), and each node it left unfinished
        continues its last execution (settled attempts replay from their records,
        journaled values are the same). ``plan`` and ``input`` default to the
        old run's; a reviewed fix goes in ``plan``.
        """
        check_text("run id", from_run)
        check_text("segment id", segment_id)
        input_json = recorded_input(input)
        with self._db.transaction() as tx:
            old = runs.load(tx, from_run)
            self._authority.authorize(tx, reviewed_by, old.mission_id, Right.LINK, entity=from_run)
            if not old.status.terminal:
                raise StateError(
                    f"run {from_run} is {old.status.value}; only an ended run is followed by a "
                    "linked one (stop it first, or recover and resume it)",
                    run_id=from_run,
                    status=old.status.value,
                )
            return follow(
                self._runtime,
                tx,
                old,
                actor=reviewed_by.name,
                segment_id=segment_id,
                plan=plan,
                input_json=input_json,
            )


def follow(
    runtime: Runtime,
    tx: Tx,
    old: Run,
    *,
    actor: str,
    segment_id: str,
    plan: Plan | None,
    input_json: str | None,
) -> Executor:
    """A linked run after the ended run ``old`` (N4), owned by a first segment."""
    follower = run_store.follower(tx, old.id)
    if follower is not None:
        # Two followers would each send what the old run left unsent.
        raise StateError(
            f"run {old.id} is already followed by run {follower}; link from "
            "the last run of the chain",
            run_id=old.id,
            followed_by=follower,
        )
    recorded = run_store.recorded_plan(tx, old.id)
    assert recorded is not None
    run_id, expires, claim = runs.insert(
        tx,
        lease_seconds=runtime.config.lease_seconds,
        mission_id=old.mission_id,
        principal=old.principal,
        segment_id=segment_id,
        plan=recorded["plan"] if plan is None else (plan.ref or plan.name),
        input_json=recorded["input"] if input_json is None else input_json,
        linked_from=old.id,
    )
    inherited = runner.inherit(tx, old.id, run_id)
    tx.audit(
        old.mission_id,
        "run.linked",
        run_id,
        actor=actor,
        segment=segment_id,
        epoch=1,
        after="active",
        payload={
            "from_run": old.id,
            "from_status": old.status.value,
            "principal": old.principal,
            "lease_expires_us": expires,
            "nodes": inherited,
        },
    )
    return first_owner(
        runtime,
        run_id=run_id,
        mission_id=old.mission_id,
        segment_id=segment_id,
        principal=old.principal,
        lease_expires_us=expires,
        claim=claim,
    )


def first_owner(
    runtime: Runtime,
    *,
    run_id: str,
    mission_id: str,
    segment_id: str,
    principal: str,
    lease_expires_us: int,
    claim: str,
) -> Executor:
    """The executor of a run's first segment (epoch 1), holding the run."""
    return Executor(
        runtime,
        run_id=run_id,
        mission_id=mission_id,
        segment_id=segment_id,
        epoch=1,
        principal=principal,
        lease_expires_us=lease_expires_us,
        claim=claim,
    )


class _Carried(Exception):
    """Another request claimed the call while this one started a run for it: the
    transaction is undone, so the run it started never existed."""

    def __init__(self, run_id: str) -> None:
        super().__init__(run_id)
        self.run_id = run_id
