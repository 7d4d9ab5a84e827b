"""The built-in example mission: ``charter demo``.

An agent pays this week's invoices through a payments API (the sandbox,
started on loopback). The agent's executor runs in a child process, which is
SIGKILLed in the middle of a payment: the API applied it, and its answer is
lost with the process. The demo then tells what Charter does about it: the
recovery takes the run over at once (its owner's death is provable), keeps
the hold of the unresolved payment, reconciles it by looking it up, an
operator confirms the evidence, and the run finishes — paying the new payee
only after a named person approved it — with nothing paid twice, checked
against the sandbox's own records.
"""

from __future__ import annotations

import json
import os
import signal
import subprocess
import sys
import tempfile
import time
from collections.abc import Callable
from pathlib import Path
from typing import Any

from charter import (
    Blocked,
    Context,
    Engine,
    EngineConfig,
    Executor,
    Plan,
    Principal,
    new_credential,
    node,
)
from charter.adapters.http import HttpAdapter
from charter.sandbox import Sandbox, declaration

UNIT = "usd"
INVOICES = (
    {"invoice": "inv-101", "payee": "acme", "amount": 4_50},
    {"invoice": "inv-102", "payee": "globex", "amount": 12_00},
    {"invoice": "inv-103", "payee": "initech", "amount": 27_30},
    {"invoice": "inv-104", "payee": "umbrella", "amount": 8_75, "new_payee": True},
)
CRASH_AT = "inv-103"
APPROVER = "maria"


def payments_adapter(url: str) -> HttpAdapter:
    """The sandbox's declaration, plus ``pay_new_payee``: the same call, its own scope,
    so that the contract can require an approval for it alone."""
    base = declaration(url, unit=UNIT)
    ops = {**base.operations, "pay_new_payee": base.operations["pay"]}
    return type(base)(base.name, base.base_url, ops, base.classification).build()


def invoice_plan(payments: HttpAdapter) -> Plan:
    @node
    def pay_invoices(ctx: Context, invoices: list[dict[str, Any]]) -> list[str]:
        paid = []
        for inv in invoices:
            operation = "pay_new_payee" if inv.get("new_payee") else "pay"
            request = {
                "amount": inv["amount"],
                "currency": "usd",
                "payee": inv["payee"],
                "reference": inv["invoice"],
            }
            payment = ctx.attempt(payments, operation, request, key=inv["invoice"])
            paid.append(payment["id"])
        return paid

    return Plan("weekly-invoices", (pay_invoices,))


def run_demo(store: str | None = None, *, as_json: bool = False) -> int:
    """Run the example mission on ``store``; 0 when it completed with nothing paid twice."""
    creds = {name: new_credential(name) for name in ("agent", "ops", APPROVER)}
    config = EngineConfig(credentials={n: digest for n, (_, digest) in creds.items()})
    data = _sandbox_file(store)
    story = Story(as_json)
    child: dict[str, subprocess.Popen[str]] = {}

    def crash_mid_payment(payment: dict[str, Any]) -> None:
        if payment["reference"] == CRASH_AT and "worker" in child:
            child["worker"].send_signal(signal.SIGKILL)
            child["worker"].wait()

    with (
        Sandbox(data, on_apply=crash_mid_payment) as box,
        Engine.open(store, config=config) as engine,
    ):
        who = {n: engine.authenticate(cred) for n, (cred, _) in creds.items()}
        mission = _mission(engine, who["ops"])
        contract = engine.contract(mission)
        story.tell(
            "mission",
            f"mission {mission}: pay {len(INVOICES)} invoices from an allowance of "
            f"{contract.show(UNIT, contract.allowance[UNIT])}; "
            f"a new payee needs {APPROVER}'s approval",
            mission_id=mission,
            allowance=contract.allowance[UNIT],
            invoices=list(INVOICES),
            sandbox=box.url,
        )
        box.fault("drop_after_apply", reference=CRASH_AT)
        run_id = _worker(
            story, child, store, agent=creds["agent"], config=config, url=box.url, mission=mission
        )
        payments = payments_adapter(box.url)
        try:
            _recover(story, engine, run_id, payments, who["ops"])
            _finish(story, engine, run_id, invoice_plan(payments), who)
        finally:
            payments.close()
        return _report(story, engine, mission, run_id, box)


def _sandbox_file(store: str | None) -> str:
    """The sandbox keeps its records beside the store (or in a temporary folder)."""
    if store is not None and "://" not in store:
        return f"{store}.sandbox.db"
    return str(Path(tempfile.mkdtemp(prefix="charter-demo-")) / "sandbox.db")


