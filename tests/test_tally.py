"""A run's settled counts (R5) while its settlements write no run row (schema 25).

A settlement marks its attempt as not yet in its run's counts; every
``TALLY_EVERY`` settled attempts of a run, and when the run ends, they are added
to the run's row and marked counted, in one transaction. Breaking it looks like
counts short or counted twice (recovery reports them, a snapshot carries them),
a run row written by every settlement, or an ended run's settled attempts left
in the index of unresolved ones.
"""

from __future__ import annotations

import io
import json
import subprocess
import sys
import tarfile
import threading
import time
from collections import Counter
from pathlib import Path
from typing import Any

import pytest

import charter
from _raw import RawStore
from charter.attempts.settlement import TALLY_EVERY, tally
from charter.audit.signing import load_signer
from charter.ids import IdFactory
from charter.runs.store import SETTLED
from charter.storage import open_database
from charter.testing import ManualClock, RecordingAdapter
from conftest import Principals, default_contract, fresh_store

CHILD = Path(__file__).with_name("_tally_child.py")


def fail(send: charter.Dispatch) -> charter.Outcome:
    return charter.Outcome.failed({"error": "declined"}, cost={"usd": 0, "calls": 1})


def lose(send: charter.Dispatch) -> charter.Outcome:
    raise charter.OutcomeUnknown("cut off", evidence={"seen": send.attempt_id})


def stored(raw: RawStore, run_id: str) -> tuple[Counter[str], Counter[str], Counter[str]]:
    """The run's settled attempts as stored (the truth), its row's counts, and
    the settled attempts its row does not count yet."""
    truth = Counter(
        r["status"]
        for r in raw.rows("SELECT status FROM attempts WHERE run_id = ?", run_id)
        if r["status"] in SETTLED
    )
    [row] = raw.rows(
        "SELECT n_succeeded, n_failed, n_written_off, n_voided FROM runs WHERE id = ?", run_id
    )
    counted = Counter({s: row[f"n_{s}"] for s in SETTLED if row[f"n_{s}"]})
    untallied = Counter(
        r["status"]
        for r in raw.rows("SELECT status FROM attempts WHERE run_id = ? AND tallied = 0", run_id)
        if r["status"] in SETTLED
    )
    return truth, counted, untallied


def test_R5_settlements_write_no_run_row_and_its_counts_stay_whole(
    engine: charter.Engine, who: Principals, mission: str, adapter: RecordingAdapter, raw: RawStore
) -> None:
    ex = engine.start_run(mission, by=who.agent, segment_id="seg-1")
    counted_before: Counter[str] = Counter()
    for n in range(2 * TALLY_EVERY + 6):
        adapter.script.pop("write", None)
        if n % 5 == 4:
            adapter.script["write"] = fail
        ex.perform(adapter, "write", {"n": n}, effect_key=f"e{n}")
        truth, counted, untallied = stored(raw, ex.run_id)
        assert counted + untallied == truth, n
        assert sum(untallied.values()) < TALLY_EVERY
        if (n + 1) % TALLY_EVERY:  # not a tally: the run's row was not written
            assert counted == counted_before, n
        else:  # the settlement that brought them to TALLY_EVERY counted them
            assert not untallied and sum(counted.values()) == n + 1
        counted_before = counted
    assert sum(untallied.values()) == 6
    ex.finish()
    truth, counted, untallied = stored(raw, ex.run_id)
    assert counted == truth == Counter(succeeded=56, failed=14) and not untallied


def test_R5_recovery_reports_the_counts_the_row_has_not_taken_yet(
    engine: charter.Engine,
    who: Principals,
    mission: str,
    adapter: RecordingAdapter,
    raw: RawStore,
    clock: ManualClock,
) -> None:
    ex = engine.start_run(mission, by=who.agent, segment_id="seg-1")
    for n in range(TALLY_EVERY + 8):
        adapter.script.pop("write", None)
        if n % 4 == 0:
            adapter.script["write"] = fail
        ex.perform(adapter, "write", {"n": n}, effect_key=f"e{n}")
    truth, counted, untallied = stored(raw, ex.run_id)
    assert sum(counted.values()) == TALLY_EVERY and sum(untallied.values()) == 8
    clock.advance(60)
    state = engine.coordinator.recover(ex.run_id, "seg-2").state
    assert state.settled_counts == dict(truth) == {"succeeded": 30, "failed": 10}


