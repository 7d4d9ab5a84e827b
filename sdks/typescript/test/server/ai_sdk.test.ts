/**
 * The Vercel AI SDK on Charter (`@charter/sdk/ai-sdk`), with the real `ai`
 * and `@ai-sdk/openai` against a loopback model that speaks OpenAI's Chat
 * Completions (`fake_openai.ts`), the payments sandbox and a real `charter
 * serve`. The kill test runs `examples/ai_sdk_agent.ts` as its own process
 * and SIGKILLs it after the sandbox applied the payment and before the tool's
 * answer was recorded; the others run the agent in this process.
 */

import assert from "node:assert/strict";
import { spawn, type ChildProcess } from "node:child_process";
import { randomUUID } from "node:crypto";
import { join } from "node:path";
import { createInterface } from "node:readline";
import { after, before, test } from "node:test";

import type { ModelMessage } from "ai";

import { Charter, Segment } from "../../src/index.js";
import type { Context } from "../../src/index.js";
import { charterModel } from "../../src/ai-sdk.js";
import { agent, chatModel, governedTools } from "../../examples/ai_sdk_agent.js";
import { FakeOpenAI } from "./fake_openai.js";
import { SDK, startWorld, type World } from "./harness.js";

let world: World;
let model: FakeOpenAI;
const PROGRAM = join(SDK, "build", "examples", "ai_sdk_agent.js");

before(async () => {
  [world, model] = await Promise.all([startWorld(), new FakeOpenAI().start()]);
});
after(async () => {
  await Promise.all([world?.stop(), model?.stop()]);
});

type Line = { step: string; [field: string]: unknown };

function program(args: string[], principal: string, mission: string): { child: ChildProcess; lines: AsyncIterableIterator<string> } {
  const child = spawn(process.execPath, [PROGRAM, ...args], {
    stdio: ["ignore", "pipe", "inherit"],
    env: {
      ...process.env,
      CHARTER_URL: world.url,
      CHARTER_CREDENTIAL: world.credential(principal),
      CHARTER_MISSION: mission,
      SANDBOX_URL: world.sandbox,
      OPENAI_BASE_URL: model.url,
    },
  });
  return { child, lines: createInterface({ input: child.stdout! })[Symbol.asyncIterator]() };
}

async function until(check: () => Promise<boolean>, what: string): Promise<void> {
  const end = performance.now() + 15_000;
  while (!(await check())) {
    assert.ok(performance.now() < end, `${what}: not within 15 s`);
    await new Promise((done) => setTimeout(done, 50));
  }
}

async function lines(started: { child: ChildProcess; lines: AsyncIterableIterator<string> }): Promise<Line[]> {
  const all: Line[] = [];
  for await (const line of { [Symbol.asyncIterator]: () => started.lines }) all.push(JSON.parse(line) as Line);
  await new Promise((done) => (started.child.exitCode !== null ? done(null) : started.child.once("exit", done)));
  return all;
}

/** Start the agent, wait for the sandbox to apply its payment (held unanswered), SIGKILL it. */
async function killedAfterPaying(args: string[], invoice: string, mission: string): Promise<Line[]> {
  await world.fault("slow", { seconds: 30, reference: invoice });
  const started = program(args, "agent", mission);
  const seen: Line[] = [];
  const reading = (async () => {
    for await (const line of { [Symbol.asyncIterator]: () => started.lines }) seen.push(JSON.parse(line) as Line);
  })();
  await until(async () => (await world.payments(invoice)).length === 1, "the sandbox applies the payment");
  const died = new Promise((done) => started.child.once("exit", (_code, signal) => done(signal)));
  assert.ok(started.child.pid !== undefined && process.kill(started.child.pid, "SIGKILL"));
  assert.equal(await died, "SIGKILL");
  await reading;
  return seen;
}

