"""The ledger room's records: balances, incidents, entries (L0-L7).

A mission's balances (its accounts, opened with its contract) are its chain's
books, kept on the row of the chain's head and moved with it (since schema 23,
:mod:`charter.storage.books`; before, rows of ``allowances``). Every read and
move of them, and every statement on ``incidents`` and ``ledger_entries``, is
here; :mod:`charter.ledger.accounts` computes the moves and
:mod:`charter.ledger.incidents` says what an incident means.

Since schema 15 an entry is not a row of its own: it is carried by the audit
event of the transition that makes it (the payload's ``ledger``), hashed into
the mission's chain with the rest of that event (S1). ``ledger_entries`` keeps
the entries written before, read beside the carried ones; nothing writes it
any more. So the books are rebuilt from one append-only, hash-chained record,
and an attempt's two transactions write one table fewer each.
"""

from __future__ import annotations

import json
from collections.abc import Iterable, Iterator, Mapping, Sequence
from typing import Any

from charter.ledger.accounts import (
    Balance,
    Move,
    as_records,
    balances,
    carried,
    carry,
    check_sums,
    from_records,
)
from charter.ledger.escrow import store as escrow_store
from charter.storage import Row, Tx
from charter.storage import books as chain_books
from charter.storage.books import Sums
from charter.storage.paging import Position, page


def record(
    tx: Tx,
    mission_id: str,
    attempt_id: str | None,
    moves: list[Move],
    price_source: str | None,
) -> dict[str, Any]:
    """Stage the moves on the books of the chain the mission's changes go
    through (its own, or in a lane its slice's, L10), written with the chain's
    head at commit, and return what the transition's audit event must carry in
    its payload: ``{"ledger": entries}``, or nothing when there are no moves.
    The event is the entry, and the head row it moves keeps the books: the two
    are written by one statement (L2).

    Refuses (:class:`AmountOverflow`, nothing written by this call) moves whose
    sums with the books would leave the range the ledger holds (A9). Only an
    overrun (it adds to ``spent + held`` beyond any hold) or a higher limit can:
    a hold is bounded by what is available (L3), a spend moves held to spent and
    a release lowers held.
    """
    if not moves:
        return {}
    change = balances(moves)
    lane = tx.lane(mission_id)
    chain = mission_id if lane is None else lane.chain
    if any(d.overrun > 0 or d.limit > 0 for d in change.values()):
        check_sums(cached(tx, chain), change)
    # (dataclasses.astuple deep-copies: ten times the cost, on every attempt)
    tx.move_books(
        chain,
        {u: (d.limit, d.available, d.held, d.spent, d.overrun) for u, d in change.items()},
    )
    return {"ledger": carry(moves, attempt_id, price_source)}


def open_accounts(tx: Tx, chain: str, units: Iterable[str]) -> None:
    """The chain's accounts of ``units`` at zero; a ``fund`` move then sets each
    limit (L0). The transaction appends to the chain, as a mission's creation
    and a slice's lease do."""
    tx.move_books(chain, dict.fromkeys(sorted(units), (0, 0, 0, 0, 0)))


def overdrawn(tx: Tx, mission_id: str) -> bool:
    """Whether any unit of the mission has less than nothing available (L7)."""
    return any(b.available < 0 for b in cached(tx, mission_id).values())


def cached(tx: Tx, chain: str) -> dict[str, Balance]:
    """The balances of a mission's (or a slice's) books, by unit, as this
    transaction leaves them so far."""
    return {unit: Balance(*sums) for unit, sums in sorted(tx.books(chain).items())}


#: Events read at a time when the carried entries are gathered.
_PAGE = 500


def _carriers(tx: Tx, mission_id: str, *, newest_first: bool) -> Iterator[Row]:
    """The mission's audit events that may carry entries, a page at a time on
    the chain's key, oldest first or newest first."""
    order, beyond, seq = ("DESC", "<", 2**63 - 1) if newest_first else ("ASC", ">", 0)
    while True:
        rows = tx.all(
            f"SELECT seq, at_us, payload FROM audit_events WHERE mission_id = ? "
            f"AND seq {beyond} ? ORDER BY seq {order} LIMIT ?",
            mission_id,
            seq,
            _PAGE,
        )
        # Canonical JSON (sorted keys, no spaces): an event without entries
        # is passed over without decoding it.
        yield from (r for r in rows if '"ledger":{' in r["payload"])
        if len(rows) < _PAGE:
            return
        seq = rows[-1]["seq"]


