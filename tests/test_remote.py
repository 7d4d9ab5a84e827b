"""X1: a process in any language runs a run's attempts as a segment over HTTP,
and the server keeps every rule with the engine's own code.

The server runs for real (uvicorn on loopback, ``_desk.serving``) on each
backend; the client here is plain HTTP, as a TypeScript or Rust client is.
Each test asserts on what the store holds afterwards: the attempts, the
ledger, the evidence, the audit chain.
"""

from __future__ import annotations

import time
from collections.abc import Iterator
from typing import Any

import httpx
import pytest

import _desk
import charter
from charter.server.api import PREFIX
from conftest import stored

CONTRACT: dict[str, Any] = {
    "objective": "pay invoices from another language",
    "principals": {
        "agent": {"run": ["pay.*", "search.*"]},
        "bob": {"run": ["pay.*", "search.*"]},
        "alice": ["resolve", "approve", "stop", "raise_limit"],
        "mallory": ["consume"],
    },
    "allowance": {"usd": 100_000, "calls": 100},
    "approvals": {"required": ["pay.big"], "ttl_seconds": 600},
}


class Desk:
    """The server over one engine, and a client per principal."""

    def __init__(self, engine: charter.Engine, base: str, creds: dict[str, str]) -> None:
        self.engine, self.base, self.creds = engine, base, creds
        self.mission = engine.create_mission(CONTRACT, by=engine.authenticate(creds["alice"]))

    def post(self, who: str, path: str, body: dict[str, Any]) -> httpx.Response:
        headers = {"Authorization": f"Bearer {self.creds[who]}"}
        with httpx.Client(base_url=self.base + PREFIX, headers=headers, timeout=30) as http:
            return http.post(path, json=body)

    def get(self, who: str, path: str) -> httpx.Response:
        headers = {"Authorization": f"Bearer {self.creds[who]}"}
        with httpx.Client(base_url=self.base + PREFIX, headers=headers, timeout=30) as http:
            return http.get(path)

    def ok(self, who: str, path: str, body: dict[str, Any]) -> dict[str, Any]:
        answer = self.post(who, path, body)
        assert answer.status_code == 200, answer.text
        return dict(answer.json())

    def refused(self, who: str, path: str, body: dict[str, Any], status: int, code: str) -> Any:
        answer = self.post(who, path, body)
        assert (answer.status_code, answer.json()["error"]["code"]) == (status, code), answer.text
        return answer.json()["error"]

    def start(self, segment: str = "ts-1", who: str = "agent") -> dict[str, Any]:
        return self.ok(who, f"/missions/{self.mission}/runs", {"segment": segment, "input": {}})


def held(claim: dict[str, Any]) -> dict[str, Any]:
    return {k: claim[k] for k in ("segment", "epoch", "claim")}


def effect(claim: dict[str, Any], **over: Any) -> dict[str, Any]:
    """An admit body: a payment of 5,000 usd as node ``n1``'s effect ``pay``."""
    return {
        **held(claim),
        "node_id": "n1",
        "execution": 1,
        "effect_key": "pay",
        "adapter": "pay",
        "operation": "transfer",
        "effect_class": "unsafe",
        "request": {"to": "acme", "amount": 5_000},
        "estimate": {"usd": 5_000, "calls": 1},
        **over,
    }


def paid(claim: dict[str, Any], **over: Any) -> dict[str, Any]:
    return {
        **held(claim),
        "outcome": "succeeded",
        "cost": {"usd": 4_900, "calls": 1},
        "result": {"transfer": "tr_1"},
        "receipt": {"id": "tr_1"},
        **over,
    }


@pytest.fixture
def desk(make_engine: Any, creds: tuple[dict[str, str], dict[str, str]]) -> Iterator[Desk]:
    engine = make_engine()
    with _desk.serving(engine) as base:
        yield Desk(engine, base, creds[0])


def spent(engine: charter.Engine, mission: str) -> dict[str, Any]:
    return {u: charter_balance(b) for u, b in engine.balances(mission).items()}


def charter_balance(b: Any) -> tuple[int, int]:
    return (b.spent, b.held)


