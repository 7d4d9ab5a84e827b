"""Secrets in requests (S3): the adapter gets the value; the store, the audit
log and everything printed from them get the secret's name only."""

from __future__ import annotations

import json
import pickle
from pathlib import Path
from typing import Any

import pytest

import charter
from charter.adapters import Dispatch, Outcome
from charter.testing import RecordingAdapter
from conftest import Principals, default_contract, stored

TOKEN = "sk_live_4f9a0c1e7b2d"


def everything(engine: charter.Engine, mission: str) -> str:
    """All the store holds about the mission, audit chain included, as text."""
    return json.dumps(
        {"stored": stored(engine, mission), "audit": engine.audit_events(mission)}, default=str
    )


def bearer(send: Dispatch) -> str:
    token = send.request["headers"]["authorization"]
    assert isinstance(token, charter.Secret)
    return token.reveal()


def echoing(seen: list[str]) -> Any:
    """A target that answers with what it was sent, secret included."""

    def script(send: Dispatch) -> Outcome:
        value = bearer(send)
        seen.append(value)
        return Outcome.succeeded(
            {"echo": f"Bearer {value}"}, cost={"usd": 1_000, "calls": 1}, receipt={"raw": value}
        )

    return script


def charge(token: charter.Secret) -> dict[str, Any]:
    return {"amount": 1_200, "headers": {"authorization": token}}


def test_S3_a_secret_reaches_the_adapter_and_is_recorded_by_its_name_only(
    engine: charter.Engine, who: Principals, mission: str, adapter: RecordingAdapter
) -> None:
    """Breaking S3 looks like the value in the stored request, in the audit log, or
    in the result and receipt a target echoed back."""
    seen: list[str] = []
    adapter.script["charge"] = echoing(seen)
    ex = engine.start_run(mission, by=who.agent, segment_id="seg-1")

    done = ex.perform(
        adapter, "charge", charge(charter.Secret(TOKEN, name="stripe")), effect_key="c"
    )

    assert seen == [TOKEN]
    recorded = engine.get_attempt(done.id)
    assert recorded.status is charter.AttemptStatus.SUCCEEDED
    token = recorded.request["headers"]["authorization"]
    assert isinstance(token, charter.Secret) and token.name == "stripe"
    assert (recorded.result, recorded.receipt) == ({"echo": "Bearer ***"}, {"raw": "***"})
    assert TOKEN not in everything(engine, mission)
    assert TOKEN not in repr(recorded)
    shown = {"amount": 1_200, "headers": {"authorization": {"$secret": "stripe"}}}
    assert recorded.to_dict()["request"] == done.to_dict()["request"] == shown


def test_S3_a_target_error_that_echoes_the_secret_is_recorded_without_it(
    engine: charter.Engine, who: Principals, mission: str, adapter: RecordingAdapter
) -> None:
    """Breaking S3 looks like an adapter's exception text, kept as the reason of an
    UNKNOWN attempt, carrying the secret into the store."""

    def refused(send: Dispatch) -> Outcome:
        raise ConnectionResetError(f"reset after sending Bearer {bearer(send)}")

    adapter.script["charge"] = refused
    ex = engine.start_run(mission, by=who.agent, segment_id="seg-1")

    lost = ex.perform(
        adapter, "charge", charge(charter.Secret(TOKEN, name="stripe")), effect_key="c"
    )

    assert lost.status is charter.AttemptStatus.UNKNOWN
    assert (
        engine.get_attempt(lost.id).reason == "ConnectionResetError: reset after sending Bearer ***"
    )
    assert TOKEN not in everything(engine, mission)


def test_S3_no_byte_of_the_secret_is_in_the_store_file(
    store_url: str, engine: charter.Engine, who: Principals, mission: str, adapter: RecordingAdapter
) -> None:
    """Breaking S3 anywhere in the store (a table, an index, the write-ahead log)
    shows up in the SQLite files themselves."""
    adapter.script["charge"] = echoing([])
    ex = engine.start_run(mission, by=who.agent, segment_id="seg-1")
    ex.perform(adapter, "charge", charge(charter.Secret(TOKEN, name="stripe")), effect_key="c")
    engine.close()

    files = [p for p in Path(store_url).parent.iterdir() if p.name.startswith("charter.db")]
    assert files
    for path in files:
        assert TOKEN.encode() not in path.read_bytes(), path.name


