"""The HTTP adapter against the payments sandbox, over real sockets (A2-A8, F3, R7).

One test per way a payments API misbehaves. Each asserts on what the store
holds and on what the sandbox applied; after every one, the sandbox shows each
payment applied at most once and the ledger's spend equals the sandbox's sum.
"""

from __future__ import annotations

import dataclasses
import json
import socket
from collections.abc import Callable
from pathlib import Path
from typing import Any

import pytest

import charter
from _clocks import Stalls
from charter import AttemptStatus
from charter.adapters.http import (
    Classification,
    HttpAdapter,
    HttpDeclaration,
    HttpOperation,
    declare,
)
from charter.conformance.http_target import ScriptedHttp
from charter.sandbox import Sandbox, declaration
from charter.testing import ManualClock
from conftest import Principals, payment, payments_contract

UNIT = "usd_cents"
SANDBOX_KEY = "sk_test"
LEASE = 30.0
MakeEngine = Callable[..., charter.Engine]
Creds = tuple[dict[str, str], dict[str, str]]


@pytest.fixture
def mission(engine: charter.Engine, who: Principals) -> str:
    return engine.create_mission(payments_contract(), by=who.alice)


def books_agree(engine: charter.Engine, mission: str, box: Sandbox) -> None:
    """Each key applied at most once, and what the ledger spent is what the sandbox took."""
    applied = box.payments()
    keys = [p["idempotency_key"] for p in applied]
    assert len(keys) == len(set(keys))
    settled = [
        a for a in engine.attempts(mission_id=mission) if a.status is AttemptStatus.SUCCEEDED
    ]
    assert engine.balances(mission)[UNIT].spent == sum(p["amount"] for p in applied)
    assert sorted(a.idempotency_key for a in settled) == sorted(keys)
    assert engine.check_ledger(mission) == []


def verdicts(engine: charter.Engine, attempt_id: str) -> list[str]:
    return [row["verdict"] for row in engine.evidence(attempt_id)]


def take_over(engine: charter.Engine, run_id: str, clock: ManualClock) -> None:
    clock.advance(LEASE)
    engine.coordinator.recover(run_id, "seg-2")


# -- lost and late answers: UNKNOWN, then the lookup ---------------------------------------


def test_A3_R7_applied_but_response_lost_is_unknown_until_a_person_confirms_the_lookup(
    engine: charter.Engine,
    who: Principals,
    mission: str,
    box: Sandbox,
    payments: HttpAdapter,
    clock: ManualClock,
) -> None:
    ex = engine.start_run(mission, by=who.agent, segment_id="seg-1")
    box.fault("drop_after_apply")

    attempt = ex.perform(payments, "pay", payment(4_50, "inv-1"), effect_key="inv-1")

    assert attempt.status is AttemptStatus.UNKNOWN
    assert engine.balances(mission)[UNIT].held == 4_50
    assert len(box.payments()) == 1
    take_over(engine, ex.run_id, clock)

    evidence = engine.coordinator.reconcile(attempt.id, payments)

    assert evidence.verdict == "applied"
    [row] = engine.evidence(attempt.id)
    assert json.loads(row["outcome"])["cost"] == {UNIT: 4_50}
    assert json.loads(row["outcome"])["result"]["id"] == box.payments()[0]["id"]
    assert engine.get_attempt(attempt.id).status is AttemptStatus.UNKNOWN
    settled = engine.coordinator.confirm(attempt.id, by=who.alice)
    assert settled.status is AttemptStatus.SUCCEEDED
    assert settled.actual == {UNIT: 4_50}
    assert engine.balances(mission)[UNIT].held == 0
    books_agree(engine, mission, box)


