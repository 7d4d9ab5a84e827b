"""The built-in example mission: ``charter demo``.

An agent books a team offsite on the embedded SQLite store. It calls a model
(read-only), pays a venue (keyed by our idempotency key, needing a person's
approval, and authorised by an API key the store never sees), and e-mails the
team — and the e-mail's answer is lost.
The demo shows what Charter does about each: the payment waits for approval,
the lost e-mail stays UNKNOWN with its hold until evidence is found and a
person confirms it, and the run then finishes without sending anything twice.

The adapters here are in-process stand-ins for real targets; they keep their
own record of what they received, which the demo prints at the end.
"""

from __future__ import annotations

import json
import secrets
from collections.abc import Callable
from dataclasses import dataclass, field
from typing import Any, ClassVar

from charter import (
    Blocked,
    Context,
    Dispatch,
    EffectClass,
    Engine,
    EngineConfig,
    Estimate,
    Evidence,
    Executor,
    NotApplied,
    Operation,
    Outcome,
    Plan,
    Principal,
    RecordedAttempt,
    Secret,
    new_credential,
    node,
)

USD = 1_000_000  # the ledger counts micro-dollars


@dataclass
class Target:
    """What an outside system received, keyed by idempotency key."""

    received: dict[str, Any] = field(default_factory=dict)


class ModelAdapter:
    """A model call: read-only; estimated at max_tokens x price (an upper bound)."""

    name = "llm"
    operations: ClassVar[dict[str, Operation]] = {"complete": Operation(EffectClass.READ_ONLY)}
    price_per_token = 2  # micro-dollars

    def __init__(self, target: Target) -> None:
        self.target = target

    def estimate(self, operation: str, request: Any) -> Estimate:
        return Estimate(
            {"usd": request["max_tokens"] * self.price_per_token, "calls": 1},
            "llm/price-table-2026-11",
        )

    def dispatch(self, send: Dispatch) -> Outcome:
        send.check_deadline()
        self.target.received[send.idempotency_key] = send.request
        used = 180
        return Outcome.succeeded(
            {"text": "The Lakeside Lodge fits 12 people on 14 March."},
            cost={"usd": used * self.price_per_token, "calls": 1},
            receipt={"usage": {"output_tokens": used}},
            price_source="llm/price-table-2026-11",
        )

    def reconcile(self, attempt: RecordedAttempt) -> Evidence:
        return Evidence.indeterminate({"reason": "model calls leave no trace to look up"})


class PaymentsAdapter:
    """A payment: the target deduplicates by our idempotency key for 24 hours and
    accepts only requests that carry its API key."""

    name = "payments"
    operations: ClassVar[dict[str, Operation]] = {
        "charge": Operation(EffectClass.IDEMPOTENT_KEYED, dedupe_window_seconds=86_400)
    }

    def __init__(self, target: Target, api_key: str) -> None:
        self.target = target
        self._api_key = api_key

    def estimate(self, operation: str, request: Any) -> Estimate:
        return Estimate({"usd": request["amount"], "calls": 1}, "payments/quoted")

    def dispatch(self, send: Dispatch) -> Outcome:
        send.check_deadline()
        if send.request["api_key"].reveal() != self._api_key:
            raise NotApplied("the payments API refused the key before charging")
        first = send.idempotency_key not in self.target.received
        self.target.received.setdefault(send.idempotency_key, send.request)
        return Outcome.succeeded(
            {"charge_id": f"ch_{send.attempt_id[-8:]}", "deduplicated": not first},
            cost={"usd": send.request["amount"], "calls": 1},
            receipt={"charge_id": f"ch_{send.attempt_id[-8:]}"},
        )

    def reconcile(self, attempt: RecordedAttempt) -> Evidence:
        if attempt.idempotency_key in self.target.received:
            return Evidence.applied(
                Outcome.succeeded(cost=attempt.estimate, receipt={"found": True})
            )
        return Evidence.not_applied({"lookup": "no charge with this key"})


