"""Shared fixtures: a real store per backend, a manual clock, real principals.

Every test that takes ``engine`` runs once per backend: the embedded SQLite
store, and PostgreSQL when ``CHARTER_TEST_POSTGRES_URL`` names a server (under
``CI=true`` it must: ``.ci/run`` starts one). Each test process (each pytest-xdist
worker, or pytest run alone) works in a database of its own on that server,
created when its session starts and dropped when it ends, and each PostgreSQL
test gets a schema of its own in it: what PostgreSQL keeps per database, not per
schema (advisory locks such as a mission's gate, LISTEN/NOTIFY channels), is
never shared by two tests running at once. A test that tampers with or inspects
rows on purpose takes ``raw`` (the store's own client, either backend); one that
asks for ``store_url`` itself is about the SQLite file (its bytes, pragmas,
write lock) and runs on SQLite only.
"""

from __future__ import annotations

import contextlib
import dataclasses
import functools
import inspect
import json
import os
import random
import urllib.parse
import uuid
from collections.abc import Callable, Iterator
from dataclasses import dataclass
from pathlib import Path
from typing import Any

import pytest

import _schemas
import charter
from _fake_models import FakeProvider, pay_invoice_script
from _raw import RawStore
from charter.adapters.http import HttpAdapter
from charter.clock import Clock
from charter.sandbox import Sandbox, declaration
from charter.testing import (
    AsyncRecordingAdapter,
    ManualClock,
    RecordingAdapter,
    SkewedClock,
    credential,
)

#: The server the tests use, as given: its maintenance database, for creating others.
ADMIN_URL = os.environ.get("CHARTER_TEST_POSTGRES_URL")
if os.environ.get("CI") == "true" and not ADMIN_URL:
    raise RuntimeError("CI=true but CHARTER_TEST_POSTGRES_URL is not set: start PostgreSQL")
#: The pytest-xdist worker this process is (``gw0``, ``gw1`` ...), ``main`` when alone.
WORKER = os.environ.get("PYTEST_XDIST_WORKER", "main")
#: The test run, shared by its workers (one name prefix for all their databases).
RUN = os.environ.get("PYTEST_XDIST_TESTRUNUID", uuid.uuid4().hex)[:12]


def database_url(admin_url: str, name: str) -> str:
    """``admin_url`` with its database replaced by ``name`` (query kept)."""
    return urllib.parse.urlsplit(admin_url)._replace(path=f"/{name}").geturl()


#: This process's database (:func:`database`), where every PostgreSQL test works.
PG_DATABASE = f"charter_{RUN}_{WORKER}"
PG_URL = database_url(ADMIN_URL, PG_DATABASE) if ADMIN_URL else None
BACKENDS = ["sqlite", *(["postgresql"] if PG_URL else [])]
#: ``python3 tasks.py faults --long``: the fault families run longer.
LONG = os.environ.get("CHARTER_FAULTS") == "long"

NAMES = ("agent", "alice", "bob", "mallory")


@dataclass
class Principals:
    """Credentials and authenticated principals of the test engine."""

    credentials: dict[str, str]
    digests: dict[str, str]
    engine: charter.Engine

    def __getattr__(self, name: str) -> charter.Principal:
        if name in self.credentials:
            return self.engine.authenticate(self.credentials[name])
        raise AttributeError(name)


def stored(engine: charter.Engine, mission: str, *, runs: bool = True) -> dict[str, Any]:
    """Everything the store holds about a mission except its audit chain: what a
    refused request must leave exactly as it was. ``runs=False`` leaves out the
    runs, for refusals whose rule changes the run's status (L7 pause, stopping)."""
    attempts = engine.attempts(mission_id=mission)
    return {
        "mission": engine.mission(mission).to_dict(),
        "runs": [r.to_dict() for r in engine.runs(mission)] if runs else None,
        "attempts": [a.to_dict() for a in attempts],
        "evidence": {a.id: engine.evidence(a.id) for a in attempts},
        "ledger": engine.ledger_entries(mission),
        "balances": {u: dataclasses.asdict(b) for u, b in engine.balances(mission).items()},
        "approvals": [a.to_dict() for a in engine.approvals() if a.mission_id == mission],
        "incidents": engine.incidents(mission),
    }


