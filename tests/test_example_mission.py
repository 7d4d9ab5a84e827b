"""The example graph mission (examples/survey_mission.py), across five processes (N1-N3, W1, W2).

Each step is a fresh process: it starts and waits for a person's answer; it
resumes after the answer and is SIGKILLed in the middle of the fan-out (the
second survey payment settled, the others in flight); recovery takes the dead
owner's run over at once and settles what it left; a fresh process resumes and
runs into the cooling-off timer; another resumes after it and waits for the
publisher's approval; the last completes. Checked against the sandbox: each
survey and the publication paid once, the ledger equal to what it took; the
report artifact verifies; the plan's extension is one audited version.
"""

from __future__ import annotations

import json
import os
import signal
import subprocess
import sys
from collections import Counter
from collections.abc import Iterator
from dataclasses import dataclass
from pathlib import Path
from typing import Any

import pytest

import charter
from _examples import run_step
from charter import AttemptStatus
from charter.cli.demo import payments_adapter
from charter.sandbox import Sandbox
from charter.testing import credential
from conftest import Principals

ROOT = Path(__file__).resolve().parents[1]
EXAMPLE = ROOT / "examples" / "survey_mission.py"
sys.path.insert(0, str(EXAMPLE.parent))
import survey_mission  # noqa: E402 - the example, importable once examples/ is on the path


def step(cfg: dict[str, Any], tmp: Path, **how: Any) -> tuple[int, list[dict[str, Any]]]:
    return run_step(EXAMPLE, cfg, tmp, **how)


class Cli:
    """The ``charter`` command on the test's store, as a principal when asked."""

    def __init__(self, store: str, creds: tuple[dict[str, str], dict[str, str]], tmp: Path):
        digests = "\n".join(f'{n} = "{d}"' for n, d in creds[1].items())
        self.config = tmp / "charter.toml"
        self.config.write_text(
            f'store = "{store}"\nartifacts = "{tmp / "artifacts"}"\n'
            f'workspace = "{tmp / "work"}"\n[credentials]\n{digests}\n'
        )
        self.creds = creds

    def __call__(self, *args: str, who: str | None = None, ok: bool = True) -> Any:
        env = {
            **os.environ,
            "CHARTER_CONFIG": str(self.config),
            "PYTHONPATH": os.pathsep.join(sys.path),
        }
        if who is not None:
            env["CHARTER_CREDENTIAL"] = self.creds[0][who]
        done = subprocess.run(
            [sys.executable, "-m", "charter", *args, "--json"],
            capture_output=True,
            text=True,
            env=env,
            timeout=60,
            check=False,
        )
        assert (done.returncode == 0) is ok, done.stdout + done.stderr
        return json.loads(done.stdout)


@dataclass
class Survey:
    """The example's mission on the test's store, the sandbox it pays through, and
    the configuration each step's process is given."""

    engine: charter.Engine
    who: Principals
    box: Sandbox
    mission: str
    creds: tuple[dict[str, str], dict[str, str]]
    cfg: dict[str, Any]


@pytest.fixture
def survey(store_address: str, tmp_path: Path) -> Iterator[Survey]:
    pairs = {name: credential(name) for name in ("agent", "ops")}
    creds = ({n: c for n, (c, _) in pairs.items()}, {n: d for n, (_, d) in pairs.items()})
    config = charter.EngineConfig(
        credentials=creds[1],
        artifacts=str(tmp_path / "artifacts"),
        workspace=str(tmp_path / "work"),
    )
    with (
        charter.Engine.open(store_address, config=config) as engine,
        Sandbox(tmp_path / "sandbox.db") as box,
    ):
        who = Principals(*creds, engine)
        mission = engine.create_mission(survey_mission.CONTRACT, by=who.ops)
        cfg = {
            "store": store_address,
            "digests": creds[1],
            "credential": creds[0]["agent"],
            "url": box.url,
            "mission": mission,
            "artifacts": config.artifacts,
            "workspace": config.workspace,
        }
        yield Survey(engine, who, box, mission, creds, cfg)


