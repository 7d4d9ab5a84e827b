"""Storage: one protocol, shared SQL, a backend chosen by URL scheme.

``None`` or a bare path or ``sqlite:///path`` opens the embedded SQLite store;
``postgresql://`` URLs open the PostgreSQL store (the ``postgres`` extra). Drivers are
imported lazily so ``import charter`` stays cheap.
"""

from __future__ import annotations

from pathlib import Path

from charter.clock import Clock
from charter.errors import ConfigError, SchemaError, StoreNotFound
from charter.ids import IdFactory
from charter.storage.database import Database
from charter.storage.schema import LATEST, MIGRATIONS, Migration
from charter.storage.sqlite import SQLiteDriver
from charter.storage.transaction import Driver, Listening, Prefetched, Row, Tx

DEFAULT_PATH = Path(".charter") / "charter.db"

__all__ = ["DEFAULT_PATH", "Database", "Listening", "Prefetched", "Row", "Tx", "open_database"]


def _sqlite_path(url: str | None) -> Path | None:
    """The SQLite file a store address names; ``None`` for a PostgreSQL URL."""
    if url is None:
        return DEFAULT_PATH
    if url.startswith(("postgresql://", "postgres://")):
        return None
    if url.startswith("sqlite:///"):
        return Path(url.removeprefix("sqlite:///"))
    if "://" in url:
        raise ConfigError(
            f"unsupported store URL {url!r}; use a path, sqlite:///path or postgresql://..."
        )
    return Path(url)


def _driver(url: str | None, path: Path | None, busy_timeout: float) -> Driver:
    if path is None:
        # psycopg is an optional extra: only a PostgreSQL store imports it.
        from charter.storage.postgres import PostgresDriver  # noqa: PLC0415

        assert url is not None
        return PostgresDriver(url, busy_timeout=busy_timeout)
    return SQLiteDriver(path, busy_timeout=busy_timeout)


def open_database(
    url: str | None,
    *,
    clock: Clock,
    ids: IdFactory,
    busy_timeout: float = 5.0,
    create: bool = True,
) -> Database:
    """Open (and migrate) the store at ``url``; with ``create=False`` only a store that
    exists, so that a mistyped address is refused instead of answered from a new one."""
    path = _sqlite_path(url)
    # A PostgreSQL URL may hold a password: it is not repeated in the error.
    missing = StoreNotFound(
        f"no Charter store at {path or 'the PostgreSQL database of the store URL'}; check "
        "--store or the configured store (`charter demo` and Engine.open() create one)",
        store=None if path is None else str(path),
    )
    if not create and path is not None and not path.is_file():
        raise missing  # before SQLite makes the file
    db = Database(_driver(url, path, busy_timeout), clock, ids)
    try:
        if not create:
            with db.read() as tx:
                if tx.one(db.dialect.has_table, "schema_migrations") is None:
                    raise missing
        migrate(db)
    except BaseException:
        db.close()
        raise
    return db


def migrate(db: Database) -> int:
    """Apply pending migrations, each in its own transaction, and return the
    version. A new store is made whole in one transaction: one commit instead
    of one per version, and no process ever sees it half made."""
    with db.transaction() as tx:
        tx.run(
            "CREATE TABLE IF NOT EXISTS schema_migrations ("
            "version INTEGER PRIMARY KEY, name TEXT NOT NULL, applied_at_us BIGINT NOT NULL)"
        )
        current = _version(tx)
        if current == 0:
            for migration in MIGRATIONS:
                _apply(db, tx, migration)
            return LATEST
    if current > LATEST:
        raise SchemaError(
            f"the store's schema is version {current}, newer than this Charter knows "
            f"({LATEST}); upgrade Charter"
        )
    for migration in MIGRATIONS:
        if migration[0] <= current:
            continue
        with db.transaction() as tx:
            # Re-check under the write lock: another process may have migrated.
            if _version(tx) < migration[0]:
                _apply(db, tx, migration)
    return LATEST


def _version(tx: Tx) -> int:
    row = tx.one("SELECT MAX(version) AS v FROM schema_migrations")
    return int((row["v"] if row else None) or 0)


def _apply(db: Database, tx: Tx, migration: Migration) -> None:
    """One version's statements (those for this backend), and its record."""
    version, name, statements = migration
    for statement in statements:
        backend, sql = statement if isinstance(statement, tuple) else (None, statement)
        if backend in (None, db.dialect.name):
            tx.run(sql)
    tx.run(
        "INSERT INTO schema_migrations (version, name, applied_at_us) VALUES (?, ?, ?)",
        version,
        name,
        tx.now_us,
    )