def default_contract(**overrides: Any) -> dict[str, Any]:
    """A contract: ``agent`` runs on the recorder, ``alice`` decides, ``bob`` approves."""
    contract: dict[str, Any] = {
        "objective": "test mission",
        "principals": {
            "agent": {"run": ["recorder.*"]},
            "alice": ["resolve", "raise_limit", "stop", "link", "adopt", "consume", "approve"],
            "bob": {"approve": ["recorder.*"]},
        },
        "allowance": {"usd": 1_000_000, "calls": 100},
    }
    contract.update(overrides)
    return contract


def pytest_generate_tests(metafunc: pytest.Metafunc) -> None:
    kinds = getattr(metafunc.module, "ADAPTER_KINDS", None)
    if kinds and "adapter" in metafunc.fixturenames:
        # Modules that set ADAPTER_KINDS run every test taking ``adapter`` with a
        # synchronous and an async adapter: the rules hold for both kinds.
        metafunc.parametrize("adapter", kinds, indirect=True)
    if "backend" not in metafunc.fixturenames:
        return
    reads_the_file = "store_url" in inspect.signature(metafunc.function).parameters or any(
        # ... or through a fixture of its own module that does.
        "store_url" in fd.argnames and fd.func.__module__ == metafunc.module.__name__
        for fds in metafunc._arg2fixturedefs.values()
        for fd in fds
    )
    backends = ["sqlite"] if reads_the_file else BACKENDS
    if metafunc.definition.get_closest_marker("networked"):
        backends = [b for b in backends if b == "postgresql"]
    metafunc.parametrize("backend", backends, indirect=True)


@contextlib.contextmanager
def database(admin_url: str, name: str) -> Iterator[str]:
    """A database ``name`` on the server, created empty (from ``template0``, which
    no session holds open) and dropped afterwards with whatever connections are
    left in it (a killed child's, a leaked pool's); yields its URL."""
    import psycopg

    with psycopg.connect(admin_url, autocommit=True) as admin:
        admin.execute(f"CREATE DATABASE {name} TEMPLATE template0")
    try:
        yield database_url(admin_url, name)
    finally:
        with psycopg.connect(admin_url, autocommit=True) as admin:
            admin.execute(f"DROP DATABASE IF EXISTS {name} WITH (FORCE)")


@pytest.fixture(scope="session", autouse=True)
def _process_database() -> Iterator[None]:
    """:data:`PG_DATABASE`, for the whole session of this test process."""
    if ADMIN_URL is None:
        yield
        return
    with database(ADMIN_URL, PG_DATABASE):
        yield


def pytest_collection_modifyitems(config: pytest.Config, items: list[pytest.Item]) -> None:
    """Under pytest-xdist, the longest tests first: those whose timeout is raised
    past the default (a kill table, a sweep, a fleet), then those that kill real
    processes, each group in file order. Handed out first, one at a time to
    whichever worker is free (``tasks.parallel``), they run beside the short
    ones; handed out last, the run would end waiting on one of them.
    (Every worker collects the same order, as pytest-xdist requires.)"""
    if WORKER == "main":
        return
    default = float(config.getini("timeout") or 0)

    def rank(item: pytest.Item) -> tuple[float, bool]:
        marker = item.get_closest_marker("timeout")
        seconds = float(marker.args[0]) if marker and marker.args else default
        return (-(seconds or float("inf")), item.get_closest_marker("crash") is None)

    items.sort(key=rank)


@pytest.fixture
def backend(request: pytest.FixtureRequest) -> str:
    return str(request.param)


@pytest.fixture
def clock() -> ManualClock:
    return ManualClock()


