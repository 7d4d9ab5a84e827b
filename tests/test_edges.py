"""What a target's answer may and may not do to the record (A3, A10, S3).

Each test sends through a real adapter to a real server on loopback and then
reads what the store holds: a list-shaped lookup does not settle a payment
that never happened, a credential a target quotes back is stored nowhere,
and a huge answer is stored once and bounded.
"""

from __future__ import annotations

import json
from collections.abc import Iterator
from typing import Any

import pytest

import charter
from _fake_models import FakeProvider
from charter import AttemptStatus
from charter.adapters.http import declare
from charter.adapters.models.openai import OpenAIModels
from charter.conformance.http_target import ScriptedHttp
from charter.sandbox import Sandbox
from charter.testing import RecordingAdapter
from conftest import Principals, default_contract

SECRET = "sk-live-edge-4f9c2a7be1d04c6f"
REQUEST = {"amount": 7_00, "currency": "usd", "payee": "acme", "reference": "inv-7"}


@pytest.fixture
def target() -> Iterator[ScriptedHttp]:
    with ScriptedHttp(secret=SECRET) as scripted:
        yield scripted


def _mission(engine: charter.Engine, who: Principals, adapter: str) -> str:
    contract = default_contract(
        principals={"agent": {"run": [f"{adapter}.*"]}, "alice": ["resolve", "stop"]},
        allowance={
            "usd_cents": 100_000,
            "usd": 1_000_000,
            "calls": 100,
            "input_tokens": 100_000,
            "output_tokens": 10_000,
        },
        units={"usd": {"scale": 6, "name": "USD"}},
    )
    return engine.create_mission(contract, by=who.alice)


def _everything(engine: charter.Engine, mission: str) -> str:
    """All the store holds about the mission, audit chain included, as text."""
    attempts = engine.attempts(mission_id=mission)
    return json.dumps(
        {
            "attempts": [a.to_dict() for a in attempts],
            "evidence": [engine.evidence(a.id) for a in attempts],
            "audit": engine.audit_events(mission),
            "incidents": engine.incidents(mission),
        },
        default=str,
    )


def test_A3_R7_a_list_lookup_that_finds_nothing_does_not_settle_a_payment_never_made(
    make_engine: Any, creds: Any, tmp_path: Any
) -> None:
    """The sandbox refuses a payment with a 429 this declaration does not know
    as a refusal (so the attempt is UNKNOWN), and has no cost rule. Its lookup
    is the list endpoint, which answers ``200 {"data": []}``: that used to be
    read as applied and, under ``evidence_settles="auto"``, settled SUCCEEDED
    at the estimate: the ledger spent what the target never took."""
    engine = make_engine(evidence_settles="auto")
    who = Principals(creds[0], creds[1], engine)
    table = {
        "http": "",
        "timeout_seconds": 0.5,
        "operations": {
            "pay": {
                "method": "POST",
                "path": "/v1/payments",
                "effect": "unsafe",
                "estimate": {"usd_cents": "amount"},
                "lookup": "/v1/payments?reference={reference}",
            }
        },
    }
    with Sandbox(tmp_path / "box.db") as box:
        adapter = declare("payments", {**table, "http": box.url}).build()
        mission = _mission(engine, who, "payments")
        run = engine.start_run(mission, by=who.agent, segment_id="seg-1")
        box.fault("refuse")  # 429, nothing applied
        refused = run.perform(adapter, "pay", REQUEST, effect_key="inv-7")
        assert refused.status is AttemptStatus.UNKNOWN
        evidence = engine.coordinator.reconcile(refused.id, adapter)
        adapter.close()
        assert box.payments() == []
    assert evidence.verdict == "indeterminate"
    assert engine.get_attempt(refused.id).status is AttemptStatus.UNKNOWN
    assert engine.balances(mission)["usd_cents"].spent == 0
    assert engine.balances(mission)["usd_cents"].held == 7_00  # waits for a person


def test_A3_an_empty_list_answer_proves_nothing_even_where_absence_is_proof(
    engine: charter.Engine, who: Principals, target: ScriptedHttp
) -> None:
    decl = target.declaration(name="things")
    op = decl.operations["create"]
    adapter = type(decl)(
        decl.name,
        decl.base_url,
        {"create": type(op)(**{**vars(op), "lookup_match": None})},
        headers=decl.headers,
        timeout_seconds=0.5,
    ).build()
    mission = _mission(engine, who, "things")
    run = engine.start_run(mission, by=who.agent, segment_id="seg-1")
    target.arm("applied_then_lost")
    lost = run.perform(adapter, "create", REQUEST, effect_key="t-1")
    target.arm("lookup_list")  # 200 {"data": []}
    assert engine.coordinator.reconcile(lost.id, adapter).verdict == "indeterminate"
    target.arm("lookup_empty")  # 200, no body
    assert engine.coordinator.reconcile(lost.id, adapter).verdict == "indeterminate"
    assert engine.coordinator.reconcile(lost.id, adapter).verdict == "applied"  # it is there
    assert target.applied(lost.idempotency_key) == 1
    adapter.close()


