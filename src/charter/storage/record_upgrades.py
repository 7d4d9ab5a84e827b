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
