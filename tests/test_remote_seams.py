"""X3: a claim proves a segment, over the remote attempt protocol.

A report, renewal, release, evidence, node call or finish speaks for a
segment: it must present the claim the server issued to that segment at that
epoch, and a report (or evidence given as a segment) must come from the
segment that dispatched the attempt, sent by a principal with ``run`` on its
operation. Anything else is refused, typed, and changes nothing: not the
attempt, not the ledger, not an incident, not the audit chain. A proven late
report is evidence (R7): it settles only as the contract lets evidence settle
by itself, and never above its hold without a person.

The server runs for real on loopback over each backend; the client is plain
HTTP, as a TypeScript or Rust client is.
"""

from __future__ import annotations

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
        "agent": {"run": ["pay.*"]},
        "bob": {"run": ["pay.*"]},
        # A stranger to payments: her run right covers no operation of them.
        "mallory": {"run": ["search.*"]},
        "alice": ["resolve", "approve", "stop", "raise_limit"],
    },
    "allowance": {"usd": 100_000, "calls": 100},
}

INT64 = 2**63 - 1


class Wire:
    """The server over one engine, a mission, and a client per principal."""

    def __init__(self, engine: charter.Engine, base: str, creds: dict[str, str]) -> None:
        self.engine, self.base, self.creds = engine, base, creds
        self.mission = engine.create_mission(CONTRACT, by=engine.authenticate(creds["alice"]))

    def post(self, who: str, path: str, body: dict[str, Any]) -> httpx.Response:
        headers = {"Authorization": f"Bearer {self.creds[who]}"}
        with httpx.Client(base_url=self.base + PREFIX, headers=headers, timeout=30) as http:
            return http.post(path, json=body)

    def ok(self, who: str, path: str, body: dict[str, Any]) -> dict[str, Any]:
        answer = self.post(who, path, body)
        assert answer.status_code == 200, answer.text
        return dict(answer.json())

    def refused(self, who: str, path: str, body: dict[str, Any], status: int, code: str) -> Any:
        answer = self.post(who, path, body)
        assert (answer.status_code, answer.json()["error"]["code"]) == (status, code), answer.text
        return answer.json()["error"]

    def start(self, segment: str, who: str = "agent") -> dict[str, Any]:
        return self.ok(who, f"/missions/{self.mission}/runs", {"segment": segment, "input": {}})

    def admit(self, claim: dict[str, Any], key: str = "pay", usd: int = 5_000) -> str:
        order = self.ok("agent", f"/runs/{claim['run_id']}/attempts", effect(claim, key, usd))
        assert order["action"] == "send"
        return str(order["attempt_id"])

    def everything(self) -> dict[str, Any]:
        """What the store holds about the mission, its audit chain included."""
        audit = self.engine.audit_events(self.mission)
        return {**stored(self.engine, self.mission), "audit": audit}


def held(claim: dict[str, Any]) -> dict[str, Any]:
    return {k: claim[k] for k in ("segment", "epoch", "claim")}


def effect(claim: dict[str, Any], key: str = "pay", usd: int = 5_000) -> dict[str, Any]:
    return {
        **held(claim),
        "node_id": "n1",
        "execution": 1,
        "effect_key": key,
        "adapter": "pay",
        "operation": "transfer",
        "effect_class": "unsafe",
        "request": {"to": "acme", "amount": usd},
        "estimate": {"usd": usd, "calls": 1},
    }


def paid(segment: dict[str, Any], usd: int = 4_900, *, receipt: bool = True) -> dict[str, Any]:
    return {
        **segment,
        "outcome": "succeeded",
        "cost": {"usd": usd, "calls": 1},
        "result": {"transfer": "tr_1"},
        **({"receipt": {"id": "tr_1"}} if receipt else {}),
    }


def refused_not_applied(segment: dict[str, Any]) -> dict[str, Any]:
    return {**segment, "outcome": "not_applied", "proof": {"bank": "no such transfer"}}


@pytest.fixture
def wire(make_engine: Any, creds: tuple[dict[str, str], dict[str, str]]) -> Iterator[Wire]:
    engine = make_engine()
    with _desk.serving(engine) as base:
        yield Wire(engine, base, creds[0])


@pytest.fixture
def auto_wire(make_engine: Any, creds: tuple[dict[str, str], dict[str, str]]) -> Iterator[Wire]:
    engine = make_engine(evidence_settles="auto")
    with _desk.serving(engine) as base:
        yield Wire(engine, base, creds[0])


def spent(engine: charter.Engine, mission: str) -> tuple[int, int]:
    usd = engine.balances(mission)["usd"]
    return usd.spent, usd.held


