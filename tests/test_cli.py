"""The CLI end to end, in real processes: crash, recover, reconcile, confirm, resume."""

from __future__ import annotations

import json
import os
import re
import subprocess
import sys
import time
from collections.abc import Callable
from pathlib import Path
from typing import Any

import pytest

import _cli_mission
import charter
from _raw import RawStore
from charter.cli import app as cli_mod
from charter.storage import Tx
from charter.testing import RecordingAdapter, credential
from conftest import default_contract

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
    assert state["epoch"] == 2 and len(state["unresolved"]) == 1 and state["taken_over"] is True
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
    charter.Engine.open(str(setup["dir"] / "charter.db")).close()  # an empty store
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
    assert code == 0 and runs == {"items": [], "next": None}


# -- bad input for every command: a typed error, one line, exit 1, nothing changed -------------


def _snapshot(populated: dict[str, Any]) -> dict[str, list[tuple[Any, ...]]]:
    """Every table but the audit log (refusals are audited, by design)."""
    store = RawStore(populated["store"], populated["backend"])
    try:
        return store.state()
    finally:
        store.close()


@pytest.fixture
def populated(
    setup: dict[str, Any], monkeypatch: pytest.MonkeyPatch, store_address: str, backend: str
) -> dict[str, Any]:
    """A mission with a run holding one settled and one UNKNOWN attempt, on the test's
    store (the configuration names it: on SQLite, the same ``charter.db``). The run's
    lease stays live for the test however slow the machine (a minute, not a second)."""
    import charter

    monkeypatch.setenv("CHARTER_TEST_OUTBOX", setup["env"]["CHARTER_TEST_OUTBOX"])
    mallory, mallory_digest = credential("mallory")
    toml = setup["dir"] / "charter.toml"
    toml.write_text(
        toml.read_text()
        .replace('store = "charter.db"', f"store = {json.dumps(store_address)}")
        .replace("lease_seconds = 1\n", "lease_seconds = 60\n")
        .replace("[adapters]", f'mallory = "{mallory_digest}"\n[adapters]')
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
        settled = ex.perform(mail, "send", {"n": 1}, effect_key="a")
        lost = RecordingAdapter(name="mail", operations=mail.operations, script={"send": _raise})
        unknown = ex.perform(lost, "send", {"n": 2}, effect_key="b")
    return {
        **setup,
        "store": store_address,
        "backend": backend,
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
    "attempts of unknown run": (["attempts", "--run", "run_x"], None, "not_found"),
    "attempts of unknown mission": (["attempts", "--mission", "msn_x"], None, "not_found"),
    "runs of unknown mission": (["runs", "--mission", "msn_x"], None, "not_found"),
    "approvals of unknown run": (["approvals", "--run", "run_x"], None, "not_found"),
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
        "usage_error",
    ),
    "resolve cost of 2**64": (
        ["resolve", "{unknown}", "--succeeded", "--cost", f"calls={2**64}", "--evidence", "x"],
        "ops",
        "usage_error",
    ),
    "resolve cost of 2**63": (
        ["resolve", "{unknown}", "--succeeded", "--cost", f"calls={2**63}", "--evidence", "x"],
        "ops",
        "usage_error",
    ),
    "resolve negative cost": (
        ["resolve", "{unknown}", "--succeeded", "--cost", "calls=-1", "--evidence", "x"],
        "ops",
        "usage_error",
    ),
    "resolve cost without unit": (
        ["resolve", "{unknown}", "--succeeded", "--cost", "=1", "--evidence", "x"],
        "ops",
        "usage_error",
    ),
    "resolve cost of one unit twice": (
        ["resolve", "{unknown}", "--failed", "--cost=calls=1", "--cost=calls=2", "--evidence", "x"],
        "ops",
        "usage_error",
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
    "raise limit not a number": (["raise-limit", "{mission}", "calls=2e3"], "ops", "usage_error"),
    "raise limit without unit": (["raise-limit", "{mission}", "=20"], "ops", "usage_error"),
    "raise limit to 2**63": (["raise-limit", "{mission}", f"calls={2**63}"], "ops", "usage_error"),
    "raise limit negative": (["raise-limit", "{mission}", "calls=-20"], "ops", "usage_error"),
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
    populated: dict[str, Any],
    case: str,
    monkeypatch: pytest.MonkeyPatch,
    capsys: pytest.CaptureFixture[str],
) -> None:
    """Run as ``python -m charter`` runs it (``main``, whose status is the exit
    status), in this process: the operator's directory and environment."""
    from charter.cli.app import main

    args, who, code = BAD[case]
    args = [a.format(**populated) for a in args]
    before = _snapshot(populated)
    monkeypatch.chdir(populated["dir"])
    for name in set(os.environ) - set(populated["env"]):
        monkeypatch.delenv(name)
    for name, value in populated["env"].items():
        monkeypatch.setenv(name, value)
    if who is not None:
        monkeypatch.setenv("CHARTER_CREDENTIAL", populated[who])
    outcomes = []
    for given in (args, [*args, "--json"]):
        status = main(given)
        outcomes.append((status, *capsys.readouterr()))
    (plain, _, plain_err), (as_json, json_out, json_err) = outcomes
    assert _snapshot(populated) == before
    exit_code = 2 if code == "usage_error" else 1  # the command line itself is wrong: 2
    assert plain == exit_code and as_json == exit_code
    assert len(plain_err.strip().splitlines()) == 1 and plain_err.startswith("error: ")
    assert "Traceback" not in plain_err + json_err
    assert json.loads(json_out)["error"]["code"] == code


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


# -- the command line itself: global options, the store, exit codes, paging -----------------


@pytest.mark.parametrize("where", ["before", "after"])
@pytest.mark.parametrize("option", ["--store", "--config", "--json"])
def test_cli_global_option_means_the_same_before_or_after_the_command(
    populated: dict[str, Any], cli: Callable[..., tuple[int, Any]], option: str, where: str
) -> None:
    """Broken: an option written before the command is dropped, so the command runs on
    ./.charter/ (creating it) or prints a table instead of JSON."""
    given = {
        "--store": ["--store", populated["store"]],
        "--config": ["--config", str(populated["dir"] / "charter.toml")],
        "--json": ["--json"],
    }
    placed = given[option]
    # The other options go after the command, where they have always worked.
    rest = [a for o, value in given.items() if o not in (option, "--config") for a in value]
    argv = [*placed, "missions", *rest] if where == "before" else ["missions", *rest, *placed]
    code, out = cli(*argv)
    assert code == 0, out
    assert [m["id"] for m in out["items"]] == [populated["mission"]]
    assert not Path(".charter").exists()


@pytest.mark.parametrize("option", ["--store", "--config"])
def test_cli_global_option_given_twice_with_different_values_is_a_usage_error(
    populated: dict[str, Any], cli: Callable[..., tuple[int, Any]], option: str
) -> None:
    value = populated["store"] if option == "--store" else str(populated["dir"] / "charter.toml")
    code, out = cli(option, value, "missions", option, value + ".other", "--json")
    assert code == 2 and out["error"]["code"] == "usage_error"
    assert option in out["error"]["message"]
    assert not Path(".charter").exists() and not Path(value + ".other").exists()
    code, out = cli(option, value, "missions", option, value, "--json")  # the same: fine
    assert code == 0 and [m["id"] for m in out["items"]] == [populated["mission"]]


#: Every command that works on a store, with arguments that parse.
ON_A_STORE = [
    ["missions"],
    ["runs"],
    ["show", "run_x"],
    ["attempts"],
    ["approvals"],
    ["incidents", "msn_x"],
    ["ledger", "msn_x"],
    ["audit", "verify"],
    ["recover", "run_x", "--segment", "s"],
    ["reconcile", "att_x"],
    ["confirm", "att_x"],
    ["resolve", "att_x", "--failed", "--evidence", "e"],
    ["resume", "run_x", "--segment", "s"],
    ["stop", "run_x"],
    ["link", "run_x", "--segment", "s"],
    ["raise-limit", "msn_x", "calls=1"],
    ["approve", "apr_x"],
    ["close-incident", "inc_x", "--note", "n"],
]


@pytest.mark.parametrize("command", ON_A_STORE, ids=lambda c: c[0])
def test_cli_refuses_a_store_that_does_not_exist_and_creates_nothing(
    cli: Callable[..., tuple[int, Any]], tmp_path: Path, command: list[str]
) -> None:
    """Broken: a mistyped --store makes an empty store there and answers from it."""
    missing = tmp_path / "no" / "such.db"
    code, out = cli(*command, "--store", str(missing), "--json")
    assert code == 1 and out["error"]["code"] == "store_not_found", out
    assert str(missing) in out["error"]["message"]
    assert not missing.parent.exists()
    code, text = cli(*command)  # the default store, ./.charter/charter.db
    assert code == 1 and text.startswith("error: no Charter store")
    assert len(text.strip().splitlines()) == 1
    assert not Path(".charter").exists()


@pytest.mark.bare_store
def test_cli_refuses_an_uncreated_store_on_either_backend(
    cli: Callable[..., tuple[int, Any]], store_address: str, backend: str
) -> None:
    code, out = cli("missions", "--store", store_address, "--json")
    assert code == 1 and out["error"]["code"] == "store_not_found"
    if backend == "sqlite":
        assert not Path(store_address).exists()
    else:
        import psycopg

        with psycopg.connect(store_address) as con:
            tables = con.execute(
                "SELECT table_name FROM information_schema.tables "
                "WHERE table_schema = current_schema()"
            ).fetchall()
        assert tables == []
    with pytest.raises(charter.StoreError) as refused:
        charter.Engine.open(store_address, create=False)
    assert refused.value.code == "store_not_found"
    charter.Engine.open(store_address).close()  # Engine.open creates a store by default
    code, out = cli("missions", "--store", store_address, "--json")
    assert code == 0 and out == {"items": [], "next": None}


def test_R5_cli_recover_of_a_terminal_run_takes_nothing_over_and_says_so(
    populated: dict[str, Any], cli: Callable[..., tuple[int, Any]]
) -> None:
    """Broken: recovering a completed run prints "recovered as segment s10" and exits 0
    although the epoch did not move and the segment owns nothing."""
    config = charter.EngineConfig.from_file(populated["dir"] / "charter.toml")
    with charter.Engine.open(config=config) as engine:
        ops = engine.authenticate(populated["ops"])
        engine.stop_run(populated["run"], by=ops)
        engine.coordinator.resolve(
            populated["unknown"], by=ops, outcome="written_off", evidence="no answer"
        )
        assert engine.run(populated["run"]).status.terminal
    before = _snapshot(populated)
    store = ["--store", populated["store"]]
    code, out = cli("recover", populated["run"], "--segment", "s10", *store, "--json")
    assert code == 1
    error = out["error"]
    assert error["code"] == "run_terminal" and error["taken_over"] is False
    assert (error["run_id"], error["status"], error["epoch"]) == (populated["run"], "stopped", 1)
    code, text = cli("recover", populated["run"], "--segment", "s11", *store)
    assert code == 1 and "nothing was taken over" in text and "recovered as" not in text
    assert _snapshot(populated) == before


#: Bad paging values: each a usage error (exit 2) before the store is read.
BAD_PAGING = {
    "limit zero": ["--limit", "0"],
    "limit negative": ["--limit", "-1"],
    "limit not a number": ["--limit", "ten"],
    "limit above the largest page": ["--limit", "1001"],
    "cursor not a cursor": ["--after", "nonsense"],
    "cursor of another listing": ["--after", "1700000000000000:run_0123456789abcdefghjkmnpqrs"],
    "cursor position out of range": ["--after", f"{2**63}:att_0123456789abcdefghjkmnpqrs"],
}


@pytest.mark.parametrize("bad", list(BAD_PAGING), ids=list(BAD_PAGING))
def test_cli_bad_paging_values_are_usage_errors(
    populated: dict[str, Any], cli: Callable[..., tuple[int, Any]], bad: str
) -> None:
    store = ["--store", populated["store"]]
    code, out = cli("attempts", *BAD_PAGING[bad], *store, "--json")
    assert code == 2 and out["error"]["code"] == "usage_error", out
    code, text = cli("attempts", *BAD_PAGING[bad], *store)
    assert code == 2 and text.startswith("error: ") and len(text.strip().splitlines()) == 1


class Listing:
    """One listing command: how to add one row of it, and its rows in the store's order."""

    def __init__(
        self, engine: charter.Engine, who: Any, mission: str, adapter: RecordingAdapter
    ) -> None:
        self.engine, self.who, self.mission, self.adapter = engine, who, mission, adapter
        self.n = 0
        self.gated = engine.create_mission(
            default_contract(approvals={"required": ["recorder.write"], "ttl_seconds": 60}),
            by=who.alice,
        )
        self.run = engine.start_run(mission, by=who.agent, segment_id="seg-0")

    def add(self, listing: str) -> None:
        self.n += 1
        if listing == "missions":
            self.engine.create_mission(default_contract(), by=self.who.alice)
        elif listing == "runs":
            self.engine.start_run(self.mission, by=self.who.agent, segment_id=f"s{self.n}")
        elif listing == "attempts":
            self.run.perform(self.adapter, "read", {"n": self.n}, effect_key=f"k{self.n}")
        elif listing == "approvals":
            ex = self.engine.start_run(self.gated, by=self.who.agent, segment_id=f"s{self.n}")
            with pytest.raises(charter.ApprovalRequired):
                ex.perform(self.adapter, "write", {"n": self.n}, effect_key="w")
        else:  # an overrun opens an incident; closed, so the mission admits again
            self.adapter.script["write"] = _overrun
            self.run.perform(self.adapter, "write", {"n": self.n}, effect_key=f"o{self.n}")
            for incident in self.engine.incidents(self.mission, open_only=True):
                self.engine.close_incident(incident["id"], by=self.who.alice, note="seen")

    def ids(self, listing: str) -> list[str]:
        rows: list[Any] = {
            "missions": self.engine.missions,
            "runs": self.engine.runs,
            "attempts": self.engine.attempts,
            "approvals": self.engine.approvals,
            "incidents": lambda: self.engine.incidents(self.mission),
        }[listing]()
        return [r["id"] if isinstance(r, dict) else r.id for r in rows]

    def command(self, listing: str) -> list[str]:
        return [listing, self.mission] if listing == "incidents" else [listing]


def _overrun(send: Any) -> Any:
    return charter.Outcome.succeeded(
        {}, cost={"usd": 9_000, "calls": 1}, receipt={"id": send.attempt_id}, price_source="x"
    )


LISTINGS = ["missions", "runs", "attempts", "approvals", "incidents"]


@pytest.fixture
def rows(engine: charter.Engine, who: Any, mission: str, adapter: RecordingAdapter) -> Listing:
    return Listing(engine, who, mission, adapter)


@pytest.mark.parametrize("listing", LISTINGS)
def test_cli_listing_pages_each_row_once_in_a_stable_order_while_rows_are_added(
    rows: Listing, store_address: str, cli: Callable[..., tuple[int, Any]], listing: str
) -> None:
    """Broken: a page is a slice of every row (OFFSET or a list cut in Python), so rows
    added between pages are seen twice or push others out, or the order is not stable."""
    for _ in range(5):
        rows.add(listing)
    existing = rows.ids(listing)
    seen: list[str] = []
    after: list[str] = []
    for _page in range(20):
        code, page = cli(
            *rows.command(listing), "--store", store_address, "--limit", "2", *after, "--json"
        )
        assert code == 0, page
        assert len(page["items"]) <= 2
        seen += [r["id"] for r in page["items"]]
        if page["next"] is None:
            break
        after = ["--after", page["next"]]
        rows.add(listing)  # a row written between two pages
    else:
        pytest.fail("paging did not end")
    assert len(seen) == len(set(seen))  # nothing twice
    assert set(existing) <= set(seen)  # nothing that was there is skipped
    assert [i for i in rows.ids(listing) if i in seen] == seen  # in the store's order


def test_cli_listing_reads_one_page_from_the_store_not_every_row(
    rows: Listing,
    store_address: str,
    cli: Callable[..., tuple[int, Any]],
    monkeypatch: pytest.MonkeyPatch,
) -> None:
    """Broken: a page cut from a full list; memory then grows with the store."""
    for _ in range(30):
        rows.add("attempts")
    fetched: list[int] = []
    real = Tx.all

    def counting(tx: Tx, sql: str, *params: Any) -> Any:
        found = real(tx, sql, *params)
        fetched.append(len(found))
        return found

    monkeypatch.setattr(Tx, "all", counting)
    code, page = cli("attempts", "--store", store_address, "--limit", "5", "--json")
    assert code == 0 and len(page["items"]) == 5 and page["next"]
    assert fetched and max(fetched) <= 6


def test_cli_listing_shows_one_page_by_default_and_how_to_get_the_next(
    engine: charter.Engine,
    who: Any,
    mission: str,
    store_address: str,
    cli: Callable[..., tuple[int, Any]],
) -> None:
    for n in range(51):
        engine.start_run(mission, by=who.agent, segment_id=f"s{n}")
    code, page = cli("runs", "--store", store_address, "--json")
    assert code == 0 and len(page["items"]) == 50 and page["next"]
    code, text = cli("runs", "--store", store_address)
    lines = text.strip().splitlines()
    assert code == 0 and len(lines) == 1 + 50 + 1  # header, a page, how to go on
    assert f"--after {page['next']}" in lines[-1]
    code, rest = cli("runs", "--store", store_address, "--after", page["next"], "--json")
    assert code == 0 and rest["next"] is None
    assert [r["id"] for r in page["items"] + rest["items"]] == [r.id for r in engine.runs()]


def _codes(error: type[charter.CharterError]) -> set[str]:
    """The codes of ``error`` and of every Charter error derived from it."""
    subs = [sub for sub in error.__subclasses__() if sub.__module__.startswith("charter")]
    return {error.code}.union(*(_codes(sub) for sub in subs))


def test_cli_every_error_code_and_exit_status_is_documented() -> None:
    """An adapter author or operator scripting the CLI finds every ``code`` it can print."""
    page = (HERE.parent / "docs" / "cli.md").read_text()
    codes = _codes(charter.CharterError) | set(cli_mod.SIGNAL_CODES.values())
    codes.add(cli_mod.UNEXPECTED)
    undocumented = sorted(c for c in codes if f"| `{c}` |" not in page)
    assert undocumented == []
    for status in ("0", "1", "2", str(cli_mod.INTERRUPTED), str(cli_mod.PIPE_CLOSED)):
        assert f"| {status} |" in page


def test_cli_every_option_has_help() -> None:
    parser = cli_mod._parser()
    sub = next(a for a in parser._actions if a.dest == "command")
    parsers = {"charter": parser, **sub.choices}  # type: ignore[attr-defined]
    for name, p in parsers.items():
        for action in p._actions:
            assert action.help, f"{name} {action.option_strings or action.dest} has no help"


@pytest.mark.parametrize(
    "page",
    [{"limit": 0}, {"limit": -1}, {"limit": True}, {"after": (-1, "att_x")}, {"after": (1, "")}],
    ids=["limit 0", "limit -1", "limit True", "negative position", "position without id"],
)
def test_engine_listing_refuses_a_bad_page_with_a_usage_error(
    engine: charter.Engine, mission: str, page: dict[str, Any]
) -> None:
    """Broken: ``LIMIT -1`` reads every row on SQLite (and fails on PostgreSQL)."""
    with pytest.raises(charter.CharterError) as refused:
        engine.attempts(mission_id=mission, **page)
    assert refused.value.code == "usage_error"


# -- N6: a node that raises; every error one line; a closed pipe --------------------------

START = """
import sys, charter
import _cli_mission as m
config = charter.EngineConfig.from_file(sys.argv[1])
with charter.Engine.open(config=config) as engine:
    agent = engine.authenticate(sys.argv[2])
    ops = engine.authenticate(sys.argv[3])
    mission = engine.create_mission({
        "objective": "pay the month's invoices",
        "principals": {"agent": {"run": ["mail.*"]}, "ops": ["resolve", "run", "stop", "approve"]},
        "allowance": {"calls": 10},
    }, by=ops)
    ex = engine.start_run(mission, by=agent, segment_id="seg-1", plan=getattr(m, sys.argv[4]))
    print(ex.run_id, flush=True)
"""


def start_run(setup: dict[str, Any], plan: str) -> str:
    """A run of ``_cli_mission.<plan>``, started (not executed) by another process."""
    config = str(setup["dir"] / "charter.toml")
    done = subprocess.run(
        [sys.executable, "-c", START, config, setup["agent"], setup["ops"], plan],
        cwd=setup["dir"],
        env=setup["env"],
        capture_output=True,
        text=True,
        timeout=60,
        check=True,
    )
    return done.stdout.strip()


def charter_raw(
    setup: dict[str, Any], *args: str, env: dict[str, str] | None = None
) -> subprocess.CompletedProcess[str]:
    """``charter ARGS`` as the operator's shell runs it, acting as ops."""
    return subprocess.run(
        [sys.executable, "-m", "charter", *args],
        cwd=setup["dir"],
        env={**setup["env"], "CHARTER_CREDENTIAL": setup["ops"], **(env or {})},
        capture_output=True,
        text=True,
        timeout=60,
    )


def _outbox(setup: dict[str, Any]) -> list[dict[str, Any]]:
    lines = (setup["dir"] / "outbox.jsonl").read_text().splitlines()
    return [json.loads(line) for line in lines]


def test_N6_cli_resume_of_a_node_that_raises_leaves_the_run_resumable_and_pays_each_once(
    setup: dict[str, Any],
) -> None:
    """The operator's shell lacks a variable the node reads after four payments.
    Broken: ``charter resume`` printed a traceback and the run ended ``failed`` for
    good (node retries default to 0), with four invoices paid and the rest never."""
    setup["env"].pop(_cli_mission.LEDGER_ACCOUNT, None)
    run_id = start_run(setup, "payments")

    done = charter_raw(setup, "resume", run_id, "--segment", "seg-1")
    assert done.returncode == 1 and done.stdout == ""
    [line] = done.stderr.splitlines()  # one line, no traceback
    assert line.startswith("error: node pay_invoices raised KeyError: ")
    assert _cli_mission.LEDGER_ACCOUNT in line and "resume" in line
    first_keys = [m["key"] for m in _outbox(setup)]
    assert [m["request"]["invoice"] for m in _outbox(setup)] == [0, 1, 2, 3]

    done = charter_raw(setup, "resume", run_id, "--segment", "seg-1", "--json")
    assert done.returncode == 1 and done.stderr == ""
    [line] = done.stdout.splitlines()  # one JSON object
    error = json.loads(line)["error"]
    assert (error["code"], error["run_id"]) == ("blocked", run_id)
    assert "KeyError" in error["message"]
    assert [m["key"] for m in _outbox(setup)] == first_keys  # replayed, never re-sent

    code, shown = charter_cli(setup, "show", run_id)
    assert code == 0 and shown["status"] == "needs_intervention"
    assert f"KeyError: '{_cli_mission.LEDGER_ACCOUNT}'" in shown["status_reason"]
    [node] = shown["graph"]
    assert (node["node_id"], node["status"]) == ("pay_invoices", "blocked")
    stored = node["error"]
    assert stored.startswith(f"KeyError: '{_cli_mission.LEDGER_ACCOUNT}'")
    assert "Traceback, last frames" in stored and "_cli_mission.py" in stored
    assert "in pay_invoices" in stored and "os.environ[LEDGER_ACCOUNT]" in stored
    assert [n["error"] for n in shown["nodes"]] == [stored]  # the recovery state's view
    text = charter_raw(setup, "show", run_id).stdout
    assert "[?] pay_invoices  blocked" in text and "in pay_invoices" in text

    # The operator fixes the shell; a new segment takes the run over by itself (no
    # `recover`) once the lease is gone, and the run goes on where it stopped.
    time.sleep(1.1)
    fixed = {_cli_mission.LEDGER_ACCOUNT: "acct-7"}
    done = charter_raw(setup, "resume", run_id, "--segment", "seg-2", "--json", env=fixed)
    assert done.returncode == 0, done.stderr
    resumed = json.loads(done.stdout)
    assert (resumed["status"], resumed["epoch"], resumed["result"]) == (
        "completed",
        2,
        {"paid": 5},
    )
    sent = _outbox(setup)
    assert [m["request"]["invoice"] for m in sent] == [0, 1, 2, 3, 4]  # each invoice once
    assert [m["key"] for m in sent[:4]] == first_keys
    assert len({m["key"] for m in sent}) == 5
    code, attempts = charter_cli(setup, "attempts", "--run", run_id)
    assert code == 0 and len(attempts["items"]) == 5
    assert {a["status"] for a in attempts["items"]} == {"succeeded"}


def test_N6_cli_resume_of_a_waiting_node_is_one_error_line(setup: dict[str, Any]) -> None:
    """Broken: a node waiting for an answer ended ``charter resume`` in a KeyError
    traceback, the CLI knowing only the exact signal classes, not their kinds."""
    run_id = start_run(setup, "asking")
    done = charter_raw(setup, "resume", run_id, "--segment", "seg-1", "--json")
    assert done.returncode == 1 and done.stderr == ""
    error = json.loads(done.stdout)["error"]
    assert (error["code"], error["run_id"]) == ("blocked", run_id)
    assert error["wait_id"].startswith("wt")
    done = charter_raw(setup, "resume", run_id, "--segment", "seg-1")
    assert done.returncode == 1 and len(done.stderr.splitlines()) == 1
    assert done.stderr.startswith("error: node ask_budget waits for input 'budget'")


def test_cli_an_unexpected_error_is_one_line_without_a_traceback_and_changes_nothing(
    populated: dict[str, Any],
) -> None:
    """Code Charter loads (here an adapter factory) fails with no Charter error.
    Broken: a Python traceback, and under ``--json`` no JSON at all."""
    toml = populated["dir"] / "charter.toml"
    toml.write_text(toml.read_text().replace("_cli_mission:make_mail", "_cli_mission:broken_mail"))
    before = _snapshot(populated)
    code, out = charter_cli(populated, "reconcile", populated["unknown"])
    assert code == 1 and out["error"]["code"] == "unexpected_error"
    assert out["error"]["type"] == "RuntimeError"
    assert "MAIL_TOKEN is not set" in out["error"]["message"]
    done = charter_raw(populated, "reconcile", populated["unknown"])
    assert done.returncode == 1 and done.stdout == ""
    [line] = done.stderr.splitlines()
    assert line.startswith("error: RuntimeError: MAIL_TOKEN is not set")
    assert _snapshot(populated) == before


@pytest.mark.parametrize(
    "args",
    [
        ["runs"],
        ["runs", "--json"],
        ["missions", "--limit", "5"],
        ["audit", "verify"],
        ["show", "run_nope", "--json"],  # an error, to the closed output
        ["--help"],
        ["runs", "--help"],
    ],
    ids=" ".join,
)
def test_cli_output_to_a_closed_pipe_ends_quietly(setup: dict[str, Any], args: list[str]) -> None:
    """``charter runs | head -1``: the reader has gone before the command writes.
    Broken: a BrokenPipeError traceback on standard error. (``--help`` is argparse's,
    which drops what it cannot write and exits 0.)"""
    charter.Engine.open(str(setup["dir"] / "charter.db")).close()  # an empty store
    read, write = os.pipe()
    os.close(read)  # the reader is gone before anything is written: a sure EPIPE
    try:
        child = subprocess.Popen(
            [sys.executable, "-m", "charter", *args],
            cwd=setup["dir"],
            env=setup["env"],
            stdout=write,
            stderr=subprocess.PIPE,
            text=True,
        )
    finally:
        os.close(write)
    _, err = child.communicate(timeout=60)
    assert err == ""
    assert child.returncode == (0 if "--help" in args else cli_mod.PIPE_CLOSED)


def test_cli_piped_into_head_prints_its_first_line_and_nothing_on_stderr(
    setup: dict[str, Any],
) -> None:
    """The shell pipeline itself, with more rows than a pipe holds, so that the
    command is still writing when ``head`` leaves."""
    config = charter.EngineConfig.from_file(setup["dir"] / "charter.toml")
    with charter.Engine.open(str(setup["dir"] / "charter.db"), config=config) as engine:
        ops = engine.authenticate(setup["ops"])
        mission = engine.create_mission(
            {"objective": "many", "principals": {"ops": ["run"]}, "allowance": {"calls": 1}},
            by=ops,
        )
        for n in range(1000):  # about 93 kB of table: more than the pipe's 64 kB
            engine.start_run(mission, by=ops, segment_id=f"s{n}")
    done = subprocess.run(
        ["bash", "-c", f"{sys.executable} -m charter runs --limit 1000 | head -1"],
        cwd=setup["dir"],
        env=setup["env"],
        capture_output=True,
        text=True,
        timeout=120,
    )
    assert done.returncode == 0
    assert done.stdout.split() == ["ID", "MISSION_ID", "STATUS", "EPOCH", "OWNER_SEGMENT"]
    assert done.stderr == ""


def test_cli_text_shows_amounts_in_the_contracts_units_and_json_keeps_the_integers(
    engine: charter.Engine,
    who: Any,
    adapter: RecordingAdapter,
    store_address: str,
    cli: Callable[..., tuple[int, Any]],
) -> None:
    """Broken: ``attempts``, ``ledger`` and ``show`` printed ``{'usd': 1250}`` and
    ``6400`` where the contract says usd is cents of a dollar ("12.50 USD");
    an overrun's negative balance shows its sign; ``--json`` keeps integers."""
    mission = engine.create_mission(
        default_contract(
            allowance={"usd": 12_000, "calls": 100}, units={"usd": {"scale": 2, "name": "USD"}}
        ),
        by=who.alice,
    )
    ex = engine.start_run(mission, by=who.agent, segment_id="seg-1")
    ex.perform(adapter, "read", {"n": 1}, effect_key="r")  # 10.00 USD and a call, settled
    lost = RecordingAdapter(
        name="recorder",
        operations=adapter.operations,
        costs=adapter.costs,
        script={"write": _raise},
    )
    unknown = ex.perform(lost, "write", {"n": 3}, effect_key="u")  # 50.00 USD held
    adapter.script["write"] = _overrun  # 90.00 USD spent against a 50.00 USD hold
    ex.perform(adapter, "write", {"n": 2}, effect_key="o")
    store = ["--store", store_address]

    code, text = cli("attempts", "--run", ex.run_id, *store)
    assert code == 0, text
    assert "1 calls, 10.00 USD" in text and "1 calls, 90.00 USD" in text
    assert "{" not in text  # no mapping printed raw
    code, page = cli("attempts", "--run", ex.run_id, *store, "--json")
    assert sorted(a["estimate"]["usd"] for a in page["items"]) == [1_000, 5_000, 5_000]
    assert sorted(a["actual"]["usd"] for a in page["items"] if a["actual"]) == [1_000, 9_000]

    code, text = cli("ledger", mission, *store)
    assert code == 0, text
    usd = next(line for line in text.splitlines() if line.startswith("usd "))
    # limit, available (below zero: the overrun), held, spent, overrun
    assert " ".join(usd.split()[1:]) == "120.00 USD -30.00 USD 50.00 USD 100.00 USD 40.00 USD"
    calls = next(line for line in text.splitlines() if line.startswith("calls "))
    assert calls.split()[1:3] == ["100", "calls"]  # no units entry: smallest steps
    code, data = cli("ledger", mission, *store, "--json")
    assert {b["unit"]: b["available"] for b in data["balances"]}["usd"] == -3_000

    code, text = cli("show", ex.run_id, *store)
    held = next(line for line in text.splitlines() if line.startswith(unknown.id))
    assert code == 0 and "HOLD" in text and "1 calls, 50.00 USD" in held, text
    code, state = cli("show", ex.run_id, *store, "--json")
    assert state["attempts"][0]["estimate"] == {"calls": 1, "usd": 5_000}


@pytest.mark.parametrize("command", ["confirm", "resolve", "resume"])
def test_cli_help_of_a_decision_names_the_credential_it_acts_as(
    command: str, capsys: pytest.CaptureFixture[str]
) -> None:
    """Broken: ``confirm``, ``resolve`` and ``resume`` act as whoever
    CHARTER_CREDENTIAL names, and their ``--help`` did not say so."""
    with pytest.raises(SystemExit) as done:
        cli_mod.main([command, "--help"])
    shown = capsys.readouterr().out
    assert done.value.code == 0
    assert re.search(r"\bCHARTER_CREDENTIAL\b(?!_)", shown), shown
    assert "CHARTER_CREDENTIAL_FILE" in shown


def test_cli_resolve_and_raise_limit_say_amounts_in_the_contracts_units(
    setup: dict[str, Any], monkeypatch: pytest.MonkeyPatch
) -> None:
    """Broken: ``resolve`` answered ``at {'calls': 1, 'usd': 4550}`` and
    ``raise-limit`` ``usd limit 20000 ...; 15450 available`` where the contract
    says usd is cents ("45.50 USD")."""
    monkeypatch.setenv("CHARTER_TEST_OUTBOX", setup["env"]["CHARTER_TEST_OUTBOX"])
    config = charter.EngineConfig.from_file(setup["dir"] / "charter.toml")
    with charter.Engine.open(config=config) as engine:
        ops, agent = engine.authenticate(setup["ops"]), engine.authenticate(setup["agent"])
        mission = engine.create_mission(
            {
                "objective": "pay",
                "principals": {"agent": {"run": ["mail.*"]}, "ops": ["resolve", "raise_limit"]},
                "allowance": {"usd": 10_000, "calls": 10},
                "units": {"usd": {"scale": 2, "name": "USD"}},
            },
            by=ops,
        )
        ex = engine.start_run(mission, by=agent, segment_id="seg-1")
        lost = RecordingAdapter(
            name="mail",
            operations=_cli_mission.make_mail().operations,
            costs={"send": {"usd": 5_000, "calls": 1}},
            script={"send": _raise},
        )
        unknown = ex.perform(lost, "send", {"n": 1}, effect_key="b")
    time.sleep(1.2)  # the segment's one-second lease runs out: a person may settle
    cost = ["--cost", "usd=4550", "--cost", "calls=1"]
    done = charter_raw(setup, "resolve", unknown.id, "--succeeded", *cost, "--evidence", "bank")
    assert done.returncode == 0 and "at 1 calls, 45.50 USD" in done.stdout, done
    done = charter_raw(setup, "raise-limit", mission, "usd=20000")
    assert done.returncode == 0, done
    assert "usd limit 200.00 USD" in done.stdout and "154.50 USD available" in done.stdout
