"""A chain's books on the row of its head (schema 23): the balances admission
decides on (L3) and the entries that make them (L2) move in one statement.

Breaking this looks like an admission decided on books the store no longer
holds (a copy a networked store remembered, while another process moved them),
or books moved by a transaction that appends no event to carry the entries.
"""

from __future__ import annotations

import json

import pytest

import charter
from _raw import RawStore
from charter.testing import RecordingAdapter
from conftest import Principals, default_contract


def _books(raw: RawStore, mission: str) -> dict[str, list[int]]:
    [row] = raw.rows("SELECT books FROM missions WHERE id = ?", mission)
    found: dict[str, list[int]] = json.loads(row["books"])
    return found


def test_L3_admission_decides_on_the_books_the_store_holds_not_a_remembered_copy(
    engine: charter.Engine, who: Principals, adapter: RecordingAdapter, raw: RawStore
) -> None:
    """Another process spends what is left between two admissions of one run; on
    PostgreSQL the engine remembers the books from its last commit, and must not
    admit on that copy (L3)."""
    mission = engine.create_mission(
        default_contract(allowance={"usd": 10_000, "calls": 100}), by=who.alice
    )
    ex = engine.start_run(mission, by=who.agent, segment_id="seg-1")
    ex.perform(adapter, "write", {"n": 1}, effect_key="first")
    assert engine.balances(mission)["usd"].available == 5_000
    books = _books(raw, mission)
    limit, available, held, spent, overrun = books["usd"]
    books["usd"] = [limit, 0, held, spent + available, overrun]
    raw.execute("UPDATE missions SET books = ? WHERE id = ?", json.dumps(books), mission)
    sent = len(adapter.sent)

    with pytest.raises(charter.AllowanceExceeded):
        ex.perform(adapter, "write", {"n": 2}, effect_key="second")
    assert len(adapter.sent) == sent
    assert _books(raw, mission) == books
    assert [a.effect_key for a in engine.attempts(mission_id=mission)] == ["first"]


def test_L2_books_move_only_with_an_event_on_their_chain(
    engine: charter.Engine, mission: str, raw: RawStore
) -> None:
    """A move staged by a transaction that appends nothing to the chain is refused
    at commit, and nothing of the transaction is written."""
    books, head = _books(raw, mission), raw.heads()[mission]
    with (
        pytest.raises(charter.StoreError, match="L2"),
        engine._db.transaction(gate=mission) as tx,
    ):
        tx.run("UPDATE missions SET name = 'moved' WHERE id = ?", mission)
        tx.move_books(mission, {"usd": (0, -1, 0, 1, 0)})
    assert (_books(raw, mission), raw.heads()[mission]) == (books, head)
    assert engine.mission(mission).name != "moved"
