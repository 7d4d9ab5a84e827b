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

export type Verdict = "applied" | "not_applied" | "indeterminate";

/** What every claiming call answers: the segment's three credentials and its lease. */
export interface Claim {
  run_id: string;
  mission_id: string;
  segment: string;
  epoch: number;
  /** The secret claim token: every call as the segment carries it. */
  claim: string;
  lease_ms: number;
  status: RunStatus;
}

/** What a renewal answers: the lease left. */
export interface Renewed {
  run_id: string;
  segment: string;
  epoch: number;
  lease_ms: number;
}

/** The server's answer to an admission: what the client does with the effect. */
export interface Admitted {
  action: "send" | "replay" | "blocked" | "voided";
  attempt_id: string;
  status: AttemptStatus;
  idempotency_key?: string;
  fencing_token?: string;
  send_deadline_ms?: number;
  run_id?: string;
  epoch?: number;
  result?: unknown;
  cost?: Amounts | null;
  receipt?: unknown;
  reason?: string | null;
}

/** What a report answers; `late` when the segment lost the run during the send (F2). */
export interface Reported {
  attempt_id: string;
  status: AttemptStatus;
  settled: boolean;
  late: boolean;
}

/** What starting a node answers: the execution to run now. */
export interface NodeStarted {
  run_id: string;
  node_id: string;
  execution: number;
}

/** A run's waits: approvals pending, expired and flagged, timers, questions. */
export interface Waits {
  run_id: string;
  status: RunStatus;
  waits: Record<string, unknown>[];
}

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

/** One piece of evidence on an attempt (its other fields are kept as the server sent them). */
export interface EvidenceRecord {
  id: string;
  verdict: Verdict;
  /** Whether it settled the attempt, as the store keeps the flag (SQLite's 0 or 1, PostgreSQL's boolean). */
  settled?: boolean | 0 | 1;
}

/** An attempt with its evidence so far and the next safe action (null once settled). */
export interface AttemptDetail extends Attempt {
  evidence: EvidenceRecord[];
  next_action: string | null;
}

export interface NextAction {
  /** `attempts` is the one line about the settled ones together (its `id` is `settled`). */
  kind: "attempt" | "attempts" | "node" | "run";
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
  verdict: Verdict;
  detail: unknown;
  status: AttemptStatus;
  settled: boolean;
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

/** What approving or denying an approval answers. */
export interface Decided {
  approval_id: string;
  status: string;
}

/** What closing an incident answers. */
export interface IncidentClosed {
  incident_id: string;
  status: "closed";
}

/** The principal a credential proves. */
export interface Me {
  principal: string;
}
