"""Contracts: strict validation, lossless serialisation, audited versions, current authority."""

from __future__ import annotations

import json
from collections.abc import Callable
from datetime import UTC, datetime, timedelta, timezone
from typing import Any

import pytest
from hypothesis import given, settings
from hypothesis import strategies as st

import charter
from _raw import RawStore
from charter.contracts.amendments import amendment_needs
from charter.contracts.contract import Contract, scope_matches
from charter.contracts.principals import Right
from charter.testing import RecordingAdapter
from conftest import Principals, default_contract, stored

#: The last representable deadline (datetime.max, UTC) in microseconds since 1970.
LATEST_DEADLINE_US = (
    datetime.max.replace(tzinfo=UTC) - datetime(1970, 1, 1, tzinfo=UTC)
) // timedelta(microseconds=1)

EPOCH = datetime(1970, 1, 1, tzinfo=UTC)


def _with(**changes: Any) -> dict[str, Any]:
    return default_contract(**changes)


def _without(key: str) -> dict[str, Any]:
    contract = default_contract()
    del contract[key]
    return contract


def _agent(grants: Any) -> dict[str, Any]:
    return _with(principals={"agent": grants, "alice": ["resolve"]})


#: Malformed contracts and the field each refusal must name (``None``: any field).
MALFORMED: dict[str, tuple[Any, str | None]] = {
    "a list": ([default_contract()], None),
    "null": (None, None),
    "unknown field": (_with(budget={"usd": 1}), "budget"),
    "missing objective": (_without("objective"), "objective"),
    "empty objective": (_with(objective=""), "objective"),
    "blank objective": (_with(objective="   "), "objective"),
    "objective not text": (_with(objective=7), "objective"),
    "missing principals": (_without("principals"), "principals"),
    "no principals": (_with(principals={}), "principals"),
    "principals as a list": (_with(principals=["alice"]), "principals"),
    "principal name with a colon": (_with(principals={"al:ice": ["stop"]}), "principals"),
    "empty principal name": (_with(principals={"": ["stop"]}), "principals"),
    "unknown right in a list": (_agent(["run", "fly"]), "principals.agent"),
    "unknown right in a mapping": (_agent({"fly": ["*"]}), "principals.agent"),
    "right as a nested list": (_agent([["run"]]), "principals.agent"),
    "right as a mapping in a list": (_agent([{"run": "*"}]), "principals.agent"),
    "grants as text": (_agent("run"), "principals.agent"),
    "scope without an operation": (_agent({"run": ["recorder"]}), "principals.agent.run"),
    "empty scope": (_agent({"run": [""]}), "principals.agent.run"),
    "scope not text": (_agent({"run": [5]}), "principals.agent.run"),
    "scopes not a list": (_agent({"run": {"recorder.*": True}}), "principals.agent.run"),
    "missing allowance": (_without("allowance"), "allowance"),
    "empty allowance": (_with(allowance={}), "allowance"),
    "float allowance": (_with(allowance={"usd": 1.5}), "allowance.usd"),
    "whole float allowance": (_with(allowance={"usd": 100.0}), "allowance.usd"),
    "negative allowance": (_with(allowance={"usd": -1}), "allowance.usd"),
    "bool allowance": (_with(allowance={"usd": True}), "allowance.usd"),
    "text allowance": (_with(allowance={"usd": "100"}), "allowance.usd"),
    "odd unit name": (_with(allowance={"usd-micros": 1}), "allowance"),
    "approvals not a mapping": (_with(approvals=["recorder.*"]), "approvals"),
    "approvals unknown key": (_with(approvals={"required": [], "quorum": 2}), "approvals"),
    "approvals required as text": (_with(approvals={"required": "recorder.*"}), "approvals"),
    "approvals empty scope": (_with(approvals={"required": [""]}), "approvals"),
    "approvals scope that matches nothing": (
        _with(approvals={"required": ["recorder"]}),
        "approvals",
    ),
    "approvals zero ttl": (_with(approvals={"ttl_seconds": 0}), "approvals.ttl_seconds"),
    "approvals float ttl": (_with(approvals={"ttl_seconds": 60.0}), "approvals.ttl_seconds"),
    "approvals bool ttl": (_with(approvals={"ttl_seconds": True}), "approvals.ttl_seconds"),
    "stop conditions not a mapping": (_with(stop_conditions=[1]), "stop_conditions"),
    "stop conditions unknown key": (_with(stop_conditions={"max_usd": 1}), "stop_conditions"),
    "naive deadline": (
        _with(stop_conditions={"deadline": "2026-06-01T12:00:00"}),
        "stop_conditions.deadline",
    ),
    "deadline not a time": (
        _with(stop_conditions={"deadline": "next tuesday"}),
        "stop_conditions.deadline",
    ),
    "negative deadline_us": (
        _with(stop_conditions={"deadline_us": -1}),
        "stop_conditions.deadline_us",
    ),
    "deadline_us after 9999": (
        _with(stop_conditions={"deadline_us": LATEST_DEADLINE_US + 1}),
        "stop_conditions.deadline_us",
    ),
    "float deadline_us": (
        _with(stop_conditions={"deadline_us": 1.5}),
        "stop_conditions.deadline_us",
    ),
    "negative max_attempts": (
        _with(stop_conditions={"max_attempts": -1}),
        "stop_conditions.max_attempts",
    ),
    "bool max_attempts": (
        _with(stop_conditions={"max_attempts": True}),
        "stop_conditions.max_attempts",
    ),
    "text max_failed_attempts": (
        _with(stop_conditions={"max_failed_attempts": "3"}),
        "stop_conditions.max_failed_attempts",
    ),
    "unknown resume mode": (_with(resume="eventually"), "resume"),
    "resume not text": (_with(resume=1), "resume"),
    "unknown read_only_unknown": (_with(read_only_unknown="retry"), "read_only_unknown"),
    "bool read_only_unknown": (_with(read_only_unknown=True), "read_only_unknown"),
    "zero max_recoveries": (_with(max_recoveries=0), "max_recoveries"),
    "float max_node_crashes": (_with(max_node_crashes=2.0), "max_node_crashes"),
}


