"""The console in a real browser: headless Chromium (the system's ``chromium``)
driven by Playwright, against the real server over a test engine.

Under ``CI=true`` these tests must run: a missing browser fails them. Elsewhere
they are skipped, saying why, when no ``chromium`` is installed. The screenshots
in docs/console.md are taken here.
"""

from __future__ import annotations

import os
import shutil
import threading
import time
from collections.abc import Iterator
from pathlib import Path
from typing import Any

import pytest

import _desk
import charter
from conftest import Principals

CHROMIUM = os.environ.get("CHARTER_TEST_CHROMIUM") or shutil.which("chromium")
#: Screenshots go to docs/ (the ones docs/console.md shows) when this is set, else
#: to the test's temporary directory, so a test run leaves the checkout as it was.
SCREENSHOTS = os.environ.get("CHARTER_DOCS_SCREENSHOTS")
if CHROMIUM is None:
    if os.environ.get("CI") == "true":
        raise RuntimeError("CI=true but no chromium: install the Debian package `chromium`")
    pytest.skip("no chromium installed (apt-get install chromium)", allow_module_level=True)

sync_api = pytest.importorskip("playwright.sync_api")

CONTRACT: dict[str, Any] = {
    "objective": "pay this week's invoices",
    "principals": {
        "agent": {"run": ["recorder.*"]},
        "alice": {
            "run": ["recorder.*"],
            "approve": ["recorder.*"],
            "resolve": ["recorder.*"],
            "stop": ["*"],
        },
        "mallory": ["consume"],
    },
    "allowance": {"usd": 1_000_000, "calls": 100},
}
GATED = {**CONTRACT, "approvals": {"required": ["recorder.write"], "ttl_seconds": 900}}


@pytest.fixture
def who(desk: charter.Engine, creds: tuple[dict[str, str], dict[str, str]]) -> Principals:
    return Principals(creds[0], creds[1], desk)


@pytest.fixture
def page(desk: charter.Engine) -> Iterator[Any]:
    with _desk.serving(desk) as base, sync_api.sync_playwright() as pw:
        browser = pw.chromium.launch(executable_path=CHROMIUM, args=["--no-sandbox"])
        context = browser.new_context(base_url=base, viewport={"width": 1200, "height": 900})
        context.set_default_timeout(15_000)
        tab = context.new_page()
        yield tab
        browser.close()


def shot(page: Any, name: str, tmp_path: Path) -> None:
    where = Path(__file__).resolve().parent.parent / "docs" if SCREENSHOTS else tmp_path
    page.screenshot(path=str(where / f"console-{name}.png"), full_page=True)


def sign_in(page: Any, credential: str) -> None:
    page.goto("/console/inbox")
    page.fill("input[name=credential]", credential)
    page.click("button:has-text('Sign in')")
    page.wait_for_selector("#me")


def start(desk: charter.Engine, who: Principals, contract: dict[str, Any]) -> str:
    mission = desk.create_mission(contract, by=who.alice)
    ex = desk.start_run(
        mission,
        by=who.agent,
        segment_id="worker-1",
        plan=_desk.pay_plan,
        input={"to": "ACME Corp", "amount": 4200},
    )
    with pytest.raises(charter.Blocked):
        ex.execute()
    return ex.run_id


def test_W2_operator_approves_the_exact_request_in_the_inbox_and_the_run_completes(
    desk: charter.Engine,
    who: Principals,
    page: Any,
    creds: tuple[dict[str, str], dict[str, str]],
    tmp_path: Path,
) -> None:
    """Broken W2 in the console: the inbox does not show the request the approval is
    bound to, approving there does not let the waiting run go on, or the run page
    does not follow it to the end."""
    run_id = start(desk, who, GATED)
    [approval] = desk.approvals(pending=True)

    def agent() -> None:  # the worker: carries on once someone has decided
        deadline = time.monotonic() + 20
        while desk.approval(approval.id).status.value == "pending":
            if time.monotonic() > deadline:
                return
            time.sleep(0.05)
        desk.coordinator.resume(run_id, "worker-1", by=who.agent).execute()

    worker = threading.Thread(target=agent, daemon=True)
    worker.start()
    sign_in(page, creds[0]["alice"])
    card = page.locator(f"#{approval.id}")
    assert "ACME Corp" in card.locator("pre.request").inner_text()
    assert "4200" in card.inner_text() and "5000 usd" in card.inner_text()
    shot(page, "inbox", tmp_path)
    card.get_by_role("button", name="Approve").click()
    page.wait_for_selector("text=Approve a pending approval: approved")
    worker.join(15)
    page.goto(f"/console/runs/{run_id}")
    page.wait_for_selector("#run-status:text-is('completed')")
    assert desk.run(run_id).status is charter.RunStatus.COMPLETED
    assert [s.request for s in _desk.ADAPTER.sent] == [{"to": "ACME Corp", "amount": 4200}]


