/**
 * The adapter: how an effect reaches the outside world from this process. It
 * declares each operation's effect class (A7), estimates what an operation may
 * cost (an upper bound held against the allowance before anything is sent),
 * sends one admitted attempt, and looks up what happened to an uncertain one.
 *
 * It must send the attempt's own `idempotencyKey` (A5) and, where the target
 * fences, the `fencingToken` (F3); never start a send once `checkDeadline()`
 * throws; pass on `signal` to what it sends with, so that a cancelled call
 * stops its send; turn its client's own retries off (every send is an attempt
 * Charter knows); and throw `NotApplied` only when non-application is proven
 * — any other exception leaves the attempt UNKNOWN, for evidence or a person (A3).
 */

import * as checks from "./checks.js";
import { seg } from "./transport.js";
import type { Requester } from "./transport.js";
import { AdapterError, NotApplied, StateError } from "./errors.js";
import type { Amounts, Attempt, EffectClass, Reconciled } from "./records.js";

export type { EffectClass } from "./records.js";

export interface Operation {
  effect: EffectClass;
  /** Required for `idempotent_keyed`: how long the target deduplicates by key. */
  dedupeWindowSeconds?: number;
}

export interface Estimate {
  /** Per unit, whole numbers in the unit's smallest step. */
  amounts: Amounts;
  /** Where the prices come from (L8). */
  priceSource?: string;
}

/** What goes with an outcome, whichever it is. */
interface OutcomeFields {
  /** The actual cost as reported, never clamped (L2, L5). */
  cost?: Amounts;
  /** The target's raw receipt, kept verbatim. */
  receipt?: unknown;
  priceSource?: string;
}

/**
 * What the target did: applied as a success, or answered and refused
 * (applied as a failure). A success's `result` is what `ctx.attempt`
 * answers (and what a replay answers: its recorded JSON); a failure's is
 * the refusal, kept on the record.
 */
export type Outcome<Result = unknown> =
  | (OutcomeFields & { status: "succeeded"; result?: Result })
  | (OutcomeFields & { status: "failed"; result?: unknown });

/** What a lookup found about an uncertain attempt (R7). */
export interface Evidence {
  verdict: "applied" | "not_applied" | "indeterminate";
  /** Required for `applied`: what the target did, with its cost. */
  outcome?: Outcome;
  detail?: unknown;
}

/** Everything an adapter is told when asked to send one attempt. */
export interface Dispatch<Request = unknown> {
  attemptId: string;
  runId: string;
  epoch: number;
  operation: string;
  request: Request;
  /** Send it to the target, which deduplicates by it (A5). */
  idempotencyKey: string;
  /** `"<run_id>:<epoch>"`: send it where the target fences stale senders (F3). */
  fencingToken: string;
  /** What was left of the send deadline when `dispatch` was called, in milliseconds. */
  deadlineMs: number;
  /** What is left of the send deadline now, on this process's monotonic clock. */
  remainingMs(): number;
  /** Throw `NotApplied` if the send deadline has passed: call it just before the bytes go out. */
  checkDeadline(): void;
  /**
   * Aborted when the caller cancels `ctx.attempt`: hand it to the request
   * that sends (with `AbortSignal.any` beside the adapter's own timeout).
   * Throw `NotApplied` if it aborted before anything went out; a send cut
   * off after that is UNKNOWN, as any other exception makes it.
   */
  signal: AbortSignal;
}

/**
 * `Request` is what `ctx.attempt` is given for the adapter's operations,
 * `Result` what it answers for a success: the type `ctx.attempt` returns.
 */
export interface Adapter<Request = any, Result = unknown> {
  readonly name: string;
  readonly operations: Readonly<Record<string, Operation>>;
  estimate(operation: string, request: Request): Estimate | Promise<Estimate>;
  dispatch(send: Dispatch<Request>): Promise<Outcome<Result>>;
  /** Look the attempt up at the target by its key or reference (A8); `signal` cancels it. */
  lookup(attempt: Attempt, options?: { signal?: AbortSignal }): Promise<Evidence>;
}