@pytest.mark.parametrize("case", list(MALFORMED))
def test_a_malformed_contract_is_refused_naming_its_field(case: str) -> None:
    data, field = MALFORMED[case]
    with pytest.raises(charter.ContractError) as info:
        Contract.from_dict(data)
    assert info.value.code == "contract_error"
    assert "field" in info.value.details
    if field is not None:
        assert info.value.details["field"] == field


@pytest.mark.parametrize(
    "text",
    ['{"objective": "x", ', "[1, 2]"],
)
def test_contract_json_that_does_not_parse_to_a_contract_is_refused_naming_a_field(
    text: str,
) -> None:
    with pytest.raises(charter.ContractError) as info:
        Contract.from_json(text)
    assert "field" in info.value.details


@pytest.mark.parametrize("case", [c for c in MALFORMED if MALFORMED[c][0] is not None])
def test_create_mission_with_a_malformed_contract_creates_nothing(
    case: str, engine: charter.Engine, who: Principals, raw: RawStore
) -> None:
    data, _ = MALFORMED[case]
    alice = who.alice
    before = engine.missions()
    with pytest.raises(charter.ContractError) as info:
        engine.create_mission(data, by=alice)
    assert "field" in info.value.details
    assert engine.missions() == before
    assert raw.rows("SELECT * FROM missions") == []
    assert raw.rows("SELECT * FROM contract_versions") == []
    assert raw.rows("SELECT * FROM audit_events") == []


def test_create_mission_refuses_a_creator_who_is_not_a_principal(
    engine: charter.Engine, who: Principals, raw: RawStore
) -> None:
    with pytest.raises(charter.ContractError) as info:
        engine.create_mission(default_contract(), by=who.mallory)
    assert info.value.details["field"] == "principals"
    assert engine.missions() == []
    assert raw.rows("SELECT * FROM audit_events") == []


@pytest.mark.parametrize("limit", [2**63, 2**64 + 5])
def test_an_allowance_the_store_cannot_hold_is_a_contract_error(
    limit: int, engine: charter.Engine, who: Principals
) -> None:
    with pytest.raises(charter.ContractError) as info:
        engine.create_mission(_with(allowance={"usd": limit}), by=who.alice)
    assert info.value.details["field"] == "allowance.usd"
    assert engine.missions() == []


def test_the_largest_storable_allowance_is_accepted(
    engine: charter.Engine, who: Principals
) -> None:
    mission = engine.create_mission(_with(allowance={"usd": 2**63 - 1}), by=who.alice)
    assert engine.balances(mission)["usd"].available == 2**63 - 1
    assert engine.check_ledger(mission) == []


# -- serialisation --------------------------------------------------------------------------

NAMES = st.from_regex(r"[a-z][a-z0-9_.\-]{0,11}", fullmatch=True)
UNITS = st.from_regex(r"[a-z][a-z0-9_]{0,11}", fullmatch=True)
SCOPES = st.one_of(
    st.just("*"),
    st.builds(lambda a: f"{a}.*", UNITS),
    st.builds(lambda a, o: f"{a}.{o}", UNITS, UNITS),
)
RIGHTS = st.sampled_from([r.value for r in Right])
GRANTS = st.one_of(
    st.lists(RIGHTS, max_size=8),
    st.dictionaries(RIGHTS, st.one_of(SCOPES, st.lists(SCOPES, min_size=1, max_size=3))).map(
        lambda g: {r: "*" if r == "recover" else s for r, s in g.items()}
    ),
)  # `recover` concerns a whole run: granted on "*" only
COUNTS = st.integers(min_value=0, max_value=2**62)
DEADLINES = st.datetimes(
    min_value=datetime(1970, 1, 2),
    max_value=datetime(2400, 1, 1),
    timezones=st.builds(
        timezone, st.integers(-23 * 60, 23 * 60).map(lambda m: timedelta(minutes=m))
    ),
)


