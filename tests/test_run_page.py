"""A run's page tells what happened, in order: the run's input, its node
executions with outputs and timings, each attempt's request, evidence and
receipt as fields (long values folded, large ones as hash and size), the
takeovers with their epochs, who decided what, and the next safe action as the
run stands now. It refreshes itself while the run moves and stops once it ended.
"""

from __future__ import annotations

import html
import re
from typing import Any

import pytest

import _desk
import charter
from charter.server import story
from conftest import Principals
from test_console import browse, csrf, sign_in

CONTRACT: dict[str, Any] = {
    "objective": "pay this week's invoices",
    "principals": {
        "agent": {"run": ["recorder.*"]},
        "alice": {"run": ["recorder.*"], "resolve": ["recorder.*"], "stop": ["*"]},
    },
    "allowance": {"usd": 1_000_000, "calls": 100},
    "units": {"usd": {"scale": 2, "name": "USD"}},
}
MEMO = "invoice INV-2291 for the March delivery; " * 8  # longer than a folded line


@pytest.fixture
def who(desk: charter.Engine, creds: tuple[dict[str, str], dict[str, str]]) -> Principals:
    return Principals(creds[0], creds[1], desk)


@pytest.fixture
def base(desk: charter.Engine) -> Any:
    with _desk.serving(desk) as url:
        yield url


def lost(send: charter.Dispatch) -> charter.Outcome:
    raise TimeoutError("connection reset after the request was sent")


def unknown_payment(desk: charter.Engine, who: Principals) -> tuple[str, str]:
    """A run blocked on a payment whose answer was lost: (run ID, attempt ID). Its
    node goes on once the payment is settled, with or without the answer."""
    _desk.ADAPTER.script["write"] = lost
    mission = desk.create_mission(CONTRACT, by=who.alice)
    ex = desk.start_run(
        mission,
        by=who.agent,
        segment_id="worker-1",
        plan=_desk.pay_anyway_plan,
        input={"to": "ACME Corp", "amount": 4200, "memo": MEMO},
    )
    with pytest.raises(charter.Blocked):
        ex.execute()
    [attempt] = desk.attempts(run_id=ex.run_id)
    assert attempt.status is charter.AttemptStatus.UNKNOWN
    _desk.ADAPTER.script.clear()
    return ex.run_id, attempt.id


def element(page: str, ident: str) -> str:
    """The inner HTML of the element with ``id`` ``ident`` (no nested same tag)."""
    found = re.search(rf'<(\w+)[^>]* id="{ident}"[^>]*>(.*?)</\1>', page, re.S)
    assert found is not None, f"no #{ident} on the page"
    return found.group(2)


def header(page: str) -> str:
    """The run's status card: everything before its input."""
    return page.split('id="live"', 1)[1].split("<h2>Input</h2>", 1)[0]


def test_R8_after_a_resolve_the_next_safe_action_is_resume_not_reconcile_or_resolve(
    desk: charter.Engine, base: str, who: Principals, creds: tuple[dict[str, str], dict[str, str]]
) -> None:
    """Broken: once a person resolved the attempt the run stopped on, the run page
    still said what the run recorded when it stopped ("attempt … is unknown:
    reconcile or resolve it"): the status reason stays on the run until it is
    resumed, and the page showed it as if it were still the thing to do."""
    run_id, attempt_id = unknown_payment(desk, who)
    with browse(base) as http:
        sign_in(http, creds[0]["alice"])
        page = http.get(f"/console/runs/{run_id}").text
        step = html.unescape(element(page, "next-step"))
        assert step.startswith(f"attempt {attempt_id} is unknown: reconcile: ask the target")
        page = http.post(
            f"/console/attempts/{attempt_id}/resolve",
            data={
                "csrf": csrf(page),
                "back": f"/console/runs/{run_id}",
                "outcome": "succeeded",
                "evidence": "bank statement line 14 shows INV-2291 paid",
                "cost.usd": "5000",
                "cost.calls": "1",
            },
        ).text
        assert desk.run(run_id).status_reason == (
            f"attempt {attempt_id} is unknown: reconcile or resolve it"
        )  # still recorded on the run: the page must not read it as the next step
        assert element(page, "next-step") == f"attempt {attempt_id} is settled: resume the run"
        assert "reconcile or resolve it" not in header(page)
        page = http.post(
            f"/console/runs/{run_id}/resume",
            data={"csrf": csrf(page), "back": f"/console/runs/{run_id}"},
        ).text
        assert element(page, "run-status") == "completed"
        assert element(page, "next-step").startswith("the run completed: it is never reopened")
    assert desk.get_attempt(attempt_id).status is charter.AttemptStatus.SUCCEEDED
    assert [s.request["to"] for s in _desk.ADAPTER.sent] == ["ACME Corp"]  # sent once