def test_S3_the_request_hash_names_the_secret_not_its_value(
    engine: charter.Engine, who: Principals, mission: str, adapter: RecordingAdapter
) -> None:
    """Breaking it looks like a rotated key making a replayed call differ from its
    record (or the hash, which is stored, depending on the value)."""
    ex = engine.start_run(mission, by=who.agent, segment_id="seg-1")
    keys = iter(range(4))

    def hashed(token: charter.Secret) -> str:
        """The hash admission records for a request carrying ``token``."""
        return ex.admit(adapter, "charge", charge(token), effect_key=f"c{next(keys)}").request_hash

    old, rotated = charter.Secret(TOKEN, name="stripe"), charter.Secret("sk_new", name="stripe")
    assert hashed(old) == hashed(rotated)
    assert hashed(old) != hashed(charter.Secret(TOKEN, name="other"))


def test_S3_a_send_rebuilt_from_the_record_reads_an_env_secret_again(
    engine: charter.Engine, who: Principals, adapter: RecordingAdapter, monkeypatch: Any
) -> None:
    """A PREPARED attempt dispatched later (after an approval) by code that no longer
    holds the request: a secret from the environment is read again."""
    monkeypatch.setenv("CHARTER_TEST_TOKEN", TOKEN)
    mission = engine.create_mission(
        default_contract(approvals={"required": ["recorder.charge"]}), by=who.alice
    )
    seen: list[str] = []
    adapter.script["charge"] = echoing(seen)
    ex = engine.start_run(mission, by=who.agent, segment_id="seg-1")
    with pytest.raises(charter.ApprovalRequired) as waiting:
        ex.perform(
            adapter, "charge", charge(charter.Secret.env("CHARTER_TEST_TOKEN")), effect_key="c"
        )
    [approval] = engine.approvals(pending=True)
    engine.approve(approval.id, by=who.bob)

    sent = ex.dispatch(waiting.value.details["attempt_id"], adapter)

    assert sent.status is charter.AttemptStatus.SUCCEEDED
    assert seen == [TOKEN]
    assert TOKEN not in everything(engine, mission)


def test_S3_a_literal_secret_cannot_be_rebuilt_and_the_send_stops_before_it_commits(
    engine: charter.Engine, who: Principals, adapter: RecordingAdapter
) -> None:
    """Breaking it looks like a send committed DISPATCHED (and then UNKNOWN) because
    the adapter could not have the secret, or a live request that is not the
    recorded one being sent."""
    mission = engine.create_mission(
        default_contract(approvals={"required": ["recorder.charge"]}), by=who.alice
    )
    seen: list[str] = []
    adapter.script["charge"] = echoing(seen)
    ex = engine.start_run(mission, by=who.agent, segment_id="seg-1")
    live = charge(charter.Secret(TOKEN, name="stripe"))
    with pytest.raises(charter.ApprovalRequired) as waiting:
        ex.perform(adapter, "charge", live, effect_key="c")
    attempt_id = waiting.value.details["attempt_id"]
    [approval] = engine.approvals(pending=True)
    engine.approve(approval.id, by=who.bob)
    before = stored(engine, mission)

    with pytest.raises(charter.SecretUnavailable):
        ex.dispatch(attempt_id, adapter)
    with pytest.raises(charter.StateError):
        ex.dispatch(attempt_id, adapter, request={**live, "amount": 9_999})
    assert stored(engine, mission) == before
    assert seen == []

    assert ex.dispatch(attempt_id, adapter, request=live).status is (
        charter.AttemptStatus.SUCCEEDED
    )
    assert seen == [TOKEN]


def test_S3_a_request_that_uses_the_placeholder_key_itself_is_refused(
    engine: charter.Engine, who: Principals, mission: str, adapter: RecordingAdapter
) -> None:
    """A literal ``{"$secret": ...}`` would read back as a secret: refused, nothing kept."""
    ex = engine.start_run(mission, by=who.agent, segment_id="seg-1")
    before = stored(engine, mission)
    with pytest.raises(charter.AdmissionRefused):
        ex.perform(adapter, "write", {"note": {"$secret": "x"}}, effect_key="w")
    assert stored(engine, mission) == before
    assert adapter.sent == []