@st.composite
def contracts(draw: st.DrawFn) -> dict[str, Any]:
    data: dict[str, Any] = {
        "objective": draw(st.text(min_size=1).filter(str.strip)),
        "principals": draw(st.dictionaries(NAMES, GRANTS, min_size=1, max_size=4)),
        "allowance": draw(st.dictionaries(UNITS, COUNTS, min_size=1, max_size=4)),
    }
    if draw(st.booleans()):
        approvals: dict[str, Any] = {"required": draw(st.lists(SCOPES, max_size=3))}
        if draw(st.booleans()):
            approvals["ttl_seconds"] = draw(st.integers(1, 10**9))
        if draw(st.booleans()):
            approvals["four_eyes"] = draw(st.booleans())
        data["approvals"] = approvals
    if draw(st.booleans()):
        stop: dict[str, Any] = {}
        for key in ("max_attempts", "max_failed_attempts"):
            if draw(st.booleans()):
                stop[key] = draw(COUNTS)
        deadline = draw(st.sampled_from(["none", "iso", "us"]))
        if deadline == "iso":
            stop["deadline"] = draw(DEADLINES).isoformat()
        elif deadline == "us":
            stop["deadline_us"] = draw(st.integers(0, LATEST_DEADLINE_US))
        data["stop_conditions"] = stop
    if draw(st.booleans()):
        data["resume"] = draw(st.sampled_from(["automatic", "rules", "human"]))
    for key in ("max_recoveries", "max_node_crashes"):
        if draw(st.booleans()):
            data[key] = draw(st.integers(1, 1000))
    if draw(st.booleans()):
        data["read_only_unknown"] = draw(st.sampled_from(["wait", "write_off"]))
    return data


@settings(max_examples=300, deadline=None)
@given(contracts())
def test_a_contract_round_trips_through_its_dict_and_json(data: dict[str, Any]) -> None:
    contract = Contract.from_dict(data)
    again = Contract.from_dict(contract.to_dict())
    assert again == contract
    assert again.to_dict() == contract.to_dict()
    assert Contract.from_json(contract.canonical_json()) == contract
    assert Contract.from_dict(json.loads(json.dumps(contract.to_dict()))) == contract
    assert again.digest() == contract.digest()
    # Nothing granted was lost on the way.
    for name, grants in data["principals"].items():
        pairs = (
            [(r, "*") for r in grants]
            if isinstance(grants, list)
            else [
                (r, s)
                for r, scopes in grants.items()
                for s in ([scopes] if isinstance(scopes, str) else scopes)
            ]
        )
        for right, scope in pairs:
            probe = "x.y" if scope == "*" else scope.replace("*", "op")
            assert again.allows(name, Right(right), probe)
    assert dict(again.allowance) == data["allowance"]


@settings(max_examples=200, deadline=None)
@given(DEADLINES)
def test_a_deadline_is_kept_to_the_exact_microsecond(moment: datetime) -> None:
    contract = Contract.from_dict(_with(stop_conditions={"deadline": moment.isoformat()}))
    assert contract.stop_conditions.deadline_us == (moment - EPOCH) // timedelta(microseconds=1)


@pytest.mark.parametrize(
    "deadline", ["1969-12-31T23:59:59+00:00", "1900-01-01T00:00:00Z", "2026-06-01T00:00:00Z"]
)
def test_an_accepted_contract_can_always_be_read_back(
    deadline: str, engine: charter.Engine, who: Principals
) -> None:
    mission = engine.create_mission(_with(stop_conditions={"deadline": deadline}), by=who.alice)
    stored = engine.contract(mission)
    assert stored == Contract.from_dict(_with(stop_conditions={"deadline": deadline}))


def test_the_same_contract_has_the_same_digest_whatever_the_key_order() -> None:
    data = default_contract(approvals={"required": ["recorder.charge"], "ttl_seconds": 60})
    shuffled = {k: data[k] for k in reversed(list(data))}
    assert Contract.from_dict(data).digest() == Contract.from_dict(shuffled).digest()
    assert (
        Contract.from_dict(data).digest()
        != Contract.from_dict({**data, "objective": "other"}).digest()
    )


# -- versions ----------------------------------------------------------------------------------


def _versions(raw: RawStore, mission: str) -> list[tuple[Any, ...]]:
    """A mission's contract versions as stored: (version, digest, reason, created_by)."""
    return [
        tuple(r.values())
        for r in raw.rows(
            "SELECT version, digest, reason, created_by FROM contract_versions "
            "WHERE mission_id = ? ORDER BY version",
            mission,
        )
    ]


