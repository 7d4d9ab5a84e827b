"""P1: principals authenticate; forged, foreign or unknown identities are refused and audited.

Every decision records the authenticated identity, and secrets never reach
the store (S3).
"""

from __future__ import annotations

import dataclasses
import hashlib
from collections.abc import Callable
from dataclasses import dataclass
from pathlib import Path
from types import SimpleNamespace
from typing import Any

import pytest

import charter
from _raw import RawStore
from charter.testing import ManualClock, RecordingAdapter
from conftest import Principals, default_contract

APPROVAL_CONTRACT = default_contract(approvals={"required": ["recorder.charge"]})


def secret_of(credential: str) -> str:
    return credential.partition(":")[2]


# -- a mission with something to decide ------------------------------------------------


@dataclass
class Scene:
    engine: charter.Engine
    who: Principals
    raw: RawStore
    mission: str
    run: str
    approval: str
    incident: str
    unknown: str
    adapter: RecordingAdapter
    clock: ManualClock


@pytest.fixture
def scene(
    engine: charter.Engine,
    who: Principals,
    adapter: RecordingAdapter,
    raw: RawStore,
    clock: ManualClock,
) -> Scene:
    """A running mission with an uncertain attempt, a pending approval and an open incident."""
    mission = engine.create_mission(APPROVAL_CONTRACT, by=who.alice)
    ex = engine.start_run(mission, by=who.agent, segment_id="seg-1")

    def lost(send: charter.Dispatch) -> charter.Outcome:
        raise TimeoutError("no answer")

    adapter.script["read"] = lost
    unknown = ex.perform(adapter, "read", {"q": 1}, effect_key="lookup")
    assert unknown.status is charter.AttemptStatus.UNKNOWN
    with pytest.raises(charter.ApprovalRequired):
        ex.perform(adapter, "charge", {"amount": 1}, effect_key="charge")
    (approval,) = engine.approvals(pending=True)
    adapter.script["write"] = lambda send: charter.Outcome.succeeded(
        cost={"usd": 50_000, "calls": 1}, receipt={"id": "r1"}
    )
    ex.perform(adapter, "write", {"n": 1}, effect_key="w1")
    (incident,) = engine.incidents(mission, open_only=True)
    ids = (mission, ex.run_id, approval.id, incident["id"], unknown.id)
    return Scene(engine, who, raw, *ids, adapter, clock)


def _recover(s: Scene, p: Any) -> object:
    s.clock.advance(60)  # the owner's lease runs out: a takeover needs no force
    return s.engine.coordinator.recover(s.run, "seg-9", by=p)


Decision = Callable[[Scene, Any], object]

#: Each decision API, with the principal entitled to make it in ``APPROVAL_CONTRACT``.
DECISIONS: dict[str, tuple[str, Decision]] = {
    "approve": ("bob", lambda s, p: s.engine.approve(s.approval, by=p)),
    "raise_limit": ("alice", lambda s, p: s.engine.raise_limit(s.mission, "usd", 9_000_000, by=p)),
    "close_incident": (
        "alice",
        lambda s, p: s.engine.close_incident(s.incident, by=p, note="checked the receipt"),
    ),
    "stop_run": ("alice", lambda s, p: s.engine.stop_run(s.run, by=p)),
    "create_mission": ("alice", lambda s, p: s.engine.create_mission(default_contract(), by=p)),
    "start_run": ("agent", lambda s, p: s.engine.start_run(s.mission, by=p, segment_id="seg-2")),
    "amend_contract": (
        "alice",
        lambda s, p: s.engine.amend_contract(
            s.mission, default_contract(objective="amended"), by=p, reason="scope change"
        ),
    ),
    "resolve": (
        "alice",
        lambda s, p: s.engine.coordinator.resolve(
            s.unknown, by=p, outcome="failed", evidence="the target has no record of it"
        ),
    ),
    "forced recover": (
        "alice",
        lambda s, p: s.engine.coordinator.recover(s.run, "seg-9", force=True, by=p),
    ),
    # P3: `recover` and `reconcile` come with `run` or `resolve` (alice resolves).
    "recover": ("alice", _recover),
    "reconcile": (
        "alice",
        lambda s, p: s.engine.coordinator.reconcile(s.unknown, s.adapter, by=p),
    ),
}


# -- authentication ---------------------------------------------------------------------


