"""Upgrading a store in place: a store written by an earlier release of Charter
(its own code, from the project's history: ``_release.py``) is opened by
today's, which brings its schema up to date in one transaction per version.

Breaking this looks like balances lost or changed by the upgrade (L0-L2), an
event rehashed or a chain that no longer verifies (S1), an unresolved attempt
that recovery no longer finds (R3-R5), a slice's books lost (L10), or a
snapshot made by the release that today's code no longer imports (S2).
"""

from __future__ import annotations

from collections.abc import Iterator
from pathlib import Path
from typing import Any

import pytest

import _release
import charter
from _raw import RawStore
from charter.audit.signing import load_signer
from charter.storage.schema import LATEST
from charter.testing import RecordingAdapter
from conftest import default_contract, fresh_store


@pytest.fixture(scope="session")
def releases(tmp_path_factory: pytest.TempPathFactory) -> Path:
    """Where earlier releases are unpacked, once per test process."""
    return tmp_path_factory.mktemp("releases")


@pytest.fixture
def spec(creds: tuple[dict[str, str], dict[str, str]], key: str) -> dict[str, Any]:
    """What the release's process is given: who signs in, the contract, the key."""
    contract = default_contract()
    return {"digests": creds[1], "creds": creds[0], "contract": contract, "signing_key": key}


@pytest.fixture
def opened(
    store_address: str, creds: tuple[dict[str, str], dict[str, str]], key: str
) -> Iterator[charter.Engine]:
    """Today's engine on the store (on the system's clock, as the release's was)."""
    config = charter.EngineConfig(credentials=creds[1], signing_key=key)
    engine = charter.Engine.open(store_address, config=config)
    yield engine
    engine.close()


def _version(raw: RawStore) -> int:
    [row] = raw.rows("SELECT MAX(version) AS v FROM schema_migrations")
    return int(row["v"])


def _balances(engine: charter.Engine, mission: str) -> dict[str, Any]:
    return {u: vars(b) for u, b in engine.balances(mission).items()}


@pytest.mark.bare_store
def test_L2_S1_a_store_written_by_the_schema_22_release_keeps_its_books_and_chains(
    store_address: str,
    raw: RawStore,
    releases: Path,
    creds: tuple[dict[str, str], dict[str, str]],
    spec: dict[str, Any],
    request: pytest.FixtureRequest,
) -> None:
    facts = _release.build(_release.SCHEMA_22, releases, store_address, spec)
    assert _version(raw) == 22
    assert {"allowances", "escrow_accounts"} <= set(raw.tables())
    first, second = facts["first"], facts["second"]
    chains = {c: raw.events(c) for c in facts["verified"] if c != "engine"}
    assert len(chains) == 3  # two missions and the slice lent by the second

    engine: charter.Engine = request.getfixturevalue("opened")  # upgrades the store
    assert _version(raw) == LATEST
    assert not {"allowances", "escrow_accounts"} & set(raw.tables())
    # Not one event rewritten, every chain as long and as sound as the release left it.
    assert {c: raw.events(c) for c in chains} == chains
    verified = {v.mission_id: [v.ok, v.events] for v in engine.verify_audit()}
    assert {c: verified[c] for c in chains} == {c: facts["verified"][c] for c in chains}
    assert all(ok for ok, _ in verified.values())
    # The books, the mission's and the open slice's, as the release kept them (L0-L2, L10).
    assert {m: _balances(engine, m) for m in (first, second)} == facts["balances"]
    assert facts["ledger"] == {first: [], second: []}
    assert engine.check_ledger(first) == [] and engine.check_ledger(second) == []

    # The attempt whose outcome nobody knows is still found, its hold kept (R4, R5).
    state = engine.coordinator.recover(facts["run"], "after-upgrade", force=True)
    assert [a.id for a in state.attempts] == [facts["unknown"]]
    # Its run's counts as the release kept them; settled now, it is counted once (R5).
    assert state.settled_counts == {"succeeded": 1}
    alice = engine.authenticate(creds[0]["alice"])
    engine.coordinator.resolve(
        facts["unknown"], by=alice, outcome="failed", evidence="the target never saw it"
    )
    recovered = engine.coordinator.recover(facts["run"], "after-resolve", force=True, by=alice)
    assert recovered.state.settled_counts == {"succeeded": 1, "failed": 1}
    # And the upgraded store goes on: an attempt moves the books it now keeps.
    agent = engine.authenticate(creds[0]["agent"])
    ex = engine.start_run(first, by=agent, segment_id="s3")
    ex.perform(RecordingAdapter(), "read", {"n": 4}, effect_key="after")
    after = _balances(engine, first)
    assert after["calls"]["spent"] > facts["balances"][first]["calls"]["spent"]
    assert engine.check_ledger(first) == []
    assert all(v.ok for v in engine.verify_audit(first))


def test_S2_a_snapshot_made_by_the_schema_22_release_is_imported(
    backend: str,
    tmp_path: Path,
    releases: Path,
    creds: tuple[dict[str, str], dict[str, str]],
    spec: dict[str, Any],
    key: str,
) -> None:
    for folder in ("old", "new"):
        (tmp_path / folder).mkdir()
    with fresh_store(tmp_path / "old", backend, bare=True) as old:
        facts = _release.build(_release.SCHEMA_22, releases, old, spec)
    public = load_signer(key).public_key
    config = charter.EngineConfig(credentials=creds[1], trusted_keys=(public,))
    with fresh_store(tmp_path / "new", backend) as new:
        engine = charter.Engine.open(new, config=config)
        try:
            mission = engine.import_snapshot(facts["snapshot"])
            assert mission == facts["first"]
            assert _balances(engine, mission) == facts["snapshot_balances"]
            assert engine.check_ledger(mission) == []
            assert all(v.ok for v in engine.verify_audit(mission))
        finally:
            engine.close()
