/**
 * The crash story, with real processes: `examples/pay_week.ts pay` pays a
 * week's invoices through the payments sandbox and is SIGKILLed while the
 * sandbox has applied Wednesday's payment and not yet answered; a fresh
 * process, `pay_week.ts recover`, recovers the run with the SDK (recover ->
 * reconcile with its own adapter's lookup -> confirm -> claim -> the node
 * started again is given the same execution -> its payments replay or are
 * paid -> the node completed -> the run finished). The sandbox's own records
 * show every invoice paid exactly once, the mission's ledger agrees with what
 * the sandbox took, and the run ends `completed` with its node's result recorded.
 */

import assert from "node:assert/strict";
import { spawn, type ChildProcess } from "node:child_process";
import { randomUUID } from "node:crypto";
import { join } from "node:path";
import { createInterface } from "node:readline";
import { after, before, test } from "node:test";

import { Charter } from "../../src/index.js";
import { SDK, startWorld, until, type World } from "./harness.js";

let world: World;
const PROGRAM = join(SDK, "build", "examples", "pay_week.js");
const DAYS = ["mon", "tue", "wed", "thu", "fri"];

before(async () => {
  world = await startWorld();
});
after(async () => {
  await world?.stop();
});

type Line = { step: string; [field: string]: unknown };

function program(args: string[], principal: string): { child: ChildProcess; lines: AsyncIterableIterator<string> } {
  const child = spawn(process.execPath, [PROGRAM, ...args], {
    stdio: ["ignore", "pipe", "inherit"],
    env: {
      ...process.env,
      CHARTER_URL: world.url,
      CHARTER_CREDENTIAL: world.credential(principal),
      CHARTER_MISSION: world.mission,
      SANDBOX_URL: world.sandbox,
    },
  });
  return { child, lines: createInterface({ input: child.stdout! })[Symbol.asyncIterator]() };
}

async function next(lines: AsyncIterableIterator<string>): Promise<Line> {
  const { value, done } = await lines.next();
  assert.ok(!done, "the program ended before its next step");
  return JSON.parse(value) as Line;
}

test("X1_R7_item18_a_payer_SIGKILLed_mid_payment_is_recovered_in_a_fresh_process_paid_once_and_the_run_completed", async () => {
  const week = randomUUID().slice(0, 8);
  const bill = (day: string): string => `inv-${week}-${day}`;
  // Wednesday's payment is applied, and its answer held back: the payer is killed waiting.
  await world.fault("slow", { seconds: 30, reference: bill("wed") });
  const payer = program(["pay", week], "agent");
  const started = await next(payer.lines);
  assert.equal(started.step, "started");
  const runId = String(started["run_id"]);
  const nodeStarted = await next(payer.lines);
  assert.deepEqual(nodeStarted, { step: "node_started", node_id: "pay-week", execution: 1 });
  for (let line = await next(payer.lines); !(line.step === "paying" && line["invoice"] === bill("wed")); line = await next(payer.lines));
  await until(async () => (await world.payments(bill("wed"))).length === 1, "the sandbox applies Wednesday");
  const died = new Promise((done) => payer.child.once("exit", (_code, signal) => done(signal)));
  assert.ok(payer.child.pid !== undefined && process.kill(payer.child.pid, "SIGKILL"));
  assert.equal(await died, "SIGKILL");

  const ops = new Charter({ baseUrl: world.url, credential: world.credential("ops") });
  const before = await ops.coordinator.state(runId);
  assert.equal(before.unresolved.length, 1, "Wednesday is in flight on the record");
  assert.equal(before.attempts[0]?.status, "dispatched");

  const recovery = program(["recover", runId, week], "ops");
  const steps: Line[] = [];
  for await (const line of { [Symbol.asyncIterator]: () => recovery.lines }) steps.push(JSON.parse(line) as Line);
  const exit = await new Promise((done) => (recovery.child.exitCode !== null ? done(recovery.child.exitCode) : recovery.child.once("exit", done)));
  assert.equal(exit, 0, JSON.stringify(steps));
  const named = steps.map((s) => s.step);
  const paying = DAYS.flatMap(() => ["paying", "paid"]);
  assert.deepEqual(
    named,
    ["recovered", "reconciled", "confirmed", "resumed", "node_started", ...paying, "node_completed", "finished"],
    JSON.stringify(steps),
  );
  const [recovered, reconciled, confirmed, resumed, restarted] = steps as [Line, Line, Line, Line, Line];
  assert.deepEqual(recovered["unresolved"], before.unresolved);
  assert.equal(recovered["epoch"], 2, "the dead payer's epoch is fenced");
  assert.equal(reconciled["verdict"], "applied", "found by the lookup, by key");
  assert.deepEqual(confirmed["actual"], { usd_cents: 1200 });
  assert.equal(resumed["segment"], recovered["segment"], "the segment recover installed claims the run");
  assert.equal(restarted["execution"], nodeStarted["execution"], "the node continues its execution, not the epoch");
  const completed = steps.at(-2) as Line;
  const finished = steps.at(-1) as Line;
  assert.deepEqual(finished, { step: "finished", run_id: runId, status: "completed" });

  // The sandbox's own records: each invoice paid once.
  for (const day of DAYS) {
    assert.equal((await world.payments(bill(day))).length, 1, `${bill(day)} paid once`);
  }
  // The record: one attempt per invoice, Wednesday's the one sent before the kill.
  const { items } = await ops.attempts({ run: runId });
  assert.deepEqual(items.map((a) => a.effect_key).sort(), DAYS.map(bill).sort());
  assert.ok(items.every((a) => a.status === "succeeded"), JSON.stringify(items.map((a) => a.status)));
  assert.ok(items.some((a) => a.id === before.unresolved[0] && a.dispatched_epoch === 1));
  const after = await ops.coordinator.state(runId);
  assert.deepEqual(after.unresolved, []);
  assert.equal(after.status, "completed", "the run ended completed on the record");
  // The node's journal: one execution, completed with the result the node returned.
  const journal = after.record.nodes.map((n) => [n.node_id, n.execution, n.status, n.result_hash]);
  assert.deepEqual(journal, [["pay-week", 1, "completed", completed["result_hash"]]]);
  assert.ok(items.every((a) => a.node_id === "pay-week" && a.execution === 1), "every payment of that execution");
  const ledger = (await ops.request("GET", `/missions/${world.mission}/ledger`)) as {
    balances: { unit: string; spent: number; held: number }[];
    problems: unknown[];
  };
  const usd = ledger.balances.find((b) => b.unit === "usd_cents");
  assert.equal(usd?.spent, 5 * 1200, "the ledger spent what the sandbox took");
  assert.equal(usd?.held, 0);
  assert.deepEqual(ledger.problems, []);
});
