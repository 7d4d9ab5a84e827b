"""The workloads the sweep interrupts: each a plan and the adapter it pays through.

- ``payments``: the demo's plan, four invoices paid in one node, the last to a
  new payee that needs an approval;
- ``agent``: an agent loop: each turn a ``read_only`` look at what was paid
  (standing in for a model call), then a payment, alternately through an
  ``idempotent_keyed`` operation (the sandbox deduplicates by the attempt's
  key) and an ``unsafe`` one (the same call, declared as a target that does
  not), the last to a new payee that needs an approval.

Both pay the same invoices through the sandbox, so the sweep checks them the
same way; a workload's adapter serves the operator's reconciliation too.
"""

from __future__ import annotations

import dataclasses
from typing import Any

from charter import Context, Plan, node
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
            request = {
                "amount": inv["amount"],
                "currency": "usd",
                "payee": inv["payee"],
                "reference": inv["invoice"],
            }
            paid.append(ctx.attempt(payments, operation, request, key=inv["invoice"])["id"])
        return paid

    return Plan("agent-loop", (agent_loop,))


WORKLOADS = {
    "payments": (payments_adapter, invoice_plan),
    "agent": (agent_adapter, agent_plan),
}