def test_the_creator_amends_a_contract_into_an_audited_new_version(
    engine: charter.Engine, who: Principals, mission: str, raw: RawStore
) -> None:
    amended = _with(objective="narrower", allowance={"usd": 500_000, "calls": 100})
    version = engine.amend_contract(mission, amended, by=who.alice, reason="narrow the budget")
    assert version == 2
    assert engine.mission(mission).contract_version == 2
    assert engine.contract(mission) == Contract.from_dict(amended)
    assert engine.contract(mission, 1) == Contract.from_dict(default_contract())
    digest = Contract.from_dict(amended).digest()
    assert _versions(raw, mission) == [
        (1, Contract.from_dict(default_contract()).digest(), "created", "alice"),
        (2, digest, "narrow the budget", "alice"),
    ]
    event = engine.audit_events(mission)[-1]
    assert (event["kind"], event["actor"], event["before"], event["after"]) == (
        "contract.version",
        "alice",
        "1",
        "2",
    )
    payload = json.loads(event["payload"])
    assert payload["digest"] == digest
    assert payload["reason"] == "narrow the budget"
    assert Contract.from_dict(payload["contract"]) == Contract.from_dict(amended)
    # A lowered limit moves the difference out of available, and the ledger holds (L0).
    balance = engine.balances(mission)["usd"]
    assert (balance.limit, balance.available) == (500_000, 500_000)
    assert engine.check_ledger(mission) == []
    assert all(v.ok for v in engine.verify_audit())


def test_someone_else_cannot_amend_the_contract(
    engine: charter.Engine, who: Principals, mission: str, raw: RawStore
) -> None:
    before = _versions(raw, mission)
    events = engine.audit_events(mission)
    for name in ("bob", "agent", "mallory"):
        with pytest.raises(charter.NotAuthorized) as info:
            engine.amend_contract(
                mission,
                _with(principals={name: ["raise_limit"], "alice": ["stop"]}),
                by=getattr(who, name),
                reason="take over",
            )
        assert info.value.details["principal"] == name
    assert _versions(raw, mission) == before
    assert engine.mission(mission).contract_version == 1
    assert engine.contract(mission) == Contract.from_dict(default_contract())
    refusals = engine.audit_events(mission)[len(events) :]
    assert [(e["kind"], e["actor"]) for e in refusals] == [
        ("authorization.refused", "bob"),
        ("authorization.refused", "agent"),
        ("authorization.refused", "mallory"),
    ]


def test_a_version_cannot_drop_an_allowance_unit(
    engine: charter.Engine, who: Principals, mission: str, raw: RawStore
) -> None:
    before = _versions(raw, mission)
    events = engine.audit_events(mission)
    balances = engine.balances(mission)
    with pytest.raises(charter.ContractError) as info:
        engine.amend_contract(
            mission, _with(allowance={"usd": 1_000_000}), by=who.alice, reason="no more calls"
        )
    assert info.value.details["field"] == "allowance"
    assert _versions(raw, mission) == before
    assert engine.audit_events(mission) == events
    assert engine.balances(mission) == balances


def test_a_malformed_amendment_changes_nothing(
    engine: charter.Engine, who: Principals, mission: str, raw: RawStore
) -> None:
    before = _versions(raw, mission)
    with pytest.raises(charter.ContractError) as info:
        engine.amend_contract(
            mission, _with(allowance={"usd": 1.5, "calls": 1}), by=who.alice, reason="typo"
        )
    assert info.value.details["field"] == "allowance.usd"
    assert _versions(raw, mission) == before


def test_raise_limit_makes_a_new_version_that_only_raises(
    engine: charter.Engine, who: Principals, mission: str, raw: RawStore
) -> None:
    assert engine.raise_limit(mission, "usd", 3_000_000, by=who.alice) == 2
    assert engine.contract(mission).allowance["usd"] == 3_000_000
    assert engine.balances(mission)["usd"].available == 3_000_000
    for unit, limit in (("usd", 3_000_000), ("usd", 10), ("yen", 10**9)):
        with pytest.raises(charter.ContractError) as info:
            engine.raise_limit(mission, unit, limit, by=who.alice)
        assert info.value.details["field"] == "allowance"
    not_integers: list[Any] = [4_000_000.0, True]
    for amount in not_integers:
        with pytest.raises(charter.ContractError):
            engine.raise_limit(mission, "usd", amount, by=who.alice)
    assert [v[0] for v in _versions(raw, mission)] == [1, 2]
    assert engine.check_ledger(mission) == []


# -- P2: an amendment needs the rights its changes need -----------------------------------------

#: Alice creates the mission but may only stop and consume; bob approves charges.
NARROW = _with(
    principals={
        "agent": {"run": ["recorder.read"]},
        "alice": ["stop", "consume"],
        "bob": {"approve": ["recorder.*"]},
    },
    approvals={"required": ["recorder.charge"], "ttl_seconds": 600},
    stop_conditions={"max_attempts": 10, "deadline": "2030-01-01T00:00:00+00:00"},
    resume="human",
)


def _narrow(**changes: Any) -> dict[str, Any]:
    return {**NARROW, **changes}


