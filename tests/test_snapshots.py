"""Signed snapshots, verified import, the handoff report and handover (S2-S5).

A snapshot is exported from one store and imported into another: the state,
the chain and the handoff report are the same on both sides, across SQLite and
PostgreSQL. Every kind of tampering is refused with its own error before
anything is written; an imported mission takes no change at all; a handover
fences the source, and the target finishes the mission without any effect
being performed twice.
"""

from __future__ import annotations

import dataclasses
import gzip
import io
import json
import random
import tarfile
import uuid
from collections.abc import Callable, Iterator
from pathlib import Path
from typing import Any

import pytest

import charter
from _raw import RawStore
from charter.audit import archive
from charter.audit.signing import load_signer
from charter.audit.snapshot import TABLES
from charter.hashing import canonical, digest, event_hash, genesis
from charter.testing import ManualClock, RecordingAdapter
from conftest import PG_URL, Principals, default_contract, stored

OpenEngine = Callable[..., charter.Engine]


# -- stores and keys ---------------------------------------------------------------------


@pytest.fixture
def key(tmp_path: Path) -> str:
    path = tmp_path / "source.pem"
    charter.new_signing_key(path)
    return str(path)


@pytest.fixture
def other_key(tmp_path: Path) -> str:
    path = tmp_path / "other.pem"
    charter.new_signing_key(path)
    return str(path)


@pytest.fixture
def open_store(
    tmp_path: Path, clock: ManualClock, creds: tuple[dict[str, str], dict[str, str]]
) -> Iterator[OpenEngine]:
    """Engines on fresh stores of either backend, beside the test's own."""
    opened: list[charter.Engine] = []
    schemas: list[str] = []

    def make(backend: str = "sqlite", **config: Any) -> charter.Engine:
        if backend == "sqlite":
            url = str(tmp_path / f"{uuid.uuid4().hex[:8]}.db")
        else:
            import psycopg

            assert PG_URL is not None
            schema = f"t_{uuid.uuid4().hex[:16]}"
            with psycopg.connect(PG_URL, autocommit=True) as admin:
                admin.execute(f"CREATE SCHEMA {schema}")
            schemas.append(schema)
            sep = "&" if "?" in PG_URL else "?"
            url = f"{PG_URL}{sep}options=-csearch_path%3D{schema}"
        eng = charter.Engine.open(
            url,
            config=charter.EngineConfig(credentials=creds[1], **config),
            clock=clock,
            rng=random.Random(len(opened) + 100),
        )
        opened.append(eng)
        return eng

    yield make
    for eng in opened:
        eng.close()
    if schemas:
        import psycopg

        with psycopg.connect(PG_URL, autocommit=True) as admin:  # type: ignore[arg-type]
            for schema in schemas:
                admin.execute(f"DROP SCHEMA {schema} CASCADE")


def public(path: str) -> str:
    return load_signer(path).public_key


def busy_mission(engine: charter.Engine, who: Principals, clock: ManualClock) -> str:
    """A mission with something of everything: settled attempts with costs, an
    unresolved one with evidence, a pending approval, an open incident."""
    contract = default_contract(approvals={"required": ["recorder.charge"], "ttl_seconds": 600})
    mission = engine.create_mission(contract, by=who.alice, name="invoices")
    adapter = RecordingAdapter(costs={"write": {"usd": 5_000, "calls": 1}})
    ex = engine.start_run(mission, by=who.agent, segment_id="seg-1")
    ex.attempt(adapter, "write", {"invoice": 1}, effect_key="inv-1")

    def lost(send: charter.Dispatch) -> charter.Outcome:
        raise TimeoutError("no answer")

    adapter.script["write"] = lost
    assert ex.attempt(adapter, "write", {"invoice": 2}, effect_key="inv-2").status.value == "unknown"
    with pytest.raises(charter.ApprovalRequired):
        ex.attempt(adapter, "charge", {"invoice": 3}, effect_key="inv-3")
    adapter.script["read"] = lambda send: charter.Outcome.succeeded(
        {"ok": True}, cost={"calls": 1, "usd": 9_000}
    )
    ex.attempt(adapter, "read", {"q": "balance"}, effect_key="look")  # over its hold: incident
    clock.advance(1)
    return mission


def everything(engine: charter.Engine, mission: str) -> dict[str, Any]:
    """All the store holds about a mission, chain included."""
    runs = engine.runs(mission)
    return {
        **stored(engine, mission),
        "contracts": [
            engine.contract(mission, v).to_dict()
            for v in range(1, engine.mission(mission).contract_version + 1)
        ],
        "nodes": {r.id: [dataclasses.asdict(n) for n in engine.node_executions(r.id)] for r in runs},
        "journal": {r.id: [dataclasses.asdict(j) for j in engine.journal(r.id)] for r in runs},
        "audit": engine.audit_events(mission),
        "ledger": [{k: v for k, v in e.items() if k != "id"} for e in stored(engine, mission)["ledger"]],
    }


# -- round trip -----------------------------------------------------------------------


