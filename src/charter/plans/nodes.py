"""Plans, nodes and the journaled node context (A6, N1).

A node is a registered Python function, sync or async, that receives a
:class:`Context` and its input (the run's input for the first node, the
previous node's checked result after that). Effects go through
``ctx.attempt(...)``; nondeterminism through ``ctx.now()``, ``ctx.random()``
and ``ctx.uuid()``. All of these are journaled, so a node re-executed after a
crash replays them: a settled attempt returns its recorded result, an
unresolved one blocks the node, and a request that differs from the recorded
one is a :class:`~charter.errors.NonDeterminismError`, never a silent re-send.

**Code outside journaled calls runs again on replay.** A bare file write, a
``print``, a call to an API not made through an adapter: all repeat. Keep
effects inside ``ctx.attempt``.
"""

from __future__ import annotations

import contextlib
import json
import threading
import uuid as uuid_mod
from collections.abc import Callable, Iterator, Mapping, Sequence
from dataclasses import dataclass, field
from datetime import UTC, datetime
from pathlib import Path
from typing import Any, BinaryIO, overload

from charter.adapters import Adapter
from charter.artifacts.workspace import check_name
from charter.attempts import dispatch, driver, effects
from charter.attempts.model import Attempt, AttemptStatus, Effect, Lineage
from charter.clock import MICROS
from charter.errors import (
    AdmissionRefused,
    AnswerNotRecorded,
    ApprovalRequired,
    AttemptFailed,
    Blocked,
    CharterError,
    NonDeterminismError,
    PlanError,
    SettlementUnrecorded,
    StateError,
    StoreError,
    WaitPending,
)
from charter.plans import files, graph, versions
from charter.plans import store as plans_store
from charter.plans.lineage import lineage
from charter.runs import store as run_store
from charter.runs.ownership import Segment
from charter.runs.run import RunStatus
from charter.waits import pending
from charter.waits.model import WaitKind

NodeFn = Callable[["Context", Any], Any]


@dataclass(frozen=True)
class Node:
    """One step of a plan: a function, an optional check, a retry policy."""

    name: str
    fn: NodeFn
    check: Callable[[Any], bool] | None = None
    retries: int = 0
    #: Workspace files (artifact names) the node reads: put back before it starts (N2).
    uses: tuple[str, ...] = ()

    def __call__(self, ctx: Context, value: Any) -> Any:
        return self.fn(ctx, value)


@overload
def node(fn: NodeFn, /) -> Node: ...


@overload
def node(
    *,
    name: str | None = None,
    check: Callable[[Any], bool] | None = None,
    retries: int = 0,
    uses: Sequence[str] = (),
) -> Callable[[NodeFn], Node]: ...


def node(
    fn: NodeFn | None = None,
    /,
    *,
    name: str | None = None,
    check: Callable[[Any], bool] | None = None,
    retries: int = 0,
    uses: Sequence[str] = (),
) -> Node | Callable[[NodeFn], Node]:
    """Decorate a function ``(ctx, value) -> result`` as a plan node.

    ``check`` must accept the result for the node to complete (N1); a node
    whose function raises (or whose check refuses) is executed again up to
    ``retries`` times, each time as a new node execution. Without retries, only
    a declared failure (:class:`~charter.errors.NodeFailed`, a refusing check,
    an effect settled failed) fails the run; any other exception is a bug or a
    broken environment, and leaves the run needing intervention (N6). ``uses`` names the
    workspace files (artifacts saved by earlier nodes) it reads: each is
    checked, and put back from the artifact store if missing, before it starts.
    """

    def wrap(f: NodeFn) -> Node:
        return Node(name or f.__name__, f, check, retries, _uses(uses))

    return wrap(fn) if fn is not None else wrap


def _uses(names: Sequence[str]) -> tuple[str, ...]:
    """Declared workspace files, each a safe artifact name (N2)."""
    for n in names:
        check_name(n)
    return tuple(names)