def _mission(engine: Engine, ops: Principal) -> str:
    return engine.create_mission(
        {
            "objective": "Pay this week's invoices",
            "principals": {
                "agent": {"run": ["payments.*"]},
                "ops": ["resolve", "stop", "run"],
                APPROVER: {"approve": ["payments.pay_new_payee"]},
            },
            "allowance": {UNIT: 100_00},
            "units": {UNIT: {"scale": 2, "name": "USD"}},
            "approvals": {"required": ["payments.pay_new_payee"], "ttl_seconds": 3600},
        },
        by=ops,
        name="weekly invoices",
    )


def _worker(
    story: Story,
    child: dict[str, subprocess.Popen[str]],
    store: str | None,
    *,
    agent: tuple[str, str],
    config: EngineConfig,
    url: str,
    mission: str,
) -> str:
    """Start the agent's executor in a child process; return its run once it has died."""
    order = {
        "store": store,
        "credential": agent[0],
        "credentials": dict(config.credentials),
        "url": url,
        "mission": mission,
        "invoices": list(INVOICES),
    }
    with tempfile.TemporaryFile("w+") as orders:
        json.dump(order, orders)
        orders.seek(0)
        proc = subprocess.Popen(
            [sys.executable, "-m", "charter.cli.demo"],
            stdin=orders,
            stdout=subprocess.PIPE,
            text=True,
        )
    child["worker"] = proc
    run_id = str(json.loads(proc.stdout.readline() if proc.stdout else "{}")["run_id"])
    story.tell(
        "worker",
        f"worker process {proc.pid} owns run {run_id} (segment seg-1, epoch 1) and pays",
        pid=proc.pid,
        run_id=run_id,
    )
    story.wait_for(lambda: proc.poll() is not None, f"paying invoices in process {proc.pid}")
    story.tell(
        "crash",
        f"process {proc.pid} was killed (SIGKILL) while paying {CRASH_AT}: the API applied "
        "it, and its answer died with the process",
        pid=proc.pid,
        signal="SIGKILL",
        invoice=CRASH_AT,
        returncode=proc.returncode,
    )
    return run_id


def _recover(
    story: Story, engine: Engine, run_id: str, payments: HttpAdapter, ops: Principal
) -> None:
    """recover, then reconcile and confirm what is uncertain, showing the ledger."""
    contract = engine.contract(engine.run(run_id).mission_id)
    state, unresolved = engine.coordinator.recover(run_id, "seg-2")
    attempts = [engine.get_attempt(a) for a in unresolved]
    story.tell(
        "recover",
        f"recover took run {run_id} over as seg-2 at once (its owner is provably dead): "
        f"epoch {state.epoch}; unresolved: "
        + ", ".join(
            f"{a.id} ({a.request['reference']}, {a.status.value}, "
            f"hold {contract.show(UNIT, a.estimate[UNIT])} kept)"
            for a in attempts
        ),
        epoch=state.epoch,
        unresolved=[a.to_dict() for a in attempts],
    )
    _ledger(story, engine, contract, run_id, step="ledger_before", title="ledger before")
    for attempt in attempts:
        evidence = engine.coordinator.reconcile(attempt.id, payments, by=ops)
        found = evidence.outcome.result if evidence.outcome else None
        story.tell(
            "reconcile",
            f"reconcile looked {attempt.request['reference']} up by its idempotency key: "
            f"{evidence.verdict}"
            + (
                f", payment {found['id']} of {contract.show(UNIT, found['amount'])}"
                if found
                else ""
            ),
            attempt_id=attempt.id,
            verdict=evidence.verdict,
            found=found,
        )
        settled = engine.coordinator.confirm(attempt.id, by=ops)
        story.tell(
            "confirm",
            f"ops confirmed the evidence: {attempt.id} {settled.status.value}, "
            f"{contract.show(UNIT, (settled.actual or {}).get(UNIT, 0))} spent",
            attempt_id=attempt.id,
            status=settled.status.value,
            actual=settled.actual,
        )
    _ledger(story, engine, contract, run_id, step="ledger_after", title="ledger after")


def _finish(
    story: Story, engine: Engine, run_id: str, plan: Plan, who: dict[str, Principal]
) -> None:
    """Resume; approve what waits for approval; until the run ends."""
    for _ in range(4):
        ex: Executor = engine.coordinator.resume(run_id, "seg-2", by=who["ops"])
        try:
            ex.execute(plan)
        except Blocked as blocked:
            story.tell("blocked", f"the run waits: {blocked.reason}", reason=blocked.reason)
            for approval in engine.approvals(run_id=run_id, pending=True):
                engine.approve(approval.id, by=who[APPROVER])
                story.tell(
                    "approve",
                    f"{APPROVER} approved {approval.scope} ({approval.id})",
                    approval_id=approval.id,
                    by=APPROVER,
                )
            continue
        story.tell(
            "resume",
            "resumed as seg-2: paid invoices replayed from their records, nothing sent again",
        )
        return