def test_P1_the_right_credential_authenticates(
    engine: charter.Engine, creds: tuple[dict[str, str], dict[str, str]], raw: RawStore
) -> None:
    for name, credential in creds[0].items():
        principal = engine.authenticate(credential)
        assert isinstance(principal, charter.Principal)
        assert principal.name == name
    # Surrounding whitespace (a trailing newline in a credential file) is not part of it.
    assert engine.authenticate(creds[0]["alice"] + "\n").name == "alice"
    mission = engine.create_mission(default_contract(), by=engine.authenticate(creds[0]["alice"]))
    assert engine.mission(mission).created_by == "alice"
    assert raw.events()[0]["mission_id"] == mission  # no refusal recorded
    assert engine.audit_events("engine") == []


def _digest16(text: str) -> str:
    return hashlib.sha256(text.encode()).hexdigest()[:16]


def _bad_credentials(creds: dict[str, str]) -> dict[str, tuple[str, str]]:
    """Refused credentials and the name the refusal should be recorded under."""
    return {
        "wrong secret": ("alice:" + "x" * 43, "alice"),
        "another principal's secret": ("alice:" + secret_of(creds["bob"]), "alice"),
        # An unknown name is recorded only by digest: it may be a misplaced secret (S3).
        "unknown name": ("zed:" + secret_of(creds["alice"]), "unknown:" + _digest16("zed")),
        "secret where the name belongs": (
            secret_of(creds["alice"]) + ":alice",
            "unknown:" + _digest16(secret_of(creds["alice"])),
        ),
        "empty": ("", "?"),
        "no separator": (secret_of(creds["alice"]), "?"),
        "no name": (":" + secret_of(creds["alice"]), "?"),
        "no secret": ("alice:", "?"),
        "blank": ("   ", "?"),
    }


@pytest.mark.parametrize(
    "case",
    [
        "wrong secret",
        "another principal's secret",
        "unknown name",
        "secret where the name belongs",
        "empty",
        "no separator",
        "no name",
        "no secret",
        "blank",
    ],
)
def test_P1_a_bad_credential_is_refused_and_audited(
    case: str,
    engine: charter.Engine,
    creds: tuple[dict[str, str], dict[str, str]],
    raw: RawStore,
) -> None:
    credential, recorded_as = _bad_credentials(creds[0])[case]
    before = raw.state()
    with pytest.raises(charter.AuthenticationError) as info:
        engine.authenticate(credential)
    assert info.value.code == "unauthenticated"
    if recorded_as != "?":
        assert info.value.details["principal"] == recorded_as
    (event,) = engine.audit_events("engine")
    assert event["kind"] == "auth.refused"
    assert event["actor"] == recorded_as
    assert [e["mission_id"] for e in raw.events()] == ["engine"]
    assert raw.state() == before
    (verification,) = engine.verify_audit("engine")
    assert verification.ok
    # The refusal says nothing secret, in the error or in the audit log (S3).
    secret = secret_of(credential).strip()
    if secret:
        assert secret not in repr(info.value.to_dict())
        assert secret not in str(info.value)
        assert secret not in repr(event)


def test_P1_every_refusal_is_a_new_event(
    engine: charter.Engine, creds: tuple[dict[str, str], dict[str, str]]
) -> None:
    for _ in range(3):
        with pytest.raises(charter.AuthenticationError):
            engine.authenticate("mallory:guess")
    trail = engine.audit_events("engine")
    assert [(e["seq"], e["actor"]) for e in trail] == [
        (1, "mallory"),
        (2, "mallory"),
        (3, "mallory"),
    ]


def test_P1_an_engine_without_a_credential_for_a_principal_refuses_it(
    store_address: str, creds: tuple[dict[str, str], dict[str, str]]
) -> None:
    config = charter.EngineConfig(credentials={"bob": creds[1]["bob"]})
    with charter.Engine.open(store_address, config=config) as other:
        with pytest.raises(charter.AuthenticationError) as info:
            other.authenticate(creds[0]["alice"])
        # Not configured here, so recorded only by digest (S3).
        assert info.value.details["principal"] == "unknown:" + _digest16("alice")
        assert other.authenticate(creds[0]["bob"]).name == "bob"
        assert [e["actor"] for e in other.audit_events("engine")] == [
            "unknown:" + _digest16("alice")
        ]


# -- forged and foreign principals --------------------------------------------------------