@pytest.mark.crash
def test_N1_N2_N3_W1_the_example_mission_survives_a_kill_in_its_fan_out(
    survey: Survey, store_address: str, tmp_path: Path
) -> None:
    engine, who, box, mission = survey.engine, survey.who, survey.box, survey.mission
    creds, cfg = survey.creds, survey.cfg
    # 1. A fresh process starts the run; the first node asks a person.
    _, out = step(cfg, tmp_path, step="start")
    run_id = out[0]["run_id"]
    assert out[-1]["ended"] == "blocked"
    cli = Cli(store_address, creds, tmp_path)
    refused = cli("answer", run_id, "budget", "three", who="ops", ok=False)["error"]
    assert refused["code"] == "invalid_wait"
    assert [w.status.value for w in engine.waits(run_id)] == ["pending"]  # nothing changed
    assert cli("answer", run_id, "budget", "3", who="ops")["status"] == "satisfied"

    # 2. Resumed after the answer, killed once the second survey settled.
    code, _ = step(
        cfg,
        tmp_path,
        step="resume",
        run=run_id,
        segment="seg-1",
        kill_at="settlement.after",
        nth=2,
    )
    assert code == -signal.SIGKILL
    surveys = [
        a for a in engine.attempts(run_id=run_id) if a.request["reference"].startswith("survey-")
    ]
    assert sum(a.status is AttemptStatus.SUCCEEDED for a in surveys) >= 2

    # 3. The dead owner is taken over at once; what it left is settled by lookup.
    _, unresolved = engine.coordinator.recover(run_id, "seg-2")
    with payments_adapter(box.url) as payments:
        for attempt_id in unresolved:
            if engine.get_attempt(attempt_id).status is AttemptStatus.UNKNOWN:
                assert engine.coordinator.reconcile(attempt_id, payments, by=who.ops).conclusive
                engine.coordinator.confirm(attempt_id, by=who.ops)

    # 4. A fresh process runs the rest of the fan-out, the merge, and meets the timer.
    _, out = step(cfg, tmp_path, step="resume", run=run_id, segment="seg-2")
    assert out[-1]["ended"] == "blocked", out
    assert engine.run(run_id).status is charter.RunStatus.WAITING
    due = cli("wait", "--run", run_id, "--timeout", "30")["due"]  # the timer, by the store
    assert [(d["run_id"], d["ready"]) for d in due] == [(run_id, True)]

    # 5. After the timer: the publication waits for its approval.
    _, out = step(cfg, tmp_path, step="resume", run=run_id, segment="seg-2")
    assert out[-1]["ended"] == "blocked", out
    [approval] = engine.approvals(run_id=run_id, pending=True)
    assert approval.scope == "payments.pay_new_payee"
    engine.approve(approval.id, by=who.ops)

    # 6. The last process completes the mission.
    _, out = step(cfg, tmp_path, step="resume", run=run_id, segment="seg-2")
    assert out[-1]["ended"] == "completed", out

    assert engine.run(run_id).status is charter.RunStatus.COMPLETED
    keys = {a.idempotency_key for a in engine.attempts(run_id=run_id)}
    paid = [p for p in box.payments() if p["idempotency_key"] in keys]
    assert Counter(p["reference"] for p in paid) == {
        "survey-east": 1,
        "survey-north": 1,
        "survey-south": 1,
        "publish": 1,
    }
    assert engine.balances(mission)["usd"].spent == sum(p["amount"] for p in paid)
    assert engine.check_ledger(mission) == []
    assert [a["ok"] for a in cli("artifacts", run_id, "--verify")["items"]] == [True]
    assert [v["version"] for v in cli("plan", run_id)["versions"]] == [2]
    fetched = tmp_path / "fetched.txt"
    cli("artifacts", run_id, "--fetch", "report.txt", "-o", str(fetched), who="ops")
    assert fetched.read_text().count("payment") == 0 and len(fetched.read_text().splitlines()) == 3
    shown = {n["node_id"]: n for n in cli("show", run_id)["graph"]}
    assert shown["survey-north"]["after"] == ["plan_surveys"]
    assert shown["publish"]["after"] == ["merge"]
    assert {n["status"] for n in shown.values()} == {"completed"}
    nodes = {n["node_id"] for n in engine.coordinator.state(run_id).nodes}
    assert nodes == {
        "regions",
        "plan_surveys",
        "survey-east",
        "survey-north",
        "survey-south",
        "merge",
        "publish",
    }
    assert all(v.ok for v in engine.verify_audit(mission))


@pytest.mark.crash
def test_N3_a_plan_change_replayed_after_a_crash_is_found_not_made_again(
    survey: Survey, store_address: str, tmp_path: Path
) -> None:
    """Killed once ``plan_surveys`` extended the plan but before its completion
    committed: the fresh process re-executes the node, whose ``extend`` finds
    the recorded change (one version, nothing new) and the run goes on."""
    engine, who, box, cfg = survey.engine, survey.who, survey.box, survey.cfg
    _, out = step(cfg, tmp_path, step="start")
    run_id = out[0]["run_id"]
    engine.answer(run_id, "budget", 2, by=who.ops)
    # regions completes first; the second completion about to commit is plan_surveys'.
    code, _ = step(
        cfg,
        tmp_path,
        step="resume",
        run=run_id,
        segment="seg-1",
        kill_at="node.completed.before",
        nth=2,
    )
    assert code == -signal.SIGKILL
    assert [v["version"] for v in engine.plan_versions(run_id)] == [2]

    engine.coordinator.recover(run_id, "seg-2")
    _, out = step(cfg, tmp_path, step="resume", run=run_id, segment="seg-2")

    assert out[-1]["ended"] == "blocked", out  # on to the cooling-off timer
    assert [v["version"] for v in engine.plan_versions(run_id)] == [2]
    [execution] = [n for n in engine.node_executions(run_id) if n.node_id == "plan_surveys"]
    # run again after the crash, and its change found, not made again
    assert (execution.status, execution.crashes) == ("completed", 1)
    keys = {a.idempotency_key for a in engine.attempts(run_id=run_id)}
    paid = Counter(p["reference"] for p in box.payments() if p["idempotency_key"] in keys)
    assert paid == {"survey-east": 1, "survey-north": 1}