def test_S3_an_env_header_echoed_by_the_target_is_stored_nowhere(
    engine: charter.Engine,
    who: Principals,
    target: ScriptedHttp,
    monkeypatch: pytest.MonkeyPatch,
) -> None:
    """An ``env:`` header is read when the request is sent; a target that echoes
    it (in its body, in an error) used to get it into the attempt's result, its
    receipt and the audit events."""
    monkeypatch.setenv("EDGE_AUTH", f"Bearer {SECRET}")
    table = {
        "http": target.url,
        "headers": {"Authorization": "env:EDGE_AUTH"},
        "timeout_seconds": 0.5,
        "operations": {
            "create": {
                "method": "POST",
                "path": "/v1/things",
                "effect": "unsafe",
                "estimate": {"usd_cents": "amount"},
            }
        },
    }
    mission = _mission(engine, who, "things")
    with declare("things", table).build() as adapter:
        run = engine.start_run(mission, by=who.agent, segment_id="seg-1")
        target.arm("echo_in_body")
        echoed = run.perform(adapter, "create", REQUEST, effect_key="a")
        target.arm("echo_in_exception")
        failed = run.perform(adapter, "create", {**REQUEST, "reference": "b"}, effect_key="b")
    assert echoed.status is AttemptStatus.SUCCEEDED
    assert echoed.result["seen_authorization"] == "***"
    assert failed.status is AttemptStatus.UNKNOWN
    assert SECRET not in _everything(engine, mission)


def test_S3_a_model_api_key_quoted_back_in_a_401_is_stored_nowhere(
    engine: charter.Engine, who: Principals
) -> None:
    """A provider that quotes the key in its 401 body: the refusal is kept as
    evidence, without the key (it used to be stored in evidence and audit)."""
    with FakeProvider(faults=["401_quoting_key"]) as provider:
        adapter = OpenAIModels(base_url=f"{provider.url}/v1", api_key=SECRET, timeout=5.0)
        mission = _mission(engine, who, "openai")
        run = engine.start_run(mission, by=who.agent, segment_id="seg-1")
        request = {"model": "gpt-4o-mini", "input": "hi", "max_output_tokens": 20}
        refused = run.perform(adapter, "responses", request, effect_key="m")
        assert provider.received[0].headers["authorization"] == f"Bearer {SECRET}"
    assert refused.status is AttemptStatus.FAILED  # a 401 is a refusal before any work
    stored = _everything(engine, mission)
    assert "Incorrect API key provided: ***" in stored
    assert SECRET not in stored


def test_A10_a_huge_answer_is_stored_once_and_bounded(
    make_engine: Any, creds: Any, target: ScriptedHttp
) -> None:
    """A 50 MB answer used to be stored four times over (result, receipt, the
    settlement's audit event, again in evidence): now the result keeps its
    head, its length and its SHA-256, and the audit event refers to it."""
    engine = make_engine(answer_bytes=100_000)
    who = Principals(creds[0], creds[1], engine)
    mission = _mission(engine, who, "things")
    with target.declaration(timeout_seconds=10.0).build() as adapter:
        run = engine.start_run(mission, by=who.agent, segment_id="seg-1")
        target.arm("huge_answer")
        big = run.perform(adapter, "create", REQUEST, effect_key="big")
    assert big.status is AttemptStatus.SUCCEEDED
    kept = big.result["$bounded"]
    assert kept["bytes"] > 50 * 1024 * 1024
    assert len(kept["head"]) == 100_000
    assert big.receipt == {"status": 201}  # the body is not repeated as the receipt
    settled = [e for e in engine.audit_events(mission) if e["kind"] == "attempt.settled"]
    assert "$stored" in json.dumps(settled[-1])
    assert len(_everything(engine, mission)) < 400_000


@pytest.mark.parametrize("odd", ["\x00", "\ud800"], ids=["nul", "lone-surrogate"])
def test_A3_A10_an_adapter_error_whose_text_no_store_keeps_still_leaves_the_attempt_unknown(
    engine: charter.Engine, who: Principals, odd: str
) -> None:
    """A target's error text is whatever it sent: a NUL or a lone surrogate in it
    must not make the settlement unrecordable (the attempt would stay DISPATCHED
    until a recovery). It is kept, escaped, and the attempt is UNKNOWN."""

    def broken(send: charter.Dispatch) -> charter.Outcome:
        raise ConnectionResetError(f"peer said {odd}bye after the write")

    adapter = RecordingAdapter(script={"write": broken})
    mission = _mission(engine, who, "recorder")
    run = engine.start_run(mission, by=who.agent, segment_id="seg-1")
    lost = run.perform(adapter, "write", {"to": "x"}, effect_key="w")
    assert lost.status is AttemptStatus.UNKNOWN
    assert len(adapter.sent) == 1
    escaped = "\\x00" if odd == "\x00" else "\\ud800"
    assert f"peer said {escaped}bye" in (engine.get_attempt(lost.id).reason or "")
