"""Finding things on the desk: runs and attempts by a business key (an effect key,
a value in a request such as an invoice number or a payee, an ID or its prefix),
from the engine (:meth:`charter.Engine.search`), the API (``GET /search``) and the
console (``/console/search``); bad text is refused and changes nothing.
"""

from __future__ import annotations

import re
from collections.abc import Iterator
from typing import Any

import httpx
import pytest

import _desk
import charter
from charter.engine import overview
from charter.testing import ManualClock
from conftest import Principals, default_contract, stored


@charter.node
def pay_invoice(ctx: charter.Context, value: Any) -> Any:
    request = {"invoice": value["invoice"], "payee": value["payee"], "amount": value["amount"]}
    return ctx.attempt(_desk.ADAPTER, "write", request, key=f"pay-{value['invoice']}")


invoice_plan = charter.Plan("invoice", (pay_invoice,), ref="test_search:invoice_plan")


@pytest.fixture
def who(desk: charter.Engine, creds: tuple[dict[str, str], dict[str, str]]) -> Principals:
    return Principals(creds[0], creds[1], desk)


def paid(desk: charter.Engine, who: Principals, mission: str, invoice: str, payee: str) -> str:
    """A finished run paying one invoice; its ID."""
    ex = desk.start_run(
        mission,
        by=who.agent,
        segment_id="s1",
        plan=invoice_plan,
        input={"invoice": invoice, "payee": payee, "amount": 1},
    )
    ex.execute()
    return ex.run_id


def invoices(
    desk: charter.Engine, who: Principals, clock: ManualClock
) -> tuple[str, dict[str, str]]:
    """A mission with four invoices paid a second apart (IDs sort by their
    millisecond); the runs by invoice number."""
    mission = desk.create_mission(default_contract(), by=who.alice)
    payees = {"INV-2041": "acme", "INV-2042": "globex", "INV-3001": "acme", "INV-3002": "initech"}
    runs = {}
    for invoice, payee in payees.items():
        clock.advance(1)
        runs[invoice] = paid(desk, who, mission, invoice, payee)
    return mission, runs


def test_search_finds_a_payment_by_a_request_field_an_effect_key_and_an_id(
    desk: charter.Engine, who: Principals, clock: ManualClock
) -> None:
    """Broken: a request's values, an effect key or an ID prefix find nothing (or
    another run's attempt), or the match does not say which field held it."""
    _, runs = invoices(desk, who, clock)
    found = desk.search("inv-2041")["items"]
    assert [(f["kind"], f["run_id"]) for f in found] == [("attempt", runs["INV-2041"])]
    assert found[0]["matched"] == "request.invoice"
    assert found[0]["effect_key"].endswith("pay-INV-2041") and found[0]["status"] == "succeeded"
    by_key = desk.search("pay-INV-3002")["items"]
    assert [(f["run_id"], f["matched"]) for f in by_key] == [(runs["INV-3002"], "effect_key")]
    acme = desk.search("acme")["items"]
    assert [f["run_id"] for f in acme] == [runs["INV-3001"], runs["INV-2041"]]  # newest first
    assert {f["matched"] for f in acme} == {"request.payee"}
    run_id = runs["INV-2042"]
    by_prefix = desk.search(run_id[:-3])["items"]
    assert {"kind": "run", "id": run_id} in [{k: f[k] for k in ("kind", "id")} for f in by_prefix]
    attempt = desk.attempts(run_id=run_id)[0]
    assert [f["id"] for f in desk.search(attempt.id)["items"]] == [attempt.id]
    assert desk.search("nothing-like-this")["items"] == []


