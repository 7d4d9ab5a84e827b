/**
 * The client of Charter's HTTP API (`/api/v1`): one base URL, one credential
 * (`NAME:SECRET`, sent as `Authorization: Bearer NAME:SECRET`), the global
 * `fetch`. It holds no rule of its own: every decision is the engine's,
 * checked against the mission's contract and audited under the credential's
 * principal. Errors arrive as the typed errors of `./errors.js`.
 */

import { CharterError, TransportError, fromAnswer } from "./errors.js";
import { Coordinator } from "./coordinator.js";
import type {
  Attempt,
  AttemptDetail,
  AuditVerification,
  Incident,
  Ledger,
  LimitRaised,
  Page,
  Run,
  RunStatus,
} from "./records.js";
import { seg } from "./transport.js";
import type { Query, Requester } from "./transport.js";

export interface CharterOptions {
  /** Where the server is, e.g. `http://127.0.0.1:8765` (with or without `/api/v1`). */
  baseUrl: string;
  /** `NAME:SECRET`, as `charter credential new NAME` printed it. */
  credential: string;
  /** How long one request may take before it is abandoned (default 30 s). */
  timeoutMs?: number;
}

export class Charter implements Requester {
  readonly baseUrl: string;
  readonly coordinator: Coordinator;
  readonly #authorization: string;
  readonly #timeoutMs: number;

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
    this.coordinator = new Coordinator(this);
  }

  /** The principal the credential proves. */
  async me(): Promise<{ principal: string }> {
    return (await this.request("GET", "/me")) as { principal: string };
  }

  /** Runs, newest page first by creation (`next` is the cursor of the page after). */
  async runs(query: { mission?: string; status?: RunStatus; limit?: number; after?: string } = {}): Promise<Page<Run>> {
    return (await this.request("GET", "/runs", undefined, query)) as Page<Run>;
  }

  /** A run's waits: approvals pending, expired and flagged, timers, questions. */
  async waits(runId: string): Promise<{ run_id: string; status: RunStatus; waits: Record<string, unknown>[] }> {
    return (await this.request("GET", `/runs/${seg(runId)}/waits`)) as { run_id: string; status: RunStatus; waits: Record<string, unknown>[] };
  }

  async attempt(attemptId: string): Promise<AttemptDetail> {
    return (await this.request("GET", `/attempts/${seg(attemptId)}`)) as AttemptDetail;
  }

  async attempts(query: { run?: string; mission?: string; unresolved?: boolean; limit?: number; after?: string } = {}): Promise<Page<Attempt>> {
    return (await this.request("GET", "/attempts", undefined, query)) as Page<Attempt>;
  }

  /** Approve a pending approval (needs `approve`; the engine may require another person's eyes). */
  async approve(approvalId: string): Promise<{ approval_id: string; status: string }> {
    return (await this.request("POST", `/approvals/${seg(approvalId)}/approve`)) as { approval_id: string; status: string };
  }

  /** Deny a pending approval: its attempt is voided and never sent. */
  async deny(approvalId: string): Promise<{ approval_id: string; status: string }> {
    return (await this.request("POST", `/approvals/${seg(approvalId)}/deny`)) as { approval_id: string; status: string };
  }

  /** Queue a run of `plan` (its `module:attribute` reference) for a worker (K1). */
  async submit(missionId: string, plan: string, input?: Record<string, unknown>, queue?: string): Promise<Run> {
    const body: Record<string, unknown> = { mission_id: missionId, plan };
    if (input !== undefined) body["input"] = input;
    if (queue !== undefined) body["queue"] = queue;
    return (await this.request("POST", "/runs", body)) as Run;
  }

  /**
   * Stop a run (needs `stop`, N5): nothing new is admitted, and it ends
   * `stopped` once what was sent has settled (until then `stopping`).
   */
  async stop(runId: string, reason: string): Promise<Run> {
    return (await this.request("POST", `/runs/${seg(runId)}/stop`, { reason })) as Run;
  }

  /**
   * Raise a mission's limit in one unit to `limit` (whole smallest steps;
   * needs `raise_limit`): a new contract version (L7). Runs paused for the
   * allowance go on by themselves once it covers them (K2).
   */
  async raiseLimit(missionId: string, unit: string, limit: number): Promise<LimitRaised> {
    const path = `/missions/${seg(missionId)}/raise-limit`;
    return (await this.request("POST", path, { unit, limit })) as LimitRaised;
  }

  /** A mission's balances per unit, and the ledger check (L0-L2). */
  async ledger(missionId: string): Promise<Ledger> {
    return (await this.request("GET", `/missions/${seg(missionId)}/ledger`)) as Ledger;
  }

  /** A mission's incidents (L5), by opening time; `open` for the open ones only. */
  async incidents(
    missionId: string,
    query: { open?: boolean; limit?: number; after?: string } = {},
  ): Promise<Page<Incident>> {
    return (await this.request("GET", `/missions/${seg(missionId)}/incidents`, undefined, query)) as Page<Incident>;
  }

  /** Close an incident with a note saying what was done: its mission's runs may go on. */
  async closeIncident(incidentId: string, note: string): Promise<{ incident_id: string; status: "closed" }> {
    const path = `/incidents/${seg(incidentId)}/close`;
    return (await this.request("POST", path, { note })) as { incident_id: string; status: "closed" };
  }

  /** Verify the audit hash chains (S1): one mission's, or every chain the store keeps. */
  async audit(missionId?: string): Promise<AuditVerification> {
    return (await this.request("GET", "/audit", undefined, { mission: missionId })) as AuditVerification;
  }

  /**
   * One request; its JSON answer, or the typed error the server answered. A
   * request that got no answer is a `TransportError`: for a POST, whether the
   * server acted is then unknown, so read the state again before deciding anew.
   */
  async request(method: "GET" | "POST", path: string, body?: unknown, query: Query = {}): Promise<unknown> {
    const { status, answer } = await this.exchange(method, path, body, query);
    if (status < 200 || status > 299) throw fromAnswer(status, answer);
    return answer;
  }

  /** One request as it went: the HTTP status and the JSON answer, whatever they are. */
  async exchange(method: "GET" | "POST", path: string, body?: unknown, query: Query = {}): Promise<{ status: number; answer: unknown }> {
    const url = new URL(this.baseUrl + path);
    for (const [name, value] of Object.entries(query)) {
      if (value !== undefined) url.searchParams.set(name, String(value));
    }
    const headers: Record<string, string> = { authorization: this.#authorization, accept: "application/json" };
    const init: RequestInit = { method, headers, signal: AbortSignal.timeout(this.#timeoutMs) };
    if (method === "POST") {
      headers["content-type"] = "application/json";
      init.body = JSON.stringify(body ?? {});
    }
    let response: Response;
    let text: string;
    try {
      response = await fetch(url, init);
      text = await response.text();
    } catch (cause) {
      throw new TransportError(`${method} ${url.pathname} got no answer: ${describe(cause)}`, {
        details: { method, path: url.pathname },
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