/** The deadline of one send, measured on `performance.now()` from `startedAt`. */
export function deadline(startedAt: number, durationMs: number): Pick<Dispatch, "remainingMs" | "checkDeadline"> {
  const remainingMs = (): number => durationMs - (performance.now() - startedAt);
  return {
    remainingMs,
    checkDeadline(): void {
      const left = remainingMs();
      if (left <= 0) {
        throw new NotApplied("send deadline passed before sending", { late_by_ms: -left });
      }
    },
  };
}

/** `amounts` checked as the server checks them: whole numbers in [0, 2^53 - 1]. */
export function checkAmounts(amounts: unknown, what: string): Amounts {
  if (typeof amounts !== "object" || amounts === null || Array.isArray(amounts)) {
    throw new AdapterError(`${what} must map units to whole amounts, got ${JSON.stringify(amounts)}`);
  }
  for (const [unit, amount] of Object.entries(amounts)) {
    if (typeof amount !== "number" || !Number.isSafeInteger(amount) || amount < 0) {
      throw new AdapterError(
        `${what} for unit ${JSON.stringify(unit)} must be a whole number in the unit's smallest ` +
          `step (floats never touch the ledger), got ${JSON.stringify(amount)}`,
      );
    }
  }
  return amounts as Amounts;
}

/** The wire form of an outcome (`{"status", "result", "cost", "receipt"}`). */
export function outcomeBody(outcome: Outcome<unknown>): Record<string, unknown> {
  const status: unknown = outcome.status; // an adapter in plain JavaScript may answer anything
  if (status !== "succeeded" && status !== "failed") {
    throw new AdapterError(`an outcome's status must be "succeeded" or "failed", got ${JSON.stringify(status)}`);
  }
  const body: Record<string, unknown> = {
    status: outcome.status,
    result: outcome.result ?? null,
    cost: checkAmounts(outcome.cost ?? {}, "outcome cost"),
    receipt: outcome.receipt ?? null,
  };
  return body;
}

/**
 * `coordinator.reconcile(attemptId, adapter)`: this process's adapter looks
 * the attempt up, and what it found is posted as evidence (A8, R7). A lookup
 * that throws `NotApplied` proves non-application; any other failure of the
 * lookup is recorded as indeterminate evidence, never as a verdict.
 */
export async function reconcileWith(
  client: Requester,
  attemptId: string,
  adapter: Adapter,
  options: { signal?: AbortSignal } = {},
): Promise<Reconciled> {
  const { signal } = options;
  const attempt = checks.answer(checks.attemptDetail, await client.request("GET", `/attempts/${seg(attemptId)}`, undefined, { signal }));
  if (attempt.adapter !== adapter.name) {
    throw new StateError(`attempt ${attemptId} belongs to adapter ${JSON.stringify(attempt.adapter)}, not ${JSON.stringify(adapter.name)}`, {
      details: { attempt_id: attemptId, adapter: attempt.adapter },
    });
  }
  let found: Evidence;
  try {
    found = await adapter.lookup(attempt, { signal });
  } catch (error) {
    if (signal?.aborted) throw signal.reason; // cancelled: nothing was found, nothing is recorded
    found =
      NotApplied.isInstance(error)
        ? { verdict: "not_applied", detail: { reason: error.reason, ...error.evidence } }
        : { verdict: "indeterminate", detail: { lookup_error: describe(error) } };
  }
  const body: Record<string, unknown> = { verdict: found.verdict, detail: found.detail ?? null };
  if (found.verdict === "applied") {
    if (found.outcome === undefined) {
      throw new AdapterError("evidence that an effect was applied must carry its outcome");
    }
    body["outcome"] = outcomeBody(found.outcome);
  } else if (found.verdict !== "not_applied" && found.verdict !== "indeterminate") {
    throw new AdapterError(`unknown evidence verdict ${JSON.stringify(found.verdict)}`);
  }
  const path = `/attempts/${seg(attemptId)}/evidence`;
  return checks.answer(checks.reconciled, await client.request("POST", path, body, { signal }));
}

export function describe(error: unknown): string {
  return error instanceof Error ? `${error.name}: ${error.message}` : String(error);
}
