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
import { SDK, startWorld, until, type World } from "./harness.js";

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

/** An agent run in this process: a run of `mission` started as `agent`, its node, its governed tools and model. */
async function inProcess(mission: string) {
  const charter = new Charter({ baseUrl: world.url, credential: world.credential("agent") });
  const segment = await Segment.start(charter, mission, `agent-${randomUUID().slice(0, 8)}`);
  const ctx: Context = await segment.startNode("agent");
  const governed = governedTools(ctx, world.sandbox);
  return { segment, ctx, governed, model: charterModel(ctx, chatModel(model.url)) };
}

/** The conversation so far, with every approval request answered approved: the SDK's way to go on. */
function approved(invoice: string, messages: ModelMessage[]): ModelMessage[] {
  const requests = messages.flatMap((m) =>
    m.role === "assistant" && typeof m.content !== "string" ? m.content.filter((p) => p.type === "tool-approval-request") : [],
  );
  const answers = requests.map((r) => ({ type: "tool-approval-response" as const, approvalId: r.approvalId, approved: true }));
  return [{ role: "user", content: `Pay invoice ${invoice}.` }, ...messages, { role: "tool", content: answers }];
}

function scripted(prefix: string): string {
  const invoice = `inv-${prefix}-${randomUUID().slice(0, 8)}`;
  model.script(invoice, [{ tool: "pay", arguments: { invoice, amount: 1200 } }, { text: `Paid ${invoice}.` }]);
  return invoice;
}

async function goOn(run: Awaited<ReturnType<typeof inProcess>>, invoice: string, messages: ModelMessage[]) {
  const { generateText, isStepCount } = await import("ai");
  return generateText({
    model: run.model,
    tools: run.governed.tools,
    toolApproval: run.governed.toolApproval,
    stopWhen: isStepCount(5),
    maxOutputTokens: 200,
    maxRetries: 0,
    messages: approved(invoice, messages),
  });
}

test("W2_ai_sdk_a_payment_that_needs_an_approval_stops_the_agent_with_a_tool_approval_request_and_is_sent_once_approved", async () => {
  const mission = await world.agentsMission({ approvals: { required: ["tools.pay"], ttl_seconds: 600 } });
  const invoice = scripted("ai-approve");
  const run = await inProcess(mission);
  const first = await agent(run.model, run.governed.tools, invoice, run.governed.toolApproval);
  const requests = first.content.filter((p) => p.type === "tool-approval-request");
  assert.equal(requests.length, 1, "the SDK's own stop: a tool approval request");
  assert.equal((await world.payments(invoice)).length, 0, "nothing paid before a person decided");
  const why = run.governed.stopped.get(requests[0]!.toolCall.toolCallId) as { details?: Record<string, unknown> };
  const approvalId = String(why.details?.["approval_id"]);
  assert.match(approvalId, /./);
  const ops = new Charter({ baseUrl: world.url, credential: world.credential("ops") });
  await ops.approve(approvalId);
  const second = await goOn(run, invoice, first.response.messages);
  assert.equal(second.text, `Paid ${invoice}.`);
  assert.equal((await world.payments(invoice)).length, 1, "paid once, after the approval");
  const { items } = await ops.attempts({ run: run.segment.runId });
  assert.deepEqual(items.filter((a) => a.operation === "pay").map((a) => a.status), ["succeeded"], "the same attempt, sent once");
  assert.deepEqual(model.of(invoice).map((b) => b.step), [0, 1], "the model was not asked twice for the tool call");
});

test("W2_ai_sdk_a_payment_a_person_denied_in_Charter_is_the_SDKs_denied_tool_call_and_is_never_sent", async () => {
  const mission = await world.agentsMission({ approvals: { required: ["tools.pay"], ttl_seconds: 600 } });
  const invoice = scripted("ai-deny");
  const run = await inProcess(mission);
  const first = await agent(run.model, run.governed.tools, invoice, run.governed.toolApproval);
  const request = first.content.find((p) => p.type === "tool-approval-request");
  assert.ok(request !== undefined);
  const why = run.governed.stopped.get(request.toolCall.toolCallId) as { details?: Record<string, unknown> };
  const ops = new Charter({ baseUrl: world.url, credential: world.credential("ops") });
  await ops.deny(String(why.details?.["approval_id"]));
  const second = await goOn(run, invoice, first.response.messages);
  assert.equal((await world.payments(invoice)).length, 0, "never sent");
  assert.ok(second.steps.length > 0);
  const told = model.of(invoice)[1]?.told ?? [];
  assert.match(told[0] ?? "", /voided and never sent: approval denied/, "the model told the call was denied, the SDK's way");
  const { items } = await ops.attempts({ run: run.segment.runId });
  assert.deepEqual(items.filter((a) => a.operation === "pay").map((a) => a.status), ["voided"]);
});

