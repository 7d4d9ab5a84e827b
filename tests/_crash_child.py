"""The child process of ``test_crash.py``: one Charter executor, killed or paused for real.

Run as ``python _crash_child.py CONFIG.json``. The configuration names the store,
the credential digests, the agent's credential, the mission, the HTTP target and
the scenario:

- ``crash``: settle one attempt, park one PREPARED attempt, then arm a crash at
  ``point`` (a name from :data:`charter.crashpoints.POINTS`, or ``"adapter"`` for a
  SIGKILL inside the adapter right after the target answered) and perform one
  more attempt, either ``two_phase`` (``admit`` then ``dispatch``) or
  ``one_shot`` (``attempt``). The process is expected to die by SIGKILL.
- ``zombie``: park one PREPARED attempt, then perform one attempt whose adapter
  pauses (``before_send`` or ``after_send``) until ``go`` arrives on stdin. After
  that it tries to dispatch, to attempt and to renew its lease, and reports
  which of these were fenced.

Progress is reported as one JSON object per line on stdout.
"""

from __future__ import annotations

import json
import os
import signal
import sys
import urllib.request
from collections.abc import Callable, Mapping
from pathlib import Path
from typing import Any

import charter
from charter.crashpoints import POINTS
from charter.testing import kill_at

COST = {"usd": 5_000, "calls": 1}

# Talk to the target directly, never through a proxy configured in the environment.
_OPENER = urllib.request.build_opener(urllib.request.ProxyHandler({}))


def emit(event: str, **data: Any) -> None:
    print(json.dumps({"event": event, **data}), flush=True)


def wait_for_go() -> None:
    if sys.stdin.readline().strip() != "go":
        sys.exit(3)


class ArmedKill:
    """A crash hook that delegates to :func:`charter.testing.kill_at` once armed."""

    def __init__(self, point: str) -> None:
        self._kill = kill_at(point) if point in POINTS else None
        self.armed = False

    def __call__(self, name: str) -> None:
        if self.armed and self._kill is not None:
            self._kill(name)


class HttpTarget:
    """An adapter that sends each attempt to a real HTTP target on 127.0.0.1."""

    name = "target"
    operations: Mapping[str, charter.Operation] = {
        "write": charter.Operation(charter.EffectClass.UNSAFE)
    }

    def __init__(self, url: str) -> None:
        self.url = url
        self.kill_after_send = False
        self.pause: str | None = None

    def estimate(self, operation: str, request: Any) -> charter.Estimate:
        return charter.Estimate(dict(COST), "target/test-prices")

    def dispatch(self, send: charter.Dispatch) -> charter.Outcome:
        pause, self.pause = self.pause, None
        if pause == "before_send":
            emit("paused", attempt_id=send.attempt_id)
            wait_for_go()
        send.check_deadline()
        request = urllib.request.Request(
            self.url,
            data=json.dumps({"attempt_id": send.attempt_id, "request": send.request}).encode(),
            method="POST",
            headers={
                "Content-Type": "application/json",
                "Idempotency-Key": send.idempotency_key,
                "X-Fencing-Token": str(send.fencing_token),
                "X-Send-Deadline-Us": str(send.send_deadline_us),
            },
        )
        with _OPENER.open(request, timeout=10) as response:
            answer = json.load(response)
        if self.kill_after_send:
            os.kill(os.getpid(), signal.SIGKILL)
        if pause == "after_send":
            emit("paused", attempt_id=send.attempt_id)
            wait_for_go()
        return charter.Outcome.succeeded(
            {"seq": answer["seq"]},
            cost=dict(COST),
            receipt={"target_seq": answer["seq"], "key": send.idempotency_key},
            price_source="target/test-prices",
        )

    def reconcile(self, attempt: charter.RecordedAttempt) -> charter.Evidence:
        return charter.Evidence.indeterminate({"looked_up": attempt.id})


def crash(cfg: Mapping[str, Any], engine: charter.Engine, hook: ArmedKill) -> None:
    agent = engine.authenticate(cfg["credential"])
    target = HttpTarget(cfg["target"])
    ex = engine.start_run(cfg["mission_id"], by=agent, segment_id="seg-1")
    settled = ex.perform(target, "write", {"n": 1}, effect_key="settled")
    parked = ex.admit(target, "write", {"n": 2}, effect_key="parked")
    emit(
        "ready",
        run_id=ex.run_id,
        epoch=ex.epoch,
        pid=os.getpid(),
        settled=settled.id,
        settled_status=settled.status.value,
        parked=parked.id,
    )
    if cfg["point"] == "adapter":
        target.kill_after_send = True
    hook.armed = True
    if cfg["path"] == "two_phase":
        attempt = ex.admit(target, "write", {"n": 3}, effect_key="crash")
        ex.dispatch(attempt.id, target)
    else:
        ex.perform(target, "write", {"n": 3}, effect_key="crash")
    emit("survived")


def zombie(cfg: Mapping[str, Any], engine: charter.Engine) -> None:
    agent = engine.authenticate(cfg["credential"])
    target = HttpTarget(cfg["target"])
    ex = engine.start_run(cfg["mission_id"], by=agent, segment_id="seg-1")
    parked = ex.admit(target, "write", {"n": 1}, effect_key="parked")
    emit("ready", run_id=ex.run_id, epoch=ex.epoch, parked=parked.id)
    target.pause = cfg["pause"]
    first = ex.perform(target, "write", {"n": 2}, effect_key="zombie")
    emit("settled", attempt_id=first.id, status=first.status.value)
    tries: list[tuple[str, Callable[[], object]]] = [
        ("dispatch", lambda: ex.dispatch(parked.id, target)),
        ("attempt", lambda: ex.perform(target, "write", {"n": 3}, effect_key="after-takeover")),
        ("renew_lease", ex.renew_lease),
    ]
    results: list[dict[str, Any]] = []
    for op, call in tries:
        try:
            call()
        except charter.Fenced as exc:
            results.append(
                {"op": op, "fenced": True, "epoch": exc.epoch, "current_epoch": exc.current_epoch}
            )
        except charter.CharterError as exc:
            results.append({"op": op, "fenced": False, "error": exc.code})
        else:
            results.append({"op": op, "fenced": False})
    emit("done", results=results)


def main(argv: list[str]) -> int:
    cfg = json.loads(Path(argv[1]).read_text())
    hook = ArmedKill(cfg.get("point", ""))
    config = charter.EngineConfig(
        credentials=cfg["digests"],
        lease_seconds=cfg["lease_seconds"],
        send_deadline_seconds=cfg["lease_seconds"],
    )
    with charter.Engine.open(cfg["store"], config=config, crash_hook=hook) as engine:
        if cfg["mode"] == "crash":
            crash(cfg, engine, hook)
        else:
            zombie(cfg, engine)
    return 0


if __name__ == "__main__":
    sys.exit(main(sys.argv))
