"""The Charter side of the TypeScript SDK's tests: a store, its configuration and
the runs the tests recover, made through Charter's public Python API.

    python ts_fixture.py prepare DIR SANDBOX_URL [BUSY_SECONDS]  # store, config, mission: one JSON line
    python ts_fixture.py lost DIR [LEASE_SECONDS]  # a run whose payment is UNKNOWN: one JSON line
    python ts_fixture.py mission DIR CONTRACT_JSON  # an agents' mission, the contract's keys overridden

``prepare`` writes ``DIR/charter.db`` and ``DIR/charter.toml`` (the credentials'
digests, the payments adapter by reference; ``BUSY_SECONDS``, the store's busy
wait, shortened where a test holds the store's lock to see ``store_busy``) and
prints the mission, a second one whose payments need an approval, and each
principal's ``NAME:SECRET``.

``lost`` starts a run of :data:`week` that pays the week's invoices through the
payments sandbox, armed to apply the first payment and drop its answer: the
attempt is UNKNOWN, the run blocked, this process gone; what the tests recover
is real. Its owner's lease is ``LEASE_SECONDS`` (default 1): a test waits it
out, or finds it held. The server started over the same store imports this
module (``PYTHONPATH``) to build the adapter and the plan.
"""

from __future__ import annotations

import dataclasses
import json
import os
import sys
import uuid
from pathlib import Path
from typing import Any

import httpx

import charter
from charter.adapters.http import HttpAdapter
from charter.sandbox import declaration
from charter.testing import credential

NAMES = ("agent", "ops", "monitor", "visitor")
DAYS = ("mon", "tue", "wed", "thu", "fri")
AMOUNT = 12_00


def contract() -> dict[str, Any]:
    return {
        "objective": "pay the week's invoices",
        "principals": {
            "agent": {"run": ["payments.*"]},
            "ops": {
                "run": ["payments.*"],
                "resolve": ["*"],
                "stop": ["*"],
                "approve": ["*"],
                "raise_limit": ["*"],
            },
            "monitor": {"recover": ["*"], "reconcile": ["payments.*"]},
            "visitor": ["consume"],
        },
        "allowance": {"usd_cents": 1_000_000},
    }


def payments() -> HttpAdapter:
    """The sandbox's adapter, for the server's reconcile and resume (its URL from the env)."""
    return declaration(os.environ["CHARTER_TS_SANDBOX"], timeout_seconds=2.0).build()


@charter.node
def pay_week(ctx: charter.Context, value: dict[str, Any]) -> list[Any]:
    adapter = payments()
    try:
        return [
            ctx.attempt(adapter, "pay", bill(invoice), key=invoice) for invoice in value["invoices"]
        ]
    finally:
        adapter.close()


def bill(invoice: str) -> dict[str, Any]:
    return {"amount": AMOUNT, "currency": "usd", "payee": "acme", "reference": invoice}


week = charter.Plan("week", (pay_week,), ref="ts_fixture:week")


def prepare(home: Path, sandbox: str, busy_seconds: float | None = None) -> dict[str, Any]:
    pairs = {n: credential(n) for n in NAMES}
    digests = "".join(f'{n} = "{d}"\n' for n, (_, d) in pairs.items())
    busy = "" if busy_seconds is None else f"busy_timeout_seconds = {busy_seconds}\n"
    (home / "charter.toml").write_text(
        f'store = "{home / "charter.db"}"\n'
        'resume = "human"\n'
        "send_deadline_seconds = 3\n"
        f"{busy}"
        f"[credentials]\n{digests}"
        '[adapters]\npayments = "ts_fixture:payments"\n'
    )
    (home / "sandbox.url").write_text(sandbox)
    with open_engine(home) as engine:
        ops = engine.authenticate(pairs["ops"][0])
        mission = engine.create_mission(contract(), by=ops)
        gated = {**contract(), "approvals": {"required": ["payments.pay"], "ttl_seconds": 600}}
        approvals = engine.create_mission(gated, by=ops)
    found = {
        "mission": mission,
        "approvals_mission": approvals,
        "credentials": {n: c for n, (c, _) in pairs.items()},
    }
    (home / "fixture.json").write_text(json.dumps(found))
    return found


