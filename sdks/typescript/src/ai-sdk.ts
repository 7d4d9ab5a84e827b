/**
 * Charter for the Vercel AI SDK (`ai` 7): an agent's tool executions and
 * model calls as attempts of a node, for `generateText` and `streamText`
 * agents with multi-step tool loops.
 *
 *     const model = charterModel(ctx, openai.chat("gpt-4o-mini"));
 *     const governed = charterTools(ctx, { quote, pay }, { effects: { quote: "read_only" } });
 *     const result = await generateText({ model, tools: governed.tools, toolApproval: governed.toolApproval,
 *                                         stopWhen: isStepCount(5), maxOutputTokens: 300, maxRetries: 0, prompt });
 *
 * - Model calls go through the SDK's language model middleware
 *   (`charterMiddleware`, or `charterModel` = `wrapLanguageModel` with it):
 *   `read_only` attempts `model.generate` / `model.stream`, keyed by the
 *   digest of what they ask, estimated from the prompt's size and
 *   `maxOutputTokens` (required), charged the usage the model reported in
 *   `input_tokens` and `output_tokens` (and money at a declared price). A
 *   streamed call is recorded whole and its parts replayed as a stream.
 * - Tool executions (`charterTools`, over a tool set) are attempts
 *   `tools.<name>` keyed by the tool call's id, of the effect class each
 *   tool declares (`unsafe` when undeclared). A `read_only` tool's error
 *   reaches the model as the SDK tells it (a `tool-error`, the same on
 *   replay); another tool's error is UNKNOWN and waits for evidence.
 * - Charter stopping a call (an approval, an exhausted allowance, an
 *   unknown outcome) is the SDK's tool approval: `toolApproval` answers
 *   `user-approval` with Charter's reason, `generateText` ends with a
 *   `tool-approval-request`, and once a person decided in Charter the
 *   program answers it (`tool-approval-response`) and calls `generateText`
 *   again: the call is sent once, or replayed. A call a person denied in
 *   Charter is the SDK's `denied`.
 * - After a crash the node runs the agent again with the same prompt: every
 *   recorded model answer and tool result comes back from its record.
 */

import { wrapLanguageModel } from "ai";
import type { LanguageModel, LanguageModelMiddleware, ToolApprovalStatus, ToolSet } from "ai";

import { AttemptFailed } from "./errors.js";
import type { Context } from "./segment.js";
import { ModelCalls, ToolCalls, jsonable, recordedFailure, stopsTheAgent } from "./integrations/calls.js";
import type { ModelOptions, ModelRequest, ToolOptions } from "./integrations/calls.js";

export { ModelCalls, ToolCalls, currentSend, stopsTheAgent } from "./integrations/calls.js";
export type { ModelOptions, ModelPrice, ModelRequest, ToolCost, ToolFailure, ToolLookup, ToolOptions, ToolRequest } from "./integrations/calls.js";

type Middleware = Exclude<LanguageModelMiddleware, undefined>;
type GenerateOptions = Parameters<NonNullable<Middleware["wrapGenerate"]>>[0];
type Params = GenerateOptions["params"];
type InnerModel = GenerateOptions["model"];
type Generated = Awaited<ReturnType<InnerModel["doGenerate"]>>;
type Streamed = Awaited<ReturnType<InnerModel["doStream"]>>;

/** The adapter an operator reconciles the model calls of `charterMiddleware` with. */
export function modelCalls(options: ModelOptions = {}): ModelCalls {
  return new ModelCalls(["generate", "stream"], options);
}

/**
 * The middleware that makes every call of a model an attempt of `ctx`'s
 * node. `key` names the agent in the node (default `agent`).
 */