def test_X1_admit_answers_the_attempt_its_key_the_fencing_token_and_a_deadline_in_the_lease(
    desk: Desk, clock: charter.ManualClock
) -> None:
    """Broken X1/A2/F3: the admit answer lacks the key or token, the attempt is not
    DISPATCHED before the client is told to send, or the deadline outlives the lease."""
    claim = desk.start()
    assert claim["epoch"] == 1 and claim["claim"] and 0 < claim["lease_ms"] <= 30_000
    clock.advance(10)  # a third of the lease used: the deadline is what is left of it
    order = desk.ok("agent", f"/runs/{claim['run_id']}/attempts", effect(claim))
    attempt = desk.engine.get_attempt(order["attempt_id"])
    assert order["action"] == "send" and order["status"] == "dispatched"
    assert attempt.status is charter.AttemptStatus.DISPATCHED
    assert order["idempotency_key"] == attempt.idempotency_key == f"charter-{attempt.id}"
    assert order["fencing_token"] == f"{claim['run_id']}:1"
    # The lease was renewed by the admission (half used? no: a third), so what is
    # left of the lease, by the store's clock, bounds the deadline.
    assert 0 < order["send_deadline_ms"] <= 20_000
    assert attempt.send_deadline_us is not None and attempt.dispatched_at_us is not None
    assert order["send_deadline_ms"] <= (attempt.send_deadline_us - attempt.dispatched_at_us) / 1000
    assert spent(desk.engine, desk.mission)["usd"] == (0, 5_000)


def test_X1_admission_refusals_carry_the_engines_codes_and_send_nothing(
    desk: Desk, clock: charter.ManualClock
) -> None:
    """Broken X1/A1/L3/W2/F1: an admission the engine refuses is answered as a send."""
    claim = desk.start()
    run = claim["run_id"]
    path = f"/runs/{run}/attempts"
    before = stored(desk.engine, desk.mission)
    desk.refused("agent", path, effect(claim, adapter="mail", operation="send"), 403,
                 "not_authorized")  # fmt: skip
    assert stored(desk.engine, desk.mission) == before  # a refusal holds nothing
    # An approval: PREPARED with its hold, then sent as the same attempt once approved.
    waiting = desk.refused("agent", path, effect(claim, operation="big"), 409, "approval_required")
    assert desk.engine.get_attempt(waiting["attempt_id"]).status is charter.AttemptStatus.PREPARED
    desk.ok("alice", f"/approvals/{waiting['approval_id']}/approve", {})
    order = desk.ok("agent", path, effect(claim, operation="big"))
    assert (order["action"], order["attempt_id"]) == ("send", waiting["attempt_id"])
    # Fenced: the lease runs out, bob takes the run over as a new segment.
    clock.advance(31)
    desk.ok("agent", f"/attempts/{order['attempt_id']}/report", paid(claim))
    taken = desk.ok("bob", f"/runs/{run}/claim", {"segment": "rs-1"})
    assert taken["epoch"] == 2
    old = desk.refused("agent", path, effect(claim, effect_key="again"), 409, "fenced")
    assert old["current_epoch"] == 2
    desk.refused("agent", f"/runs/{run}/renew", held(claim), 409, "fenced")
    assert [a.effect_key for a in desk.engine.attempts(run_id=run)] == ["pay"]
    # The allowance (L3): refused, nothing held; the run pauses for a person.
    other = desk.start("ts-9")
    before = stored(desk.engine, desk.mission, runs=False)
    too_much = effect(other, estimate={"usd": 200_000})
    desk.refused("agent", f"/runs/{other['run_id']}/attempts", too_much, 409, "allowance_exceeded")
    assert stored(desk.engine, desk.mission, runs=False) == before


def test_X1_a_report_sent_twice_settles_once_and_answers_the_same(desk: Desk) -> None:
    """Broken X1: a repeated report spends twice, records twice, or answers otherwise."""
    claim = desk.start()
    order = desk.ok("agent", f"/runs/{claim['run_id']}/attempts", effect(claim))
    report = f"/attempts/{order['attempt_id']}/report"
    first = desk.ok("agent", report, paid(claim))
    events = len(desk.engine.audit_events(desk.mission))
    second = desk.ok("agent", report, paid(claim))
    assert first == second == {
        "attempt_id": order["attempt_id"], "status": "succeeded", "settled": True, "late": False,
    }  # fmt: skip
    attempt = desk.engine.get_attempt(order["attempt_id"])
    assert attempt.actual == {"usd": 4_900, "calls": 1} and attempt.receipt == {"id": "tr_1"}
    assert spent(desk.engine, desk.mission)["usd"] == (4_900, 0)
    assert desk.engine.evidence(order["attempt_id"]) == []
    assert len(desk.engine.audit_events(desk.mission)) == events  # nothing written again