def lost(home: Path, lease_seconds: float) -> dict[str, Any]:
    found = json.loads((home / "fixture.json").read_text())
    sandbox = (home / "sandbox.url").read_text()
    deadline = min(lease_seconds / 2, 5.0)
    week_of = uuid.uuid4().hex[:8]  # each run's own invoices, in one sandbox
    invoices = [f"inv-{week_of}-{day}" for day in DAYS]
    with open_engine(home, lease_seconds=lease_seconds, send_deadline_seconds=deadline) as engine:
        agent = engine.authenticate(found["credentials"]["agent"])
        httpx.post(f"{sandbox}/_sandbox/faults", json={"fault": "drop_after_apply", "times": 1})
        # A loaded machine can keep this process from its first payment for longer
        # than a short lease: that run, fenced before it sent anything, is left
        # and another one is begun (the fault is still armed for it).
        for _ in range(3):
            run = engine.start_run(
                found["mission"],
                by=agent,
                segment_id="py-1",
                plan=week,
                input={"invoices": invoices},
            )
            try:
                run.execute(week)
            except charter.Blocked as blocked:
                lease = engine.run(run.run_id).lease_expires_us
                return {
                    "run": run.run_id,
                    "attempt": blocked.attempt_id,
                    "invoice": invoices[0],
                    "invoices": invoices,
                    "lease_expires_us": lease,
                }
            except charter.Fenced:
                if engine.attempts(run_id=run.run_id):
                    raise
    raise SystemExit("the first payment was meant to be lost, and it was not")


def agents_contract(overrides: dict[str, Any]) -> dict[str, Any]:
    """An agent's mission: its tools (``tools.*``) and model calls (``model.*``)
    run by ``agent``, decided by ``ops``, under an allowance in cents and tokens."""
    ops = {"run": ["*"], "resolve": ["*"], "stop": ["*"], "approve": ["*"], "raise_limit": ["*"]}
    base = {
        "objective": "an agent pays its invoices",
        "principals": {"agent": {"run": ["tools.*", "model.*"]}, "ops": ops},
        "allowance": {"usd_cents": 1_000_000, "input_tokens": 1_000_000, "output_tokens": 100_000},
    }
    return {**base, **overrides}


def mission(home: Path, overrides: dict[str, Any]) -> dict[str, Any]:
    found = json.loads((home / "fixture.json").read_text())
    with open_engine(home) as engine:
        ops = engine.authenticate(found["credentials"]["ops"])
        return {"mission": engine.create_mission(agents_contract(overrides), by=ops)}


def open_engine(home: Path, **options: Any) -> charter.Engine:
    config = charter.EngineConfig.from_file(home / "charter.toml")
    if options:
        config = dataclasses.replace(config, **options)
    return charter.Engine.open(str(home / "charter.db"), config=config)


if __name__ == "__main__":
    command, where = sys.argv[1], Path(sys.argv[2])
    if command == "prepare":
        busy = float(sys.argv[4]) if len(sys.argv) > 4 else None
        print(json.dumps(prepare(where, sys.argv[3], busy)), flush=True)
    elif command == "lost":
        os.environ.setdefault("CHARTER_TS_SANDBOX", (where / "sandbox.url").read_text())
        lease = float(sys.argv[3]) if len(sys.argv) > 3 else 1.0
        print(json.dumps(lost(where, lease)), flush=True)
    elif command == "mission":
        print(json.dumps(mission(where, json.loads(sys.argv[3]))), flush=True)
    else:
        raise SystemExit(f"unknown command {command!r}: prepare, lost or mission")
