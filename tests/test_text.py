"""Identifiers and text are stored as given or refused, the same on both stores (A10).

PostgreSQL holds no NUL in text (a text parameter goes up to its first NUL);
SQLite keeps it. A lone surrogate is not Unicode: no store keeps it and no
adapter can encode it. So an identifier holding either, and any text a store
would not keep as given, is a typed error before anything is written, on
both stores alike; requests and results are JSON whose text keeps a NUL as
``\\u0000``, stored losslessly everywhere. Each test asserts on what the store
holds and on what the target received.
"""

from __future__ import annotations

import json
import os
import subprocess
import sys
from collections.abc import Callable
from typing import Any

import pytest

import charter
from charter import AttemptStatus, TextRefused
from charter.adapters.http import HttpAdapter
from charter.attempts.calls import request_hash
from charter.hashing import canonical
from charter.ids import IdFactory
from charter.sandbox import Sandbox
from charter.storage import open_database
from charter.testing import ManualClock, RecordingAdapter
from conftest import Principals, default_contract, payment, payments_contract, stored

UNIT = "usd_cents"
SANDBOX_KEY = "sk_test"
NUL = "\0"
SURROGATE = "\ud800"


def unchanged(engine: charter.Engine, mission: str) -> dict[str, Any]:
    """What a refusal must leave as it was: the mission's rows and its chain."""
    return {**stored(engine, mission), "audit": engine.audit_events(mission)}


def chains_verify(engine: charter.Engine) -> None:
    assert [v.problem for v in engine.verify_audit() if not v.ok] == []


# -- identifiers: refused before anything is written -----------------------------------


def test_A10_effect_keys_differing_after_a_nul_are_refused_and_nothing_is_paid(
    engine: charter.Engine, who: Principals, box: Sandbox, payments: HttpAdapter
) -> None:
    """``inv\\0A`` and ``inv\\0B`` would be one key on PostgreSQL (cut at the NUL),
    two on SQLite: refused on both, so the stores never disagree on an effect."""
    mission = engine.create_mission(payments_contract(), by=who.alice)
    ex = engine.start_run(mission, by=who.agent, segment_id="seg-1")
    before = unchanged(engine, mission)

    for key in (f"inv{NUL}A", f"inv{NUL}B"):
        with pytest.raises(TextRefused) as refused:
            ex.perform(payments, "pay", payment(4_00, key), effect_key=key)
        assert refused.value.details == {"field": "effect key", "problem": "nul", "position": 3}

    assert unchanged(engine, mission) == before
    assert box.requests() == [] and box.payments() == []
    # The same payments under keys both stores keep as given are two payments.
    for key in ("inv-A", "inv-B"):
        assert ex.perform(payments, "pay", payment(4_00, key), effect_key=key).status is (
            AttemptStatus.SUCCEEDED
        )
    assert sorted(p["reference"] for p in box.payments()) == ["inv-A", "inv-B"]
    assert engine.balances(mission)[UNIT].spent == 8_00
    chains_verify(engine)


def test_A10_a_segment_with_a_nul_is_refused_and_the_audit_chain_verifies(
    engine: charter.Engine, who: Principals, mission: str, clock: ManualClock
) -> None:
    """A segment id hashed whole but stored cut would make the chain report a
    tampering that never happened: it is refused, at a start and a takeover."""
    before = unchanged(engine, mission)
    with pytest.raises(TextRefused) as refused:
        engine.start_run(mission, by=who.agent, segment_id=f"seg{NUL}1")
    assert refused.value.details["field"] == "segment id"
    assert unchanged(engine, mission) == before

    ex = engine.start_run(mission, by=who.agent, segment_id="seg-1")
    clock.advance(engine.config.lease_seconds + 1)
    before = unchanged(engine, mission)
    for take_over in (engine.coordinator.recover, engine.coordinator.resume):
        with pytest.raises(TextRefused):
            take_over(ex.run_id, f"seg{NUL}2")
    assert unchanged(engine, mission) == before
    assert engine.run(ex.run_id).epoch == 1
    chains_verify(engine)