def test_X1_a_late_report_after_a_takeover_is_kept_as_evidence_with_its_epoch(
    desk: Desk, clock: charter.ManualClock
) -> None:
    """Broken F2 over the wire: the old segment's report is lost, or settles a
    settled attempt a second time."""
    claim = desk.start()
    run = claim["run_id"]
    order = desk.ok("agent", f"/runs/{run}/attempts", effect(claim))
    clock.advance(31)
    desk.ok("bob", f"/runs/{run}/recover", {"segment": "rs-1"})
    attempt_id = order["attempt_id"]
    assert desk.engine.get_attempt(attempt_id).status is charter.AttemptStatus.UNKNOWN
    desk.ok("alice", f"/attempts/{attempt_id}/resolve",
            {"outcome": "succeeded", "evidence": "the bank shows tr_1",
             "cost": {"usd": 4_900, "calls": 1}})  # fmt: skip
    late = desk.ok("agent", f"/attempts/{attempt_id}/report", paid(claim))
    assert late == {"attempt_id": attempt_id, "status": "succeeded", "settled": True, "late": True}
    [kept] = [e for e in desk.engine.evidence(attempt_id) if e["source"].startswith("late")]
    assert (kept["epoch"], kept["verdict"], kept["settled"]) == (1, "applied", False)
    assert spent(desk.engine, desk.mission)["usd"] == (4_900, 0)  # settled once
    # A conflicting late report is kept too, and opens an incident (F2).
    desk.ok(
        "agent",
        f"/attempts/{attempt_id}/report",
        {**held(claim), "outcome": "not_applied", "proof": {"refused": "before any byte"}},
    )
    assert [i["kind"] for i in desk.engine.incidents(desk.mission)] == ["conflicting_evidence"]


def test_X1_a_settled_effect_replays_its_record_and_nothing_is_sent_again(desk: Desk) -> None:
    """Broken A4/A6 over the wire: a node re-run after a crash is told to send again."""
    claim = desk.start()
    path = f"/runs/{claim['run_id']}/attempts"
    order = desk.ok("agent", path, effect(claim))
    desk.ok("agent", f"/attempts/{order['attempt_id']}/report", paid(claim))
    for execution in (1, 2):  # the same execution asking again; a re-run of the node
        replay = desk.ok("agent", path, effect(claim, execution=execution))
        assert replay == {
            "action": "replay", "attempt_id": order["attempt_id"], "status": "succeeded",
            "result": {"transfer": "tr_1"}, "cost": {"usd": 4_900, "calls": 1},
            "receipt": {"id": "tr_1"}, "reason": None,
        }  # fmt: skip
    desk.refused("agent", path, effect(claim, execution=3, request={"to": "acme", "amount": 6}),
                 409, "non_determinism")  # fmt: skip
    assert len(desk.engine.attempts(run_id=claim["run_id"])) == 1
    # As the plan runner does (A6): the run needs a person.
    assert desk.engine.run(claim["run_id"]).status is charter.RunStatus.NEEDS_INTERVENTION


def test_X1_an_unknown_outcome_blocks_the_effect_until_evidence_or_a_person(desk: Desk) -> None:
    """Broken A3/A4: an UNKNOWN reported by the client is sent again on the next admit."""
    claim = desk.start()
    path = f"/runs/{claim['run_id']}/attempts"
    order = desk.ok("agent", path, effect(claim))
    lost = {**held(claim), "outcome": "unknown", "reason": "timeout", "detail": {"after_ms": 30}}
    report = f"/attempts/{order['attempt_id']}/report"
    assert desk.ok("agent", report, lost)["status"] == "unknown"
    assert desk.ok("agent", report, lost)["late"] is False  # the same report: nothing more
    assert len(desk.engine.evidence(order["attempt_id"])) == 1
    blocked = desk.ok("agent", path, effect(claim, execution=2))
    assert (blocked["action"], blocked["status"]) == ("blocked", "unknown")
    assert spent(desk.engine, desk.mission)["usd"] == (0, 5_000)  # the hold is kept


