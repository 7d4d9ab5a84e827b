"""Every attempt's status, held against a model (Hypothesis stateful testing).

:class:`Model` is a few dozen lines of plain Python that say what each attempt
should be after each operator or agent action — its status, its hold, what it
spent — and what the mission's allowance should show (held, spent,
available, limit, open incidents). :class:`AttemptMachine` drives the engine
through random interleavings of admit, approve, dispatch, outcome, crash and
recover, reconcile and confirm, resolve, stop, limit raises and results that
arrive after the owner lost the run, and after every step the store and the
model must agree, attempt by attempt. It runs on both stores; ``python3
tasks.py faults --long`` runs twenty times as many histories.
"""

from __future__ import annotations

import contextlib
import random
import tempfile
from dataclasses import dataclass, field
from pathlib import Path

import pytest
from hypothesis import HealthCheck, settings
from hypothesis import strategies as st
from hypothesis.stateful import (
    RuleBasedStateMachine,
    invariant,
    precondition,
    rule,
    run_state_machine_as_test,
)

import charter
from charter import Attempt, AttemptStatus, Dispatch, Evidence, NotApplied, Outcome, RunStatus
from charter.adapters import RecordedAttempt
from charter.engine.executor import Executor
from charter.testing import ManualClock, RecordingAdapter, credential
from charter.waits.approvals import effect_id
from conftest import LONG, default_contract, fresh_store

S = AttemptStatus
COSTS = {
    "read": {"usd": 1_000, "calls": 1},
    "write": {"usd": 5_000, "calls": 1},
    "charge": {"usd": 20_000, "calls": 1},
}
LEASE = 30
#: What the target does: applied at the estimate, applied for less, refused
#: before processing (proven), or applied with the answer lost.
FATES = st.sampled_from(["applied", "cheaper", "refused", "timeout"])
HOLDING = frozenset({S.PREPARED, S.DISPATCHED, S.UNKNOWN})


class SimulatedCrash(BaseException):
    """The process dies here."""


@dataclass
class Expected:
    """One attempt as the model expects it."""

    run_id: str
    operation: str
    status: AttemptStatus
    applied: dict[str, int] | None = None  # what the target took; None: not applied
    actual: dict[str, int] | None = None
    evidence: bool = False  # conclusive evidence on record, not yet confirmed

    @property
    def estimate(self) -> dict[str, int]:
        return COSTS[self.operation]


@dataclass
class Model:
    """The expected state: attempts, limits, open incidents."""

    limit: dict[str, int]
    attempts: dict[str, Expected] = field(default_factory=dict)
    incidents: int = 0

    def held(self, unit: str) -> int:
        return sum(a.estimate[unit] for a in self.attempts.values() if a.status in HOLDING)

    def spent(self, unit: str) -> int:
        return sum(
            (a.actual or {}).get(unit, 0) for a in self.attempts.values() if a.status.settled
        )

    def available(self, unit: str) -> int:
        return self.limit[unit] - self.held(unit) - self.spent(unit)

    def admits(self, operation: str) -> bool:
        """L3, L7: every unit covered, no open incident."""
        return not self.incidents and all(
            a <= self.available(u) for u, a in COSTS[operation].items()
        )

    def settle(self, attempt_id: str, status: AttemptStatus, actual: dict[str, int]) -> None:
        a = self.attempts[attempt_id]
        a.status, a.actual, a.evidence = status, actual, False

    def outcome(self, attempt_id: str, fate: str) -> None:
        """What the live answer settles (A3): applied, proven not, or unknown."""
        a = self.attempts[attempt_id]
        if fate == "refused":
            self.settle(attempt_id, S.FAILED, {})
            return
        a.applied = dict(COSTS[a.operation])
        if fate == "cheaper":
            a.applied["usd"] //= 2
        if fate == "timeout":
            a.status = S.UNKNOWN
        else:
            self.settle(attempt_id, S.SUCCEEDED, dict(a.applied))

    def voided(self, run_id: str) -> None:
        """Recover and stop void what a run never sent (R3, L6)."""
        for a in self.attempts.values():
            if a.run_id == run_id and a.status is S.PREPARED:
                a.status = S.VOIDED


