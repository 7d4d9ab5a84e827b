/**
 * What the framework integrations (`@charter/sdk/ai-sdk`,
 * `@charter/sdk/openai-agents`) share: an agent's tool calls and model calls
 * as attempts of a node. Each call is one `ctx.attempt`: admitted against the
 * allowance and written down before it is made, made here by the framework's
 * own code (the adapter's `dispatch` is the call itself, handed over per
 * call), settled by what it answered, and replayed from its record when the
 * node runs again.
 *
 * The rules are the Python integrations' (docs/integrations.md): a tool's
 * effect class is declared (`unsafe` when it is not: an uncertain call is never
 * repeated), a tool call is keyed by the framework's tool-call id and a model
 * call by a digest of what it asks (both the same when the framework resumes
 * or replays), and a tool's error is read by the A3 rule: a `read_only`
 * tool's call settles FAILED and the model is told; any other tool's error
 * proves nothing (the tool may have acted before raising), so its call is
 * UNKNOWN and waits for a lookup or a person.
 */

import { AsyncLocalStorage } from "node:async_hooks";
import { createHash } from "node:crypto";

import type { Adapter, Dispatch, Estimate, Evidence, Operation, Outcome } from "../adapter.js";
import { AdmissionRefused, ApprovalRequired, AttemptFailed, Blocked, NotApplied, OutcomeUnknown, UsageError } from "../errors.js";
import type { Amounts, Attempt, EffectClass } from "../records.js";
import type { Context } from "../segment.js";

/** What a tool call records: its arguments, whole. */
export interface ToolRequest {
  arguments: unknown;
}

/** A tool call's estimate (and cost, once made): fixed amounts, or a function of its arguments. */
export type ToolCost = Amounts | ((args: any) => Amounts);

/** How to find out what became of a tool's uncertain call (`coordinator.reconcile`). */
export type ToolLookup = (attempt: Attempt, options?: { signal?: AbortSignal }) => Promise<Evidence>;

export interface ToolOptions {
  /** Each tool's effect class (or an `Operation`, for an `idempotent_keyed` tool's window); `unsafe` when absent. */
  effects?: Readonly<Record<string, EffectClass | Operation>>;
  /** Each tool's estimate, charged as its cost when it succeeds. */
  costs?: Readonly<Record<string, ToolCost>>;
  /** Each tool's lookup, for a call whose outcome is unknown. */
  lookups?: Readonly<Record<string, ToolLookup>>;
  /** The adapter's name: a tool's scope is `<name>.<tool>` (default `tools`). */
  name?: string;
}

/** What a `read_only` tool's recorded failure keeps: the error, and what the model was told. */
export interface ToolFailure {
  error: string;
  shown: string;
}

const SENDING = new AsyncLocalStorage<Dispatch>();

/**
 * The attempt a tool call is being made as: its idempotency key and fencing
 * token, for a tool whose target deduplicates or fences by them. Only inside
 * a governed tool's call.
 */
export function currentSend(): Dispatch {
  const send = SENDING.getStore();
  if (send === undefined) {
    throw new UsageError("currentSend() is for a tool called through Charter; this code is not inside one");
  }
  return send;
}

/** Whether `error` is Charter stopping the agent for a person or for evidence, never a failure to tell the model. */
export function stopsTheAgent(error: unknown): boolean {
  return ApprovalRequired.isInstance(error) || AdmissionRefused.isInstance(error) || Blocked.isInstance(error);
}

/**
 * An agent's tools as one adapter: an operation per tool, each with its
 * effect class, estimate and lookup. `call` makes one tool call an attempt of
 * a node, the framework's own invocation being what the attempt sends.
 */
export class ToolCalls implements Adapter<ToolRequest, unknown> {
  readonly name: string;
  readonly operations: Readonly<Record<string, Operation>>;
  readonly #costs: Readonly<Record<string, ToolCost>>;
  readonly #lookups: Readonly<Record<string, ToolLookup>>;

  constructor(tools: readonly string[], options: ToolOptions = {}) {
    this.name = options.name ?? "tools";
    const effects = options.effects ?? {};
    for (const declared of Object.keys(effects)) {
      if (!tools.includes(declared)) throw new UsageError(`effects names ${JSON.stringify(declared)}, which is not one of the tools`);
    }
    const operations: Record<string, Operation> = {};
    for (const tool of tools) {
      const effect = effects[tool] ?? "unsafe";
      operations[tool] = typeof effect === "string" ? { effect } : effect;
      if (operations[tool].effect === "idempotent_keyed" && operations[tool].dedupeWindowSeconds === undefined) {
        throw new UsageError(`tool ${JSON.stringify(tool)} is idempotent_keyed: give its dedupeWindowSeconds ({ effect, dedupeWindowSeconds })`);
      }
    }
    this.operations = operations;
    this.#costs = options.costs ?? {};
    this.#lookups = options.lookups ?? {};
  }