def _ledger(
    story: Story, engine: Engine, contract: Any, run_id: str, *, step: str, title: str
) -> None:
    b = engine.balances(engine.run(run_id).mission_id)[UNIT]
    shown = {k: contract.show(UNIT, getattr(b, k)) for k in ("limit", "available", "held", "spent")}
    story.tell(
        step,
        f"{title}: " + ", ".join(f"{k} {v}" for k, v in shown.items()),
        **{k: getattr(b, k) for k in ("limit", "available", "held", "spent")},
    )


def _report(story: Story, engine: Engine, mission: str, run_id: str, box: Sandbox) -> int:
    """The end of the story, checked against the sandbox's own records; the exit status."""
    run = engine.run(run_id)
    contract = engine.contract(mission)
    paid = [p for p in box.payments() if p["run_id"] == run_id]
    keys = {a.idempotency_key for a in engine.attempts(run_id=run_id)}
    creates = [r for r in box.requests() if r["kind"] == "create" and r["idempotency_key"] in keys]
    by_invoice: dict[str, int] = {}
    for p in paid:
        by_invoice[p["reference"]] = by_invoice.get(p["reference"], 0) + 1
    twice = sorted(ref for ref, n in by_invoice.items() if n > 1)
    repeats = len(creates) - len({r["idempotency_key"] for r in creates})
    spent = engine.balances(mission)[UNIT].spent
    problems = engine.check_ledger(mission)
    audit_ok = all(c.ok for c in engine.verify_audit(mission))
    agree = spent == sum(p["amount"] for p in paid)
    story.tell(
        "finished",
        f"run {run_id}: {run.status.value}, epoch {run.epoch}. The sandbox received "
        f"{len(creates)} payment requests ({repeats} repeated) and applied "
        f"{len(paid)} payments for {len(by_invoice)} invoices; paid twice: "
        f"{', '.join(twice) or 'none'}; the ledger spent {contract.show(UNIT, spent)}, "
        f"{'as' if agree else 'NOT as'} the sandbox took; ledger check "
        f"{problems or 'ok'}; audit chain {'verified' if audit_ok else 'BROKEN'}",
        status=run.status.value,
        requests=len(creates),
        repeated=repeats,
        paid_twice=twice,
        ledger_agrees=agree,
        ledger_problems=problems,
        audit_ok=audit_ok,
    )
    ok = run.status.value == "completed" and not twice and agree and not problems and audit_ok
    story.end(
        {
            "mission_id": mission,
            "run_id": run_id,
            "status": run.status.value,
            "attempts": [a.to_dict() for a in engine.attempts(run_id=run_id)],
            "sandbox": {"data": box.ledger.path, "payments": paid, "requests": creates},
            "paid_twice": twice,
            "ledger_problems": problems,
            "audit_ok": audit_ok,
            "ok": ok,
        }
    )
    return 0 if ok else 1


class Story:
    """The demo's telling: coloured lines on a terminal, plain ones elsewhere, or JSON."""

    def __init__(self, as_json: bool) -> None:
        self.as_json = as_json
        self.steps: list[dict[str, Any]] = []
        self.tty = sys.stdout.isatty() and not as_json
        self.colour = self.tty and "NO_COLOR" not in os.environ and os.environ.get("TERM") != "dumb"

    def tell(self, step: str, line: str, **data: Any) -> None:
        self.steps.append({"step": step, "text": line, **data})
        if not self.as_json:
            head = f"\033[1;36m{step:>13}\033[0m" if self.colour else f"{step:>13}"
            print(f"{head}  {line}", flush=True)

    def wait_for(self, done: Callable[[], bool], what: str) -> None:
        """Wait, showing a progress line on a terminal (a plain line elsewhere)."""
        if not self.as_json and not self.tty:
            print(f"{'…':>13}  {what}", flush=True)
        frames, i = "|/-\\", 0
        while not done():
            if self.tty:
                print(f"\r{frames[i % 4]:>13}  {what}", end="", flush=True)
            i += 1
            time.sleep(0.05)
        if self.tty:
            print("\r\033[K", end="", flush=True)

    def end(self, report: dict[str, Any]) -> None:
        if self.as_json:
            print(json.dumps({**report, "story": self.steps}, indent=2, default=str))


def _work() -> int:
    """The child: own a new run of the mission and pay the invoices, until killed."""
    order = json.loads(sys.stdin.read())
    config = EngineConfig(credentials=order["credentials"])
    with Engine.open(order["store"], config=config, create=False) as engine:
        agent = engine.authenticate(order["credential"])
        payments = payments_adapter(order["url"])
        plan = invoice_plan(payments)
        ex = engine.start_run(
            order["mission"], by=agent, segment_id="seg-1", plan=plan, input=order["invoices"]
        )
        print(json.dumps({"run_id": ex.run_id}), flush=True)
        ex.execute(plan)
    return 0


if __name__ == "__main__":
    raise SystemExit(_work())
