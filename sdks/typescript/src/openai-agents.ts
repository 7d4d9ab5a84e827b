/**
 * Charter for the OpenAI Agents SDK for JavaScript (`@openai/agents` 0.20):
 * an agent run's function tool calls and model calls as attempts of a node,
 * as the Python integration makes them, with the SDK's human-in-the-loop
 * (interruptions, `RunState`) as the way Charter's stops reach the program.
 *
 *     const pay = charterTool({ name: "pay", description, parameters, execute, effect: "unsafe", cost, lookup });
 *     const runner = new Runner({ modelProvider: charterModels(new OpenAIProvider({ openAIClient, useResponses: false })) });
 *     let result = await inNode(ctx, () => runner.run(agent, "Pay invoice inv-1"));
 *     // a person decides in Charter, then:
 *     for (const item of result.interruptions) result.state.approve(item);
 *     result = await inNode(ctx, () => runner.run(agent, result.state));
 *
 * - A function tool built with `charterTool` (the SDK's `tool()` options,
 *   plus its effect class, cost and lookup) is called as an attempt
 *   `tools.<name>` keyed by its tool call id, `unsafe` unless declared. A
 *   `read_only` tool's error is told to the model as the SDK tells it (its
 *   `errorFunction`, or the SDK's default message; recorded, so a replay
 *   tells the same); another tool's error is UNKNOWN and waits for evidence.
 * - Model calls through `charterModels(provider)` are `read_only` attempts
 *   `model.response`, keyed by the digest of what they ask, estimated from
 *   the request's size and `modelSettings.maxTokens` (required), charged the
 *   usage the model reported.
 * - Charter stopping a tool call (an approval, an exhausted allowance, an
 *   unknown outcome) is the SDK's interruption: the run ends with a
 *   `RunToolApprovalItem` in `result.interruptions`; once a person decided
 *   in Charter, `state.approve(item)` and running the state again sends the
 *   call once, or replays it. A tool's own `needsApproval` still asks first.
 * - After a crash the node runs the agent again (or from a saved `RunState`):
 *   every recorded answer and tool result comes back from its record.
 */

import { AsyncLocalStorage } from "node:async_hooks";

import { Usage, tool as sdkTool } from "@openai/agents";
import type { FunctionTool, Model, ModelProvider, ModelRequest as SdkModelRequest, ModelResponse, RunContext } from "@openai/agents";

import type { Operation } from "./adapter.js";
import { UsageError } from "./errors.js";
import type { Amounts, EffectClass } from "./records.js";
import type { Context } from "./segment.js";
import { ModelCalls, ToolCalls, jsonable, recordedFailure, stopsTheAgent } from "./integrations/calls.js";
import type { ModelOptions, ModelRequest, ToolLookup } from "./integrations/calls.js";

export { ModelCalls, ToolCalls, currentSend, stopsTheAgent } from "./integrations/calls.js";
export type { ModelOptions, ModelPrice, ModelRequest, ToolCost, ToolFailure, ToolLookup, ToolOptions, ToolRequest } from "./integrations/calls.js";

/** The node an agent run is running in, and its calls in flight. */
interface Binding {
  ctx: Context;
  key: string;
  pending: Map<string, Promise<unknown>>;
}

const BINDING = new AsyncLocalStorage<Binding>();
/** Why Charter stopped a tool call, by node context and tool call id. */
const STOPPED = new WeakMap<Context, Map<string, Error>>();

/**
 * Why Charter stopped the tool call `callId` of `ctx`'s agent run (an
 * interruption's `rawItem.callId`): the error names the approval
 * (`details.approval_id`) or the attempt waiting for evidence.
 */
export function stoppedBy(ctx: Context, callId: string): Error | undefined {
  return STOPPED.get(ctx)?.get(callId);
}

/**
 * Run `work` (a `runner.run(...)`, or `run(...)`) as node `ctx`'s agent run:
 * its governed tool calls and model calls are attempts of that node. `key`
 * names the agent run in the node (default `agent`).
 */
export function inNode<T>(ctx: Context, work: () => Promise<T>, options: { key?: string } = {}): Promise<T> {
  return BINDING.run({ ctx, key: options.key ?? "agent", pending: new Map() }, work);
}