def entry_points(
    engine: charter.Engine, who: Principals, mission: str, run_id: str, bad: str
) -> dict[str, Callable[[], object]]:
    """Every public way an identifier (or a person's text) reaches the store."""
    recorder = RecordingAdapter()
    coordinator = engine.coordinator
    return {
        "create_mission name": lambda: engine.create_mission(
            default_contract(), by=who.alice, name=f"pay{bad}"
        ),
        "contract principal": lambda: engine.create_mission(
            default_contract(
                principals={"alice": ["resolve"], f"eve{bad}": {"run": ["recorder.*"]}}
            ),
            by=who.alice,
        ),
        "amend reason": lambda: engine.amend_contract(
            mission, default_contract(), by=who.alice, reason=f"why{bad}"
        ),
        "amend mission id": lambda: engine.amend_contract(
            f"{mission}{bad}", default_contract(), by=who.alice, reason="why"
        ),
        "raise_limit unit": lambda: engine.raise_limit(mission, f"usd{bad}", 10**7, by=who.alice),
        "start_run mission id": lambda: engine.start_run(
            f"{mission}{bad}", by=who.agent, segment_id="seg-9"
        ),
        "new_linked_run run id": lambda: engine.new_linked_run(
            f"{run_id}{bad}", reviewed_by=who.alice, segment_id="seg-9"
        ),
        "stop_run run id": lambda: engine.stop_run(f"{run_id}{bad}", by=who.alice),
        "stop_run reason": lambda: engine.stop_run(run_id, by=who.alice, reason=f"no{bad}"),
        "approve id": lambda: engine.approve(f"apr_x{bad}", by=who.bob),
        "close_incident note": lambda: engine.close_incident("inc_x", by=who.alice, note=bad),
        "read a run": lambda: engine.run(f"{run_id}{bad}"),
        "read an attempt": lambda: engine.get_attempt(f"att_x{bad}"),
        "reconcile attempt id": lambda: coordinator.reconcile(f"att_x{bad}", recorder),
        "confirm attempt id": lambda: coordinator.confirm(f"att_x{bad}", by=who.alice),
        "resolve attempt id": lambda: coordinator.resolve(
            f"att_x{bad}", by=who.alice, outcome="written_off", evidence="checked"
        ),
        "recover run id": lambda: coordinator.recover(f"{run_id}{bad}", "seg-9"),
    }


@pytest.mark.parametrize("bad", [NUL, SURROGATE], ids=["nul", "lone-surrogate"])
def test_A10_every_entry_point_refuses_an_identifier_no_store_keeps(
    engine: charter.Engine, who: Principals, mission: str, adapter: RecordingAdapter, bad: str
) -> None:
    ex = engine.start_run(mission, by=who.agent, segment_id="seg-1")
    before = unchanged(engine, mission)
    missions = engine.missions()

    for name, call in entry_points(engine, who, mission, ex.run_id, bad).items():
        with pytest.raises(TextRefused):
            call()
        assert unchanged(engine, mission) == before, name
        assert engine.missions() == missions, name
    for key, node in ((f"k{bad}", ""), ("k", f"node{bad}")):
        with pytest.raises(TextRefused):
            ex.perform(adapter, "write", {"n": 1}, effect_key=key, node_id=node)
    assert unchanged(engine, mission) == before
    assert adapter.sent == []
    chains_verify(engine)


def test_A10_a_statement_with_text_a_store_cannot_keep_is_refused_on_both_stores(
    store_address: str, clock: ManualClock
) -> None:
    """The rule for whatever text reaches a store, whichever way it came: both
    stores refuse a NUL and a lone surrogate and keep every other text as given."""
    db = open_database(store_address, clock=clock, ids=IdFactory(clock))
    try:
        with db.read() as tx:
            for text in ("plain", "é ü 😀 \x01 \u2028 \uffff", "\U0010ffff"):
                row = tx.one("SELECT ? AS t", text)
                assert row is not None and row["t"] == text
            for text, problem in ((f"a{NUL}b", "nul"), (f"a{SURROGATE}", "surrogate")):
                with pytest.raises(TextRefused) as refused:
                    tx.one("SELECT ? AS t", text)
                assert refused.value.details["problem"] == problem
    finally:
        db.close()


