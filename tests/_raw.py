"""The store seen from outside, on either backend: raw SQL through the driver's
own client (``sqlite3`` or ``psycopg``), as an operator — or an attacker — with
access to the database would use it. Nothing here goes through Charter.

Statements are written with ``?`` placeholders, as Charter's are.
"""

from __future__ import annotations

import json
import sqlite3
from collections.abc import Iterator
from contextlib import contextmanager
from typing import Any

#: What a chain's head adds to a mission's row; the recorded state leaves it out
#: (every audit event moves it, refusals included).
HEAD_COLUMNS = ("audit_seq", "audit_hash", "audit_legacy_seq")
#: Tables that belong to the audit log, not to the recorded state.
AUDIT_TABLES = ("audit_events", "audit_chains")


class RawStore:
    """One connection in autocommit mode to the store at ``url``."""

    def __init__(self, url: str, backend: str) -> None:
        self.url = url
        self.backend = backend
        self._con: Any
        if backend == "sqlite":
            self._con = sqlite3.connect(url, isolation_level=None)
            self._con.row_factory = sqlite3.Row
        else:
            import psycopg
            from psycopg.rows import dict_row

            self._con = psycopg.connect(url, autocommit=True, row_factory=dict_row)

    def close(self) -> None:
        self._con.close()

    def _sql(self, sql: str) -> str:
        return sql if self.backend == "sqlite" else sql.replace("?", "%s")

    def execute(self, sql: str, *params: Any) -> None:
        self._con.execute(self._sql(sql), params)

    def rows(self, sql: str, *params: Any) -> list[dict[str, Any]]:
        return [dict(r) for r in self._con.execute(self._sql(sql), params).fetchall()]

    def books_as_before_schema_23(self) -> None:
        """Put the books of missions back where schema 22 kept them, as rows of
        ``allowances`` (the table made again if it is gone), and drop the
        ``books`` columns of ``missions`` and ``audit_chains`` (a slice's are
        left to the caller): a store as code before schema 23 left it."""
        from charter.storage.schema import MIGRATIONS

        if "allowances" not in self.tables():
            [ddl] = [s for s in MIGRATIONS[0][2] if "CREATE TABLE allowances" in str(s)]
            self.execute(str(ddl))
        for row in self.rows("SELECT id, books FROM missions"):
            for unit, sums in json.loads(row["books"]).items():
                self.execute(
                    "INSERT INTO allowances VALUES (?, ?, ?, ?, ?, ?, ?)", row["id"], unit, *sums
                )
        for head in ("missions", "audit_chains"):
            if head in self.tables():
                self.execute(f"ALTER TABLE {head} DROP COLUMN books")

    def attempts_as_before_schema_25(self) -> None:
        """Take the ``tallied`` column off ``attempts``, and the index of what is
        not tallied, and put back the index of unresolved attempts that schema
        25 replaced: a store as code before schema 25 left it."""
        self.execute("DROP INDEX IF EXISTS attempts_untallied")
        self.execute("ALTER TABLE attempts DROP COLUMN tallied")
        self.execute(
            "CREATE INDEX IF NOT EXISTS attempts_unresolved ON attempts (run_id) "
            "WHERE status IN ('prepared', 'dispatched', 'unknown')"
        )

    def tables(self) -> list[str]:
        if self.backend == "sqlite":
            sql = "SELECT name FROM sqlite_master WHERE type = 'table'"
        else:
            sql = (
                "SELECT table_name AS name FROM information_schema.tables "
                "WHERE table_schema = current_schema()"
            )
        return sorted(r["name"] for r in self.rows(sql))

    def state(self) -> dict[str, list[tuple[Any, ...]]]:
        """Every table except the audit log, rows sorted: the recorded state."""
        out = {}
        for name in self.tables():
            if name in AUDIT_TABLES:
                continue
            rows = [
                tuple(v for k, v in r.items() if k not in HEAD_COLUMNS)
                for r in self.rows(f"SELECT * FROM {name}")
            ]
            out[name] = sorted(rows, key=repr)
        return out

    def dump(self) -> dict[str, Any]:
        """The whole store as data, audit log included: its schema (tables, columns,
        indexes) and every table's rows, sorted. Equal dumps, an unchanged store."""
        if self.backend == "sqlite":
            schema = self.rows("SELECT type, name, sql FROM sqlite_master ORDER BY type, name")
        else:
            schema = self.rows(
                "SELECT table_name, column_name, data_type, is_nullable, column_default "
                "FROM information_schema.columns WHERE table_schema = current_schema() "
                "ORDER BY table_name, ordinal_position"
            ) + self.rows(
                "SELECT indexname, indexdef FROM pg_indexes "
                "WHERE schemaname = current_schema() ORDER BY indexname"
            )
        rows = {t: sorted(map(repr, self.rows(f"SELECT * FROM {t}"))) for t in self.tables()}
        return {"schema": schema, "rows": rows}

    def events(self, chain: str | None = None) -> list[dict[str, Any]]:
        if chain is None:
            return self.rows("SELECT * FROM audit_events ORDER BY mission_id, seq")
        return self.rows("SELECT * FROM audit_events WHERE mission_id = ? ORDER BY seq", chain)

    def heads(self) -> dict[str, tuple[int, str | None]]:
        """Every chain's recorded head: (last seq, last hash), ``(0, None)`` when empty."""
        rows = self.rows("SELECT id, audit_seq, audit_hash FROM missions")
        rows += self.rows("SELECT id, audit_seq, audit_hash FROM audit_chains")
        return {r["id"]: (r["audit_seq"], r["audit_hash"]) for r in rows}

    def ends(self) -> dict[str, tuple[int, str | None]]:
        """Every chain's last event as the log holds it, in the shape of :meth:`heads`."""
        ends: dict[str, tuple[int, str | None]] = dict.fromkeys(self.heads(), (0, None))
        for e in self.events():
            ends[e["mission_id"]] = (e["seq"], e["hash"])
        return ends

    @contextmanager
    def refusing(self, table: str, event: str) -> Iterator[None]:
        """While open, the store refuses ``event`` (``INSERT``, ``UPDATE OF col``) on ``table``."""
        if self.backend == "sqlite":
            self.execute(
                f"CREATE TRIGGER refuse_{table} BEFORE {event} ON {table} "
                "BEGIN SELECT RAISE(ABORT, 'refused by a test trigger'); END"
            )
        else:
            self.execute(
                "CREATE OR REPLACE FUNCTION refuse_write() RETURNS trigger AS $$ BEGIN "
                "RAISE EXCEPTION 'refused by a test trigger'; END $$ LANGUAGE plpgsql"
            )
            self.execute(
                f"CREATE TRIGGER refuse_{table} BEFORE {event} ON {table} "
                "FOR EACH ROW EXECUTE FUNCTION refuse_write()"
            )
        try:
            yield
        finally:
            on = "" if self.backend == "sqlite" else f" ON {table}"
            self.execute(f"DROP TRIGGER refuse_{table}{on}")
