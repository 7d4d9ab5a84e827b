"""The store: recorded migrations, SQLite settings, bounded busy waits, typed errors, config.

Migrations and "nothing changed" are checked through the store's own client on
both backends (``_raw.py``); what is about SQLite itself (its file, WAL, pragmas,
its write lock) runs on SQLite only.
"""

from __future__ import annotations

import contextlib
import json
import math
import sqlite3
import subprocess
import sys
import time
from collections import Counter
from collections.abc import Callable, Iterator
from contextlib import closing, contextmanager
from pathlib import Path
from typing import Any

import pytest

import charter
from _raw import RawStore
from charter.storage.dialect import postgresql as postgresql_dialect
from charter.storage.dialect import sqlite as sqlite_dialect
from charter.storage.schema import LATEST, MIGRATIONS
from charter.storage.sqlite import SQLiteDriver
from charter.testing import ManualClock, RecordingAdapter
from conftest import Principals, default_contract, stored

HOLDER = Path(__file__).with_name("_hold_write_lock.py")


def migrations(raw: RawStore) -> list[tuple[Any, ...]]:
    return [
        tuple(r.values())
        for r in raw.rows(
            "SELECT version, name, applied_at_us FROM schema_migrations ORDER BY version"
        )
    ]


def pragma(engine: charter.Engine, name: str) -> Any:
    """A setting of the engine's own connection."""
    with engine._db.read() as tx:
        row = tx.one(f"PRAGMA {name}")
        assert row is not None
        return row[0]


# -- migrations ---------------------------------------------------------------------------


@pytest.mark.bare_store
def test_migrations_are_recorded_with_their_versions(
    engine: charter.Engine, raw: RawStore, clock: ManualClock
) -> None:
    assert migrations(raw) == [(v, name, clock.now_us()) for v, name, _ in MIGRATIONS]
    assert [v for v, _, _ in MIGRATIONS] == list(range(1, LATEST + 1))
    assert {
        "missions",
        "contract_versions",
        "ledger_entries",
        "runs",
        "segments",
        "attempts",
        "evidence",
        "incidents",
        "approvals",
        "audit_events",
        "node_executions",
        "journal",
    } <= set(raw.tables())


def test_a_statement_for_one_backend_names_a_backend_that_exists() -> None:
    """A migration's ``(backend, sql)`` runs only there: a misspelt name would
    make every store skip it, so each name must be a dialect's."""
    names = {sqlite_dialect().name, postgresql_dialect().name}
    tagged = [s for _, _, statements in MIGRATIONS for s in statements if isinstance(s, tuple)]
    assert tagged, "schema 14 has statements for one backend"
    assert {backend for backend, _ in tagged} <= names


def test_reopening_a_store_is_idempotent(
    make_engine: Callable[..., charter.Engine],
    raw: RawStore,
    clock: ManualClock,
    creds: tuple[dict[str, str], dict[str, str]],
) -> None:
    first = make_engine()
    mission = first.create_mission(default_contract(), by=first.authenticate(creds[0]["alice"]))
    first.close()
    before = raw.dump()
    for _ in range(3):
        clock.advance(60)
        again = make_engine()
        assert [m.id for m in again.missions()] == [mission]
        again.close()
    assert raw.dump() == before


def _build_version_1(raw: RawStore) -> None:
    """A store as the first migration left it."""
    version, name, statements = MIGRATIONS[0]
    if raw.backend == "sqlite":
        raw.execute("PRAGMA journal_mode=WAL")
    _new_migrations_table(raw)
    dialect = sqlite_dialect() if raw.backend == "sqlite" else postgresql_dialect()
    for statement in statements:  # DDL: no placeholders to rewrite twice
        raw.execute(dialect.sql(statement))
    raw.execute("INSERT INTO schema_migrations VALUES (?, ?, ?)", version, name, 42)


def _new_migrations_table(raw: RawStore) -> None:
    raw.execute(
        "CREATE TABLE schema_migrations (version INTEGER PRIMARY KEY, name TEXT NOT NULL, "
        "applied_at_us BIGINT NOT NULL)"
    )


@pytest.mark.bare_store
def test_an_older_store_is_migrated_forward(
    make_engine: Callable[..., charter.Engine], raw: RawStore, clock: ManualClock
) -> None:
    _build_version_1(raw)
    assert "node_executions" not in raw.tables()
    make_engine()
    assert [(v, at) for v, _, at in migrations(raw)] == [
        (1, 42),
        *((v, clock.now_us()) for v in range(2, LATEST + 1)),
    ]
    assert {"node_executions", "journal"} <= set(raw.tables())


def _attempt_indexes(raw: RawStore) -> set[str]:
    """The names of the indexes on ``attempts`` (SQLite names a constraint's own)."""
    if raw.backend == "sqlite":
        return {r["name"] for r in raw.rows("PRAGMA index_list(attempts)")}
    return {
        r["indexname"]
        for r in raw.rows(
            "SELECT indexname FROM pg_indexes WHERE schemaname = current_schema() "
            "AND tablename = 'attempts'"
        )
    }


