/**
 * The OpenAI Agents SDK for JavaScript on Charter
 * (`@charter/sdk/openai-agents`), with the real `@openai/agents` and its
 * `openai` client against a loopback model that speaks OpenAI's Chat
 * Completions (`fake_openai.ts`), the payments sandbox and a real `charter
 * serve`. The kill test runs `examples/openai_agents_agent.ts` as its own
 * process and SIGKILLs it after the sandbox applied the payment and before
 * the tool's answer was recorded; the others run the agent in this process.
 */

import assert from "node:assert/strict";
import { spawn, type ChildProcess } from "node:child_process";
import { randomUUID } from "node:crypto";
import { join } from "node:path";
import { createInterface } from "node:readline";
import { after, before, test } from "node:test";

import { Runner, RunState } from "@openai/agents";

import { Charter, Segment } from "../../src/index.js";
import { charterModels, inNode, stoppedBy, toolCalls } from "../../src/openai-agents.js";
import { clerk, governedTools, provider } from "../../examples/openai_agents_agent.js";
import { FakeOpenAI } from "./fake_openai.js";
import { SDK, startWorld, until, type World } from "./harness.js";

let world: World;
let model: FakeOpenAI;
const PROGRAM = join(SDK, "build", "examples", "openai_agents_agent.js");

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

test("X1_A6_R7_openai_agents_an_agent_SIGKILLed_after_paying_resumes_pays_once_and_bills_each_model_call_once_without_Charter_it_pays_twice", async () => {
  const mission = await world.agentsMission();
  const ops = new Charter({ baseUrl: world.url, credential: world.credential("ops") });

  // With Charter.
  const invoice = `inv-oa-${randomUUID().slice(0, 8)}`;
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
  const billed = model.of(invoice);
  assert.deepEqual(billed.map((b) => b.step), [0, 1], "the tool call asked once (replayed after the crash), then the answer");
  const { items } = await ops.attempts({ run: runId });
  assert.deepEqual(items.map((a) => `${a.adapter}.${a.operation}:${a.status}`).sort(), [
    "model.response:succeeded",
    "model.response:succeeded",
    "tools.pay:succeeded",
  ]);
  const pay = items.find((a) => a.operation === "pay")!;
  assert.match(pay.effect_key, /^agent:tool:call_/, "keyed by the model's tool call id");
  assert.equal(pay.dispatched_epoch, 1, "the payment sent before the kill is the one settled");
  assert.equal((await ops.coordinator.state(runId)).status, "completed");
  const spent = await ledger(ops, mission);
  assert.equal(spent["usd_cents"]?.spent, 1200, "the ledger spent what the sandbox took");
  assert.equal(spent["input_tokens"]?.spent, billed.reduce((n, b) => n + b.inputTokens, 0), "input tokens as billed");
  assert.equal(spent["output_tokens"]?.spent, billed.reduce((n, b) => n + b.outputTokens, 0), "output tokens as billed");
  assert.ok(Object.values(spent).every((b) => b.held === 0));

  // Without Charter: the same agent, killed at the same point and started again.
  const plainInvoice = `inv-oa-plain-${randomUUID().slice(0, 8)}`;
  model.script(plainInvoice, [{ tool: "pay", arguments: { invoice: plainInvoice, amount: 1200 } }, { text: `Paid ${plainInvoice}.` }]);
  await killedAfterPaying(["plain", plainInvoice], plainInvoice, mission);
  const again = await lines(program(["plain", plainInvoice], "agent", mission));
  assert.equal(again.at(-1)?.step, "answered", JSON.stringify(again));
  assert.equal((await world.payments(plainInvoice)).length, 2, "without Charter the invoice is paid twice");
  assert.deepEqual(model.of(plainInvoice).map((b) => b.step), [0, 0, 1], "and the model is asked again for what it answered");
});

/** An agent run in this process: a run of `mission` started as `agent`, its node, the runner on Charter. */
async function inProcess(mission: string) {
  const charter = new Charter({ baseUrl: world.url, credential: world.credential("agent") });
  const segment = await Segment.start(charter, mission, `agent-${randomUUID().slice(0, 8)}`);
  const ctx = await segment.startNode("agent");
  const tools = governedTools(world.sandbox);
  const runner = new Runner({ modelProvider: charterModels(provider(model.url)) });
  return { segment, ctx, tools, agent: clerk(tools), runner };
}

function scripted(prefix: string): string {
  const invoice = `inv-${prefix}-${randomUUID().slice(0, 8)}`;
  model.script(invoice, [{ tool: "pay", arguments: { invoice, amount: 1200 } }, { text: `Paid ${invoice}.` }]);
  return invoice;
}