export function charterMiddleware(ctx: Context, options: ModelOptions & { key?: string } = {}): Middleware {
  const calls = modelCalls(options);
  const key = options.key ?? "agent";
  const headers = (params: Params, idempotencyKey: string): Params => ({
    ...params,
    headers: { ...params.headers, "idempotency-key": idempotencyKey },
  });
  return {
    specificationVersion: "v4",
    async wrapGenerate({ params, model }) {
      const recorded = await calls.call(ctx, key, "generate", modelRequest(model, params), async (send) => {
        const answer = await model.doGenerate(headers(params, send.idempotencyKey));
        return { result: generated(answer), inputTokens: answer.usage.inputTokens.total, outputTokens: answer.usage.outputTokens.total };
      }, params.abortSignal);
      return revived(recorded) as Generated;
    },
    async wrapStream({ params, model }) {
      const recorded = await calls.call(ctx, key, "stream", modelRequest(model, params), async (send) => {
        const { stream, response } = await model.doStream(headers(params, send.idempotencyKey));
        const parts: unknown[] = [];
        let inputTokens: number | undefined;
        let outputTokens: number | undefined;
        const reader = stream.getReader();
        for (let read = await reader.read(); !read.done; read = await reader.read()) {
          const part = read.value;
          if (part.type === "finish") {
            inputTokens = part.usage.inputTokens.total;
            outputTokens = part.usage.outputTokens.total;
          }
          if (part.type !== "raw") parts.push(jsonable(part));
        }
        return { result: { parts, response: jsonable({ headers: response?.headers }) }, inputTokens, outputTokens };
      }, params.abortSignal);
      const parts = ((recorded as { parts?: unknown[] }).parts ?? []).map(revived);
      return {
        stream: new ReadableStream({
          start(controller) {
            for (const part of parts) controller.enqueue(part as never);
            controller.close();
          },
        }),
      } as Streamed;
    },
  };
}

/** `wrapLanguageModel({ model, middleware: charterMiddleware(ctx, options) })`. */
export function charterModel(ctx: Context, model: LanguageModel, options: ModelOptions & { key?: string } = {}): LanguageModel {
  if (typeof model === "string") throw new TypeError("give charterModel a model object (openai.chat(...)), not a gateway model id");
  return wrapLanguageModel({ model: model as never, middleware: charterMiddleware(ctx, options) });
}

/** What a call records: the fields that define it, from an allow-list, and its output limit. */
function modelRequest(model: InnerModel, params: Params): ModelRequest {
  return {
    model: model.modelId,
    provider: model.provider,
    prompt: jsonable(params.prompt),
    tools: jsonable(params.tools ?? []),
    tool_choice: jsonable(params.toolChoice ?? null),
    response_format: jsonable(params.responseFormat ?? null),
    settings: jsonable({
      temperature: params.temperature,
      topP: params.topP,
      topK: params.topK,
      presencePenalty: params.presencePenalty,
      frequencyPenalty: params.frequencyPenalty,
      stopSequences: params.stopSequences,
      seed: params.seed,
      reasoning: (params as { reasoning?: unknown }).reasoning,
      providerOptions: params.providerOptions,
    }),
    max_output_tokens: params.maxOutputTokens,
  };
}

/** What an answer records: what the SDK reads of it (never the raw bodies or headers). */
function generated(answer: Generated): unknown {
  return jsonable({
    content: answer.content,
    finishReason: answer.finishReason,
    usage: answer.usage,
    providerMetadata: answer.providerMetadata,
    response: { id: answer.response?.id, modelId: answer.response?.modelId, timestamp: answer.response?.timestamp },
    warnings: answer.warnings,
  });
}

/** A recorded answer or stream part as the SDK expects it: its timestamps as dates again. */
function revived(value: unknown): unknown {
  if (typeof value !== "object" || value === null) return value;
  const record = value as Record<string, unknown>;
  const response = record["response"] as Record<string, unknown> | undefined;
  if (response !== undefined && typeof response["timestamp"] === "string") {
    return { ...record, response: { ...response, timestamp: new Date(response["timestamp"]) } };
  }
  if (typeof record["timestamp"] === "string") return { ...record, timestamp: new Date(record["timestamp"]) };
  return record;
}

/** The adapter an operator reconciles a tool set's calls with: its executable tools, declared as `charterTools` declares them. */
export function toolCalls(tools: ToolSet, options: ToolOptions = {}): ToolCalls {
  return new ToolCalls(Object.keys(tools).filter((name) => typeof tools[name]?.execute === "function"), options);
}

