"""Signed snapshots, verified import, the handoff report and handover (S2-S5).

A snapshot is exported from one store and imported into another: the state,
the chain and the handoff report are the same on both sides, across SQLite and
PostgreSQL. Every kind of tampering is refused with its own error before
anything is written; an imported mission takes no change at all; a handover
fences the source, and the target finishes the mission without any effect
being performed twice.
"""

from __future__ import annotations

import contextlib
import dataclasses
import gzip
import hashlib
import io
import json
import random
import tarfile
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
from conftest import PG_URL, Principals, default_contract, fresh_store, stored

OpenEngine = Callable[..., charter.Engine]
#: The store's tables a snapshot carries (a slice's chain travels as escrow_events).
#: The tables a snapshot's records are written to (balances are on the head rows
#: of ``missions`` and ``escrow_slices``, their books, since schema 23).
STORED = [t for t in TABLES if t not in ("escrow_events", "allowances", "escrow_accounts")]


# -- stores and keys ---------------------------------------------------------------------


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
    with contextlib.ExitStack() as stores:

        def make(backend: str = "sqlite", **config: Any) -> charter.Engine:
            folder = tmp_path / f"store-{len(opened)}"
            folder.mkdir()
            eng = charter.Engine.open(
                stores.enter_context(fresh_store(folder, backend)),
                config=charter.EngineConfig(credentials=creds[1], **config),
                clock=clock,
                rng=random.Random(len(opened) + 100),
            )
            opened.append(eng)
            return eng

        yield make
        for eng in opened:
            eng.close()


def public(path: str) -> str:
    return load_signer(path).public_key


def busy_mission(engine: charter.Engine, who: Principals, clock: ManualClock) -> str:
    """A mission with something of everything: settled attempts with costs, an
    unresolved one with evidence, a pending approval, an open incident."""
    contract = default_contract(approvals={"required": ["recorder.charge"], "ttl_seconds": 600})
    mission = engine.create_mission(contract, by=who.alice, name="invoices")
    adapter = RecordingAdapter(costs={"write": {"usd": 5_000, "calls": 1}})
    ex = engine.start_run(mission, by=who.agent, segment_id="seg-1")
    ex.perform(adapter, "write", {"invoice": 1}, effect_key="inv-1")
    clock.advance(1)

    def lost(send: charter.Dispatch) -> charter.Outcome:
        raise TimeoutError("no answer")

    adapter.script["write"] = lost
    assert (
        ex.perform(adapter, "write", {"invoice": 2}, effect_key="inv-2").status.value == "unknown"
    )
    clock.advance(1)
    with pytest.raises(charter.ApprovalRequired):
        ex.perform(adapter, "charge", {"invoice": 3}, effect_key="inv-3")
    clock.advance(1)
    adapter.script["read"] = lambda send: charter.Outcome.succeeded(
        {"ok": True}, cost={"calls": 1, "usd": 9_000}
    )
    ex.perform(adapter, "read", {"q": "balance"}, effect_key="look")  # over its hold: incident
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
        "nodes": {
            r.id: [dataclasses.asdict(n) for n in engine.node_executions(r.id)] for r in runs
        },
        "journal": {r.id: [dataclasses.asdict(j) for j in engine.journal(r.id)] for r in runs},
        "audit": engine.audit_events(mission),
        "ledger": [
            {k: v for k, v in e.items() if k != "id"} for e in stored(engine, mission)["ledger"]
        ],
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
    assert header["format"] == "charter-snapshot" and header["version"] == 2
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
    ex.perform(RecordingAdapter(), "read", {"auth": secret}, effect_key="s")
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


# -- the tamper catalogue -------------------------------------------------------------


def entries_of(data: bytes) -> dict[str, bytes]:
    return archive.read(data)


