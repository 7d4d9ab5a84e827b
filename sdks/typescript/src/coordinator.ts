/**
 * The recovery API with the seed's names (R1-R9, X2):
 *
 *     const { state, unresolved } = await coordinator.recover(runId, segmentId);
 *     await coordinator.reconcile(attemptId, adapter);
 *
 * `recover` reads and fences (a new epoch, older prepared attempts voided,
 * dispatched ones of older owners UNKNOWN with their holds kept); it never
 * sends and never resumes. Every call is one request the engine authorises
 * and audits under the client's principal.
 */

import { seg } from "./transport.js";
import type { Requester } from "./transport.js";
import type { Adapter } from "./adapter.js";
import { reconcileWith } from "./adapter.js";
import type { Amounts, Attempt, RecoveryRecord, Reconciled, Resumed } from "./records.js";

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
  async recover(runId: string, segmentId: string, options: { force?: boolean } = {}): Promise<RecoveryState> {
    const body = { segment: segmentId, force: options.force ?? false };
    const record = await this.#client.request("POST", `/runs/${seg(runId)}/recover`, body);
    return new RecoveryState(record as RecoveryRecord);
  }

  /** The recovery state without taking ownership (a read). */
  async state(runId: string): Promise<RecoveryState> {
    const record = await this.#client.request("GET", `/runs/${seg(runId)}`);
    return new RecoveryState(record as RecoveryRecord);
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
  async reconcile(attemptId: string, adapter?: Adapter, options: { segment?: string } = {}): Promise<Reconciled> {
    if (adapter !== undefined) return reconcileWith(this.#client, attemptId, adapter);
    const body = options.segment === undefined ? {} : { segment: options.segment };
    return (await this.#client.request("POST", `/attempts/${seg(attemptId)}/reconcile`, body)) as Reconciled;
  }

  /** Settle an uncertain attempt on its recorded evidence (the newest conclusive one by default). */
  async confirm(attemptId: string, options: { evidenceId?: string } = {}): Promise<Attempt> {
    const body = options.evidenceId === undefined ? {} : { evidence_id: options.evidenceId };
    return (await this.#client.request("POST", `/attempts/${seg(attemptId)}/confirm`, body)) as Attempt;
  }

  /** A person's settlement of an uncertain attempt, with their evidence and the actual cost. */
  async resolve(attemptId: string, options: ResolveOptions): Promise<Attempt> {
    const body: Record<string, unknown> = { outcome: options.outcome, evidence: options.evidence };
    if (options.cost !== undefined) body["cost"] = options.cost;
    if (options.confirmAboveHold !== undefined) body["confirm_above_hold"] = options.confirmAboveHold;
    return (await this.#client.request("POST", `/attempts/${seg(attemptId)}/resolve`, body)) as Attempt;
  }

  /**
   * Continue the run under the engine's resume policy: the server runs its
   * remaining nodes as `segmentId` (default: the run's owner) and answers
   * where it stands — completed with its result, or blocked and why. A run
   * workers carry, resumed without a segment, is given this principal's
   * go-ahead instead (`go_ahead` in the answer): the next worker continues it.
   */
  async resume(runId: string, segmentId?: string): Promise<Resumed> {
    const body = segmentId === undefined ? {} : { segment: segmentId };
    return (await this.#client.request("POST", `/runs/${seg(runId)}/resume`, body)) as Resumed;
  }
}