def _forge(
    how: str,
    name: str,
    make_engine: Callable[..., charter.Engine],
    creds: tuple[dict[str, str], dict[str, str]],
    who: Principals,
) -> Any:
    if how == "built by hand":
        return charter.Principal(name, "x")
    if how == "another engine":
        return make_engine().authenticate(creds[0][name])
    if how == "renamed":  # a genuine principal with another's name
        donor = who.mallory
        return dataclasses.replace(donor, name=name)
    assert how == "look-alike"
    return SimpleNamespace(name=name, _proof="x")


@pytest.mark.parametrize("how", ["built by hand", "another engine", "renamed", "look-alike"])
@pytest.mark.parametrize("decision", list(DECISIONS))
def test_P1_a_forged_or_foreign_principal_is_refused_on_every_decision(
    decision: str,
    how: str,
    scene: Scene,
    make_engine: Callable[..., charter.Engine],
    creds: tuple[dict[str, str], dict[str, str]],
) -> None:
    name, act = DECISIONS[decision]
    forged = _forge(how, name, make_engine, creds, scene.who)
    before_state, before_events = scene.raw.state(), scene.raw.events()
    with pytest.raises(charter.AuthenticationError) as info:
        act(scene, forged)
    assert info.value.code == "unauthenticated"
    assert scene.raw.state() == before_state
    new = [e for e in scene.raw.events() if e not in before_events]
    assert [(e["kind"], e["actor"]) for e in new] == [("auth.refused", name)]
    assert new[0]["mission_id"] in (scene.mission, "engine")
    assert all(v.ok for v in scene.engine.verify_audit())
    # The same decision by the authenticated principal goes through.
    act(scene, getattr(scene.who, name))
    assert scene.raw.state() != before_state


# -- authenticated, but not authorised ------------------------------------------------------

#: Decisions, each with principals that hold no right to make them.
UNAUTHORISED = [
    ("approve", "mallory"),
    ("approve", "agent"),
    ("raise_limit", "bob"),
    ("raise_limit", "agent"),
    ("close_incident", "bob"),
    ("stop_run", "agent"),
    ("stop_run", "bob"),
    ("start_run", "alice"),
    ("start_run", "mallory"),
    ("amend_contract", "bob"),
    ("resolve", "bob"),
    ("resolve", "agent"),
    ("forced recover", "agent"),
    ("forced recover", "bob"),
    # P3: an approver, or a credential with no standing in the mission, may neither
    # take a run over nor ask for evidence (a reconcile can replay a send).
    ("recover", "bob"),
    ("recover", "mallory"),
    ("reconcile", "bob"),
    ("reconcile", "mallory"),
]


@pytest.mark.parametrize(("decision", "name"), UNAUTHORISED)
def test_P1_a_principal_without_the_right_is_refused_and_audited(
    decision: str, name: str, scene: Scene
) -> None:
    _, act = DECISIONS[decision]
    before_state, before_events = scene.raw.state(), scene.raw.events()
    with pytest.raises(charter.NotAuthorized) as info:
        act(scene, getattr(scene.who, name))
    assert info.value.code == "not_authorized"
    assert info.value.details["principal"] == name
    assert scene.raw.state() == before_state
    new = [e for e in scene.raw.events() if e not in before_events]
    assert [(e["mission_id"], e["kind"], e["actor"]) for e in new] == [
        (scene.mission, "authorization.refused", name)
    ]
    assert all(v.ok for v in scene.engine.verify_audit())


def test_P1_an_approver_needs_the_right_on_the_effects_scope(
    engine: charter.Engine, who: Principals, adapter: RecordingAdapter
) -> None:
    contract = default_contract(
        approvals={"required": ["recorder.charge"]},
        principals={
            "agent": {"run": ["recorder.*"]},
            "alice": ["resolve"],
            "bob": {"approve": ["recorder.write"]},  # not on charge
        },
    )
    mission = engine.create_mission(contract, by=who.alice)
    ex = engine.start_run(mission, by=who.agent, segment_id="seg-1")
    with pytest.raises(charter.ApprovalRequired):
        ex.perform(adapter, "charge", {"amount": 1}, effect_key="charge")
    (approval,) = engine.approvals(pending=True)
    with pytest.raises(charter.NotAuthorized) as info:
        engine.approve(approval.id, by=who.bob)
    assert info.value.details["scope"] == "recorder.charge"
    (still,) = engine.approvals(pending=True)
    assert still.status.value == "pending"
    assert engine.audit_events(mission)[-1]["kind"] == "authorization.refused"