def rebuild(entries: dict[str, bytes], *, resign: str | None = None, rehash: bool = False) -> bytes:
    """An archive of ``entries``: with ``rehash`` the header's digests follow the
    entries, with ``resign`` the header is signed again with that key."""
    if rehash or resign:
        header = json.loads(entries["snapshot.json"])
        if rehash:
            header["entries"] = {
                n: {
                    "sha256": hashlib.sha256(entries[n]).hexdigest(),
                    "size": len(entries[n]),
                }
                for n in header["entries"]
            }
        entries["snapshot.json"] = canonical(header).encode()
        if resign:
            entries["snapshot.sig"] = load_signer(resign).sign(entries["snapshot.json"])
    return archive.write(entries, mtime=0)


def events(entries: dict[str, bytes]) -> list[dict[str, Any]]:
    return [json.loads(line) for line in entries["audit.jsonl"].splitlines()]


def with_events(entries: dict[str, bytes], evs: list[dict[str, Any]]) -> dict[str, bytes]:
    return {**entries, "audit.jsonl": "".join(canonical(e) + "\n" for e in evs).encode()}


def rehashed(evs: list[dict[str, Any]], mission: str) -> list[dict[str, Any]]:
    """The chain recomputed from genesis: a consistent forgery."""
    prev = genesis(mission)
    out = []
    for seq, old in enumerate(evs, start=1):
        e = {**old, "seq": seq, "prev_hash": prev, "payload_hash": digest(old["payload"])}
        e["hash"] = event_hash(prev, {k: e[k] for k in charter.hashing.HASHED_FIELDS})
        prev = e["hash"]
        out.append(e)
    return out


def tar_with(name: str, content: bytes, kind: bytes = tarfile.REGTYPE) -> bytes:
    raw = io.BytesIO()
    with tarfile.open(fileobj=raw, mode="w", format=tarfile.PAX_FORMAT) as tar:
        info = tarfile.TarInfo(name)
        info.type = kind
        info.size = len(content) if kind == tarfile.REGTYPE else 0
        tar.addfile(info, io.BytesIO(content) if kind == tarfile.REGTYPE else None)
    return gzip.compress(raw.getvalue())


def _flip(data: bytes, at: int) -> bytes:
    return data[:at] + bytes([data[at] ^ 0x04]) + data[at + 1 :]


