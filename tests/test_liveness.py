"""A dead owner on this host is not waited for; anywhere else the lease rules stand (R1, F1).

The owner of a run is an OS process. When it ran on this host and is provably
gone (its pid is dead, a zombie, or reused by a later process), ``recover``
and ``resume`` take over at once, without force; a live owner, or one on
another host, keeps its lease. Crash cases kill real processes.
"""

from __future__ import annotations

import json
import multiprocessing
import os
import signal
import subprocess
import sys
import textwrap
from collections.abc import Iterator
from pathlib import Path
from typing import Any

import pytest

import charter
from charter.runs import liveness
from charter.runs.liveness import ProcessIdentity
from charter.testing import RecordingAdapter
from conftest import Principals, default_contract

CHILD = textwrap.dedent(
    """
    import json, sys, time
    import charter
    cfg = json.loads(sys.argv[1])
    config = charter.EngineConfig(credentials=cfg["digests"], lease_seconds=60,
                                  send_deadline_seconds=60)
    engine = charter.Engine.open(cfg["store"], config=config, create=False)
    who = engine.authenticate(cfg["credential"])
    if cfg["do"] == "start":
        ex = engine.start_run(cfg["mission"], by=who, segment_id="seg-1")
    else:
        ex = engine.coordinator.resume(cfg["run"], cfg["segment"], by=who)
    print(json.dumps({"run_id": ex.run_id, "epoch": ex.epoch}), flush=True)
    time.sleep(120)
    """
)


class Owner:
    """A child process holding a run (started or resumed), alive until killed."""

    def __init__(self, store: str, creds: tuple[dict[str, str], dict[str, str]], **do: Any) -> None:
        cfg = {"store": store, "digests": creds[1], "credential": creds[0]["agent"], **do}
        env = {**os.environ, "PYTHONPATH": str(Path(__file__).parents[1] / "src")}
        self.proc = subprocess.Popen(
            [sys.executable, "-c", CHILD, json.dumps(cfg)],
            stdout=subprocess.PIPE,
            text=True,
            env=env,
        )
        assert self.proc.stdout is not None
        line = self.proc.stdout.readline()
        assert line, "the owner process died before it held the run"
        self.held = json.loads(line)

    def kill(self) -> None:
        self.proc.send_signal(signal.SIGKILL)
        self.proc.wait()

    def close(self) -> None:
        if self.proc.poll() is None:
            self.kill()
        if self.proc.stdout is not None:
            self.proc.stdout.close()


Creds = tuple[dict[str, str], dict[str, str]]


@pytest.fixture
def real_time(store_address: str, creds: Creds) -> Iterator[tuple[charter.Engine, Principals]]:
    """An engine on the system's clocks, as the owner processes run on."""
    engine = charter.Engine.open(
        store_address, config=charter.EngineConfig(credentials=creds[1], lease_seconds=60)
    )
    yield engine, Principals(*creds, engine)
    engine.close()


@pytest.fixture
def owners(store_address: str, creds: Creds) -> Iterator[Any]:
    started: list[Owner] = []

    def start(**do: Any) -> Owner:
        owner = Owner(store_address, creds, **do)
        started.append(owner)
        return owner

    yield start
    for owner in started:
        owner.close()


def recovered_events(engine: charter.Engine, mission: str) -> list[dict[str, Any]]:
    return [
        json.loads(e["payload"])
        for e in engine.audit_events(mission)
        if e["kind"] == "run.recovered"
    ]


@pytest.mark.crash
def test_R1_a_living_owner_keeps_its_lease_and_a_killed_one_is_taken_over_at_once(
    real_time: tuple[charter.Engine, Principals], owners: Any
) -> None:
    engine, who = real_time
    mission = engine.create_mission(default_contract(), by=who.alice)
    owner = owners(do="start", mission=mission)
    run_id = owner.held["run_id"]

    with pytest.raises(charter.LeaseHeld):
        engine.coordinator.recover(run_id, "seg-2")
    assert engine.run(run_id).epoch == 1

    owner.kill()
    state, _ = engine.coordinator.recover(run_id, "seg-2")

    assert state.epoch == engine.run(run_id).epoch == 2
    [event] = recovered_events(engine, mission)
    assert (event["forced"], event["owner_dead"]["pid"]) == (False, owner.proc.pid)