class AttemptMachine(RuleBasedStateMachine):
    backend = "sqlite"

    def __init__(self) -> None:
        super().__init__()
        self.tmp = tempfile.TemporaryDirectory()
        self.stores = contextlib.ExitStack()
        url = self.stores.enter_context(fresh_store(Path(self.tmp.name), self.backend))
        self.clock = ManualClock()
        self.crash_at: str | None = None
        pairs = {n: credential(n) for n in ("agent", "alice", "bob")}
        self.engine = charter.Engine.open(
            url,
            config=charter.EngineConfig(
                credentials={n: d for n, (_, d) in pairs.items()}, lease_seconds=LEASE
            ),
            clock=self.clock,
            rng=random.Random(0),
            crash_hook=self._crash,
        )
        self.who = {n: self.engine.authenticate(c) for n, (c, _) in pairs.items()}
        allowance = {"usd": 60_000, "calls": 12}
        contract = default_contract(
            allowance=allowance, approvals={"required": ["recorder.charge"]}
        )
        self.mission = self.engine.create_mission(contract, by=self.who["alice"])
        self.model = Model(dict(allowance))
        self.target = RecordingAdapter(costs=COSTS)
        self.target.script = dict.fromkeys(COSTS, self._answer)
        self.fate = "applied"
        self.meanwhile: str | None = None
        self.executor: Executor | None = None
        self.counter = 0

    def teardown(self) -> None:
        self.engine.close()
        self.stores.close()
        self.tmp.cleanup()

    # -- the world -----------------------------------------------------------------
    def _crash(self, point: str) -> None:
        if point == self.crash_at:
            self.crash_at = None
            raise SimulatedCrash(point)

    def _answer(self, send: Dispatch) -> Outcome:
        """The target: the model learns of an attempt when it is sent (A2)."""
        self.model.attempts.setdefault(
            send.attempt_id, Expected(send.run_id, send.operation, S.DISPATCHED)
        )
        if self.fate == "refused":
            raise NotApplied("refused before processing")
        cost = dict(COSTS[send.operation])
        if self.fate == "cheaper":
            cost["usd"] //= 2
        if self.fate == "timeout":
            raise TimeoutError("applied; the answer was lost")
        if self.meanwhile is not None:  # the owner stalls; the run is taken over
            self._take_over_meanwhile(send.run_id, send.attempt_id, cost)
        return Outcome.succeeded({"ok": True}, cost=cost, receipt={"id": send.idempotency_key})

    def _take_over_meanwhile(self, run_id: str, attempt_id: str, cost: dict[str, int]) -> None:
        self.clock.advance(LEASE + 1)
        self.engine.coordinator.recover(run_id, f"seg-{self._next()}")
        self.model.voided(run_id)
        self.model.attempts[attempt_id].status = S.UNKNOWN
        self.model.attempts[attempt_id].applied = cost
        if self.meanwhile == "resolved":  # a person settles it before the answer is back
            self.engine.coordinator.resolve(
                attempt_id, by=self.who["alice"], outcome="failed", evidence="no trace", cost={}
            )
            self.model.settle(attempt_id, S.FAILED, {})
            self.model.incidents += 1  # the late answer contradicts it (F2)

    def _look_up(self, attempt: RecordedAttempt) -> Evidence:
        applied = self.model.attempts[attempt.id].applied
        if applied is None:
            return Evidence.not_applied({"books": "no such key"})
        return Evidence.applied(Outcome.succeeded({"ok": True}, cost=applied, receipt={"b": 1}))

    # -- helpers ---------------------------------------------------------------------
    def _next(self) -> int:
        self.counter += 1
        return self.counter

    def _attempted(self, ex: Executor, operation: str) -> Attempt | None:
        """The next attempt at ``operation``, or None when the allowance refused
        it; either way as the model says it must."""
        admits = self.model.admits(operation)
        n = self._next()
        try:
            done = ex.perform(self.target, operation, {"n": n}, effect_key=f"k{n}")
        except charter.AllowanceExceeded:
            assert not admits
            return None
        assert admits
        return done

    def _executor(self) -> Executor:
        ex = self.executor
        if ex is not None:
            run = self.engine.run(ex.run_id)
            live = run.status is RunStatus.ACTIVE and run.lease_expires_us > self.clock.now_us()
            if live and run.epoch == ex.epoch:
                return ex
        ex = self.engine.start_run(
            self.mission, by=self.who["agent"], segment_id=f"seg-{self._next()}"
        )
        self.executor = ex
        return ex

    def _with(self, *statuses: AttemptStatus) -> list[str]:
        return sorted(i for i, a in self.model.attempts.items() if a.status in statuses)

    def _admit(self, operation: str) -> tuple[Executor, str | None]:
        """Admit through the current run; ``None`` when the model says refuse."""
        ex = self._executor()
        admits = self.model.admits(operation)
        n = self._next()
        try:
            attempt = ex.admit(self.target, operation, {"n": n}, effect_key=f"k{n}")
        except charter.AllowanceExceeded:
            assert not admits
            return ex, None
        assert admits
        self.model.attempts[attempt.id] = Expected(ex.run_id, operation, S.PREPARED)
        return ex, attempt.id

    def _approved(self, attempt_id: str) -> bool:
        a = self.engine.get_attempt(attempt_id)
        effect = effect_id(a.run_id, a.node_id, a.execution, a.effect_key)
        return any(
            p.effect_id == effect and p.status.value == "approved" for p in self.engine.approvals()
        )

    # -- rules -------------------------------------------------------------------------
    @rule(operation=st.sampled_from(sorted(COSTS)))
    def admit(self, operation: str) -> None:
        self._admit(operation)

    @precondition(lambda self: bool(self.engine.approvals(pending=True)))
    @rule(data=st.data(), deny=st.booleans())
    def approve(self, data: st.DataObject, deny: bool) -> None:
        approval = data.draw(st.sampled_from(self.engine.approvals(pending=True)))
        self.engine.approve(approval.id, by=self.who["bob"], deny=deny)

    @precondition(lambda self: bool(self._with(S.PREPARED)))
    @rule(data=st.data(), fate=FATES)
    def dispatch(self, data: st.DataObject, fate: str) -> None:
        attempt_id = data.draw(st.sampled_from(self._with(S.PREPARED)))
        a = self.model.attempts[attempt_id]
        ex = self.executor
        run = self.engine.run(a.run_id)
        if ex is None or ex.run_id != a.run_id or run.epoch != ex.epoch:
            return  # only its own segment may send it (A2); recover voids it
        live = run.status is RunStatus.ACTIVE and run.lease_expires_us > self.clock.now_us()
        needs = a.operation == "charge"
        approval = self._approved(attempt_id) if needs else True
        self.fate = fate
        try:
            done = ex.dispatch(attempt_id, self.target)
        except charter.Fenced:
            assert not live
            return
        except charter.StateError:  # waiting for approval; or the run no longer active
            assert not approval or run.status is not RunStatus.ACTIVE
            return
        assert live
        if done.status is S.VOIDED:  # approval denied (W2)
            assert needs
            a.status = S.VOIDED
            return
        assert approval
        self.model.outcome(attempt_id, fate)

    @rule(operation=st.sampled_from(["read", "write"]), fate=FATES)
    def attempt(self, operation: str, fate: str) -> None:
        ex = self._executor()
        self.fate = fate
        done = self._attempted(ex, operation)
        if done is None:
            return
        self.model.outcome(done.id, fate)

    @rule(
        operation=st.sampled_from(["read", "write"]), fate=st.sampled_from(["applied", "cheaper"])
    )
    def crash_after_send(self, operation: str, fate: str) -> None:
        """The process dies after the target applied, before the settlement."""
        ex = self._executor()
        admits = self.model.admits(operation)
        self.fate, self.crash_at = fate, "settlement.before"
        n = self._next()
        try:
            ex.perform(self.target, operation, {"n": n}, effect_key=f"k{n}")
        except SimulatedCrash:
            assert admits
            applied = dict(COSTS[operation])
            if fate == "cheaper":
                applied["usd"] //= 2
            self.model.attempts[self.target.sent[-1].attempt_id].applied = applied
            self.executor = None
            return
        except charter.AllowanceExceeded:
            assert not admits
            return
        finally:
            self.crash_at = None
        raise AssertionError("the crash point was never reached")

    @precondition(lambda self: any(not r.status.terminal for r in self.engine.runs()))
    @rule(data=st.data())
    def recover(self, data: st.DataObject) -> None:
        """R3, R4: after the lease expires, PREPARED is voided, DISPATCHED is UNKNOWN."""
        run = data.draw(st.sampled_from([r for r in self.engine.runs() if not r.status.terminal]))
        self.clock.advance(LEASE + 1)
        self.engine.coordinator.recover(run.id, f"seg-{self._next()}")
        self.model.voided(run.id)
        for a in self.model.attempts.values():
            if a.run_id == run.id and a.status is S.DISPATCHED:
                a.status = S.UNKNOWN
        if self.executor is not None and self.executor.run_id == run.id:
            self.executor = None

    @precondition(lambda self: bool(self._with(S.UNKNOWN)))
    @rule(data=st.data())
    def reconcile(self, data: st.DataObject) -> None:
        """R7: evidence is stored; under ``confirm`` it settles nothing yet."""
        attempt_id = data.draw(st.sampled_from(self._with(S.UNKNOWN)))
        self.target.evidence[attempt_id] = self._look_up(self.engine.get_attempt(attempt_id))
        found = self.engine.coordinator.reconcile(attempt_id, self.target, by=self.who["alice"])
        assert found.conclusive
        self.model.attempts[attempt_id].evidence = True

    @precondition(lambda self: any(a.evidence for a in self.model.attempts.values()))
    @rule(data=st.data())
    def confirm(self, data: st.DataObject) -> None:
        ids = sorted(i for i, a in self.model.attempts.items() if a.evidence)
        attempt_id = data.draw(st.sampled_from(ids))
        self.engine.coordinator.confirm(attempt_id, by=self.who["alice"])
        applied = self.model.attempts[attempt_id].applied
        if applied is None:
            self.model.settle(attempt_id, S.FAILED, {})
        else:
            self.model.settle(attempt_id, S.SUCCEEDED, dict(applied))

    @precondition(lambda self: bool(self._with(S.UNKNOWN)))
    @rule(data=st.data(), outcome=st.sampled_from(["succeeded", "failed", "written_off"]))
    def resolve(self, data: st.DataObject, outcome: str) -> None:
        """R8, L9: a person's settlement, at the cost seen or (write-off) the full hold."""
        attempt_id = data.draw(st.sampled_from(self._with(S.UNKNOWN)))
        a = self.model.attempts[attempt_id]
        cost = dict(a.applied or {}) if outcome == "succeeded" else {}
        self.engine.coordinator.resolve(
            attempt_id,
            by=self.who["alice"],
            outcome=outcome,  # type: ignore[arg-type]
            evidence="checked with the target",
            cost=cost,
        )
        self.model.settle(
            attempt_id, S(outcome), dict(a.estimate) if outcome == "written_off" else cost
        )

    @precondition(lambda self: any(not r.status.terminal for r in self.engine.runs()))
    @rule(data=st.data())
    def stop(self, data: st.DataObject) -> None:
        run = data.draw(st.sampled_from([r for r in self.engine.runs() if not r.status.terminal]))
        self.engine.stop_run(run.id, by=self.who["alice"])
        self.model.voided(run.id)

    @rule(unit=st.sampled_from(["usd", "calls"]), step=st.integers(1, 3))
    def raise_limit(self, unit: str, step: int) -> None:
        limit = self.model.limit[unit] + step * (10_000 if unit == "usd" else 2)
        self.engine.raise_limit(self.mission, unit, limit, by=self.who["alice"])
        self.model.limit[unit] = limit

    @rule(operation=st.sampled_from(["read", "write"]), resolved=st.booleans())
    def late_result(self, operation: str, resolved: bool) -> None:
        """F2: the answer comes back after the run was recovered (and maybe after a
        person settled it otherwise): kept as evidence, settling what is still open."""
        ex = self._executor()
        self.fate, self.meanwhile = "applied", "resolved" if resolved else "recovered"
        try:
            done = self._attempted(ex, operation)
        finally:
            self.meanwhile = None
        if done is None:
            return
        a = self.model.attempts[done.id]
        if a.status is S.UNKNOWN:
            self.model.settle(done.id, S.SUCCEEDED, dict(a.applied or {}))
        self.executor = None

    @precondition(lambda self: self.model.incidents > 0)
    @rule()
    def close_incident(self) -> None:
        incident = self.engine.incidents(self.mission, open_only=True)[0]
        self.engine.close_incident(incident["id"], by=self.who["alice"], note="reviewed")
        self.model.incidents -= 1

    @rule(seconds=st.sampled_from([1, 20, LEASE + 1]))
    def time_passes(self, seconds: int) -> None:
        self.clock.advance(seconds)

    # -- after every step ----------------------------------------------------------------
    @invariant()
    def engine_and_model_agree(self) -> None:
        stored = {a.id: a for a in self.engine.attempts(mission_id=self.mission)}
        assert sorted(stored) == sorted(self.model.attempts)
        for attempt_id, want in self.model.attempts.items():
            got = stored[attempt_id]
            assert got.status is want.status, (attempt_id, got.status, want)
            assert got.estimate == want.estimate
            assert got.actual == (want.actual if want.status.settled else None), (got, want)
        for unit, bal in self.engine.balances(self.mission).items():
            model = (
                self.model.limit[unit],
                self.model.held(unit),
                self.model.spent(unit),
                self.model.available(unit),
            )
            assert (bal.limit, bal.held, bal.spent, bal.available) == model, unit
        assert len(self.engine.incidents(self.mission, open_only=True)) == self.model.incidents


@pytest.mark.timeout(0 if LONG else 600)
def test_A3_A4_L1_R4_R7_R8_every_attempt_is_where_the_model_says(backend: str) -> None:
    """A status, hold or spend that a rule would get wrong in some interleaving of
    admit, approve, dispatch, outcome, crash and recover, reconcile and confirm,
    resolve, stop, raise-limit and late result shows as a step after which an
    attempt (or the allowance) is not where the model put it."""
    run_state_machine_as_test(
        type(f"AttemptMachine_{backend}", (AttemptMachine,), {"backend": backend}),
        settings=settings(
            max_examples=(12 if backend == "sqlite" else 4) * (20 if LONG else 1),
            stateful_step_count=30,
            deadline=None,
            database=None,
            suppress_health_check=[HealthCheck.too_slow, HealthCheck.filter_too_much],
        ),
    )