def test_X1_a_client_crash_then_recover_evidence_confirm_and_claim_again(
    desk: Desk, clock: charter.ManualClock
) -> None:
    """Broken X1/R1-R9: after a client died mid-send, its effect is performed again,
    or the client's evidence settles without a person under ``confirm``."""
    claim = desk.start()
    run = claim["run_id"]
    order = desk.ok("agent", f"/runs/{run}/attempts", effect(claim))  # then the client dies
    clock.advance(31)
    state = desk.ok("agent", f"/runs/{run}/recover", {"segment": "ts-2"})
    assert state["epoch"] == 2 and state["unresolved"] == [order["attempt_id"]]
    found = {"verdict": "applied", "detail": {"lookup": "by key"}, "outcome": {
        "status": "succeeded", "result": {"transfer": "tr_1"}, "cost": {"usd": 4_900},
        "receipt": {"id": "tr_1"}}}  # fmt: skip
    seen = desk.ok("agent", f"/attempts/{order['attempt_id']}/evidence", found)
    assert (seen["status"], seen["settled"]) == ("unknown", False)  # a person confirms
    desk.refused("agent", f"/runs/{run}/claim", {"segment": "ts-2"}, 409, "needs_intervention")
    desk.ok("alice", f"/attempts/{order['attempt_id']}/confirm", {})
    again = desk.ok("agent", f"/runs/{run}/claim", {"segment": "ts-2"})
    assert again["epoch"] == 2 and again["claim"] != claim["claim"]
    replay = desk.ok("agent", f"/runs/{run}/attempts", effect(again, execution=2))
    assert (replay["action"], replay["result"]) == ("replay", {"transfer": "tr_1"})
    assert len(desk.engine.attempts(run_id=run)) == 1
    assert spent(desk.engine, desk.mission)["usd"] == (4_900, 0)
    waits = desk.get("agent", f"/runs/{run}/waits").json()
    assert (waits["run_id"], waits["waits"]) == (run, [])


BAD_ADMITS: list[dict[str, Any]] = [
    {"estimate": {"usd": -1}},
    {"estimate": {"usd": "5"}},
    {"estimate": {"usd": 2**63}},
    {"estimate": [5]},
    {"effect_class": "maybe"},
    {"effect_class": "idempotent_keyed"},  # no window
    {"dedupe_window_seconds": 60},  # a window for an unsafe effect
    {"execution": -1},
    {"execution": True},
    {"epoch": "1"},
    {"effect_key": ""},
    {"effect_key": "a\x00b"},
    {"surprise": 1},
]


def test_X1_bad_input_is_a_typed_400_that_changes_nothing(desk: Desk) -> None:
    """Broken: a malformed admit or report is a 500, or writes something."""
    claim = desk.start()
    path = f"/runs/{claim['run_id']}/attempts"
    before = stored(desk.engine, desk.mission)
    for bad in BAD_ADMITS:
        answer = desk.post("agent", path, effect(claim, **bad))
        assert answer.status_code == 400, (bad, answer.text)
        assert answer.json()["error"]["code"] in ("usage_error", "text_refused"), bad
    no_request = effect(claim)
    del no_request["request"]
    desk.refused("agent", path, no_request, 400, "usage_error")
    assert stored(desk.engine, desk.mission) == before
    order = desk.ok("agent", path, effect(claim))
    before = stored(desk.engine, desk.mission)
    report = f"/attempts/{order['attempt_id']}/report"
    for bad in (
        {"outcome": "fine"},
        {"outcome": "not_applied"},  # no proof
        {"outcome": "succeeded", "cost": {"usd": 1.5}},
        {"outcome": "succeeded", "proof": "x"},  # proof goes with not_applied
        {"outcome": "unknown", "cost": {"usd": 1}},
    ):
        desk.refused("agent", report, {**held(claim), **bad}, 400, "usage_error")
    assert stored(desk.engine, desk.mission) == before


