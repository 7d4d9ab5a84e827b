"""What a worker does with a run it took from the queue (K1, K2).

A submitted run is begun as its first segment. Any other run is taken over as a
new segment (R1: the epoch moves on and older work is fenced), then every
unresolved attempt whose adapter the worker holds is reconciled (a lookup, or a
same-key replay of an ``idempotent_keyed`` effect inside its window, A8), and
the run is resumed under the engine's resume policy (R9), which continues past
nothing uncertain. A send whose answer is lost while the worker holds the run
is looked up in the same way at once (K5), and while lookups prove nothing the
run is parked until the next is due, at most :data:`LOOKUPS` in all. What still
stands in the way is a person's: the run is parked until a decision wakes it,
and the people are told. A run that stops to wait is parked until its wait can
be met (a timer's due time, or a wake).

The queue only says when to look. Who may act is the run's epoch and lease: a
run another worker holds is refused here (:class:`~charter.errors.LeaseHeld`)
and parked until that lease ends, so a worker that died is found by its lease,
never by a process table that only one host can read (K4).
"""

from __future__ import annotations

import contextlib
import logging
from collections.abc import Callable, Mapping, Sequence
from contextlib import AbstractContextManager
from dataclasses import dataclass, field

from charter.adapters import Adapter
from charter.attempts.model import Attempt, AttemptStatus
from charter.clock import seconds_us
from charter.engine.engine import Engine
from charter.engine.executor import Executor
from charter.errors import (
    Blocked,
    CharterError,
    Fenced,
    LeaseHeld,
    NeedsIntervention,
    NotFound,
    RunTerminal,
    StateError,
)
from charter.plans.nodes import Plan
from charter.runs.model import RunStatus

log = logging.getLogger("charter.worker")

#: Statuses in which a run waits for people, not for time (K3 tells them).
NEEDS_PEOPLE = (RunStatus.NEEDS_INTERVENTION, RunStatus.PAUSED, RunStatus.STOPPING)

#: How many lookups a worker makes of one UNKNOWN attempt before it leaves the
#: attempt to a person (K5), and how long it waits after the first that proved
#: nothing: each next wait is twice the last, at most half a lease, so that the
#: run is mostly looked at again while its segment's lease still runs.
LOOKUPS = 6
LOOKUP_WAIT_SECONDS = 0.5

#: What a carry that met a lost answer does next: look it up, as after a takeover.
_LOOK_UP = "look_up"


