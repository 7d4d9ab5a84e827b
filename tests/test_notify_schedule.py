"""K3: a deliverer's thread sends each retry when its backoff ends (about 1, 2,
4, 8 s, jittered), not at its next poll.

A real HTTP receiver on loopback answers the first deliveries 500 and records
when each arrived; the deliverer runs in its thread, on an engine with the
real clock, its poll interval the default (5 s). What is checked is when the
receiver got each try, and what the store recorded of the delivery.
"""

from __future__ import annotations

import itertools
import secrets
import time
from typing import Any

import pytest

import charter
from charter.workers.notify import Notices
from conftest import Principals, default_contract
from test_notify import SECRET_ENV, Receiver, hook

#: How much later than its backoff's ceiling a retry may arrive: the mark's
#: commit, the thread's wake, the claim and the send, on a loaded machine.
SLACK_SECONDS = 0.75
FAILURES = 4


def test_K3_item11_retries_arrive_on_their_backoff_schedule_not_on_the_poll(
    store_address: str, creds: Any, monkeypatch: pytest.MonkeyPatch
) -> None:
    monkeypatch.setenv(SECRET_ENV, "whsec-" + secrets.token_hex(16))
    receiver = Receiver()
    receiver.answers = [500] * FAILURES
    config = charter.EngineConfig(credentials=creds[1])
    try:
        with charter.Engine.open(store_address, config=config) as engine:  # the real clock
            who = Principals(creds[0], creds[1], engine)
            mission = engine.create_mission(default_contract(), by=who.alice)
            run = engine.start_run(mission, by=who.agent, segment_id="s1")
            notices = Notices(engine, [hook(receiver.url)])  # backoff 1 s, poll 5 s
            notices.start()
            try:
                nid = notices.post(run.run_id, mission, "allowance", ["usd is exhausted"])
                deadline = time.monotonic() + 40
                while len(receiver.got) <= FAILURES or notices.pending():
                    assert time.monotonic() < deadline, [g.at for g in receiver.got]
                    time.sleep(0.05)
            finally:
                notices.stop()
            [delivery] = notices.deliveries(nid)
            assert (delivery.status, delivery.tries) == ("delivered", FAILURES + 1)
            assert delivery.last_error is None and notices.pending() == 0
        assert receiver.ids() == [nid] * (FAILURES + 1)
        arrived = [g.at for g in receiver.got]
        gaps = [later - sooner for sooner, later in itertools.pairwise(arrived)]
        print(f"\nretries {', '.join(f'{g:.2f}' for g in gaps)} s after the try before")
        # After try n the retry waits between half and all of 2**(n-1) s (docs/notices.md).
        for n, gap in enumerate(gaps, 1):
            ceiling = 2.0 ** (n - 1)
            assert ceiling / 2 <= gap <= ceiling + SLACK_SECONDS, (n, gaps)
    finally:
        receiver.close()
