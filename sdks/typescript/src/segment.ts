/**
 * A segment of a run executed in this process (X1): the claim the server
 * answered (run, segment name, epoch, secret claim token, lease), kept alive
 * by renewing at half the lease; the node journal the server keeps for it
 * (`startNode`, `completeNode`) and the end of the run (`finish`); and the
 * node context whose `attempt` admits an effect on the server, sends it here
 * with the process's own adapter within the send deadline, and reports what
 * the target said.
 *
 * The client holds no rule: whether an effect is sent, replayed from its
 * record or waits for a person is the server's answer to each admission. A
 * segment that learns it is fenced (its claim is no longer the run's owner)
 * sends nothing more.
 */

import type { Charter } from "./client.js";
import { seg } from "./transport.js";
import type { Adapter, Dispatch, Outcome } from "./adapter.js";
import type { NodeCompleted, Run } from "./records.js";
import { checkAmounts, deadline, describe, outcomeBody } from "./adapter.js";
import {
  AdapterError,
  AttemptFailed,
  Blocked,
  CharterError,
  Fenced,
  NotApplied,
  OutcomeUnknown,
  SettlementUnrecorded,
  TransportError,
  UsageError,
} from "./errors.js";

/** What every claiming call answers. */
export interface Claim {
  run_id: string;
  mission_id: string;
  segment: string;
  epoch: number;
  claim: string;
  lease_ms: number;
  status: string;
}

/** The server's answer to an admission. */
interface Admitted {
  action: "send" | "replay" | "blocked" | "voided";
  attempt_id: string;
  status: string;
  idempotency_key?: string;
  fencing_token?: string;
  send_deadline_ms?: number;
  run_id?: string;
  epoch?: number;
  result?: unknown;
  cost?: unknown;
  receipt?: unknown;
  reason?: string;
}

interface Reported {
  attempt_id: string;
  status: string;
  settled: boolean;
  late: boolean;
}

/** How many times one call of `ctx.attempt` asks again after an attempt proven not sent. */
const TRIES = 4;
/** How many times a report is sent again when it got no answer (it is idempotent by attempt id). */
const REPORT_TRIES = 3;

export class Segment {
  readonly runId: string;
  readonly missionId: string;
  readonly name: string;
  readonly epoch: number;
  #claim: string;
  #leaseMs: number;
  #fenced: CharterError | undefined;
  #keeper: NodeJS.Timeout | undefined;
  readonly #client: Charter;

  private constructor(client: Charter, claim: Claim) {
    this.#client = client;
    this.runId = claim.run_id;
    this.missionId = claim.mission_id;
    this.name = claim.segment;
    this.epoch = claim.epoch;
    this.#claim = claim.claim;
    this.#leaseMs = claim.lease_ms;
  }

  /** Start a run of `missionId` whose nodes run here, as its first segment `segment`. */
  static async start(client: Charter, missionId: string, segment: string, input?: Record<string, unknown>): Promise<Segment> {
    const body: Record<string, unknown> = { segment };
    if (input !== undefined) body["input"] = input;
    const claim = await client.request("POST", `/missions/${seg(missionId)}/runs`, body);
    return new Segment(client, claim as Claim);
  }

  /**
   * Take `runId` over as a new segment (the server recovers it first: a new
   * epoch, older prepared attempts voided, dispatched ones UNKNOWN), or
   * continue it as its owner segment once its executor let go. Refused with
   * `lease_held`, `segment_reused`, `needs_intervention` (`blockers`), `run_terminal`.
   */
  static async claim(client: Charter, runId: string, segment: string, options: { force?: boolean } = {}): Promise<Segment> {
    const body = { segment, force: options.force ?? false };
    const claim = await client.request("POST", `/runs/${seg(runId)}/claim`, body);
    return new Segment(client, claim as Claim);
  }

  /** The lease left when the server last answered, in milliseconds. */
  get leaseMs(): number {
    return this.#leaseMs;
  }

  /** Whether the server said this segment no longer owns the run. */
  get fenced(): boolean {
    return this.#fenced !== undefined;
  }

  /** The three credentials every call as the segment carries. */
  #credentials(): { segment: string; epoch: number; claim: string } {
    return { segment: this.name, epoch: this.epoch, claim: this.#claim };
  }

  async #call(path: string, body: Record<string, unknown>): Promise<unknown> {
    if (this.#fenced !== undefined) throw this.#fenced;
    try {
      return await this.#client.request("POST", path, { ...this.#credentials(), ...body });
    } catch (error) {
      if (error instanceof Fenced) {
        this.#fenced = error;
        this.stopRenewing();
      }
      throw error;
    }
  }

