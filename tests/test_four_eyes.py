"""P3: four eyes on approvals, and who may call ``recover`` and ``reconcile``.

Four eyes: the principal whose run requested an effect never approves it, when
the contract asks for it (``approvals.four_eyes``) and by default for an
effect estimated in a money unit (one the contract describes under ``units``).
``recover`` and ``reconcile`` (which can replay a send) are rights: granted by
name, or coming with ``run`` or ``resolve``. A refusal is the same audited
``NotAuthorized`` as any other decision's, and changes nothing else.
"""

from __future__ import annotations

import json
from collections.abc import Callable
from pathlib import Path
from typing import Any

import pytest

import _cli_mission
import charter
from charter.cli.app import main
from charter.contracts.amendments import amendment_needs
from charter.testing import ManualClock, RecordingAdapter, credential
from charter.waits.model import Approval, ApprovalStatus
from conftest import Principals, default_contract, stored

MONEY = {"usd": {"scale": 6, "name": "USD"}}


def _contract(**approvals: Any) -> dict[str, Any]:
    """``agent`` runs and may approve; ``bob`` approves; ``usd`` is money."""
    return default_contract(
        principals={
            "agent": {"run": ["recorder.*"], "approve": ["recorder.*"]},
            "alice": ["resolve", "raise_limit", "stop"],
            "bob": {"approve": ["recorder.*"]},
        },
        approvals={"required": ["recorder.charge"], **approvals},
        units=MONEY,
    )


def _asked(
    engine: charter.Engine, who: Principals, adapter: RecordingAdapter, contract: dict[str, Any]
) -> tuple[str, charter.Executor, Approval]:
    """A mission whose agent's run asks for approval of a charge (20_000 usd held)."""
    mission = engine.create_mission(contract, by=who.alice)
    ex = engine.start_run(mission, by=who.agent, segment_id="seg-1")
    with pytest.raises(charter.ApprovalRequired):
        ex.perform(adapter, "charge", {"amount": 1}, effect_key="charge")
    (approval,) = engine.approvals(pending=True)
    return mission, ex, approval


def _events_since(engine: charter.Engine, mission: str, seen: int) -> list[dict[str, Any]]:
    return engine.audit_events(mission)[seen:]


# -- four eyes ------------------------------------------------------------------------------


def test_P3_four_eyes_is_the_default_for_money_the_requester_is_refused_and_audited(
    engine: charter.Engine, who: Principals, adapter: RecordingAdapter
) -> None:
    """Broken P3: the agent, holding ``approve``, approves the payment its own run
    asked for. The refusal stores nothing but itself; another approver decides."""
    mission, ex, approval = _asked(engine, who, adapter, _contract())
    before, seen = stored(engine, mission), len(engine.audit_events(mission))
    with pytest.raises(charter.NotAuthorized) as info:
        engine.approve(approval.id, by=who.agent)
    assert info.value.code == "not_authorized"
    assert info.value.details == {
        "principal": "agent",
        "right": "approve",
        "scope": "recorder.charge",
        "rule": "four_eyes",
    }
    assert stored(engine, mission) == before
    (event,) = _events_since(engine, mission, seen)
    assert (event["kind"], event["actor"], event["entity"]) == (
        "authorization.refused",
        "agent",
        approval.id,
    )
    assert json.loads(event["payload"])["reason"] == "four_eyes"
    assert all(v.ok for v in engine.verify_audit())
    assert adapter.sent == []

    engine.approve(approval.id, by=who.bob)  # a second pair of eyes
    (charged,) = [a for a in engine.attempts(mission_id=mission) if a.operation == "charge"]
    assert ex.dispatch(charged.id, adapter).status is charter.AttemptStatus.SUCCEEDED
    assert len(adapter.sent) == 1


def test_P3_the_requester_may_still_deny_its_own_request(
    engine: charter.Engine, who: Principals, adapter: RecordingAdapter
) -> None:
    """Four eyes guard a "yes": saying no to one's own request sends nothing."""
    _, _, approval = _asked(engine, who, adapter, _contract())
    assert engine.approve(approval.id, by=who.agent, deny=True) is ApprovalStatus.DENIED
    assert adapter.sent == []