function binding(what: string): Binding {
  const found = BINDING.getStore();
  if (found === undefined) throw new UsageError(`${what} is called outside a node: run the agent inside inNode(ctx, ...)`);
  return found;
}

/** What `charterTool` takes besides the SDK's `tool()` options. */
export interface CharterToolOptions<Args = any> {
  /** The tool's effect class; `unsafe` when absent (an uncertain call is never repeated). */
  effect?: EffectClass;
  /** For an `idempotent_keyed` tool: how long its target deduplicates by the key (`currentSend().idempotencyKey`). */
  dedupeWindowSeconds?: number;
  /** Its estimate, charged as its cost when it succeeds: fixed amounts, or a function of its arguments. */
  cost?: Amounts | ((args: Args) => Amounts);
  /** How to find out what became of an uncertain call (`coordinator.reconcile(id, toolCalls([...]))`). */
  lookup?: ToolLookup;
  /** The adapter's name: the tool's scope is `<adapter>.<name>` (default `tools`). */
  adapter?: string;
}

const DECLARED = new WeakMap<object, { name: string; operation: Operation; options: CharterToolOptions }>();

type SdkToolOptions = Parameters<typeof sdkTool>[0];

/**
 * The SDK's `tool()`, each call an attempt of the node it runs in (see the
 * module's text). Its `errorFunction` (or the SDK's default message) says
 * what the model is told when a `read_only` tool raises.
 */
export function charterTool<T extends SdkToolOptions>(options: T & CharterToolOptions): FunctionTool<any, any, any> {
  const { effect, dedupeWindowSeconds, cost, lookup, adapter, ...sdk } = options;
  const raw = sdkTool({ ...(sdk as SdkToolOptions), errorFunction: null } as SdkToolOptions) as FunctionTool<any, any, any>;
  const told = (sdk as { errorFunction?: ((ctx: RunContext<any>, error: unknown) => unknown) | null }).errorFunction;
  const operation: Operation = { effect: effect ?? "unsafe" };
  if (dedupeWindowSeconds !== undefined) operation.dedupeWindowSeconds = dedupeWindowSeconds;
  const charterOptions: CharterToolOptions = { effect, dedupeWindowSeconds, cost, lookup, adapter };
  const calls = toolCallsOf([{ name: raw.name, operation, options: charterOptions }]);

  const start = (bound: Binding, runContext: RunContext<any>, input: string, callId: string, details?: object): Promise<unknown> => {
    let args: unknown;
    try {
      args = JSON.parse(input === "" ? "{}" : input);
    } catch {
      args = input; // the SDK tells the model its arguments are not JSON; recorded as sent
    }
    const shown = async (error: unknown): Promise<string> => {
      if (typeof told === "function") return String(await told(runContext, error));
      return `An error occurred while running the tool. Please try again. Error: ${error instanceof Error ? error.message : String(error)}`;
    };
    const invoke = (): Promise<unknown> => raw.invoke(runContext, input, details as never);
    const call = calls.call(bound.ctx, bound.key, raw.name, callId, args, invoke, shown, (details as { signal?: AbortSignal } | undefined)?.signal);
    call.catch(() => undefined); // read by whichever of needsApproval and invoke comes first
    return call;
  };

  const governed: FunctionTool<any, any, any> = {
    ...raw,
    async needsApproval(runContext, input, callId) {
      if (await raw.needsApproval(runContext, input, callId)) return true; // the tool's own approval asks first
      const bound = binding(`tool ${raw.name}`);
      const id = callId ?? "";
      const call = start(bound, runContext, JSON.stringify(input ?? {}), id);
      bound.pending.set(`${raw.name}:${id}`, call);
      const stops = STOPPED.get(bound.ctx) ?? new Map<string, Error>();
      STOPPED.set(bound.ctx, stops);
      try {
        await call;
        stops.delete(id);
        return false;
      } catch (error) {
        if (!stopsTheAgent(error)) return false; // invoke tells the model, or throws
        bound.pending.delete(`${raw.name}:${id}`); // asked again once a person decided
        stops.set(id, error as Error);
        return true;
      }
    },
    async invoke(runContext, input, details) {
      const bound = binding(`tool ${raw.name}`);
      const id = details?.toolCall?.callId ?? "";
      const key = `${raw.name}:${id}`;
      const call = bound.pending.get(key) ?? start(bound, runContext, input, id, details);
      bound.pending.delete(key);
      try {
        return await call;
      } catch (error) {
        const failure = recordedFailure(error);
        if (failure !== undefined) return failure.shown; // the tool's failure, told to the model
        throw error;
      }
    },
  };
  DECLARED.set(governed, { name: raw.name, operation, options: charterOptions });
  return governed;
}

