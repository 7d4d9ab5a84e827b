"""The one small layer where SQLite and PostgreSQL differ.

All SQL in Charter is written once, with ``?`` placeholders and a few named
slots; the dialect rewrites it (once per statement text, cached) so the two
backends cannot drift:

- ``?`` becomes ``%s`` on PostgreSQL;
- ``{serial_pk}`` in DDL is an auto-incrementing 64-bit key;
- ``{without_rowid}`` after a table's DDL clusters it by its primary key on
  SQLite (PostgreSQL tables need nothing);
- ``{group_concat}(text, separator)`` is the string aggregate;
- ``{indexed_by NAME}`` after a table's name makes SQLite read it through that
  index (its planner, without statistics, prefers the primary key whenever the
  key's first column is constrained); PostgreSQL plans from its statistics;
- ``{skip_locked}`` after a ``SELECT`` makes PostgreSQL lock the rows it returns
  and pass over rows another transaction holds (SQLite's one writer holds the
  whole store already, so there it is nothing);
- ``max_params`` bounds the parameters of one statement.

``has_table`` finds a table of the store by name (the catalogues differ).

Upserts use ``ON CONFLICT ... DO UPDATE`` and results use ``RETURNING``: both
backends accept the same text.
"""

from __future__ import annotations

import re
from dataclasses import dataclass, field

_INDEXED_BY = re.compile(r"\{indexed_by (\w+)\}")


@dataclass
class Dialect:
    name: str
    placeholder: str
    serial_pk: str
    without_rowid: str
    group_concat: str
    indexed_by: str  # a format string for the index's name
    has_table: str
    skip_locked: str
    #: A statement telling listeners of a channel, sent when the transaction
    #: commits (PostgreSQL's NOTIFY); ``None`` where the store has no such thing.
    notify: str | None
    #: The most parameters one statement may carry (multi-row writes are split under it).
    max_params: int
    _cache: dict[str, str] = field(default_factory=dict, repr=False)

    def sql(self, text: str) -> str:
        """The statement text for this backend (cached)."""
        out = self._cache.get(text)
        if out is None:
            out = (
                text.replace("{serial_pk}", self.serial_pk)
                .replace("{without_rowid}", self.without_rowid)
                .replace("{group_concat}", self.group_concat)
                .replace("{skip_locked}", self.skip_locked)
            )
            out = _INDEXED_BY.sub(lambda m: self.indexed_by.format(m.group(1)), out)
            if self.placeholder != "?":
                out = out.replace("?", self.placeholder)
            self._cache[text] = out
        return out


def sqlite() -> Dialect:
    # SQLite's compiled-in default; the driver reads its connection's actual limit.
    return Dialect(
        "sqlite",
        "?",
        "INTEGER PRIMARY KEY",
        " WITHOUT ROWID",
        "group_concat",
        " INDEXED BY {}",
        "SELECT 1 AS x FROM sqlite_master WHERE type = 'table' AND name = ?",
        "",
        None,
        32_766,
    )


def postgresql() -> Dialect:
    # The wire protocol counts a statement's parameters in 16 bits.
    return Dialect(
        "postgresql",
        "%s",
        "BIGSERIAL PRIMARY KEY",
        "",
        "string_agg",
        "",
        "SELECT 1 AS x FROM information_schema.tables "
        "WHERE table_schema = current_schema() AND table_name = ?",
        " FOR UPDATE SKIP LOCKED",
        "SELECT pg_notify(%s, %s)",
        65_535,
    )