def _alice(*extra: Any) -> dict[str, Any]:
    """NARROW's principals with alice's grants widened by ``extra`` (rights on ``*``,
    or ``(right, scopes)`` pairs)."""
    grants: dict[str, list[str]] = {"stop": ["*"], "consume": ["*"]}
    for item in extra:
        right, scopes = (item, ["*"]) if isinstance(item, str) else item
        grants[right] = scopes
    return {**NARROW["principals"], "alice": grants}


#: Amendments that widen authority, each with the (right, scope) pairs alice lacks for it.
ESCALATIONS: dict[str, tuple[dict[str, Any], set[tuple[str, str]]]] = {
    "raise a limit": (
        _narrow(allowance={"usd": 2_000_000, "calls": 100}),
        {("raise_limit", "*")},
    ),
    "budget a new unit": (
        _narrow(allowance={"usd": 1_000_000, "calls": 100, "gpu_seconds": 60}),
        {("raise_limit", "*")},
    ),
    "grant herself resolve": (_narrow(principals=_alice("resolve")), {("resolve", "*")}),
    "grant herself raise_limit": (
        _narrow(principals=_alice("raise_limit")),
        {("raise_limit", "*")},
    ),
    "grant herself approve": (
        _narrow(principals=_alice(("approve", ["recorder.*"]))),
        {("approve", "recorder.*")},
    ),
    "widen the agent's scope": (
        _narrow(principals={**NARROW["principals"], "agent": {"run": ["recorder.*"]}}),
        {("run", "recorder.*")},
    ),
    "add a principal": (
        _narrow(principals={**NARROW["principals"], "mallory": {"run": ["recorder.read"]}}),
        {("run", "recorder.read")},
    ),
    "drop the approval requirement": (
        _narrow(approvals={"required": [], "ttl_seconds": 600}),
        {("approve", "recorder.charge")},
    ),
    "lengthen approvals": (
        _narrow(approvals={"required": ["recorder.charge"], "ttl_seconds": 6_000}),
        {("approve", "recorder.charge")},
    ),
    "allow more attempts": (
        _narrow(stop_conditions={"max_attempts": 11, "deadline": "2030-01-01T00:00:00Z"}),
        {("raise_limit", "*")},
    ),
    "drop the deadline": (_narrow(stop_conditions={"max_attempts": 10}), {("raise_limit", "*")}),
    "allow more recoveries": (_narrow(max_recoveries=4), {("raise_limit", "*")}),
    "allow more node crashes": (_narrow(max_node_crashes=9), {("raise_limit", "*")}),
    "resume automatically": (_narrow(resume="automatic"), {("run", "*")}),
    "lift the resume restriction": (
        {k: v for k, v in NARROW.items() if k != "resume"},
        {("run", "*")},
    ),
    "write off read-only unknowns": (
        _narrow(read_only_unknown="write_off"),
        {("resolve", "*")},
    ),
    "all at once": (
        _narrow(
            allowance={"usd": 9_000_000, "calls": 100},
            principals=_alice("resolve", "raise_limit", "approve"),
            approvals={"required": [], "ttl_seconds": 600},
        ),
        {("raise_limit", "*"), ("resolve", "*"), ("approve", "*"), ("approve", "recorder.charge")},
    ),
}


@pytest.mark.parametrize("case", sorted(ESCALATIONS))
def test_P2_an_amendment_that_widens_authority_needs_the_right_for_each_change(
    case: str, engine: charter.Engine, who: Principals
) -> None:
    """Breaking P2 looks like the mission's creator, refused ``raise_limit`` (or
    ``resolve``, ``approve``, ``run``), getting through an amendment what her rights
    deny: a higher limit, a right granted to herself or another, an approval
    requirement dropped, a stop condition or the resume restriction loosened. The
    refusal lists every missing right, is audited, and changes nothing else."""
    amendment, missing = ESCALATIONS[case]
    mission = engine.create_mission(NARROW, by=who.alice)
    before = stored(engine, mission)
    events = engine.audit_events(mission)
    with pytest.raises(charter.NotAuthorized) as info:
        engine.amend_contract(mission, amendment, by=who.alice, reason=case)
    assert info.value.details["principal"] == "alice"
    listed = info.value.details["missing"]
    assert {(m["right"], m["scope"]) for m in listed} == missing
    assert stored(engine, mission) == before
    assert engine.contract(mission) == Contract.from_dict(NARROW)
    (refusal,) = engine.audit_events(mission)[len(events) :]
    assert (refusal["kind"], refusal["actor"]) == ("authorization.refused", "alice")
    payload = json.loads(refusal["payload"])
    assert payload["action"] == "amend_contract"
    assert payload["missing"] == listed
    assert all(v.ok for v in engine.verify_audit())
    assert engine.check_ledger(mission) == []