class MailAdapter:
    """E-mail: unsafe (no dedupe). The first answer is lost after the send."""

    name = "mail"
    operations: ClassVar[dict[str, Operation]] = {"send": Operation(EffectClass.UNSAFE)}

    def __init__(self, target: Target) -> None:
        self.target = target
        self.lose_next_answer = True

    def estimate(self, operation: str, request: Any) -> Estimate:
        return Estimate({"usd": 1_000, "calls": 1}, "mail/flat-rate")

    def dispatch(self, send: Dispatch) -> Outcome:
        send.check_deadline()
        self.target.received[send.idempotency_key] = send.request
        if self.lose_next_answer:
            self.lose_next_answer = False
            raise TimeoutError("the mail server accepted the message but the answer was lost")
        return Outcome.succeeded(
            {"queued": True},
            cost={"usd": 1_000, "calls": 1},
            receipt={"message_id": send.idempotency_key},
        )

    def reconcile(self, attempt: RecordedAttempt) -> Evidence:
        # The mail server's log is searchable by the Message-ID we sent (our key).
        if attempt.idempotency_key in self.target.received:
            return Evidence.applied(
                Outcome.succeeded(
                    {"queued": True},
                    cost={"usd": 1_000, "calls": 1},
                    receipt={"log_entry": f"message {attempt.idempotency_key} delivered"},
                )
            )
        return Evidence.not_applied({"log": "no such message"})


