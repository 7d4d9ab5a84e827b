"""A worker whose store goes away backs off and says so twice (K5).

A real ``charter worker`` process reaches its PostgreSQL store through a relay
on loopback (``_cut.py``) that the test cuts: every connection ends, and every
new one is closed as soon as it is made, counted. The worker carries two runs
meanwhile. What is checked is what the worker's log says, how many times it
tried the store while it was away, and that the runs finish once it is back.
"""

from __future__ import annotations

import json
import os
import signal
import subprocess
import sys
import time
from pathlib import Path
from typing import Any
from urllib.parse import urlsplit, urlunsplit

import pytest

import charter
from _cut import Cut
from charter.runs.model import RunStatus
from charter.testing import credential
from conftest import default_contract

HERE = Path(__file__).resolve().parent
SRC = HERE.parent / "src"
LEASE = 3.0
OUTAGE = 8.0
PLAN = "_worker_plans:THINK_THEN_PAY"
OPTIONS = ("--poll", "0.2", "--concurrency", "2", "--json")


def relayed(url: str, cut: Cut) -> str:
    """``url`` with its host and port those of the relay."""
    parts = urlsplit(url)
    user = f"{parts.username}@" if parts.username else ""
    return urlunsplit(parts._replace(netloc=f"{user}127.0.0.1:{cut.port}"))


@pytest.mark.crash
@pytest.mark.networked
@pytest.mark.timeout(180)
def test_K5_item12_a_worker_backs_off_while_its_store_is_away_and_logs_it_once(
    store_address: str, backend: str, tmp_path: Path
) -> None:
    """Broken: while the database was away, the worker looked again about four
    times a second, and logged a warning per look and a traceback per carried
    run. Now: one line when the store goes away, one when it is back, no
    traceback, at most two tries a second over the outage (backed off up to
    5 s between looks), and the runs it carried finish afterwards."""
    (agent, agent_digest), (alice, alice_digest) = credential("agent"), credential("alice")
    url = urlsplit(store_address)
    cut = Cut(url.hostname or "127.0.0.1", url.port or 5432)
    (tmp_path / "charter.toml").write_text(
        f'store = "{relayed(store_address, cut)}"\nresume = "automatic"\n'
        f"lease_seconds = {LEASE}\nsend_deadline_seconds = 1.0\n"
        f'[credentials]\nagent = "{agent_digest}"\nalice = "{alice_digest}"\n'
    )
    config = charter.EngineConfig.from_file(tmp_path / "charter.toml")
    env = {
        **os.environ,
        "PYTHONPATH": os.pathsep.join([str(HERE), str(SRC)]),
        "CHARTER_CONFIG": str(tmp_path / "charter.toml"),
    }
    log = tmp_path / "worker.log"
    with charter.Engine.open(store_address, config=config) as engine:
        mission = engine.create_mission(default_contract(), by=engine.authenticate(alice))
        work = {"sandbox": "http://127.0.0.1:9", "amount": 1, "invoices": [], "think_seconds": 3}
        runs = [
            engine.submit(
                mission,
                by=engine.authenticate(agent),
                plan=PLAN,
                input=work,
            ).id
            for _ in range(2)
        ]
        with log.open("w") as err:
            worker = subprocess.Popen(
                [sys.executable, "-m", "charter", "worker", "--plan", PLAN, *OPTIONS],
                cwd=tmp_path,
                env=env,
                stdout=subprocess.PIPE,
                stderr=err,
                text=True,
            )
        try:
            carried(engine, runs, timeout=30)
            cut.cut()
            time.sleep(OUTAGE)
            tries = cut.refused
            cut.mend()
            deadline = time.monotonic() + 60
            while not all(engine.run(r).status.terminal for r in runs):
                assert time.monotonic() < deadline, [engine.run(r) for r in runs]
                assert worker.poll() is None, log.read_text()
                time.sleep(0.1)
            worker.send_signal(signal.SIGTERM)
            out, _ = worker.communicate(timeout=30)
        finally:
            worker.kill()
            cut.close()
        assert [engine.run(r).status for r in runs] == [RunStatus.COMPLETED] * 2
    text = log.read_text()
    lines = text.splitlines()
    away = [line for line in lines if "the store is unreachable" in line]
    back = [line for line in lines if "the store answers again" in line]
    print(f"\n{tries} tries of the store in a {OUTAGE:.0f}s outage; log:\n{text}")
    assert worker.returncode == 0, text
    assert len(away) == 1 and len(back) == 1, text
    assert "Traceback" not in text
    assert not [line for line in lines if "could not" in line or "not renewed" in line], text
    assert 1 <= tries <= 2 * OUTAGE
    counts: dict[str, Any] = json.loads(out)["counts"]
    assert counts.get("ended") == 2, counts


def carried(engine: charter.Engine, runs: list[str], timeout: float) -> None:
    """Wait until a worker holds every one of ``runs`` (each begun, its lease live)."""
    deadline = time.monotonic() + timeout
    while not all(engine.run(r).status is RunStatus.ACTIVE for r in runs):
        assert time.monotonic() < deadline, [engine.run(r) for r in runs]
        time.sleep(0.05)