def test_P3_a_contract_opts_out_of_four_eyes_explicitly(
    engine: charter.Engine, who: Principals, adapter: RecordingAdapter
) -> None:
    mission, ex, approval = _asked(engine, who, adapter, _contract(four_eyes=False))
    assert engine.approve(approval.id, by=who.agent) is ApprovalStatus.APPROVED
    (charged,) = [a for a in engine.attempts(mission_id=mission) if a.operation == "charge"]
    assert ex.dispatch(charged.id, adapter).status is charter.AttemptStatus.SUCCEEDED
    assert len(adapter.sent) == 1
    assert engine.contract(mission).to_dict()["approvals"]["four_eyes"] is False


def test_P3_W2_an_own_approval_given_before_four_eyes_sends_nothing_after(
    engine: charter.Engine, who: Principals, adapter: RecordingAdapter
) -> None:
    """An approval's validity is checked at the dispatch commit (W2), four eyes
    included: the agent approved its own charge while the contract allowed it,
    then four eyes was asked for. The charge is not sent on that approval; a
    new request waits for another approver."""
    mission, ex, approval = _asked(engine, who, adapter, _contract(four_eyes=False))
    assert engine.approve(approval.id, by=who.agent) is ApprovalStatus.APPROVED
    engine.amend_contract(mission, _contract(four_eyes=True), by=who.alice, reason="four eyes")
    (charged,) = [a for a in engine.attempts(mission_id=mission) if a.operation == "charge"]
    with pytest.raises(charter.ApprovalRequired):
        ex.dispatch(charged.id, adapter)
    assert adapter.sent == []
    statuses = {a.id: a.status for a in engine.approvals()}
    assert statuses[approval.id] is ApprovalStatus.SUPERSEDED
    (pending,) = engine.approvals(pending=True)
    assert engine.approve(pending.id, by=who.bob) is ApprovalStatus.APPROVED
    assert ex.dispatch(charged.id, adapter).status is charter.AttemptStatus.SUCCEEDED
    assert len(adapter.sent) == 1


def test_P3_without_a_money_estimate_the_default_lets_the_requester_approve(
    engine: charter.Engine, who: Principals
) -> None:
    """The default looks at the effect: a charge estimated in calls alone is not
    money, even in a contract that has a money unit."""
    counted = RecordingAdapter(costs={"charge": {"calls": 1}})
    mission, _, approval = _asked(engine, who, counted, _contract())
    assert engine.approve(approval.id, by=who.agent) is ApprovalStatus.APPROVED
    assert engine.audit_events(mission)[-1]["kind"] == "approval.decided"


def test_P3_no_money_unit_no_default_four_eyes_unless_asked(
    engine: charter.Engine, who: Principals, adapter: RecordingAdapter
) -> None:
    """``usd`` undescribed is not money (the default stays off); ``four_eyes: true``
    asks for four eyes on every approval."""
    plain = {k: v for k, v in _contract().items() if k != "units"}
    _, _, approval = _asked(engine, who, adapter, plain)
    assert engine.approve(approval.id, by=who.agent) is ApprovalStatus.APPROVED

    always = {**plain, "approvals": {"required": ["recorder.charge"], "four_eyes": True}}
    _, _, asked = _asked(engine, who, adapter, always)
    with pytest.raises(charter.NotAuthorized) as info:
        engine.approve(asked.id, by=who.agent)
    assert info.value.details["rule"] == "four_eyes"


def test_P3_four_eyes_hold_after_a_recovery_voided_the_prepared_attempt(
    engine: charter.Engine, who: Principals, adapter: RecordingAdapter, clock: ManualClock
) -> None:
    """The approval outlives its voided attempt (R3); its estimate is still known."""
    mission, ex, approval = _asked(engine, who, adapter, _contract())
    clock.advance(60)
    engine.coordinator.recover(ex.run_id, "seg-2")
    assert all(a.status is charter.AttemptStatus.VOIDED for a in engine.attempts())
    before = stored(engine, mission)
    with pytest.raises(charter.NotAuthorized):
        engine.approve(approval.id, by=who.agent)
    assert stored(engine, mission) == before


def test_P3_a_contract_says_four_eyes_with_a_boolean() -> None:
    with pytest.raises(charter.ContractError) as info:
        charter.Contract.from_dict(_contract(four_eyes="yes"))
    assert info.value.details["field"] == "approvals.four_eyes"
    # Unset, it is absent: versions stored before it keep their digests.
    assert "four_eyes" not in charter.Contract.from_dict(_contract()).to_dict()["approvals"]


