"""The engine: one store, one configuration, no global state.

``Engine.open()`` opens (and migrates) the store, and every public operation
is a method on the instance. Decisions by people — approvals, limit raises,
incident closures, stops — take an authenticated :class:`Principal` (P1) and
are checked against the mission's *current* contract; refusals are audited.

The methods live with their concern, each a class mixed in here:
:mod:`~charter.engine.reads` (what anyone may read),
:mod:`~charter.engine.decisions` (what people decide),
:mod:`~charter.engine.runs` (starting and following runs),
:mod:`~charter.engine.submitted` (runs submitted to workers, and their queue),
:mod:`~charter.engine.graphs` (waits and artifacts),
:mod:`~charter.engine.overview` (the operator's desk),
:mod:`~charter.engine.signins` (the console's sessions) and
:mod:`~charter.engine.snapshots` (export, import, handover). This module opens
the store, proves who is asking, and holds the coordinator.
"""

from __future__ import annotations

import random

from charter.clock import Clock, SystemClock
from charter.config import EngineConfig
from charter.contracts.authority import Authority
from charter.contracts.principals import Authenticator, Principal
from charter.crashpoints import CrashHook
from charter.engine.coordinator import Coordinator
from charter.engine.decisions import Decisions
from charter.engine.graphs import ArtifactOperations, GraphOperations
from charter.engine.overview import Overview
from charter.engine.reads import Reads
from charter.engine.remote import RemoteSegments
from charter.engine.runs import Runs
from charter.engine.signins import SignIns
from charter.engine.snapshots import Snapshots
from charter.engine.submitted import Submissions
from charter.errors import AuthenticationError
from charter.ids import IdFactory
from charter.runtime import Runtime
from charter.storage import Database, open_database
from charter.telemetry import Observer


class Engine(
    Reads,
    Decisions,
    Runs,
    RemoteSegments,
    Submissions,
    GraphOperations,
    ArtifactOperations,
    Overview,
    SignIns,
    Snapshots,
):
    """A Charter engine bound to one store (its operator reads: :class:`Overview`)."""

    def __init__(
        self,
        db: Database,
        config: EngineConfig,
        clock: Clock,
        crash_hook: CrashHook | None,
        rng: random.Random | None = None,
        *,
        observer: Observer | None = None,
    ) -> None:
        self._db = db
        self.config = config
        self.clock = clock
        self._authority = Authority(config.credentials)
        self._runtime = Runtime(
            db,
            config,
            clock,
            self._authority,
            rng or random.SystemRandom(),
            crash_hook,
            observer,
        )
        self._coordinator: Coordinator | None = None
        self._sign_heads()

    @classmethod
    def open(
        cls,
        url: str | None = None,
        *,
        config: EngineConfig | None = None,
        clock: Clock | None = None,
        rng: random.Random | None = None,
        crash_hook: CrashHook | None = None,
        store_clock: Clock | None = None,
        create: bool = True,
        observer: Observer | None = None,
    ) -> Engine:
        """Open the store at ``url`` (default: ``./.charter/charter.db``).

        A store that does not exist yet is created, unless ``create=False``: then
        it is refused with :class:`~charter.errors.StoreNotFound` and nothing is
        made (tools that only look at a store, like the ``charter`` command).

        ``clock``, ``rng`` and ``crash_hook`` are the test seams: a
        :class:`~charter.clock.ManualClock`, a seeded ``random.Random`` and a
        hook called at every durable boundary (see :mod:`charter.testing`).
        ``clock`` is this process's clock. The store's clock, which leases and
        deadlines are measured by (F1), is the server's on PostgreSQL and this
        process's on SQLite; a test simulating several machines injects it as
        ``store_clock`` (with a skewed ``clock`` per worker).

        ``observer`` is told of runs, nodes and attempts as they pass (see
        :mod:`charter.telemetry`; OpenTelemetry: :mod:`charter.integrations.otel`).
        """
        config = config or EngineConfig()
        clock = clock or SystemClock()
        ids = IdFactory(clock, rng)
        Authenticator(config.credentials)  # refuse bad credentials before opening anything
        db = open_database(
            url if url is not None else config.store,
            clock=store_clock or clock,
            ids=ids,
            busy_timeout=config.busy_timeout_seconds,
            create=create,
        )
        db.on_commit = crash_hook
        return cls(db, config, clock, crash_hook, rng, observer=observer)

    def close(self) -> None:
        self._db.close()

    def __enter__(self) -> Engine:
        return self

    def __exit__(self, *exc: object) -> None:
        self.close()

    @property
    def coordinator(self) -> Coordinator:
        """The recovery API: ``recover``, ``reconcile``, ``resolve``, ``resume``."""
        if self._coordinator is None:
            self._coordinator = Coordinator(self._runtime)
        return self._coordinator

    # -- identity (P1) ----------------------------------------------------------
    def authenticate(self, credential: str, *, audit: bool = True) -> Principal:
        """The principal a ``NAME:SECRET`` credential proves; a refusal is audited,
        unless ``audit`` is false: a server counts refusals and records the counts
        (P4, :meth:`record_refusals`)."""
        try:
            return self._authority.authenticator.authenticate(credential)
        except AuthenticationError as exc:
            who = self._authority.claimed(exc, self.config.credentials)
            if "principal" in exc.details:
                exc.details["principal"] = who
            if not audit:
                raise
            with self._db.transaction() as tx:
                raise self._authority.refused_identity(
                    tx, exc, who, reason="bad credential"
                ) from None


def runtime_of(engine: Engine) -> Runtime:
    """What ``engine``'s parts share (its store, configuration, clocks, crash hook),
    for the rooms above the engine that work on the same store beside it, such as
    the notices of :mod:`charter.workers.notify`. Read it; replace nothing in it.

    A function of this module, not a property of the face: the runtime holds the
    store's transactions, and no public method hands user code one."""
    return engine._runtime
