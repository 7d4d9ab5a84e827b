"""The desk's ledger and audit pages read bounded pages, never a mission's whole
history: the audit page shows the newest page of a chain's events (older ones a
link away) and verifies every chain only when asked; the ledger page checks
the ledger only when asked."""

from __future__ import annotations

import re
from collections.abc import Iterator
from typing import Any

import pytest

import _desk
import charter
from charter.server import pages
from charter.storage import Tx
from charter.testing import RecordingAdapter
from conftest import Principals, default_contract


@pytest.fixture
def who(desk: charter.Engine, creds: tuple[dict[str, str], dict[str, str]]) -> Principals:
    return Principals(creds[0], creds[1], desk)


@pytest.fixture
def base(desk: charter.Engine) -> Iterator[str]:
    with _desk.serving(desk) as url:
        yield url


def busy(desk: charter.Engine, who: Principals, runs: int = 25) -> str:
    """A mission with ``runs`` finished payments: a long chain and many entries."""
    mission = desk.create_mission(default_contract(), by=who.alice)
    for n in range(runs):
        desk.start_run(
            mission,
            by=who.agent,
            segment_id="s1",
            plan=_desk.pay_plan,
            input={"to": n, "amount": 1},
        ).execute()
    return mission


class Rows:
    """Counts the rows every statement of the store brings back while it is on."""

    def __init__(self, monkeypatch: pytest.MonkeyPatch) -> None:
        self.read = 0
        real = Tx.all

        def counting(tx: Tx, sql: str, *params: Any) -> Any:
            found = real(tx, sql, *params)
            self.read += len(found)
            return found

        monkeypatch.setattr(Tx, "all", counting)


def test_the_audit_page_reads_a_page_of_events_and_verifies_only_when_asked(
    desk: charter.Engine,
    who: Principals,
    base: str,
    creds: tuple[dict[str, str], dict[str, str]],
    monkeypatch: pytest.MonkeyPatch,
) -> None:
    """Broken: every visit to the audit page verified every chain, reading every
    event the store holds; under load one visit held a server's reading thread for
    most of a second. Its older-events link must page without skipping."""
    from test_console import browse, sign_in

    mission = busy(desk, who)
    chain = [e["seq"] for e in desk.audit_events(mission)]
    assert len(chain) > 150
    monkeypatch.setattr(pages, "TIMELINE_ROWS", 20)
    with browse(base) as http:
        sign_in(http, creds[0]["alice"])
        rows = Rows(monkeypatch)
        html = http.get(f"/console/audit?mission={mission}").text
        assert rows.read < 60, rows.read
        assert "verify every chain" in html and "every chain verifies" not in html
        shown: list[list[int]] = []
        url: str | None = f"/console/audit?mission={mission}"
        while url is not None:
            page = http.get(url).text
            shown.insert(
                0, [int(s) for s in re.findall(r'<tr class="[^"]*" data-seq="(\d+)">', page)]
            )
            older = re.search(r'href="(/console/audit\?[^"]+)">older events', page)
            url = older.group(1).replace("&amp;", "&") if older else None
        verified = http.get(f"/console/audit?mission={mission}&verify=1").text
        missing = http.get("/console/audit?mission=msn_nothing")
    assert shown[-1] == chain[-20:] and [s for p in shown for s in p] == chain
    assert "every chain verifies" in verified
    assert missing.status_code == 404


def test_the_ledger_page_checks_the_ledger_only_when_asked(
    desk: charter.Engine,
    who: Principals,
    base: str,
    creds: tuple[dict[str, str], dict[str, str]],
    monkeypatch: pytest.MonkeyPatch,
) -> None:
    """Broken: every visit to the ledger page checked the ledger, reading every
    entry of the mission (a quarter of a second with 10,000 runs); the chart
    reads a window of the newest entries (test_console)."""
    from test_console import browse, sign_in

    mission = busy(desk, who)
    assert len(desk.ledger_entries(mission)) > 100
    checks: list[str] = []
    real = desk.check_ledger

    def counted(mission_id: str) -> list[str]:
        checks.append(mission_id)
        return real(mission_id)

    monkeypatch.setattr(desk, "check_ledger", counted)
    with browse(base) as http:
        sign_in(http, creds[0]["alice"])
        html = http.get(f"/console/ledger?mission={mission}").text
        assert checks == []
        checked = http.get(f"/console/ledger?mission={mission}&check=1").text
    assert checks == [mission]
    assert 'id="check-ledger"' in html and "ledger check: <span" not in html
    assert 'ledger check: <span class="ok">ok</span>' in checked


def test_K3_the_runs_that_wait_for_a_person_are_read_by_index_whatever_else_ran(
    desk: charter.Engine, who: Principals, store_url: str
) -> None:
    """Broken: the inbox read each status by scanning every run the store held, so
    with 10,000 finished runs it cost 9 ms a visit, the most of any desk page. On
    SQLite only (asking for ``store_url`` says so): it counts SQLite's virtual
    machine steps, and SQLite's planner is the one that needs telling which index."""
    mission = desk.create_mission(default_contract(allowance={"calls": 1}), by=who.alice)
    paused = desk.start_run(mission, by=who.agent, segment_id="s1")
    recorder = RecordingAdapter()
    paused.perform(recorder, "read", {}, effect_key="first")
    with pytest.raises(charter.errors.AdmissionRefused):  # the allowance is spent: paused
        paused.perform(recorder, "read", {}, effect_key="second")
    conn = desk._db.driver._conn  # type: ignore[attr-defined]
    steps = [0]

    def count() -> int:
        steps[0] += 1
        return 0

    def cost() -> tuple[int, list[str]]:
        steps[0] = 0
        conn.set_progress_handler(count, 1)
        try:
            found = [r.id for r in desk.runs_needing_people()]
        finally:
            conn.set_progress_handler(None, 1)
        return steps[0], found

    alone, found = cost()
    assert found == [paused.run_id]
    busy(desk, who, runs=30)
    assert cost() == (alone, found)


def test_the_index_of_runs_waiting_for_a_person_exists_after_migrating(
    desk: charter.Engine, raw: Any
) -> None:
    names = {str(r.get("name") or r.get("indexname")) for r in raw.dump()["schema"]}
    assert "runs_need_people" in names


def test_a_read_of_no_waiting_runs_is_refused(desk: charter.Engine) -> None:
    """Bad input: a limit under one is a usage error."""
    for bad in (0, -1, True):
        with pytest.raises(charter.UsageError, match="limit"):
            desk.runs_needing_people(limit=bad)