test("W2_openai_agents_a_payment_that_needs_an_approval_is_an_interruption_and_the_RunState_resumed_after_the_approval_pays_once", async () => {
  const mission = await world.agentsMission({ approvals: { required: ["tools.pay"], ttl_seconds: 600 } });
  const invoice = scripted("oa-approve");
  const run = await inProcess(mission);
  const first = await inNode(run.ctx, () => run.runner.run(run.agent, `Pay invoice ${invoice}.`));
  assert.equal(first.interruptions.length, 1, "the SDK's own stop: an interruption");
  assert.equal((await world.payments(invoice)).length, 0, "nothing paid before a person decided");
  const ops = new Charter({ baseUrl: world.url, credential: world.credential("ops") });
  const callId = (first.interruptions[0]!.rawItem as { callId: string }).callId;
  const why = stoppedBy(run.ctx, callId) as { code?: string; details?: Record<string, unknown> } | undefined;
  assert.equal(why?.code, "approval_required");
  await ops.approve(String(why?.details?.["approval_id"]));
  // The run state as the program saved it, read back as another process would.
  const saved = first.state.toString();
  const state = await RunState.fromString(run.agent, saved);
  for (const item of state.getInterruptions()) state.approve(item);
  const second = await inNode(run.ctx, () => run.runner.run(run.agent, state));
  assert.equal(second.finalOutput, `Paid ${invoice}.`);
  assert.equal((await world.payments(invoice)).length, 1, "paid once, after the approval");
  const { items } = await ops.attempts({ run: run.segment.runId });
  assert.deepEqual(items.filter((a) => a.operation === "pay").map((a) => a.status), ["succeeded"], "the same attempt, sent once");
  assert.deepEqual(model.of(invoice).map((b) => b.step), [0, 1]);
});

test("L3_L7_openai_agents_an_exhausted_allowance_is_an_interruption_and_a_raised_limit_lets_it_pay_once", async () => {
  const mission = await world.agentsMission({ allowance: { usd_cents: 500, input_tokens: 1_000_000, output_tokens: 100_000 } });
  const invoice = scripted("oa-allowance");
  const run = await inProcess(mission);
  const first = await inNode(run.ctx, () => run.runner.run(run.agent, `Pay invoice ${invoice}.`));
  assert.equal(first.interruptions.length, 1);
  assert.equal((await world.payments(invoice)).length, 0);
  const ops = new Charter({ baseUrl: world.url, credential: world.credential("ops") });
  await ops.raiseLimit(mission, "usd_cents", 10_000);
  for (const item of first.interruptions) first.state.approve(item);
  const second = await inNode(run.ctx, () => run.runner.run(run.agent, first.state));
  assert.equal(second.finalOutput, `Paid ${invoice}.`);
  assert.equal((await world.payments(invoice)).length, 1);
  assert.equal((await ledger(ops, mission))["usd_cents"]?.spent, 1200);
});

test("A3_openai_agents_a_read_only_tools_failure_reaches_the_model_as_the_SDK_tells_it_and_settles_failed", async () => {
  const mission = await world.agentsMission();
  const marker = `inv-oa-quote-${randomUUID().slice(0, 8)}`;
  model.script(marker, [{ tool: "quote", arguments: { invoice: `unknown-${marker}` } }, { text: "No such invoice." }]);
  const run = await inProcess(mission);
  const result = await inNode(run.ctx, () => run.runner.run(run.agent, `Pay invoice ${marker}.`));
  assert.equal(result.finalOutput, "No such invoice.");
  const told = model.of(marker)[1]?.told ?? [];
  assert.equal(told.length, 1);
  assert.match(told[0]!, new RegExp(`An error occurred while running the tool.*no invoice unknown-${marker}`), "told as the SDK tells it");
  const ops = new Charter({ baseUrl: world.url, credential: world.credential("ops") });
  const { items } = await ops.attempts({ run: run.segment.runId });
  const quote = items.find((a) => a.operation === "quote")!;
  assert.equal(quote.status, "failed");
  assert.equal((quote.result as { error: string }).error, `Error: no invoice unknown-${marker}`);
});

test("A3_R7_openai_agents_a_payment_tools_error_proves_nothing_the_run_is_interrupted_until_a_lookup_settles_it", async () => {
  const mission = await world.agentsMission();
  const invoice = scripted("oa-unknown");
  await world.fault("drop_after_apply", { reference: invoice });
  const run = await inProcess(mission);
  const first = await inNode(run.ctx, () => run.runner.run(run.agent, `Pay invoice ${invoice}.`));
  assert.equal(first.interruptions.length, 1, "interrupted, not told an error");
  assert.deepEqual(model.of(invoice).map((b) => b.step), [0]);
  assert.equal((await world.payments(invoice)).length, 1);
  const ops = new Charter({ baseUrl: world.url, credential: world.credential("ops") });
  const { items } = await ops.attempts({ run: run.segment.runId });
  const pay = items.find((a) => a.operation === "pay")!;
  assert.equal(pay.status, "unknown");
  assert.equal((await ops.coordinator.reconcile(pay.id, toolCalls(run.tools))).verdict, "applied");
  await ops.coordinator.confirm(pay.id);
  for (const item of first.interruptions) first.state.approve(item);
  const second = await inNode(run.ctx, () => run.runner.run(run.agent, first.state));
  assert.equal(second.finalOutput, `Paid ${invoice}.`);
  assert.equal((await world.payments(invoice)).length, 1, "never sent again");
  assert.match(model.of(invoice)[1]?.told[0] ?? "", new RegExp(invoice), "the model was told the payment the lookup found");
});