def test_X1_A4_an_execution_number_no_client_was_given_is_refused_at_once(desk: Desk) -> None:
    """Broken: an admit naming execution 1,700,000,000,000 read the effect's earlier
    tries execution by execution and held a server thread for hours."""
    claim = desk.start()
    path = f"/runs/{claim['run_id']}/attempts"
    before = stored(desk.engine, desk.mission)
    started = time.monotonic()
    answer = desk.post("agent", path, effect(claim, node_id="n1", execution=1_700_000_000_000))
    assert (answer.status_code, answer.json()["error"]["code"]) == (400, "usage_error")
    assert time.monotonic() - started < 5
    assert stored(desk.engine, desk.mission) == before
    desk.ok("agent", f"/runs/{claim['run_id']}/nodes/n1/start", held(claim))
    assert desk.ok("agent", path, effect(claim, node_id="n1", execution=1))["action"] == "send"


def test_X1_the_openapi_document_describes_the_protocol(desk: Desk) -> None:
    paths = desk.get("agent", "/openapi.json").json()["paths"]
    for path in ("/missions/{mission_id}/runs", "/runs/{run_id}/claim", "/runs/{run_id}/renew",
                 "/runs/{run_id}/release", "/runs/{run_id}/attempts",
                 "/attempts/{attempt_id}/report", "/attempts/{attempt_id}/evidence"):  # fmt: skip
        assert "post" in paths[PREFIX + path], path
    admit = paths[PREFIX + "/runs/{run_id}/attempts"]["post"]["requestBody"]
    schema = admit["content"]["application/json"]["schema"]
    assert schema["properties"]["request"] == {} and "estimate" in schema["required"]


def test_X1_a_nodes_journal_is_kept_for_the_client_and_the_run_ends_when_settled(
    desk: Desk,
) -> None:
    """Broken N1/X1: a node re-run after a client crash gets a new execution (its
    effects would not replay as this execution's), a completion is recorded twice
    or with another result, or a run ends over an unresolved attempt."""
    claim = desk.start()
    run, seg = claim["run_id"], held(claim)
    first = desk.ok("agent", f"/runs/{run}/nodes/n1/start", seg)
    assert desk.ok("agent", f"/runs/{run}/nodes/n1/start", seg) == first  # a crash: same one
    assert first == {"run_id": run, "node_id": "n1", "execution": 1}
    order = desk.ok("agent", f"/runs/{run}/attempts", effect(claim))
    desk.refused("agent", f"/runs/{run}/finish", seg, 409, "invalid_state")  # unresolved
    desk.ok("agent", f"/attempts/{order['attempt_id']}/report", paid(claim))
    done = {**seg, "execution": 1, "result": {"paid": "tr_1"}}
    recorded = desk.ok("agent", f"/runs/{run}/nodes/n1/complete", done)
    assert desk.ok("agent", f"/runs/{run}/nodes/n1/complete", done) == recorded
    other = {**done, "result": {"paid": "tr_2"}}
    desk.refused("agent", f"/runs/{run}/nodes/n1/complete", other, 409, "invalid_state")
    [node] = [n for n in desk.engine.coordinator.state(run).nodes if n["node_id"] == "n1"]
    assert node["status"] == "completed" and node["result_hash"] == recorded["result_hash"]
    assert desk.ok("agent", f"/runs/{run}/finish", seg)["status"] == "completed"


def refusals(engine: charter.Engine, mission: str) -> list[tuple[str, str]]:
    return [
        (e["actor"], e["entity"])
        for e in engine.audit_events(mission)
        if e["kind"] == "authorization.refused"
    ]


