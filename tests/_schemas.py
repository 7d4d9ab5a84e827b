"""PostgreSQL schemas for the tests, made once per test process and used again.

A fresh schema costs its ``CREATE SCHEMA``, every version of the store's
migrations and a ``DROP SCHEMA ... CASCADE``: about half a second of the
server's DDL for each of the ~1,300 PostgreSQL tests, a fifth of the suite's
time. A schema given back is instead made new again in a few milliseconds and
handed to the next test:

1. every session still connected to it is ended (each connection to a test's
   store names the schema as its ``application_name``: the test's engines, its
   children's, a leaked pool's);
2. its name changes, so that a straggler which connects again later (a child
   left running) finds no store there, as it would after a ``DROP``;
3. in one transaction, every row a test wrote is deleted, the rows the store is
   made with (its migrations' record, the engine's chain) are put back as they
   were, and the sequences start again;
4. its tables, columns, indexes, constraints, triggers and functions must be
   exactly those of a schema just made; one a test changed (an index dropped, a
   trigger added, a table in the way) is dropped instead.

A test that makes the store itself (an old version, a half-made one) takes a
bare schema: ``@pytest.mark.bare_store``.
"""

from __future__ import annotations

import json
import uuid
from dataclasses import dataclass, field
from typing import Any

import psycopg
from psycopg import sql

import charter

#: What a schema is made of, for comparing one with another (its DDL, not its rows).
FINGERPRINT = """
SELECT md5(coalesce(string_agg(item, E'\\n' ORDER BY item), '')) FROM (
    SELECT 'rel ' || c.relname || ' ' || c.relkind::text || ' '
        || coalesce(array_to_string(c.reloptions, ','), '') || ' ' || c.relrowsecurity::text AS item
      FROM pg_class c WHERE c.relnamespace = %(ns)s::regnamespace
    UNION ALL
    SELECT 'col ' || c.relname || '.' || a.attname || ' ' || format_type(a.atttypid, a.atttypmod)
        || ' ' || a.attnotnull::text || ' ' || coalesce(pg_get_expr(d.adbin, d.adrelid), '')
      FROM pg_attribute a JOIN pg_class c ON c.oid = a.attrelid
      LEFT JOIN pg_attrdef d ON d.adrelid = a.attrelid AND d.adnum = a.attnum
     WHERE c.relnamespace = %(ns)s::regnamespace AND a.attnum > 0 AND NOT a.attisdropped
    UNION ALL
    SELECT 'idx ' || replace(pg_get_indexdef(i.indexrelid), ' ON ' || %(ns)s || '.', ' ON ')
      FROM pg_index i JOIN pg_class c ON c.oid = i.indrelid
     WHERE c.relnamespace = %(ns)s::regnamespace
    UNION ALL
    SELECT 'con ' || c.relname || ' ' || n.conname || ' ' || pg_get_constraintdef(n.oid)
      FROM pg_constraint n JOIN pg_class c ON c.oid = n.conrelid
     WHERE c.relnamespace = %(ns)s::regnamespace
    UNION ALL
    SELECT 'trg ' || c.relname || ' ' || t.tgname || ' ' || t.tgenabled::text
      FROM pg_trigger t JOIN pg_class c ON c.oid = t.tgrelid
     WHERE c.relnamespace = %(ns)s::regnamespace AND NOT t.tgisinternal
    UNION ALL
    SELECT 'fn ' || p.proname || ' ' || md5(p.prosrc)
      FROM pg_proc p WHERE p.pronamespace = %(ns)s::regnamespace
) items
"""


def store_url(database_url: str, schema: str) -> str:
    """The URL of the store in ``schema``, its connections named after it."""
    sep = "&" if "?" in database_url else "?"
    return f"{database_url}{sep}options=-csearch_path%3D{schema}&application_name={schema}"


def _name() -> str:
    return f"t_{uuid.uuid4().hex[:16]}"


@dataclass
class Pristine:
    """A schema as the store's migrations leave it: its DDL's fingerprint, and how
    to put its rows back (the tables to empty, the rows to restore, the sequences)."""

    fingerprint: str
    reset: sql.Composed


