"""Finding things from the command line: ``charter runs --status``, the effect key
in ``charter attempts``, ``charter search`` and ``charter audit log`` (the audit
timeline a page at a time, newest page first, as the API pages a run's)."""

from __future__ import annotations

from collections.abc import Callable
from typing import Any

import pytest

import charter
from charter.testing import ManualClock, RecordingAdapter
from conftest import Principals, stored

Cli = Callable[..., tuple[int, Any]]


def two_runs(
    engine: charter.Engine, who: Principals, mission: str, adapter: RecordingAdapter
) -> tuple[str, str]:
    """A run that paid invoice INV-7 and ended completed, and one still active."""
    done = engine.start_run(mission, by=who.agent, segment_id="s1")
    done.perform(adapter, "write", {"invoice": "INV-7", "payee": "acme"}, effect_key="pay-INV-7")
    done.finish()
    active = engine.start_run(mission, by=who.agent, segment_id="s2")
    active.perform(adapter, "read", {"invoice": "INV-8"}, effect_key="look-INV-8")
    return done.run_id, active.run_id


def test_cli_runs_filters_by_status_as_the_api_does(
    engine: charter.Engine,
    who: Principals,
    mission: str,
    adapter: RecordingAdapter,
    store_address: str,
    cli: Cli,
) -> None:
    """Broken: ``charter runs`` has no ``--status`` (or ignores it), or a status that
    does not exist is anything but a usage error naming the statuses."""
    done, active = two_runs(engine, who, mission, adapter)
    store = ["--store", store_address]
    code, page = cli("runs", "--status", "completed", *store, "--json")
    assert code == 0 and [r["id"] for r in page["items"]] == [done]
    code, page = cli("runs", "--status", "active", "--mission", mission, *store, "--json")
    assert code == 0 and [r["id"] for r in page["items"]] == [active]
    before = stored(engine, mission)
    code, refused = cli("runs", "--status", "finished", *store, "--json")
    assert code == 2 and refused["error"]["code"] == "usage_error"
    assert "completed" in refused["error"]["message"]
    assert stored(engine, mission) == before


def test_cli_attempts_shows_the_effect_key(
    engine: charter.Engine,
    who: Principals,
    mission: str,
    adapter: RecordingAdapter,
    store_address: str,
    cli: Cli,
) -> None:
    """Broken: ``charter attempts`` leaves out the effect key an operator knows a payment by."""
    done, _ = two_runs(engine, who, mission, adapter)
    code, text = cli("attempts", "--run", done, "--store", store_address)
    header, row = text.strip().splitlines()[:2]
    assert code == 0 and "EFFECT_KEY" in header and "pay-INV-7" in row


def test_cli_search_finds_a_payment_by_a_request_value(
    engine: charter.Engine,
    who: Principals,
    mission: str,
    adapter: RecordingAdapter,
    store_address: str,
    cli: Cli,
) -> None:
    """Broken: ``charter search`` misses a request's value or shows another run's attempt;
    an empty text is not a usage error."""
    done, _ = two_runs(engine, who, mission, adapter)
    code, found = cli("search", "INV-7", "--store", store_address, "--json")
    assert code == 0 and [(f["run_id"], f["matched"]) for f in found["items"]] == [
        (done, "request.invoice")
    ]
    code, text = cli("search", "inv-7", "--store", store_address)
    assert code == 0 and done in text and "request.invoice" in text
    code, refused = cli("search", " ", "--store", store_address, "--json")
    assert code == 2 and refused["error"]["code"] == "usage_error"


def _pages(cli: Cli, store: list[str], *scope: str) -> list[list[int]]:
    """Every page of ``charter audit log`` with 3 events a page, newest page first."""
    pages: list[list[int]] = []
    before: list[str] = []
    for _ in range(100):
        code, page = cli("audit", "log", *scope, *store, "--limit", "3", *before, "--json")
        assert code == 0, page
        seqs = [e["seq"] for e in page["items"]]
        assert len(seqs) <= 3 and seqs == sorted(seqs)
        pages.append(seqs)
        if page["next"] is None:
            return pages
        before = ["--before", page["next"]]
    pytest.fail("paging did not end")