# -- item 1: a report proves it comes from the segment that sent ------------------------


def test_X3_item1_a_stranger_with_run_elsewhere_cannot_settle_another_segments_attempt(
    wire: Wire,
) -> None:
    """Broken X3 (item 1): a principal whose run right covers no operation of the
    attempt, naming a segment nobody was given and a garbage claim, settles it
    FAILED; the owner's true report then reads as late and nothing is spent."""
    claim = wire.start("ts-1")
    attempt_id = wire.admit(claim)
    report = f"/attempts/{attempt_id}/report"
    before = wire.everything()
    forged = {"segment": "nobody", "epoch": 1, "claim": "garbage"}
    for who in ("mallory", "agent", "bob"):
        wire.refused(who, report, refused_not_applied(forged), 409, "fenced")
    # The owner's segment and epoch with a claim it was never given: fenced too.
    wire.refused("mallory", report, refused_not_applied({**held(claim), "claim": "x"}), 409,
                 "fenced")  # fmt: skip
    assert wire.everything() == before  # not even an incident, not an audit event
    # A leaked claim is no right: mallory's run covers no operation of the attempt.
    wire.refused("mallory", report, refused_not_applied(held(claim)), 403, "not_authorized")
    assert stored(wire.engine, wire.mission) == stored_before(before)
    # The owner's report settles it, live, at its cost.
    done = wire.ok("agent", report, paid(held(claim)))
    assert done == {"attempt_id": attempt_id, "status": "succeeded", "settled": True,
                    "late": False}  # fmt: skip
    assert spent(wire.engine, wire.mission) == (4_900, 0)
    assert wire.engine.incidents(wire.mission) == []


def stored_before(everything: dict[str, Any]) -> dict[str, Any]:
    return {k: v for k, v in everything.items() if k != "audit"}


def test_X3_item1_the_owner_of_one_run_cannot_settle_another_runs_attempt_with_its_claim(
    wire: Wire,
) -> None:
    """Broken X3 (item 1): bob, holding his own run with a valid claim, settles an
    attempt of agent's run by naming his own segment, epoch and claim."""
    mine = wire.start("ts-1")
    attempt_id = wire.admit(mine)
    bobs = wire.start("bob-1", who="bob")
    before = wire.everything()
    for outcome in (refused_not_applied(held(bobs)), paid(held(bobs), 1)):
        wire.refused("bob", f"/attempts/{attempt_id}/report", outcome, 409, "fenced")
    assert wire.everything() == before
    assert wire.engine.get_attempt(attempt_id).status is charter.AttemptStatus.DISPATCHED


# -- item 2: a late report is evidence, never past the contract --------------------------


def taken_over(wire: Wire, clock: charter.ManualClock) -> tuple[dict[str, Any], str]:
    """A run whose segment dispatched a payment and was taken over: the old
    segment's claim, and the attempt, UNKNOWN with its hold of 5,000."""
    claim = wire.start("ts-1")
    attempt_id = wire.admit(claim)
    clock.advance(31)
    wire.ok("bob", f"/runs/{claim['run_id']}/recover", {"segment": "ts-2"})
    assert wire.engine.get_attempt(attempt_id).status is charter.AttemptStatus.UNKNOWN
    return claim, attempt_id


def test_X3_R7_item2_a_late_report_under_confirm_is_evidence_for_a_person(
    wire: Wire, clock: charter.ManualClock
) -> None:
    """Broken X3/R7 (item 2): a proven late report settles an UNKNOWN attempt by
    itself (at 1 on a hold of 5,000) while the contract says a person confirms."""
    claim, attempt_id = taken_over(wire, clock)
    late = wire.ok("agent", f"/attempts/{attempt_id}/report", paid(held(claim), 1))
    assert late == {"attempt_id": attempt_id, "status": "unknown", "settled": False, "late": True}
    assert spent(wire.engine, wire.mission) == (0, 5_000)  # the hold is kept
    [kept] = wire.engine.evidence(attempt_id)
    assert (kept["verdict"], kept["epoch"], kept["settled"]) == ("applied", 1, False)
    assert kept["source"].startswith("late")
    assert wire.engine.incidents(wire.mission) == []
    # A person confirms the evidence the report brought: settled once, at its cost.
    alice = wire.engine.authenticate(wire.creds["alice"])
    wire.engine.coordinator.confirm(attempt_id, by=alice)
    assert spent(wire.engine, wire.mission) == (1, 0)