@pytest.mark.parametrize("there", ["sqlite", "postgresql"])
def test_S2_export_then_import_gives_identical_state_report_and_chain(
    open_store: OpenEngine, creds: Any, clock: ManualClock, key: str, there: str
) -> None:
    """Breaking S2 looks like an import that loses or changes a record, a chain that
    no longer verifies on the other side, or a report that differs; SQLite to
    PostgreSQL and back."""
    if there == "postgresql" and PG_URL is None:
        pytest.skip("needs CHARTER_TEST_POSTGRES_URL")
    source = open_store("sqlite", signing_key=key)
    who = Principals(creds[0], creds[1], source)
    mission = busy_mission(source, who, clock)
    file = source.export_snapshot(mission)

    middle = open_store(there, trusted_keys=(public(key),))
    assert middle.import_snapshot(file) == mission
    assert everything(middle, mission) == everything(source, mission)
    assert all(v.ok for v in middle.verify_audit())
    assert middle.handoff(mission_id=mission) == source.handoff(mission_id=mission) | {
        "source": {"kind": "store", "sealed": "imported from a snapshot: a read-only copy"}
    }
    assert middle.handoff(snapshot=file) == source.handoff(snapshot=file)

    # ... and back, re-exported by the store it went to (signed with its own key).
    back_key = str(Path(key).with_name("middle.pem"))
    charter.new_signing_key(back_key)
    middle2 = open_store(there, signing_key=back_key, trusted_keys=(public(key),))
    middle2.import_snapshot(file)
    returned = open_store("sqlite", trusted_keys=(public(back_key),))
    returned.import_snapshot(middle2.export_snapshot(mission))
    assert everything(returned, mission) == everything(source, mission)
    assert all(v.ok for v in returned.verify_audit(mission))


def test_S2_the_format_is_read_with_standard_tools(
    make_engine: OpenEngine, creds: Any, clock: ManualClock, key: str
) -> None:
    """Breaking the documented format looks like a snapshot that ``tar`` and ``json``
    cannot read, or whose entries do not say what the documentation says."""
    signed = make_engine(signing_key=key)
    mission = busy_mission(signed, Principals(creds[0], creds[1], signed), clock)
    data = signed.export_snapshot(mission)
    with tarfile.open(fileobj=io.BytesIO(data), mode="r:gz") as tar:
        names = tar.getnames()
        read = {n: tar.extractfile(n).read() for n in names}  # type: ignore[union-attr]
    assert names == ["snapshot.json", "snapshot.sig", "audit.jsonl", "state.json", "artifacts.json"]
    header = json.loads(read["snapshot.json"])
    assert header["format"] == "charter-snapshot" and header["version"] == 1
    assert header["head"]["seq"] == len(read["audit.jsonl"].splitlines())
    assert sorted(json.loads(read["state.json"])) == sorted(TABLES)
    assert json.loads(read["artifacts.json"]) == []
    assert len(read["snapshot.sig"]) == 64


def test_S3_no_secret_enters_a_snapshot(
    make_engine: OpenEngine, creds: Any, clock: ManualClock, key: str
) -> None:
    """Breaking S3 looks like a credential or a secret header in the file."""
    signed = make_engine(signing_key=key)
    who = Principals(creds[0], creds[1], signed)
    mission = signed.create_mission(default_contract(), by=who.alice)
    ex = signed.start_run(mission, by=who.agent, segment_id="seg-9")
    secret = charter.Secret("tok-very-secret-value", name="api")
    ex.attempt(RecordingAdapter(), "read", {"auth": secret}, effect_key="s")
    data = signed.export_snapshot(mission)
    inflated = gzip.decompress(data)
    for text in ["tok-very-secret-value", *creds[0].values(), Path(key).read_text()]:
        assert text.split(":")[-1].encode() not in inflated


# -- read-only imports ------------------------------------------------------------------


def test_S2_an_imported_mission_takes_no_change(
    open_store: OpenEngine, creds: Any, clock: ManualClock, key: str
) -> None:
    """Breaking S2's read-only import looks like a recover, resume, decision or new run
    on an imported mission changing its records or sending anything."""
    source = open_store("sqlite", signing_key=key)
    who = Principals(creds[0], creds[1], source)
    mission = busy_mission(source, who, clock)
    target = open_store("sqlite", trusted_keys=(public(key),))
    target.import_snapshot(source.export_snapshot(mission))
    there = Principals(creds[0], creds[1], target)
    before = everything(target, mission)
    (run,) = target.runs(mission)
    (pending,) = target.approvals(pending=True)
    unknown = next(a for a in target.attempts(mission_id=mission) if a.status.value == "unknown")
    adapter = RecordingAdapter()
    attempts: list[Callable[[], object]] = [
        lambda: target.coordinator.recover(run.id, "seg-x", force=True, by=there.alice),
        lambda: target.coordinator.resume(run.id, "seg-1", by=there.agent),
        lambda: target.start_run(mission, by=there.agent, segment_id="seg-y"),
        lambda: target.approve(pending.id, by=there.bob),
        lambda: target.raise_limit(mission, "usd", 9_000_000, by=there.alice),
        lambda: target.stop_run(run.id, by=there.alice),
        lambda: target.coordinator.reconcile(unknown.id, adapter),
        lambda: target.coordinator.resolve(
            unknown.id, by=there.alice, outcome="failed", evidence="looked"
        ),
    ]
    for act in attempts:
        with pytest.raises(charter.MissionSealed):
            act()
    with pytest.raises(charter.StateError, match="not handed over to this store"):
        target.adopt(mission, by=there.alice, segment_id="seg-z")
    assert everything(target, mission) == before
    assert adapter.sent == []


def test_S2_importing_a_mission_twice_is_refused(
    open_store: OpenEngine, creds: Any, clock: ManualClock, key: str
) -> None:
    source = open_store("sqlite", signing_key=key)
    mission = busy_mission(source, Principals(creds[0], creds[1], source), clock)
    target = open_store("sqlite", trusted_keys=(public(key),))
    data = source.export_snapshot(mission)
    target.import_snapshot(data)
    before = everything(target, mission)
    with pytest.raises(charter.SnapshotRefused) as refused:
        target.import_snapshot(data)
    assert refused.value.details["problem"] == "exists"
    assert everything(target, mission) == before


def test_S2_export_needs_a_signing_key(engine: charter.Engine, mission: str) -> None:
    with pytest.raises(charter.ConfigError, match="signing key"):
        engine.export_snapshot(mission)