def test_P2_dropping_four_eyes_needs_approve_where_approval_is_required() -> None:
    """Widening: four eyes turned off, or a money unit no longer described under the
    default, needs ``approve`` on each required scope; turning them on needs nothing."""
    default = charter.Contract.from_dict(_contract())
    off = charter.Contract.from_dict(_contract(four_eyes=False))
    on = charter.Contract.from_dict(_contract(four_eyes=True))
    undescribed = charter.Contract.from_dict({**_contract(), "units": {}})
    dropped = [(n.right.value, n.scope) for n in amendment_needs(default, off)]
    assert dropped == [("approve", "recorder.charge")]
    assert [(n.right.value, n.scope) for n in amendment_needs(default, undescribed)] == dropped
    assert [(n.right.value, n.scope) for n in amendment_needs(on, default)] == dropped
    assert amendment_needs(default, on) == []
    assert amendment_needs(off, default) == []


def test_P2_only_an_approver_may_drop_four_eyes(engine: charter.Engine, who: Principals) -> None:
    mission = engine.create_mission(_contract(), by=who.alice)  # alice may not approve
    before = stored(engine, mission)
    with pytest.raises(charter.NotAuthorized) as info:
        engine.amend_contract(mission, _contract(four_eyes=False), by=who.alice, reason="faster")
    assert [m["right"] for m in info.value.details["missing"]] == ["approve"]
    assert stored(engine, mission) == before


# -- recover and reconcile are rights ---------------------------------------------------------


def _lost(send: charter.Dispatch) -> charter.Outcome:
    raise TimeoutError("no answer")


def _uncertain(
    engine: charter.Engine, who: Principals, adapter: RecordingAdapter, grants: dict[str, Any]
) -> tuple[str, charter.Executor, dict[str, charter.Attempt]]:
    """A run with an UNKNOWN ``read`` and an UNKNOWN ``write``; ``grants`` for mallory."""
    contract = default_contract(principals={**default_contract()["principals"], "mallory": grants})
    mission = engine.create_mission(contract, by=who.alice)
    ex = engine.start_run(mission, by=who.agent, segment_id="seg-1")
    adapter.script.update(read=_lost, write=_lost)
    lost = {op: ex.perform(adapter, op, {"op": op}, effect_key=op) for op in ("read", "write")}
    return mission, ex, lost


def test_P3_recover_and_reconcile_granted_by_name_and_on_a_scope(
    engine: charter.Engine, who: Principals, adapter: RecordingAdapter, clock: ManualClock
) -> None:
    """A monitoring principal with only ``recover`` and ``reconcile`` on one scope:
    it takes the run over and asks about ``read``; about ``write`` it is refused,
    audited, and nothing is asked of the target."""
    grants = {"recover": ["*"], "reconcile": ["recorder.read"]}
    mission, ex, lost = _uncertain(engine, who, adapter, grants)
    adapter.evidence[lost["read"].id] = charter.Evidence.not_applied({"log": "none"})
    clock.advance(60)
    state, unresolved = engine.coordinator.recover(ex.run_id, "seg-2", by=who.mallory)
    assert state.epoch == 2 and sorted(unresolved) == sorted(a.id for a in lost.values())
    assert engine.coordinator.reconcile(lost["read"].id, adapter, by=who.mallory).verdict == (
        "not_applied"
    )
    before, seen = stored(engine, mission), len(engine.audit_events(mission))
    asked = len(adapter.reconciled)
    with pytest.raises(charter.NotAuthorized) as info:
        engine.coordinator.reconcile(lost["write"].id, adapter, by=who.mallory)
    assert (info.value.details["right"], info.value.details["scope"]) == (
        "reconcile",
        "recorder.write",
    )
    assert stored(engine, mission) == before
    assert [(e["kind"], e["actor"]) for e in _events_since(engine, mission, seen)] == [
        ("authorization.refused", "mallory")
    ]
    assert len(adapter.reconciled) == asked  # the target was not asked


def test_P3_recover_and_reconcile_come_with_run_or_resolve(
    engine: charter.Engine, who: Principals, adapter: RecordingAdapter, clock: ManualClock
) -> None:
    """The agent (``run`` on the recorder) and alice (``resolve``) need no new grant:
    contracts written before these rights existed keep working."""
    _, ex, lost = _uncertain(engine, who, adapter, ["consume"])
    clock.advance(60)
    engine.coordinator.recover(ex.run_id, "seg-2", by=who.agent)
    clock.advance(60)
    engine.coordinator.recover(ex.run_id, "seg-3", by=who.alice)
    for by in (who.agent, who.alice):
        assert engine.coordinator.reconcile(lost["write"].id, adapter, by=by).verdict == (
            "indeterminate"
        )


