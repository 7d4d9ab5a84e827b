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

import * as checks from "./checks.js";
import { seg } from "./transport.js";
import type { RequestOptions, Requester } from "./transport.js";
import type { Adapter, Dispatch, Outcome } from "./adapter.js";
import type { Admitted, Claim, NodeCompleted, Reported, Run } from "./records.js";
import { checkAmounts, deadline, describe, outcomeBody } from "./adapter.js";
import {
  AdapterError,
  AttemptFailed,
  Blocked,
  CharterError,
  Fenced,
  LateReport,
  NotApplied,
  OutcomeUnknown,
  SettlementUnrecorded,
  UsageError,
} from "./errors.js";

/** Per call: a signal that cancels it (the call rejects with the signal's reason). */
export interface SegmentCallOptions {
  signal?: AbortSignal;
}

/** What `ctx.attempt` is told besides the effect. */
export interface AttemptOptions {
  /** The effect's key within the node (A6): the same key replays, never sends again. */
  key: string;
  /**
   * Cancels the attempt. Before it is admitted, nothing is written; admitted
   * and not yet sent, it is reported not applied (settled at no cost);
   * during the send, the adapter is given it (`Dispatch.signal`) and what it
   * ends with is reported — UNKNOWN, unless the adapter proves nothing went
   * out. Either way the report is made before `attempt` rejects with the
   * signal's reason, so the record says what happened.
   */
  signal?: AbortSignal;
}

/** How many times one call of `ctx.attempt` asks again after an attempt proven not sent. */
const TRIES = 4;

/** What a send came to: the report's answer, the adapter's result, whether nothing went out. */
interface Sent {
  status: string;
  result?: unknown;
  notSent: boolean;
}

export class Segment {
  readonly runId: string;
  readonly missionId: string;
  readonly name: string;
  readonly epoch: number;
  #claim: string;
  #leaseMs: number;
  #fenced: CharterError | undefined;
  #keeper: ReturnType<typeof setInterval> | undefined;
  readonly #client: Requester;

  private constructor(client: Requester, claim: Claim) {
    this.#client = client;
    this.runId = claim.run_id;
    this.missionId = claim.mission_id;
    this.name = claim.segment;
    this.epoch = claim.epoch;
    this.#claim = claim.claim;
    this.#leaseMs = claim.lease_ms;
  }

  /** Start a run of `missionId` whose nodes run here, as its first segment `segment`. */
  static async start(
    client: Requester,
    missionId: string,
    segment: string,
    input?: Record<string, unknown>,
    options: SegmentCallOptions = {},
  ): Promise<Segment> {
    const body: Record<string, unknown> = { segment };
    if (input !== undefined) body["input"] = input;
    const claim = await client.request("POST", `/missions/${seg(missionId)}/runs`, body, options);
    return new Segment(client, checks.answer(checks.claim, claim));
  }

  /**
   * Take `runId` over as a new segment (the server recovers it first: a new
   * epoch, older prepared attempts voided, dispatched ones UNKNOWN), or
   * continue it as its owner segment once its executor let go. Refused with
   * `lease_held`, `segment_reused`, `needs_intervention` (`blockers`),
   * `run_terminal`. `coordinator.resume(runId, segment)` is this call.
   */
  static async claim(
    client: Requester,
    runId: string,
    segment: string,
    options: { force?: boolean } & SegmentCallOptions = {},
  ): Promise<Segment> {
    const body = { segment, force: options.force ?? false };
    const claim = await client.request("POST", `/runs/${seg(runId)}/claim`, body, { signal: options.signal });
    return new Segment(client, checks.answer(checks.claim, claim));
  }

  /** The lease left when the server last answered, in milliseconds. */
  get leaseMs(): number {
    return this.#leaseMs;
  }

  /** Whether this segment no longer owns the run (told so by the server, or its report came late). */
  get fenced(): boolean {
    return this.#fenced !== undefined;
  }

  /** The three credentials every call as the segment carries. */
  #credentials(): { segment: string; epoch: number; claim: string } {
    return { segment: this.name, epoch: this.epoch, claim: this.#claim };
  }

  async #call(path: string, body: Record<string, unknown>, options: RequestOptions = {}): Promise<unknown> {
    if (this.#fenced !== undefined) throw this.#fenced;
    try {
      return await this.#client.request("POST", path, { ...this.#credentials(), ...body }, options);
    } catch (error) {
      if (Fenced.isInstance(error)) this.#fence(error);
      throw error;
    }
  }