def test_R7_under_auto_the_lookup_settles_a_lost_response_at_once(
    make_engine: MakeEngine,
    creds: Creds,
    box: Sandbox,
    payments: HttpAdapter,
    clock: ManualClock,
) -> None:
    engine = make_engine(evidence_settles="auto")
    who = Principals(*creds, engine)
    mission = engine.create_mission(payments_contract(), by=who.alice)
    ex = engine.start_run(mission, by=who.agent, segment_id="seg-1")
    box.fault("drop_after_apply")
    attempt = ex.perform(payments, "pay", payment(12_00, "inv-2"), effect_key="inv-2")
    take_over(engine, ex.run_id, clock)

    engine.coordinator.reconcile(attempt.id, payments)

    assert engine.get_attempt(attempt.id).status is AttemptStatus.SUCCEEDED
    assert engine.get_attempt(attempt.id).actual == {UNIT: 12_00}
    books_agree(engine, mission, box)


@pytest.mark.parametrize(
    ("fault", "seconds", "reason"),
    [("slow", 1.5, "Timeout"), ("error_after_apply", 0.0, "HTTP 500")],
    ids=["answer-slower-than-the-timeout", "5xx-after-applying"],
)
def test_A3_an_answer_that_may_hide_an_application_is_unknown_and_the_lookup_finds_it(
    engine: charter.Engine,
    who: Principals,
    mission: str,
    box: Sandbox,
    payments: HttpAdapter,
    clock: ManualClock,
    fault: str,
    seconds: float,
    reason: str,
) -> None:
    ex = engine.start_run(mission, by=who.agent, segment_id="seg-1")
    box.fault(fault, seconds=seconds)

    attempt = ex.perform(payments, "pay", payment(7_00, "inv-3"), effect_key="inv-3")

    assert attempt.status is AttemptStatus.UNKNOWN
    assert reason in (attempt.reason or "")
    assert engine.balances(mission)[UNIT].held == 7_00
    take_over(engine, ex.run_id, clock)
    assert engine.coordinator.reconcile(attempt.id, payments).verdict == "applied"
    assert engine.coordinator.confirm(attempt.id, by=who.alice).actual == {UNIT: 7_00}
    books_agree(engine, mission, box)


def test_R7_a_lookup_that_finds_nothing_proves_non_application_and_closes_the_key(
    engine: charter.Engine, who: Principals, box: Sandbox, clock: ManualClock
) -> None:
    """A 429 the API does not document as unprocessed is UNKNOWN (the default);
    the lookup by key finds nothing and closes the key, which proves it."""
    mission = engine.create_mission(payments_contract(), by=who.alice)
    plain = declaration(box.url, api_key="sk_test")
    defaults = HttpDeclaration(
        plain.name, plain.base_url, plain.operations, headers=plain.headers
    ).build()
    ex = engine.start_run(mission, by=who.agent, segment_id="seg-1")
    box.fault("refuse")

    attempt = ex.perform(defaults, "pay", payment(5_00, "inv-5"), effect_key="inv-5")

    assert attempt.status is AttemptStatus.UNKNOWN
    assert box.payments() == []
    take_over(engine, ex.run_id, clock)
    assert engine.coordinator.reconcile(attempt.id, defaults).verdict == "not_applied"
    settled = engine.coordinator.confirm(attempt.id, by=who.alice)
    assert settled.status is AttemptStatus.FAILED
    assert engine.balances(mission)[UNIT].held == 0
    # The key is closed: the original request, had it been in flight, cannot apply now.
    late = defaults._client.post(  # a late copy of the send
        "/v1/payments",
        json=payment(5_00, "inv-5"),
        headers={"Idempotency-Key": attempt.idempotency_key, "Authorization": "Bearer sk_test"},
    )
    assert late.status_code == 409
    assert box.payments() == []
    books_agree(engine, mission, box)
    defaults.close()