def test_S1_cli_audit_log_pages_a_run_and_a_mission_newest_page_first(
    engine: charter.Engine,
    who: Principals,
    mission: str,
    adapter: RecordingAdapter,
    store_address: str,
    cli: Cli,
) -> None:
    """Broken: ``charter audit log`` prints a whole chain at once, its ``--before``
    skips or repeats events, or a run's log shows another run's events."""
    done, active = two_runs(engine, who, mission, adapter)
    store = ["--store", store_address]
    run_pages = _pages(cli, store, "--run", done)
    assert [s for p in reversed(run_pages) for s in p] == [e["seq"] for e in engine.timeline(done)]
    assert run_pages[0] == [e["seq"] for e in engine.timeline(done)][-3:]
    mission_pages = _pages(cli, store, "--mission", mission)
    everything = [e["seq"] for e in engine.audit_events(mission)]
    assert [s for p in reversed(mission_pages) for s in p] == everything
    assert len(mission_pages) > len(run_pages) and len(everything) > 6

    code, text = cli("audit", "log", "--run", done, *store, "--limit", "50")
    lines = text.strip().splitlines()
    assert code == 0 and lines[0].split()[:6] == [
        "SEQ",
        "TIME",
        "ACTOR",
        "KIND",
        "ENTITY",
        "CHANGE",
    ]
    assert active not in text and done in text
    completed = next(line for line in lines if "run.status" in line and "->completed" in line)
    assert "2026-01-01" in completed and "agent" in completed


def test_cli_audit_log_tells_how_to_read_the_older_page(
    engine: charter.Engine,
    who: Principals,
    mission: str,
    adapter: RecordingAdapter,
    store_address: str,
    cli: Cli,
) -> None:
    done, _ = two_runs(engine, who, mission, adapter)
    code, page = cli(
        "audit", "log", "--run", done, "--limit", "2", "--store", store_address, "--json"
    )
    code, text = cli("audit", "log", "--run", done, "--limit", "2", "--store", store_address)
    assert code == 0 and text.strip().splitlines()[-1].endswith(f"--before {page['next']})")


@pytest.mark.parametrize(
    ("args", "status", "code"),
    [
        (["audit", "log", "--before", "0"], 2, "usage_error"),
        (["audit", "log", "--limit", "0"], 2, "usage_error"),
        (["audit", "log", "--run", "RUN", "--mission", "MISSION"], 2, "usage_error"),
        (["audit", "verify", "--run", "RUN"], 2, "usage_error"),
        (["audit", "log", "--mission", "msn_nothing"], 1, "not_found"),
        (["audit", "log", "--run", "run_nothing"], 1, "not_found"),
    ],
)
def test_cli_audit_log_bad_input_is_a_typed_error_and_changes_nothing(
    engine: charter.Engine,
    who: Principals,
    mission: str,
    adapter: RecordingAdapter,
    store_address: str,
    cli: Cli,
    clock: ManualClock,
    args: list[str],
    status: int,
    code: str,
) -> None:
    done, _ = two_runs(engine, who, mission, adapter)
    named = {"RUN": done, "MISSION": mission}
    before = stored(engine, mission), engine.audit_events(mission)
    answer, refused = cli(*[named.get(a, a) for a in args], "--store", store_address, "--json")
    assert (answer, refused["error"]["code"]) == (status, code)
    assert (stored(engine, mission), engine.audit_events(mission)) == before


def test_the_engine_refuses_a_bad_audit_page(engine: charter.Engine, mission: str) -> None:
    """Bad input: a page of no events, or before no event, is a usage error."""
    for bad in ({"limit": 0}, {"before": 0}, {"limit": True}):
        with pytest.raises(charter.UsageError):
            engine.audit_events(mission, **bad)