@pytest.mark.bare_store
def test_A5_upgrading_drops_the_index_of_the_derived_key_and_keeps_every_attempt(
    make_engine: Callable[..., charter.Engine],
    raw: RawStore,
    creds: tuple[dict[str, str], dict[str, str]],
    monkeypatch: pytest.MonkeyPatch,
) -> None:
    """Schema 14 copies the attempts into a table without an index for the
    idempotency key (it is the id's, A5): evidence keeps pointing at its attempt."""
    from charter import storage

    monkeypatch.setattr(storage, "MIGRATIONS", MIGRATIONS[:13])
    monkeypatch.setattr(storage, "LATEST", 13)
    old = make_engine()
    # Today's code reads the escrow tables (L10) on every admission, keeps the
    # digest of every claim it issues (X3), a chain's books on its head row and
    # whether an attempt is in its run's counts: they stand in for this old
    # store's while it is written, and go before it is upgraded (the books as
    # the rows of ``allowances`` that old code kept).
    for later in (m for m in MIGRATIONS if m[0] in (18, 21)):
        for statement in later[2]:
            backend, sql = statement if isinstance(statement, tuple) else (raw.backend, statement)
            if backend == raw.backend:
                raw.execute(sql)
    for head in ("missions", "audit_chains"):
        raw.execute(f"ALTER TABLE {head} ADD COLUMN books TEXT NOT NULL DEFAULT '{{}}'")
    raw.execute("ALTER TABLE attempts ADD COLUMN tallied INTEGER NOT NULL DEFAULT 1")
    agent = old.authenticate(creds[0]["agent"])
    mission = old.create_mission(default_contract(), by=old.authenticate(creds[0]["alice"]))
    adapter = RecordingAdapter()

    def lost(send: charter.Dispatch) -> charter.Outcome:
        raise charter.OutcomeUnknown("cut off", evidence={"seen": send.attempt_id})

    adapter.script["write"] = lost
    ex = old.start_run(mission, by=agent, segment_id="s1")
    ex.perform(adapter, "read", {"k": 1}, effect_key="r1")
    assert ex.perform(adapter, "write", {"k": 2}, effect_key="w1").status.value == "unknown"
    old.close()
    for table in ("escrow_holds", "escrow_accounts", "escrow_slices", "run_claims"):
        raw.execute(f"DROP TABLE {table}")
    raw.books_as_before_schema_23()
    raw.attempts_as_before_schema_25()
    assert len(raw.rows("SELECT * FROM evidence")) == 1
    keyed = _attempt_indexes(raw)
    before = {t: raw.dump()["rows"][t] for t in ("attempts", "evidence", "runs", "ledger_entries")}
    monkeypatch.undo()

    upgraded = make_engine()
    assert migrations(raw)[-1][0] == LATEST
    after = raw.dump()["rows"]
    # Every row as it was, and (schema 25) each attempt counted in its run's
    # counts but the one whose outcome is unknown.
    attempts = raw.rows("SELECT * FROM attempts")
    after["attempts"] = sorted(
        repr({c: v for c, v in a.items() if c != "tallied"}) for a in attempts
    )
    assert {t: after[t] for t in before} == before
    assert sorted((a["status"], a["tallied"]) for a in attempts) == [
        ("succeeded", 1),
        ("unknown", 0),
    ]
    assert len(_attempt_indexes(raw)) == len(keyed) - 1
    assert all(
        r["idempotency_key"] == f"charter-{r['id']}"
        for r in raw.rows("SELECT id, idempotency_key FROM attempts")
    )
    if raw.backend == "sqlite":
        assert raw.rows("PRAGMA foreign_key_check") == []
    # The effect's identity is still unique, and the upgraded store goes on.
    with pytest.raises(Exception, match=r"(?i)unique"):
        raw.execute("INSERT INTO attempts SELECT * FROM attempts WHERE effect_key = 'r1'")
    ex = upgraded.start_run(mission, by=upgraded.authenticate(creds[0]["agent"]), segment_id="s2")
    assert ex.perform(RecordingAdapter(), "read", {"k": 3}, effect_key="r2").status.value == (
        "succeeded"
    )


@pytest.mark.bare_store
def test_a_failing_migration_leaves_the_store_at_its_previous_version(
    make_engine: Callable[..., charter.Engine], raw: RawStore
) -> None:
    _build_version_1(raw)
    raw.execute("CREATE TABLE journal (x INTEGER)")  # something in the way of migration 2
    before = raw.dump()
    with pytest.raises(charter.StoreError):
        make_engine()
    assert raw.dump() == before
    assert "node_executions" not in raw.tables()  # the whole migration rolled back


@pytest.mark.bare_store
def test_a_new_store_is_made_whole_or_not_at_all(
    make_engine: Callable[..., charter.Engine], raw: RawStore
) -> None:
    """Every version of a new store is applied in one transaction: when the
    last one fails, none of the others is left behind (a half-made store would
    be taken for an old one and upgraded from wherever it stopped)."""
    last_version, _, _ = MIGRATIONS[-1]
    raw.execute("CREATE TABLE gateway_calls (x INTEGER)")  # in the way of the newest version
    with pytest.raises(charter.StoreError):
        make_engine()
    assert raw.tables() == ["gateway_calls"]
    raw.execute("DROP TABLE gateway_calls")
    engine = make_engine()
    assert [v for v, _, _ in migrations(raw)] == list(range(1, last_version + 1))
    engine.close()


def test_a_store_newer_than_this_charter_is_refused_and_left_untouched(
    make_engine: Callable[..., charter.Engine],
    raw: RawStore,
    creds: tuple[dict[str, str], dict[str, str]],
) -> None:
    engine = make_engine()
    engine.create_mission(default_contract(), by=engine.authenticate(creds[0]["alice"]))
    engine.close()
    raw.execute("INSERT INTO schema_migrations VALUES (?, 'from the future', 1)", LATEST + 1)
    before = raw.dump()
    with pytest.raises(charter.SchemaError) as info:
        make_engine()
    assert info.value.code == "schema_error"
    assert isinstance(info.value, charter.StoreError)
    assert raw.dump() == before


@pytest.mark.bare_store
def test_a_newer_store_gets_none_of_this_charters_tables(
    make_engine: Callable[..., charter.Engine], raw: RawStore
) -> None:
    _new_migrations_table(raw)
    raw.execute("INSERT INTO schema_migrations VALUES (?, 'rewritten', 1)", LATEST + 7)
    before = raw.dump()
    with pytest.raises(charter.SchemaError):
        make_engine()
    assert raw.dump() == before
    assert raw.tables() == ["schema_migrations"]


# -- SQLite settings --------------------------------------------------------------------------


def test_sqlite_runs_in_wal_with_full_sync(
    make_engine: Callable[..., charter.Engine], store_url: str
) -> None:
    engine = make_engine(busy_timeout_seconds=0.2)
    assert pragma(engine, "journal_mode") == "wal"
    assert pragma(engine, "synchronous") == 2  # FULL
    assert pragma(engine, "foreign_keys") == 1
    assert pragma(engine, "busy_timeout") == 200
    assert pragma(engine, "wal_autocheckpoint") == SQLiteDriver.checkpoint_pages == 2_000
    with closing(sqlite3.connect(store_url)) as con:  # WAL is a property of the file
        assert con.execute("PRAGMA journal_mode").fetchone()[0] == "wal"


_LONG_LOG = """
import os, signal, sys
import charter
from charter.testing import RecordingAdapter
store, digest, cred, mission, n = sys.argv[1:]
engine = charter.Engine.open(store, config=charter.EngineConfig(credentials={"agent": digest}))
ex = engine.start_run(mission, by=engine.authenticate(cred), segment_id="long-log")
adapter = RecordingAdapter()
for k in range(int(n)):
    ex.perform(adapter, "write", {"k": k}, effect_key=f"e{k}")
print(ex.run_id, flush=True)
os.kill(os.getpid(), signal.SIGKILL)
"""


def _logged_pages(wal: Path) -> int:
    """Pages in the write-ahead log since its last checkpoint: the frames that
    carry the log header's current salt (older frames are leftovers)."""
    data = wal.read_bytes()
    page_size = int.from_bytes(data[8:12], "big")
    salt = data[16:24]
    frames = range(32, len(data) - 24 - page_size + 1, 24 + page_size)
    return sum(1 for at in frames if data[at + 8 : at + 16] == salt)


