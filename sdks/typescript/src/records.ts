/**
 * The records the API answers with, typed as they travel: field names as on
 * the wire (`run_id`, `idempotency_key`), so what a program reads is what the
 * server, the store and the other SDKs call it. Amounts are whole numbers in
 * each unit's smallest step; times are microseconds since the epoch by the
 * store's clock.
 */

export type RunStatus =
  | "queued" | "active" | "waiting" | "paused" | "needs_intervention" | "stopping"
  | "completed" | "failed" | "cancelled" | "stopped" | "handed_off";

export type AttemptStatus =
  | "prepared" | "dispatched" | "unknown" | "succeeded" | "failed" | "written_off" | "voided";

export type EffectClass = "read_only" | "idempotent_keyed" | "unsafe";

export type Amounts = Record<string, number>;

export interface Run {
  id: string;
  mission_id: string;
  principal: string;
  status: RunStatus;
  status_reason: string | null;
  epoch: number;
  owner_segment: string | null;
  lease_expires_us: number;
  recoveries: number;
  linked_from: string | null;
  created_at_us: number;
  updated_at_us: number;
}

export interface Attempt {
  id: string;
  mission_id: string;
  run_id: string;
  node_id: string | null;
  execution: number | null;
  effect_key: string;
  adapter: string;
  operation: string;
  effect_class: EffectClass;
  status: AttemptStatus;
  principal: string;
  admitted_epoch: number;
  dispatched_epoch: number | null;
  idempotency_key: string;
  request_hash: string;
  request: unknown;
  estimate: Amounts;
  actual: Amounts | null;
  result: unknown;
  receipt: unknown;
  price_source: string | null;
  retry_of: string | null;
  reason: string | null;
  prepared_at_us: number;
  dispatched_at_us: number | null;
  settled_at_us: number | null;
  generation: number;
  answered: boolean;
}

export interface EvidenceRecord {
  id: string;
  verdict: "applied" | "not_applied" | "indeterminate";
  settled?: boolean;
  [field: string]: unknown;
}

/** An attempt with its evidence so far and the next safe action (null once settled). */
export interface AttemptDetail extends Attempt {
  evidence: EvidenceRecord[];
  next_action: string | null;
}

export interface NextAction {
  kind: "attempt" | "node" | "run";
  id: string;
  phase: string;
  action: string;
}

/** One execution of a node as its journal records it (what `state` lists under `nodes`). */
export interface NodeRecord {
  node_id: string;
  execution: number;
  /** `running`, `blocked`, `completed` or `failed`. */
  status: string;
  crashes: number;
  /** The hash of the recorded result, once completed (N1). */
  result_hash: string | null;
  error: string | null;
}

/** What completing a node answers: its result is recorded with this hash (N1). */
export interface NodeCompleted {
  run_id: string;
  node_id: string;
  execution: number;
  result_hash: string;
}

/** What `recover` and `state` answer (R5): the run as recorded and what stands open. */
export interface RecoveryRecord {
  run_id: string;
  epoch: number;
  status: RunStatus;
  status_reason: string | null;
  owner_segment: string | null;
  linked_from: string | null;
  contract_version: number;
  plan: string | null;
  nodes: NodeRecord[];
  /** The IDs of the attempts sent and not settled. */
  unresolved: string[];
  attempts: Attempt[];
  voided: string[];
  settled_counts: Record<string, number>;
  waits: Record<string, unknown>[];
  assessment: Record<string, unknown>;
  next_actions: NextAction[];
}

/** What `reconcile` answers: the verdict recorded and where the attempt stands. */
export interface Reconciled {
  attempt_id: string;
  verdict: "applied" | "not_applied" | "indeterminate";
  detail: unknown;
  status: AttemptStatus;
  settled: boolean;
  [field: string]: unknown;
}

/**
 * What `resume` answers: the run's status after its plan ran, and why it
 * stopped if blocked; for a run workers carry, resumed without a segment, the
 * name of the principal whose go-ahead was recorded (the next worker continues it).
 */
export interface Resumed {
  run_id: string;
  status: RunStatus;
  epoch: number;
  result?: unknown;
  blocked?: { reason: string; attempt_id: string | null };
  go_ahead?: string;
}

/** One unit's accounts in a mission (L0-L2): `available + held + spent == limit`. */
export interface Balance {
  limit: number;
  available: number;
  held: number;
  spent: number;
  overrun: number;
}

/** A mission's balances per unit and what the ledger check found wrong (none: L0-L2 hold). */
export interface Ledger {
  mission_id: string;
  balances: (Balance & { unit: string })[];
  problems: string[];
}

/** What raising a limit answers: the new contract version and the unit's balance. */
export interface LimitRaised {
  mission_id: string;
  contract_version: number;
  balance: Balance;
}

/** An incident (L5): an anomaly that pauses a mission's runs until a person closes it. */
export interface Incident {
  id: string;
  mission_id: string;
  run_id: string | null;
  attempt_id: string | null;
  kind: string;
  detail: string;
  status: "open" | "closed";
  opened_at_us: number;
  closed_at_us: number | null;
  closed_by: string | null;
  close_note: string | null;
}

/** One audit hash chain as verified (S1): where it breaks, if it does. */
export interface ChainVerification {
  mission_id: string;
  events: number;
  ok: boolean;
  broken_at: number | null;
  problem: string | null;
}

/** The audit chains verified: `ok` only if every one of them is. */
export interface AuditVerification {
  ok: boolean;
  chains: ChainVerification[];
}

export interface Page<T> {
  items: T[];
  next: string | null;
}
