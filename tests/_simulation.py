"""A deterministic simulator: the engine against an outside world a seed decides.

In the manner of TigerBeetle's VOPR and FoundationDB's simulation: one process
runs two workers and an operator, each with an engine of its own on one store
(SQLite or PostgreSQL), against a simulated target whose every answer is
picked by a seeded random source — applied, refused, timed out after applying,
lost before applying, a reply that comes back after the owner lost the run, a
duplicate reply — through adapters the simulator controls (synchronous and
``async def``). It also picks store faults at the next physical commits (the
commit fails before it, or after it succeeded; the store is busy; the process
dies there), moves the store's clock across lease and approval expiry while
the two workers' wall clocks are skewed against it, and pauses a sender
between its dispatch commit and its send.

After every step each invariant is checked, named by its rule, against what
the store holds *and* what the target received (the target records every
send): at most one dispatch per attempt, each preceded by a durable dispatch
commit (A1, A2); no admission while the same effect is unresolved (A4); no
dispatch from an older epoch and no send after its deadline or lease (F2,
F3); the ledger (L0-L2, and the engine's own check); an attempt settled
after its send was not answered only by conclusive evidence or an authorised
person, and never against what the target knows (R7, R8); every audit chain
(S1). An engine call that fails with anything but a typed error is a
violation too.

The same seed gives the same trace, and its hash is printed; a failing seed
prints the one command that replays it. See docs/reliability.md.
"""

from __future__ import annotations

import contextlib
import hashlib
import random
import traceback
from collections import Counter, defaultdict
from collections.abc import Callable

import charter
from _sim_world import (
    APPROVAL_TTL,
    COSTS,
    FATES,
    FAULTS,
    HOLDING,
    LEASE,
    LOOKUPS,
    OPERATIONS,
    AsyncWorldAdapter,
    Hook,
    Process,
    Received,
    SimulatedCrash,
    Stats,
    Violation,
    World,
    WorldAdapter,
    pick,
    replay_command,
)
from charter import AttemptStatus, Dispatch, RunStatus
from charter.adapters import EffectClass
from charter.clock import ManualClock, SkewedClock
from charter.engine.executor import Executor
from charter.errors import Fenced, StoreBusy, StoreError
from charter.testing import AtCommit, RecordingAdapter, credential