def _event_entries(mission_id: str, row: Row) -> list[dict[str, Any]]:
    """The entries one event carries, as :func:`entries` gives them; an event
    whose ``ledger`` is not a ledger's entries raises :class:`ValueError`."""
    ledger = json.loads(row["payload"]).get("ledger")
    if ledger is None:
        return []  # the text was inside another value
    attempt_id, price_source, moves = carried(ledger)
    return [
        {
            "mission_id": mission_id,
            "seq": row["seq"],
            "unit": m.unit,
            "attempt_id": attempt_id,
            "kind": m.kind,
            "source": m.source,
            "target": m.target,
            "amount": m.amount,
            "price_source": price_source,
            "at_us": row["at_us"],
        }
        for m in moves
    ]


def _legacy(tx: Tx, mission_id: str) -> list[dict[str, Any]]:
    """Entries written as rows of their own, before schema 15, in their order."""
    rows = tx.all("SELECT * FROM ledger_entries WHERE mission_id = ? ORDER BY id", mission_id)
    return [{**{k: v for k, v in dict(r).items() if k != "id"}, "seq": None} for r in rows]


def _move(entry: Mapping[str, Any]) -> Move:
    return Move(entry["unit"], entry["kind"], entry["source"], entry["target"], entry["amount"])


def from_entries(tx: Tx, mission_id: str) -> dict[str, Balance]:
    """The mission's balances rebuilt from every entry (L2)."""
    return balances(_move(e) for e in entries(tx, mission_id))


def entries(
    tx: Tx, mission_id: str, *, unit: str | None = None, newest: int | None = None
) -> list[dict[str, Any]]:
    """The mission's ledger entries (of one ``unit``), in the order they were
    written: those written as rows before schema 15, then those its audit events
    carry (``seq`` names the event). With ``newest``, only that many of the
    latest, read from the chain's end. :class:`ValueError` when an event carries
    something that is not a ledger's entries."""
    wanted = (lambda e: True) if unit is None else (lambda e: e["unit"] == unit)
    if newest is None:
        found = [e for e in _legacy(tx, mission_id) if wanted(e)]
        for row in _carriers(tx, mission_id, newest_first=False):
            found += [e for e in _event_entries(mission_id, row) if wanted(e)]
        return found
    latest: list[dict[str, Any]] = []
    for row in _carriers(tx, mission_id, newest_first=True):
        latest += reversed([e for e in _event_entries(mission_id, row) if wanted(e)])
        if len(latest) >= newest:
            return list(reversed(latest[:newest]))
    older = [e for e in _legacy(tx, mission_id) if wanted(e)]
    return [*older, *reversed(latest)][-newest:]


def problems(tx: Tx, mission_id: str) -> list[str]:
    """Check L0, L1 and L2 for one mission and each slice it lent that is open
    (L10); an empty list means the ledger holds.

    A mission's ``held`` is the holds of its open attempts taken from it, and
    every open slice's whole grant; a slice's ``held`` is the holds of its open
    attempts taken from it. A slice's books rebuild from its own chain."""
    holds: dict[str | None, dict[str, int]] = {None: {}}
    lent = escrow_store.open_slices(tx, mission_id)
    for s in lent:
        holds[s["id"]] = {}
    for estimate, slice_id in escrow_store.open_holds(tx, mission_id):
        into = holds.setdefault(slice_id, {})
        for unit, amount in estimate.items():
            into[unit] = into.get(unit, 0) + amount
    books = [(mission_id, "", cached(tx, mission_id), holds[None])]
    for s in lent:
        grant = cached(tx, s["id"])
        for unit, bal in grant.items():
            holds[None][unit] = holds[None].get(unit, 0) + bal.limit
        books.append((s["id"], f"slice {s['id']} ", grant, holds[s["id"]]))
    out: list[str] = []
    for chain, name, cache, held in books:
        try:
            rebuilt = from_entries(tx, chain)
        except ValueError:
            return [f"L2 {name}: an audit event carries entries that are not a ledger's"]
        for unit, bal in cache.items():
            if bal.available + bal.held + bal.spent != bal.limit:
                out.append(f"L0 {name}{unit}: available+held+spent != limit ({bal})")
            if bal.held != held.get(unit, 0):
                out.append(f"L1 {name}{unit}: held {bal.held} != open holds {held.get(unit, 0)}")
            if rebuilt.get(unit, Balance()) != bal:
                out.append(
                    f"L2 {name}{unit}: cached {bal} != rebuilt from entries {rebuilt.get(unit)}"
                )
    return out