def test_P3_a_resume_as_a_new_segment_is_a_recover_and_needs_its_right(
    engine: charter.Engine, who: Principals, adapter: RecordingAdapter, clock: ManualClock
) -> None:
    mission, ex, _ = _uncertain(engine, who, adapter, ["consume"])
    clock.advance(60)
    before = stored(engine, mission)
    with pytest.raises(charter.NotAuthorized) as info:
        engine.coordinator.resume(ex.run_id, "seg-2", by=who.mallory)
    assert info.value.details["right"] == "recover"
    assert stored(engine, mission) == before
    assert engine.run(ex.run_id).epoch == 1


# -- the command line ------------------------------------------------------------------------


@pytest.fixture
def desk(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch, capsys: pytest.CaptureFixture[str]
) -> dict[str, Any]:
    """A configured store with a run holding one UNKNOWN mail (hold: 1 call), and a
    ``charter`` command run in this process as a named principal."""
    creds = {n: credential(n) for n in ("agent", "ops", "bob")}
    digests = "".join(f'{n} = "{d}"\n' for n, (_, d) in creds.items())
    toml = tmp_path / "charter.toml"
    toml.write_text(
        f'store = "{tmp_path / "charter.db"}"\n[credentials]\n{digests}'
        '[adapters]\nmail = "_cli_mission:make_mail"\n'
    )
    (tmp_path / "outbox.jsonl").write_text("")
    monkeypatch.setenv("CHARTER_TEST_OUTBOX", str(tmp_path / "outbox.jsonl"))
    monkeypatch.setenv("CHARTER_CONFIG", str(toml))
    monkeypatch.delenv("CHARTER_CREDENTIAL_FILE", raising=False)
    with charter.Engine.open(config=charter.EngineConfig.from_file(toml)) as engine:
        ops = engine.authenticate(creds["ops"][0])
        mission = engine.create_mission(
            {
                "objective": "announce",
                "principals": {
                    "agent": {"run": ["mail.*"]},
                    "ops": ["resolve"],
                    "bob": {"approve": ["mail.*"]},
                },
                "allowance": {"calls": 10_000},
            },
            by=ops,
        )
        ex = engine.start_run(mission, by=engine.authenticate(creds["agent"][0]), segment_id="s1")
        mail = _cli_mission.make_mail()
        lost = RecordingAdapter(name="mail", operations=mail.operations, script={"send": _lost})
        unknown = ex.perform(lost, "send", {"n": 1}, effect_key="b")

    def cli(who: str, *args: str) -> tuple[int, Any]:
        monkeypatch.setenv("CHARTER_CREDENTIAL", creds[who][0])
        status = main([*args, "--json"])
        out, _ = capsys.readouterr()
        return status, json.loads(out)

    def state() -> dict[str, Any]:
        with charter.Engine.open(config=charter.EngineConfig.from_file(toml)) as engine:
            return stored(engine, mission)

    return {"cli": cli, "state": state, "run": ex.run_id, "unknown": unknown.id}


def test_P3_cli_recover_and_reconcile_with_a_credential_need_the_right(
    desk: dict[str, Any],
) -> None:
    cli: Callable[..., tuple[int, Any]] = desk["cli"]
    before = desk["state"]()
    for args in (["recover", desk["run"], "--segment", "s2"], ["reconcile", desk["unknown"]]):
        status, out = cli("bob", *args)
        assert (status, out["error"]["code"], out["error"]["principal"]) == (
            1,
            "not_authorized",
            "bob",
        )
    assert desk["state"]() == before
    status, out = cli("ops", "reconcile", desk["unknown"])
    assert status == 0 and out["verdict"] == "not_applied"


def test_R8_cli_resolve_far_above_the_hold_needs_the_confirming_flag(
    desk: dict[str, Any],
) -> None:
    """500 calls on a hold of one: a usage error (exit 2) that changes nothing, until
    ``--confirm-above-hold`` says it is meant."""
    cli: Callable[..., tuple[int, Any]] = desk["cli"]
    resolve = ["resolve", desk["unknown"], "--succeeded", "--cost", "calls=500", "--evidence", "x"]
    before = desk["state"]()
    status, out = cli("ops", *resolve)
    assert (status, out["error"]["code"], out["error"]["confirm"]) == (
        2,
        "usage_error",
        "confirm_above_hold",
    )
    assert desk["state"]() == before
    status, out = cli("ops", *resolve, "--confirm-above-hold")
    assert status == 0 and (out["status"], out["actual"]) == ("succeeded", {"calls": 500})
