/**
 * The client of Charter's HTTP API (`/api/v1`): one base URL, one credential
 * (`NAME:SECRET`, sent as `Authorization: Bearer NAME:SECRET`), a `fetch`
 * (the global one unless given: a proxy's, a logging one, a test's). It holds
 * no rule of its own: every decision is the engine's, checked against the
 * mission's contract and audited under the credential's principal. Errors
 * arrive as the typed errors of `./errors.js`; answers are checked against
 * the protocol (`./checks.js`) before they are handed on; a busy store and
 * an unanswered repeatable call are retried as `./retry.js` says.
 */

import * as checks from "./checks.js";
import { CharterError, TransportError, fromAnswer } from "./errors.js";
import { Coordinator } from "./coordinator.js";
import type {
  AttemptDetail,
  Attempt,
  AuditVerification,
  Decided,
  Incident,
  IncidentClosed,
  Ledger,
  LimitRaised,
  Me,
  Page,
  Run,
  RunStatus,
  Waits,
} from "./records.js";
import { backoff, retryPolicy, sleep } from "./retry.js";
import type { RetryPolicy } from "./retry.js";
import { seg } from "./transport.js";
import type { Method, RequestOptions, Requester } from "./transport.js";

/** Per call: a signal that cancels it (the call rejects with the signal's reason). */
export interface CallOptions {
  signal?: AbortSignal;
}

export interface CharterOptions {
  /** Where the server is, e.g. `http://127.0.0.1:8765` (with or without `/api/v1`). */
  baseUrl: string;
  /** `NAME:SECRET`, as `charter credential new NAME` printed it. */
  credential: string;
  /** How long one request may take before it is abandoned (default 30 s). */
  timeoutMs?: number;
  /** The `fetch` every request goes through (default: the global one). */
  fetch?: typeof globalThis.fetch;
  /** When to ask again (`./retry.js`); `false` never does. */
  retry?: RetryPolicy | false;
}

export class Charter implements Requester {
  readonly baseUrl: string;
  readonly coordinator: Coordinator;
  readonly #authorization: string;
  readonly #timeoutMs: number;
  readonly #fetch: typeof globalThis.fetch;
  readonly #retry: Required<RetryPolicy>;

  constructor(options: CharterOptions) {
    if (!/^[^:\s]+:\S+$/.test(options.credential)) {
      throw new CharterError("credential must be NAME:SECRET, as `charter credential new` printed it", {
        code: "usage_error",
      });
    }
    const base = options.baseUrl.replace(/\/+$/, "");
    this.baseUrl = base.endsWith("/api/v1") ? base : `${base}/api/v1`;
    this.#authorization = `Bearer ${options.credential}`;
    this.#timeoutMs = options.timeoutMs ?? 30_000;
    this.#fetch = options.fetch ?? ((input, init) => globalThis.fetch(input, init));
    this.#retry = retryPolicy(options.retry);
    this.coordinator = new Coordinator(this);
  }

  /** The principal the credential proves. */
  async me(options: CallOptions = {}): Promise<Me> {
    return checks.answer(checks.me, await this.request("GET", "/me", undefined, options));
  }

  /** Runs, newest page first by creation (`next` is the cursor of the page after). */
  async runs(
    query: { mission?: string; status?: RunStatus; limit?: number; after?: string } = {},
    options: CallOptions = {},
  ): Promise<Page<Run>> {
    return checks.answer(checks.page(checks.run), await this.request("GET", "/runs", undefined, { ...options, query }));
  }

  /** A run's waits: approvals pending, expired and flagged, timers, questions. */
  async waits(runId: string, options: CallOptions = {}): Promise<Waits> {
    return checks.answer(checks.waits, await this.request("GET", `/runs/${seg(runId)}/waits`, undefined, options));
  }

  /** An attempt, its evidence so far and its next safe action. */
  async attempt(attemptId: string, options: CallOptions = {}): Promise<AttemptDetail> {
    return checks.answer(checks.attemptDetail, await this.request("GET", `/attempts/${seg(attemptId)}`, undefined, options));
  }

  async attempts(
    query: { run?: string; mission?: string; unresolved?: boolean; limit?: number; after?: string } = {},
    options: CallOptions = {},
  ): Promise<Page<Attempt>> {
    return checks.answer(checks.page(checks.attempt), await this.request("GET", "/attempts", undefined, { ...options, query }));
  }

  /** Approve a pending approval (needs `approve`; the engine may require another person's eyes). */
  async approve(approvalId: string, options: CallOptions = {}): Promise<Decided> {
    return checks.answer(checks.decided, await this.request("POST", `/approvals/${seg(approvalId)}/approve`, {}, options));
  }

  /** Deny a pending approval: its attempt is voided and never sent. */
  async deny(approvalId: string, options: CallOptions = {}): Promise<Decided> {
    return checks.answer(checks.decided, await this.request("POST", `/approvals/${seg(approvalId)}/deny`, {}, options));
  }

  /** Queue a run of `plan` (its `module:attribute` reference) for a worker (K1). */
  async submit(
    missionId: string,
    plan: string,
    input?: Record<string, unknown>,
    queue?: string,
    options: CallOptions = {},
  ): Promise<Run> {
    const body: Record<string, unknown> = { mission_id: missionId, plan };
    if (input !== undefined) body["input"] = input;
    if (queue !== undefined) body["queue"] = queue;
    return checks.answer(checks.run, await this.request("POST", "/runs", body, options));
  }

