"""Storage: one protocol, shared SQL, a backend chosen by URL scheme.

``None`` or a bare path or ``sqlite:///path`` opens the embedded SQLite store;
``postgresql://`` URLs open the PostgreSQL store (the ``postgres`` extra). Drivers are
imported lazily so ``import charter`` stays cheap.
"""

from __future__ import annotations

from pathlib import Path

from charter.clock import Clock
from charter.errors import ConfigError, SchemaError
from charter.ids import IdFactory
from charter.storage.database import Database, Driver, Prefetched, Row, Tx
from charter.storage.schema import LATEST, MIGRATIONS

DEFAULT_PATH = Path(".charter") / "charter.db"

__all__ = ["DEFAULT_PATH", "Database", "Prefetched", "Row", "Tx", "open_database"]


def _driver(url: str | None, busy_timeout: float) -> Driver:
    if url is None:
        from charter.storage.sqlite import SQLiteDriver

        return SQLiteDriver(DEFAULT_PATH, busy_timeout=busy_timeout)
    if url.startswith(("postgresql://", "postgres://")):
        from charter.storage.postgres import PostgresDriver

        return PostgresDriver(url, busy_timeout=busy_timeout)
    if url.startswith("sqlite:///"):
        path = Path(url.removeprefix("sqlite:///"))
    elif "://" in url:
        raise ConfigError(
            f"unsupported store URL {url!r}; use a path, sqlite:///path or postgresql://..."
        )
    else:
        path = Path(url)
    from charter.storage.sqlite import SQLiteDriver

    return SQLiteDriver(path, busy_timeout=busy_timeout)


def open_database(
    url: str | None, *, clock: Clock, ids: IdFactory, busy_timeout: float = 5.0
) -> Database:
    """Open (and migrate) the store at ``url``."""
    db = Database(_driver(url, busy_timeout), clock, ids)
    try:
        migrate(db)
    except BaseException:
        db.close()
        raise
    return db


def migrate(db: Database) -> int:
    """Apply pending migrations, each in its own transaction; return the version."""
    with db.transaction() as tx:
        tx.run(
            "CREATE TABLE IF NOT EXISTS schema_migrations ("
            "version INTEGER PRIMARY KEY, name TEXT NOT NULL, applied_at_us BIGINT NOT NULL)"
        )
        row = tx.one("SELECT MAX(version) AS v FROM schema_migrations")
    current = (row["v"] if row else None) or 0
    if current > LATEST:
        raise SchemaError(
            f"the store's schema is version {current}, newer than this Charter knows "
            f"({LATEST}); upgrade Charter"
        )
    for version, name, statements in MIGRATIONS:
        if version <= current:
            continue
        with db.transaction() as tx:
            # Re-check under the write lock: another process may have migrated.
            done = tx.one("SELECT 1 AS x FROM schema_migrations WHERE version = ?", version)
            if done:
                continue
            for statement in statements:
                tx.run(statement)
            tx.run(
                "INSERT INTO schema_migrations (version, name, applied_at_us) VALUES (?, ?, ?)",
                version,
                name,
                tx.now_us,
            )
    return LATEST