def test_sqlite_a_process_killed_with_a_long_log_loses_no_commit(
    who: Principals, store_url: str
) -> None:
    """Commits left in the write-ahead log (checkpoints are 2,000 pages apart)
    are durable: a process killed with over a thousand pages not yet folded into
    the database file loses none of them, and the ledger and chain still hold."""
    engine = who.engine
    mission = engine.create_mission(
        default_contract(allowance={"usd": 1_000, "calls": 1_000}), by=who.alice
    )
    child = subprocess.run(
        [
            sys.executable,
            "-c",
            _LONG_LOG,
            store_url,
            who.digests["agent"],
            who.credentials["agent"],
            mission,
            "70",
        ],
        capture_output=True,
        text=True,
        timeout=120,
    )
    assert child.returncode == -9, child.stderr
    run_id = child.stdout.strip()
    assert _logged_pages(Path(store_url + "-wal")) > 1_000  # past SQLite's default interval
    reopened = charter.Engine.open(store_url, config=charter.EngineConfig(credentials=who.digests))
    try:
        attempts = reopened.attempts(run_id=run_id)
        assert [a.status for a in attempts] == [charter.AttemptStatus.SUCCEEDED] * 70
        assert reopened.check_ledger(mission) == []
        assert [v.ok for v in reopened.verify_audit(mission)] == [True]
        assert (reopened.balances(mission)["calls"].spent, len(attempts)) == (70, 70)
    finally:
        reopened.close()


# -- a busy store ---------------------------------------------------------------------------------


@contextmanager
def write_lock_held(store: str) -> Iterator[subprocess.Popen[str]]:
    """Another process holding the store's write lock for the duration of the block."""
    child = subprocess.Popen(
        [sys.executable, str(HOLDER), store, "30"],
        stdin=subprocess.PIPE,
        stdout=subprocess.PIPE,
        text=True,
    )
    assert child.stdin is not None and child.stdout is not None
    try:
        assert child.stdout.readline().strip() == "locked"
        yield child
    finally:
        child.stdin.close()
        assert child.stdout.readline().strip() == "released"
        child.stdout.close()
        assert child.wait(timeout=10) == 0


def _timed_busy(action: Callable[[], object]) -> tuple[charter.StoreBusy, float]:
    started = time.monotonic()
    with pytest.raises(charter.StoreBusy) as info:
        action()
    return info.value, time.monotonic() - started


def test_a_held_write_lock_gives_store_busy_after_a_bounded_wait(
    make_engine: Callable[..., charter.Engine],
    store_url: str,
    raw: RawStore,
    creds: tuple[dict[str, str], dict[str, str]],
    adapter: RecordingAdapter,
) -> None:
    engine = make_engine(busy_timeout_seconds=0.2)
    alice = engine.authenticate(creds[0]["alice"])
    agent = engine.authenticate(creds[0]["agent"])
    mission = engine.create_mission(default_contract(), by=alice)
    ex = engine.start_run(mission, by=agent, segment_id="seg-1")
    before = raw.dump()
    writes: list[Callable[[], object]] = [
        lambda: engine.create_mission(default_contract(), by=alice),
        lambda: ex.perform(adapter, "write", {"n": 1}, effect_key="w1"),
        lambda: engine.raise_limit(mission, "usd", 5_000_000, by=alice),
        lambda: engine.stop_run(ex.run_id, by=alice),
    ]
    with write_lock_held(store_url):
        for write in writes:
            error, waited = _timed_busy(write)
            assert error.code == "store_busy"
            assert error.details.get("retryable") is True
            assert 0.15 <= waited < 3.0
        # WAL: readers are not blocked by a writer.
        assert [m.id for m in engine.missions()] == [mission]
        assert engine.run(ex.run_id).status is charter.RunStatus.ACTIVE
    assert adapter.sent == []  # nothing was sent that is not written down
    assert raw.dump() == before
    assert engine.check_ledger(mission) == []
    assert all(v.ok for v in engine.verify_audit())
    # The store serves again once the lock is gone.
    attempt = ex.perform(adapter, "write", {"n": 1}, effect_key="w1")
    assert attempt.status is charter.AttemptStatus.SUCCEEDED


def test_opening_a_locked_store_is_bounded_too(
    make_engine: Callable[..., charter.Engine], store_url: str
) -> None:
    make_engine().close()
    with write_lock_held(store_url):
        error, waited = _timed_busy(lambda: make_engine(busy_timeout_seconds=0.2))
        assert error.code == "store_busy"
        assert waited < 3.0


# -- unknown IDs -------------------------------------------------------------------------

Lookup = Callable[[charter.Engine, Principals, str, charter.Executor, RecordingAdapter], object]

UNKNOWN: dict[str, tuple[str, Lookup]] = {
    "mission": ("mission_id", lambda e, w, m, x, a: e.mission("msn_nope")),
    "contract": ("mission_id", lambda e, w, m, x, a: e.contract("msn_nope")),
    "contract version": ("version", lambda e, w, m, x, a: e.contract(m, 99)),
    "incidents": ("mission_id", lambda e, w, m, x, a: e.incidents("msn_nope")),
    "balances": ("mission_id", lambda e, w, m, x, a: e.balances("msn_nope")),
    "ledger entries": ("mission_id", lambda e, w, m, x, a: e.ledger_entries("msn_nope")),
    "check ledger": ("mission_id", lambda e, w, m, x, a: e.check_ledger("msn_nope")),
    "verify audit": ("mission_id", lambda e, w, m, x, a: e.verify_audit("msn_nope")),
    "run": ("run_id", lambda e, w, m, x, a: e.run("run_nope")),
    "attempt": ("attempt_id", lambda e, w, m, x, a: e.get_attempt("att_nope")),
    "evidence": ("attempt_id", lambda e, w, m, x, a: e.evidence("att_nope")),
    "approve": ("approval_id", lambda e, w, m, x, a: e.approve("apr_nope", by=w.bob)),
    "close incident": (
        "incident_id",
        lambda e, w, m, x, a: e.close_incident("inc_nope", by=w.alice, note="fine"),
    ),
    "stop run": ("run_id", lambda e, w, m, x, a: e.stop_run("run_nope", by=w.alice)),
    "raise limit": (
        "mission_id",
        lambda e, w, m, x, a: e.raise_limit("msn_nope", "usd", 10**9, by=w.alice),
    ),
    "amend contract": (
        "mission_id",
        lambda e, w, m, x, a: e.amend_contract(
            "msn_nope", default_contract(), by=w.alice, reason="x"
        ),
    ),
    "start run": (
        "mission_id",
        lambda e, w, m, x, a: e.start_run("msn_nope", by=w.agent, segment_id="seg-9"),
    ),
    "dispatch": ("attempt_id", lambda e, w, m, x, a: x.dispatch("att_nope", a)),
}