@dataclass(frozen=True)
class Plan:
    """A DAG of nodes; a fixed sequence when ``after`` is not given.

    ``after`` maps a node's name to the names of the nodes it comes after
    (build one with :meth:`graph`); a node with several dependencies receives
    ``{name: result}`` of them, one with a single dependency its result, one
    with none the run's input. ``functions`` are further nodes a running node
    may add to the plan (N3, :meth:`Context.extend`). ``workers`` bounds how
    many ready nodes run at once. ``ref`` is the ``"module:attribute"`` path
    of this plan object, recorded on the run so a fresh process (``charter
    resume``) can load it.
    """

    name: str
    nodes: tuple[Node, ...]
    ref: str | None = None
    after: Mapping[str, tuple[str, ...]] | None = None
    functions: tuple[Node, ...] = ()
    workers: int = 4

    def __post_init__(self) -> None:
        names = [n.name for n in self.nodes]
        if not names:
            raise PlanError(f"plan {self.name!r} has no nodes", plan=self.name)
        offered = names + [n.name for n in self.functions]
        if len(set(offered)) != len(offered):
            dup = sorted({n for n in offered if offered.count(n) > 1})
            raise PlanError(
                f"plan {self.name!r} has duplicate node names {dup}; node ids are unique",
                plan=self.name,
                duplicates=dup,
            )
        if not 1 <= self.workers <= 64:
            raise PlanError(f"plan {self.name!r}: workers must be 1..64", plan=self.name)
        deps = graph.sequence(names) if self.after is None else dict(self.after)
        extra = sorted(set(deps) - set(names))
        if extra or len(deps) != len(names):
            raise PlanError(
                f"plan {self.name!r}: dependencies are declared for {extra or 'too few'} "
                "node(s); declare exactly the plan's nodes",
                plan=self.name,
            )
        deps = {n: tuple(deps[n]) for n in names}
        shape = graph.Shape(deps, {n: n for n in names}, {}, graph.check(self.name, deps))
        object.__setattr__(self, "shape", shape)

    #: The checked DAG (set in ``__post_init__``).
    shape: graph.Shape = field(init=False, repr=False, compare=False)

    @classmethod
    def graph(
        cls,
        name: str,
        edges: Mapping[Node, Sequence[Node | str]],
        *,
        ref: str | None = None,
        functions: Sequence[Node] = (),
        workers: int = 4,
    ) -> Plan:
        """A plan from ``{node: [the nodes it comes after]}``, in declaration order."""
        after = {
            n.name: tuple(d if isinstance(d, str) else d.name for d in ds)
            for n, ds in edges.items()
        }
        return cls(name, tuple(edges), ref, after, tuple(functions), workers)

    @property
    def offered(self) -> set[str]:
        """The names of the node functions a step may run: the nodes and functions."""
        return {n.name for n in (*self.nodes, *self.functions)}

    def function(self, name: str) -> Node:
        """The node function named ``name``: one of the nodes or the functions."""
        for n in (*self.nodes, *self.functions):
            if n.name == name:
                return n
        raise PlanError(f"plan {self.name!r} offers no node function {name!r}", plan=self.name)


