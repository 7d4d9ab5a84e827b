"""L10 with workers: ``charter.Worker(..., escrow=...)`` leases a slice of each
carried run's mission and executes the run's plan in its lane, node threads
included; L0-L2 and S1 hold at every instant, every invoice is paid once, the
slices come back when the workers stop, and a worker killed while it holds a
slice loses no hold.

Each test asserts on what the store recorded (balances, slices, which slice
each hold was taken from, the chains) and on what the payments sandbox took.
"""

from __future__ import annotations

import json
import os
import subprocess
import sys
import threading
import time
from collections.abc import Callable
from pathlib import Path
from typing import Any

import pytest

import _worker_plans as plans
import charter
from charter.adapters.http import HttpAdapter
from charter.errors import UsageError
from charter.runs.model import RunStatus
from charter.sandbox import Sandbox
from charter.workers.escrow import slices, sweep
from conftest import Principals, payments_contract

HERE = Path(__file__).resolve().parent
MakeEngine = Callable[..., charter.Engine]


@pytest.fixture(autouse=True)
def _plans_adapters() -> Any:
    """The plans' own adapters (built in the node, as in a worker process) are closed."""
    yield
    plans.close()


def _pay(box: Sandbox, *invoices: str, amount: int = 100) -> dict[str, Any]:
    return {"sandbox": box.url, "amount": amount, "invoices": list(invoices)}


def _paid(box: Sandbox) -> list[str]:
    return [p["reference"] for p in box.payments()]


def _held_in(raw: Any) -> dict[str, str]:
    """Attempt -> the slice its hold was taken from, as stored."""
    return {r["attempt_id"]: r["slice_id"] for r in raw.rows("SELECT * FROM escrow_holds")}


def test_L10_K1_workers_with_escrow_carry_many_paying_runs_of_one_mission_once_each(
    make_engine: MakeEngine, creds: Any, box: Sandbox, payments: HttpAdapter, raw: Any
) -> None:
    engines = [
        make_engine(resume="automatic", evidence_settles="auto", lease_seconds=30.0)
        for _ in range(2)
    ]
    who = Principals(creds[0], creds[1], engines[0])
    mission = engines[0].create_mission(payments_contract(), by=who.alice)
    invoices = [[f"r{i}a", f"r{i}b"] for i in range(10)]
    runs = [
        engines[0].submit(mission, by=who.agent, plan=plans.PAY, input=_pay(box, *pair))
        for pair in invoices
    ]
    workers = [
        charter.Worker(
            eng,
            plans.PLANS,
            adapters=[payments],
            concurrency=2,
            poll_seconds=0.1,
            name=f"w{n}",
            escrow={"usd_cents": 700},
        )
        for n, eng in enumerate(engines)
    ]
    checks: list[list[str]] = []
    threads = [threading.Thread(target=w.run, kwargs={"install_signals": False}) for w in workers]
    for t in threads:
        t.start()
    try:
        deadline = time.monotonic() + 60
        while any(engines[0].run(r.id).status is not RunStatus.COMPLETED for r in runs):
            assert time.monotonic() < deadline, [engines[0].run(r.id).status for r in runs]
            checks.append(engines[0].check_ledger(mission))
            time.sleep(0.05)
        # Slices still open while the workers run: the mission holds them whole (L0).
        lent = slices(engines[0], mission)
        assert engines[0].check_ledger(mission) == []
    finally:
        for w in workers:
            w.stop()
        for t in threads:
            t.join(30)
    assert not any(t.is_alive() for t in threads)
    assert checks and all(c == [] for c in checks)
    assert sorted(_paid(box)) == sorted(i for pair in invoices for i in pair)
    attempts = engines[0].attempts(mission_id=mission)
    assert [a.status.value for a in attempts] == ["succeeded"] * 20
    # The plans' node threads admitted in the workers' lanes: holds taken from slices.
    held_in = _held_in(raw)
    assert lent and held_in and set(held_in.values()) <= {s["id"] for s in lent}
    assert {s["holder"] for s in lent} <= {"w0", "w1"}
    # Stopped: every slice is back, nothing held, every cent spent counted once.
    after = slices(engines[0], mission)
    assert after and {s["status"] for s in after} == {"returned"}
    usd = engines[0].balances(mission)["usd_cents"]
    assert (usd.held, usd.spent, usd.available) == (0, 2_000, 100_000 - 2_000)
    assert engines[0].check_ledger(mission) == []
    assert all(v.ok for v in engines[0].verify_audit())