def _tampers(key: str, other_key: str, mission: str, foreign: bytes) -> dict[str, Any]:
    """Each tampering: a function of the snapshot's entries giving the bytes to import,
    and the error class and problem it must be refused with."""

    def flip_event(e: dict[str, bytes]) -> bytes:
        evs = events(e)
        evs[2] = {**evs[2], "actor": evs[2]["actor"][:-1] + chr(ord(evs[2]["actor"][-1]) ^ 1)}
        return rebuild(with_events(e, evs))

    def edit(
        e: dict[str, bytes], change: Callable[[list[dict[str, Any]]], list[dict[str, Any]]]
    ) -> bytes:
        return rebuild(with_events(e, change(events(e))))

    def balance(e: dict[str, bytes], **how: Any) -> bytes:
        state = json.loads(e["state.json"])
        state["allowances"][0]["available"] += 1
        return rebuild({**e, "state.json": canonical(state).encode()}, **how)

    def forged(e: dict[str, bytes]) -> bytes:
        evs = events(e)
        evs[1] = {**evs[1], "actor": "mallory"}
        evs = rehashed(evs, mission)
        header = json.loads(e["snapshot.json"])
        header["head"]["hash"] = evs[-1]["hash"]
        state = json.loads(e["state.json"])
        state["missions"][0]["audit_hash"] = evs[-1]["hash"]
        e = {
            **with_events(e, evs),
            "state.json": canonical(state).encode(),
            "snapshot.json": canonical(header).encode(),
        }
        return rebuild(e, rehash=True)

    def other(e: dict[str, bytes]) -> bytes:
        header = json.loads(e["snapshot.json"])
        header["public_key"] = public(other_key)
        header["key_id"] = load_signer(other_key).key_id
        return rebuild({**e, "snapshot.json": canonical(header).encode()}, resign=other_key)

    def artifact(e: dict[str, bytes]) -> bytes:
        blob = b"the report"
        real = hashlib.sha256(blob).hexdigest()
        swapped = "0" * 64
        manifest = [{"sha256": swapped, "size": len(blob), "location": "report.pdf"}]
        return rebuild(
            {**e, "artifacts.json": canonical(manifest).encode(), f"artifacts/{real}": blob},
            rehash=True,
            resign=key,
        )

    def spliced(e: dict[str, bytes]) -> bytes:
        evs = events(e)
        evs[3] = events(entries_of(foreign))[3]
        return rebuild(with_events(e, evs))

    return {
        "a flipped bit in an event": (flip_event, charter.SnapshotTampered, "chain_broken"),
        "a dropped event": (
            lambda e: edit(e, lambda v: v[:2] + v[3:]),
            charter.SnapshotTampered,
            "chain_broken",
        ),
        "an inserted event": (
            lambda e: edit(e, lambda v: [*v[:2], v[1], *v[2:]]),
            charter.SnapshotTampered,
            "chain_broken",
        ),
        "a duplicated event": (
            lambda e: edit(e, lambda v: [*v, v[-1]]),
            charter.SnapshotTampered,
            "chain_broken",
        ),
        "reordered events": (
            lambda e: edit(e, lambda v: [v[0], v[2], v[1], *v[3:]]),
            charter.SnapshotTampered,
            "chain_broken",
        ),
        "a truncated tail": (
            lambda e: edit(e, lambda v: v[:-1]),
            charter.SnapshotTampered,
            "chain_broken",
        ),
        "a cut last line": (
            lambda e: rebuild({**e, "audit.jsonl": e["audit.jsonl"][:-9]}),
            charter.SnapshotTampered,
            "chain_broken",
        ),
        "events spliced from another mission": (spliced, charter.SnapshotTampered, "chain_broken"),
        "a fully re-hashed forged chain": (forged, charter.SignatureInvalid, "bad_signature"),
        "a wrong key": (other, charter.SignatureInvalid, "untrusted_key"),
        "another key's signature": (
            lambda e: rebuild(e, resign=other_key),
            charter.SignatureInvalid,
            "bad_signature",
        ),
        "an edited balance": (balance, charter.SnapshotTampered, "digest_mismatch"),
        "an edited balance, signed": (
            lambda e: balance(e, rehash=True, resign=key),
            charter.SnapshotTampered,
            "ledger",
        ),
        "a swapped artifact hash": (artifact, charter.SnapshotTampered, "artifact_mismatch"),
        "an entry named ../": (
            lambda e: tar_with("../state.json", b"{}"),
            charter.SnapshotMalformed,
            "unsafe_path",
        ),
        "an absolute entry name": (
            lambda e: tar_with("/etc/passwd", b"x"),
            charter.SnapshotMalformed,
            "unsafe_path",
        ),
        "a symbolic link": (
            lambda e: tar_with("state.json", b"", tarfile.SYMTYPE),
            charter.SnapshotMalformed,
            "not_a_file",
        ),
        "an oversized entry": (
            lambda e: tar_with("state.json", b" " * (archive.MAX_ENTRY_BYTES + 1)),
            charter.SnapshotMalformed,
            "too_large",
        ),
        "a deeply nested entry": (
            lambda e: rebuild({**e, "state.json": b"[" * 100_000 + b"]" * 100_000}),
            charter.SnapshotMalformed,
            "too_deep",
        ),
        "a newer format version": (
            lambda e: rebuild(
                {**e, "snapshot.json": e["snapshot.json"].replace(b'"version":2', b'"version":3')}
            ),
            charter.SnapshotMalformed,
            "unsupported_version",
        ),
        "not an archive": (lambda e: b"hello", charter.SnapshotMalformed, "not_an_archive"),
        "a header without its handover field": (
            lambda e: rebuild(
                {**e, "snapshot.json": e["snapshot.json"].replace(b'"handover"', b'"x"')}
            ),
            charter.SnapshotMalformed,
            "bad_header",
        ),
    }