# -- decisions record who made them -----------------------------------------------------------


def test_P1_every_decision_records_the_authenticated_identity(
    engine: charter.Engine,
    who: Principals,
    scene: Scene,
    raw: RawStore,
) -> None:
    def last(kind: str) -> dict[str, Any]:
        return [e for e in engine.audit_events(scene.mission) if e["kind"] == kind][-1]

    engine.approve(scene.approval, by=who.bob)
    assert last("approval.decided")["actor"] == "bob"
    engine.coordinator.resolve(
        scene.unknown, by=who.alice, outcome="written_off", evidence="nobody can tell"
    )
    assert last("attempt.settled")["actor"] == "alice"
    assert last("evidence.recorded")["actor"] == "alice"
    engine.close_incident(scene.incident, by=who.alice, note="receipt checked")
    assert last("incident.closed")["actor"] == "alice"
    engine.raise_limit(scene.mission, "usd", 5_000_000, by=who.alice)
    assert last("contract.version")["actor"] == "alice"
    engine.amend_contract(
        scene.mission, default_contract(objective="v3"), by=who.alice, reason="objective"
    )
    assert last("contract.version")["actor"] == "alice"
    ex = engine.start_run(scene.mission, by=who.agent, segment_id="seg-2")
    assert last("run.started")["actor"] == "agent"
    engine.stop_run(ex.run_id, by=who.alice)
    stops = [
        e
        for e in engine.audit_events(scene.mission)
        if e["kind"] == "run.status" and e["entity"] == ex.run_id
    ]
    assert [e["actor"] for e in stops] == ["alice"]
    other = engine.create_mission(default_contract(), by=who.alice)
    assert [e["actor"] for e in engine.audit_events(other)] == ["alice", "alice"]

    (approval,) = raw.rows("SELECT decided_by FROM approvals WHERE id = ?", scene.approval)
    (incident,) = raw.rows("SELECT closed_by FROM incidents WHERE id = ?", scene.incident)
    versions = raw.rows(
        "SELECT version, created_by FROM contract_versions WHERE mission_id = ? ORDER BY version",
        scene.mission,
    )
    runs = raw.rows("SELECT id, principal FROM runs WHERE mission_id = ?", scene.mission)
    assert approval["decided_by"] == "bob"
    assert incident["closed_by"] == "alice"
    assert [tuple(v.values()) for v in versions] == [(1, "alice"), (2, "alice"), (3, "alice")]
    assert {r["principal"] for r in runs} == {"agent"}
    assert engine.mission(other).created_by == "alice"
    assert all(v.ok for v in engine.verify_audit())


# -- secrets never enter the store (S3) -------------------------------------------------------


def _store_bytes(store_url: str) -> bytes:
    base = Path(store_url)
    return b"".join(p.read_bytes() for p in sorted(base.parent.glob(base.name + "*")))


def test_P1_secrets_never_enter_the_store(
    make_engine: Callable[..., charter.Engine],
    creds: tuple[dict[str, str], dict[str, str]],
    adapter: RecordingAdapter,
    store_url: str,
) -> None:
    engine = make_engine()
    principals = {n: engine.authenticate(c) for n, c in creds[0].items()}
    mission = engine.create_mission(default_contract(), by=principals["alice"])
    ex = engine.start_run(mission, by=principals["agent"], segment_id="seg-1")
    ex.perform(adapter, "write", {"n": 1}, effect_key="w1")
    engine.raise_limit(mission, "usd", 2_000_000, by=principals["alice"])
    wrong = "guessed-" + "q" * 40
    tried = [
        "alice:" + wrong,
        "bob:" + secret_of(creds[0]["alice"]),  # a real secret, under the wrong name
        "zed:" + secret_of(creds[0]["bob"]),
    ]
    for credential in tried:
        with pytest.raises(charter.AuthenticationError):
            engine.authenticate(credential)
    with pytest.raises(charter.AuthenticationError):
        engine.stop_run(ex.run_id, by=charter.Principal("alice", secret_of(creds[0]["alice"])))

    secrets = [secret_of(c) for c in creds[0].values()] + [wrong]
    for snapshot in ("open", "closed"):
        if snapshot == "closed":
            engine.close()  # checkpoints the WAL into the main file
        raw = _store_bytes(store_url)
        assert len(raw) > 0
        for secret in secrets:
            assert secret.encode() not in raw, snapshot
            assert secret[:16].encode() not in raw, snapshot