class Context:
    """What a node sees: journaled effects and journaled nondeterminism."""

    def __init__(self, executor: Segment, node_id: str, execution: int) -> None:
        self._ex = executor
        self.run_id = executor.run_id
        self.node_id = node_id
        self.execution = execution
        self._seq = 0  # unkeyed effect calls, in order
        self._jseq = 0  # journaled values, in order
        self._lock = threading.Lock()
        self._in_flight = 0
        #: Where this node's earlier attempts live (read once, on first use).
        self._lineage: Lineage | None = None
        #: The plan being run, which :meth:`extend` changes (set by the runner).
        self.plan: Plan | None = None

    @property
    def epoch(self) -> int:
        return self._ex.epoch

    # -- effects -------------------------------------------------------------
    def attempt(
        self, adapter: Adapter, operation: str, request: Any, *, key: str | None = None
    ) -> Any:
        """Perform one effect through ``adapter``; return its recorded result.

        ``key`` is the effect key; without one, the call's sequence number in
        this node execution is used, which is why concurrent calls must carry
        explicit keys (the engine refuses concurrent unkeyed calls). An async
        adapter is awaited on a private event loop; in an async node, prefer
        :meth:`aattempt`.
        """
        with self._effect(key) as effect_key:
            return dispatch.drive(self._steps(adapter, operation, request, effect_key), adapter)

    async def aattempt(
        self, adapter: Adapter, operation: str, request: Any, *, key: str | None = None
    ) -> Any:
        """:meth:`attempt` for async nodes: the adapter's send is awaited on this
        event loop (a synchronous adapter's in a worker thread), and the short
        store commits around it run in a worker thread."""
        with self._effect(key) as effect_key:
            return await dispatch.adrive(self._steps(adapter, operation, request, effect_key))

    @contextlib.contextmanager
    def _effect(self, key: str | None) -> Iterator[str]:
        """The effect key of one call, counted as in flight while it runs."""
        with self._lock:
            if key is None:
                if self._in_flight:
                    raise StateError(
                        "concurrent calls must carry explicit keys: ctx.attempt(..., key=...); "
                        "an unkeyed call's identity is its position, which concurrency changes"
                    )
                self._seq += 1
                effect_key = f"#{self._seq}"
            else:
                effect_key = f"k:{key}"
            self._in_flight += 1
        try:
            yield effect_key
        finally:
            with self._lock:
                self._in_flight -= 1

    def _steps(
        self, adapter: Adapter, operation: str, request: Any, effect_key: str
    ) -> dispatch.Sending[Any]:
        """The call through the one driver (:func:`dispatch.performing`), which
        :func:`effects.decide` steers: what the node sees is the outcome, and a
        wait or an uncertainty marks the run and blocks the node."""
        ex = self._ex
        if ex.draining:  # K4: the process is stopping; the run goes on elsewhere
            raise Blocked(
                "the executor is stopping: this effect is left for the run's next owner",
                run_id=self.run_id,
            )
        at = Effect(self.node_id, self.execution, effect_key, lineage=self._lines())
        try:
            attempt = yield from driver.calling(ex, adapter, operation, request, at)
        except ApprovalRequired as exc:
            scope = f"{adapter.name}.{operation}"
            ex.mark(RunStatus.WAITING, f"approval for {scope} in node {self.node_id}")
            raise Blocked(
                exc.message, run_id=self.run_id, attempt_id=exc.details.get("attempt_id")
            ) from None
        except SettlementUnrecorded as exc:
            # Sent, and not recorded: an uncertainty, never a failure to retry (A4).
            self._intervene(exc.message)
            raise Blocked(
                exc.message, run_id=self.run_id, attempt_id=exc.details["attempt_id"]
            ) from exc
        except StoreError as exc:
            # The store failed around an admission or a dispatch commit: whatever
            # it kept (nothing, PREPARED, or DISPATCHED with the answer lost to the
            # worker) is the engine's to sort out on resume or recovery, never the
            # node's failure to end the run with (A4, R4).
            self._intervene(exc.message)
            raise Blocked(exc.message, run_id=self.run_id) from exc
        except AdmissionRefused as exc:
            if _suspended(ex):
                # Not the node's failure: the run is paused, stopping or stopped and
                # waits for its people (L7, N5). Like an approval wait, the node
                # stops here: a retry would be refused again, and a node that caught
                # the refusal and went on would end a run somebody must decide on.
                raise Blocked(exc.message, run_id=self.run_id) from None
            raise
        return self._outcome(attempt)

    def _intervene(self, reason: str) -> None:
        """Mark the run as needing a person, if the store lets us (it may be the
        store that failed): recovery finds the unresolved attempt either way."""
        with contextlib.suppress(CharterError):
            self._ex.mark(RunStatus.NEEDS_INTERVENTION, reason)

    def _lines(self) -> Lineage:
        """Where this node's effects were tried before: this execution, the node's
        earlier ones, the ended run this one continues (N4); read once."""
        if self._lineage is None:
            with self._ex.runtime.db.read() as tx:
                self._lineage = lineage(tx, self.run_id, self.node_id, self.execution)
        return self._lineage

    def _outcome(self, attempt: Attempt) -> Any:
        if effects.unrecorded(attempt):  # never a result nobody recorded (N6)
            raise AnswerNotRecorded(
                f"attempt {attempt.id} ({attempt.scope}) settled {attempt.status.value} without "
                "its answer (a lookup or a person named no result); the effect was applied, "
                "so it is not performed again: go on without the answer, or stop",
                attempt_id=attempt.id,
                scope=attempt.scope,
                status=attempt.status.value,
            )
        if attempt.status is AttemptStatus.SUCCEEDED:
            return attempt.result
        if attempt.status in (AttemptStatus.FAILED, AttemptStatus.WRITTEN_OFF):
            # The reason says whether the target refused, a lookup proved nothing
            # was applied, or the engine itself refused to send late (F3): the
            # same status, three different stories for whoever reads the failure.
            why = f": {attempt.reason}" if attempt.reason else ""
            raise AttemptFailed(
                f"attempt {attempt.id} ({attempt.scope}) generation {attempt.generation} "
                f"settled {attempt.status.value}{why}",
                attempt_id=attempt.id,
                status=attempt.status.value,
                generation=attempt.generation,
                reason=attempt.reason,
                result=attempt.result,
            )
        if attempt.status is AttemptStatus.VOIDED:
            raise Blocked(
                f"attempt {attempt.id} was voided ({attempt.reason})",
                run_id=self.run_id,
                attempt_id=attempt.id,
            )
        self._ex.mark(
            RunStatus.NEEDS_INTERVENTION,
            f"attempt {attempt.id} is {attempt.status.value}: reconcile or resolve it",
        )
        raise Blocked(
            f"attempt {attempt.id} ({attempt.scope}) is {attempt.status.value}; it is never "
            "retried on a guess — reconcile it or have a person resolve it",
            run_id=self.run_id,
            attempt_id=attempt.id,
        )

    # -- journaled nondeterminism ---------------------------------------------
    def _journal(self, kind: str, make: Callable[[], Any]) -> Any:
        with self._lock:
            self._jseq += 1
            seq = self._jseq
        with self._ex.runtime.db.transaction() as tx:
            row = plans_store.journaled(tx, self.run_id, self.node_id, self.execution, seq)
            if row is not None:
                if row["kind"] != kind:
                    raise NonDeterminismError(
                        f"node {self.node_id} asked for {kind} at journal position {seq}, "
                        f"where {row['kind']} was recorded",
                        position=seq,
                    )
                return json.loads(row["value"])
            self._ex.own(tx)  # a fenced owner records nothing (F2)
            value = make()
            plans_store.write_journal(
                tx,
                self.run_id,
                self.node_id,
                self.execution,
                seq,
                kind=kind,
                value=json.dumps(value),
            )
            return value

    def now(self) -> datetime:
        """The current time by the engine's clock, journaled."""
        us = self._journal("now", self._ex.runtime.clock.now_us)
        return datetime.fromtimestamp(us / MICROS, tz=UTC)

    def random(self) -> float:
        """A float in [0, 1), journaled."""
        value: float = self._journal("random", self._ex.runtime.random)
        return value

    def uuid(self) -> str:
        """A random UUID (version 4), journaled."""
        value: str = self._journal(
            "uuid", lambda: str(uuid_mod.UUID(int=self._ex.runtime.randbits(128), version=4))
        )
        return value

    # -- artifacts (N2) --------------------------------------------------------------
    @property
    def workspace(self) -> Path:
        """This run's workspace directory, where declared files are put back."""
        return Path(files.workspace(self._ex))

    def save(self, name: str, source: bytes | BinaryIO | None = None) -> dict[str, Any]:
        """Save an artifact: the workspace file ``name`` (or ``source``), streamed
        into the artifact store; returns ``{"artifact", "sha256", "size"}``."""
        return files.save(self._ex, self.node_id, self.execution, name, source)

    # -- plan changes (N3) -------------------------------------------------------------
    def extend(self, *steps: graph.Step) -> int:
        """Add nodes and edges to the run's plan (a journaled step); the new version."""
        if self.plan is None:
            raise StateError("extend is for a node run by a plan")
        with self._lock:
            self._jseq += 1
            seq = self._jseq
        p = self.plan
        return versions.extend(
            self._ex,
            p.shape,
            name=p.name,
            offered=p.offered,
            at=(self.node_id, self.execution, seq),
            steps=steps,
        )

    # -- durable waits (W1) --------------------------------------------------------
    def ask(self, key: str, question: str, *, answer: type = str) -> Any:
        """Ask a person ``question``; the node waits, durably, for an answer of type
        ``answer`` (``str``, ``int``, ``float``, ``bool``, or ``object`` for any JSON)."""
        kind = {str: "str", int: "int", float: "float", bool: "bool"}.get(answer, "json")
        return self._wait(key, WaitKind.INPUT, question, kind, None)

    def sleep(self, key: str, seconds: float) -> None:
        """Wait until ``seconds`` after this node first asked, by the store's clock."""
        self._wait(key, WaitKind.TIMER, None, None, seconds)

    def wait_for(self, key: str, event: str) -> Any:
        """Wait for the named ``event``; return the payload it was signalled with."""
        return self._wait(key, WaitKind.EVENT, event, None, None)

    def _wait(
        self, key: str, kind: WaitKind, prompt: str | None, answer: str | None, sec: float | None
    ) -> Any:
        ex = self._ex
        with ex.runtime.db.transaction() as tx:
            ex.own(tx)  # a fenced owner asks for nothing (F2)
            w = pending.request(
                tx,
                mission_id=ex.mission_id,
                run_id=self.run_id,
                node_id=self.node_id,
                key=key,
                kind=kind,
                prompt=prompt,
                answer_type=answer,
                seconds=sec,
                actor=ex.principal,
                segment=ex.segment_id,
                epoch=ex.epoch,
            )
            ready, value = pending.arrived(tx, w, actor=ex.principal)
        if ready:
            return value
        ex.runtime.crash("wait.pending")
        raise WaitPending(
            f"node {self.node_id} waits for {kind.value} {key!r}", run_id=self.run_id, wait_id=w.id
        )


def _suspended(ex: Segment) -> bool:
    """Whether the run has left ``active`` (the refusal itself may have paused it)."""
    with ex.runtime.db.read() as tx:
        status = run_store.status(tx, ex.run_id)
    return status is not RunStatus.ACTIVE
