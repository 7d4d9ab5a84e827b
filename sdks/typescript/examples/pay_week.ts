/**
 * A week's invoices paid through the payments sandbox from TypeScript, and
 * what happens when the process paying them dies mid-payment.
 *
 *     node dist/examples/pay_week.js pay WEEK       # as the agent: start a run, pay Monday..Friday
 *     node dist/examples/pay_week.js recover RUN WEEK  # as ops, in a fresh process, after the first died
 *
 * Environment: CHARTER_URL (the server), CHARTER_CREDENTIAL (NAME:SECRET),
 * CHARTER_MISSION (pay), SANDBOX_URL (the payments API: `charter sandbox`).
 * Each step prints one JSON line, so that a person or a test can follow it.
 *
 * `pay` claims a new run as its first segment and pays each invoice as an
 * attempt of node `pay-week`: admitted against the allowance and written down
 * on the server before the sandbox sees it, settled after. Killed while the
 * sandbox has applied a payment and not yet answered, it leaves that attempt
 * DISPATCHED with its hold, and the rest unpaid.
 *
 * `recover` is the seed's recovery, with the SDK: `coordinator.recover`
 * takes the run over as a new segment (a new epoch: the dead process's claim
 * is fenced; its in-flight payment becomes UNKNOWN, hold kept) — forced,
 * since the dead owner's lease has not run out, which the `stop` right allows
 * and the audit records; `coordinator.reconcile` asks the sandbox through
 * this process's own adapter whether the payment happened (a lookup by its
 * idempotency key) and records the answer as evidence; `coordinator.confirm`
 * settles it on that evidence; then the run resumes as the new segment and
 * the node runs again: what was paid replays from its record, the rest is paid
 * once. Nothing is paid twice, and the sandbox's own records say so.
 */

import { randomUUID } from "node:crypto";

import { Charter, Segment } from "../src/index.js";
import { Payments, type Bill } from "./payments.js";

const DAYS = ["mon", "tue", "wed", "thu", "fri"] as const;
const AMOUNT = 12_00;

function env(name: string): string {
  const value = process.env[name];
  if (value === undefined || value === "") throw new Error(`${name} is not set (see the top of pay_week.ts)`);
  return value;
}

function say(step: string, fields: Record<string, unknown> = {}): void {
  process.stdout.write(`${JSON.stringify({ step, ...fields })}\n`);
}

function invoices(week: string): Bill[] {
  return DAYS.map((day) => ({ amount: AMOUNT, currency: "usd", payee: "acme", reference: `inv-${week}-${day}` }));
}

/** Node `pay-week`: each invoice once, its effect keyed by its reference. */
async function payWeek(segment: Segment, payments: Payments, bills: Bill[]): Promise<unknown[]> {
  const ctx = segment.node("pay-week");
  const paid: unknown[] = [];
  for (const bill of bills) {
    say("paying", { invoice: bill.reference });
    paid.push(await ctx.attempt(payments, "pay", bill, { key: bill.reference }));
    say("paid", { invoice: bill.reference });
  }
  return paid;
}

async function pay(week: string): Promise<void> {
  const charter = new Charter({ baseUrl: env("CHARTER_URL"), credential: env("CHARTER_CREDENTIAL") });
  const payments = new Payments(env("SANDBOX_URL"), { timeoutMs: 60_000 });
  const segment = await Segment.start(charter, env("CHARTER_MISSION"), `pay-${randomUUID().slice(0, 8)}`, { week });
  segment.keepRenewing();
  say("started", { run_id: segment.runId, segment: segment.name, epoch: segment.epoch, pid: process.pid });
  await payWeek(segment, payments, invoices(week));
  await segment.release();
  say("done", { run_id: segment.runId });
}

async function recover(runId: string, week: string): Promise<void> {
  const charter = new Charter({ baseUrl: env("CHARTER_URL"), credential: env("CHARTER_CREDENTIAL") });
  const payments = new Payments(env("SANDBOX_URL"));
  const { coordinator } = charter;
  const segmentId = `recover-${randomUUID().slice(0, 8)}`;

  const { state, unresolved } = await coordinator.recover(runId, segmentId, { force: true });
  say("recovered", { run_id: runId, segment: segmentId, epoch: state.epoch, unresolved });
  for (const attemptId of unresolved) {
    const found = await coordinator.reconcile(attemptId, payments);
    say("reconciled", { attempt_id: attemptId, verdict: found.verdict, status: found.status });
    if (found.verdict === "indeterminate") {
      say("needs_a_person", { attempt_id: attemptId });
      return;
    }
    const settled = await coordinator.confirm(attemptId);
    say("confirmed", { attempt_id: attemptId, status: settled.status, actual: settled.actual });
  }
  const segment = await Segment.claim(charter, runId, segmentId);
  segment.keepRenewing();
  say("resumed", { run_id: runId, segment: segment.name, epoch: segment.epoch });
  await payWeek(segment, payments, invoices(week));
  await segment.release();
  say("done", { run_id: runId });
}

const [command, first, second] = process.argv.slice(2);
let main: Promise<void>;
if (command === "pay" && first !== undefined) main = pay(first);
else if (command === "recover" && first !== undefined && second !== undefined) main = recover(first, second);
else {
  process.stderr.write("usage: pay_week.js pay WEEK | pay_week.js recover RUN WEEK\n");
  process.exit(2);
}
main.catch((error: unknown) => {
  const fields = error instanceof Error ? { error: error.name, message: error.message, code: (error as { code?: unknown }).code } : { error: String(error) };
  say("failed", fields);
  process.exit(1);
});