def test_X1_claiming_and_a_segments_calls_need_their_rights_a_claim_is_no_right(
    desk: Desk, clock: charter.ManualClock
) -> None:
    """Broken P1/P3 over the protocol: a principal without ``run`` starts a run, or
    acts as another's segment with its claim, or posts evidence without
    ``reconcile``; or a refusal is not audited, or changes something."""
    claim = desk.start()
    run = claim["run_id"]
    order = desk.ok("agent", f"/runs/{run}/attempts", effect(claim))
    before = stored(desk.engine, desk.mission)
    desk.refused("mallory", f"/missions/{desk.mission}/runs", {"segment": "m-1"}, 403,
                 "not_authorized")  # fmt: skip
    desk.refused("mallory", f"/runs/{run}/attempts", effect(claim, effect_key="x"), 403,
                 "not_authorized")  # fmt: skip
    desk.refused("mallory", f"/attempts/{order['attempt_id']}/report", paid(claim), 403,
                 "not_authorized")  # fmt: skip
    clock.advance(31)
    desk.refused("mallory", f"/runs/{run}/claim", {"segment": "m-2"}, 403, "not_authorized")
    assert stored(desk.engine, desk.mission) == before
    assert [actor for actor, _ in refusals(desk.engine, desk.mission)] == ["mallory"] * 4
    desk.ok("agent", f"/runs/{run}/recover", {"segment": "ts-2"})
    found = {"verdict": "not_applied", "detail": {"bank": "no such transfer"}}
    desk.refused("mallory", f"/attempts/{order['attempt_id']}/evidence", found, 403,
                 "not_authorized")  # fmt: skip
    assert desk.engine.evidence(order["attempt_id"]) == []
    # bob, whom the mission grants run, carries another of agent's runs as a new
    # segment once its lease ran out; the run still acts as agent (A1).
    other = desk.start("ts-9")
    clock.advance(31)
    taken = desk.ok("bob", f"/runs/{other['run_id']}/claim", {"segment": "bob-1"})
    assert taken["epoch"] == 2
    sent = desk.ok("bob", f"/runs/{other['run_id']}/attempts", effect(taken))
    assert desk.engine.get_attempt(sent["attempt_id"]).principal == "agent"


def test_X1_a_client_killed_mid_send_is_recovered_reconciled_and_replayed_not_resent(
    desk: Desk, clock: charter.ManualClock
) -> None:
    """Broken X1/R1-R9 with a real process: a client SIGKILLed after it was told
    to send leaves a run a new segment cannot carry on, or whose payment is sent
    again, or whose node starts a new execution (its effects would be new)."""
    import json
    import signal
    import subprocess
    import sys
    from pathlib import Path

    script = Path(__file__).with_name("_remote_client.py")
    with subprocess.Popen(
        [sys.executable, str(script), desk.base, desk.creds["agent"], desk.mission],
        stdout=subprocess.PIPE,
        text=True,
    ) as child:
        try:
            assert child.stdout is not None
            told = json.loads(child.stdout.readline())
        finally:
            child.send_signal(signal.SIGKILL)
            child.wait(30)
    run, attempt_id = told["run"], told["order"]["attempt_id"]
    assert told["order"]["action"] == "send"
    assert desk.engine.get_attempt(attempt_id).status is charter.AttemptStatus.DISPATCHED
    clock.advance(31)  # its lease runs out by the store's clock
    state = desk.ok("agent", f"/runs/{run}/recover", {"segment": "py-2"})
    assert state["unresolved"] == [attempt_id]
    found = {"verdict": "applied", "outcome": {"status": "succeeded", "cost": {"usd": 5_000},
             "result": {"transfer": "tr_9"}, "receipt": {"id": "tr_9"}}}  # fmt: skip
    desk.ok("agent", f"/attempts/{attempt_id}/evidence", found)
    desk.ok("alice", f"/attempts/{attempt_id}/confirm", {})
    again = desk.ok("agent", f"/runs/{run}/claim", {"segment": "py-2"})
    seg = held(again)
    node = desk.ok("agent", f"/runs/{run}/nodes/n1/start", seg)
    assert node["execution"] == told["execution"]  # the same execution, continued
    replay = desk.ok("agent", f"/runs/{run}/attempts", effect(again, execution=node["execution"]))
    assert (replay["action"], replay["result"]) == ("replay", {"transfer": "tr_9"})
    desk.ok("agent", f"/runs/{run}/nodes/n1/complete", {**seg, "execution": 1, "result": "tr_9"})
    assert desk.ok("agent", f"/runs/{run}/finish", seg)["status"] == "completed"
    assert [a.id for a in desk.engine.attempts(run_id=run)] == [attempt_id]
    assert spent(desk.engine, desk.mission)["usd"] == (5_000, 0)