def test_R7_lookups_unavailable_leave_the_attempt_unknown_with_its_hold(
    engine: charter.Engine,
    who: Principals,
    mission: str,
    box: Sandbox,
    payments: HttpAdapter,
    clock: ManualClock,
) -> None:
    ex = engine.start_run(mission, by=who.agent, segment_id="seg-1")
    box.fault("drop_after_apply")
    attempt = ex.perform(payments, "pay", payment(8_00, "inv-6"), effect_key="inv-6")
    take_over(engine, ex.run_id, clock)
    box.fault("lookups_unavailable")

    evidence = engine.coordinator.reconcile(attempt.id, payments)

    assert evidence.verdict == "indeterminate"
    assert evidence.detail["status"] == 503
    assert engine.get_attempt(attempt.id).status is AttemptStatus.UNKNOWN
    assert engine.balances(mission)[UNIT].held == 8_00
    assert len(box.payments()) == 1  # applied: the hold stays until someone proves it


@pytest.mark.parametrize("failure", ["lookup_refused", "lookup_reset", "lookup_timeout"])
def test_A3_R7_item13_a_lookup_that_raises_proves_nothing_even_where_absence_is_proof(
    make_engine: MakeEngine, creds: Creds, failure: str
) -> None:
    """Broken, it looks like a payment applied while the lookup's connection was
    refused, reset or timed out read as absent: under ``evidence_settles =
    "auto"`` and ``absent_is_proof`` it is settled FAILED, its hold released, and
    the next try pays twice. Only an answer the target gave can be proof."""
    engine = make_engine(evidence_settles="auto")
    who = Principals(*creds, engine)
    mission = engine.create_mission(payments_contract(), by=who.alice)
    with ScriptedHttp() as target:
        declared = target.declaration(name="payments")
        keyed = dataclasses.replace(
            declared.operations["create"], absent_is_proof=True, lookup_empty_is_absent=True
        )
        adapter = dataclasses.replace(declared, operations={"create": keyed}).build()
        ex = engine.start_run(mission, by=who.agent, segment_id="seg-1")
        target.arm("applied_then_lost")
        attempt = ex.perform(adapter, "create", payment(6_00, "inv-13"), effect_key="inv-13")
        assert target.arm(failure)

        evidence = engine.coordinator.reconcile(attempt.id, adapter)
        adapter.close()

    assert evidence.verdict == "indeterminate"
    assert verdicts(engine, attempt.id) == ["indeterminate"]
    assert engine.get_attempt(attempt.id).status is AttemptStatus.UNKNOWN
    assert engine.balances(mission)[UNIT].held == 6_00
    assert target.applied(attempt.idempotency_key) == 1
    assert target.received(attempt.idempotency_key) == 1


def test_A8_a_same_key_replay_answers_the_first_payment_and_applies_nothing_new(
    engine: charter.Engine,
    who: Principals,
    mission: str,
    box: Sandbox,
    payments: HttpAdapter,
    clock: ManualClock,
) -> None:
    ex = engine.start_run(mission, by=who.agent, segment_id="seg-1")
    box.fault("drop_after_apply")
    attempt = ex.perform(payments, "pay", payment(9_00, "inv-7"), effect_key="inv-7")
    clock.advance(LEASE)
    engine.coordinator.recover(ex.run_id, "seg-2")
    box.fault("lookups_unavailable")

    evidence = engine.coordinator.reconcile(attempt.id, payments, segment_id="seg-2")

    assert evidence.verdict == "applied"
    [replayed] = [r for r in box.requests() if r["verdict"] == "replayed"]
    assert replayed["idempotency_key"] == attempt.idempotency_key
    assert replayed["fencing_token"] == f"{ex.run_id}:2"
    assert len(box.payments()) == 1
    assert engine.coordinator.confirm(attempt.id, by=who.alice).status is AttemptStatus.SUCCEEDED
    books_agree(engine, mission, box)


# -- answers that settle at once -------------------------------------------------------------