def build_plan(
    llm: ModelAdapter, payments: PaymentsAdapter, mail: MailAdapter, api_key: Secret
) -> Plan:
    @node
    def research(ctx: Context, team: dict[str, Any]) -> dict[str, Any]:
        answer = ctx.attempt(
            llm, "complete", {"prompt": f"venue for {team['size']}", "max_tokens": 400}
        )
        return {"venue": "Lakeside Lodge", "why": answer["text"], "size": team["size"]}

    @node(check=lambda r: bool(r.get("charge_id")))
    def pay(ctx: Context, plan: dict[str, Any]) -> dict[str, Any]:
        charge = ctx.attempt(
            payments,
            "charge",
            {"venue": plan["venue"], "amount": 450 * USD // 1000, "api_key": api_key},
        )
        return {**plan, "charge_id": charge["charge_id"]}

    @node
    def notify(ctx: Context, booking: dict[str, Any]) -> dict[str, Any]:
        ctx.attempt(
            mail,
            "send",
            {"to": "team@example.org", "subject": f"Offsite booked at {booking['venue']}"},
        )
        return booking

    return Plan("offsite", (research, pay, notify))


def run_demo(store: str | None = None, *, as_json: bool = False) -> int:
    """Run the example mission on ``store``; 0 when it completed with a clean ledger and audit."""
    agent_cred, agent_digest = new_credential("agent")
    ops_cred, ops_digest = new_credential("ops")
    config = EngineConfig(credentials={"agent": agent_digest, "ops": ops_digest})
    targets = {"llm": Target(), "payments": Target(), "mail": Target()}
    api_key = f"sk_demo_{secrets.token_hex(8)}"
    llm = ModelAdapter(targets["llm"])
    payments = PaymentsAdapter(targets["payments"], api_key)
    mail = MailAdapter(targets["mail"])
    plan = build_plan(llm, payments, mail, Secret(api_key, name="payments-key"))
    say: list[str] = []

    def log(line: str) -> None:
        say.append(line)
        if not as_json:
            print(line)

    with Engine.open(store, config=config) as engine:
        agent, ops = engine.authenticate(agent_cred), engine.authenticate(ops_cred)
        mission = _mission(engine, ops)
        log(f"mission {mission}: allowance 1.00 USD, 10 calls; payments need approval")
        ex = engine.start_run(mission, by=agent, segment_id="seg-1", plan=plan, input={"size": 12})
        _drive(engine, ex, plan, ops=ops, mail=mail, log=log)
        return _report(
            engine,
            mission,
            ex.run_id,
            targets=targets,
            log=log,
            say=say if as_json else None,
        )


def _mission(engine: Engine, ops: Principal) -> str:
    return engine.create_mission(
        {
            "objective": "Book a team offsite for 12 people",
            "principals": {
                "agent": {"run": ["llm.*", "payments.*", "mail.*"]},
                "ops": ["approve", "resolve", "raise_limit", "stop", "run"],
            },
            "allowance": {"usd": 1 * USD, "calls": 10},
            "approvals": {"required": ["payments.charge"], "ttl_seconds": 3600},
        },
        by=ops,
        name="offsite",
    )


def _drive(
    engine: Engine,
    ex: Executor,
    plan: Plan,
    *,
    ops: Principal,
    mail: MailAdapter,
    log: Callable[[str], None],
) -> None:
    """Run the plan; each time it blocks, act as ops would: approve, reconcile and
    confirm what is uncertain, then resume the segment."""
    run_id, coordinator = ex.run_id, engine.coordinator
    for _ in range(5):
        try:
            ex.execute(plan)
            return
        except Blocked as blocked:
            log(f"run blocked: {blocked.reason}")
        for approval in engine.approvals(run_id=run_id, pending=True):
            engine.approve(approval.id, by=ops)
            log(f"ops approved {approval.scope} ({approval.id})")
        for attempt in engine.attempts(run_id=run_id, unresolved=True):
            if attempt.status.value != "unknown":
                continue
            evidence = coordinator.reconcile(attempt.id, mail)
            log(
                f"reconciled {attempt.scope} {attempt.id}: evidence {evidence.verdict} "
                f"(hold kept: {attempt.estimate})"
            )
            coordinator.confirm(attempt.id, by=ops)
            log(f"ops confirmed the evidence: {attempt.id} settled")
        ex = coordinator.resume(run_id, ex.segment_id, by=ops)
        log(f"resumed run {run_id} as {ex.segment_id} (epoch {ex.epoch})")


def _report(
    engine: Engine,
    mission: str,
    run_id: str,
    *,
    targets: dict[str, Target],
    log: Callable[[str], None],
    say: list[str] | None,
) -> int:
    """Print what happened (as JSON when ``say`` collects the log); the exit status."""
    run = engine.run(run_id)
    attempts = engine.attempts(run_id=run_id)
    balances = engine.balances(mission)
    problems = engine.check_ledger(mission)
    chains = engine.verify_audit(mission)
    sends = {name: len(target.received) for name, target in targets.items()}
    log(f"\nrun {run_id}: {run.status.value}, epoch {run.epoch}")
    log(f"{'ATTEMPT':32} {'SCOPE':16} {'STATUS':10} {'HOLD':>22} {'ACTUAL':>22}")
    for a in attempts:
        log(
            f"{a.id:32} {a.scope:16} {a.status.value:10} {json.dumps(a.estimate):>22} "
            f"{json.dumps(a.actual):>22}"
        )
    log(f"\n{'UNIT':6} {'LIMIT':>10} {'AVAILABLE':>10} {'HELD':>8} {'SPENT':>8} {'OVERRUN':>8}")
    for unit, b in balances.items():
        log(f"{unit:6} {b.limit:>10} {b.available:>10} {b.held:>8} {b.spent:>8} {b.overrun:>8}")
    log(f"\nsends received by each target: {sends}")
    [charge] = [a for a in attempts if a.scope == "payments.charge"]
    log(f"the payments API key, as the store holds it: {charge.request['api_key']}")
    audit_ok = all(c.ok for c in chains)
    log(
        f"ledger check: {problems or 'ok'}; audit chain: "
        f"{'verified' if audit_ok else 'BROKEN'} ({chains[0].events} events)"
    )
    if say is not None:
        report = {
            "mission_id": mission,
            "run_id": run_id,
            "status": run.status.value,
            "attempts": [a.to_dict() for a in attempts],
            "balances": {u: b.__dict__ for u, b in balances.items()},
            "sends": sends,
            "ledger_problems": problems,
            "audit_ok": audit_ok,
            "log": say,
        }
        print(json.dumps(report, indent=2, default=str))
    return 0 if run.status.value == "completed" and not problems and audit_ok else 1
