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

import _cli_mission
from _raw import RawStore
from charter.testing import RecordingAdapter, credential

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
    "principals": {"agent": {"run": ["mail.*"]}, "ops": ["resolve", "run", "stop", "link"]},
    "allowance": {"calls": 10},
}, by=ops)
ex = engine.start_run(mission, by=agent, segment_id="seg-1", plan=m.plan, input={"x": 1})
print(ex.run_id, mission, flush=True)
ex.execute(m.plan)
"""


@pytest.fixture
def setup(tmp_path: Path) -> dict[str, Any]:
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

    # N4: a reviewed linked run after the completed one performs nothing settled again.
    code, linked = charter_cli(setup, "link", run_id, "--segment", "seg-3", ops=True)
    assert code == 0, linked
    assert (linked["linked_from"], linked["status"]) == (run_id, "completed")
    code, shown = charter_cli(setup, "show", linked["run_id"])
    assert code == 0 and shown["linked_from"] == run_id
    assert [json.loads(line)["key"] for line in outbox.read_text().splitlines()] == keys


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


# -- bad input for every command: a typed error, one line, exit 1, nothing changed -------------


def _snapshot(db: Path) -> dict[str, list[tuple[Any, ...]]]:
    """Every table but the audit log (refusals are audited, by design)."""
    store = RawStore(str(db), "sqlite")
    try:
        return store.state()
    finally:
        store.close()


@pytest.fixture
def populated(setup: dict[str, Any], monkeypatch: pytest.MonkeyPatch) -> dict[str, Any]:
    """A mission with a run holding one settled and one UNKNOWN attempt."""
    import charter

    monkeypatch.setenv("CHARTER_TEST_OUTBOX", setup["env"]["CHARTER_TEST_OUTBOX"])
    mallory, mallory_digest = credential("mallory")
    toml = setup["dir"] / "charter.toml"
    toml.write_text(
        toml.read_text().replace("[adapters]", f'mallory = "{mallory_digest}"\n[adapters]')
    )
    config = charter.EngineConfig.from_file(toml)
    with charter.Engine.open(config=config) as engine:
        ops = engine.authenticate(setup["ops"])
        agent = engine.authenticate(setup["agent"])
        mission = engine.create_mission(
            {
                "objective": "announce",
                "principals": {
                    "agent": {"run": ["mail.*"]},
                    "ops": ["resolve", "run", "stop", "raise_limit"],
                    "mallory": {"run": ["mail.*"]},
                },
                "allowance": {"calls": 10},
            },
            by=ops,
        )
        ex = engine.start_run(mission, by=agent, segment_id="seg-1")
        mail = _cli_mission.make_mail()
        settled = ex.attempt(mail, "send", {"n": 1}, effect_key="a")
        lost = RecordingAdapter(name="mail", operations=mail.operations, script={"send": _raise})
        unknown = ex.attempt(lost, "send", {"n": 2}, effect_key="b")
    return {
        **setup,
        "mallory": mallory,
        "mission": mission,
        "run": ex.run_id,
        "settled": settled.id,
        "unknown": unknown.id,
    }


def _raise(send: Any) -> Any:
    raise TimeoutError("lost")


BAD: dict[str, tuple[list[str], str | None, str]] = {
    "show unknown run": (["show", "run_x"], None, "not_found"),
    "attempts of unknown run is empty": (["attempts", "--run", "run_x"], None, ""),
    "recover unknown run": (["recover", "run_x", "--segment", "s9"], None, "not_found"),
    "recover reused segment": (["recover", "{run}", "--segment", "seg-1"], None, "segment_reused"),
    "recover live lease": (["recover", "{run}", "--segment", "s9"], None, "lease_held"),
    "force without right": (
        ["recover", "{run}", "--segment", "s9", "--force"],
        "mallory",
        "not_authorized",
    ),
    "reconcile unknown attempt": (["reconcile", "att_x"], None, "not_found"),
    "reconcile settled attempt": (["reconcile", "{settled}"], None, "attempt_settled"),
    "reconcile as a segment that does not own the run": (
        ["reconcile", "{unknown}", "--segment", "seg-9"],
        None,
        "invalid_state",
    ),
    "confirm unknown attempt": (["confirm", "att_x"], "ops", "not_found"),
    "confirm without evidence": (["confirm", "{unknown}"], "ops", "invalid_state"),
    "confirm by mallory": (["confirm", "{unknown}"], "mallory", "not_authorized"),
    "resolve settled attempt": (
        ["resolve", "{settled}", "--failed", "--evidence", "x"],
        "ops",
        "attempt_settled",
    ),
    "resolve by mallory": (
        ["resolve", "{unknown}", "--written-off", "--evidence", "x"],
        "mallory",
        "not_authorized",
    ),
    "resolve unauthenticated": (
        ["resolve", "{unknown}", "--written-off", "--evidence", "x"],
        None,
        "unauthenticated",
    ),
    "resolve bad cost": (
        ["resolve", "{unknown}", "--succeeded", "--cost", "calls=1.5", "--evidence", "x"],
        "ops",
        "invalid_state",
    ),
    "resume unknown run": (["resume", "run_x", "--segment", "s9"], "ops", "not_found"),
    "resume past unknown attempt": (
        ["resume", "{run}", "--segment", "seg-1"],
        "ops",
        "needs_intervention",
    ),
    "stop unknown run": (["stop", "run_x"], "ops", "not_found"),
    "link unknown run": (["link", "run_x", "--segment", "s9"], "ops", "not_found"),
    "link a live run": (["link", "{run}", "--segment", "s9"], "ops", "invalid_state"),
    "stop by mallory": (["stop", "{run}"], "mallory", "not_authorized"),
    "stop unauthenticated": (["stop", "{run}"], None, "unauthenticated"),
    "raise limit of unknown mission": (["raise-limit", "msn_x", "calls=20"], "ops", "not_found"),
    "raise limit of unknown unit": (
        ["raise-limit", "{mission}", "usd=20"],
        "ops",
        "contract_error",
    ),
    "raise limit downwards": (["raise-limit", "{mission}", "calls=5"], "ops", "contract_error"),
    "raise limit not a number": (
        ["raise-limit", "{mission}", "calls=2e3"],
        "ops",
        "invalid_state",
    ),
    "raise limit without unit": (["raise-limit", "{mission}", "=20"], "ops", "invalid_state"),
    "raise limit by mallory": (
        ["raise-limit", "{mission}", "calls=20"],
        "mallory",
        "not_authorized",
    ),
    "approve unknown": (["approve", "apr_x"], "ops", "not_found"),
    "incidents unknown mission": (["incidents", "msn_x"], None, "not_found"),
    "close unknown incident": (["close-incident", "inc_x", "--note", "n"], "ops", "not_found"),
    "ledger unknown mission": (["ledger", "msn_x"], None, "not_found"),
    "audit unknown mission": (["audit", "verify", "--mission", "msn_x"], None, "not_found"),
}


@pytest.mark.parametrize("case", list(BAD), ids=list(BAD))
def test_cli_bad_input_is_a_typed_one_line_error_and_changes_nothing(
    populated: dict[str, Any], case: str
) -> None:
    args, who, code = BAD[case]
    args = [a.format(**populated) for a in args]
    db = populated["dir"] / "charter.db"
    before = _snapshot(db)
    env = dict(populated["env"])
    if who is not None:
        env["CHARTER_CREDENTIAL"] = populated[who]
    plain = subprocess.run(
        [sys.executable, "-m", "charter", *args],
        cwd=populated["dir"],
        env=env,
        capture_output=True,
        text=True,
        timeout=60,
    )
    as_json = subprocess.run(
        [sys.executable, "-m", "charter", *args, "--json"],
        cwd=populated["dir"],
        env=env,
        capture_output=True,
        text=True,
        timeout=60,
    )
    assert _snapshot(db) == before
    if not code:  # a query that finds nothing is not an error
        assert plain.returncode == 0 and json.loads(as_json.stdout) == []
        return
    assert plain.returncode == 1 and as_json.returncode == 1
    assert len(plain.stderr.strip().splitlines()) == 1 and plain.stderr.startswith("error: ")
    assert "Traceback" not in plain.stderr + as_json.stderr
    assert json.loads(as_json.stdout)["error"]["code"] == code


def test_N5_cli_stop_then_resolve_ends_the_run_stopped_and_raise_limit_versions_the_contract(
    populated: dict[str, Any],
) -> None:
    run, mission, unknown = populated["run"], populated["mission"], populated["unknown"]
    code, stopped = charter_cli(populated, "stop", run, "--reason", "operator", ops=True)
    assert code == 0, stopped
    assert (stopped["status"], stopped["status_reason"], stopped["unresolved"]) == (
        "stopping",
        "operator",
        1,
    )
    code, again = charter_cli(populated, "stop", run, ops=True)
    assert code == 0 and again["status"] == "stopping"  # still waiting for the same attempt
    code, shown = charter_cli(populated, "show", run)  # what was sent, for whoever resolves it
    assert code == 0 and [a["request"] for a in shown["attempts"]] == [{"n": 2}]

    code, resolved = charter_cli(
        populated, "resolve", unknown, "--written-off", "--evidence", "no answer", ops=True
    )
    assert code == 0 and resolved["status"] == "written_off"
    code, shown = charter_cli(populated, "show", run)
    assert (shown["status"], shown["status_reason"], shown["attempts"]) == (
        "stopped",
        "operator",
        [],
    )
    code, terminal = charter_cli(populated, "stop", run, ops=True)
    assert code == 1 and terminal["error"]["code"] == "run_terminal"

    code, raised = charter_cli(populated, "raise-limit", mission, "calls=25", ops=True)
    assert code == 0, raised
    assert (raised["contract_version"], raised["balance"]["limit"]) == (2, 25)
    assert raised["balance"]["available"] == 25 - raised["balance"]["spent"]
    code, ledger = charter_cli(populated, "ledger", mission)
    assert code == 0 and ledger["problems"] == []