@pytest.fixture
def creds() -> tuple[dict[str, str], dict[str, str]]:
    pairs = {n: credential(n) for n in NAMES}
    return {n: c for n, (c, _) in pairs.items()}, {n: d for n, (_, d) in pairs.items()}


@contextlib.contextmanager
def fresh_store(folder: Path, backend: str, *, bare: bool = False) -> Iterator[str]:
    """The URL of a store with nothing in it: a file in ``folder``, or a PostgreSQL
    schema of its own (for tests that need many, such as state machines). On
    PostgreSQL the schema holds the store's tables already, at the current
    version, and is made new for another test afterwards (``_schemas.py``);
    ``bare=True``: nothing at all, dropped afterwards."""
    if backend == "sqlite":
        yield str(folder / "charter.db")
        return
    pool = _schema_pool()
    schema = pool.bare() if bare else pool.take()
    try:
        yield _schemas.store_url(pool.database_url, schema)
    finally:
        pool.give_back(schema, reuse=not bare)


@functools.cache
def _schema_pool() -> _schemas.SchemaPool:
    """This test process's schemas, in its own database."""
    assert PG_URL is not None
    return _schemas.SchemaPool(PG_URL)


@pytest.fixture
def store_url(request: pytest.FixtureRequest, tmp_path: Path, backend: str) -> Iterator[str]:
    """See :func:`fresh_store`; a test marked ``bare_store`` makes the store itself."""
    bare = request.node.get_closest_marker("bare_store") is not None
    with fresh_store(tmp_path, backend, bare=bare) as url:
        yield url


@pytest.fixture
def store_address(store_url: str) -> str:
    """The store's URL for tests that only hand it to another process (any backend)."""
    return store_url


@pytest.fixture
def raw(store_address: str, backend: str) -> Iterator[RawStore]:
    """The store seen from outside, through its driver (see ``_raw.py``): for tests
    that tamper with rows or inspect them on purpose, on either backend."""
    store = RawStore(store_address, backend)
    yield store
    store.close()


@pytest.fixture
def make_engine(
    store_url: str,
    backend: str,
    clock: ManualClock,
    creds: tuple[dict[str, str], dict[str, str]],
) -> Iterator[Callable[..., charter.Engine]]:
    """Open (more) engines on the same store; all are closed after the test."""
    opened: list[charter.Engine] = []

    def make(*, process_clock: Clock | None = None, **config: Any) -> charter.Engine:
        """``clock`` is the store's clock; the engine's own (``process_clock``) is
        off from it by default on PostgreSQL, as a worker's on another machine
        would be, so nothing can quietly depend on the two agreeing (F1, F3)."""
        cfg = charter.EngineConfig(credentials=creds[1], **config)
        if process_clock is None:
            process_clock = SkewedClock(clock, -20.0) if backend == "postgresql" else clock
        eng = charter.Engine.open(
            store_url,
            config=cfg,
            clock=process_clock,
            store_clock=clock,
            rng=random.Random(len(opened)),
        )
        opened.append(eng)
        return eng

    yield make
    for eng in opened:
        eng.close()


@pytest.fixture
def engine(make_engine: Callable[..., charter.Engine]) -> charter.Engine:
    return make_engine()


@pytest.fixture
def who(engine: charter.Engine, creds: tuple[dict[str, str], dict[str, str]]) -> Principals:
    """``who.agent``, ``who.alice`` ... authenticated on ``engine``."""
    return Principals(creds[0], creds[1], engine)


@pytest.fixture
def adapter(request: pytest.FixtureRequest) -> RecordingAdapter:
    """A recording adapter, synchronous unless the module asks for both kinds."""
    kind = getattr(request, "param", "sync")
    make = AsyncRecordingAdapter if kind == "async" else RecordingAdapter
    return make(
        costs={
            "read": {"usd": 1_000, "calls": 1},
            "write": {"usd": 5_000, "calls": 1},
            "charge": {"usd": 20_000, "calls": 1},
        }
    )


@pytest.fixture
def mission(engine: charter.Engine, who: Principals) -> str:
    return engine.create_mission(default_contract(), by=who.alice)