def test_X3_R7_item2_a_late_report_never_settles_above_its_hold_by_itself(
    auto_wire: Wire, clock: charter.ManualClock
) -> None:
    """Broken X3/R7 (item 2): under ``evidence_settles = "auto"`` a late report
    settles at a cost its hold did not cover, or without a receipt."""
    wire = auto_wire
    claim, attempt_id = taken_over(wire, clock)
    report = f"/attempts/{attempt_id}/report"
    for outcome in (paid(held(claim), 300_000), paid(held(claim), 4_000, receipt=False)):
        answer = wire.ok("agent", report, outcome)
        assert (answer["status"], answer["settled"], answer["late"]) == ("unknown", False, True)
    assert spent(wire.engine, wire.mission) == (0, 5_000)
    assert [e["settled"] for e in wire.engine.evidence(attempt_id)] == [False, False]
    # Within the hold, with a receipt: what a lookup's evidence would settle, it settles.
    done = wire.ok("agent", report, paid(held(claim), 4_000))
    assert (done["status"], done["settled"], done["late"]) == ("succeeded", True, True)
    assert spent(wire.engine, wire.mission) == (4_000, 0)


# -- items 4 and 5: numbers past the store, releases that release nothing ----------------


def test_X1_item4_an_epoch_past_the_stores_integers_is_a_typed_400_on_every_endpoint(
    wire: Wire,
) -> None:
    """Broken X1/A9 (item 4): an epoch of 2**63 or more is a 500 (an
    OverflowError, or the database's own text) on admit, renew and release."""
    claim = wire.start("ts-1")
    run = claim["run_id"]
    attempt_id = wire.admit(claim)
    before = wire.everything()
    for epoch in (INT64 + 1, 2**64, 10**30):
        segment = {**held(claim), "epoch": epoch}
        for path, body in (
            (f"/runs/{run}/attempts", {**effect(claim, "again"), "epoch": epoch}),
            (f"/runs/{run}/renew", segment),
            (f"/runs/{run}/release", segment),
            (f"/attempts/{attempt_id}/report", paid(segment)),
            (f"/attempts/{attempt_id}/evidence", {**segment, "verdict": "indeterminate"}),
            (f"/runs/{run}/nodes/n1/start", segment),
            (f"/runs/{run}/nodes/n1/complete", {**segment, "execution": 1, "result": 1}),
            (f"/runs/{run}/finish", segment),
        ):
            error = wire.refused("agent", path, body, 400, "usage_error")
            assert "epoch" in error["message"] and "range" not in error["message"]
    execution = {**effect(claim, "again"), "execution": INT64 + 1}
    wire.refused("agent", f"/runs/{run}/attempts", execution, 400, "usage_error")
    assert wire.everything() == before


def test_X1_item4_a_stores_own_failure_is_told_by_its_code_alone(wire: Wire) -> None:
    """Broken (item 4): a store's failure hands the client the database's own text."""
    from starlette.requests import Request

    from charter.errors import StoreError
    from charter.server.app import failure

    request = Request({"type": "http", "method": "POST", "path": "/api/v1/x", "headers": []})
    inner = StoreError('PostgreSQL error: value "9223372036854775808" is out of range for type')
    answer = failure(inner, request)
    assert answer.status_code == 500
    body = bytes(answer.body).decode()
    assert "store_error" in body and "out of range" not in body and "9223372" not in body


def test_X3_item5_a_release_with_a_claim_not_its_own_or_another_epoch_is_fenced(
    wire: Wire,
) -> None:
    """Broken X3 (item 5): a release with a forged claim, or the owner's claim at
    another epoch, answers ``released: true`` and releases nothing."""
    claim = wire.start("ts-1")
    release = f"/runs/{claim['run_id']}/release"
    before = wire.everything()
    wire.refused("agent", release, {**held(claim), "claim": "forged"}, 409, "fenced")
    wire.refused("agent", release, {**held(claim), "epoch": 2}, 409, "fenced")
    wire.refused("mallory", release, {**held(claim), "claim": "forged"}, 409, "fenced")
    assert wire.everything() == before
    # The owner still holds it: it admits, then releases for real.
    wire.admit(claim, "still-mine", 1)
    assert wire.ok("agent", release, held(claim)) == {"run_id": claim["run_id"], "released": True}
    # Released: its claim holds nothing now, so a second release is fenced.
    wire.refused("agent", release, held(claim), 409, "fenced")


# -- every endpoint that takes a claim, driven by an impostor ----------------------------