TAMPERS = [
    "a flipped bit in an event",
    "a dropped event",
    "an inserted event",
    "a duplicated event",
    "reordered events",
    "a truncated tail",
    "a cut last line",
    "events spliced from another mission",
    "a fully re-hashed forged chain",
    "a wrong key",
    "another key's signature",
    "an edited balance",
    "an edited balance, signed",
    "a swapped artifact hash",
    "an entry named ../",
    "an absolute entry name",
    "a symbolic link",
    "an oversized entry",
    "a deeply nested entry",
    "a newer format version",
    "not an archive",
    "a header without its handover field",
]


@pytest.fixture
def exported(
    open_store: OpenEngine, creds: Any, clock: ManualClock, key: str
) -> tuple[str, bytes, bytes]:
    source = open_store("sqlite", signing_key=key)
    who = Principals(creds[0], creds[1], source)
    mission = busy_mission(source, who, clock)
    foreign = busy_mission(source, who, clock)
    return mission, source.export_snapshot(mission), source.export_snapshot(foreign)


@pytest.mark.parametrize("tamper", TAMPERS)
def test_S2_every_tampering_is_refused_with_its_error_and_nothing_is_imported(
    engine: charter.Engine,
    raw: RawStore,
    make_engine: OpenEngine,
    exported: tuple[str, bytes, bytes],
    key: str,
    other_key: str,
    tamper: str,
) -> None:
    """Breaking S2 looks like a changed snapshot imported whole or in part, or refused
    without saying what is wrong."""
    mission, good, foreign = exported
    target = make_engine(trusted_keys=(public(key),))
    change, error, problem = _tampers(key, other_key, mission, foreign)[tamper]
    bad = change(entries_of(good))
    before = {t: raw.rows(f"SELECT * FROM {t}") for t in [*STORED, "audit_events"]}
    with pytest.raises(error) as refused:
        target.import_snapshot(bad)
    assert refused.value.details["problem"] == problem, refused.value.message
    assert {t: raw.rows(f"SELECT * FROM {t}") for t in [*STORED, "audit_events"]} == before
    target.import_snapshot(good)  # the genuine file still imports
    assert engine.mission(mission).id == mission


# -- hostile input: a bounded fuzz ------------------------------------------------------

from hypothesis import HealthCheck, given, settings  # noqa: E402
from hypothesis import strategies as st  # noqa: E402


@pytest.fixture(scope="module")
def genuine(
    tmp_path_factory: pytest.TempPathFactory,
) -> Iterator[tuple[bytes, charter.Engine]]:
    """One real snapshot to mutate, and a store that trusts the key that signed it."""
    here = tmp_path_factory.mktemp("fuzz")
    key = str(here / "k.pem")
    charter.new_signing_key(key)
    from charter.testing import credential

    alice = credential("alice")
    agent = credential("agent")
    with charter.Engine.open(
        str(here / "s.db"),
        config=charter.EngineConfig(
            credentials={"alice": alice[1], "agent": agent[1], "bob": credential("bob")[1]},
            signing_key=key,
        ),
        clock=ManualClock(),
    ) as eng:
        mission = eng.create_mission(default_contract(), by=eng.authenticate(alice[0]))
        ex = eng.start_run(mission, by=eng.authenticate(agent[0]), segment_id="s")
        ex.perform(RecordingAdapter(), "write", {"n": 1}, effect_key="one")
        data = eng.export_snapshot(mission)
    with charter.Engine.open(
        str(here / "t.db"), config=charter.EngineConfig(trusted_keys=(public(key),))
    ) as target:
        yield data, target