@pytest.fixture
def box(request: pytest.FixtureRequest, tmp_path: Path) -> Iterator[Sandbox]:
    """The payments sandbox, on a store of its own under ``tmp_path``. A module
    that sets ``SANDBOX_KEY`` gets one that asks for that API key, as a real
    payments API does (else 401)."""
    api_key = getattr(request.module, "SANDBOX_KEY", None)
    with Sandbox(tmp_path / "sandbox.db", api_key=api_key) as sandbox:
        yield sandbox


@pytest.fixture
def payments(box: Sandbox) -> Iterator[HttpAdapter]:
    """The HTTP adapter declared for ``box`` (its key, if it asks for one), quick to time out."""
    with declaration(box.url, timeout_seconds=0.5, api_key=box.api_key).build() as adapter:
        yield adapter


def payments_contract(**overrides: Any) -> dict[str, Any]:
    """A contract for the sandbox: ``agent`` pays, ``alice`` resolves and stops,
    within 1,000 dollars (in the sandbox's unit, cents)."""
    return default_contract(
        principals={"agent": {"run": ["payments.*"]}, "alice": ["resolve", "stop"]},
        allowance={"usd_cents": 100_000},
        **overrides,
    )


def payment(amount: int, invoice: str, payee: str = "acme") -> dict[str, Any]:
    """A request to the sandbox's ``pay``: ``amount`` cents to ``payee`` for ``invoice``."""
    return {"amount": amount, "currency": "usd", "payee": payee, "reference": invoice}


@pytest.fixture
def key(tmp_path: Path) -> str:
    """A fresh signing key's file, for an engine that signs its snapshots."""
    path = tmp_path / "signing.pem"
    charter.new_signing_key(path)
    return str(path)


@pytest.fixture
def target(
    tmp_path: Path,
    backend: str,
    clock: ManualClock,
    creds: tuple[dict[str, str], dict[str, str]],
    key: str,
) -> Iterator[charter.Engine]:
    """The store a mission is handed or imported to: an empty store of its own,
    of the same kind, that trusts ``key``'s public half."""
    from charter.audit.signing import load_signer

    folder = tmp_path / "target"
    folder.mkdir()
    with fresh_store(folder, backend) as url:
        config = charter.EngineConfig(
            credentials=creds[1], trusted_keys=(load_signer(key).public_key,)
        )
        eng = charter.Engine.open(url, config=config, clock=clock)
        yield eng
        eng.close()


@pytest.fixture
def desk(make_engine: Callable[..., charter.Engine]) -> charter.Engine:
    """The operator's desk engine (``_desk``): its configuration names the shared
    recorder, reset for this test. A module that serves it authenticates ``who`` on it."""
    import _desk  # the server's dependencies, only for the tests that serve

    _desk.reset()
    return make_engine(**_desk.CONFIG)


@pytest.fixture
def cli(
    monkeypatch: pytest.MonkeyPatch, tmp_path: Path, capsys: pytest.CaptureFixture[str]
) -> Callable[..., tuple[int, Any]]:
    """Run ``charter ARGS`` in this process from an empty directory with no configuration;
    returns the exit status and the parsed JSON (under ``--json``) or the text printed."""
    from charter.cli.app import main

    cwd = tmp_path / "cwd"
    cwd.mkdir()
    monkeypatch.chdir(cwd)
    for name in ("CHARTER_CONFIG", "CHARTER_CREDENTIAL", "CHARTER_CREDENTIAL_FILE"):
        monkeypatch.delenv(name, raising=False)

    def run(*args: str) -> tuple[int, Any]:
        status = main(list(args))
        out, err = capsys.readouterr()
        if "--json" in args:
            assert not err, err
            return status, json.loads(out)
        return status, out + err

    return run


@pytest.fixture
def provider() -> Iterator[FakeProvider]:
    """A fake model provider playing the agent that pays an invoice; a module
    whose agent plays another script defines its own."""
    with FakeProvider(script=pay_invoice_script) as fake:
        yield fake