def test_L10_a_worker_escrow_of_bad_amounts_is_refused(engine: charter.Engine) -> None:
    for amounts in ({"usd_cents": 0}, {}, {"usd_cents": 1.5}):
        with pytest.raises(UsageError):
            charter.Worker(engine, plans.PLANS, escrow=amounts)


_CHILD = r"""
import json, sys
import charter
import _worker_plans as plans
config = json.loads(sys.argv[1])
engine = charter.Engine.open(config["store"], config=charter.EngineConfig(
    credentials=config["digests"], lease_seconds=config["lease_seconds"],
    send_deadline_seconds=1, evidence_settles="auto", resume="automatic"))
worker = charter.Worker(engine, plans.PLANS, adapters=[plans.sandbox(config["sandbox"])],
    poll_seconds=0.1, name=config["name"], escrow=config["escrow"])
print(json.dumps({"started": config["name"]}), flush=True)
worker.run()
"""


def test_L10_L4_a_worker_killed_while_it_holds_a_slice_loses_no_hold(
    tmp_path: Path, creds: Any, box: Sandbox, payments: HttpAdapter
) -> None:
    """SIGKILL mid-payment, the slice open: L0-L2 hold with the slice still lent;
    it lapses after its lease and comes back whole, the dispatched payment's hold
    with it (L4); another worker reconciles the payment by lookup, and every
    invoice is paid once."""
    lease = 3.0
    store = str(tmp_path / "store.db")
    config = charter.EngineConfig(
        credentials=creds[1],
        resume="automatic",
        evidence_settles="auto",
        lease_seconds=lease,
        send_deadline_seconds=1,
    )
    child_config = {
        "store": store,
        "digests": creds[1],
        "sandbox": box.url,
        "lease_seconds": lease,
        "name": "doomed",
        "escrow": {"usd_cents": 1_000},
    }
    env = {**os.environ, "PYTHONPATH": os.pathsep.join([str(HERE), *sys.path])}
    with charter.Engine.open(store, config=config) as engine:
        who = Principals(creds[0], creds[1], engine)
        mission = engine.create_mission(payments_contract(), by=who.alice)
        box.fault("slow", seconds=30, reference="stuck")
        run = engine.submit(mission, by=who.agent, plan=plans.PAY, input=_pay(box, "stuck", "b"))
        child = subprocess.Popen(
            [sys.executable, "-c", _CHILD, json.dumps(child_config)],
            cwd=HERE,
            env=env,
            stdout=subprocess.DEVNULL,
        )
        try:
            deadline = time.monotonic() + 20
            while _paid(box) != ["stuck"]:  # applied; its answer is held back
                assert time.monotonic() < deadline and child.poll() is None
                time.sleep(0.02)
            child.kill()
            child.wait(10)
        finally:
            child.kill()
        [lent] = slices(engine, mission)
        assert (lent["status"], lent["holder"]) == ("open", "doomed")
        [stuck] = engine.attempts(run_id=run.id)
        assert stuck.status is charter.AttemptStatus.DISPATCHED
        assert lent["accounts"]["usd_cents"]["held"] == stuck.estimate["usd_cents"]
        usd = engine.balances(mission)["usd_cents"]
        assert (usd.held, usd.spent) == (1_000, 0)  # the whole grant, held by the mission
        assert engine.check_ledger(mission) == []
        # After its lease the slice lapses and comes back; the dispatched payment's
        # hold stays held, now the mission's (L4).
        time.sleep(lease + 0.5)
        assert sweep(engine, mission) == 1
        usd = engine.balances(mission)["usd_cents"]
        assert (usd.held, usd.spent) == (stuck.estimate["usd_cents"], 0)
        assert engine.check_ledger(mission) == []
        worker = charter.Worker(engine, plans.PLANS, adapters=[payments], poll_seconds=0.1)
        thread = threading.Thread(target=worker.run, kwargs={"install_signals": False})
        thread.start()
        try:
            deadline = time.monotonic() + 30
            while engine.run(run.id).status is not RunStatus.COMPLETED:
                assert time.monotonic() < deadline, engine.run(run.id)
                time.sleep(0.05)
        finally:
            worker.stop()
            thread.join(20)
        assert _paid(box) == ["stuck", "b"]
        assert [a.status.value for a in engine.attempts(run_id=run.id)] == ["succeeded"] * 2
        usd = engine.balances(mission)["usd_cents"]
        assert (usd.held, usd.spent) == (0, 200)
        assert {s["status"] for s in slices(engine, mission)} == {"returned"}
        assert engine.check_ledger(mission) == []
        assert all(v.ok for v in engine.verify_audit())