@settings(
    max_examples=150,
    deadline=None,
    suppress_health_check=[HealthCheck.function_scoped_fixture, HealthCheck.too_slow],
)
@given(data=st.data())
def test_S2_fuzzed_snapshots_raise_only_the_documented_errors(
    genuine: tuple[bytes, charter.Engine], data: st.DataObject
) -> None:
    """Breaking the importer's safety looks like any other exception (a crash, a
    RecursionError, a MemoryError) or an import of a changed file."""
    good, target = genuine
    entries = entries_of(good)
    how = data.draw(st.sampled_from(["bytes", "entry", "json"]))
    if how == "bytes":
        at = data.draw(st.integers(0, len(good) - 1))
        bad = _flip(good, at) if data.draw(st.booleans()) else good[:at]
    else:
        name = data.draw(st.sampled_from(sorted(entries)))
        if how == "entry":
            content = entries[name]
            at = data.draw(st.integers(0, max(0, len(content) - 1)))
            content = content[:at] + data.draw(st.binary(max_size=16)) + content[at + 1 :]
        else:
            content = json.dumps(
                data.draw(
                    st.recursive(
                        st.none() | st.booleans() | st.integers() | st.text(max_size=8),
                        lambda c: (
                            st.lists(c, max_size=4)
                            | st.dictionaries(st.text(max_size=8), c, max_size=4)
                        ),
                        max_leaves=20,
                    )
                )
            ).encode()
        rehash = name != "snapshot.json" and data.draw(st.booleans())
        bad = rebuild({**entries, name: content}, rehash=rehash)
    try:
        target.import_snapshot(bad)
    except charter.SnapshotRefused:
        return
    assert bad == good or entries_of(bad) == entries


# -- handover (S5) -----------------------------------------------------------------------


def three_steps(adapter: RecordingAdapter) -> charter.Plan:
    @charter.node
    def first(ctx: charter.Context, value: Any) -> int:
        ctx.attempt(adapter, "write", {"step": "first"})
        return 1

    @charter.node
    def second(ctx: charter.Context, value: Any) -> int:
        ctx.attempt(adapter, "write", {"step": "second"})
        return 2

    @charter.node
    def third(ctx: charter.Context, value: Any) -> int:
        ctx.attempt(adapter, "write", {"step": "third"})
        return 3

    return charter.Plan("three", (first, second, third))