  async renew(): Promise<number> {
    const answer = (await this.#call(`/runs/${seg(this.runId)}/renew`, {})) as { lease_ms: number };
    this.#leaseMs = answer.lease_ms;
    return answer.lease_ms;
  }

  /**
   * Renew the lease at half of it until `release` or `stopRenewing`. The
   * timer does not keep the process alive; a renewal that is refused as
   * fenced stops it, and the next call of this segment throws `Fenced`.
   */
  keepRenewing(): void {
    this.stopRenewing();
    const every = Math.max(50, Math.floor(this.#leaseMs / 2));
    this.#keeper = setInterval(() => {
      this.renew().catch(() => undefined); // a fenced renewal is remembered by #call
    }, every);
    this.#keeper.unref();
  }

  stopRenewing(): void {
    if (this.#keeper !== undefined) clearInterval(this.#keeper);
    this.#keeper = undefined;
  }

  /** Let the run go, so that it can be claimed at once (after a node blocked, say). */
  async release(): Promise<void> {
    this.stopRenewing();
    await this.#call(`/runs/${seg(this.runId)}/release`, {});
  }

  /**
   * Start node `nodeId` (its journal is kept by the server, as the plan
   * runner keeps a Python node's) and answer its context. The execution is
   * the server's: the same one after a crash (the node was left running or
   * blocked), so its settled effects replay in it; a new one after the node
   * failed. Every `ctx.attempt` of the context is admitted as that execution.
   */
  async startNode(nodeId: string): Promise<Context> {
    const path = `/runs/${seg(this.runId)}/nodes/${seg(nodeId)}/start`;
    const started = (await this.#call(path, {})) as { execution: number };
    return this.node(nodeId, started.execution);
  }

  /**
   * The context of an execution of node `nodeId` already started (the number
   * `startNode` answered, kept by this process). Prefer `startNode`: an
   * execution the node's journal does not know cannot be completed.
   */
  node(nodeId: string, execution: number): Context {
    if (!Number.isSafeInteger(execution) || execution < 0) {
      throw new UsageError(`execution must be a whole number of at least 0, got ${execution}`);
    }
    return new Context(this, nodeId, execution);
  }

  /**
   * Record node `nodeId`'s result (any JSON) for its running execution, with
   * its hash, before anything consumes it (N1; `undefined` is recorded as
   * `null`). The same completion again
   * answers the same; another result, or an execution that is not the node's
   * running one, is `StateError` (`invalid_state`).
   */
  async completeNode(nodeId: string, execution: number, result: unknown): Promise<NodeCompleted> {
    const path = `/runs/${seg(this.runId)}/nodes/${seg(nodeId)}/complete`;
    return (await this.#call(path, { execution, result: result ?? null })) as NodeCompleted;
  }

  /**
   * End the run, `completed` (the default) or `failed`, and answer it. Refused
   * as `StateError` (`invalid_state`, `unresolved` in its details) while any
   * attempt of the run is unresolved: settle those first. A finished run needs
   * no lease, so renewing stops.
   */
  async finish(status: "completed" | "failed" = "completed", reason?: string): Promise<Run> {
    const body: Record<string, unknown> = { status };
    if (reason !== undefined) body["reason"] = reason;
    const run = (await this.#call(`/runs/${seg(this.runId)}/finish`, body)) as Run;
    this.stopRenewing();
    return run;
  }

  /** @internal Admit, send and report one effect; see `Context.attempt`. */
  async perform(nodeId: string, execution: number, adapter: Adapter, operation: string, request: unknown, key: string): Promise<unknown> {
    const declared = adapter.operations[operation];
    if (declared === undefined) {
      throw new AdapterError(`adapter ${JSON.stringify(adapter.name)} declares no operation ${JSON.stringify(operation)}`);
    }
    const estimate = await adapter.estimate(operation, request);
    const body: Record<string, unknown> = {
      node_id: nodeId,
      execution,
      effect_key: key,
      adapter: adapter.name,
      operation,
      effect_class: declared.effect,
      request,
      estimate: checkAmounts(estimate.amounts, "estimate"),
    };
    if (declared.dedupeWindowSeconds !== undefined) body["dedupe_window_seconds"] = declared.dedupeWindowSeconds;
    if (estimate.priceSource !== undefined) body["price_source"] = estimate.priceSource;
    for (let tries = 1; ; tries += 1) {
      const startedAt = performance.now(); // before the dispatch commit: the deadline can only err early
      const admitted = (await this.#call(`/runs/${seg(this.runId)}/attempts`, body)) as Admitted;
      const settled = this.#settled(admitted);
      if (settled !== undefined) return settled.value;
      const reported = await this.#send(admitted, adapter, operation, request, startedAt);
      if (reported.status === "succeeded") return reported.result;
      if (reported.status === "unknown" || reported.status === "dispatched") {
        throw new Blocked(`attempt ${admitted.attempt_id}'s outcome is unknown: it waits for evidence or a person`, {
          details: { run_id: this.runId, attempt_id: admitted.attempt_id },
        });
      }
      if (!reported.notSent || tries >= TRIES) {
        throw new AttemptFailed(`attempt ${admitted.attempt_id} ${reported.status}`, {
          details: { attempt_id: admitted.attempt_id, status: reported.status, result: reported.result },
        });
      }
      // Never sent (its deadline passed here): the server decides whether to try anew.
    }
  }

  /** What a `replay`, `blocked` or `voided` answer means for the node; undefined for `send`. */
  #settled(admitted: Admitted): { value: unknown } | undefined {
    const details = { run_id: this.runId, attempt_id: admitted.attempt_id, status: admitted.status };
    switch (admitted.action) {
      case "send":
        return undefined;
      case "replay":
        if (admitted.status === "succeeded") return { value: admitted.result };
        throw new AttemptFailed(`attempt ${admitted.attempt_id} ${admitted.status} (replayed from its record)`, {
          details: { ...details, result: admitted.result },
        });
      case "blocked":
        throw new Blocked(`attempt ${admitted.attempt_id} is ${admitted.status}: it waits for evidence or a person`, { details });
      case "voided":
        throw new AttemptFailed(`attempt ${admitted.attempt_id} was voided and never sent: ${admitted.reason ?? ""}`, {
          details: { ...details, reason: admitted.reason },
        });
      default:
        throw new AdapterError(`the server answered an admission with action ${JSON.stringify(admitted.action)}`);
    }
  }

  /** Send an admitted attempt within its deadline and report what happened. */
  async #send(admitted: Admitted, adapter: Adapter, operation: string, request: unknown, startedAt: number): Promise<{ status: string; result?: unknown; notSent: boolean }> {
    const limit = deadline(startedAt, admitted.send_deadline_ms ?? 0);
    const attemptId = admitted.attempt_id;
    if (limit.remainingMs() <= 0) {
      const reported = await this.#report(attemptId, { outcome: "not_applied", proof: { reason: "send deadline passed" } });
      return { status: reported.status, notSent: true };
    }
    const send: Dispatch = {
      attemptId,
      runId: this.runId,
      epoch: admitted.epoch ?? this.epoch,
      operation,
      request,
      idempotencyKey: String(admitted.idempotency_key),
      fencingToken: admitted.fencing_token ?? `${this.runId}:${this.epoch}`,
      deadlineMs: limit.remainingMs(),
      ...limit,
    };
    let report: Record<string, unknown>;
    let result: unknown;
    let notSent = false;
    try {
      const outcome: Outcome = await adapter.dispatch(send);
      report = { outcome: outcome.status, ...outcomeBody(outcome) };
      delete report["status"];
      if (outcome.priceSource !== undefined) report["price_source"] = outcome.priceSource;
      result = outcome.result;
    } catch (error) {
      if (error instanceof NotApplied) {
        report = { outcome: "not_applied", proof: { reason: error.reason, ...error.evidence } };
        notSent = true;
      } else if (error instanceof OutcomeUnknown) {
        report = { outcome: "unknown", reason: error.reason, detail: error.evidence };
      } else {
        report = { outcome: "unknown", reason: describe(error), detail: null };
      }
    }
    const reported = await this.#report(attemptId, report);
    return { status: reported.status, result, notSent };
  }

  /** Report an outcome; sent again when it got no answer (idempotent by attempt id). */
  async #report(attemptId: string, report: Record<string, unknown>): Promise<Reported> {
    for (let tries = 1; ; tries += 1) {
      try {
        return (await this.#call(`/attempts/${seg(attemptId)}/report`, report)) as Reported;
      } catch (error) {
        if (!(error instanceof TransportError)) throw error;
        if (tries >= REPORT_TRIES) {
          throw new SettlementUnrecorded(
            `attempt ${attemptId} was sent and its report got no answer ${tries} times: it stays ` +
              "dispatched with its hold; recover the run, then reconcile it",
            { details: { attempt_id: attemptId, run_id: this.runId } },
          );
        }
        await new Promise((resolve) => setTimeout(resolve, 200 * tries));
      }
    }
  }
}

/**
 * One execution of one node, as `segment.startNode` answered it:
 * `ctx.attempt(adapter, operation, request, { key })` for each effect, then
 * `ctx.complete(result)`.
 */
export class Context {
  readonly segment: Segment;
  readonly nodeId: string;
  readonly execution: number;

  constructor(segment: Segment, nodeId: string, execution: number) {
    this.segment = segment;
    this.nodeId = nodeId;
    this.execution = execution;
  }

  get runId(): string {
    return this.segment.runId;
  }

  /**
   * Perform one effect: admitted against the allowance and written down on
   * the server before it is sent, sent here within the send deadline (on
   * `performance.now()`), settled by the report. An effect already settled
   * for this node is replayed from its record and never sent again. Throws
   * `AttemptFailed` (settled failed), `Blocked` (its outcome is unknown, or it
   * waits for a person: the run is durable, recover and reconcile it),
   * `Fenced` (this segment lost the run: send nothing more), or the typed
   * refusal of admission (`AllowanceExceeded`, `ApprovalRequired`, ...).
   */
  async attempt<Request>(adapter: Adapter<Request>, operation: string, request: Request, options: { key: string }): Promise<unknown> {
    return this.segment.perform(this.nodeId, this.execution, adapter, operation, request, options.key);
  }

  /** Record this execution's result (see `Segment.completeNode`). */
  async complete(result: unknown): Promise<NodeCompleted> {
    return this.segment.completeNode(this.nodeId, this.execution, result);
  }
}