class Simulation:
    """One seeded history: ``run(steps)`` returns the trace hash or raises Violation."""

    def __init__(self, seed: int, url: str, backend: str) -> None:
        self.seed, self.url, self.backend = seed, url, backend
        self.rng = random.Random(seed)
        self.clock = ManualClock()
        pairs = {n: credential(n) for n in ("agent", "alice", "bob")}
        self.credentials = {n: c for n, (c, _) in pairs.items()}
        self.config = charter.EngineConfig(
            credentials={n: d for n, (_, d) in pairs.items()},
            lease_seconds=LEASE,
            send_deadline_seconds=LEASE,
            evidence_settles="auto" if seed % 3 == 0 else "confirm",
        )
        self.world = World(self)
        self.adapters = [
            WorldAdapter(name="world", operations=OPERATIONS, costs=COSTS, world=self.world),
            AsyncWorldAdapter(name="world", operations=OPERATIONS, costs=COSTS, world=self.world),
        ]
        self.operator = self._process("operator", 0.0)
        self.workers = [self._process("w0", 3.0), self._process("w1", -11.0)]
        self.mission = self.operator.engine.create_mission(
            {
                "objective": "simulated payments",
                "principals": {
                    "agent": {"run": ["world.*"]},
                    "alice": ["resolve", "raise_limit", "stop", "approve"],
                    "bob": {"approve": ["world.*"]},
                },
                "allowance": {"usd": 150_000, "calls": 30},
                "approvals": {"required": ["world.charge"], "ttl_seconds": APPROVAL_TTL},
            },
            by=self.operator.who["alice"],
        )
        self.trace: list[str] = []
        self.violations: list[Violation] = []
        self.stats = Stats()
        self.ordinal: dict[str, int] = {}
        self.counter = 0

    # -- processes -------------------------------------------------------------------
    def _process(self, name: str, offset: float) -> Process:
        hook = Hook()
        clock = self.clock if offset == 0 else SkewedClock(self.clock, offset)
        engine = charter.Engine.open(
            self.url,
            config=self.config,
            clock=clock,
            store_clock=self.clock,
            rng=random.Random(self.rng.getrandbits(64)),
            crash_hook=hook,
        )
        who = {n: engine.authenticate(c) for n, c in self.credentials.items()}
        return Process(name, offset, engine, hook, who=who)

    def restart(self, proc: Process) -> None:
        """The process died: a new one opens the store; its executors are gone."""
        proc.engine.close()
        fresh = self._process(proc.name, proc.offset)
        fresh.hook.fired = proc.hook.fired
        proc.engine, proc.hook, proc.who, proc.executor = fresh.engine, fresh.hook, fresh.who, None

    def close(self) -> None:
        for p in (self.operator, *self.workers):
            p.engine.close()

    def _next(self) -> int:
        self.counter += 1
        return self.counter

    # -- the history -------------------------------------------------------------------
    def run(self, steps: int) -> str:
        # each step, how often, and whether a worker or the operator takes it
        actions: dict[tuple[Callable[[], str], bool], int] = {
            (self.step_attempt, True): 10,
            (self.step_admit, True): 2,
            (self.step_dispatch, True): 3,
            (self.step_retry, True): 2,
            (self.step_take_over, True): 2,
            (self.step_decide, False): 3,
            (self.step_time, False): 4,
            (self.step_reconcile, False): 3,
            (self.step_resolve, False): 2,
            (self.step_redeliver, False): 1,
            (self.step_stop, False): 1,
            (self.step_raise_limit, False): 1,
            (self.step_close_incident, False): 1,
        }
        for i in range(steps):
            action, by_worker = pick(self.rng, actions)
            fault = pick(self.rng, FAULTS)
            proc = self.rng.choice(self.workers) if by_worker else self.operator
            self._arm(proc, fault)
            try:
                line = self._guarded(action, proc)
            finally:
                proc.hook.fault = None
                if proc.hook.fired:
                    self.stats.faults[fault] += 1
                    line += f" ({fault} fired)"
            self.stats.steps += 1
            self.stats.actions[action.__name__] += 1
            self.trace.append(f"{i} {action.__name__} {proc.name} {fault} {line} | {self._state()}")
            self.check(f"step {i} ({action.__name__})")
        return hashlib.sha256("\n".join(self.trace).encode()).hexdigest()[:16]

    def _arm(self, proc: Process, fault: str | None) -> None:
        self.acting = proc
        proc.hook.fired = False
        if fault is None:
            return
        k = self.rng.randint(1, 3)
        kind, _, when = fault.partition(".")
        error: BaseException
        if kind == "busy":
            error, when = StoreBusy("the store is busy (simulated)"), "before"
        elif kind == "kill":
            error = SimulatedCrash()
        else:
            error = StoreError(f"the connection was lost at commit {k} ({when}; simulated)")
        proc.hook.fault = AtCommit(k, when, "fail", error)
        proc.hook.fired = False

    def _guarded(self, action: Callable[[], str], proc: Process) -> str:
        """Run one step; a typed error is an answer, a crash restarts the process,
        anything else is a violation."""
        try:
            out = action()
        except SimulatedCrash:
            self.restart(proc)
            out = "crashed"
        except Fenced:
            proc.executor = None
            out = "fenced"
        except charter.CharterError as exc:
            out = f"refused {type(exc).__name__}"
        except Exception as exc:
            raise Violation(
                "typed errors", f"{type(exc).__name__}: {exc}\n{traceback.format_exc()}"
            ) from exc
        return out

    def _state(self) -> str:
        """What the store holds, in a form the same seed reproduces."""
        eng = self.operator.engine
        attempts = eng.attempts(mission_id=self.mission)
        for a in attempts:
            self.ordinal.setdefault(a.id, len(self.ordinal))
        statuses = " ".join(f"{self.ordinal[a.id]}:{a.status.value[:2]}" for a in attempts)
        bal = {
            u: (b.available, b.held, b.spent) for u, b in sorted(eng.balances(self.mission).items())
        }
        return f"{statuses} {bal}"

    # -- helpers ---------------------------------------------------------------------------
    def worker(self) -> Process:
        return self.acting

    def executor(self, proc: Process) -> Executor:
        """The worker's run, or a new one when it has none that is active and its own."""
        ex = proc.executor
        if ex is not None:
            run = proc.engine.run(ex.run_id)
            if run.status is RunStatus.ACTIVE and run.epoch == ex.epoch:
                return ex
        ex = proc.engine.start_run(
            self.mission, by=proc.who["agent"], segment_id=f"seg-{self._next()}"
        )
        proc.executor = ex
        return ex

    def adapter(self) -> RecordingAdapter:
        return self.rng.choice(self.adapters)

    def attempts(self, *statuses: AttemptStatus) -> list[charter.Attempt]:
        found = self.operator.engine.attempts(mission_id=self.mission)
        return [a for a in found if a.status in statuses]

    def _fate(self) -> str:
        fate: str = pick(self.rng, FATES)
        self.world.fate = fate
        self.stats.fates[fate] += 1
        if fate == "paused":
            proc = self.acting
            proc.hook.pause_at = "dispatch.after"
            proc.hook.pause = lambda: self.meanwhile_pause(proc)
        return fate

    # -- steps -------------------------------------------------------------------------------
    def step_attempt(self) -> str:
        proc = self.worker()
        ex = self.executor(proc)
        op = self.rng.choice(list(OPERATIONS))
        fate = self._fate()
        n = self._next()
        try:
            done = ex.perform(self.adapter(), op, {"n": n}, effect_key=f"e{n}")
        finally:
            proc.hook.pause = None
        return f"{op} {fate} -> {done.status.value}"

    def step_admit(self) -> str:
        proc = self.worker()
        ex = self.executor(proc)
        op = self.rng.choice(list(OPERATIONS))
        n = self._next()
        done = ex.admit(self.adapter(), op, {"n": n}, effect_key=f"e{n}")
        return f"{op} -> {done.status.value}"

    def step_dispatch(self) -> str:
        proc = self.worker()
        ex = proc.executor
        prepared = [
            a for a in self.attempts(AttemptStatus.PREPARED) if ex and a.run_id == ex.run_id
        ]
        if ex is None or not prepared:
            return "nothing prepared"
        attempt = self.rng.choice(prepared)
        fate = self._fate()
        try:
            done = ex.dispatch(attempt.id, self.adapter())
        finally:
            proc.hook.pause = None
        return f"{self.ordinal.get(attempt.id)} {fate} -> {done.status.value}"

    def step_retry(self) -> str:
        """A4: a retry after a settled non-application is a new linked attempt;
        one while the effect is unresolved must be refused."""
        proc = self.worker()
        ex = proc.executor
        if ex is None:
            return "no run"
        mine = list(proc.engine.attempts(run_id=ex.run_id))
        newest: dict[str, charter.Attempt] = {}
        for a in sorted(mine, key=lambda a: a.generation):
            newest[a.effect_key] = a
        if not newest:
            return "nothing to retry"
        last = self.rng.choice(sorted(newest.values(), key=lambda a: a.id))
        premature = last.status in HOLDING
        fate = self._fate()
        try:
            done = ex.perform(
                self.adapter(),
                last.operation,
                last.request,
                effect_key=last.effect_key,
                generation=last.generation + 1,
                retry_of=last.id,
            )
        finally:
            proc.hook.pause = None
        return f"{self.ordinal.get(last.id)} premature={premature} {fate} -> {done.status.value}"

    def step_decide(self) -> str:
        pending = [
            a for a in self.operator.engine.approvals(pending=True) if a.mission_id == self.mission
        ]
        if not pending:
            return "nothing pending"
        approval = self.rng.choice(pending)
        deny = self.rng.random() < 0.2
        by = self.operator.who["bob"]
        status = self.operator.engine.approve(approval.id, by=by, deny=deny)
        return f"deny={deny} -> {status.value}"

    def step_time(self) -> str:
        seconds = self.rng.choice([1, 5, 16, LEASE + 1, LEASE + 9, APPROVAL_TTL + 1])
        self.clock.advance(seconds)
        return f"+{seconds}s"

    def step_take_over(self) -> str:
        """A worker takes over a run (its own after a crash, or the other's)
        whose lease expired: recover, then resume; refused while anything is
        uncertain, and refused for a live lease (R1)."""
        proc = self.worker()
        runs = [r for r in proc.engine.runs(self.mission) if not r.status.terminal]
        if not runs:
            return "no open run"
        run = self.rng.choice(runs)
        ex = proc.engine.coordinator.resume(run.id, f"seg-{self._next()}", by=proc.who["agent"])
        proc.executor = ex
        return f"resumed at epoch {ex.epoch}"

    def step_reconcile(self) -> str:
        uncertain = self.attempts(AttemptStatus.UNKNOWN, AttemptStatus.DISPATCHED)
        if not uncertain:
            return "nothing uncertain"
        attempt = self.rng.choice(uncertain)
        lookup = pick(self.rng, LOOKUPS)
        self.world.lookup = lookup
        owner = next(
            (
                p.executor
                for p in self.workers
                if p.executor and p.executor.run_id == attempt.run_id
            ),
            None,
        )
        executor = owner if self.rng.random() < 0.5 else None
        eng = self.operator.engine
        evidence = eng.coordinator.reconcile(
            attempt.id, self.adapters[0], by=self.operator.who["alice"], executor=executor
        )
        line = f"{self.ordinal.get(attempt.id)} {lookup} -> {evidence.verdict}"
        if (
            evidence.conclusive
            and eng.get_attempt(attempt.id).status.unresolved
            and self.rng.random() < 0.7
        ):
            done = eng.coordinator.confirm(attempt.id, by=self.operator.who["alice"])
            line += f", confirmed {done.status.value}"
        return line

    def step_resolve(self) -> str:
        uncertain = self.attempts(AttemptStatus.UNKNOWN, AttemptStatus.DISPATCHED)
        if not uncertain:
            return "nothing uncertain"
        attempt = self.rng.choice(uncertain)
        return self._resolve(attempt.id)

    def _resolve(self, attempt_id: str) -> str:
        """A person settles with what the target's books say (or writes it off)."""
        cost = self.world.applied.get(attempt_id)
        if self.rng.random() < 0.15:
            outcome, cost = "written_off", None
        else:
            outcome = "failed" if cost is None else "succeeded"
        done = self.operator.engine.coordinator.resolve(
            attempt_id,
            by=self.operator.who["alice"],
            outcome=outcome,  # type: ignore[arg-type]
            evidence={"checked": "the target's books"},
            cost=cost or {},
        )
        return f"{self.ordinal.get(attempt_id)} -> {done.status.value}"

    def step_redeliver(self) -> str:
        """The same reply delivered again, through a lookup: nothing changes."""
        if not self.world.duplicates:
            return "nothing to redeliver"
        attempt_id = self.rng.choice(self.world.duplicates)
        before = self._state()
        try:
            self.operator.engine.coordinator.reconcile(attempt_id, self.adapters[0])
        except charter.StateError as exc:
            if self._state() != before:
                raise Violation(
                    "A4", f"a refused duplicate reply changed the store ({exc})"
                ) from exc
            return f"refused {type(exc).__name__}"
        return "reconciled"

    def step_stop(self) -> str:
        runs = [r for r in self.operator.engine.runs(self.mission) if not r.status.terminal]
        if not runs or self.rng.random() < 0.5:
            return "not stopped"
        run = self.rng.choice(runs)
        return self.operator.engine.stop_run(run.id, by=self.operator.who["alice"]).status.value

    def step_raise_limit(self) -> str:
        unit = self.rng.choice(["usd", "calls"])
        bal = self.operator.engine.balances(self.mission)[unit]
        step = 20_000 if unit == "usd" else 4
        version = self.operator.engine.raise_limit(
            self.mission, unit, bal.limit + step, by=self.operator.who["alice"]
        )
        return f"{unit} v{version}"

    def step_close_incident(self) -> str:
        eng = self.operator.engine
        open_ = eng.incidents(self.mission, open_only=True)
        if not open_:
            return "no incident"
        eng.close_incident(open_[0]["id"], by=self.operator.who["alice"], note="reviewed")
        return "closed"

    # -- what happens meanwhile (called from inside a send or a lookup) ----------------------
    def meanwhile_take_over(self, run_id: str) -> None:
        """The sender stalls past its lease; the other worker recovers its run."""
        self.clock.advance(LEASE + 1)
        other = next(p for p in self.workers if p is not self.acting)
        with contextlib.suppress(charter.CharterError):
            other.engine.coordinator.recover(run_id, f"seg-{self._next()}")
        if other.executor is not None and other.executor.run_id == run_id:
            other.executor = None
        if self.rng.random() < 0.5:  # and a person settles it before the answer is back
            for a in self.attempts(AttemptStatus.UNKNOWN):
                if a.run_id == run_id:
                    self.meanwhile_resolve(a.id)

    def meanwhile_pause(self, proc: Process) -> None:
        """The sender paused between its dispatch commit and its send (F3)."""
        self.clock.advance(LEASE + self.rng.choice([-1, 1, 5]))

    def meanwhile_resolve(self, attempt_id: str) -> None:
        with contextlib.suppress(charter.CharterError):
            self._resolve(attempt_id)

    # -- invariants --------------------------------------------------------------------------
    def check_send(self, send: Dispatch) -> None:
        """At the moment the target receives a send (A2, F2, F3); what is wrong is
        kept for the end of the step (the engine would take an exception raised
        in its adapter for an unknown outcome)."""
        try:
            self._check_send(send)
        except Violation as exc:
            self.violations.append(exc)

    def _check_send(self, send: Dispatch) -> None:
        eng = self.operator.engine
        attempt = eng.get_attempt(send.attempt_id)
        run = eng.run(send.run_id)
        first = all(r.attempt_id != send.attempt_id for r in self.world.received)
        if first and (
            attempt.status is not AttemptStatus.DISPATCHED or attempt.dispatched_epoch != send.epoch
        ):
            raise Violation(
                "A2",
                f"sent {send.attempt_id} while the store says {attempt.status.value} "
                f"(epoch {attempt.dispatched_epoch})",
            )
        if not attempt.status.unresolved:
            raise Violation(
                "A4", f"sent {send.attempt_id} again after it settled {attempt.status.value}"
            )
        if run.epoch != send.epoch:
            raise Violation(
                "F2", f"sent {send.attempt_id} at epoch {send.epoch}; the run is at {run.epoch}"
            )
        if send.clock.monotonic_us() >= send.deadline_monotonic_us:
            raise Violation("F3", f"sent {send.attempt_id} after its deadline")
        if run.lease_expires_us <= self.clock.now_us():
            raise Violation("F3", f"sent {send.attempt_id} after its run's lease expired")

    def check(self, where: str) -> None:
        if self.violations:
            raise self.violations[0]
        eng = self.operator.engine
        attempts = eng.attempts(mission_id=self.mission)
        by_id = {a.id: a for a in attempts}
        self._check_sends(by_id)
        self._check_effects(attempts)
        self._check_ledger(eng, attempts)
        self._check_settlements(eng, attempts)
        for v in eng.verify_audit(self.mission):
            if not v.ok:
                raise Violation("S1", f"{where}: chain broken at {v.broken_at}: {v.problem}")

    def _check_sends(self, by_id: dict[str, charter.Attempt]) -> None:
        per: dict[str, list[Received]] = defaultdict(list)
        for r in self.world.received:
            per[r.attempt_id].append(r)
        for attempt_id, got in per.items():
            a = by_id.get(attempt_id)
            if a is None or a.dispatched_epoch is None:
                raise Violation(
                    "A1", f"the target received {attempt_id}, which the store never dispatched"
                )
            if sum(r.applied for r in got) > 1:
                raise Violation(
                    "A2", f"the target applied {attempt_id} {sum(r.applied for r in got)} times"
                )
            if len(got) > 1 and OPERATIONS[a.operation].effect is not EffectClass.IDEMPOTENT_KEYED:
                raise Violation(
                    "A2", f"{a.operation} attempt {attempt_id} was sent {len(got)} times"
                )
        for a in by_id.values():
            if a.dispatched_epoch is not None and a.dispatched_epoch != a.admitted_epoch:
                raise Violation(
                    "F2",
                    f"{a.id} admitted at epoch {a.admitted_epoch}, "
                    f"dispatched at {a.dispatched_epoch}",
                )

    def _check_effects(self, attempts: list[charter.Attempt]) -> None:
        open_: Counter[tuple[str, str, str]] = Counter()
        for a in attempts:
            if a.status in HOLDING:
                open_[(a.run_id, a.node_id, a.effect_key)] += 1
        for effect, n in open_.items():
            if n > 1:
                raise Violation("A4", f"effect {effect} has {n} unresolved attempts")

    def _check_ledger(self, eng: charter.Engine, attempts: list[charter.Attempt]) -> None:
        problems = eng.check_ledger(self.mission)
        if problems:
            raise Violation("L0-L2", "; ".join(problems))
        for unit, bal in eng.balances(self.mission).items():
            if bal.available + bal.held + bal.spent != bal.limit:
                raise Violation("L0", f"{unit}: {bal}")
            held = sum(a.estimate.get(unit, 0) for a in attempts if a.status in HOLDING)
            if bal.held != held:
                raise Violation("L1", f"{unit}: held {bal.held}, holds of open attempts {held}")
            spent = sum((a.actual or {}).get(unit, 0) for a in attempts if a.status.settled)
            if bal.spent != spent:
                raise Violation("L2", f"{unit}: spent {bal.spent}, actuals {spent}")

    def _check_settlements(self, eng: charter.Engine, attempts: list[charter.Attempt]) -> None:
        """R7, R8: what the send did not answer is settled only by conclusive
        evidence or an authorised person, and nothing contradicts the target."""
        settled_by: dict[str, str] = {}
        for e in eng.audit_events(self.mission):
            if e["kind"] == "attempt.settled":
                settled_by[e["entity"]] = e["actor"]
        for a in attempts:
            if not a.status.settled:
                continue
            applied = a.id in self.world.applied
            if a.status is AttemptStatus.SUCCEEDED and not applied:
                raise Violation("R7", f"{a.id} SUCCEEDED but the target never applied it")
            if a.status is AttemptStatus.FAILED and applied:
                raise Violation("R7", f"{a.id} FAILED (not applied) but the target applied it")
            if a.answered:
                continue
            actor = settled_by.get(a.id)
            rows = [r for r in eng.evidence(a.id) if r["settled"]]
            if not rows:
                raise Violation(
                    "R7", f"{a.id} settled {a.status.value} with no evidence settling it"
                )
            by_target = all(
                r["verdict"] != "indeterminate" and r["source"] != "person" for r in rows
            )
            if actor != "alice" and not (
                by_target and (actor == "agent" or self.config.evidence_settles == "auto")
            ):
                raise Violation("R8", f"{a.id} settled by {actor!r}, who may not resolve it")


def simulate(seed: int, url: str, backend: str, steps: int) -> tuple[str, Stats]:
    """One seed: its trace hash and what it did, or a Violation naming the replay command."""
    sim = Simulation(seed, url, backend)
    try:
        digest = sim.run(steps)
    except Violation as exc:
        tail = "\n".join(sim.trace[-8:])
        raise Violation(
            exc.rule,
            f"seed {seed}: {exc}\nlast steps:\n{tail}\n"
            f"replay: {replay_command(seed, steps, backend)}",
        ) from exc
    finally:
        sim.close()
    return digest, sim.stats