def test_R5_two_tallies_at_once_count_each_attempt_once(
    engine: charter.Engine,
    who: Principals,
    mission: str,
    adapter: RecordingAdapter,
    raw: RawStore,
    store_address: str,
    clock: ManualClock,
) -> None:
    """Two processes tally one run at the same moment (on PostgreSQL the second
    waits for the first's marks, then finds them taken): each adds what it
    marked, so nothing is counted twice."""
    ex = engine.start_run(mission, by=who.agent, segment_id="seg-1")
    for n in range(10):
        ex.perform(adapter, "write", {"n": n}, effect_key=f"e{n}")
    first, second = (open_database(store_address, clock=clock, ids=IdFactory(clock)) for _ in "ab")
    marked = threading.Event()
    try:

        def tally_then_wait() -> None:
            with first.transaction() as tx:
                tally(tx, ex.run_id)
                marked.set()
                time.sleep(0.5)

        one = threading.Thread(target=tally_then_wait)
        one.start()
        assert marked.wait(10)
        with second.transaction() as tx:
            tally(tx, ex.run_id)
        one.join()
    finally:
        first.close()
        second.close()
    truth, counted, untallied = stored(raw, ex.run_id)
    assert counted == truth == Counter(succeeded=10) and not untallied


@pytest.mark.parametrize(
    ("point", "counted", "untallied"),
    [
        ("settlement.before", 0, TALLY_EVERY - 1),
        ("settlement.after", TALLY_EVERY, 0),
    ],
)
def test_R5_a_process_killed_around_a_tally_leaves_both_or_neither(
    store_address: str,
    creds: tuple[dict[str, str], dict[str, str]],
    engine: charter.Engine,
    who: Principals,
    mission: str,
    raw: RawStore,
    clock: ManualClock,
    tmp_path: Path,
    point: str,
    counted: int,
    untallied: int,
) -> None:
    """Killed just before the commit of the settlement that tallies, or just
    after it: the run's row holds the counts and the attempts are marked, or
    neither is; recovery's counts are the attempts settled either way."""
    config = tmp_path / "child.json"
    config.write_text(
        json.dumps(
            {
                "store": store_address,
                "digests": creds[1],
                "agent": creds[0]["agent"],
                "mission": mission,
                "point": point,
                "nth": TALLY_EVERY,
            }
        )
    )
    child = subprocess.run(
        [sys.executable, str(CHILD), str(config)], capture_output=True, text=True, timeout=120
    )
    assert child.returncode == -9, child.stderr
    run_id = child.stdout.split()[0]
    truth, row, left = stored(raw, run_id)
    assert (sum(row.values()), sum(left.values())) == (counted, untallied)
    assert sum(truth.values()) == counted + untallied
    state = engine.coordinator.recover(run_id, "seg-2").state
    assert state.settled_counts == {"succeeded": counted + untallied}


def test_R5_S2_a_snapshot_carries_whole_counts_and_its_import_counts_each_attempt_once(
    make_engine: Any,
    who: Principals,
    adapter: RecordingAdapter,
    creds: tuple[dict[str, str], dict[str, str]],
    clock: ManualClock,
    tmp_path: Path,
    backend: str,
) -> None:
    key = tmp_path / "key.pem"
    charter.new_signing_key(key)
    source = make_engine(signing_key=str(key))
    agent = Principals(creds[0], creds[1], source)
    mission = source.create_mission(default_contract(), by=agent.alice)
    ex = source.start_run(mission, by=agent.agent, segment_id="seg-1")
    for n in range(TALLY_EVERY + 5):
        ex.perform(adapter, "write", {"n": n}, effect_key=f"e{n}")
    adapter.script["write"] = lose
    lost = ex.perform(adapter, "write", {"n": "lost"}, effect_key="lost")
    assert lost.status is charter.AttemptStatus.UNKNOWN
    data = source.export_snapshot(mission)
    state = snapshot_state(data)
    [run] = state["runs"]
    assert run["n_succeeded"] == TALLY_EVERY + 5
    assert all("tallied" not in a for a in state["attempts"])

    folder = tmp_path / "target"
    folder.mkdir()
    with fresh_store(folder, backend) as url:
        target = charter.Engine.open(
            url,
            config=charter.EngineConfig(
                credentials=creds[1], trusted_keys=(load_signer(str(key)).public_key,)
            ),
            clock=clock,
        )
        try:
            target.import_snapshot(data)
            there = RawStore(url, backend)
            try:
                truth, counted, untallied = stored(there, ex.run_id)
                marks = there.rows("SELECT status, tallied FROM attempts WHERE effect_key = 'lost'")
            finally:
                there.close()
            assert counted == truth == Counter(succeeded=TALLY_EVERY + 5) and not untallied
            # What is still unresolved is not counted yet: settled later, it will be.
            assert marks == [{"status": "unknown", "tallied": 0}]
        finally:
            target.close()


def snapshot_state(data: bytes) -> dict[str, Any]:
    """The ``state.json`` of a snapshot, as exported."""
    with tarfile.open(fileobj=io.BytesIO(data), mode="r:gz") as tar:
        member = tar.extractfile("state.json")
        assert member is not None
        found: dict[str, Any] = json.loads(member.read())
    return found