# -- requests and results: JSON text, kept whole ------------------------------------------


def test_A10_a_nul_inside_a_request_and_its_result_is_stored_losslessly(
    engine: charter.Engine, who: Principals, mission: str, adapter: RecordingAdapter
) -> None:
    """The recorded JSON keeps a NUL as ``\\u0000`` on both stores: the request and
    the result read back as sent, the hash covers that text, and the chain verifies."""
    ex = engine.start_run(mission, by=who.agent, segment_id="seg-1")
    request = {"memo": f"line{NUL}break", f"key{NUL}": [f"{NUL}"], "text": "é😀"}

    attempt = ex.perform(adapter, "write", request, effect_key="memo")

    assert attempt.status is AttemptStatus.SUCCEEDED
    assert [s.request for s in adapter.sent] == [request]
    recorded = engine.get_attempt(attempt.id)
    assert recorded.request == request
    assert recorded.result == {"ok": True, "echo": request}
    assert recorded.request_hash == request_hash("recorder", "write", canonical(request))
    chains_verify(engine)


@pytest.mark.parametrize(
    "where",
    ["reference", "key", "nested"],
)
def test_A10_a_lone_surrogate_in_a_request_is_refused_at_admission_and_nothing_is_sent(
    engine: charter.Engine, who: Principals, box: Sandbox, payments: HttpAdapter, where: str
) -> None:
    """The HTTP adapter cannot encode a lone surrogate, so it would send nothing
    and the attempt would wait UNKNOWN with its hold for a person. Admission
    refuses it instead: nothing admitted, nothing held, nothing sent."""
    mission = engine.create_mission(payments_contract(), by=who.alice)
    ex = engine.start_run(mission, by=who.agent, segment_id="seg-1")
    request = payment(3_00, "inv-1")
    if where == "reference":
        request["reference"] = f"inv-{SURROGATE}"
    elif where == "key":
        request[f"memo{SURROGATE}"] = "x"
    else:
        request["lines"] = [{"text": f"ok 😀 then {SURROGATE}"}]
    before = unchanged(engine, mission)

    with pytest.raises(TextRefused) as refused:
        ex.perform(payments, "pay", request, effect_key="inv-1")

    assert refused.value.details["problem"] == "surrogate"
    assert unchanged(engine, mission) == before
    assert engine.attempts(mission_id=mission) == []
    assert engine.balances(mission)[UNIT].held == 0
    assert box.requests() == [] and box.payments() == []
    # The effect is free: the same payment in valid text goes out once.
    done = ex.perform(payments, "pay", payment(3_00, "inv-1"), effect_key="inv-1")
    assert done.status is AttemptStatus.SUCCEEDED
    assert [p["reference"] for p in box.payments()] == ["inv-1"]
    chains_verify(engine)


def test_A10_charter_audit_verify_passes_after_refusals_and_nul_requests(
    engine: charter.Engine,
    who: Principals,
    mission: str,
    adapter: RecordingAdapter,
    store_address: str,
) -> None:
    """What an operator runs: every chain verifies after text was refused and a
    request holding a NUL was recorded."""
    ex = engine.start_run(mission, by=who.agent, segment_id="seg-1")
    with pytest.raises(TextRefused):
        engine.start_run(mission, by=who.agent, segment_id=f"seg{NUL}2")
    ex.perform(adapter, "write", {"memo": f"a{NUL}b"}, effect_key="memo")
    done = subprocess.run(
        [sys.executable, "-m", "charter", "audit", "verify", "--store", store_address, "--json"],
        env={**os.environ, "CHARTER_CONFIG": os.devnull},
        capture_output=True,
        text=True,
        timeout=60,
    )
    assert done.returncode == 0, done.stderr
    chains = json.loads(done.stdout)
    assert chains and all(c["ok"] for c in chains)