@pytest.mark.parametrize(
    ("status", "request_", "operation"),
    [
        (400, {"amount": 1_00, "currency": "", "payee": "acme"}, "pay"),
        (401, None, "pay"),
        (403, payment(1_00, "inv-8", payee="blocked"), "pay"),
        (404, payment(1_00, "inv-8"), "missing"),
    ],
    ids=["400-invalid", "401-unauthorized", "403-forbidden", "404-no-such-endpoint"],
)
def test_A3_a_4xx_refusal_is_failed_with_the_response_as_receipt(
    engine: charter.Engine,
    who: Principals,
    mission: str,
    box: Sandbox,
    status: int,
    request_: dict[str, Any] | None,
    operation: str,
) -> None:
    base = declaration(box.url, api_key=None if status == 401 else "sk_test")
    ops = dict(base.operations)
    ops["missing"] = HttpOperation(
        "POST", "/v1/nowhere", charter.EffectClass.UNSAFE, estimate={UNIT: "amount"}
    )
    adapter = HttpDeclaration(base.name, base.base_url, ops, headers=base.headers).build()
    ex = engine.start_run(mission, by=who.agent, segment_id="seg-1")

    attempt = ex.perform(adapter, operation, request_ or payment(1_00, "inv-8"), effect_key="e")

    assert attempt.status is AttemptStatus.FAILED
    assert attempt.receipt["status"] == status
    assert attempt.result["error"]["code"]
    assert box.payments() == []
    assert engine.balances(mission)[UNIT].held == 0
    books_agree(engine, mission, box)
    adapter.close()


def test_A3_a_key_reused_with_another_body_is_refused_422_and_applies_nothing(
    engine: charter.Engine, who: Principals, mission: str, box: Sandbox, payments: HttpAdapter
) -> None:
    ex = engine.start_run(mission, by=who.agent, segment_id="seg-1")
    first = ex.perform(payments, "pay", payment(2_00, "inv-9"), effect_key="inv-9")
    forged = payments._client.post(  # another client reusing the key
        "/v1/payments",
        json=payment(99_00, "inv-9"),
        headers={"Idempotency-Key": first.idempotency_key, "Authorization": "Bearer sk_test"},
    )
    assert forged.status_code == 422
    assert [p["amount"] for p in box.payments()] == [2_00]
    books_agree(engine, mission, box)


def test_A2_refused_connection_is_not_applied_and_releases_the_hold(
    engine: charter.Engine, who: Principals, mission: str
) -> None:
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        port = s.getsockname()[1]  # closed again: nothing listens there
    adapter = declaration(f"http://127.0.0.1:{port}").build()
    ex = engine.start_run(mission, by=who.agent, segment_id="seg-1")

    attempt = ex.perform(adapter, "pay", payment(6_00, "inv-10"), effect_key="inv-10")

    assert attempt.status is AttemptStatus.FAILED
    assert verdicts(engine, attempt.id) == ["not_applied"]
    assert engine.balances(mission)[UNIT].held == 0
    assert engine.balances(mission)[UNIT].spent == 0
    adapter.close()


# -- fencing and the deadline, at the wire ---------------------------------------------------


def test_F2_a_stale_fencing_token_is_refused_by_the_target_before_it_applies(
    engine: charter.Engine,
    who: Principals,
    mission: str,
    box: Sandbox,
    payments: HttpAdapter,
    clock: ManualClock,
) -> None:
    """A send of epoch 1 still in flight after epoch 2 has sent is refused by the sandbox."""
    ex = engine.start_run(mission, by=who.agent, segment_id="seg-1")
    ex.perform(payments, "pay", payment(1_00, "inv-11"), effect_key="inv-11")
    clock.advance(LEASE)
    engine.coordinator.recover(ex.run_id, "seg-2")
    new = engine.coordinator.resume(ex.run_id, "seg-2", by=who.agent)
    new.perform(payments, "pay", payment(2_00, "inv-12"), effect_key="inv-12")
    stale = charter.Dispatch(
        "att_zombie",
        "pay",
        payment(3_00, "inv-13"),
        "key-zombie",
        ex.run_id,
        1,
        send_deadline_us=clock.now_us() + 10_000_000,
        deadline_monotonic_us=clock.monotonic_us() + 10_000_000,
        clock=clock,
    )

    with pytest.raises(charter.NotApplied) as refused:
        payments.dispatch(stale)

    assert refused.value.evidence["status"] == 409
    assert refused.value.evidence["body"]["error"]["code"] == "stale_fencing_token"
    assert [p["amount"] for p in box.payments()] == [1_00, 2_00]