def test_search_reads_a_bounded_window_and_pages_on(
    desk: charter.Engine,
    who: Principals,
    clock: ManualClock,
    monkeypatch: pytest.MonkeyPatch,
) -> None:
    """Broken: a search reads every attempt the store holds, or its ``next`` cursor
    skips or repeats a match."""
    monkeypatch.setattr(overview, "SEARCH_SCAN", 3)
    _, runs = invoices(desk, who, clock)
    page = desk.search("inv")
    assert page["scanned"] == 3 and len(page["items"]) == 3 and page["next"] is not None
    seen = [f["run_id"] for f in page["items"]]
    while page["next"] is not None:
        page = desk.search("inv", before=page["next"])
        seen += [f["run_id"] for f in page["items"]]
    assert seen == list(reversed(runs.values()))
    first = desk.search("inv", limit=1)
    second = desk.search("inv", limit=1, before=first["next"])
    assert [f["run_id"] for f in first["items"] + second["items"]] == seen[:2]


@pytest.mark.parametrize(
    ("text", "code"),
    [
        ("", "usage_error"),
        ("   ", "usage_error"),
        ("inv\0", "text_refused"),
        ("x" * 201, "usage_error"),
    ],
)
def test_a_bad_search_is_refused_and_changes_nothing(
    desk: charter.Engine, who: Principals, clock: ManualClock, text: str, code: str
) -> None:
    """Bad input: an empty text, a NUL or a text longer than a key is a typed error."""
    mission, _ = invoices(desk, who, clock)
    before = stored(desk, mission), desk.audit_events(mission)
    with pytest.raises(charter.UsageError) as refused:
        desk.search(text)
    assert refused.value.code == code
    with pytest.raises(charter.UsageError, match="before"):
        desk.search("inv", before="run_x")
    assert (stored(desk, mission), desk.audit_events(mission)) == before


# -- the API and the console ----------------------------------------------------------------


@pytest.fixture
def base(desk: charter.Engine) -> Iterator[str]:
    with _desk.serving(desk) as url:
        yield url


def test_the_api_searches_with_a_credential_and_refuses_bad_text(
    desk: charter.Engine,
    who: Principals,
    clock: ManualClock,
    base: str,
    creds: tuple[dict[str, str], dict[str, str]],
) -> None:
    """Broken: ``GET /search`` answers without a credential, misses a request value, or
    answers bad text with anything but a 400 naming it."""
    mission, runs = invoices(desk, who, clock)
    before = stored(desk, mission)
    auth = {"Authorization": f"Bearer {creds[0]['alice']}"}
    with httpx.Client(base_url=base) as http:
        anonymous = http.get("/api/v1/search", params={"q": "INV-3001"})
        found = http.get("/api/v1/search", params={"q": "INV-3001"}, headers=auth).json()
        empty = http.get("/api/v1/search", params={"q": ""}, headers=auth)
        nul = http.get("/api/v1/search", params={"q": "a\0b"}, headers=auth)
    assert anonymous.status_code == 401
    assert [f["run_id"] for f in found["items"]] == [runs["INV-3001"]]
    assert found["next"] is None
    assert empty.status_code == 400 and empty.json()["error"]["code"] == "usage_error"
    assert nul.status_code == 400 and nul.json()["error"]["code"] == "text_refused"
    assert stored(desk, mission) == before


def test_the_console_search_lists_matches_linking_to_their_runs(
    desk: charter.Engine,
    who: Principals,
    clock: ManualClock,
    base: str,
    creds: tuple[dict[str, str], dict[str, str]],
) -> None:
    """Broken: the search page needs no sign-in, shows another run's payment, or its
    matches do not link to their run pages; bad text is not shown as a refusal."""
    from test_console import browse, sign_in

    _, runs = invoices(desk, who, clock)
    with browse(base) as http:
        assert "/console/login" in str(http.get("/console/search?q=INV-2042").url)
        sign_in(http, creds[0]["alice"])
        html = http.get("/console/search", params={"q": "INV-2042"}).text
        refused = http.get("/console/search", params={"q": "x" * 300})
    links = set(re.findall(r'href="/console/runs/(run_[0-9a-z]+)"', html))
    assert links == {runs["INV-2042"]}
    assert "pay-INV-2042" in html and "request.invoice" in html
    assert refused.status_code == 400 and "at most 200 characters" in refused.text
