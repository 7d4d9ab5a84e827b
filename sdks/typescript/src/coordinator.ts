/**
 * The recovery API with the seed's names (R1-R9, X2), and the Rust SDK's:
 *
 *     const { state, unresolved } = await coordinator.recover(runId, segmentId);
 *     await coordinator.reconcile(attemptId, adapter);
 *     const segment = await coordinator.resume(runId, segmentId); // carried on here
 *
 * `recover` reads and fences (a new epoch, older prepared attempts voided,
 * dispatched ones of older owners UNKNOWN with their holds kept); it never
 * sends and never resumes. `resume` continues the run in this process as a
 * segment (docs/protocol.md, "Take over or continue"); `resumeOnServer`
 * continues a run whose plan runs on the server. Every call is one request
 * the engine authorises and audits under the client's principal.
 */

import * as checks from "./checks.js";
import { seg } from "./transport.js";
import type { Requester } from "./transport.js";
import type { Adapter } from "./adapter.js";
import { reconcileWith } from "./adapter.js";
import type { Amounts, Attempt, RecoveryRecord, Reconciled, Resumed } from "./records.js";
import { Segment } from "./segment.js";

/** Per call: a signal that cancels it (the call rejects with the signal's reason). */
interface CallOptions {
  signal?: AbortSignal;
}

/** The recovery state; unpacks as `{ state, unresolved }` (the seed's API). */
export class RecoveryState {
  /** The state as the server answered it. */
  readonly record: RecoveryRecord;

  constructor(record: RecoveryRecord) {
    this.record = record;
  }

  /** The state itself, so that `const { state, unresolved } = ...` reads as the seed does. */
  get state(): RecoveryState {
    return this;
  }

  /** The IDs of the attempts sent and not settled: each needs evidence or a person. */
  get unresolved(): string[] {
    return this.record.unresolved;
  }

  get runId(): string {
    return this.record.run_id;
  }

  get epoch(): number {
    return this.record.epoch;
  }

  get status(): RecoveryRecord["status"] {
    return this.record.status;
  }

  get ownerSegment(): string | null {
    return this.record.owner_segment;
  }

  /** The unresolved attempts in full. */
  get attempts(): Attempt[] {
    return this.record.attempts;
  }

  get voided(): string[] {
    return this.record.voided;
  }

  get nextActions(): RecoveryRecord["next_actions"] {
    return this.record.next_actions;
  }

  toJSON(): RecoveryRecord {
    return this.record;
  }
}

export interface ResolveOptions {
  outcome: "succeeded" | "failed" | "written_off";
  /** What the person saw: a receipt, a statement line, a ticket. */
  evidence: string;
  /** The actual cost per unit (whole numbers in each unit's smallest step). */
  cost?: Amounts;
  /** A cost over ten times the hold is refused unless this says it is meant. */
  confirmAboveHold?: boolean;
}

export class Coordinator {
  readonly #client: Requester;

  constructor(client: Requester) {
    this.#client = client;
  }

  /**
   * Take `runId` over as the new segment `segmentId` (a new ID per
   * continuation: `segment_reused` otherwise) and return the recovery state
   * and the unresolved attempt IDs. A live owner's lease is `lease_held`;
   * `force` takes it anyway (needs `stop`, audited).
   */
  async recover(runId: string, segmentId: string, options: { force?: boolean } & CallOptions = {}): Promise<RecoveryState> {
    const body = { segment: segmentId, force: options.force ?? false };
    const record = await this.#client.request("POST", `/runs/${seg(runId)}/recover`, body, { signal: options.signal });
    return new RecoveryState(checks.answer(checks.recovery, record));
  }

  /** The recovery state without taking ownership (a read). */
  async state(runId: string, options: CallOptions = {}): Promise<RecoveryState> {
    const record = await this.#client.request("GET", `/runs/${seg(runId)}`, undefined, options);
    return new RecoveryState(checks.answer(checks.recovery, record));
  }

  /**
   * Continue `runId` in this process as the segment `segmentId`, under the
   * engine's resume policy (R9), and answer the segment: the run's owner
   * segment continues at its epoch with a new claim once its executor let
   * go; a segment the run has never used takes it over first, as `recover`
   * would. Then start its nodes again through the segment: settled effects
   * replay. The same call as the Rust SDK's `coordinator.resume`.
   */
  async resume(runId: string, segmentId: string, options: CallOptions = {}): Promise<Segment> {
    return this.claim(runId, segmentId, options);
  }

  /** `resume`, with `force` past a live lease (needs `stop`; audited): `Segment.claim`. */
  async claim(runId: string, segmentId: string, options: { force?: boolean } & CallOptions = {}): Promise<Segment> {
    return Segment.claim(this.#client, runId, segmentId, options);
  }

  /**
   * Find out whether an uncertain attempt's effect happened. With `adapter`,
   * this process asks the target itself (`adapter.lookup`) and records what
   * it found as evidence on the server; without one, the server asks the
   * adapter its configuration declares for the attempt. Either way the
   * evidence is recorded, never edited; a person then confirms it (under
   * `evidence_settles = "confirm"`) with `confirm`. `segment` (the server's
   * reconcile only) names the segment `recover` installed, for a keyed replay.
   */
  async reconcile(attemptId: string, adapter?: Adapter, options: { segment?: string } & CallOptions = {}): Promise<Reconciled> {
    if (adapter !== undefined) return reconcileWith(this.#client, attemptId, adapter, options);
    const body = options.segment === undefined ? {} : { segment: options.segment };
    const path = `/attempts/${seg(attemptId)}/reconcile`;
    return checks.answer(checks.reconciled, await this.#client.request("POST", path, body, { signal: options.signal }));
  }

  /** Settle an uncertain attempt on its recorded evidence (the newest conclusive one by default). */
  async confirm(attemptId: string, options: { evidenceId?: string } & CallOptions = {}): Promise<Attempt> {
    const body = options.evidenceId === undefined ? {} : { evidence_id: options.evidenceId };
    const path = `/attempts/${seg(attemptId)}/confirm`;
    return checks.answer(checks.attempt, await this.#client.request("POST", path, body, { signal: options.signal }));
  }

  /** A person's settlement of an uncertain attempt, with their evidence and the actual cost. */
  async resolve(attemptId: string, options: ResolveOptions & CallOptions): Promise<Attempt> {
    const body: Record<string, unknown> = { outcome: options.outcome, evidence: options.evidence };
    if (options.cost !== undefined) body["cost"] = options.cost;
    if (options.confirmAboveHold !== undefined) body["confirm_above_hold"] = options.confirmAboveHold;
    const path = `/attempts/${seg(attemptId)}/resolve`;
    return checks.answer(checks.attempt, await this.#client.request("POST", path, body, { signal: options.signal }));
  }

  /**
   * Continue a run *whose plan runs on the server* (`charter worker`, a plan
   * the server imports): the server runs its remaining nodes as `segmentId`
   * (default: the run's owner) and answers where it stands — completed with
   * its result, or blocked and why. A run workers carry, resumed without a
   * segment, is given this principal's go-ahead instead (`go_ahead` in the
   * answer): the next worker continues it. The Rust SDK's `resume_on_server`.
   */
  async resumeOnServer(runId: string, segmentId?: string, options: CallOptions = {}): Promise<Resumed> {
    const body = segmentId === undefined ? {} : { segment: segmentId };
    const path = `/runs/${seg(runId)}/resume`;
    return checks.answer(checks.resumed, await this.#client.request("POST", path, body, options));
  }
}
