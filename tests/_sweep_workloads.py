"""The workloads the sweep interrupts: each a plan and the adapter it pays through.

- ``payments``: the demo's plan, four invoices paid in one node, the last to a
  new payee that needs an approval;
- ``agent``: an agent loop: each turn a ``read_only`` look at what was paid
  (standing in for a model call), then a payment, alternately through an
  ``idempotent_keyed`` operation (the sandbox deduplicates by the attempt's
  key) and an ``unsafe`` one (the same call, declared as a target that does
  not), the last to a new payee that needs an approval;
- ``fanout``: a graph: one node saves the invoices as an artifact, three
  nodes that use it pay one invoice each, concurrently, and the fan-in pays
  the new payee (after its approval) and saves a report artifact.

Both pay the same invoices through the sandbox, so the sweep checks them the
same way; a workload's adapter serves the operator's reconciliation too.
"""

from __future__ import annotations

import dataclasses
import json
from typing import Any

from charter import Context, Node, Plan, node
from charter.adapters import EffectClass
from charter.adapters.http import HttpAdapter
from charter.cli.demo import UNIT, invoice_plan, payments_adapter
from charter.sandbox.client import declaration


def agent_adapter(url: str) -> HttpAdapter:
    """The demo's adapter with ``pay_unsafe``: ``pay`` declared as a target that
    does not deduplicate, so an uncertain send is never replayed, only looked up."""
    decl = declaration(url, unit=UNIT)
    pay = decl.operations["pay"]
    unsafe = dataclasses.replace(pay, effect=EffectClass.UNSAFE, dedupe_window_seconds=None)
    ops = {**decl.operations, "pay_new_payee": pay, "pay_unsafe": unsafe}
    return dataclasses.replace(decl, operations=ops).build()


def agent_plan(payments: HttpAdapter) -> Plan:
    @node
    def agent_loop(ctx: Context, invoices: list[dict[str, Any]]) -> list[str]:
        paid = []
        for turn, inv in enumerate(invoices):
            ctx.attempt(payments, "list", {}, key=f"look-{turn}")
            if inv.get("new_payee"):
                operation = "pay_new_payee"
            else:
                operation = "pay" if turn % 2 == 0 else "pay_unsafe"
            paid.append(ctx.attempt(payments, operation, _request(inv), key=inv["invoice"])["id"])
        return paid

    return Plan("agent-loop", (agent_loop,))


def _request(inv: dict[str, Any]) -> dict[str, Any]:
    return {
        "amount": inv["amount"],
        "currency": "usd",
        "payee": inv["payee"],
        "reference": inv["invoice"],
    }


def _invoices(ctx: Context) -> list[dict[str, Any]]:
    invoices: list[dict[str, Any]] = json.loads((ctx.workspace / "invoices.json").read_text())
    return invoices


def fanout_plan(payments: HttpAdapter) -> Plan:
    @node
    def prepare(ctx: Context, invoices: list[dict[str, Any]]) -> int:
        ctx.workspace.mkdir(parents=True, exist_ok=True)
        (ctx.workspace / "invoices.json").write_text(json.dumps(invoices, sort_keys=True))
        ctx.save("invoices.json")
        return len(invoices)

    def payer(i: int) -> Node:
        @node(name=f"pay_{i}", uses=("invoices.json",))
        def pay(ctx: Context, _: Any) -> str:
            inv = _invoices(ctx)[i]
            return str(ctx.attempt(payments, "pay", _request(inv), key=inv["invoice"])["id"])

        return pay

    @node(uses=("invoices.json",))
    def report(ctx: Context, _: Any) -> dict[str, Any]:
        last = _invoices(ctx)[-1]
        paid = ctx.attempt(payments, "pay_new_payee", _request(last), key=last["invoice"])
        (ctx.workspace / "report.txt").write_text(f"paid {last['invoice']}: {paid['id']}\n")
        return ctx.save("report.txt")

    payers = [payer(i) for i in range(3)]
    return Plan.graph("fanout", {prepare: [], **{p: [prepare] for p in payers}, report: payers})


WORKLOADS = {
    "payments": (payments_adapter, invoice_plan),
    "agent": (agent_adapter, agent_plan),
    "fanout": (payments_adapter, fanout_plan),
}