def test_S3_a_secret_does_not_print_or_pickle_its_value(monkeypatch: Any) -> None:
    token = charter.Secret(TOKEN, name="stripe")
    assert TOKEN not in repr(token) + str(token) + f"{token}"
    with pytest.raises(TypeError):
        pickle.dumps(token)
    monkeypatch.delenv("CHARTER_TEST_MISSING", raising=False)
    with pytest.raises(charter.SecretUnavailable):
        charter.Secret.env("CHARTER_TEST_MISSING")
    with pytest.raises(ValueError):
        charter.Secret(TOKEN, name="")


def test_S3_a_result_that_echoes_the_request_records_the_placeholder(
    engine: charter.Engine, who: Principals, mission: str, adapter: RecordingAdapter
) -> None:
    """The recorder answers ``{"echo": request}``: the secret object it echoes is
    recorded as its placeholder, not its value (and does not break settlement)."""
    ex = engine.start_run(mission, by=who.agent, segment_id="seg-1")
    done = ex.perform(
        adapter, "write", charge(charter.Secret(TOKEN, name="stripe")), effect_key="w"
    )
    echoed = engine.get_attempt(done.id).result["echo"]["headers"]["authorization"]
    assert done.status is charter.AttemptStatus.SUCCEEDED
    assert isinstance(echoed, dict) and echoed == {"$secret": "stripe"}
    assert TOKEN not in everything(engine, mission)


def test_S3_A8_a_same_key_replay_reads_an_env_secret_again_and_skips_a_literal_one(
    engine: charter.Engine,
    who: Principals,
    mission: str,
    adapter: RecordingAdapter,
    monkeypatch: Any,
) -> None:
    """Reconcile's same-key replay is a send rebuilt from the record: it has an
    environment secret again, and is not attempted with one it cannot have."""
    monkeypatch.setenv("CHARTER_TEST_TOKEN", TOKEN)

    def lost(send: Dispatch) -> Outcome:
        raise TimeoutError("no answer")

    adapter.script["charge"] = lost
    ex = engine.start_run(mission, by=who.agent, segment_id="seg-1")
    from_env = ex.perform(
        adapter, "charge", charge(charter.Secret.env("CHARTER_TEST_TOKEN")), effect_key="env"
    )
    literal = ex.perform(
        adapter, "charge", charge(charter.Secret(TOKEN, name="lit")), effect_key="lit"
    )
    assert {from_env.status, literal.status} == {charter.AttemptStatus.UNKNOWN}
    seen: list[str] = []
    adapter.script["charge"] = echoing(seen)

    engine.coordinator.reconcile(from_env.id, adapter, executor=ex)
    engine.coordinator.reconcile(literal.id, adapter, executor=ex)

    assert seen == [TOKEN]  # the environment secret's replay only
    assert [s.attempt_id for s in adapter.sent].count(literal.id) == 1
    assert TOKEN not in everything(engine, mission)


class Echo:
    """An object whose text is the secret (a target's SDK type, say)."""

    def __init__(self, value: str) -> None:
        self.value = value

    def __str__(self) -> str:
        return f"Echo({self.value})"