@pytest.mark.parametrize("there", ["sqlite", "postgresql"])
def test_S5_a_handover_fences_the_source_and_the_target_performs_each_effect_once(
    open_store: OpenEngine, creds: Any, clock: ManualClock, key: str, there: str
) -> None:
    """Breaking S5 looks like the source still dispatching after the handover, the
    target sending again what the source settled or left uncertain, or two stores
    both able to go on."""
    if there == "postgresql" and PG_URL is None:
        pytest.skip("needs CHARTER_TEST_POSTGRES_URL")
    system = RecordingAdapter()  # the target system both stores send to

    def lost_once(send: charter.Dispatch) -> charter.Outcome:
        if send.request["step"] == "second":
            raise TimeoutError("no answer")
        return charter.Outcome.succeeded({"ok": True}, cost={"calls": 1})

    system.script["write"] = lost_once
    plan = three_steps(system)
    source = open_store("sqlite", signing_key=key)
    target = open_store(there, trusted_keys=(public(key),))
    on_source = Principals(creds[0], creds[1], source)
    on_target = Principals(creds[0], creds[1], target)
    mission = source.create_mission(default_contract(), by=on_source.alice)
    ex = source.start_run(mission, by=on_source.agent, segment_id="seg-1", plan=plan)
    with pytest.raises(charter.Blocked):
        ex.execute(plan)
    (uncertain,) = source.attempts(mission_id=mission, unresolved=True)

    file = source.export_snapshot(mission, handover_to=target.store_id(), by=on_source.alice)

    # The source is fenced: nothing more is dispatched or decided there.
    assert source.run(ex.run_id).status.value == "handed_off"
    before = everything(source, mission)
    for act in (
        lambda: ex.perform(system, "write", {"step": "late"}, effect_key="late"),
        lambda: source.start_run(mission, by=on_source.agent, segment_id="seg-3"),
        lambda: source.new_linked_run(ex.run_id, reviewed_by=on_source.alice, segment_id="s4"),
    ):
        with pytest.raises((charter.MissionSealed, charter.Fenced)):
            act()
    # A recovery there only reports: the run has ended and is never reopened.
    state = source.coordinator.recover(ex.run_id, "seg-2", force=True, by=on_source.alice)
    assert (state.run.status.value, state.run.epoch) == ("handed_off", 2)
    assert everything(source, mission) == before
    # Another store cannot adopt what was handed to this one.
    third = open_store("sqlite", trusted_keys=(public(key),))
    third.import_snapshot(file)
    with pytest.raises(charter.StateError, match="not handed over to this store"):
        third.adopt(mission, by=Principals(creds[0], creds[1], third).alice, segment_id="x")

    # The target: someone without 'adopt' is refused; alice adopts.
    assert target.import_snapshot(file) == mission
    with pytest.raises(charter.NotAuthorized):
        target.adopt(mission, by=on_target.agent, segment_id="seg-t")
    (linked,) = target.adopt(mission, by=on_target.alice, segment_id="seg-t")
    assert target.run(linked.run_id).linked_from == ex.run_id
    moved = target.get_attempt(uncertain.id)
    assert moved.status.value == "unknown"  # still unresolved, its hold kept
    assert target.balances(mission)["calls"].held == 1
    with pytest.raises(charter.Blocked):  # nothing is sent past an unresolved attempt
        linked.execute(plan)

    system.evidence[uncertain.id] = charter.Evidence.applied(
        charter.Outcome.succeeded({"ok": True}, cost={"calls": 1}, receipt={"found": True})
    )
    target.coordinator.reconcile(uncertain.id, system)
    target.coordinator.confirm(uncertain.id, by=on_target.alice)
    resumed = target.coordinator.resume(linked.run_id, "seg-t", by=on_target.agent)
    assert resumed.execute(plan) == 3
    assert [s.request["step"] for s in system.sent] == ["first", "second", "third"]
    assert target.run(linked.run_id).status.value == "completed"
    assert all(v.ok for v in target.verify_audit())


# -- signed checkpoints (S2) --------------------------------------------------------------


def test_S2_signed_checkpoints_catch_a_consistent_rewrite_of_the_store(
    make_engine: OpenEngine, raw: RawStore, creds: Any, clock: ManualClock, key: str
) -> None:
    """Breaking S2's checkpoints looks like a store whose every hash was recomputed
    after an edit (heads moved to match) still verifying with the key."""
    signed = make_engine(signing_key=key)
    who = Principals(creds[0], creds[1], signed)
    mission = busy_mission(signed, who, clock)
    assert all(c["ok"] for c in signed.verify_checkpoints())

    forged = rehashed(
        [{**e, "actor": "mallory"} if e["seq"] == 2 else e for e in raw.events(mission)], mission
    )
    for e in forged:
        raw.execute(
            "UPDATE audit_events SET actor = ?, prev_hash = ?, hash = ? "
            "WHERE mission_id = ? AND seq = ?",
            e["actor"],
            e["prev_hash"],
            e["hash"],
            mission,
            e["seq"],
        )
    raw.execute("UPDATE missions SET audit_hash = ? WHERE id = ?", forged[-1]["hash"], mission)

    assert all(v.ok for v in signed.verify_audit())  # without the key: consistent
    (checked,) = signed.verify_checkpoints(mission)
    assert not checked["ok"] and "rewritten" in checked["problem"]