# -- a person's input at resolve (R8) ---------------------------------------------------------

#: Costs a person might type that are no amounts (A9): each is their input's fault.
NOT_COSTS: dict[str, Any] = {
    "nan": {"usd": float("nan")},
    "negative": {"usd": -1},
    "2**63": {"usd": 2**63},
    "a string": {"usd": "500"},
    "a float": {"usd": 1.5},
    "a bool": {"usd": True},
    "no amount": {"usd": None},
    "a unit that is no name": {1: 5},
    "not a mapping": "usd=500",
    "pairs": [("usd", 500)],
}


@pytest.mark.parametrize("outcome", ["succeeded", "failed", "written_off"])
@pytest.mark.parametrize("case", list(NOT_COSTS))
def test_R8_a_resolution_cost_that_is_no_amount_is_a_usage_error_and_changes_nothing(
    case: str, outcome: str, scene: Scene
) -> None:
    """Broken: NaN, -1, 2**63 or a string was an ``adapter_error``, as if an adapter
    had broken its protocol. It is the person's input: a usage error, nothing stored."""
    before_state, before_events = scene.raw.state(), scene.raw.events()
    with pytest.raises(charter.UsageError) as info:
        scene.engine.coordinator.resolve(
            scene.unknown,
            by=scene.who.alice,
            outcome=outcome,  # type: ignore[arg-type]
            evidence="the target's console",
            cost=NOT_COSTS[case],
        )
    assert info.value.code == "usage_error"
    assert not isinstance(info.value, charter.AdapterError)
    assert str(info.value.details["field"]).startswith("cost")
    assert scene.raw.state() == before_state
    assert scene.raw.events() == before_events


#: Costs against the ``read`` hold of 1_000 usd and 1 call: ten times is the most
#: taken without confirming; a unit it holds nothing in has a hold of 0.
FAR_ABOVE = {
    "2**62 on a hold of 1_000": {"usd": 2**62, "calls": 1},
    "ten times and one": {"usd": 10_001, "calls": 1},
    "eleven calls on one": {"usd": 1_000, "calls": 11},
    "a unit not held": {"usd": 1_000, "gpu": 1},
}


@pytest.mark.parametrize("case", list(FAR_ABOVE))
def test_R8_a_cost_far_above_the_hold_needs_confirming(case: str, scene: Scene) -> None:
    """Broken: a typo (2**62 on a hold of 1_000) was recorded at once as an overrun,
    the incident opened after the fact. Now it is refused, changing nothing, until
    the person confirms it; confirmed, it is recorded in full with its incident (L5)."""
    cost = FAR_ABOVE[case]
    before_state, before_events = scene.raw.state(), scene.raw.events()
    with pytest.raises(charter.UsageError) as info:
        scene.engine.coordinator.resolve(
            scene.unknown, by=scene.who.alice, outcome="succeeded", evidence="seen", cost=cost
        )
    assert info.value.details["confirm"] == "confirm_above_hold"
    assert set(info.value.details["above_hold"]) == {
        u for u, a in cost.items() if a > 10 * {"usd": 1_000, "calls": 1}.get(u, 0)
    }
    assert scene.raw.state() == before_state
    assert scene.raw.events() == before_events

    settled = scene.engine.coordinator.resolve(
        scene.unknown,
        by=scene.who.alice,
        outcome="succeeded",
        evidence="seen",
        cost=cost,
        confirm_above_hold=True,
    )
    assert settled.status is charter.AttemptStatus.SUCCEEDED and settled.actual == cost
    kinds = [i["kind"] for i in scene.engine.incidents(scene.mission, open_only=True)]
    assert kinds.count("overrun") + kinds.count("unbudgeted_cost") >= 2  # one was open before
    assert scene.engine.check_ledger(scene.mission) == []


def test_R8_up_to_ten_times_the_hold_needs_no_confirming(scene: Scene) -> None:
    settled = scene.engine.coordinator.resolve(
        scene.unknown,
        by=scene.who.alice,
        outcome="succeeded",
        evidence="seen",
        cost={"usd": 10_000, "calls": 10},
    )
    assert settled.actual == {"usd": 10_000, "calls": 10}
