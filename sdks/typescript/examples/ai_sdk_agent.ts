/**
 * A Vercel AI SDK agent that pays an invoice through the payments sandbox, on
 * Charter (`@charter/sdk/ai-sdk`), and the same agent without it.
 *
 *     node build/examples/ai_sdk_agent.js pay INVOICE           # as the agent: a run, the agent in node "agent"
 *     node build/examples/ai_sdk_agent.js resume RUN INVOICE    # as ops, after the first died: recover, look up, resume
 *     node build/examples/ai_sdk_agent.js plain INVOICE         # the same agent without Charter, started again by hand
 *
 * Environment: CHARTER_URL, CHARTER_CREDENTIAL (NAME:SECRET), CHARTER_MISSION,
 * SANDBOX_URL (`charter sandbox`), OPENAI_BASE_URL (an OpenAI-compatible API).
 * Each step prints one JSON line.
 *
 * The agent is `generateText` with a multi-step tool loop: the model asks for
 * `pay`, the tool pays, the model says it is done. On Charter the model's
 * calls go through `charterModel` (token usage into the ledger) and `pay` is
 * an attempt keyed by its tool call id, sent with the attempt's idempotency
 * key. Killed after the sandbox applied the payment and before the tool's
 * answer was recorded, the run is recovered in a fresh process: the payment
 * is found at the sandbox by its key, and the agent, run again with the same
 * prompt, gets the model's recorded tool call and the payment back from their
 * records, and asks the model only what it never asked. Without Charter the
 * agent run again asks the model again and pays again under a new key.
 */

import { randomUUID } from "node:crypto";
import { fileURLToPath } from "node:url";

import { createOpenAI } from "@ai-sdk/openai";
import { generateText, isStepCount, tool } from "ai";
import type { LanguageModel, ToolSet } from "ai";
import { z } from "zod";

import { Charter, Segment } from "../src/index.js";
import type { Context } from "../src/index.js";
import { charterModel, charterTools, currentSend, toolCalls } from "../src/ai-sdk.js";
import type { CharterTools, ToolOptions } from "../src/ai-sdk.js";
import { Payments } from "./payments.js";

function env(name: string): string {
  const value = process.env[name];
  if (value === undefined || value === "") throw new Error(`${name} is not set (see the top of ai_sdk_agent.ts)`);
  return value;
}

function say(step: string, fields: Record<string, unknown> = {}): void {
  process.stdout.write(`${JSON.stringify({ step, ...fields })}\n`);
}

/** The agent's tools: `quote` reads an invoice's amount, `pay` pays it through the sandbox. */
export function agentTools(sandbox: string, key: () => string): ToolSet {
  return {
    quote: tool({
      description: "The amount due on an invoice, in cents.",
      inputSchema: z.object({ invoice: z.string() }),
      execute: async ({ invoice }) => {
        if (invoice.startsWith("unknown-")) throw new Error(`no invoice ${invoice}`);
        return { invoice, amount: 1200 };
      },
    }),
    pay: tool({
      description: "Pay an invoice.",
      inputSchema: z.object({ invoice: z.string(), amount: z.number().int() }),
      execute: async ({ invoice, amount }) => {
        say("paying", { invoice });
        const answer = await fetch(`${sandbox}/v1/payments`, {
          method: "POST",
          headers: { "content-type": "application/json", "idempotency-key": key() },
          body: JSON.stringify({ amount, currency: "usd", payee: "acme", reference: invoice }),
        });
        if (!answer.ok) throw new Error(`the payments API answered ${answer.status}`);
        return (await answer.json()) as Record<string, unknown>;
      },
    }),
  };
}

/** The model: the OpenAI provider's Chat Completions model at OPENAI_BASE_URL. */
export function chatModel(baseURL: string): Exclude<LanguageModel, string> {
  return createOpenAI({ baseURL, apiKey: "sk-test" }).chat("gpt-4o-mini");
}

/** What Charter is told of the tools: `quote` read-only, `pay` keyed by the sandbox, costed and looked up by key. */
export function declared(sandbox: string): ToolOptions {
  const payments = new Payments(sandbox);
  return {
    effects: { quote: "read_only", pay: { effect: "idempotent_keyed", dedupeWindowSeconds: 86_400 } },
    costs: { pay: (args: { amount: number }) => ({ usd_cents: args.amount }) },
    lookups: { pay: (attempt, options) => payments.lookup(attempt, options) },
  };
}