test("L3_L7_ai_sdk_an_exhausted_allowance_stops_the_agent_and_a_raised_limit_lets_it_pay_once", async () => {
  const mission = await world.agentsMission({ allowance: { usd_cents: 500, input_tokens: 1_000_000, output_tokens: 100_000 } });
  const invoice = scripted("ai-allowance");
  const run = await inProcess(mission);
  const first = await agent(run.model, run.governed.tools, invoice, run.governed.toolApproval);
  const requests = first.content.filter((p) => p.type === "tool-approval-request");
  assert.equal(requests.length, 1);
  assert.match(String(requests[0]!.reason), /allowance|exceed/i);
  assert.equal((await world.payments(invoice)).length, 0);
  const ops = new Charter({ baseUrl: world.url, credential: world.credential("ops") });
  await ops.raiseLimit(mission, "usd_cents", 10_000);
  const second = await goOn(run, invoice, first.response.messages);
  assert.equal(second.text, `Paid ${invoice}.`);
  assert.equal((await world.payments(invoice)).length, 1);
  const spent = await ledger(ops, mission);
  assert.equal(spent["usd_cents"]?.spent, 1200);
});

test("A3_ai_sdk_a_read_only_tools_failure_reaches_the_model_as_a_tool_error_and_settles_failed", async () => {
  const mission = await world.agentsMission();
  const marker = `inv-ai-quote-${randomUUID().slice(0, 8)}`;
  model.script(marker, [{ tool: "quote", arguments: { invoice: `unknown-${marker}` } }, { text: "No such invoice." }]);
  const run = await inProcess(mission);
  const result = await agent(run.model, run.governed.tools, marker, run.governed.toolApproval);
  assert.equal(result.text, "No such invoice.");
  const told = model.of(marker)[1]?.told ?? [];
  assert.equal(told.length, 1);
  assert.match(told[0]!, new RegExp(`no invoice unknown-${marker}`), "the model was told the tool's error");
  const ops = new Charter({ baseUrl: world.url, credential: world.credential("ops") });
  const { items } = await ops.attempts({ run: run.segment.runId });
  const quote = items.find((a) => a.operation === "quote")!;
  assert.equal(quote.status, "failed");
  assert.deepEqual(quote.result, { error: `Error: no invoice unknown-${marker}`, shown: `no invoice unknown-${marker}` });
});

test("A3_R7_ai_sdk_a_payment_tools_error_proves_nothing_the_agent_stops_until_a_lookup_settles_it_and_the_model_is_told_the_payment", async () => {
  const mission = await world.agentsMission();
  const invoice = scripted("ai-unknown");
  await world.fault("drop_after_apply", { reference: invoice });
  const run = await inProcess(mission);
  const first = await agent(run.model, run.governed.tools, invoice, run.governed.toolApproval);
  assert.equal(first.content.filter((p) => p.type === "tool-approval-request").length, 1, "stopped, not told an error");
  assert.deepEqual(model.of(invoice).map((b) => b.step), [0], "the model was not told the tool failed");
  assert.equal((await world.payments(invoice)).length, 1, "the sandbox applied it before the connection dropped");
  const ops = new Charter({ baseUrl: world.url, credential: world.credential("ops") });
  const { items } = await ops.attempts({ run: run.segment.runId });
  const pay = items.find((a) => a.operation === "pay")!;
  assert.equal(pay.status, "unknown");
  const found = await ops.coordinator.reconcile(pay.id, run.governed.adapter);
  assert.equal(found.verdict, "applied");
  await ops.coordinator.confirm(pay.id);
  const second = await goOn(run, invoice, first.response.messages);
  assert.equal(second.text, `Paid ${invoice}.`);
  assert.equal((await world.payments(invoice)).length, 1, "never sent again");
  assert.match(model.of(invoice)[1]?.told[0] ?? "", new RegExp(invoice), "the model was told the payment the lookup found");
});

test("A6_ai_sdk_a_streamText_agent_run_again_replays_its_model_calls_and_tool_results_from_the_record", async () => {
  const { streamText, isStepCount } = await import("ai");
  const mission = await world.agentsMission();
  const invoice = scripted("ai-stream");
  const run = await inProcess(mission);
  const once = async (): Promise<string> => {
    const result = streamText({
      model: run.model,
      tools: run.governed.tools,
      toolApproval: run.governed.toolApproval,
      stopWhen: isStepCount(5),
      maxOutputTokens: 200,
      maxRetries: 0,
      prompt: `Pay invoice ${invoice}.`,
    });
    return result.text;
  };
  assert.equal(await once(), `Paid ${invoice}.`);
  assert.equal(await once(), `Paid ${invoice}.`, "the same answer, from the record");
  assert.deepEqual(model.of(invoice).map((b) => b.step), [0, 1], "each model call made once");
  assert.equal((await world.payments(invoice)).length, 1);
  const ops = new Charter({ baseUrl: world.url, credential: world.credential("ops") });
  const { items } = await ops.attempts({ run: run.segment.runId });
  assert.deepEqual(items.map((a) => `${a.adapter}.${a.operation}`).sort(), ["model.stream", "model.stream", "tools.pay"]);
});
