/**
 * An OpenAI Agents SDK agent that pays an invoice through the payments
 * sandbox, on Charter (`@charter/sdk/openai-agents`), and the same agent
 * without it.
 *
 *     node build/examples/openai_agents_agent.js pay INVOICE          # as the agent: a run, the agent in node "agent"
 *     node build/examples/openai_agents_agent.js resume RUN INVOICE   # as ops, after the first died: recover, look up, resume
 *     node build/examples/openai_agents_agent.js plain INVOICE        # the same agent without Charter, started again by hand
 *
 * Environment: CHARTER_URL, CHARTER_CREDENTIAL (NAME:SECRET), CHARTER_MISSION,
 * SANDBOX_URL (`charter sandbox`), OPENAI_BASE_URL (an OpenAI-compatible API).
 * Each step prints one JSON line.
 *
 * The agent's model is the SDK's Chat Completions model behind
 * `charterModels` (token usage into the ledger); `pay` is a `charterTool`,
 * an attempt keyed by its tool call id, sent with the attempt's idempotency
 * key. Killed after the sandbox applied the payment and before the tool's
 * answer was recorded, the run is recovered in a fresh process: the payment
 * is found at the sandbox by its key, and the agent, run again, gets the
 * model's recorded tool call and the payment back from their records. Without
 * Charter the agent run again asks the model again and pays again.
 */

import { randomUUID } from "node:crypto";
import { fileURLToPath } from "node:url";

import { Agent, OpenAIProvider, Runner, setTracingDisabled, tool } from "@openai/agents";
import type { FunctionTool, ModelProvider } from "@openai/agents";
import OpenAI from "openai";
import { z } from "zod";

import { Charter, Segment } from "../src/index.js";
import { charterModels, charterTool, currentSend, inNode, toolCalls } from "../src/openai-agents.js";
import { Payments } from "./payments.js";

setTracingDisabled(true); // the SDK sends traces to OpenAI by default

function env(name: string): string {
  const value = process.env[name];
  if (value === undefined || value === "") throw new Error(`${name} is not set (see the top of openai_agents_agent.ts)`);
  return value;
}

function say(step: string, fields: Record<string, unknown> = {}): void {
  process.stdout.write(`${JSON.stringify({ step, ...fields })}\n`);
}

const QUOTE = {
  name: "quote",
  description: "The amount due on an invoice, in cents.",
  parameters: z.object({ invoice: z.string() }),
  execute: async ({ invoice }: { invoice: string }) => {
    if (invoice.startsWith("unknown-")) throw new Error(`no invoice ${invoice}`);
    return { invoice, amount: 1200 };
  },
};

function payTool(sandbox: string, key: () => string) {
  return {
    name: "pay",
    description: "Pay an invoice.",
    parameters: z.object({ invoice: z.string(), amount: z.number().int() }),
    execute: async ({ invoice, amount }: { invoice: string; amount: number }) => {
      say("paying", { invoice });
      const answer = await fetch(`${sandbox}/v1/payments`, {
        method: "POST",
        headers: { "content-type": "application/json", "idempotency-key": key() },
        body: JSON.stringify({ amount, currency: "usd", payee: "acme", reference: invoice }),
      });
      if (!answer.ok) throw new Error(`the payments API answered ${answer.status}`);
      return (await answer.json()) as Record<string, unknown>;
    },
  };
}

/** The tools on Charter: `quote` read-only, `pay` keyed by the sandbox, costed and looked up by key. */
export function governedTools(sandbox: string): FunctionTool<any, any, any>[] {
  const payments = new Payments(sandbox);
  return [
    charterTool({ ...QUOTE, effect: "read_only" }),
    charterTool({
      ...payTool(sandbox, () => currentSend().idempotencyKey),
      effect: "idempotent_keyed",
      dedupeWindowSeconds: 86_400,
      cost: (args: { amount: number }) => ({ usd_cents: args.amount }),
      lookup: (attempt, options) => payments.lookup(attempt, options),
    }),
  ];
}

/** The SDK's OpenAI provider on Chat Completions at `baseURL`, its client's retries off. */
export function provider(baseURL: string): ModelProvider {
  return new OpenAIProvider({ openAIClient: new OpenAI({ baseURL, apiKey: "sk-test", maxRetries: 0 }), useResponses: false });
}

/** The clerk: pays the invoice it is asked to pay. */
export function clerk(tools: FunctionTool<any, any, any>[]): Agent {
  return new Agent({ name: "clerk", instructions: "Pay the invoice.", model: "gpt-4o-mini", modelSettings: { maxTokens: 200 }, tools });
}

async function runAgent(segment: Segment, invoice: string): Promise<void> {
  const ctx = await segment.startNode("agent");
  say("node_started", { execution: ctx.execution });
  const runner = new Runner({ modelProvider: charterModels(provider(env("OPENAI_BASE_URL"))) });
  const result = await inNode(ctx, () => runner.run(clerk(governedTools(env("SANDBOX_URL"))), `Pay invoice ${invoice}.`));
  if (result.interruptions.length > 0) {
    say("stopped", { state: result.state.toString() });
    return;
  }
  say("answered", { text: String(result.finalOutput) });
  const completed = await ctx.complete({ text: String(result.finalOutput) });
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
  const lookups = toolCalls(governedTools(env("SANDBOX_URL")));
  for (const attemptId of unresolved) {
    const found = await coordinator.reconcile(attemptId, lookups);
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
  const tools = [tool(QUOTE), tool(payTool(env("SANDBOX_URL"), () => randomUUID()))];
  const runner = new Runner({ modelProvider: provider(env("OPENAI_BASE_URL")) });
  const result = await runner.run(clerk(tools as FunctionTool<any, any, any>[]), `Pay invoice ${invoice}.`);
  say("answered", { text: String(result.finalOutput) });
}

if (process.argv[1] === fileURLToPath(import.meta.url)) {
  const [command, first, second] = process.argv.slice(2);
  let main: Promise<void>;
  if (command === "pay" && first !== undefined) main = pay(first);
  else if (command === "resume" && first !== undefined && second !== undefined) main = resume(first, second);
  else if (command === "plain" && first !== undefined) main = plain(first);
  else {
    process.stderr.write("usage: openai_agents_agent.js pay INVOICE | resume RUN INVOICE | plain INVOICE\n");
    process.exit(2);
  }
  main.catch((error: unknown) => {
    say("failed", { error: error instanceof Error ? `${error.name}: ${error.message}` : String(error) });
    process.exit(1);
  });
}
