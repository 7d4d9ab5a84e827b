"""Whether a snapshot's state is one whole mission whose books balance (S2).

A signature proves who exported a snapshot, not that the store it came from
was sound: a balance edited in the source store before export would be signed
along with the rest. So an import also checks what the state must satisfy on
its own: every record belongs to the snapshot's mission (and its runs and
attempts), the mission's row ends its chain where the signed head does, and the
ledger holds (L0-L2): balances rebuilt from the entries (the rows of
``ledger_entries`` written before schema 15, then those the chain's events
carry) equal the recorded ones, the held amounts are the holds of the unresolved attempts, and
available + held + spent = limit. Pure: it reads only the snapshot.
"""

from __future__ import annotations

import json
import re
from collections.abc import Mapping, Sequence
from typing import Any

from charter.audit.chain import verify_events
from charter.audit.model import ChainHead
from charter.errors import SnapshotTampered
from charter.ledger.accounts import Balance, Move, balances, carried

_SHA256 = re.compile(r"[0-9a-f]{64}")
_UNRESOLVED = ("prepared", "dispatched", "unknown")
State = Mapping[str, Sequence[Mapping[str, Any]]]


def _refuse(problem: str, message: str, **details: Any) -> SnapshotTampered:
    return SnapshotTampered(message, problem=problem, entry="state.json", **details)


def _belongs(mission_id: str, state: State) -> None:
    missions = state["missions"]
    if len(missions) != 1 or missions[0]["id"] != mission_id:
        raise _refuse("foreign_record", f"state.json must hold exactly mission {mission_id}'s row")
    runs = {r["id"] for r in state["runs"]}
    attempts = {a["id"] for a in state["attempts"]}
    owners = {"run_id": runs, "attempt_id": attempts}
    for table, rows in state.items():
        for row in rows:
            if table == "escrow_events":
                continue  # on its slices' chains (see _slices)
            if row.get("mission_id", mission_id) != mission_id:
                raise _refuse(
                    "foreign_record",
                    f"a {table} record belongs to mission {row['mission_id']}, not {mission_id}",
                    table=table,
                )
            for column, known in owners.items():
                value = row.get(column)
                if value is not None and value not in known:
                    raise _refuse(
                        "foreign_record",
                        f"a {table} record names {column} {value}, which the snapshot lacks",
                        table=table,
                    )


def _head(header: Mapping[str, Any], state: State) -> None:
    row = state["missions"][0]
    head = header["head"]
    if (row["audit_seq"], row["audit_hash"], row["audit_legacy_seq"]) != (
        head["seq"],
        head["hash"],
        head["legacy"],
    ):
        raise _refuse(
            "head_mismatch", "the mission's row does not end its chain at the signed head"
        )


def _moves(state: State, events: Sequence[Mapping[str, Any]]) -> list[Move]:
    """Every entry of the mission: its rows, then what its (verified) events carry."""
    moves = [
        Move(e["unit"], e["kind"], e["source"], e["target"], e["amount"])
        for e in state["ledger_entries"]
    ]
    for event in events:
        if '"ledger":{' not in event["payload"]:
            continue
        try:
            ledger = json.loads(event["payload"]).get("ledger")
            moves += [] if ledger is None else carried(ledger)[2]
        except ValueError:
            raise _refuse(
                "ledger", f"audit event {event['seq']} carries entries that are not a ledger's"
            ) from None
    return moves


def _ledger(state: State, events: Sequence[Mapping[str, Any]]) -> None:
    recorded = {
        a["unit"]: Balance(a["limit_amount"], a["available"], a["held"], a["spent"], a["overrun"])
        for a in state["allowances"]
    }
    rebuilt = balances(_moves(state, events))
    holds: dict[str, int] = {}
    for attempt in state["attempts"]:
        if attempt["status"] in _UNRESOLVED:
            try:
                estimate = json.loads(attempt["estimate"])
                for unit, amount in estimate.items():
                    holds[unit] = holds.get(unit, 0) + int(amount)
            except (ValueError, TypeError, AttributeError):
                raise _refuse(
                    "ledger", f"attempt {attempt['id']}'s estimate is not a map of amounts"
                ) from None
    for unit in sorted(set(recorded) | set(rebuilt)):
        bal = recorded.get(unit, Balance())
        if bal.available + bal.held + bal.spent != bal.limit:
            raise _refuse("ledger", f"L0 {unit}: available + held + spent != limit", unit=unit)
        if rebuilt.get(unit, Balance()) != bal:
            raise _refuse(
                "ledger",
                f"L2 {unit}: the recorded balances are not those its ledger entries add up to",
                unit=unit,
            )
        if bal.held != holds.get(unit, 0):
            raise _refuse(
                "ledger", f"L1 {unit}: held is not the unresolved attempts' holds", unit=unit
            )


def check(
    header: Mapping[str, Any],
    events: Sequence[Mapping[str, Any]],
    state: State,
    artifacts: Sequence[Mapping[str, Any]],
) -> None:
    """Refuse a snapshot whose state is not one whole, balanced mission (its
    ``events`` already verified as its chain)."""
    _belongs(str(header["mission_id"]), state)
    _head(header, state)
    _ledger(state, events)
    _slices(events, state)
    for item in artifacts:
        if not _SHA256.fullmatch(item["sha256"]) or item["size"] < 0:
            raise SnapshotTampered(
                "artifacts.json lists an artifact whose hash is not a SHA-256 or whose "
                "size is negative",
                problem="artifact_mismatch",
                entry="artifacts.json",
            )


def _slices(events: Sequence[Mapping[str, Any]], state: State) -> None:
    """L10: every slice the mission lent was returned (an export returns them
    first), its chain runs from its genesis to the head on its row, and the
    mission's chain recorded that head when it took the slice back."""
    lent = {s["id"]: s for s in state["escrow_slices"]}
    ended: dict[str, Any] = {}
    for event in events:
        if event["kind"] == "escrow.returned":
            ended[event["entity"]] = json.loads(event["payload"]).get("head")
    chains: dict[str, list[Mapping[str, Any]]] = {}
    for event in state["escrow_events"]:
        chains.setdefault(event["mission_id"], []).append(event)
    named = set(chains) | {
        r["slice_id"] for t in ("escrow_accounts", "escrow_holds") for r in state[t]
    }
    if named - set(lent):
        raise _refuse(
            "foreign_record",
            f"escrow records of slices the mission did not lend: {sorted(named - set(lent))}",
        )
    for slice_id, row in lent.items():
        if row["status"] != "returned":
            raise _refuse(
                "escrow", f"escrow slice {slice_id} is {row['status']}: only returned slices travel"
            )
        head = ChainHead(row["audit_seq"], row["audit_hash"], row["audit_legacy_seq"])
        result = verify_events(slice_id, chains.get(slice_id, []), head)
        if not result.ok:
            raise _refuse(
                "chain_broken",
                f"escrow slice {slice_id}'s chain breaks at event {result.broken_at}: "
                f"{result.problem}",
                seq=result.broken_at,
            )
        if ended.get(slice_id) != [row["audit_seq"], row["audit_hash"]]:
            raise _refuse(
                "escrow",
                f"escrow slice {slice_id}'s chain does not end where the mission's chain "
                "took it back",
            )