  /**
   * Stop a run (needs `stop`, N5): nothing new is admitted, and it ends
   * `stopped` once what was sent has settled (until then `stopping`).
   */
  async stop(runId: string, reason: string, options: CallOptions = {}): Promise<Run> {
    return checks.answer(checks.run, await this.request("POST", `/runs/${seg(runId)}/stop`, { reason }, options));
  }

  /**
   * Raise a mission's limit in one unit to `limit` (whole smallest steps;
   * needs `raise_limit`): a new contract version (L7). Runs paused for the
   * allowance go on by themselves once it covers them (K2).
   */
  async raiseLimit(missionId: string, unit: string, limit: number, options: CallOptions = {}): Promise<LimitRaised> {
    const path = `/missions/${seg(missionId)}/raise-limit`;
    return checks.answer(checks.limitRaised, await this.request("POST", path, { unit, limit }, options));
  }

  /** A mission's balances per unit, and the ledger check (L0-L2). */
  async ledger(missionId: string, options: CallOptions = {}): Promise<Ledger> {
    return checks.answer(checks.ledger, await this.request("GET", `/missions/${seg(missionId)}/ledger`, undefined, options));
  }

  /** A mission's incidents (L5), by opening time; `open` for the open ones only. */
  async incidents(
    missionId: string,
    query: { open?: boolean; limit?: number; after?: string } = {},
    options: CallOptions = {},
  ): Promise<Page<Incident>> {
    const path = `/missions/${seg(missionId)}/incidents`;
    return checks.answer(checks.page(checks.incident), await this.request("GET", path, undefined, { ...options, query }));
  }

  /** Close an incident with a note saying what was done: its mission's runs may go on. */
  async closeIncident(incidentId: string, note: string, options: CallOptions = {}): Promise<IncidentClosed> {
    const path = `/incidents/${seg(incidentId)}/close`;
    return checks.answer(checks.incidentClosed, await this.request("POST", path, { note }, options));
  }

  /** Verify the audit hash chains (S1): one mission's, or every chain the store keeps. */
  async audit(missionId?: string, options: CallOptions = {}): Promise<AuditVerification> {
    const query = { mission: missionId };
    return checks.answer(checks.audit, await this.request("GET", "/audit", undefined, { ...options, query }));
  }

  /**
   * One request; its JSON answer, or the typed error the server answered.
   * A `503 store_busy` is asked again after a backoff, as is a repeatable
   * call (`options.idempotent`, every GET) that got no answer; the error
   * given up on keeps its `retryable` flag and what it came from as `cause`.
   * A decision (a POST not marked idempotent) that got no answer is a
   * `TransportError` with `retryable: false`: whether the server acted is
   * unknown, so read the state again before deciding anew. A cancelled call
   * rejects with its signal's reason.
   */
  async request(method: Method, path: string, body?: unknown, options: RequestOptions = {}): Promise<unknown> {
    const idempotent = options.idempotent ?? method === "GET";
    for (let retry = 0; ; retry += 1) {
      let error: CharterError;
      try {
        const { status, answer } = await this.#exchange(method, path, body, options, idempotent);
        if (status >= 200 && status <= 299) return answer;
        error = fromAnswer(status, answer, { idempotent });
      } catch (thrown) {
        if (!TransportError.isInstance(thrown)) throw thrown; // cancelled: the signal's reason
        error = thrown;
      }
      if (!error.retryable || retry >= this.#retry.maxRetries) throw error;
      await sleep(backoff(this.#retry, retry), options.signal);
    }
  }

  /**
   * One request as it went, asked once: the HTTP status and the JSON answer,
   * whatever they are. No answer at all is a `TransportError`.
   */
  async exchange(method: Method, path: string, body?: unknown, options: RequestOptions = {}): Promise<{ status: number; answer: unknown }> {
    return this.#exchange(method, path, body, options, options.idempotent ?? method === "GET");
  }

  async #exchange(
    method: Method,
    path: string,
    body: unknown,
    options: RequestOptions,
    idempotent: boolean,
  ): Promise<{ status: number; answer: unknown }> {
    const url = new URL(this.baseUrl + path);
    for (const [name, value] of Object.entries(options.query ?? {})) {
      if (value !== undefined) url.searchParams.set(name, String(value));
    }
    const headers: Record<string, string> = { authorization: this.#authorization, accept: "application/json" };
    const timeout = AbortSignal.timeout(this.#timeoutMs);
    const signal = options.signal === undefined ? timeout : AbortSignal.any([options.signal, timeout]);
    const init: RequestInit = { method, headers, signal };
    if (method === "POST") {
      headers["content-type"] = "application/json";
      init.body = JSON.stringify(body ?? {});
    }
    options.signal?.throwIfAborted();
    let response: Response;
    let text: string;
    try {
      response = await this.#fetch(url, init);
      text = await response.text();
    } catch (cause) {
      if (options.signal?.aborted) throw options.signal.reason;
      throw new TransportError(`${method} ${url.pathname} got no answer: ${describe(cause)}`, {
        details: { method, path: url.pathname },
        cause,
        retryable: idempotent,
      });
    }
    let answer: unknown = undefined;
    if (text !== "") {
      try {
        answer = JSON.parse(text);
      } catch {
        answer = text;
      }
    }
    return { status: response.status, answer };
  }
}

function describe(cause: unknown): string {
  if (cause instanceof Error) {
    const inner = cause.cause instanceof Error ? ` (${cause.cause.message})` : "";
    return `${cause.name}: ${cause.message}${inner}`;
  }
  return String(cause);
}
