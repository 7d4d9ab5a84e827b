/**
 * A week's invoices paid through the payments sandbox from TypeScript, and
 * what happens when the process paying them dies mid-payment.
 *
 *     node build/examples/pay_week.js pay WEEK       # as the agent: start a run, pay Monday..Friday
 *     node build/examples/pay_week.js recover RUN WEEK  # as ops, in a fresh process, after the first died
 *
 * Environment: CHARTER_URL (the server), CHARTER_CREDENTIAL (NAME:SECRET),
 * CHARTER_MISSION (pay), SANDBOX_URL (the payments API: `charter sandbox`).
 * Each step prints one JSON line, so that a person or a test can follow it.
 *
 * `pay` claims a new run as its first segment, starts node `pay-week` (the
 * server's journal answers its execution) and pays each invoice as an
 * attempt of it: admitted against the allowance and written down on the
 * server before the sandbox sees it, settled after; then it completes the
 * node and finishes the run. Killed while the sandbox has applied a payment
 * and not yet answered, it leaves that attempt DISPATCHED with its hold, the
 * node running, and the rest unpaid.
 *
 * `recover` is the seed's recovery, with the SDK: `coordinator.recover`
 * takes the run over as a new segment (a new epoch: the dead process's claim
 * is fenced; its in-flight payment becomes UNKNOWN, hold kept) — forced,
 * since the dead owner's lease has not run out, which the `stop` right allows
 * and the audit records; `coordinator.reconcile` asks the sandbox through
 * this process's own adapter whether the payment happened (a lookup by its
 * idempotency key) and records the answer as evidence; `coordinator.confirm`
 * settles it on that evidence; then `coordinator.resume` carries the run on
 * here as the new segment, which starts
 * the node again and is given the same execution, so what was paid replays
 * from its record and the rest is paid once; it completes the node and
 * finishes the run, which ends `completed`. Nothing is paid twice, and the
 * sandbox's own records say so.
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

/**
 * Node `pay-week`, as its journal on the server says to run it now: the
 * execution `startNode` answers (after a crash, the one the dead process was
 * running, so its settled payments replay), each invoice once (its effect
 * keyed by its reference), and the node's result recorded (N1).
 */
async function payWeek(segment: Segment, payments: Payments, bills: Bill[]): Promise<void> {
  const ctx = await segment.startNode("pay-week");
  say("node_started", { node_id: ctx.nodeId, execution: ctx.execution });
  const paid: unknown[] = [];
  for (const bill of bills) {
    say("paying", { invoice: bill.reference });
    paid.push(await ctx.attempt(payments, "pay", bill, { key: bill.reference }));
    say("paid", { invoice: bill.reference });
  }
  const completed = await ctx.complete(paid);
  say("node_completed", { node_id: ctx.nodeId, execution: completed.execution, result_hash: completed.result_hash });
}

/** The plan is done: the run ends `completed` (refused while any attempt is unresolved). */
async function finish(segment: Segment): Promise<void> {
  const run = await segment.finish();
  say("finished", { run_id: run.id, status: run.status });
}

async function pay(week: string): Promise<void> {
  const charter = new Charter({ baseUrl: env("CHARTER_URL"), credential: env("CHARTER_CREDENTIAL") });
  const payments = new Payments(env("SANDBOX_URL"), { timeoutMs: 60_000 });
  const segment = await Segment.start(charter, env("CHARTER_MISSION"), `pay-${randomUUID().slice(0, 8)}`, { week });
  segment.keepRenewing();
  say("started", { run_id: segment.runId, segment: segment.name, epoch: segment.epoch, pid: process.pid });
  await payWeek(segment, payments, invoices(week));
  await finish(segment);
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
  // Nothing is unresolved now: the segment `recover` installed carries the run
  // on here (under the `human` policy, refused as needs_intervention until then).
  const segment = await coordinator.resume(runId, segmentId);
  segment.keepRenewing();
  say("resumed", { run_id: runId, segment: segment.name, epoch: segment.epoch });
  await payWeek(segment, payments, invoices(week));
  await finish(segment);
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