/** A governed tool set: the tools, the approval function that stops the agent, and the adapter. */
export interface CharterTools<TOOLS extends ToolSet> {
  /** The tools, each execution an attempt of the node. */
  readonly tools: TOOLS;
  /**
   * `generateText`'s / `streamText`'s `toolApproval`: `user-approval` (with
   * Charter's reason) when Charter stopped the call for a person or for
   * evidence, `denied` when a person denied it in Charter.
   */
  readonly toolApproval: (options: { toolCall: { toolCallId: string; toolName: string; input: unknown } }) => Promise<ToolApprovalStatus>;
  /** The adapter an operator reconciles these tools' calls with (`coordinator.reconcile`). */
  readonly adapter: ToolCalls;
  /** Why Charter stopped a call, by tool call id (the error names the approval or the attempt). */
  readonly stopped: ReadonlyMap<string, Error>;
}

/**
 * Govern a tool set: each tool's `execute` an attempt of `ctx`'s node,
 * keyed by its tool call id. Tools without `execute` (run by the client or
 * the provider) are left as they are. `key` names the agent in the node
 * (default `agent`).
 */
export function charterTools<TOOLS extends ToolSet>(ctx: Context, tools: TOOLS, options: ToolOptions & { key?: string } = {}): CharterTools<TOOLS> {
  const adapter = toolCalls(tools, options);
  const executable = Object.keys(adapter.operations);
  const key = options.key ?? "agent";
  const pending = new Map<string, Promise<unknown>>();
  const stopped = new Map<string, Error>();

  const start = (name: string, callId: string, input: unknown, signal?: AbortSignal, messages?: unknown): Promise<unknown> => {
    const original = tools[name]!;
    const execute = original.execute as (input: unknown, options: unknown) => unknown;
    const invoke = async (): Promise<unknown> => {
      const output = await execute(input, { toolCallId: callId, messages: messages ?? [], abortSignal: signal, context: undefined });
      if (output !== null && typeof output === "object" && Symbol.asyncIterator in output) {
        let last: unknown;
        for await (const part of output as AsyncIterable<unknown>) last = part;
        return last;
      }
      return output;
    };
    const shown = (error: unknown): string => (error instanceof Error ? error.message : String(error));
    const call = adapter.call(ctx, key, name, callId, input, invoke, shown, signal);
    call.catch(() => undefined); // read by whichever of toolApproval and execute comes first
    return call;
  };

  const governed: Record<string, unknown> = {};
  for (const [name, original] of Object.entries(tools)) {
    if (!executable.includes(name)) {
      governed[name] = original;
      continue;
    }
    governed[name] = {
      ...original,
      async execute(input: unknown, execution: { toolCallId: string; abortSignal?: AbortSignal; messages?: unknown }) {
        const call = pending.get(execution.toolCallId) ?? start(name, execution.toolCallId, input, execution.abortSignal, execution.messages);
        pending.delete(execution.toolCallId);
        try {
          return await call;
        } catch (error) {
          const failure = recordedFailure(error);
          if (failure !== undefined) throw new Error(failure.shown); // the tool's failure, told to the model
          throw error;
        }
      },
    };
  }

  const toolApproval = async ({ toolCall }: { toolCall: { toolCallId: string; toolName: string; input: unknown } }): Promise<ToolApprovalStatus> => {
    if (!executable.includes(toolCall.toolName)) return "not-applicable";
    const call = start(toolCall.toolName, toolCall.toolCallId, toolCall.input);
    pending.set(toolCall.toolCallId, call);
    try {
      await call;
      stopped.delete(toolCall.toolCallId);
      return "not-applicable";
    } catch (error) {
      if (AttemptFailed.isInstance(error) && error.details["status"] === "voided") {
        return { type: "denied", reason: error.message };
      }
      if (!stopsTheAgent(error)) return "not-applicable"; // execute tells the model, or throws
      pending.delete(toolCall.toolCallId); // asked again once a person decided
      stopped.set(toolCall.toolCallId, error as Error);
      return { type: "user-approval", reason: (error as Error).message };
    }
  };

  return { tools: governed as TOOLS, toolApproval, adapter, stopped };
}