  /** From now on every call of this segment throws `error`: it sends nothing more (F1, F2). */
  #fence(error: CharterError): void {
    this.#fenced = error;
    this.stopRenewing();
  }

  /** Renew the lease (repeatable: asked again when it got no answer); the lease left. */
  async renew(options: SegmentCallOptions = {}): Promise<number> {
    const answer = await this.#call(`/runs/${seg(this.runId)}/renew`, {}, { ...options, idempotent: true });
    this.#leaseMs = checks.answer(checks.renewed, answer).lease_ms;
    return this.#leaseMs;
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
  async release(options: SegmentCallOptions = {}): Promise<void> {
    this.stopRenewing();
    await this.#call(`/runs/${seg(this.runId)}/release`, {}, options);
  }

  /**
   * Start node `nodeId` (its journal is kept by the server, as the plan
   * runner keeps a Python node's) and answer its context. The execution is
   * the server's: the same one after a crash (the node was left running or
   * blocked), so its settled effects replay in it; a new one after the node
   * failed. Every `ctx.attempt` of the context is admitted as that execution.
   */
  async startNode(nodeId: string, options: SegmentCallOptions = {}): Promise<Context> {
    const path = `/runs/${seg(this.runId)}/nodes/${seg(nodeId)}/start`;
    const started = checks.answer(checks.nodeStarted, await this.#call(path, {}, { ...options, idempotent: true }));
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
   * `null`). The same completion again answers the same; another result, or
   * an execution that is not the node's running one, is `StateError`
   * (`invalid_state`).
   */
  async completeNode(nodeId: string, execution: number, result: unknown, options: SegmentCallOptions = {}): Promise<NodeCompleted> {
    const path = `/runs/${seg(this.runId)}/nodes/${seg(nodeId)}/complete`;
    const body = { execution, result: result ?? null };
    return checks.answer(checks.nodeCompleted, await this.#call(path, body, { ...options, idempotent: true }));
  }

  /**
   * End the run, `completed` (the default) or `failed`, and answer it. Refused
   * as `StateError` (`invalid_state`, `unresolved` in its details) while any
   * attempt of the run is unresolved: settle those first. A finished run needs
   * no lease, so renewing stops.
   */
  async finish(status: "completed" | "failed" = "completed", reason?: string, options: SegmentCallOptions = {}): Promise<Run> {
    const body: Record<string, unknown> = { status };
    if (reason !== undefined) body["reason"] = reason;
    const run = checks.answer(checks.run, await this.#call(`/runs/${seg(this.runId)}/finish`, body, options));
    this.stopRenewing();
    return run;
  }

  /** @internal Admit, send and report one effect; see `Context.attempt`. */
  async perform(
    nodeId: string,
    execution: number,
    adapter: Adapter,
    operation: string,
    request: unknown,
    options: AttemptOptions,
  ): Promise<unknown> {
    const { key, signal } = options;
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
      signal?.throwIfAborted(); // nothing admitted yet: nothing to undo
      const startedAt = performance.now(); // before the dispatch commit: the deadline can only err early
      // The admission is never cancelled mid-flight: an admission the server
      // made and this process never heard of would stay DISPATCHED, unsent.
      const answer = await this.#call(`/runs/${seg(this.runId)}/attempts`, body);
      const admitted = checks.answer(checks.admitted, answer);
      const settled = this.#settled(admitted);
      if (settled !== undefined) return settled.value;
      const sent = await this.#send(admitted, adapter, operation, request, startedAt, signal);
      if (sent.status === "succeeded") return sent.result;
      if (signal?.aborted) throw signal.reason; // reported as what it came to; the caller asked to stop
      if (sent.status === "unknown" || sent.status === "dispatched") {
        throw new Blocked(`attempt ${admitted.attempt_id}'s outcome is unknown: it waits for evidence or a person`, {
          details: { run_id: this.runId, attempt_id: admitted.attempt_id },
        });
      }
      if (!sent.notSent || tries >= TRIES) {
        throw new AttemptFailed(`attempt ${admitted.attempt_id} ${sent.status}`, {
          details: { attempt_id: admitted.attempt_id, status: sent.status, result: sent.result },
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
    }
  }

  /**
   * Send an admitted attempt within its deadline and report what happened.
   * A report answered `late` (the run was taken over during the send) fences
   * this segment and throws `LateReport`, as the Rust SDK does.
   */
  async #send(
    admitted: Admitted,
    adapter: Adapter,
    operation: string,
    request: unknown,
    startedAt: number,
    signal: AbortSignal | undefined,
  ): Promise<Sent> {
    const attemptId = admitted.attempt_id;
    let order: ReturnType<typeof checks.sendOrder>;
    try {
      order = checks.answer(checks.sendOrder, admitted);
    } catch (error) {
      // Nothing can be sent without its key and token: proven not applied, so
      // the attempt does not stay DISPATCHED. The protocol error is what the
      // caller needs to hear, whatever the report answers.
      const proof = { reason: `the admission's answer could not be used: ${describe(error)}` };
      await this.#report(attemptId, { outcome: "not_applied", proof }).catch(() => undefined);
      throw error;
    }
    const limit = deadline(startedAt, order.send_deadline_ms);
    let report: Record<string, unknown>;
    let result: unknown;
    let notSent = false;
    if (signal?.aborted || limit.remainingMs() <= 0) {
      const reason = signal?.aborted ? "cancelled before sending" : "send deadline passed";
      report = { outcome: "not_applied", proof: { reason } };
      notSent = true;
    } else {
      const send: Dispatch = {
        attemptId,
        runId: this.runId,
        epoch: admitted.epoch ?? this.epoch,
        operation,
        request,
        idempotencyKey: order.idempotency_key,
        fencingToken: order.fencing_token,
        deadlineMs: limit.remainingMs(),
        signal: signal ?? new AbortController().signal,
        ...limit,
      };
      try {
        const outcome: Outcome = await adapter.dispatch(send);
        report = { outcome: outcome.status, ...outcomeBody(outcome) };
        delete report["status"];
        if (outcome.priceSource !== undefined) report["price_source"] = outcome.priceSource;
        result = outcome.result;
      } catch (error) {
        if (NotApplied.isInstance(error)) {
          report = { outcome: "not_applied", proof: { reason: error.reason, ...error.evidence } };
          notSent = true;
        } else if (OutcomeUnknown.isInstance(error)) {
          report = { outcome: "unknown", reason: error.reason, detail: error.evidence };
        } else {
          const why = signal?.aborted ? `cancelled during the send: ${describe(error)}` : describe(error);
          report = { outcome: "unknown", reason: why, detail: null };
        }
      }
    }
    const reported = await this.#report(attemptId, report);
    if (reported.late) {
      const late = new LateReport(
        `attempt ${attemptId} was reported after this segment lost the run: kept as evidence, ` +
          `the attempt is ${reported.status}; send nothing more for this run`,
        { details: { run_id: this.runId, attempt_id: attemptId, status: reported.status, settled: reported.settled } },
      );
      this.#fence(late);
      throw late;
    }
    return { status: reported.status, result, notSent };
  }

  /**
   * Report an outcome. It is idempotent by attempt id, so the client asks
   * again when it got no answer (its retry policy); never cancelled by the
   * caller's signal, so that what was sent is on the record.
   */
  async #report(attemptId: string, report: Record<string, unknown>): Promise<Reported> {
    try {
      const answer = await this.#call(`/attempts/${seg(attemptId)}/report`, report, { idempotent: true });
      return checks.answer(checks.reported, answer);
    } catch (error) {
      if (!CharterError.isInstance(error) || !error.retryable) throw error;
      throw new SettlementUnrecorded(
        `attempt ${attemptId} was sent and its report was not recorded (${error.message}): it stays ` +
          "dispatched with its hold; recover the run, then reconcile it — never send it again",
        { details: { attempt_id: attemptId, run_id: this.runId }, cause: error },
      );
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
   * `Fenced` (this segment lost the run: send nothing more; `LateReport`, a
   * kind of it, when that happened during this send), `SettlementUnrecorded`
   * (sent, and its report not recorded after the retries: recover and
   * reconcile it), the signal's reason when cancelled (see `AttemptOptions`),
   * or the typed refusal of admission (`AllowanceExceeded`, `ApprovalRequired`, ...).
   */
  async attempt<Result = unknown, Request = any>(
    adapter: Adapter<Request, Result>,
    operation: string,
    request: Request,
    options: AttemptOptions,
  ): Promise<Result> {
    // The result is what the adapter answered, or its record replayed (the same JSON).
    return (await this.segment.perform(this.nodeId, this.execution, adapter, operation, request, options)) as Result;
  }

  /** Record this execution's result (see `Segment.completeNode`). */
  async complete(result: unknown, options: SegmentCallOptions = {}): Promise<NodeCompleted> {
    return this.segment.completeNode(this.nodeId, this.execution, result, options);
  }
}