# -- incidents ------------------------------------------------------------------


def insert_incident(
    tx: Tx,
    incident_id: str,
    mission_id: str,
    kind: str,
    detail: Mapping[str, Any],
    *,
    run_id: str | None,
    attempt_id: str | None,
) -> None:
    tx.run(
        "INSERT INTO incidents (id, mission_id, run_id, attempt_id, kind, detail, status, "
        "opened_at_us) VALUES (?, ?, ?, ?, ?, ?, 'open', ?)",
        incident_id,
        mission_id,
        run_id,
        attempt_id,
        kind,
        json.dumps(detail, sort_keys=True),
        tx.now_us,
    )


def incident(tx: Tx, incident_id: str) -> dict[str, Any] | None:
    row = tx.one("SELECT * FROM incidents WHERE id = ?", incident_id)
    return None if row is None else _incident(row)


def close(tx: Tx, incident_id: str, *, by: str, note: str) -> bool:
    """Close an open incident; ``False`` if it was not open any more."""
    return bool(
        tx.run(
            "UPDATE incidents SET status = 'closed', closed_at_us = ?, closed_by = ?, "
            "close_note = ? WHERE id = ? AND status = 'open'",
            tx.now_us,
            by,
            note,
            incident_id,
        )
    )


def incidents(
    tx: Tx,
    mission_id: str,
    *,
    open_only: bool,
    limit: int | None,
    after: Position | None,
) -> list[dict[str, Any]]:
    where = ["mission_id = ?", *(["status = 'open'"] if open_only else [])]
    sql, args = page(
        "SELECT * FROM incidents", where, [mission_id], key="opened_at_us", after=after, limit=limit
    )
    return [_incident(r) for r in tx.all(sql, *args)]


def any_open(tx: Tx, mission_id: str) -> bool:
    """Whether an incident of the mission is open (it keeps the mission paused, L7)."""
    found = tx.one(
        "SELECT 1 AS x FROM incidents WHERE mission_id = ? AND status = 'open'", mission_id
    )
    return found is not None


def count_open(tx: Tx, mission_id: str) -> int:
    row = tx.one(
        "SELECT COUNT(*) AS n FROM incidents WHERE mission_id = ? AND status = 'open'",
        mission_id,
    )
    assert row is not None  # a count answers one row
    return int(row["n"])


def _incident(row: Row) -> dict[str, Any]:
    return {**dict(row), "detail": json.loads(row["detail"])}


def totals(tx: Tx) -> dict[str, Balance]:
    """Every mission's balances summed per unit (for the metrics endpoint)."""
    sums: dict[str, Sums] = {}
    for r in tx.all("SELECT books FROM missions"):
        sums = chain_books.added(sums, chain_books.read(r["books"]))
    return {unit: Balance(*s) for unit, s in sorted(sums.items())}


# -- snapshots (S2): a mission's rows as recorded, and back ------------------------------


def snapshot(tx: Tx, mission_id: str) -> dict[str, list[dict[str, Any]]]:
    """The mission's balances as ``allowances`` records (one per unit), its
    incidents, and the entries written as rows before schema 15, in their order
    (without their store-assigned ids: a store numbers its own entries). The
    entries made since travel in the chain's events."""
    entries = [{k: v for k, v in e.items() if k != "seq"} for e in _legacy(tx, mission_id)]
    return {
        "allowances": as_records("mission_id", mission_id, cached(tx, mission_id)),
        "ledger_entries": entries,
        "incidents": [
            dict(r)
            for r in tx.all(
                "SELECT * FROM incidents WHERE mission_id = ? ORDER BY opened_at_us, id",
                mission_id,
            )
        ],
    }


def restore(tx: Tx, tables: Mapping[str, Sequence[Mapping[str, Any]]]) -> None:
    for mission_id, books in from_records("mission_id", tables["allowances"]).items():
        tx.restore_books(mission_id, books)
    tx.copy("INSERT INTO ledger_entries", tables["ledger_entries"])
    tx.copy("INSERT INTO incidents", tables["incidents"])