def test_F3_nothing_is_sent_after_the_send_deadline(box: Sandbox, payments: HttpAdapter) -> None:
    clock = ManualClock()
    late = charter.Dispatch(
        "att_late",
        "pay",
        payment(1_00, "inv-14"),
        "key-late",
        "run_x",
        1,
        send_deadline_us=clock.now_us(),
        deadline_monotonic_us=clock.monotonic_us(),
        clock=clock,
    )

    with pytest.raises(charter.NotApplied):
        payments.dispatch(late)

    assert box.requests() == []
    assert box.payments() == []


def test_F3_a_deadline_passed_while_the_connection_was_taken_sends_nothing(
    box: Sandbox, payments: HttpAdapter
) -> None:
    """The adapter checks the deadline before its client takes a connection; the
    socket checks it again before the first byte, so a pause in between (here,
    the clock passing the deadline right after the adapter's checks) sends
    nothing, even on a connection kept from an earlier send."""
    clock = Stalls(checks=1_000)

    def send(attempt: str, request: Any) -> charter.Dispatch:
        return charter.Dispatch(
            attempt,
            "pay",
            request,
            f"key-{attempt}",
            "run_x",
            1,
            send_deadline_us=clock.now_us() + 30_000_000,
            deadline_monotonic_us=clock.monotonic_us() + 30_000_000,
            clock=clock,
        )

    payments.dispatch(send("att_first", payment(1_00, "inv-15")))
    late = send("att_stalled", payment(2_00, "inv-16"))
    clock.checks = 2  # the time left for the connect timeout, then the adapter's check

    with pytest.raises(charter.NotApplied, match="deadline"):
        payments.dispatch(late)

    assert [r["idempotency_key"] for r in box.requests()] == ["key-att_first"]
    assert [p["reference"] for p in box.payments()] == ["inv-15"]


def test_A3_F3_a_deadline_passed_once_the_first_byte_went_out_is_not_called_not_applied(
    box: Sandbox, payments: HttpAdapter
) -> None:
    """The socket checks the deadline before the first byte only: once the
    headers went out the target may act on them, so the body follows and the
    answer decides, never a refusal that claims nothing was applied (A3)."""
    # Past the deadline at any look after the connect timeout's, the adapter's
    # and the first write's: as if paused between the headers and the body.
    clock = Stalls(checks=3)
    sent = charter.Dispatch(
        "att_midway",
        "pay",
        payment(3_00, "inv-17"),
        "key-att_midway",
        "run_x",
        1,
        send_deadline_us=clock.now_us() + 30_000_000,
        deadline_monotonic_us=clock.monotonic_us() + 30_000_000,
        clock=clock,
    )
    clock.checks = 3

    outcome = payments.dispatch(sent)

    assert outcome.status == "succeeded"
    assert [p["reference"] for p in box.payments()] == ["inv-17"]


# -- declarations ----------------------------------------------------------------------------


def test_default_classification_is_the_safe_reading_of_http() -> None:
    c = Classification()
    assert [c.of(s) for s in (200, 201, 400, 401, 403, 404, 422)] == [
        "succeeded",
        "succeeded",
        "failed",
        "failed",
        "failed",
        "failed",
        "failed",
    ]
    assert {c.of(s) for s in (301, 408, 409, 418, 429, 500, 502, 503)} == {"unknown"}
    assert Classification({429: "not_applied"}).of(429) == "not_applied"


_OP = {"method": "POST", "path": "/p", "effect": "unsafe", "estimate": {}}