def _cli_setup(tmp_path: Path, creds: Any) -> dict[str, str]:
    digests = "".join(f'{name} = "{digest}"\n' for name, digest in creds[1].items())
    (tmp_path / "charter.toml").write_text(
        'store = "charter.db"\nlease_seconds = 5\nsend_deadline_seconds = 1\n'
        'resume = "automatic"\nevidence_settles = "auto"\n'
        f"[credentials]\n{digests}"
    )
    return {
        **os.environ,
        "PYTHONPATH": os.pathsep.join([str(HERE), *sys.path]),
        "CHARTER_CONFIG": str(tmp_path / "charter.toml"),
    }


def test_L10_K4_charter_worker_escrow_leases_slices_and_returns_them_on_sigterm(
    tmp_path: Path, creds: Any, box: Sandbox
) -> None:
    env = _cli_setup(tmp_path, creds)
    worker = ["-m", "charter", "worker", "--plan", "_worker_plans:PAY", "--poll", "0.1"]
    config = charter.EngineConfig(
        credentials=creds[1], lease_seconds=5, send_deadline_seconds=1, resume="automatic"
    )
    with charter.Engine.open(str(tmp_path / "charter.db"), config=config) as engine:
        who = Principals(creds[0], creds[1], engine)
        mission = engine.create_mission(payments_contract(), by=who.alice)
        for bad in ("usd_cents", "usd_cents=ten", "=5", "usd_cents=-5", "usd_cents=0"):
            refused = subprocess.run(
                [sys.executable, *worker, "--escrow", bad, "--json"],
                cwd=tmp_path,
                env=env,
                capture_output=True,
                text=True,
                timeout=60,
            )
            assert refused.returncode != 0, bad
            assert "escrow" in refused.stderr + refused.stdout, bad
        assert slices(engine, mission) == []  # refused before anything started
        runs = [
            engine.submit(mission, by=who.agent, plan=plans.PAY, input=_pay(box, f"c{i}"))
            for i in range(3)
        ]
        child = subprocess.Popen(
            [sys.executable, *worker, "--escrow", "usd_cents=500", "--name", "cli-w", "--json"],
            cwd=tmp_path,
            env=env,
            stdout=subprocess.PIPE,
            stderr=subprocess.PIPE,
            text=True,
        )
        try:
            deadline = time.monotonic() + 30
            while any(engine.run(r.id).status is not RunStatus.COMPLETED for r in runs):
                assert time.monotonic() < deadline and child.poll() is None
                time.sleep(0.05)
            [lent] = slices(engine, mission)
            assert (lent["status"], lent["holder"]) == ("open", "cli-w")
            child.send_signal(15)  # SIGTERM: stops well, every slice returned (K4)
            out, err = child.communicate(timeout=30)
        finally:
            child.kill()
        assert child.returncode == 0, err
        assert json.loads(out)["worker"] == "cli-w"
        [back] = slices(engine, mission)
        assert (back["status"], back["returned_why"]) == ("returned", "released")
        assert sorted(_paid(box)) == ["c0", "c1", "c2"]
        usd = engine.balances(mission)["usd_cents"]
        assert (usd.held, usd.spent) == (0, 300)
        assert engine.check_ledger(mission) == []
        assert all(v.ok for v in engine.verify_audit())
