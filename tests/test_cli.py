"""The CLI end to end, in real processes: crash, recover, reconcile, confirm, resume."""

from __future__ import annotations

import json
import os
import subprocess
import sys
import time
from pathlib import Path
from typing import Any

import pytest

HERE = Path(__file__).resolve().parent

CHILD = """
import sys, charter
from charter.testing import kill_at
import _cli_mission as m
config = charter.EngineConfig.from_file(sys.argv[1])
engine = charter.Engine.open(config=config, crash_hook=kill_at("settlement.before"))
agent = engine.authenticate(sys.argv[2])
ops = engine.authenticate(sys.argv[3])
mission = engine.create_mission({
    "objective": "announce",
    "principals": {"agent": {"run": ["mail.*"]}, "ops": ["resolve", "run", "stop"]},
    "allowance": {"calls": 10},
}, by=ops)
ex = engine.start_run(mission, by=agent, segment_id="seg-1", plan=m.plan, input={"x": 1})
print(ex.run_id, mission, flush=True)
ex.execute(m.plan)
"""


@pytest.fixture
def setup(tmp_path: Path) -> dict[str, Any]:
    from charter.testing import credential

    agent, agent_digest = credential("agent")
    ops, ops_digest = credential("ops")
    (tmp_path / "charter.toml").write_text(
        f'store = "charter.db"\nlease_seconds = 1\nsend_deadline_seconds = 1\n'
        f'[credentials]\nagent = "{agent_digest}"\nops = "{ops_digest}"\n'
        f'[adapters]\nmail = "_cli_mission:make_mail"\n'
    )
    env = {
        **os.environ,
        "PYTHONPATH": str(HERE),
        "CHARTER_CONFIG": str(tmp_path / "charter.toml"),
        "CHARTER_TEST_OUTBOX": str(tmp_path / "outbox.jsonl"),
    }
    (tmp_path / "outbox.jsonl").write_text("")
    return {"dir": tmp_path, "env": env, "agent": agent, "ops": ops}


def charter_cli(setup: dict[str, Any], *args: str, ops: bool = False) -> Any:
    env = dict(setup["env"])
    if ops:
        env["CHARTER_CREDENTIAL"] = setup["ops"]
    done = subprocess.run(
        [sys.executable, "-m", "charter", *args, "--json"],
        cwd=setup["dir"],
        env=env,
        capture_output=True,
        text=True,
        timeout=60,
    )
    out = json.loads(done.stdout) if done.stdout.strip() else done.stderr
    return done.returncode, out


def test_R5_crash_recover_reconcile_confirm_resume_sends_each_effect_once(
    setup: dict[str, Any],
) -> None:
    child = subprocess.run(
        [
            sys.executable,
            "-c",
            CHILD,
            str(setup["dir"] / "charter.toml"),
            setup["agent"],
            setup["ops"],
        ],
        cwd=setup["dir"],
        env=setup["env"],
        capture_output=True,
        text=True,
        timeout=60,
    )
    assert child.returncode == -9, child.stderr
    run_id, mission = child.stdout.split()
    outbox = setup["dir"] / "outbox.jsonl"
    assert len(outbox.read_text().splitlines()) == 1  # sent, then killed before settling

    time.sleep(1.1)  # the dead owner's lease expires by the store's clock
    code, state = charter_cli(setup, "recover", run_id, "--segment", "seg-2")
    assert code == 0
    assert state["epoch"] == 2 and len(state["unresolved"]) == 1
    assert state["next_actions"]
    attempt_id = state["unresolved"][0]

    code, again = charter_cli(setup, "recover", run_id, "--segment", "seg-2")
    assert code == 1 and again["error"]["code"] == "segment_reused"

    code, ev = charter_cli(setup, "reconcile", attempt_id)
    assert code == 0 and ev["verdict"] == "applied" and ev["settled"] is False

    code, refused = charter_cli(setup, "confirm", attempt_id)  # no credential
    assert code == 1 and refused["error"]["code"] == "unauthenticated"

    code, settled = charter_cli(setup, "confirm", attempt_id, ops=True)
    assert code == 0 and settled["status"] == "succeeded"

    code, resumed = charter_cli(setup, "resume", run_id, "--segment", "seg-2", ops=True)
    assert code == 0, resumed
    assert resumed["status"] == "completed"
    keys = [json.loads(line)["key"] for line in outbox.read_text().splitlines()]
    assert len(keys) == 2 and len(set(keys)) == 2  # each effect once, none repeated

    code, ledger = charter_cli(setup, "ledger", mission)
    assert code == 0 and ledger["problems"] == []
    code, chains = charter_cli(setup, "audit", "verify")
    assert code == 0 and all(c["ok"] for c in chains)


def test_cli_errors_are_one_line_and_change_nothing(setup: dict[str, Any]) -> None:
    for args in (
        ["show", "run_nope"],
        ["reconcile", "att_nope"],
        ["ledger", "msn_nope"],
        ["recover", "run_nope", "--segment", "s"],
    ):
        code, out = charter_cli(setup, *args)
        assert code == 1 and out["error"]["code"] == "not_found"
    env = dict(setup["env"])
    done = subprocess.run(
        [sys.executable, "-m", "charter", "show", "run_nope"],
        cwd=setup["dir"],
        env=env,
        capture_output=True,
        text=True,
        timeout=60,
    )
    assert done.returncode == 1 and len(done.stderr.strip().splitlines()) == 1
    code, runs = charter_cli(setup, "runs")
    assert code == 0 and runs == []