  estimate(operation: string, request: ToolRequest): Estimate {
    const cost = this.#costs[operation] ?? {};
    return { amounts: typeof cost === "function" ? cost(request.arguments) : cost, priceSource: `${this.name}/declared` };
  }

  async dispatch(): Promise<Outcome> {
    // Each call hands its own send to `call`; this one is reached only by a
    // reconcile or a replay that asks the adapter to send, which it never does.
    throw new NotApplied("a tool call is made from its agent run, never from here");
  }

  async lookup(attempt: Attempt, options: { signal?: AbortSignal } = {}): Promise<Evidence> {
    const lookup = this.#lookups[attempt.operation];
    if (lookup === undefined) return { verdict: "indeterminate", detail: { tools: `${attempt.operation}: no lookup declared` } };
    return lookup(attempt, options);
  }

  /**
   * Make one tool call an attempt of `ctx`'s node, keyed by its tool-call id
   * (`<key>:tool:<id>`): `invoke` is the framework's own call of the tool,
   * made only when the attempt is sent. A `read_only` tool's error settles
   * the call FAILED with `shown(error)` recorded (what the model is told,
   * live and on replay alike: `AttemptFailed` carries it); any other tool's
   * error leaves it UNKNOWN, the error kept as evidence.
   */
  async call(
    ctx: Context,
    key: string,
    tool: string,
    callId: string,
    args: unknown,
    invoke: () => Promise<unknown>,
    shown: (error: unknown) => string | Promise<string>,
    signal?: AbortSignal,
  ): Promise<unknown> {
    if (this.operations[tool] === undefined) throw new UsageError(`no tool ${JSON.stringify(tool)} is governed here`);
    const read = this.operations[tool].effect === "read_only";
    const sending: Adapter<ToolRequest, unknown> = {
      name: this.name,
      operations: this.operations,
      estimate: (operation, request) => this.estimate(operation, request),
      lookup: (attempt, options) => this.lookup(attempt, options),
      dispatch: async (send) => {
        send.checkDeadline();
        let output: unknown;
        try {
          output = await SENDING.run(send, invoke);
        } catch (error) {
          if (NotApplied.isInstance(error) || OutcomeUnknown.isInstance(error)) throw error;
          const failure: ToolFailure = { error: describe(error), shown: await shown(error) };
          if (read) return { status: "failed", result: failure };
          throw new OutcomeUnknown(`tool ${tool} raised ${failure.error}`, { ...failure });
        }
        return { status: "succeeded", result: jsonable(output), cost: this.estimate(tool, send.request).amounts };
      },
    };
    const request: ToolRequest = { arguments: jsonable(args) };
    return ctx.attempt(sending, tool, request, { key: `${key}:tool:${callId}`, signal });
  }
}

/** The message a `read_only` tool's recorded failure told the model, if the error is one. */
export function recordedFailure(error: unknown): ToolFailure | undefined {
  if (!AttemptFailed.isInstance(error)) return undefined;
  const result = error.details["result"] as Partial<ToolFailure> | null | undefined;
  return typeof result?.shown === "string" && typeof result.error === "string" ? (result as ToolFailure) : undefined;
}

/** Token usage as the ledger counts it, and the money it costs at the declared prices. */
export interface ModelPrice {
  /** The money unit, as the mission's allowance names it (e.g. `usd_micros`). */
  unit: string;
  /** The price of a million input tokens, in that unit's smallest step. */
  inputPerMillion: number;
  /** The price of a million output tokens, in that unit's smallest step. */
  outputPerMillion: number;
}

export interface ModelOptions {
  /** The adapter's name: a model call's scope is `<name>.<operation>` (default `model`). */
  name?: string;
  /** A price per million tokens, charged beside the token units; tokens only without it. */
  price?: ModelPrice;
  /** How to find out what a lost call was billed (default: nothing found; a person resolves it). */
  lookup?: ToolLookup;
}

/**
 * A framework's model calls as one adapter of `read_only` operations:
 * estimated as an upper bound (the request's UTF-8 size bounds its input
 * tokens, its output limit bounds the rest: a call without one is refused
 * before anything is recorded), charged the usage the model reported, in
 * `input_tokens` and `output_tokens` (and money at `price`).
 */
export class ModelCalls implements Adapter<ModelRequest, unknown> {
  readonly name: string;
  readonly operations: Readonly<Record<string, Operation>>;
  readonly #price: ModelPrice | undefined;
  readonly #lookup: ToolLookup | undefined;

  constructor(operations: readonly string[], options: ModelOptions = {}) {
    this.name = options.name ?? "model";
    this.operations = Object.fromEntries(operations.map((op) => [op, { effect: "read_only" as const }]));
    this.#price = options.price;
    this.#lookup = options.lookup;
  }