def test_X3_an_impostor_on_every_endpoint_that_takes_a_claim_changes_nothing(
    wire: Wire, clock: charter.ManualClock
) -> None:
    """Broken X3: any call that speaks for a segment is carried out for a claim
    that segment was not given (a guess, another run's, another epoch's, a
    taken-over segment's for the new owner's run), or writes anything on refusal."""
    victim = wire.start("ts-1")
    run = victim["run_id"]
    attempt_id = wire.admit(victim)
    wire.ok("agent", f"/runs/{run}/nodes/n1/start", held(victim))
    other = wire.start("bob-1", who="bob")
    impostors = [
        ("mallory", {"segment": "ts-1", "epoch": 1, "claim": "guess"}),
        ("agent", {"segment": "ts-1", "epoch": 1, "claim": other["claim"]}),
        ("bob", held(other)),
        ("agent", {**held(victim), "epoch": 2}),
        ("agent", {**held(victim), "segment": "ts-9"}),
    ]
    before = wire.everything()
    for who, segment in impostors:
        for path, body in (
            (f"/attempts/{attempt_id}/report", paid(segment)),
            (f"/attempts/{attempt_id}/report", refused_not_applied(segment)),
            (f"/runs/{run}/renew", segment),
            (f"/runs/{run}/release", segment),
            (f"/attempts/{attempt_id}/evidence", {**segment, "verdict": "not_applied"}),
            (f"/runs/{run}/nodes/n2/start", segment),
            (f"/runs/{run}/nodes/n1/complete", {**segment, "execution": 1, "result": "x"}),
            (f"/runs/{run}/finish", {**segment, "status": "failed"}),
            (f"/runs/{run}/attempts", {**effect(victim, "other"), **segment}),
        ):
            wire.refused(who, path, body, 409, "fenced")
        assert wire.everything() == before, (who, segment)
    # After a takeover, the old segment's true claim proves its own epoch only.
    clock.advance(31)
    taken = wire.ok("bob", f"/runs/{run}/recover", {"segment": "bob-2"})
    assert taken["epoch"] == 2
    stale = {**held(victim), "segment": "bob-2", "epoch": 2}
    before = wire.everything()
    for path in (f"/runs/{run}/renew", f"/runs/{run}/release", f"/runs/{run}/finish"):
        wire.refused("agent", path, stale, 409, "fenced")
    wire.refused("agent", f"/attempts/{attempt_id}/report", paid(stale), 409, "fenced")
    assert wire.everything() == before


# -- item 23: the engine's own check, in process -----------------------------------------


def test_X3_item23_only_the_dispatching_segment_with_an_issued_claim_reports_in_process(
    make_engine: Any, creds: tuple[dict[str, str], dict[str, str]], clock: charter.ManualClock
) -> None:
    """Broken X3 in ``attempts/handed.py`` (item 23): an executor with a claim the
    store never issued, another run's executor, or the segment of a later epoch
    settles an attempt it did not dispatch (or opens an incident with it)."""
    engine = make_engine()
    agent, alice = (engine.authenticate(creds[0][n]) for n in ("agent", "alice"))
    mission = engine.create_mission(CONTRACT, by=alice)
    owner = engine.start_run(mission, by=agent, segment_id="s1")
    sent = owner.hand("pay", "transfer", {"to": "acme", "amount": 5_000},
                      effect_class=charter.EffectClass.UNSAFE,
                      estimate={"usd": 5_000, "calls": 1}, effect_key="pay")  # fmt: skip
    attempt_id = sent.attempt.id
    refused = charter.Evidence.not_applied({"refused": "before any byte"})
    forged = charter.Executor(
        engine._runtime,
        run_id=owner.run_id,
        mission_id=mission,
        segment_id="s1",
        epoch=1,
        principal="agent",
        lease_expires_us=owner.lease_expires_us,
        claim="never-issued",
    )
    other = engine.start_run(mission, by=agent, segment_id="s9")
    before = stored(engine, mission)
    for stranger in (forged, other):
        with pytest.raises(charter.Fenced):
            stranger.report(attempt_id, refused)
    assert stored(engine, mission) == before
    # A later epoch's segment, with a claim of its own, did not send it either.
    clock.advance(31)
    engine.coordinator.recover(owner.run_id, "s2", by=alice)
    bank = {"bank": "tr_1"}
    engine.coordinator.resolve(attempt_id, by=alice, outcome="succeeded", evidence=bank,
                               cost={"usd": 4_900, "calls": 1})  # fmt: skip
    later = engine.coordinator.resume(owner.run_id, "s2", by=agent)
    assert later.epoch == 2 and later.claim is not None
    before = stored(engine, mission)
    with pytest.raises(charter.Fenced):
        later.report(attempt_id, refused)
    assert stored(engine, mission) == before
    assert engine.incidents(mission) == []