/** The adapter an operator reconciles these governed tools' calls with (their lookups). */
export function toolCalls(tools: readonly FunctionTool<any, any, any>[]): ToolCalls {
  return toolCallsOf(
    tools.map((t) => {
      const declared = DECLARED.get(t);
      if (declared === undefined) throw new UsageError(`tool ${JSON.stringify(t.name)} was not built with charterTool`);
      return declared;
    }),
  );
}

function toolCallsOf(declared: readonly { name: string; operation: Operation; options: CharterToolOptions }[]): ToolCalls {
  const names = new Set(declared.map((d) => d.options.adapter ?? "tools"));
  if (names.size > 1) throw new UsageError(`these tools name different adapters: ${[...names].join(", ")}`);
  const pick = <V>(get: (d: (typeof declared)[number]) => V | undefined): Record<string, V> =>
    Object.fromEntries(declared.flatMap((d) => (get(d) === undefined ? [] : [[d.name, get(d) as V]])));
  return new ToolCalls(
    declared.map((d) => d.name),
    { name: [...names][0], effects: pick((d) => d.operation), costs: pick((d) => d.options.cost), lookups: pick((d) => d.options.lookup) },
  );
}

/** A model provider whose models' calls are attempts, and the adapter an operator reconciles them with. */
export interface CharterModels extends ModelProvider {
  readonly adapter: ModelCalls;
}

/** `provider`'s models, each `getResponse` an attempt of the node the agent runs in. */
export function charterModels(provider: ModelProvider, options: ModelOptions = {}): CharterModels {
  const adapter = new ModelCalls(["response"], options);
  return {
    adapter,
    async getModel(name?: string): Promise<Model> {
      const model = await provider.getModel(name);
      const label = name ?? "default";
      return {
        async getResponse(request: SdkModelRequest): Promise<ModelResponse> {
          const bound = binding(`model ${label}`);
          const recorded = await adapter.call(bound.ctx, bound.key, "response", modelRequest(label, request), async () => {
            const answer = await model.getResponse(request);
            return {
              result: jsonable({ usage: answer.usage, output: answer.output, responseId: answer.responseId, providerData: answer.providerData }),
              inputTokens: answer.usage.inputTokens,
              outputTokens: answer.usage.outputTokens,
            };
          }, request.signal);
          const response = recorded as { usage: ConstructorParameters<typeof Usage>[0] } & Omit<ModelResponse, "usage">;
          return { ...response, usage: new Usage(response.usage) };
        },
        getStreamedResponse(): AsyncIterable<never> {
          throw new UsageError("a streamed agent run is not governed call by call: run it without stream: true");
        },
      };
    },
  };
}

/** What a model call records: the fields that define it, and its output limit. */
function modelRequest(model: string, request: SdkModelRequest): ModelRequest {
  const settings = request.modelSettings;
  return {
    model,
    instructions: request.systemInstructions ?? null,
    input: jsonable(request.input),
    tools: jsonable(request.tools),
    handoffs: jsonable(request.handoffs.map((h) => h.toolName)),
    output_type: jsonable(request.outputType),
    settings: jsonable({
      temperature: settings.temperature,
      topP: settings.topP,
      frequencyPenalty: settings.frequencyPenalty,
      presencePenalty: settings.presencePenalty,
      toolChoice: settings.toolChoice,
      parallelToolCalls: settings.parallelToolCalls,
      truncation: settings.truncation,
      maxTokens: settings.maxTokens,
      reasoning: settings.reasoning,
      text: settings.text,
      providerData: settings.providerData,
    }),
    previous_response_id: request.previousResponseId ?? null,
    conversation_id: request.conversationId ?? null,
    max_output_tokens: settings.maxTokens,
  };
}