@pytest.mark.parametrize(
    ("table", "message"),
    [
        ({"http": "ftp://x", "operations": {"a": {}}}, "needs method"),
        ({"http": "ftp://x"}, "operations"),
        ({"http": "not a url", "operations": {"pay": _OP}}, "base_url"),
        ({"http": "http://x", "operations": {"pay": {**_OP, "method": "FETCH"}}}, "method"),
        ({"http": "http://x", "operations": {"pay": {**_OP, "effect": "maybe"}}}, "effect"),
        ({"http": "http://x", "operations": {"pay": {**_OP, "absent_is_proof": True}}}, "lookup"),
        (
            {"http": "http://x", "operations": {"pay": {**_OP, "effect": "idempotent_keyed"}}},
            "dedupe window",
        ),
        ({"http": "http://x", "operations": {"pay": {**_OP, "estimate": {"usd": 3}}}}, "dotted"),
        ({"http": "http://x", "operations": {"pay": {**_OP, "colour": 1}}}, "unknown key"),
        (
            {
                "http": "http://x",
                "classify": {"200": "failed", "299": "maybe"},
                "operations": {"pay": _OP},
            },
            "use one of",
        ),
        (
            {"http": "http://x", "classify": {"500": "succeeded"}, "operations": {"pay": _OP}},
            "cannot mean success",
        ),
        ({"http": "http://x", "timeout_seconds": 0, "operations": {"pay": _OP}}, "timeout"),
    ],
)
def test_a_bad_http_declaration_is_refused_with_a_config_error(
    table: dict[str, Any], message: str
) -> None:
    with pytest.raises(charter.ConfigError, match=message):
        declare("payments", table)


def test_an_http_adapter_declared_in_toml_is_built_by_the_engine_config(
    tmp_path: Path, box: Sandbox, monkeypatch: pytest.MonkeyPatch
) -> None:
    monkeypatch.setenv("SANDBOX_AUTH", "Bearer sk_test")
    (tmp_path / "charter.toml").write_text(
        f"""
[adapters.payments]
http = "{box.url}"
headers = {{ Authorization = "env:SANDBOX_AUTH" }}
classify = {{ 409 = "not_applied", 429 = "not_applied" }}

[adapters.payments.operations.pay]
method = "POST"
path = "/v1/payments"
effect = "idempotent_keyed"
dedupe_window_seconds = 86400
estimate = {{ {UNIT} = "amount" }}
cost = {{ {UNIT} = "amount" }}
lookup = "/v1/payments/by-key/{{idempotency_key}}"
absent_is_proof = true
"""
    )
    config = charter.EngineConfig.from_file(tmp_path / "charter.toml")
    adapter = config.load_adapter("payments")
    assert isinstance(adapter, HttpAdapter)
    with adapter:
        assert adapter.operations["pay"].effect is charter.EffectClass.IDEMPOTENT_KEYED
        assert adapter.estimate("pay", payment(4_50, "inv-15")).amounts == {UNIT: 4_50}
        box.fault("drop_after_apply")
        clock = ManualClock()
        with pytest.raises(Exception, match="Server disconnected"):
            adapter.dispatch(
                charter.Dispatch(
                    "att_1",
                    "pay",
                    payment(4_50, "inv-15"),
                    "key-15",
                    "run_1",
                    1,
                    send_deadline_us=clock.now_us() + 10**7,
                    deadline_monotonic_us=clock.monotonic_us() + 10**7,
                    clock=clock,
                )
            )

        class Recorded:
            id, run_id, operation, request_hash = "att_1", "run_1", "pay", "h"
            request, idempotency_key = payment(4_50, "inv-15"), "key-15"
            estimate, dispatched_epoch, dispatched_at_us = {UNIT: 4_50}, 1, 0

        found = adapter.reconcile(Recorded())
        assert found.verdict == "applied"
        assert found.outcome is not None and found.outcome.cost == {UNIT: 4_50}
