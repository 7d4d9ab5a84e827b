"""The attempt path end to end on a real store (the shortest useful test)."""

from __future__ import annotations

import charter
from charter.testing import RecordingAdapter
from conftest import Principals


def test_one_attempt_settles_and_the_ledger_and_chain_hold(
    engine: charter.Engine, who: Principals, mission: str, adapter: RecordingAdapter
) -> None:
    ex = engine.start_run(mission, by=who.agent, segment_id="seg-1")
    attempt = ex.perform(adapter, "write", {"to": "x"}, effect_key="send")
    assert attempt.status is charter.AttemptStatus.SUCCEEDED
    assert [s.idempotency_key for s in adapter.sent] == [attempt.idempotency_key]
    stored = engine.get_attempt(attempt.id)
    assert stored.status is charter.AttemptStatus.SUCCEEDED
    assert stored.actual == {"usd": 5_000, "calls": 1}
    assert engine.check_ledger(mission) == []
    assert all(v.ok for v in engine.verify_audit())