@dataclass
class Carry:
    """One run taken by a worker: its queue token, the segment it runs as, what the
    worker knows, and whom to tell (each hook is the worker's)."""

    engine: Engine
    run_id: str
    token: str
    segment_id: str
    plans: Mapping[str, Plan]
    adapters: Mapping[str, Adapter]
    #: Called with the executor once the run is held (the worker renews its lease).
    holding: Callable[[Executor], None]
    #: Called when the run needs a person: (run id, kind, what is needed, attempt ids).
    tell: Callable[[str, str, list[str], list[str]], None]
    #: Whether the worker is stopping (K4): a run it lets go of is due at once.
    stopping: Callable[[], bool]
    #: The context the run's plan executes in, given its mission: the worker's
    #: lane of escrow (L10), or none.
    lane: Callable[[str], AbstractContextManager[object]] = lambda _: contextlib.nullcontext()
    outcome: str = field(default="", init=False)

    def __call__(self) -> str:
        """Carry the run as far as it goes; what happened (for logs and counts)."""
        try:
            self.outcome = self._carry()
        except Fenced:
            self.outcome = "fenced"  # taken over meanwhile: its new owner goes on
        except RunTerminal:
            self._ended()
        except NotFound:
            self.outcome = "gone"
            with contextlib.suppress(CharterError):
                self.engine.unqueue(self.run_id)
        return self.outcome

    def _carry(self) -> str:
        run = self.engine.run(self.run_id)
        if run.status.terminal:
            return self._ended()
        if run.status is RunStatus.QUEUED:
            executor = self.engine.begin(self.run_id, self.segment_id)
            if executor is None:
                self._park(self.engine.now_us())  # begun or stopped meanwhile: look again
                return "lost"
        else:
            taken = self._take_over()
            if isinstance(taken, str):
                return taken
            executor = taken
        while (outcome := self._execute(executor)) == _LOOK_UP:
            # A send's answer was lost while this worker held the run (A3): what
            # is uncertain is looked up and the run resumed, as after a takeover.
            taken = self._take_over()
            if isinstance(taken, str):
                return taken
            executor = taken
        return outcome

    def _take_over(self) -> Executor | str:
        """Continue the run as its owner's segment if its owner let go of it (it
        blocked on a wait, F1); else take it over as a new segment, which the
        engine allows once the lease ended or the owner is provably dead on this
        host (R1: the lost owner is fenced by the epoch and what it sent is
        marked UNKNOWN), reconcile what the worker can look up, and resume; or
        say why not."""
        run = self.engine.run(self.run_id)
        if run.lease_expires_us > self.engine.now_us() and not self.engine.held(self.run_id):
            # Recovered by a person, or let go of: what is uncertain is looked up first.
            self._reconcile(self.engine.coordinator.state(self.run_id).attempts, run.owner_segment)
            try:
                return self._resume(run.owner_segment)
            except LeaseHeld:
                pass  # held again meanwhile: taken over below if its holder is gone
        try:
            state = self.engine.coordinator.recover(self.run_id, self.segment_id)
        except LeaseHeld as held:  # a live owner: look again when its lease ends
            self._park(int(held.details["lease_expires_us"]))
            return "held"
        if state.run.status.terminal:
            return self._ended()
        self._reconcile(state.attempts, self.segment_id)
        try:
            return self._resume(self.segment_id)
        except LeaseHeld as held:  # taken meanwhile by another worker
            self._park(int(held.details["lease_expires_us"]))
            return "held"

    def _resume(self, segment: str) -> Executor | str:
        try:
            return self.engine.coordinator.resume(self.run_id, segment)
        except NeedsIntervention as exc:
            return self._needs_person(list(exc.details.get("blockers") or [exc.message]))

    def _reconcile(self, attempts: Sequence[Attempt], segment: str) -> None:
        """Ask for evidence on every UNKNOWN attempt whose adapter the worker holds (A8)."""
        for attempt in attempts:
            adapter = self.adapters.get(attempt.adapter)
            if adapter is None or attempt.status is not AttemptStatus.UNKNOWN:
                continue
            try:
                self.engine.coordinator.reconcile(attempt.id, adapter, segment_id=segment)
            except CharterError as exc:  # settled meanwhile, or the lookup was refused
                log.info("reconcile of %s in run %s: %s", attempt.id, self.run_id, exc)

    def _execute(self, executor: Executor) -> str:
        self.holding(executor)
        self.engine.hold_run(self.run_id, token=self.token, until_us=executor.lease_expires_us)
        plan = self.plans[self._plan_ref()]
        try:
            with self.lane(executor.mission_id):
                executor.execute(plan)
        except Blocked:
            return self._blocked()
        except Fenced:
            raise
        except CharterError as exc:  # the node failed, the run ended or needs a person
            log.info("run %s stopped: %s", self.run_id, exc)
            return self._stopped()
        return self._ended()

    def _plan_ref(self) -> str:
        row = self.engine.queued_run(self.run_id)
        if row is None:
            raise StateError(f"run {self.run_id} is not in the queue", run_id=self.run_id)
        return str(row["plan"])

    def _blocked(self) -> str:
        """The run stopped to wait, or for a person, or because the worker stops."""
        run = self.engine.run(self.run_id)
        if run.status.terminal:
            return self._ended()
        if self.stopping():
            self._park(self.engine.now_us())  # K4: another worker carries it on now
            return "handed_on"
        if run.status is RunStatus.NEEDS_INTERVENTION:
            state = self.engine.coordinator.state(self.run_id)
            if 0 in self._lookups(state.attempts):  # never looked up: at once (K5)
                return _LOOK_UP
        if run.status in NEEDS_PEOPLE:
            return self._stopped()
        due = self.engine.wake_at_us(self.run_id)
        self._park(due)
        if due is None:  # only a person or a service moves it on: say so (K3)
            self._tell_waiting()
        return "waiting"

    def _tell_waiting(self) -> None:
        """A run parked on an approval or a question: its people are told which."""
        pending = self.engine.approvals(run_id=self.run_id, pending=True)
        if pending:
            needs = [f"approval {a.id} of {a.scope}" for a in pending]
            self.tell(self.run_id, "approval", needs, [])
            return
        asked = [
            w for w in self.engine.waits(self.run_id, open_only=True) if w.kind.value == "input"
        ]
        if asked:
            self.tell(self.run_id, "input", [f"an answer to {w.key!r}" for w in asked], [])

    def _stopped(self) -> str:
        run = self.engine.run(self.run_id)
        if run.status.terminal:
            return self._ended()
        return self._needs_person([f"run is {run.status.value}: {run.status_reason or ''}".strip()])

    def _needs_person(self, needs: list[str]) -> str:
        """Park until a decision wakes the run, and tell its people what kind of
        decision it waits for (K3); or, while a lookup may still settle what is
        uncertain, until the next lookup is due (K5): a person is told only of
        what no lookup settled."""
        state = self.engine.coordinator.state(self.run_id)
        made = self._lookups(state.attempts)
        if made:
            wait = LOOKUP_WAIT_SECONDS * 2 ** (max(min(made), 1) - 1)
            wait = min(wait, self.engine.config.lease_seconds / 2)
            self._park(self.engine.now_us() + seconds_us(wait))
            return "looking_up"
        self._park(None)
        unknown = [a.id for a in state.attempts if a.status is AttemptStatus.UNKNOWN]
        kind = "cannot_resume"
        if unknown:
            kind = "unknown_attempt"
        elif any(w.get("renews") or w.get("status") == "pending" for w in state.waits):
            kind = "approval"  # asked again after one expired unwatched (W2)
        elif state.assessment["open_incidents"]:
            kind = "incident"
        elif state.assessment["exhausted"] or state.run.status is RunStatus.PAUSED:
            kind = "allowance"  # paused with no incident open: the allowance fell short
        self.tell(self.run_id, kind, needs, [a.id for a in state.attempts])
        return "needs_person"

    def _lookups(self, attempts: Sequence[Attempt]) -> list[int]:
        """For each UNKNOWN attempt a lookup of this worker's may still settle, how
        many lookups proved nothing so far: none once evidence that proves its
        outcome is on record (settled, or a person confirms it under
        ``evidence_settles = "confirm"``), nor after :data:`LOOKUPS` of them."""
        made = []
        for attempt in attempts:
            if attempt.status is not AttemptStatus.UNKNOWN or attempt.adapter not in self.adapters:
                continue
            verdicts = [e["verdict"] for e in self.engine.evidence(attempt.id)]
            if len(verdicts) < LOOKUPS and all(v == "indeterminate" for v in verdicts):
                made.append(len(verdicts))
        return made

    def _ended(self) -> str:
        self.engine.unqueue(self.run_id)
        return "ended"

    def _park(self, due_us: int | None) -> None:
        self.engine.park_run(self.run_id, token=self.token, due_us=due_us)