@pytest.mark.crash
def test_R1_F1_a_killed_executor_s_segment_is_resumed_at_once_without_force(
    real_time: tuple[charter.Engine, Principals], owners: Any
) -> None:
    engine, who = real_time
    mission = engine.create_mission(default_contract(), by=who.alice)
    first = owners(do="start", mission=mission)
    first.kill()
    run_id = first.held["run_id"]
    engine.coordinator.recover(run_id, "seg-2")
    second = owners(do="resume", run=run_id, segment="seg-2")

    with pytest.raises(charter.LeaseHeld):  # the resumed executor is alive
        engine.coordinator.resume(run_id, "seg-2", by=who.agent)
    second.kill()
    ex = engine.coordinator.resume(run_id, "seg-2", by=who.agent)

    assert (ex.epoch, engine.run(run_id).owner_segment) == (2, "seg-2")
    assert ex.perform(RecordingAdapter(), "read", {}, effect_key="k").status.value == "succeeded"


def test_R1_an_owner_recorded_on_another_host_keeps_its_lease(
    engine: charter.Engine, who: Principals, mission: str, raw: Any
) -> None:
    ex = engine.start_run(mission, by=who.agent, segment_id="seg-1")
    me = liveness.current()
    assert me is not None
    gone = ProcessIdentity("elsewhere/boot/pid:[1]", 2**22 + 1, "1").to_json()
    raw.execute("UPDATE runs SET owner_process = ? WHERE id = ?", gone, ex.run_id)

    with pytest.raises(charter.LeaseHeld):
        engine.coordinator.recover(ex.run_id, "seg-2")
    assert engine.run(ex.run_id).epoch == 1


def _use_in_a_fork(ex: charter.Executor, out: Any) -> None:
    try:
        ex.perform(RecordingAdapter(), "read", {}, effect_key="from-a-fork")
        out.put("sent")
    except charter.Fenced as fenced:
        out.put(str(fenced))
    finally:
        os._exit(0)  # leave the parent's connections alone


@pytest.mark.crash
def test_R1_an_executor_used_from_a_forked_child_is_fenced_and_sends_nothing(
    engine: charter.Engine, who: Principals, mission: str
) -> None:
    ex = engine.start_run(mission, by=who.agent, segment_id="seg-1")
    context = multiprocessing.get_context("fork")
    out = context.SimpleQueue()
    child = context.Process(target=_use_in_a_fork, args=(ex, out))
    child.start()
    child.join(timeout=30)

    assert "a fork" in out.get()
    assert engine.attempts(run_id=ex.run_id) == []
    # Nothing of the child reached the parent's connection: the parent goes on.
    attempt = ex.perform(RecordingAdapter(), "read", {}, effect_key="in-the-parent")
    assert attempt.status.value == "succeeded"


# -- the process identity itself ----------------------------------------------------------


def test_a_process_is_dead_when_its_pid_is_gone_a_zombie_or_reused() -> None:
    me = liveness.current()
    assert me is not None and not liveness.provably_dead(me)
    proc = subprocess.Popen([sys.executable, "-c", "import time; time.sleep(60)"])
    try:
        stat = liveness._stat(proc.pid)
        assert stat is not None
        child = ProcessIdentity(me.host, proc.pid, stat[1])
        assert not liveness.provably_dead(child)
        proc.kill()
        while (liveness._stat(proc.pid) or ("Z",))[0] != "Z":
            pass
        assert liveness.provably_dead(child)  # a zombie sends nothing
    finally:
        proc.wait()
    assert liveness.provably_dead(child)  # reaped: the pid is gone
    assert liveness.provably_dead(ProcessIdentity(me.host, me.pid, "0"))  # a later process
    assert not liveness.provably_dead(ProcessIdentity("another/host", proc.pid, stat[1]))
    assert not liveness.provably_dead(None)


@pytest.mark.parametrize(
    "text",
    [None, "", "nonsense", "[]", '{"host": "h"}', '{"host": "h", "pid": -1, "started": "1"}'],
)
def test_an_unreadable_record_proves_nothing(text: str | None) -> None:
    assert ProcessIdentity.from_json(text) is None
    assert not liveness.owner_dead(text)
