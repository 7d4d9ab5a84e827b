"""How the record became one chain of events: schema versions 23 on.

Each version is a slice of the plan in docs/record.md, forward-only like those
of :mod:`~charter.storage.upgrades`, and applied after them.
"""

from __future__ import annotations

from charter.storage.upgrades import Migration

RECORD_UPGRADES: list[Migration] = []

# From 23 on, a chain's books are on the row that keeps its head (S1, L2): the
# balances of a mission, or of an escrow slice (L10), in one column moved by the
# statement that moves the head, read with the head under the gate. Before, each
# unit was a row of ``allowances`` (``escrow_accounts`` for a slice), written by
# a statement of its own in every transaction that moved money: two statements
# and two pages an attempt. The tables go, so a process still running older
# code fails its transaction instead of moving books nobody reads.
_BOOKS = {
    "sqlite": "COALESCE((SELECT json_group_object(a.unit, json_array(a.limit_amount, "
    "a.available, a.held, a.spent, a.overrun)) FROM {table} a WHERE a.{key} = {head}.id), '{{}}')",
    "postgresql": "COALESCE((SELECT json_object_agg(a.unit, json_build_array(a.limit_amount, "
    "a.available, a.held, a.spent, a.overrun))::text FROM {table} a WHERE a.{key} = {head}.id), "
    "'{{}}')",
}
RECORD_UPGRADES.append(
    (
        23,
        "a chain's books on its head row: allowances and escrow accounts folded in (L2, L10)",
        [
            *(
                f"ALTER TABLE {head} ADD COLUMN books TEXT NOT NULL DEFAULT '{{}}'"
                for head in ("missions", "escrow_slices", "audit_chains")
            ),
            *(
                (
                    backend,
                    f"UPDATE {head} SET books = " + books.format(table=table, key=key, head=head),
                )
                for backend, books in _BOOKS.items()
                for head, table, key in (
                    ("missions", "allowances", "mission_id"),
                    ("escrow_slices", "escrow_accounts", "slice_id"),
                )
            ),
            "DROP TABLE allowances",
            "DROP TABLE escrow_accounts",
        ],
    )
)

# From 24 on, SQLite keeps the audit events in a rowid table (slice C's first
# step). Keyed by (mission, seq) without a rowid (schema 3), the table kept its
# large rows in key order: every commit inserted them among their neighbours,
# and SQLite rebalanced the leaves around them (6 log pages for an attempt's
# three events). A rowid table takes each new row on its last leaf, where the
# rows before it went, and the key is an index beside it. Nothing reads rows in
# the table's own order: every read names the chain and orders by seq through
# that index. PostgreSQL keeps its events in a heap already: nothing changes.
_EVENT_COLUMNS = (
    "mission_id TEXT NOT NULL, seq BIGINT NOT NULL, at_us BIGINT NOT NULL, "
    "actor TEXT NOT NULL, segment TEXT, epoch BIGINT, kind TEXT NOT NULL, "
    "entity TEXT NOT NULL, before TEXT, after TEXT, payload TEXT NOT NULL, "
    "payload_hash TEXT NOT NULL, prev_hash TEXT NOT NULL, hash TEXT NOT NULL"
)
RECORD_UPGRADES.append(
    (
        24,
        "the audit events in a table appended at its end (SQLite): fewer pages a commit",
        [
            (
                "sqlite",
                f"CREATE TABLE audit_events_v24 ({_EVENT_COLUMNS}, PRIMARY KEY (mission_id, seq))",
            ),
            (
                "sqlite",
                "INSERT INTO audit_events_v24 SELECT * FROM audit_events ORDER BY mission_id, seq",
            ),
            ("sqlite", "DROP TABLE audit_events"),
            ("sqlite", "ALTER TABLE audit_events_v24 RENAME TO audit_events"),
            (
                "sqlite",
                "CREATE INDEX audit_events_entity ON audit_events (mission_id, entity, seq)",
            ),
        ],
    )
)

# From 25 on, a settlement no longer writes its run's row (slice B's sweep). A
# run's settled counts (R5) are its row's counts plus its settled attempts not
# yet tallied there: ``tallied`` says which, and ``attempts_untallied`` finds
# them, beside every unresolved attempt, so one index serves recovery's read
# and the count. A settlement moves its attempt's entry within the run's part of
# that index instead of taking it out of one index and writing the run's row;
# every 32 settled attempts, and when the run ends, they are added to the run's
# counts and leave the index, in one transaction (``attempts.settlement.tally``). The
# index's condition names the unresolved statuses beside ``tallied = 0`` so an
# unresolved attempt is in it whatever its flag says, and the reads that name
# those statuses use it unchanged. Existing attempts are counted already (the
# column's default); only the unresolved are marked as not.
_UNRESOLVED = "('prepared', 'dispatched', 'unknown')"
RECORD_UPGRADES.append(
    (
        25,
        "settled attempts counted into their runs in sweeps: no run row written a settlement",
        [
            "ALTER TABLE attempts ADD COLUMN tallied INTEGER NOT NULL DEFAULT 1",
            f"UPDATE attempts SET tallied = 0 WHERE status IN {_UNRESOLVED}",
            "DROP INDEX attempts_unresolved",
            "CREATE INDEX attempts_untallied ON attempts (run_id, status, tallied) "
            f"WHERE tallied = 0 OR status IN {_UNRESOLVED}",
        ],
    )
)