def test_P2_a_creator_who_holds_the_rights_makes_every_change_at_once(
    engine: charter.Engine, who: Principals
) -> None:
    """The rule refuses only what the author's rights deny: holding each right (on a
    scope at least as wide), the same changes go through as one new version."""
    everything = [r.value for r in Right]
    start = _narrow(principals={**NARROW["principals"], "alice": everything})
    mission = engine.create_mission(start, by=who.alice)
    amended = _narrow(
        allowance={"usd": 9_000_000, "calls": 100, "gpu_seconds": 60},
        principals={
            "agent": {"run": ["recorder.*"]},
            "alice": everything,
            "bob": {"approve": ["recorder.*"], "resolve": ["recorder.charge"]},
            "mallory": {"run": ["recorder.read"]},
        },
        approvals={"required": [], "ttl_seconds": 6_000},
        stop_conditions={},
        resume="automatic",
        max_recoveries=9,
        max_node_crashes=9,
        read_only_unknown="write_off",
    )
    assert engine.amend_contract(mission, amended, by=who.alice, reason="widen") == 2
    assert engine.contract(mission) == Contract.from_dict(amended)
    assert engine.balances(mission)["usd"].available == 9_000_000
    assert engine.audit_events(mission)[-1]["kind"] == "contract.version"
    assert engine.check_ledger(mission) == []


def test_P2_one_grants_only_as_wide_as_one_holds(engine: charter.Engine, who: Principals) -> None:
    """Delegation keeps to the delegate's own scope: approve on ``recorder.*`` may
    be handed on for ``recorder.charge`` or ``recorder.*``, never for ``*``."""
    start = _narrow(principals=_alice(("approve", ["recorder.*"])))
    mission = engine.create_mission(start, by=who.alice)
    wider = {**start["principals"], "mallory": {"approve": ["*"]}}
    with pytest.raises(charter.NotAuthorized) as info:
        engine.amend_contract(mission, _narrow(principals=wider), by=who.alice, reason="too wide")
    assert [(m["right"], m["scope"]) for m in info.value.details["missing"]] == [("approve", "*")]
    narrower = {**start["principals"], "mallory": {"approve": ["recorder.charge"]}}
    assert engine.amend_contract(mission, _narrow(principals=narrower), by=who.alice, reason="ok")
    assert engine.contract(mission).allows("mallory", Right.APPROVE, "recorder.charge")


def test_P2_an_amendment_that_only_narrows_needs_no_right(
    engine: charter.Engine, who: Principals, adapter: RecordingAdapter
) -> None:
    """Narrowing takes nothing from anyone's rights but the mission's: the creator
    may lower a limit (never below what is held and spent, L0), revoke a grant, add
    an approval requirement, shorten approvals, tighten stop conditions, recovery
    limits and the resume restriction, holding none of the rights to widen them."""
    mission = engine.create_mission(_narrow(resume="rules"), by=who.alice)
    ex = engine.start_run(mission, by=who.agent, segment_id="seg-1")
    ex.perform(adapter, "read", {"n": 1}, effect_key="r")  # 1_000 usd spent
    narrowed = _narrow(
        allowance={"usd": 1_000, "calls": 1},
        principals={"agent": {"run": ["recorder.read"]}, "alice": ["stop"]},
        approvals={"required": ["recorder.*"], "ttl_seconds": 60},
        stop_conditions={
            "max_attempts": 2,
            "max_failed_attempts": 1,
            "deadline": "2029-01-01T00:00:00Z",
        },
        resume="human",
        max_recoveries=1,
        max_node_crashes=1,
    )
    assert engine.amend_contract(mission, narrowed, by=who.alice, reason="narrow") == 2
    assert engine.contract(mission) == Contract.from_dict(narrowed)
    usd = engine.balances(mission)["usd"]
    assert (usd.limit, usd.available, usd.spent) == (1_000, 0, 1_000)
    assert engine.check_ledger(mission) == []
    # ... and widening it back again is P2's business.
    with pytest.raises(charter.NotAuthorized):
        engine.amend_contract(mission, _narrow(resume="rules"), by=who.alice, reason="undo")


@settings(max_examples=300, deadline=None)
@given(contracts(), contracts())
def test_P2_every_widening_between_two_contracts_names_the_right_it_needs(
    before: dict[str, Any], after: dict[str, Any]
) -> None:
    """Whatever two contracts are compared, each right a principal holds on a scope
    afterwards but not before, and each scope that stops needing approval, is
    covered by a listed need; a higher limit needs ``raise_limit``; and a contract
    compared with itself needs nothing."""
    old, new = Contract.from_dict(before), Contract.from_dict(after)
    needs = amendment_needs(old, new)
    assert amendment_needs(new, new) == []

    def covered(right: Right, scope: str) -> bool:
        return any(n.right is right and scope_matches(n.scope, scope) for n in needs)

    for name, grants in new.principals.items():
        for right, scopes in grants.items():
            for pattern in scopes:
                probe = "x.y" if pattern == "*" else pattern.replace("*", "op")
                if not old.allows(name, right, probe):
                    assert covered(right, probe), (name, right, probe)
    for pattern in old.approvals.required:
        probe = "x.y" if pattern == "*" else pattern.replace("*", "op")
        if not new.approvals.requires(probe):
            assert covered(Right.APPROVE, probe), probe
    if any(limit > old.allowance.get(unit, 0) for unit, limit in new.allowance.items()):
        assert covered(Right.RAISE_LIMIT, "*")