def test_S2_a_chain_without_a_checkpoint_is_reported(
    make_engine: OpenEngine, raw: RawStore, creds: Any, key: str
) -> None:
    signed = make_engine(signing_key=key)
    mission = signed.create_mission(
        default_contract(), by=Principals(creds[0], creds[1], signed).alice
    )
    raw.execute("DELETE FROM audit_checkpoints WHERE mission_id = ?", mission)
    (checked,) = signed.verify_checkpoints(mission)
    assert checked == {
        "mission_id": mission,
        "ok": False,
        "signed_seq": None,
        "problem": "no signed checkpoint of this chain",
    }


# -- the handoff report (S4) ---------------------------------------------------------------

DOC = Path(__file__).resolve().parent.parent / "docs" / "handoff.md"


def test_S4_the_report_is_a_view_that_says_so(
    open_store: OpenEngine, creds: Any, clock: ManualClock, key: str
) -> None:
    """Breaking S4 looks like a report that could pass for a snapshot (imported, or
    resumed from), or one that leaves out what is unresolved."""
    source = open_store("sqlite", signing_key=key)
    mission = busy_mission(source, Principals(creds[0], creds[1], source), clock)
    report = source.handoff(snapshot=source.export_snapshot(mission))
    assert report["kind"] == "charter-handoff-report" and "cannot be imported" in report["notice"]
    assert [a["status"] for a in report["unresolved"]] == ["unknown", "prepared"]
    assert report["unresolved"][0]["next_action"].startswith("keep the hold")
    assert report["artifacts"]["consumers"] == {"alice": ["*"]}
    assert [i["kind"] for i in report["incidents"]] == ["overrun"]
    target = open_store("sqlite", trusted_keys=(public(key),))
    for text in (json.dumps(report).encode(), charter.handoff_markdown(report).encode()):
        with pytest.raises(charter.SnapshotMalformed):
            target.import_snapshot(text)
    assert target.missions() == []


def test_S4_the_documented_report_is_the_one_the_engine_builds(tmp_path: Path) -> None:
    """docs/handoff.md shows the report of the example mission as the engine builds it
    now; a change to the report rewrites the page and fails until it is committed."""
    from charter.testing import credential

    key = str(tmp_path / "k.pem")
    charter.new_signing_key(key)
    pairs = {n: credential(n) for n in ("agent", "alice", "bob")}
    clock = ManualClock()
    with charter.Engine.open(
        str(tmp_path / "doc.db"),
        config=charter.EngineConfig(
            credentials={n: d for n, (_, d) in pairs.items()}, signing_key=key
        ),
        clock=clock,
        rng=random.Random(7),
    ) as eng:
        who = Principals({n: c for n, (c, _) in pairs.items()}, {}, eng)
        mission = busy_mission(eng, who, clock)
        text = charter.handoff_markdown(eng.handoff(snapshot=eng.export_snapshot(mission)))
    page = DOC.read_text()
    start, end = "<!-- report -->\n", "<!-- /report -->"
    head, rest = page.split(start)
    wanted = f"{head}{start}```markdown\n{text}```\n{end}{rest.split(end)[1]}"
    if page != wanted:
        DOC.write_text(wanted)
        pytest.fail("docs/handoff.md showed another report; it is rewritten: commit it")


# -- the command line ----------------------------------------------------------------------