@pytest.mark.parametrize("case", list(UNKNOWN))
def test_an_unknown_id_is_not_found_and_changes_nothing(
    case: str,
    engine: charter.Engine,
    who: Principals,
    mission: str,
    raw: RawStore,
) -> None:
    adapter = RecordingAdapter()
    ex = engine.start_run(mission, by=who.agent, segment_id="seg-1")
    key, lookup = UNKNOWN[case]
    before = raw.dump()
    with pytest.raises(charter.NotFound) as info:
        lookup(engine, who, mission, ex, adapter)
    assert info.value.code == "not_found"
    assert key in info.value.details
    assert info.value.to_dict()["code"] == "not_found"
    assert raw.dump() == before
    assert adapter.sent == []


# -- store URLs --------------------------------------------------------------------------


@pytest.mark.parametrize(
    "url",
    [
        "mysql://charter@localhost/charter",
        "sqlite://relative.db",
        "file:///tmp/charter.db",
        "https://example.com/charter.db",
    ],
)
def test_an_unsupported_store_url_is_a_config_error(
    url: str, tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    monkeypatch.chdir(tmp_path)
    with pytest.raises(charter.ConfigError) as info:
        charter.Engine.open(url)
    assert info.value.code == "config_error"
    assert list(tmp_path.iterdir()) == []


@pytest.mark.parametrize(
    "url", ["postgresql://charter@127.0.0.1:1/charter", "postgres://charter@127.0.0.1:1/x"]
)
def test_an_unreachable_postgresql_store_is_a_store_error_and_writes_nothing(
    url: str, tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    monkeypatch.chdir(tmp_path)
    with pytest.raises(charter.StoreError) as info:
        charter.Engine.open(url)
    assert info.value.code == "store_error"
    assert list(tmp_path.iterdir()) == []


def test_a_libpq_without_pipelines_is_a_config_error_before_connecting(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    """The PostgreSQL store sends its statements in pipelines (libpq 14+); an older
    libpq is named in a ConfigError before anything is opened."""
    import psycopg

    monkeypatch.chdir(tmp_path)
    monkeypatch.setattr(psycopg.Pipeline, "is_supported", classmethod(lambda cls: False))
    with pytest.raises(charter.ConfigError) as info:
        charter.Engine.open("postgresql://charter@127.0.0.1:1/charter")
    assert info.value.code == "config_error"
    assert list(tmp_path.iterdir()) == []


def test_a_sqlite_url_and_a_bare_path_open_the_same_kind_of_store(tmp_path: Path) -> None:
    by_url = tmp_path / "a" / "via-url.db"
    with charter.Engine.open(f"sqlite:///{by_url}") as engine:
        assert engine.missions() == []
    by_path = tmp_path / "b" / "c" / "via-path.db"
    with charter.Engine.open(str(by_path)) as engine:
        assert engine.missions() == []
    for path in (by_url, by_path):
        with closing(RawStore(str(path), "sqlite")) as raw:
            assert migrations(raw)[-1][0] == LATEST


@pytest.mark.parametrize("kind", ["directory", "not a database"])
def test_a_store_that_cannot_be_opened_is_a_store_error(kind: str, tmp_path: Path) -> None:
    target = tmp_path / "store"
    if kind == "directory":
        target.mkdir()
    else:
        target.write_bytes(b"this is not a SQLite file at all, just some bytes" * 100)
    before = target.read_bytes() if target.is_file() else None
    with pytest.raises(charter.StoreError):
        charter.Engine.open(str(target))
    if before is not None:
        assert target.read_bytes() == before


# -- engine configuration ----------------------------------------------------------------

BAD_VALUES: dict[str, dict[str, Any]] = {
    "evidence_settles unknown": {"evidence_settles": "sometimes"},
    "resume unknown": {"resume": "eventually"},
    "zero lease": {"lease_seconds": 0},
    "negative lease": {"lease_seconds": -1},
    "nan lease": {"lease_seconds": math.nan},
    "infinite lease": {"lease_seconds": math.inf},
    "bool lease": {"lease_seconds": True, "send_deadline_seconds": True},
    "zero send deadline": {"send_deadline_seconds": 0},
    "send deadline after the lease": {"lease_seconds": 10, "send_deadline_seconds": 11},
    "zero busy timeout": {"busy_timeout_seconds": 0},
    "negative busy timeout": {"busy_timeout_seconds": -0.5},
    "nan busy timeout": {"busy_timeout_seconds": math.nan},
    "infinite busy timeout": {"busy_timeout_seconds": math.inf},
}


@pytest.mark.parametrize("case", list(BAD_VALUES))
def test_engine_config_refuses_bad_values(case: str) -> None:
    with pytest.raises(charter.ConfigError) as info:
        charter.EngineConfig(**BAD_VALUES[case])
    assert info.value.code == "config_error"


FROM_MAPPING: dict[str, dict[str, Any]] = {
    "unknown key": {"workers": 4},
    "credentials as a list": {"credentials": ["alice"]},
    "credentials as text": {"credentials": "alice"},
    "lease as text": {"lease_seconds": "30"},
    "lease as a list": {"lease_seconds": [30]},
    "store not text": {"store": 5},
    "resume as a list": {"resume": ["human"]},
}


@pytest.mark.parametrize("case", list(FROM_MAPPING))
def test_engine_config_from_mapping_refuses_bad_data(case: str) -> None:
    with pytest.raises(charter.ConfigError) as info:
        charter.EngineConfig.from_mapping(FROM_MAPPING[case])
    assert info.value.code == "config_error"


@pytest.mark.parametrize("digest", ["hunter2", "sha256:abc", "sha1:" + "0" * 64, 5, None])
def test_a_bad_credential_digest_is_a_config_error_when_the_engine_opens(
    digest: Any, tmp_path: Path
) -> None:
    config = charter.EngineConfig.from_mapping({"credentials": {"alice": digest}})
    with pytest.raises(charter.ConfigError) as info:
        charter.Engine.open(str(tmp_path / "charter.db"), config=config)
    assert info.value.code == "config_error"


def test_opening_an_engine_with_a_bad_credential_digest_leaves_no_store_open(
    tmp_path: Path,
) -> None:
    store = tmp_path / "charter.db"
    config = charter.EngineConfig.from_mapping({"credentials": {"alice": "not-a-digest"}})
    with pytest.raises(charter.ConfigError):
        charter.Engine.open(str(store), config=config)
    # While the error is still referenced the store must already be closed: an open
    # SQLite connection keeps its WAL file, the last close removes it.
    assert not store.with_name("charter.db-wal").exists()


def test_engine_config_from_a_toml_file(tmp_path: Path) -> None:
    alice_credential, alice_digest = charter.new_credential("alice")
    (tmp_path / "conf").mkdir()
    path = tmp_path / "conf" / "charter.toml"
    path.write_text(
        'store = "data/charter.db"\n'
        'evidence_settles = "auto"\n'
        'resume = "automatic"\n'
        "lease_seconds = 60\n"
        "send_deadline_seconds = 10.5\n"
        "busy_timeout_seconds = 1.5\n"
        "\n"
        "[credentials]\n"
        f'alice = "{alice_digest}"\n'
    )
    config = charter.EngineConfig.from_file(path)
    assert config.store == str(tmp_path / "conf" / "data" / "charter.db")
    assert config.evidence_settles == "auto"
    assert config.resume == "automatic"
    assert (config.lease_seconds, config.send_deadline_seconds) == (60, 10.5)
    assert config.busy_timeout_seconds == 1.5
    assert dict(config.credentials) == {"alice": alice_digest}
    with charter.Engine.open(config=config) as engine:
        assert engine.authenticate(alice_credential).name == "alice"
        assert pragma(engine, "busy_timeout") == 1500
    assert (tmp_path / "conf" / "data" / "charter.db").exists()


def test_engine_config_defaults_and_absolute_store_paths(tmp_path: Path) -> None:
    path = tmp_path / "charter.toml"
    path.write_text(f'store = "{tmp_path / "elsewhere.db"}"\n')
    config = charter.EngineConfig.from_file(path)
    assert config.store == str(tmp_path / "elsewhere.db")
    assert config == charter.EngineConfig(store=str(tmp_path / "elsewhere.db"))
    url = tmp_path / "url.toml"
    url.write_text('store = "postgresql://charter@localhost/charter"\n')
    assert charter.EngineConfig.from_file(url).store == "postgresql://charter@localhost/charter"


@pytest.mark.parametrize(
    ("name", "text"),
    [
        ("missing.toml", None),
        ("syntax.toml", "store = \n"),
        ("unknown.toml", "stores = 'x.db'\n"),
        ("bad.toml", "lease_seconds = -5\n"),
        ("nan.toml", "lease_seconds = nan\n"),
        ("type.toml", "lease_seconds = '30'\n"),
    ],
)
def test_a_bad_config_file_is_a_config_error(name: str, text: str | None, tmp_path: Path) -> None:
    path = tmp_path / name
    if text is not None:
        path.write_text(text)
    with pytest.raises(charter.ConfigError):
        charter.EngineConfig.from_file(path)


def test_engine_config_is_discovered_from_the_environment_then_the_directory(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    monkeypatch.chdir(tmp_path)
    monkeypatch.delenv("CHARTER_CONFIG", raising=False)
    assert charter.EngineConfig.discover() == charter.EngineConfig()
    (tmp_path / "charter.toml").write_text("lease_seconds = 45\n")
    assert charter.EngineConfig.discover().lease_seconds == 45
    other = tmp_path / "other.toml"
    other.write_text("lease_seconds = 90\n")
    monkeypatch.setenv("CHARTER_CONFIG", str(other))
    assert charter.EngineConfig.discover().lease_seconds == 90
    monkeypatch.setenv("CHARTER_CONFIG", str(tmp_path / "absent.toml"))
    with pytest.raises(charter.ConfigError):
        charter.EngineConfig.discover()


def test_a_write_blocked_by_another_worker_is_store_busy_after_a_bounded_wait(
    backend: str,
    store_address: str,
    make_engine: Callable[..., charter.Engine],
    creds: tuple[dict[str, str], dict[str, str]],
) -> None:
    """Both stores: a writer held up by another worker gets a retryable StoreBusy
    after ``busy_timeout_seconds``, never an unbounded wait, and changes nothing."""
    import time
    from contextlib import closing

    engine = make_engine(busy_timeout_seconds=0.3)
    alice = engine.authenticate(creds[0]["alice"])
    agent = engine.authenticate(creds[0]["agent"])
    mission = engine.create_mission(default_contract(), by=alice)
    ex = engine.start_run(mission, by=agent, segment_id="seg-1")
    adapter = RecordingAdapter()
    before = engine.attempts(mission_id=mission), engine.balances(mission)
    if backend == "sqlite":
        holder: Any = closing(sqlite3.connect(store_address, isolation_level=None))
        take = "BEGIN IMMEDIATE"
    else:
        import psycopg

        holder = psycopg.connect(store_address, autocommit=True)
        # The mission's gate, which every transaction changing the mission takes first.
        take = f"BEGIN; SELECT pg_advisory_xact_lock(hashtextextended('{mission}', 0))"
    with holder as con:
        con.execute(take)
        started = time.monotonic()
        with pytest.raises(charter.StoreBusy) as info:
            ex.perform(adapter, "write", {"to": "x"}, effect_key="blocked")
        waited = time.monotonic() - started
        con.execute("ROLLBACK")
    assert info.value.details["retryable"] is True
    assert 0.2 <= waited < 5
    assert adapter.sent == []
    assert (engine.attempts(mission_id=mission), engine.balances(mission)) == before


def test_a_failing_deferred_write_aborts_its_whole_transaction(
    engine: charter.Engine, mission: str
) -> None:
    """A write whose result nobody reads may travel with COMMIT; when it fails,
    nothing of its transaction is stored: not the statements before it, not
    its audit event."""
    from charter.errors import StoreConflict

    before = stored(engine, mission), engine.verify_audit(mission)[0].events
    with pytest.raises(StoreConflict), engine._db.transaction(gate=mission) as tx:
        tx.run("UPDATE missions SET name = ? WHERE id = ?", "renamed", mission)
        tx.audit(mission, "mission.renamed", mission, actor="alice")
        tx.write(  # the mission's own id again: refused by the primary key
            "INSERT INTO missions (id, name, created_by, created_at_us, contract_version) "
            "VALUES (?, 'twin', 'alice', 0, 0)",
            mission,
        )
    assert (stored(engine, mission), engine.verify_audit(mission)[0].events) == before
    assert engine.mission(mission).name != "renamed"


def test_a_counter_moves_with_its_transaction_and_only_then(
    engine: charter.Engine, mission: str
) -> None:
    """A counter on the mission's row (A1's admitted and failed counts) is added
    as its transaction ends, in the chain head's statement when the chain moves
    and on its own when it does not; a refusal or a failure takes it back."""
    from charter.contracts import store as contracts_store
    from charter.errors import StoreConflict

    def counts() -> tuple[int, int]:
        with engine._db.read() as tx:
            found = contracts_store.counts(tx, mission)
        assert found is not None
        return found

    events = engine.verify_audit(mission)[0].events
    with engine._db.transaction(gate=mission) as tx:  # with an event: in the head's update
        tx.count(mission, "attempts_admitted")
        tx.count(mission, "attempts_admitted")
        tx.count(mission, "attempts_failed")
        tx.audit(mission, "test.counted", mission, actor="alice")
    assert counts() == (2, 1)
    with engine._db.transaction(gate=mission) as tx:  # no event: a statement of its own
        tx.count(mission, "attempts_failed")
    assert counts() == (2, 2)
    assert engine.verify_audit(mission)[0].events == events + 1

    with pytest.raises(charter.NotAuthorized), engine._db.transaction(gate=mission) as tx:
        tx.count(mission, "attempts_admitted")
        raise tx.refused(
            charter.NotAuthorized("no"),
            mission_id=mission,
            kind="test.refused",
            entity=mission,
            actor="mallory",
        )
    with pytest.raises(StoreConflict), engine._db.transaction(gate=mission) as tx:
        tx.count(mission, "attempts_admitted")
        tx.audit(mission, "test.counted", mission, actor="alice")
        tx.write(
            "INSERT INTO missions (id, name, created_by, created_at_us, contract_version) "
            "VALUES (?, 'twin', 'alice', 0, 0)",
            mission,
        )
    assert counts() == (2, 2)
    assert engine.verify_audit(mission)[0].events == events + 2  # the refusal's only
    assert all(v.ok for v in engine.verify_audit(mission))


def test_a_statement_the_store_refuses_leaves_the_connection_usable(
    engine: charter.Engine, who: Principals, mission: str
) -> None:
    """A statement the server cannot even prepare is a StoreError, its
    transaction changes nothing, and the next transaction on the same
    connection works (nothing half-prepared or half-sent is left behind)."""
    before = stored(engine, mission)
    for _ in range(2):  # the second time, it is not mistaken for a prepared statement
        with pytest.raises(charter.StoreError), engine._db.transaction(gate=mission) as tx:
            tx.write("UPDATE missions SET name = 'x' WHERE id = ?", mission)
            tx.one("SELECT no_such_column FROM missions WHERE id = ?", mission)
    assert stored(engine, mission) == before
    ex = engine.start_run(mission, by=who.agent, segment_id="seg-after")
    adapter = RecordingAdapter()
    assert ex.perform(adapter, "write", {}, effect_key="after").status.value == "succeeded"
    assert len(adapter.sent) == 1


def test_a_prefetched_read_is_answered_with_the_next_statement_or_on_demand(
    engine: charter.Engine, who: Principals, mission: str
) -> None:
    """A read sent ahead arrives with the statement after it (on PostgreSQL in
    the same round trip), and asking for it first sends it on its own."""
    with engine._db.transaction(gate=mission) as tx:
        early = tx.prefetch("SELECT name FROM missions WHERE id = ?", mission)
        assert tx.run("UPDATE missions SET name = 'renamed' WHERE id = ?", mission) == 1
        ahead = early.row
        alone = tx.prefetch("SELECT name FROM missions WHERE id = ?", mission).row
    assert ahead is not None and alone is not None
    assert (ahead["name"] != "renamed", alone["name"]) == (True, "renamed")  # read in order
    assert engine.mission(mission).name == "renamed"


def test_an_attempt_is_two_durable_commits_and_two_round_trips(
    backend: str, store_address: str, creds: tuple[dict[str, str], dict[str, str]]
) -> None:
    """The write-ahead dispatch and the settlement each commit once; on
    PostgreSQL everything else travels with them: once the engine has
    committed on the mission, each transaction decides on what that commit
    read again and sends its guards with its writes, so the whole attempt
    makes two round trips, one per commit, with the server's clock checked
    in them. On SQLite the attempt is 12 statements (docs/record.md)."""
    config = charter.EngineConfig(credentials=creds[1])
    engine = charter.Engine.open(store_address, config=config)
    alice = engine.authenticate(creds[0]["alice"])
    mission = engine.create_mission(default_contract(), by=alice)
    ex = engine.start_run(mission, by=engine.authenticate(creds[0]["agent"]), segment_id="s")
    adapter = RecordingAdapter()
    ex.perform(adapter, "write", {"n": 0}, effect_key="warm")  # statements get prepared
    driver: Any = engine._db.driver
    sent: list[list[str]] = []
    if backend == "postgresql":
        send = driver._send

        def counting(last: Any = None) -> Any:
            sent.append([q for q, _, _ in driver._pending] + ([last[0]] if last else []))
            return send(last)

        driver._send = counting
    else:
        execute = driver.execute

        def counting(sql: str, params: Any) -> Any:
            sent.append([sql])
            return execute(sql, params)

        driver.execute = counting
    ex.perform(adapter, "write", {"n": 1}, effect_key="counted")
    engine.close()
    statements = [q for batch in sent for q in batch]
    assert statements.count("COMMIT") == 2
    assert len(adapter.sent) == 2
    if backend == "postgresql":
        assert [batch[-1] for batch in sent] == ["COMMIT", "COMMIT"]
        assert all(batch[0] == "BEGIN" for batch in sent)
    else:
        # The chain's head comes with each transaction's first read of the run
        # (under the write lock), not in a statement of its own.
        assert not [q for q in statements if q.startswith("SELECT audit_seq")]
        assert len(statements) == 12, statements


def test_a_runs_first_attempt_decides_on_copies_as_every_later_one(
    backend: str, store_address: str, creds: tuple[dict[str, str], dict[str, str]]
) -> None:
    """Starting a run (or beginning a submitted one) expects the reads its first
    admission and settlement make: a store that remembers takes them inside that
    commit, so a new run's first attempt is two round trips on PostgreSQL, as
    every later one, and not four (a read before each commit)."""
    config = charter.EngineConfig(credentials=creds[1])
    engine = charter.Engine.open(store_address, config=config)
    agent = engine.authenticate(creds[0]["agent"])
    mission = engine.create_mission(default_contract(), by=engine.authenticate(creds[0]["alice"]))
    adapter = RecordingAdapter()
    warm = engine.start_run(mission, by=agent, segment_id="warm")
    warm.perform(adapter, "write", {"n": 0}, effect_key="warm")  # statements get prepared
    warm.finish()
    driver: Any = engine._db.driver
    trips: list[int] = []
    name = "_send" if backend == "postgresql" else "execute"
    send = getattr(driver, name)

    def counting(*args: Any) -> Any:
        trips.append(1)
        return send(*args)

    def started() -> charter.Executor:
        return engine.start_run(mission, by=agent, segment_id="started")

    def begun() -> charter.Executor:
        queued = engine.submit(mission, plan="plans:first_attempt", by=agent)
        ex = engine.begin(queued.id, "begun")
        assert ex is not None
        return ex

    for start in (started, begun):
        ex = start()
        sent = []
        for key in ("first", "second"):
            setattr(driver, name, counting)
            trips.clear()
            attempt = ex.perform(adapter, "write", {"n": 1}, effect_key=key)
            delattr(driver, name)
            assert attempt.status is charter.AttemptStatus.SUCCEEDED
            sent.append(len(trips))
        # On SQLite every statement is a call: the first attempt sends what the second does.
        assert sent == [2, 2] if backend == "postgresql" else sent[0] == sent[1] == 12, sent
    engine.close()


def test_a_transaction_reads_the_stores_clock_after_waiting_for_the_gate(
    backend: str, store_address: str, creds: tuple[dict[str, str], dict[str, str]]
) -> None:
    """F1 by the store's clock: time spent queueing for the mission's gate must
    not make a lease look younger than it is, so the clock of a transaction is
    read once the gate is held (here: the real clock, not an injected one)."""
    import threading
    from contextlib import closing

    config = charter.EngineConfig(credentials=creds[1], busy_timeout_seconds=5)
    with charter.Engine.open(store_address, config=config) as engine:
        alice = engine.authenticate(creds[0]["alice"])
        agent = engine.authenticate(creds[0]["agent"])
        mission = engine.create_mission(default_contract(), by=alice)
        ex = engine.start_run(mission, by=agent, segment_id="seg-1")
        if backend == "sqlite":
            holder: Any = closing(
                sqlite3.connect(store_address, isolation_level=None, check_same_thread=False)
            )
            take = "BEGIN IMMEDIATE"
        else:
            import psycopg

            holder = psycopg.connect(store_address, autocommit=True)
            take = f"BEGIN; SELECT pg_advisory_xact_lock(hashtextextended('{mission}', 0))"
        released: list[int] = []
        with holder as con:
            con.execute(take)

            def release() -> None:
                time.sleep(0.5)
                released.append(time.time_ns() // 1000)
                con.execute("ROLLBACK")

            waiter = threading.Thread(target=release)
            waiter.start()
            attempt = ex.perform(RecordingAdapter(), "write", {}, effect_key="queued")
            waiter.join()
    # Read before the wait, the clock would be about 0.5 s earlier than this.
    assert attempt.prepared_at_us >= released[0] - 50_000


class Interrupted(Exception):
    """Raised from a signal handler, as a KeyboardInterrupt would be."""


def test_an_interrupted_transaction_changes_nothing_and_never_hangs(
    backend: str, store_address: str, creds: tuple[dict[str, str], dict[str, str]]
) -> None:
    """A transaction interrupted while it waits for the store changes nothing.
    On PostgreSQL the interrupted connection (results still in flight) is
    closed, so the server rolls back, and the engine's next transaction opens
    a new one; the SQLite connection stays usable. Another engine works too."""
    import signal

    config = charter.EngineConfig(credentials=creds[1])
    slow = (
        "SELECT pg_sleep(2) AS x"
        if backend == "postgresql"
        else "WITH RECURSIVE c(x) AS (SELECT 1 UNION ALL SELECT x + 1 FROM c WHERE x < 3000000) "
        "SELECT COUNT(*) AS x FROM c"
    )
    engine = charter.Engine.open(store_address, config=config)
    mission = engine.create_mission(default_contract(), by=engine.authenticate(creds[0]["alice"]))
    before = stored(engine, mission)

    def interrupt(signum: int, frame: Any) -> None:
        raise Interrupted

    previous = signal.signal(signal.SIGALRM, interrupt)
    try:
        signal.setitimer(signal.ITIMER_REAL, 0.2)
        with pytest.raises(Interrupted), engine._db.transaction(gate=mission) as tx:
            tx.write("UPDATE missions SET name = 'interrupted' WHERE id = ?", mission)
            tx.one(slow)
    finally:
        signal.setitimer(signal.ITIMER_REAL, 0)
        signal.signal(signal.SIGALRM, previous)
    assert engine.mission(mission).name != "interrupted"
    engine.close()
    with charter.Engine.open(store_address, config=config) as other:
        assert stored(other, mission) == before


# -- big transactions, and failures that must not break the engine -------------------------


def test_S1_a_transaction_with_more_events_than_one_statement_carries_commits_them_all(
    engine: charter.Engine, mission: str
) -> None:
    """20,000 events are 280,000 parameters: over what one statement may carry
    on either store (SQLite: 32,766 by default, some builds 250,000; PostgreSQL's
    protocol: 65,535)."""
    n = 20_000
    (before,) = engine.verify_audit(mission)
    with engine._db.transaction(gate=mission) as tx:
        for i in range(n):
            tx.audit(mission, "test.bulk", f"e{i}", actor="alice", payload={"i": i})
    (after,) = engine.verify_audit(mission)
    assert (after.ok, after.events) == (True, before.events + n)
    trail = engine.audit_events(mission)[before.events :]
    assert [json.loads(e["payload"])["i"] for e in trail] == list(range(n))


def test_a_multi_row_insert_over_the_parameter_limit_is_written_whole(
    engine: charter.Engine, mission: str
) -> None:
    n = 45_000  # 270,000 parameters
    rows = [("run_x", "node", 1, i, "value", str(i)) for i in range(n)]
    with engine._db.transaction(gate=mission) as tx:
        tx.many(
            "INSERT INTO journal (run_id, node_id, execution, seq, kind, value) "
            "VALUES (?, ?, ?, ?, ?, ?)",
            rows,
        )
    with engine._db.read() as tx:
        stored_rows = tx.all("SELECT seq, value FROM journal WHERE run_id = 'run_x' ORDER BY seq")
    assert [(r["seq"], r["value"]) for r in stored_rows] == [(i, str(i)) for i in range(n)]


FAILURES = {
    # The server refuses a statement in the middle of a pipeline.
    "refused": lambda tx, mission: tx.one("SELECT no_such_column FROM missions"),
    # More parameters than one statement can carry: refused before it is sent.
    "too many parameters": lambda tx, mission: tx.one(
        f"SELECT 1 AS x WHERE 0 IN ({', '.join(['?'] * 300_000)})", *range(1, 300_001)
    ),
    # The server ends the connection mid-transaction.
    "connection lost": lambda tx, mission: tx.one(
        "SELECT pg_terminate_backend(pg_backend_pid()) AS x"
    ),
}


@pytest.mark.parametrize("failure", list(FAILURES))
def test_an_engine_stays_usable_after_any_failed_transaction(
    failure: str, backend: str, engine: charter.Engine, who: Principals, mission: str
) -> None:
    if failure == "connection lost" and backend == "sqlite":
        pytest.skip("an embedded store has no connection to lose")
    before = stored(engine, mission)
    with pytest.raises(charter.StoreError), engine._db.transaction(gate=mission) as tx:
        tx.write("UPDATE missions SET name = 'failed' WHERE id = ?", mission)
        tx.audit(mission, "mission.renamed", mission, actor="alice")
        FAILURES[failure](tx, mission)
    assert stored(engine, mission) == before
    ex = engine.start_run(mission, by=who.agent, segment_id="seg-after")
    adapter = RecordingAdapter()
    assert ex.perform(adapter, "write", {}, effect_key="after").status.value == "succeeded"
    assert len(adapter.sent) == 1
    assert all(v.ok for v in engine.verify_audit())


class Crash(BaseException):
    """The executor's process dies at a durable boundary."""


def _crash_after_dispatch(point: str) -> None:
    if point == "dispatch.after":
        raise Crash(point)


@pytest.mark.timeout(600)  # 10,000 attempts: minutes when it shares the cores with other tests
def test_R3_R4_N5_a_run_with_10_000_attempts_in_flight_is_stopped_and_recovered(
    engine: charter.Engine, who: Principals, store_address: str, clock: ManualClock
) -> None:
    """Stopping voids 5,000 PREPARED attempts in one transaction, recovering
    marks 5,000 DISPATCHED ones UNKNOWN in one transaction: 5,000 audit events
    each, more than one statement can carry on PostgreSQL (and on SQLite
    builds with the default limit)."""
    n = 5_000
    mission = engine.create_mission(default_contract(allowance={"calls": 4 * n}), by=who.alice)
    doomed = charter.Engine.open(
        store_address,
        config=charter.EngineConfig(credentials=who.digests),
        clock=clock,
        crash_hook=_crash_after_dispatch,
    )
    adapter = RecordingAdapter()
    try:
        ex = doomed.start_run(
            mission, by=doomed.authenticate(who.credentials["agent"]), segment_id="seg-1"
        )
        prepared = {ex.admit(adapter, "write", {"i": i}, effect_key=f"p{i}").id for i in range(n)}
        for i in range(n):
            with contextlib.suppress(Crash):
                ex.perform(adapter, "write", {"i": i}, effect_key=f"d{i}")
    finally:
        doomed.close()
    in_flight = engine.attempts(run_id=ex.run_id)
    assert len(in_flight) == 2 * n and adapter.sent == []

    assert engine.stop_run(ex.run_id, by=who.alice).status is charter.RunStatus.STOPPING
    clock.advance(60)  # the dead owner's lease expires
    state = engine.coordinator.recover(ex.run_id, "seg-2")

    statuses = {a.id: a.status for a in engine.attempts(run_id=ex.run_id)}
    assert {i for i, s in statuses.items() if s is charter.AttemptStatus.VOIDED} == prepared
    unknown = {i for i, s in statuses.items() if s is charter.AttemptStatus.UNKNOWN}
    assert unknown == {a.id for a in in_flight} - prepared
    assert engine.run(ex.run_id).status is charter.RunStatus.STOPPING
    assert {a.id for a in state.attempts} == unknown
    kinds = Counter(e["kind"] for e in engine.audit_events(mission))
    assert (kinds["attempt.voided"], kinds["attempt.unknown"]) == (n, n)
    assert engine.check_ledger(mission) == []
    assert all(v.ok for v in engine.verify_audit())
    assert adapter.sent == []


# -- identifiers ---------------------------------------------------------------------------


def test_ids_spell_their_time_and_randomness_in_base32_and_sort_by_time() -> None:
    """An ID is its prefix and 26 base32 characters, most significant first: 48
    bits of milliseconds, then 80 random bits. Read back, they give both; IDs
    made later sort later."""
    import random

    from charter.ids import IdFactory

    alphabet = "0123456789abcdefghjkmnpqrstvwxyz"
    clock = ManualClock(start_us=1_796_180_974_320_920)
    rng = random.Random(7)
    expected_bits = random.Random(7)
    made = []
    for _ in range(300):
        made.append(IdFactory(clock, rng).new("att"))
        prefix, _, body = made[-1].partition("_")
        assert (prefix, len(body), set(body) <= set(alphabet)) == ("att", 26, True)
        value = 0
        for ch in body:
            value = value * 32 + alphabet.index(ch)
        assert value >> 80 == clock.now_us() // 1000
        assert value & ((1 << 80) - 1) == expected_bits.getrandbits(80)
        clock.advance(0.0015)
    assert made == sorted(made)


def test_S1_two_engines_taking_turns_on_one_mission_keep_one_chain(
    backend: str, store_address: str, creds: tuple[dict[str, str], dict[str, str]]
) -> None:
    """A transaction chains its events onto the head its own first read found
    under the mission's gate, never onto one an earlier transaction saw: two
    engines (two connections) taking turns on one mission's chain, one of them
    also deciding on the mission without reading a run, leave one unbroken
    chain with every event on it."""
    config = charter.EngineConfig(credentials=creds[1])
    first = charter.Engine.open(store_address, config=config)
    second = charter.Engine.open(store_address, config=config)
    try:
        mission = first.create_mission(default_contract(), by=first.authenticate(creds[0]["alice"]))
        runs = [
            engine.start_run(mission, by=engine.authenticate(creds[0]["agent"]), segment_id=seg)
            for engine, seg in ((first, "s1"), (second, "s2"))
        ]
        adapter = RecordingAdapter()
        alice = first.authenticate(creds[0]["alice"])
        for n in range(6):
            runs[n % 2].perform(adapter, "write", {"n": n}, effect_key=f"turn-{n}")
            # A decision that reads no run, by the engine whose last write is older.
            first.raise_limit(mission, "calls", 101 + n, by=alice)
        for ex in runs:
            ex.finish()
        [verdict] = first.verify_audit(mission)
        assert verdict.ok, verdict
        assert len(adapter.sent) == 6
        events = first.audit_events(mission)
        assert [e["seq"] for e in events] == list(range(1, len(events) + 1))
        settled = [e for e in events if e["kind"] == "attempt.settled"]
        assert len(settled) == 6
    finally:
        first.close()
        second.close()
