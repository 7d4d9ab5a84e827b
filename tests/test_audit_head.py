"""S1, S2: a chain must end exactly at the head recorded beside it.

Each chain's head (last sequence number and hash) is kept on the mission's row
(the engine's on its own row) in the same transaction as the events. The chain
alone cannot show that its last event was rewritten: an event re-hashed from
the one before it links correctly, and nothing follows it. Only the head can,
so these tests rewrite the end of a chain *consistently* (checked: the chain
verifies against a head taken from its own end) or move only the head, and
demand that ``verify``, ``charter audit verify`` and a snapshot's import report
it. The store is tampered with through its own driver (``_raw.py``), on either
backend.
"""

from __future__ import annotations

import hashlib
import json
from collections.abc import Callable
from typing import Any

import pytest

import charter
from _raw import RawStore
from charter.audit.archive import read as read_archive
from charter.audit.archive import write as write_archive
from charter.audit.chain import verify_events
from charter.audit.model import ChainHead
from charter.audit.signing import load_signer
from charter.hashing import HASHED_FIELDS, canonical, event_hash
from charter.testing import ManualClock, RecordingAdapter
from conftest import Principals, default_contract

ENGINE = "engine"
AT_HEAD = "the last event does not match the chain's head"
PAST_HEAD = "an event after the chain's head"


@pytest.fixture
def engine(make_engine: Callable[..., charter.Engine], key: str) -> charter.Engine:
    return make_engine(signing_key=key)


@pytest.fixture
def mission(
    engine: charter.Engine, who: Principals, adapter: RecordingAdapter, clock: ManualClock
) -> str:
    """A mission with a few events on its chain, and some on the engine's."""
    mission = engine.create_mission(default_contract(), by=who.alice)
    ex = engine.start_run(mission, by=who.agent, segment_id="seg-1")
    for n in range(3):
        clock.advance(1)
        ex.perform(adapter, "write", {"n": n}, effect_key=f"w{n}")
    for guess in ("alice:not-the-secret", "bob:nor-this"):  # events on the engine's chain
        with pytest.raises(charter.AuthenticationError):
            engine.authenticate(guess)
    return mission


def head_table(chain: str) -> str:
    return "audit_chains" if chain == ENGINE else "missions"


def chain_of(mission: str, which: str) -> str:
    return mission if which == "mission" else ENGINE


def verdicts(engine: charter.Engine) -> dict[str, charter.audit.chain.Verification]:
    return {v.mission_id: v for v in engine.verify_audit()}


def resealed(event: dict[str, Any], prev: str, **changes: Any) -> dict[str, Any]:
    """``event`` with ``changes``, its hash recomputed from ``prev``: a well-formed link."""
    forged = {**event, **changes, "prev_hash": prev}
    forged["hash"] = event_hash(prev, {k: forged[k] for k in HASHED_FIELDS})
    return forged


def rewrite_last(raw: RawStore, chain: str) -> dict[str, Any]:
    """Rewrite the chain's last event consistently (another actor, hash recomputed
    from the event before it); the head on its row is left as it was."""
    last = raw.events(chain)[-1]
    forged = resealed(last, last["prev_hash"], actor="mallory")
    raw.execute(
        "UPDATE audit_events SET actor = ?, hash = ? WHERE mission_id = ? AND seq = ?",
        forged["actor"],
        forged["hash"],
        chain,
        last["seq"],
    )
    return forged


def assert_consistent_chain(raw: RawStore, chain: str) -> None:
    """The chain as the store holds it verifies against a head taken from its own
    end: what is wrong is only where it ends, so only the head can tell."""
    trail = raw.events(chain)
    own_end = ChainHead(trail[-1]["seq"], trail[-1]["hash"], 0)
    assert verify_events(chain, trail, own_end).ok


# -- verify --------------------------------------------------------------------------


@pytest.mark.parametrize("which", ["mission", "engine"])
def test_S1_a_consistently_rewritten_last_event_is_caught_by_the_head(
    engine: charter.Engine, mission: str, raw: RawStore, which: str
) -> None:
    chain = chain_of(mission, which)
    heads = raw.heads()
    forged = rewrite_last(raw, chain)
    assert_consistent_chain(raw, chain)
    assert raw.heads() == heads  # the head was not touched

    results = verdicts(engine)
    assert (results[chain].ok, results[chain].broken_at, results[chain].problem) == (
        False,
        forged["seq"],
        AT_HEAD,
    )
    (alone,) = engine.verify_audit(chain)
    assert (alone.ok, alone.broken_at) == (False, forged["seq"])
    other = mission if chain == ENGINE else ENGINE
    assert results[other].ok


@pytest.mark.parametrize("which", ["mission", "engine"])
@pytest.mark.parametrize("head", ["another hash", "the previous event's hash"])
def test_S1_a_head_changed_on_its_row_is_reported(
    engine: charter.Engine, mission: str, raw: RawStore, which: str, head: str
) -> None:
    """Only the row changes: every event is as it was written."""
    chain = chain_of(mission, which)
    trail = raw.events(chain)
    assert len(trail) >= 2
    wrong = "0" * 64 if head == "another hash" else trail[-2]["hash"]
    raw.execute(f"UPDATE {head_table(chain)} SET audit_hash = ? WHERE id = ?", wrong, chain)
    assert raw.events(chain) == trail

    result = verdicts(engine)[chain]
    assert (result.ok, result.broken_at, result.problem) == (False, len(trail), AT_HEAD)