def test_R7_lost_response_is_reconciled_confirmed_and_the_run_finishes_from_the_queue(
    desk: charter.Engine,
    who: Principals,
    page: Any,
    creds: tuple[dict[str, str], dict[str, str]],
    tmp_path: Path,
) -> None:
    """Broken R7/R8 in the console: an attempt whose response was lost is missing from
    the queue, reconciling or confirming there does not settle it on the target's
    evidence, or the run cannot finish afterwards."""

    def lost(send: charter.Dispatch) -> charter.Outcome:
        raise TimeoutError("connection reset after the request was sent")

    _desk.ADAPTER.script["write"] = lost
    run_id = start(desk, who, CONTRACT)
    [attempt] = desk.attempts(run_id=run_id)
    sign_in(page, creds[0]["alice"])
    page.goto("/console/queue")
    card = page.locator(f"#{attempt.id}")
    assert "unknown" in card.inner_text()
    assert "reconcile: ask the target" in card.locator(".next").inner_text()
    shot(page, "queue", tmp_path)
    applied = charter.Outcome.succeeded({"paid": True}, cost={"usd": 5_000, "calls": 1})
    _desk.ADAPTER.evidence[attempt.id] = charter.Evidence.applied(applied)
    card.get_by_role("button", name="Reconcile").click()
    page.wait_for_selector("text=for evidence and record it: applied")
    page.locator(f"#{attempt.id}").get_by_role("button", name="Confirm evidence").click()
    page.wait_for_selector("text=on its recorded evidence: succeeded")
    page.goto(f"/console/runs/{run_id}")
    page.get_by_role("button", name="Resume").click()
    page.wait_for_selector("#run-status:text-is('completed')")
    assert desk.get_attempt(attempt.id).status is charter.AttemptStatus.SUCCEEDED
    assert len(_desk.ADAPTER.sent) == 1  # sent once, never again on a guess


def test_P1_principal_without_approve_is_refused_and_the_refusal_is_in_the_timeline(
    desk: charter.Engine,
    who: Principals,
    page: Any,
    creds: tuple[dict[str, str], dict[str, str]],
    tmp_path: Path,
) -> None:
    """Broken P1 in the console: a principal without ``approve`` decides, the refusal
    is not shown, or it is missing from the run's audit timeline."""
    run_id = start(desk, who, GATED)
    [approval] = desk.approvals(pending=True)
    sign_in(page, creds[0]["mallory"])
    page.locator(f"#{approval.id}").get_by_role("button", name="Approve").click()
    refusal = page.wait_for_selector(".note.refused")
    assert refusal is not None and "not_authorized" in refusal.inner_text()
    page.goto(f"/console/runs/{run_id}")
    row = page.locator("#timeline tr.refusal")
    assert "mallory" in row.inner_text() and "authorization.refused" in row.inner_text()
    assert desk.approval(approval.id).status.value == "pending"