# -- A1: authority is the current version's -----------------------------------------------------


def test_a_revoked_run_right_refuses_the_next_admission(
    engine: charter.Engine,
    who: Principals,
    mission: str,
    adapter: RecordingAdapter,
) -> None:
    ex = engine.start_run(mission, by=who.agent, segment_id="seg-1")
    first = ex.perform(adapter, "write", {"n": 1}, effect_key="before")
    assert first.status is charter.AttemptStatus.SUCCEEDED
    revoked = _with(
        principals={
            "agent": {},
            "alice": ["resolve", "raise_limit", "stop", "approve"],
        }
    )
    engine.amend_contract(mission, revoked, by=who.alice, reason="agent misbehaved")
    balances = engine.balances(mission)
    with pytest.raises(charter.NotAuthorized) as info:
        ex.perform(adapter, "write", {"n": 2}, effect_key="after")
    assert info.value.details["principal"] == "agent"
    assert [a.id for a in engine.attempts(mission_id=mission)] == [first.id]
    assert len(adapter.sent) == 1
    assert engine.balances(mission) == balances
    event = engine.audit_events(mission)[-1]
    assert (event["kind"], event["actor"]) == ("admission.refused", "agent")
    with pytest.raises(charter.NotAuthorized):
        engine.start_run(mission, by=who.agent, segment_id="seg-2")
    assert len(engine.runs(mission)) == 1


def test_a_narrowed_scope_applies_to_the_running_executor(
    engine: charter.Engine, who: Principals, mission: str, adapter: RecordingAdapter
) -> None:
    ex = engine.start_run(mission, by=who.agent, segment_id="seg-1")
    narrowed = _with(principals={"agent": {"run": ["recorder.read"]}, "alice": ["resolve", "stop"]})
    engine.amend_contract(mission, narrowed, by=who.alice, reason="read only from now on")
    with pytest.raises(charter.NotAuthorized) as info:
        ex.perform(adapter, "write", {"n": 1}, effect_key="w")
    assert info.value.details["scope"] == "recorder.write"
    read = ex.perform(adapter, "read", {"n": 2}, effect_key="r")
    assert read.status is charter.AttemptStatus.SUCCEEDED
    assert [s.operation for s in adapter.sent] == ["read"]


def test_a_right_revoked_by_another_engine_is_seen_at_the_next_admission(
    engine: charter.Engine,
    who: Principals,
    mission: str,
    adapter: RecordingAdapter,
    make_engine: Callable[..., charter.Engine],
) -> None:
    ex = engine.start_run(mission, by=who.agent, segment_id="seg-1")
    ex.perform(adapter, "write", {"n": 1}, effect_key="w1")
    other = make_engine()
    alice_there = other.authenticate(who.credentials["alice"])
    other.amend_contract(
        mission,
        _with(principals={"agent": {}, "alice": ["stop"]}),
        by=alice_there,
        reason="revoked elsewhere",
    )
    with pytest.raises(charter.NotAuthorized):
        ex.perform(adapter, "write", {"n": 2}, effect_key="w2")
    assert len(adapter.sent) == 1


def test_a_revoked_approver_no_longer_decides(
    engine: charter.Engine, who: Principals, adapter: RecordingAdapter
) -> None:
    mission = engine.create_mission(
        _with(approvals={"required": ["recorder.charge"]}), by=who.alice
    )
    ex = engine.start_run(mission, by=who.agent, segment_id="seg-1")
    with pytest.raises(charter.ApprovalRequired):
        ex.perform(adapter, "charge", {"amount": 1}, effect_key="c")
    (approval,) = engine.approvals(pending=True)
    engine.amend_contract(
        mission,
        _with(
            approvals={"required": ["recorder.charge"]},
            principals={"agent": {"run": ["recorder.*"]}, "alice": ["resolve"], "bob": []},
        ),
        by=who.alice,
        reason="bob left",
    )
    with pytest.raises(charter.NotAuthorized):
        engine.approve(approval.id, by=who.bob)
    (still,) = engine.approvals(pending=True)
    assert still.id == approval.id


# -- units: how amounts are shown --------------------------------------------------------


def test_a_unit_declares_its_scale_and_amounts_show_exactly() -> None:
    contract = Contract.from_dict(
        _with(
            allowance={"usd": 50_00, "calls": 10},
            units={"usd": {"scale": 2, "name": "USD"}},
        )
    )
    assert [contract.show("usd", a) for a in (0, 5, 4_50, 1_234_56)] == [
        "0.00 USD",
        "0.05 USD",
        "4.50 USD",
        "1234.56 USD",
    ]
    assert contract.show("calls", 12) == "12 calls"  # undescribed: smallest steps
    assert Contract.from_dict(contract.to_dict()) == contract