def test_S5_the_cli_exports_imports_reports_and_adopts(
    tmp_path: Path,
    creds: tuple[dict[str, str], dict[str, str]],
    clock: ManualClock,
    capsys: pytest.CaptureFixture[str],
    monkeypatch: pytest.MonkeyPatch,
) -> None:
    """Breaking the commands looks like a handover the CLI cannot make or accept, a
    tampered file it imports, or an existing file it writes over."""
    from charter.cli.app import main

    key = tmp_path / "a.pem"
    public_key = charter.new_signing_key(key)
    digests = "\n".join(f'{n} = "{d}"' for n, d in creds[1].items())
    for name, extra in (("a", f'signing_key = "{key}"'), ("b", f'trusted_keys = ["{public_key}"]')):
        (tmp_path / f"{name}.toml").write_text(
            f'store = "{name}.db"\n{extra}\n[credentials]\n{digests}\n'
        )
        charter.Engine.open(str(tmp_path / f"{name}.db")).close()
    with charter.Engine.open(
        str(tmp_path / "a.db"),
        config=charter.EngineConfig.from_file(tmp_path / "a.toml"),
        clock=clock,
    ) as source:
        mission = busy_mission(source, Principals(creds[0], creds[1], source), clock)

    def run(config: str, *args: str) -> Any:
        code = main(["--json", "--config", str(tmp_path / f"{config}.toml"), *args])
        out = capsys.readouterr().out
        return code, json.loads(out) if out.strip() else None

    code, ident = run("b", "audit", "identity")
    assert code == 0 and ident["signing_key"] is None
    monkeypatch.setenv("CHARTER_CREDENTIAL", creds[0]["alice"])
    file = str(tmp_path / "handover.tar.gz")
    assert run("a", "export", mission, "-o", file, "--handover", ident["store_id"])[0] == 0
    code, again = run("a", "export", mission, "-o", file)
    assert code == 2 and again["error"]["code"] == "usage_error"  # never written over
    code, report = run("b", "handoff", file)
    assert code == 0 and report["kind"] == "charter-handoff-report"
    bad = str(tmp_path / "bad.tar.gz")
    Path(bad).write_bytes(rebuild({**entries_of(Path(file).read_bytes()), "audit.jsonl": b""}))
    code, refused = run("b", "import", bad)
    assert code == 1 and refused["error"]["code"] == "snapshot_tampered"
    assert run("b", "import", file) == (0, {"mission_id": mission, "imported": True})
    code, adopted = run("b", "adopt", mission, "--segment", "seg-b")
    assert code == 0 and len(adopted["runs"]) == 1
    code, checked = run("a", "audit", "verify", "--key")
    assert code == 0 and all(c["ok"] for c in checked["checkpoints"])


def test_S2_S4_a_snapshot_lists_the_missions_artifacts_and_the_report_checks_them(
    make_engine: OpenEngine, creds: Any, key: str, tmp_path: Path
) -> None:
    """The manifest names each artifact (SHA-256, size, where it was saved); the
    report of the mission here says it is available only while the store holds
    it with a matching hash, and a snapshot's report, which carries no bytes, says not."""
    signed = make_engine(
        signing_key=key, artifacts=str(tmp_path / "objects"), workspace=str(tmp_path / "work")
    )
    who = Principals(creds[0], creds[1], signed)
    mission = signed.create_mission(default_contract(), by=who.alice)

    @charter.node
    def report(ctx: charter.Context, _: Any) -> dict[str, Any]:
        return ctx.save("report.txt", b"three regions surveyed\n")

    plan = charter.Plan("report", (report,))
    run = signed.start_run(mission, by=who.agent, segment_id="seg-1", plan=plan)
    saved = run.execute(plan)
    listed = {"sha256": saved["sha256"], "size": 23, "location": f"{run.run_id}/report.txt"}

    data = signed.export_snapshot(mission)
    with tarfile.open(fileobj=io.BytesIO(data), mode="r:gz") as tar:
        manifest = json.loads(tar.extractfile("artifacts.json").read())  # type: ignore[union-attr]
    assert manifest == [listed]
    here = signed.handoff(mission_id=mission)["artifacts"]["items"]
    assert [(i["location"], i["available"]) for i in here] == [(listed["location"], True)]
    from_file = signed.handoff(snapshot=data)["artifacts"]["items"]
    assert [i["available"] for i in from_file] == [False]

    for path in (tmp_path / "objects").rglob("*"):
        if path.is_file():
            path.write_bytes(b"altered")  # the object no longer matches its hash
    assert [i["available"] for i in signed.handoff(mission_id=mission)["artifacts"]["items"]] == [
        False
    ]