@pytest.mark.parametrize("which", ["mission", "engine"])
@pytest.mark.parametrize("how", ["a well-formed event appended", "the head moved back one"])
def test_S1_an_event_past_the_head_is_reported(
    engine: charter.Engine, mission: str, raw: RawStore, which: str, how: str
) -> None:
    """A chain one event longer than its head, every link well formed: either a
    forged event appended after the last, or the head moved back over the last
    (its sequence number and hash both, consistently)."""
    chain = chain_of(mission, which)
    trail = raw.events(chain)
    last = trail[-1]
    if how == "a well-formed event appended":
        extra = resealed(last, last["hash"], seq=last["seq"] + 1, actor="mallory")
        columns = list(extra)
        raw.execute(
            f"INSERT INTO audit_events ({', '.join(columns)}) "
            f"VALUES ({', '.join('?' for _ in columns)})",
            *(extra[c] for c in columns),
        )
        beyond = extra["seq"]
    else:
        raw.execute(
            f"UPDATE {head_table(chain)} SET audit_seq = ?, audit_hash = ? WHERE id = ?",
            last["seq"] - 1,
            last["prev_hash"],
            chain,
        )
        beyond = last["seq"]
    assert_consistent_chain(raw, chain)

    result = verdicts(engine)[chain]
    assert (result.ok, result.broken_at) == (False, beyond)
    assert result.problem is not None and result.problem.startswith(PAST_HEAD)


# -- the command line ------------------------------------------------------------------


@pytest.mark.parametrize("tamper", ["last event rewritten", "head changed"])
def test_S1_charter_audit_verify_reports_a_chain_that_does_not_end_at_its_head(
    engine: charter.Engine,
    mission: str,
    raw: RawStore,
    store_address: str,
    cli: Callable[..., tuple[int, Any]],
    tamper: str,
) -> None:
    code, fine = cli("audit", "verify", "--store", store_address, "--json")
    assert code == 0 and all(c["ok"] for c in fine)
    if tamper == "last event rewritten":
        rewrite_last(raw, mission)
        assert_consistent_chain(raw, mission)
    else:
        raw.execute("UPDATE missions SET audit_hash = ? WHERE id = ?", "f" * 64, mission)
    seq = len(raw.events(mission))

    for args in ([], ["--mission", mission]):
        code, out = cli("audit", "verify", "--store", store_address, *args, "--json")
        assert code == 1
        assert out["error"]["code"] == "audit_broken"
        assert f"{mission} at event {seq}" in out["error"]["message"]
        [broken] = [c for c in out["error"]["chains"] if c["mission_id"] == mission]
        assert (broken["ok"], broken["broken_at"], broken["problem"]) == (False, seq, AT_HEAD)


# -- a snapshot's import (S2) -------------------------------------------------------------


def signed_again(entries: dict[str, bytes], key: str) -> bytes:
    """The archive with its header's digests following the entries, signed again
    with the source's own key: what someone holding that key could produce."""
    header = json.loads(entries["snapshot.json"])
    for name in header["entries"]:
        header["entries"][name] = {
            "sha256": hashlib.sha256(entries[name]).hexdigest(),
            "size": len(entries[name]),
        }
    entries["snapshot.json"] = canonical(header).encode()
    entries["snapshot.sig"] = load_signer(key).sign(entries["snapshot.json"])
    return write_archive(entries, mtime=0)


def rewritten_last_line(entries: dict[str, bytes]) -> tuple[dict[str, bytes], int]:
    """The snapshot's entries with its last event rewritten consistently."""
    events = [json.loads(line) for line in entries["audit.jsonl"].splitlines()]
    events[-1] = resealed(events[-1], events[-1]["prev_hash"], actor="mallory")
    own_end = ChainHead(events[-1]["seq"], events[-1]["hash"], 0)
    assert verify_events(str(events[-1]["mission_id"]), events, own_end).ok
    lines = "".join(canonical(e) + "\n" for e in events).encode()
    return {**entries, "audit.jsonl": lines}, events[-1]["seq"]


@pytest.mark.parametrize("signed", [False, True], ids=["as-exported", "signed-again"])
def test_S2_an_imported_chain_must_end_at_the_signed_head(
    engine: charter.Engine,
    mission: str,
    key: str,
    target: charter.Engine,
    signed: bool,
) -> None:
    """The snapshot's chain, its last event rewritten consistently, ends elsewhere
    than the head its header signs: refused as a broken chain there, whether or
    not the header's digests were made to follow (signed again with the key)."""
    entries, seq = rewritten_last_line(read_archive(engine.export_snapshot(mission)))
    data = signed_again(entries, key) if signed else write_archive(entries, mtime=0)
    with pytest.raises(charter.SnapshotTampered) as refused:
        target.import_snapshot(data)
    assert refused.value.details["problem"] == "chain_broken"
    assert refused.value.details["seq"] == seq
    assert AT_HEAD in refused.value.message
    with pytest.raises(charter.NotFound):
        target.mission(mission)
    assert target.import_snapshot(engine.export_snapshot(mission)) == mission
    assert all(v.ok for v in target.verify_audit())


def test_S2_a_snapshot_whose_mission_row_is_not_at_the_signed_head_is_refused(
    engine: charter.Engine,
    mission: str,
    key: str,
    target: charter.Engine,
) -> None:
    """The chain is intact and ends at the signed head, but the mission's row in
    state.json says the chain ends elsewhere (signed again with the key): imported,
    that row would make the chain fail ``verify`` on the target. Refused, nothing
    written."""
    entries = read_archive(engine.export_snapshot(mission))
    state = json.loads(entries["state.json"])
    events = [json.loads(line) for line in entries["audit.jsonl"].splitlines()]
    state["missions"][0]["audit_hash"] = events[-2]["hash"]
    data = signed_again({**entries, "state.json": canonical(state).encode()}, key)
    with pytest.raises(charter.SnapshotTampered) as refused:
        target.import_snapshot(data)
    assert refused.value.details["problem"] == "head_mismatch"
    with pytest.raises(charter.NotFound):
        target.mission(mission)