def test_an_attempts_request_evidence_and_receipt_are_fields_not_json(
    desk: charter.Engine, base: str, who: Principals, creds: tuple[dict[str, str], dict[str, str]]
) -> None:
    """Broken: the page shows an attempt's request, evidence or receipt as a JSON
    blob, or a long value unfolded."""
    run_id, attempt_id = unknown_payment(desk, who)
    found = charter.Outcome.succeeded(
        {"paid": True}, cost={"usd": 5_000, "calls": 1}, receipt={"bank_ref": "TX-88213"}
    )
    _desk.ADAPTER.evidence[attempt_id] = charter.Evidence.applied(
        found, detail={"invoice": "INV-2291", "state": "paid"}
    )
    desk.coordinator.reconcile(attempt_id, _desk.ADAPTER, by=who.alice)
    desk.coordinator.confirm(attempt_id, by=who.alice)
    with browse(base) as http:
        sign_in(http, creds[0]["alice"])
        page = http.get(f"/console/runs/{run_id}").text
    card = page.split(f'id="{attempt_id}"', 1)[1].split("<h2>Waits</h2>", 1)[0]
    assert "<dt>to</dt><dd>ACME Corp</dd>" in card and "<dt>amount</dt><dd>4200</dd>" in card
    assert "<dt>invoice</dt><dd>INV-2291</dd>" in card  # the evidence's detail
    assert "<dt>bank_ref</dt><dd>TX-88213</dd>" in card  # the receipt, and the outcome's
    assert "<strong>applied</strong> · settled it" in card
    assert "<dt>estimate</dt><dd>1 calls, 50.00 USD</dd>" in card  # the contract's units
    assert "{&quot;" not in card and '{"' not in card  # no record shown as JSON text
    memo = element(page, "run-input")
    assert "<details><summary>" in memo and MEMO in html.unescape(memo)  # folded, whole inside


def test_nodes_show_output_hash_and_timings_and_the_takeovers_their_epochs(
    desk: charter.Engine, base: str, who: Principals, creds: tuple[dict[str, str], dict[str, str]]
) -> None:
    """Broken: a node's output, its hash or its timings are missing, a takeover is
    not shown with the epoch it left the run at, or a person's decision is not
    named with who made it."""
    run_id, attempt_id = unknown_payment(desk, who)
    desk.coordinator.recover(run_id, "worker-2", force=True, by=who.alice)
    desk.coordinator.resolve(
        attempt_id, by=who.alice, outcome="succeeded", evidence="paid", cost={"usd": 5_000}
    )
    desk.coordinator.resume(run_id, "worker-2", by=who.agent).execute()
    [node] = desk.node_executions(run_id)
    assert node.status == "completed" and node.completed_at_us is not None
    with browse(base) as http:
        sign_in(http, creds[0]["alice"])
        page = http.get(f"/console/runs/{run_id}").text
    row = page.split('data-node="pay_anyway"', 1)[1].split("</tr>", 1)[0]
    assert "completed" in row and f"sha256 {node.result_hash}" in row
    took = story.took(node.started_at_us, node.completed_at_us)
    assert f"<td>{took}</td>" in row
    takeovers = element(page, "takeovers")
    assert "run.recovered" in takeovers and "<td>alice</td>" in takeovers
    assert desk.run(run_id).epoch == 2 and "<td>2</td>" in takeovers
    decisions = element(page, "decisions")
    assert "<td>alice</td><td>attempt.settled</td>" in decisions


def test_the_run_page_polls_while_the_run_moves_and_stops_once_it_ended(
    desk: charter.Engine, base: str, who: Principals, creds: tuple[dict[str, str], dict[str, str]]
) -> None:
    """Broken: a moving run's page does not refresh itself, or an ended run's
    page keeps asking the server every two seconds for nothing."""
    run_id, attempt_id = unknown_payment(desk, who)
    with browse(base) as http:
        sign_in(http, creds[0]["alice"])
        assert 'hx-trigger="every 2s' in http.get(f"/console/runs/{run_id}").text
        desk.coordinator.resolve(attempt_id, by=who.alice, outcome="failed", evidence="bounced")
        desk.stop_run(run_id, by=who.alice, reason="enough")
        page = http.get(f"/console/runs/{run_id}").text
    assert desk.run(run_id).status.terminal
    assert 'id="live" data-ended="true"' in page and "hx-trigger" not in page


def test_a_value_is_shown_whole_folded_or_as_its_hash_and_size() -> None:
    """Broken: a short value is folded, a long one shown unfolded, or one too
    large to read on a page printed whole."""
    assert story.folded({"to": "ACME"}) == "{&quot;to&quot;: &quot;ACME&quot;}"
    long = story.folded({"memo": MEMO})
    assert long.startswith("<details><summary>") and "\n  &quot;memo&quot;" in long
    large = "x" * (story.WHOLE_CHARS + 1)
    shown = story.folded(large)
    assert "x" * 100 not in shown and f"{len(large)} bytes · sha256 " in shown
    assert story.took(0, 420_000) == "420 ms" and story.took(0, None) == "-"
    assert story.took(0, 185_000_000) == "3 min 5 s"