def test_R8_operator_finds_an_unknown_payment_reads_its_evidence_resolves_it_and_the_run_goes_on(
    desk: charter.Engine,
    who: Principals,
    page: Any,
    creds: tuple[dict[str, str], dict[str, str]],
    tmp_path: Path,
) -> None:
    """Broken R8 on the desk: a payment is not found by its invoice number, an
    UNKNOWN payment's evidence is not shown as fields, resolving it on the run's
    page does not settle it, the next safe action still says to reconcile or
    resolve, or the page does not follow the run on without a reload (and keeps
    polling once it ended)."""

    def lost(send: charter.Dispatch) -> charter.Outcome:
        raise TimeoutError("connection reset after the request was sent")

    _desk.ADAPTER.script["write"] = lost
    mission = desk.create_mission(CONTRACT, by=who.alice)
    ex = desk.start_run(
        mission,
        by=who.agent,
        segment_id="worker-1",
        plan=_desk.pay_anyway_plan,
        input={"to": "ACME Corp", "amount": 4200, "invoice": "INV-2291"},
    )
    with pytest.raises(charter.Blocked):
        ex.execute()
    run_id = ex.run_id
    [attempt] = desk.attempts(run_id=run_id)
    _desk.ADAPTER.script.clear()
    _desk.ADAPTER.evidence[attempt.id] = charter.Evidence.indeterminate(
        {"invoice": "INV-2291", "bank": "transfer pending at the bank"}
    )
    go = threading.Event()

    def worker() -> None:  # carries the run on once a person settled the payment
        if go.wait(20):
            desk.coordinator.resume(run_id, "worker-1", by=who.agent).execute()

    carrier = threading.Thread(target=worker, daemon=True)
    carrier.start()
    sign_in(page, creds[0]["alice"])
    page.goto("/console/search")  # the operator knows the invoice, not the run
    page.fill("input[name=q]", "INV-2291")
    page.get_by_role("button", name="Search").click()
    found = page.locator("tr.found.attempt")
    assert attempt.id in found.inner_text() and "unknown" in found.inner_text()
    found.get_by_role("link", name=run_id).click()
    page.wait_for_selector(f"#{attempt.id}")
    card = page.locator(f"#{attempt.id}")
    assert "unknown" in card.locator(".status").first.inner_text()
    assert "reconcile: ask the target" in page.locator("#next-step").inner_text()
    card.get_by_role("button", name="Reconcile").click()
    page.wait_for_selector("text=for evidence and record it: indeterminate")
    card = page.locator(f"#{attempt.id}")
    evidence = card.locator(".evidence dl.fields").first
    assert "invoice" in evidence.locator("dt").all_inner_texts()
    assert "INV-2291" in evidence.inner_text()
    assert "evidence is indeterminate" in page.locator("#next-step").inner_text()
    shot(page, "run", tmp_path)
    card.locator("input[name=evidence]").fill("bank statement line 14: INV-2291 paid")
    card.locator("input[name='cost.usd']").fill("5000")
    card.locator("input[name='cost.calls']").fill("1")
    card.get_by_role("button", name="Resolve").click()
    page.wait_for_selector("text=as a person, with evidence: succeeded")
    assert page.locator("#run-status").inner_text() == "needs_intervention"
    assert "is settled: resume the run" in page.locator("#next-step").inner_text()
    page.evaluate("window.stayed = true")  # gone if the page is loaded again
    go.set()
    page.wait_for_selector("#run-status:text-is('completed')")
    assert page.evaluate("window.stayed") is True  # followed without a reload
    assert "never reopened" in page.locator("#next-step").inner_text()
    asked: list[str] = []
    page.on("request", lambda r: asked.append(r.url))
    page.wait_for_timeout(2_500)
    assert not asked  # an ended run's page stops polling
    carrier.join(10)
    assert desk.get_attempt(attempt.id).status is charter.AttemptStatus.SUCCEEDED
    assert len(_desk.ADAPTER.sent) == 1  # sent once, never again on a guess


@pytest.fixture
def wide(desk: charter.Engine) -> Iterator[Any]:
    """A tab 1,280 pixels wide: the width an operator's laptop gives the console."""
    with _desk.serving(desk) as base, sync_api.sync_playwright() as pw:
        browser = pw.chromium.launch(executable_path=CHROMIUM, args=["--no-sandbox"])
        context = browser.new_context(base_url=base, viewport={"width": 1280, "height": 800})
        context.set_default_timeout(15_000)
        yield context.new_page()
        browser.close()


def uncertain(desk: charter.Engine, who: Principals, mission: str, to: str) -> str:
    """A run of ``pay_plan`` whose payment was sent and its answer lost; its attempt."""

    def lost(send: charter.Dispatch) -> charter.Outcome:
        raise TimeoutError("connection reset after the request was sent")

    _desk.ADAPTER.script["write"] = lost
    ex = desk.start_run(
        mission,
        by=who.agent,
        segment_id=f"w-{to}",
        plan=_desk.pay_plan,
        input={"to": to, "amount": 1},
    )
    with pytest.raises(charter.Blocked):
        ex.execute()
    [attempt] = desk.attempts(run_id=ex.run_id)
    return attempt.id