  estimate(_operation: string, request: ModelRequest): Estimate {
    const limit = request.max_output_tokens;
    if (typeof limit !== "number" || !Number.isSafeInteger(limit) || limit <= 0) {
      throw new UsageError(
        "a model call needs an output limit to be estimated (maxOutputTokens in the AI SDK, modelSettings.maxTokens in the Agents SDK)",
      );
    }
    const input = Buffer.byteLength(JSON.stringify(request), "utf8");
    return { amounts: this.charge(input, limit), priceSource: this.#source() };
  }

  /** What `input` and `output` tokens cost, per unit. */
  charge(input: number, output: number): Amounts {
    const amounts: Amounts = { input_tokens: input, output_tokens: output };
    if (this.#price !== undefined) {
      const { unit, inputPerMillion, outputPerMillion } = this.#price;
      amounts[unit] = Math.ceil((input * inputPerMillion + output * outputPerMillion) / 1_000_000);
    }
    return amounts;
  }

  #source(): string {
    const price = this.#price;
    return price === undefined ? `${this.name}/tokens` : `${this.name}/declared ${price.unit} ${price.inputPerMillion}/${price.outputPerMillion} per million`;
  }

  async dispatch(): Promise<Outcome> {
    throw new NotApplied("a model call is made from its agent run, never from here");
  }

  async lookup(attempt: Attempt, options: { signal?: AbortSignal } = {}): Promise<Evidence> {
    if (this.#lookup === undefined) return { verdict: "indeterminate", detail: { model: "no usage lookup by key: a person resolves it" } };
    return this.#lookup(attempt, options);
  }

  /**
   * Make one model call an attempt of `ctx`'s node, keyed by the digest of
   * its recorded request (`<key>:model:<digest>`): the same conversation asks
   * the same, whether the agent runs again after a crash or resumes after a
   * person's decision. `send` makes the call and says what it answered and
   * what it used; a call that fails is UNKNOWN unless the model refused it
   * before processing (a 4xx but 408), which proves it was not billed.
   */
  async call(
    ctx: Context,
    key: string,
    operation: string,
    request: ModelRequest,
    send: (dispatch: Dispatch<ModelRequest>) => Promise<{ result: unknown; inputTokens?: number | undefined; outputTokens?: number | undefined }>,
    signal?: AbortSignal,
  ): Promise<unknown> {
    const sending: Adapter<ModelRequest, unknown> = {
      name: this.name,
      operations: this.operations,
      estimate: (op, asked) => this.estimate(op, asked),
      lookup: (attempt, options) => this.lookup(attempt, options),
      dispatch: async (dispatch) => {
        dispatch.checkDeadline();
        let answer: Awaited<ReturnType<typeof send>>;
        try {
          answer = await send(dispatch);
        } catch (error) {
          const status = (error as { statusCode?: unknown; status?: unknown } | null)?.statusCode ?? (error as { status?: unknown } | null)?.status;
          if (typeof status === "number" && status >= 400 && status < 500 && status !== 408) {
            throw new NotApplied(`the model refused the call (${status})`, { error: describe(error) });
          }
          throw new OutcomeUnknown(`the model call got no answer: ${describe(error)}`, { error: describe(error) });
        }
        // An answer that reports no usage is charged its estimate, never nothing.
        const bound = this.estimate(operation, dispatch.request).amounts;
        const input = answer.inputTokens ?? bound["input_tokens"] ?? 0;
        const output = answer.outputTokens ?? bound["output_tokens"] ?? 0;
        return {
          status: "succeeded",
          result: answer.result,
          cost: this.charge(input, output),
          priceSource: this.#source(),
        };
      },
    };
    return ctx.attempt(sending, operation, request, { key: `${key}:model:${digest(request)}`, signal });
  }
}

/** A model call as recorded: what defines it, and its output limit. */
export interface ModelRequest {
  model: string;
  max_output_tokens: number | undefined;
  [field: string]: unknown;
}

/** The first 24 hex digits of the SHA-256 of `value` as canonical JSON (keys sorted). */
export function digest(value: unknown): string {
  return createHash("sha256").update(JSON.stringify(jsonable(value))).digest("hex").slice(0, 24);
}

/**
 * A value as the store gives it back: JSON, object keys sorted, `undefined`
 * fields left out, dates as ISO text. What the framework is handed is this,
 * live and replayed alike, so the next call's request is the same either way (A6).
 */
export function jsonable(value: unknown): unknown {
  if (value === null || typeof value === "string" || typeof value === "boolean") return value;
  if (typeof value === "number") return Number.isFinite(value) ? value : null;
  if (value instanceof Date) return value.toISOString();
  if (Array.isArray(value)) return value.map((item) => (item === undefined ? null : jsonable(item)));
  if (value instanceof Uint8Array) return Buffer.from(value).toString("base64");
  if (typeof value === "object") {
    const out: Record<string, unknown> = {};
    for (const name of Object.keys(value).sort()) {
      const item = (value as Record<string, unknown>)[name];
      if (item !== undefined && typeof item !== "function") out[name] = jsonable(item);
    }
    return out;
  }
  return value === undefined ? null : String(value);
}

export function describe(error: unknown): string {
  return error instanceof Error ? `${error.name}: ${error.message}` : String(error);
}