/** The tools on Charter, each call an attempt of `ctx`'s node sent with its own key. */
export function governedTools(ctx: Context, sandbox: string): CharterTools<ToolSet> {
  return charterTools(ctx, agentTools(sandbox, () => currentSend().idempotencyKey), declared(sandbox));
}

/** One agent run: the invoice paid, in as many steps as the model takes. */
export async function agent(model: LanguageModel, tools: ToolSet, invoice: string, toolApproval?: CharterTools<ToolSet>["toolApproval"]) {
  return generateText({
    model,
    tools,
    ...(toolApproval === undefined ? {} : { toolApproval }),
    stopWhen: isStepCount(5),
    maxOutputTokens: 200,
    maxRetries: 0, // every call that leaves is an attempt
    prompt: `Pay invoice ${invoice}.`,
  });
}

async function runAgent(segment: Segment, invoice: string): Promise<void> {
  const ctx = await segment.startNode("agent");
  say("node_started", { execution: ctx.execution });
  const governed = governedTools(ctx, env("SANDBOX_URL"));
  const result = await agent(charterModel(ctx, chatModel(env("OPENAI_BASE_URL"))), governed.tools, invoice, governed.toolApproval);
  const waiting = result.content.filter((part) => part.type === "tool-approval-request");
  if (waiting.length > 0) {
    say("stopped", { reasons: waiting.map((part) => part.reason ?? null) });
    return;
  }
  say("answered", { text: result.text });
  const completed = await ctx.complete({ text: result.text });
  say("node_completed", { result_hash: completed.result_hash });
  const run = await segment.finish();
  say("finished", { run_id: run.id, status: run.status });
}

async function pay(invoice: string): Promise<void> {
  const charter = new Charter({ baseUrl: env("CHARTER_URL"), credential: env("CHARTER_CREDENTIAL") });
  const segment = await Segment.start(charter, env("CHARTER_MISSION"), `agent-${randomUUID().slice(0, 8)}`, { invoice });
  segment.keepRenewing();
  say("started", { run_id: segment.runId, pid: process.pid });
  await runAgent(segment, invoice);
}

async function resume(runId: string, invoice: string): Promise<void> {
  const charter = new Charter({ baseUrl: env("CHARTER_URL"), credential: env("CHARTER_CREDENTIAL") });
  const { coordinator } = charter;
  const segmentId = `resume-${randomUUID().slice(0, 8)}`;
  const { unresolved } = await coordinator.recover(runId, segmentId, { force: true });
  say("recovered", { unresolved });
  const lookup = toolCalls(agentTools(env("SANDBOX_URL"), () => currentSend().idempotencyKey), declared(env("SANDBOX_URL")));
  for (const attemptId of unresolved) {
    const found = await coordinator.reconcile(attemptId, lookup);
    say("reconciled", { attempt_id: attemptId, verdict: found.verdict });
    if (found.verdict === "indeterminate") return say("needs_a_person", { attempt_id: attemptId });
    await coordinator.confirm(attemptId);
  }
  const segment = await coordinator.resume(runId, segmentId);
  segment.keepRenewing();
  say("resumed", { segment: segment.name });
  await runAgent(segment, invoice);
}

async function plain(invoice: string): Promise<void> {
  const tools = agentTools(env("SANDBOX_URL"), () => randomUUID());
  const result = await agent(chatModel(env("OPENAI_BASE_URL")), tools, invoice);
  say("answered", { text: result.text });
}

if (process.argv[1] === fileURLToPath(import.meta.url)) {
  const [command, first, second] = process.argv.slice(2);
  let main: Promise<void>;
  if (command === "pay" && first !== undefined) main = pay(first);
  else if (command === "resume" && first !== undefined && second !== undefined) main = resume(first, second);
  else if (command === "plain" && first !== undefined) main = plain(first);
  else {
    process.stderr.write("usage: ai_sdk_agent.js pay INVOICE | resume RUN INVOICE | plain INVOICE\n");
    process.exit(2);
  }
  main.catch((error: unknown) => {
    say("failed", { error: error instanceof Error ? `${error.name}: ${error.message}` : String(error) });
    process.exit(1);
  });
}