def test_S3_a_secret_echoed_in_bytes_an_exception_or_any_object_never_reaches_the_live_store(
    backend: str,
    store_address: str,
    engine: charter.Engine,
    who: Principals,
    mission: str,
    adapter: RecordingAdapter,
) -> None:
    """Broken S3: scrubbing walked only ``str``, so a secret echoed inside bytes, an
    exception object or another value was written as its repr. The files are read
    while the engine is open, write-ahead log included (closing would checkpoint
    and remove it)."""

    def applied(send: Dispatch) -> Outcome:
        token = bearer(send)
        return Outcome.succeeded(
            {"raw": token.encode(), "sdk": Echo(token), "error": ValueError(token)},
            cost={"usd": 1_000, "calls": 1},
            receipt=[token.encode(), (Echo(token),)],
        )

    def refused(send: Dispatch) -> Outcome:
        token = bearer(send)
        raise charter.NotApplied(
            "refused", evidence={"cause": ConnectionRefusedError(token), "raw": token.encode()}
        )

    def lost(send: Dispatch) -> Outcome:
        raise TimeoutError(bearer(send).encode())  # its text: b'...'

    adapter.script = {"charge": applied, "write": refused, "read": lost}
    ex = engine.start_run(mission, by=who.agent, segment_id="seg-1")
    request = charge(charter.Secret(TOKEN, name="stripe"))
    done = ex.perform(adapter, "charge", request, effect_key="c")
    failed = ex.perform(adapter, "write", request, effect_key="w")
    unknown = ex.perform(adapter, "read", request, effect_key="r")
    adapter.evidence[unknown.id] = charter.Evidence.indeterminate({"seen": TOKEN.encode()})
    engine.coordinator.reconcile(unknown.id, adapter, by=who.alice)

    assert (done.status, failed.status, unknown.status) == (
        charter.AttemptStatus.SUCCEEDED,
        charter.AttemptStatus.FAILED,
        charter.AttemptStatus.UNKNOWN,
    )
    assert engine.get_attempt(done.id).result["raw"] == "b'***'"
    text = everything(engine, mission)
    assert TOKEN not in text, text[max(0, text.find(TOKEN) - 300) : text.find(TOKEN) + 50]
    if backend == "sqlite":  # and in the files themselves, write-ahead log included
        files = [p for p in Path(store_address).parent.iterdir() if p.name.startswith("charter.db")]
        assert any(p.name.endswith("-wal") and p.stat().st_size for p in files)
        for path in files:
            assert TOKEN.encode() not in path.read_bytes(), path.name


def test_S3_A10_item17_an_outcomes_price_source_is_scrubbed_and_bounded_on_every_path(
    make_engine: Any, creds: tuple[dict[str, str], dict[str, str]], raw: Any
) -> None:
    """Broken S3 and A10: an outcome's ``price_source`` was stored as the adapter
    gave it, on the attempt, its ledger entries, its evidence and the audit: a
    target's echo of the key put the key there, and a 5 MiB one was stored
    three times over although ``answer_bytes`` is 64 KiB. The evidence's own
    ``source`` is a text an adapter writes too, and is held to the same."""
    limit = 64 * 1024
    engine = make_engine(answer_bytes=limit)
    who = Principals(creds[0], creds[1], engine)
    mission = engine.create_mission(default_contract(), by=who.alice)
    adapter = RecordingAdapter(costs={"charge": {"usd": 1_000, "calls": 1}})
    huge = "p" * (5 << 20)

    def quoted(send: Dispatch) -> Outcome:
        return Outcome.succeeded(
            {"ok": True}, cost={"usd": 1_000}, price_source=f"quoted for Bearer {bearer(send)}"
        )

    def oversized(send: Dispatch) -> Outcome:
        return Outcome.succeeded({"ok": True}, cost={"usd": 1_000}, price_source=huge)

    def lost(send: Dispatch) -> Outcome:
        raise TimeoutError("no answer")

    ex = engine.start_run(mission, by=who.agent, segment_id="seg-1")
    request = charge(charter.Secret(TOKEN, name="stripe"))
    adapter.script["charge"] = quoted
    echoed = ex.perform(adapter, "charge", request, effect_key="echoed")
    adapter.script["charge"] = oversized
    big = ex.perform(adapter, "charge", request, effect_key="big")
    adapter.script["charge"] = lost
    unknown = ex.perform(adapter, "charge", request, effect_key="lost")
    found = Outcome.succeeded({"ok": True}, cost={"usd": 1_000}, price_source=f"lookup {TOKEN}")
    adapter.evidence[unknown.id] = charter.Evidence("applied", found, None, f"{TOKEN} {huge}")
    evidence = engine.coordinator.reconcile(unknown.id, adapter, by=who.alice)

    assert engine.get_attempt(echoed.id).price_source == "quoted for Bearer ***"
    assert evidence.outcome is not None and evidence.outcome.price_source == "lookup ***"
    assert evidence.source.startswith("*** ppp") and len(evidence.source.encode()) < limit + 64
    kept = engine.get_attempt(big.id).price_source
    assert kept is not None and kept.endswith(f"[cut at {limit} bytes]")
    assert len(kept.encode()) < limit + 64
    dump = repr(raw.dump())  # every table of the store, the audit log included
    assert TOKEN not in dump
    assert huge[: limit + 1] not in dump
    assert len(dump) < 2 << 20  # three 64 KiB copies at most per text, not 15 MB