@dataclass
class SchemaPool:
    """Schemas of one test process's database (``database_url``), made new again
    between tests; one test at a time takes each."""

    database_url: str
    idle: list[str] = field(default_factory=list)
    pristine: Pristine | None = None

    def bare(self) -> str:
        """A schema with nothing in it, dropped at :meth:`give_back`."""
        name = _name()
        with self._admin() as admin:
            admin.execute(sql.SQL("CREATE SCHEMA {}").format(sql.Identifier(name)))
        return name

    def take(self) -> str:
        """A schema holding an empty store at the current version."""
        if self.idle:
            return self.idle.pop()
        name = self.bare()
        charter.Engine.open(store_url(self.database_url, name)).close()
        if self.pristine is None:
            with self._admin() as admin:
                self.pristine = _pristine(admin, name)
        return name

    def give_back(self, schema: str, *, reuse: bool = True) -> None:
        """Make ``schema`` new again for the next test, or drop it when it cannot
        be (``reuse=False``, a changed schema, a lock that is not let go of)."""
        with self._admin() as admin:
            admin.execute(
                "SELECT pg_terminate_backend(pid, 5000) FROM pg_stat_activity"
                " WHERE application_name = %s AND pid <> pg_backend_pid()",
                (schema,),
            )
            admin.execute("SET lock_timeout = '5s'")
            if reuse and self.pristine is not None:
                try:
                    self.idle.append(self._renew(admin, schema, self.pristine))
                    return
                except psycopg.Error:
                    pass  # dropped below
            admin.execute(sql.SQL("DROP SCHEMA {} CASCADE").format(sql.Identifier(schema)))

    def _renew(self, admin: psycopg.Connection[Any], schema: str, pristine: Pristine) -> str:
        renamed = _name()
        with admin.transaction():
            admin.execute(
                sql.SQL("ALTER SCHEMA {} RENAME TO {}").format(
                    sql.Identifier(schema), sql.Identifier(renamed)
                )
            )
            admin.execute(sql.SQL("SET LOCAL search_path = {}").format(sql.Identifier(renamed)))
            admin.execute(pristine.reset)
            found = admin.execute(FINGERPRINT, {"ns": renamed}).fetchone()
            if found is None or found[0] != pristine.fingerprint:
                raise psycopg.DataError(f"schema {schema} was changed by its test")
        return renamed

    def _admin(self) -> psycopg.Connection[Any]:
        return psycopg.connect(self.database_url, autocommit=True)


def _pristine(admin: psycopg.Connection[Any], schema: str) -> Pristine:
    """What ``schema``, just made by the migrations, holds, as a reset statement
    (the fingerprint taken with the schema on the search path, as when it is
    compared: its own names then go unqualified)."""
    with admin.transaction():
        admin.execute(sql.SQL("SET LOCAL search_path = {}").format(sql.Identifier(schema)))
        fingerprint = admin.execute(FINGERPRINT, {"ns": schema}).fetchone()
        tables = _referrers_first(admin, schema)
        parts: list[sql.Composable] = []
        for table in tables:
            name = sql.Identifier(table)
            rows = admin.execute(
                sql.SQL("SELECT coalesce(json_agg(t), '[]') FROM {} t").format(name)
            ).fetchone()
            parts.append(sql.SQL("DELETE FROM {}").format(name))
            if rows is not None and rows[0]:
                parts.append(
                    sql.SQL(
                        "INSERT INTO {} SELECT * FROM json_populate_recordset(NULL::{}, {})"
                    ).format(name, name, sql.Literal(json.dumps(rows[0])))
                )
        sequences = admin.execute(
            "SELECT sequencename FROM pg_sequences WHERE schemaname = %s", (schema,)
        ).fetchall()
    for (sequence,) in sequences:
        parts.append(sql.SQL("ALTER SEQUENCE {} RESTART").format(sql.Identifier(sequence)))
    assert fingerprint is not None
    return Pristine(str(fingerprint[0]), sql.SQL("; ").join(parts))


def _referrers_first(admin: psycopg.Connection[Any], schema: str) -> list[str]:
    """``schema``'s tables, each after every table whose foreign keys refer to it:
    the order their rows can be deleted in."""
    tables = [
        str(r[0])
        for r in admin.execute(
            "SELECT tablename FROM pg_tables WHERE schemaname = %s ORDER BY tablename", (schema,)
        )
    ]
    referrers: dict[str, set[str]] = {t: set() for t in tables}
    for child, parent in admin.execute(
        "SELECT c.relname, p.relname FROM pg_constraint n"
        " JOIN pg_class c ON c.oid = n.conrelid JOIN pg_class p ON p.oid = n.confrelid"
        " WHERE n.contype = 'f' AND c.relnamespace = %s::regnamespace AND c.oid <> p.oid",
        (schema,),
    ):
        referrers[str(parent)].add(str(child))
    ordered: list[str] = []
    while referrers:
        free = sorted(t for t, by in referrers.items() if not by - set(ordered))
        assert free, f"foreign keys in a circle among {sorted(referrers)}"
        for table in free:
            ordered.append(table)
            del referrers[table]
    return ordered