async function ledger(ops: Charter, mission: string): Promise<Record<string, { spent: number; held: number }>> {
  const found = await ops.ledger(mission);
  assert.deepEqual(found.problems, []);
  return Object.fromEntries(found.balances.map((b) => [b.unit, { spent: b.spent, held: b.held }]));
}

test("X1_A6_R7_ai_sdk_an_agent_SIGKILLed_after_paying_resumes_pays_once_and_bills_each_model_call_once_without_Charter_it_pays_twice", async () => {
  const mission = await world.agentsMission();
  const ops = new Charter({ baseUrl: world.url, credential: world.credential("ops") });

  // With Charter.
  const invoice = `inv-ai-${randomUUID().slice(0, 8)}`;
  model.script(invoice, [{ tool: "pay", arguments: { invoice, amount: 1200 } }, { text: `Paid ${invoice}.` }]);
  const first = await killedAfterPaying(["pay", invoice], invoice, mission);
  const runId = String(first.find((l) => l.step === "started")?.["run_id"]);
  const resumed = await lines(program(["resume", runId, invoice], "ops", mission));
  assert.deepEqual(
    resumed.map((l) => l.step),
    ["recovered", "reconciled", "resumed", "node_started", "answered", "node_completed", "finished"],
    JSON.stringify(resumed),
  );
  assert.equal(resumed[1]?.["verdict"], "applied", "found at the sandbox by the attempt's key");
  assert.equal(resumed.find((l) => l.step === "answered")?.["text"], `Paid ${invoice}.`);
  assert.equal((await world.payments(invoice)).length, 1, "the sandbox took the payment once");
  // The model: asked for the tool call once (replayed after the crash), then for the answer once.
  const billed = model.of(invoice);
  assert.deepEqual(billed.map((b) => b.step), [0, 1]);
  const { items } = await ops.attempts({ run: runId });
  const modelKeys = items.filter((a) => a.adapter === "model").map((a) => a.idempotency_key).sort();
  assert.deepEqual(billed.map((b) => b.idempotencyKey).sort(), modelKeys, "each call carried its attempt's key");
  const scopes = items.map((a) => `${a.adapter}.${a.operation}:${a.status}`).sort();
  assert.deepEqual(scopes, ["model.generate:succeeded", "model.generate:succeeded", "tools.pay:succeeded"]);
  const pay = items.find((a) => a.operation === "pay")!;
  assert.match(pay.effect_key, /^agent:tool:call_/, "keyed by the model's tool call id");
  assert.equal(pay.dispatched_epoch, 1, "the payment sent before the kill is the one settled");
  const state = await ops.coordinator.state(runId);
  assert.equal(state.status, "completed");
  const spent = await ledger(ops, mission);
  assert.equal(spent["usd_cents"]?.spent, 1200, "the ledger spent what the sandbox took");
  assert.equal(spent["input_tokens"]?.spent, billed.reduce((n, b) => n + b.inputTokens, 0), "input tokens as billed");
  assert.equal(spent["output_tokens"]?.spent, billed.reduce((n, b) => n + b.outputTokens, 0), "output tokens as billed");
  assert.ok(Object.values(spent).every((b) => b.held === 0));

  // Without Charter: the same agent, killed at the same point and started again.
  const plainInvoice = `inv-ai-plain-${randomUUID().slice(0, 8)}`;
  model.script(plainInvoice, [{ tool: "pay", arguments: { invoice: plainInvoice, amount: 1200 } }, { text: `Paid ${plainInvoice}.` }]);
  await killedAfterPaying(["plain", plainInvoice], plainInvoice, mission);
  const again = await lines(program(["plain", plainInvoice], "agent", mission));
  assert.equal(again.at(-1)?.step, "answered", JSON.stringify(again));
  assert.equal((await world.payments(plainInvoice)).length, 2, "without Charter the invoice is paid twice");
  assert.deepEqual(model.of(plainInvoice).map((b) => b.step), [0, 0, 1], "and the model is asked again for what it answered");
});