def test_amounts_as_people_type_them_read_exactly_and_bad_ones_are_refused() -> None:
    """``Unit.parse`` is ``show``'s inverse for what a person types: a point means
    the unit's reading ("12.50" USD is 1250 cents), no point means whole steps
    as every amount is written elsewhere ("1250" is 1250, never 125,000). No
    float, no more decimals than the unit has, nothing outside A9's range."""
    usd, calls = charter.Unit(2, "USD"), charter.Unit(0, "calls")
    assert [usd.parse(t) for t in ("12.50", "12.5", "1250", "0.01", " 3.10 ")] == [
        1250,
        1250,
        1250,
        1,
        310,
    ]
    largest = 2**63 - 1
    assert usd.parse("92233720368547758.07") == usd.parse(str(largest)) == largest
    assert calls.parse("3") == 3
    for bad, unit in (
        ("12.505", usd),  # a fraction of a cent
        ("12.", usd),
        (".5", usd),
        ("1.2.3", usd),
        ("-1", usd),
        ("1e3", usd),
        ("\u0661\u0662", usd),  # digits, but not ASCII ones
        ("92233720368547758.08", usd),  # one cent past the largest amount
        ("3.0", calls),  # a unit without decimals
        ("", usd),
    ):
        with pytest.raises(charter.UsageError):
            unit.parse(bad)
    assert all(usd.parse(usd.show(a)[: -len(" USD")]) == a for a in (0, 5, 4_50, largest))


def test_amounts_show_with_their_units_exactly_the_one_way_every_desk_shows_them() -> None:
    """``charter.show_amounts`` is what the CLI's text and the console's pages
    print: the contract's scale and name, integer digits only (no float rounds
    the largest amount the ledger holds), an overrun's sign, and a unit the
    contract does not describe in its smallest steps under its own name."""
    units = {"usd": charter.Unit(2, "USD"), "eur": charter.Unit(0, "EUR")}
    assert charter.show_amounts({"usd": 1250}, units) == "12.50 USD"
    assert charter.show_amounts({"eur": 1250}, units) == "1250 EUR"  # scale 0
    assert charter.show_amounts({"calls": 3}, units) == "3 calls"  # no name: its steps
    assert charter.show_amounts({"usd": -1250}, units) == "-12.50 USD"  # an overrun
    assert charter.show_amounts({"usd": -5}, units) == "-0.05 USD"
    largest = 2**63 - 1
    assert charter.show_amounts({"usd": largest}, units) == "92233720368547758.07 USD"
    assert charter.show_amounts({"eur": largest}, units) == f"{largest} EUR"
    assert charter.show_amounts({"usd": 1250, "calls": 3}, units) == "12.50 USD, 3 calls"
    assert charter.show_amounts({}, units) == charter.show_amounts(None) == "-"
    assert charter.show_amounts({"usd": 1250}) == "1250 usd"  # no units at all
    contract = Contract.from_dict(
        _with(allowance={"usd": 50_00, "calls": 10}, units={"usd": {"scale": 2, "name": "USD"}})
    )
    assert contract.show("usd", 1250) == charter.show_amounts({"usd": 1250}, contract.units)


def test_a_contract_without_units_keeps_its_digest() -> None:
    """Versions stored before units existed must hash as they did."""
    assert "units" not in Contract.from_dict(default_contract()).to_dict()


@pytest.mark.parametrize(
    "units",
    [
        {"yen": {"scale": 0, "name": "JPY"}},
        {"usd": {"scale": 19, "name": "USD"}},
        {"usd": {"scale": -1, "name": "USD"}},
        {"usd": {"scale": 2.0, "name": "USD"}},
        {"usd": {"scale": 2, "name": ""}},
        {"usd": {"scale": 2}},
        {"usd": {"scale": 2, "name": "USD", "symbol": "$"}},
        ["usd"],
    ],
)
def test_malformed_units_are_refused_and_create_nothing(
    engine: charter.Engine, who: Principals, units: Any
) -> None:
    missions = engine.missions()
    with pytest.raises(charter.ContractError) as info:
        engine.create_mission(_with(units=units), by=who.alice)
    assert str(info.value.details["field"]).startswith("units")
    assert engine.missions() == missions


def test_a_units_scale_never_changes_in_an_amendment(
    engine: charter.Engine, who: Principals, raw: RawStore
) -> None:
    mission = engine.create_mission(_with(units={"usd": {"scale": 6, "name": "USD"}}), by=who.alice)
    before = _versions(raw, mission)
    with pytest.raises(charter.ContractError, match="cannot change"):
        engine.amend_contract(
            mission, _with(units={"usd": {"scale": 2, "name": "USD"}}), by=who.alice, reason="x"
        )
    assert _versions(raw, mission) == before
    renamed = _with(units={"usd": {"scale": 6, "name": "US$"}})
    assert engine.amend_contract(mission, renamed, by=who.alice, reason="rename") == 2
    assert engine.contract(mission).show("usd", 1_500_000) == "1.500000 US$"