def test_P1_reconcile_all_after_a_confirmation_and_the_desk_fits_1280_pixels(
    desk: charter.Engine,
    who: Principals,
    wide: Any,
    creds: tuple[dict[str, str], dict[str, str]],
) -> None:
    """Broken: the inbox, the queue or the ledger scrolls sideways at 1,280 pixels; or
    "reconcile all" acts without listing what it will do first, or not as one
    decision of the signed-in operator per attempt, each with its outcome shown."""
    dollars = {**GATED, "units": {"usd": {"scale": 2, "name": "USD"}}}
    start(desk, who, dollars)  # an approval waits in the inbox
    mission = desk.create_mission({**CONTRACT, "units": dollars["units"]}, by=who.alice)
    ids = [uncertain(desk, who, mission, to) for to in ("ACME Corp", "Globex Ltd")]
    applied = charter.Outcome.succeeded({"paid": True}, cost={"usd": 5_000, "calls": 1})
    _desk.ADAPTER.evidence[ids[0]] = charter.Evidence.applied(applied)
    sign_in(wide, creds[0]["alice"])
    for path in ("/console/inbox", "/console/queue", f"/console/ledger?mission={mission}"):
        wide.goto(path)
        scroll, width = wide.evaluate(
            "[document.documentElement.scrollWidth, document.documentElement.clientWidth]"
        )
        assert scroll <= width == 1280, (path, scroll, width)
    wide.goto("/console/queue")
    assert "50.00 USD" in wide.locator(f"#{ids[0]}").inner_text()
    wide.click("#reconcile-all")
    wide.wait_for_selector("#confirm-all")
    listed = wide.locator("#confirm-all").inner_text()
    assert all(i in listed for i in ids) and "ACME Corp" not in listed  # IDs and holds
    assert not _desk.ADAPTER.reconciled  # nothing asked before the confirmation
    wide.get_by_role("button", name="Reconcile these 2").click()
    done = wide.wait_for_selector("#reconciled")
    assert done is not None
    rows = {r.split("\t")[0]: r for r in done.inner_text().splitlines()[1:]}
    assert "applied" in rows[ids[0]] and "indeterminate" in rows[ids[1]], rows
    assert sorted(_desk.ADAPTER.reconciled) == sorted(ids)  # each asked once
    for attempt_id in ids:
        run_id = desk.get_attempt(attempt_id).run_id
        assert any(
            (e["actor"], e["kind"]) == ("alice", "evidence.recorded") for e in desk.timeline(run_id)
        )
    assert len(_desk.ADAPTER.sent) == 2  # nothing sent again


def test_operator_finds_a_payment_by_its_invoice_number_and_opens_its_run(
    desk: charter.Engine,
    who: Principals,
    page: Any,
    creds: tuple[dict[str, str], dict[str, str]],
    tmp_path: Path,
) -> None:
    """Broken: the console has no search, a request's value (the invoice number)
    finds nothing or another payment, or a match does not lead to its run's page."""
    mission = desk.create_mission(CONTRACT, by=who.alice)
    runs = {}
    for invoice, payee in (("INV-2041", "ACME Corp"), ("INV-2042", "Globex Ltd")):
        ex = desk.start_run(mission, by=who.agent, segment_id=f"pay-{invoice}")
        request = {"invoice": invoice, "payee": payee, "amount": 4200}
        ex.perform(_desk.ADAPTER, "write", request, effect_key=f"pay-{invoice}")
        ex.finish()
        runs[invoice] = ex.run_id
    sign_in(page, creds[0]["alice"])
    page.click("header a:has-text('Search')")
    page.fill("input[name=q]", "inv-2042")
    page.press("input[name=q]", "Enter")
    found = page.locator("tr.found")
    found.first.wait_for()
    assert found.count() == 1
    row = found.first.inner_text()
    assert "request.invoice" in row and "Globex Ltd" in row and "INV-2041" not in row
    shot(page, "search", tmp_path)
    found.first.locator(f"a:has-text('{runs['INV-2042']}')").click()
    page.wait_for_selector("#run-status:text-is('completed')")
    assert page.url.endswith(f"/console/runs/{runs['INV-2042']}")
    assert "INV-2042" in page.content()
