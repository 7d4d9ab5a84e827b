/**
 * The server's answers checked as they arrive, never cast: a small validator
 * per record of `./records.js`, each checking the fields the SDK declares
 * (their presence and JSON type) and keeping any field the server adds later
 * as it came. An answer that does not hold is a `ProtocolError` naming where
 * (`details.at`), instead of an `undefined` found three calls later.
 */

import { ProtocolError, isRecord } from "./errors.js";
import type {
  Admitted,
  Attempt,
  AttemptDetail,
  AttemptStatus,
  AuditVerification,
  Balance,
  ChainVerification,
  Claim,
  Decided,
  EffectClass,
  EvidenceRecord,
  Incident,
  IncidentClosed,
  Ledger,
  LimitRaised,
  Me,
  NextAction,
  NodeCompleted,
  NodeRecord,
  NodeStarted,
  Page,
  Reconciled,
  RecoveryRecord,
  Renewed,
  Reported,
  Resumed,
  Run,
  RunStatus,
  Verdict,
  Waits,
} from "./records.js";

/** Checks `value` (found at `at` in an answer) and answers it typed, or throws `ProtocolError`. */
export type Check<T> = (value: unknown, at: string) => T;

function wrong(at: string, want: string, value: unknown): never {
  const shown = JSON.stringify(value)?.slice(0, 200) ?? String(value);
  throw new ProtocolError(`the server answered ${shown} at ${at}, where the protocol says ${want}`, {
    details: { at, value },
  });
}

export const string: Check<string> = (v, at) => (typeof v === "string" ? v : wrong(at, "a string", v));
export const boolean: Check<boolean> = (v, at) => (typeof v === "boolean" ? v : wrong(at, "a boolean", v));
/** A whole number JavaScript holds exactly (IDs' counters, epochs, amounts, microseconds). */
export const integer: Check<number> = (v, at) =>
  typeof v === "number" && Number.isSafeInteger(v) ? v : wrong(at, "a whole number", v);
/** Any JSON: a request, a result, a receipt, as recorded. */
export const json: Check<unknown> = (v) => v;

export function nullable<T>(check: Check<T>): Check<T | null> {
  return (v, at) => (v === null ? null : check(v, at));
}

export function optional<T>(check: Check<T>): Check<T | undefined> {
  return (v, at) => (v === undefined ? undefined : check(v, at));
}

export function oneOf<T extends string>(...values: readonly T[]): Check<T> {
  return (v, at) => ((values as readonly unknown[]).includes(v) ? (v as T) : wrong(at, `one of ${values.join(", ")}`, v));
}

export function array<T>(check: Check<T>): Check<T[]> {
  return (v, at) => (Array.isArray(v) ? v.map((item, i) => check(item, `${at}[${i}]`)) : wrong(at, "a list", v));
}

export function dict<T>(check: Check<T>): Check<Record<string, T>> {
  return (v, at) => {
    if (!isRecord(v)) return wrong(at, "an object", v);
    for (const [key, item] of Object.entries(v)) check(item, `${at}.${key}`);
    return v as Record<string, T>;
  };
}

/**
 * An object with every field `fields` names checked; fields it does not name
 * are kept as they came (a newer server may add some). The mapped type makes
 * the compiler hold each validator to its interface: a field declared and not
 * checked, or checked as the wrong type, does not compile.
 */
export function shape<T extends object>(fields: { [K in keyof T]-?: Check<T[K]> }): Check<T> {
  return (v, at) => {
    if (!isRecord(v)) return wrong(at, "an object", v);
    for (const [key, check] of Object.entries(fields) as [string, Check<unknown>][]) check(v[key], `${at}.${key}`);
    return v as T;
  };
}

/** `check` run on an answer: the entry point every typed call uses. */
export function answer<T>(check: Check<T>, value: unknown): T {
  return check(value, "answer");
}

const amounts = dict(integer);
const runStatus: Check<RunStatus> = oneOf(
  "queued", "active", "waiting", "paused", "needs_intervention", "stopping",
  "completed", "failed", "cancelled", "stopped", "handed_off",
);
const attemptStatus: Check<AttemptStatus> = oneOf(
  "prepared", "dispatched", "unknown", "succeeded", "failed", "written_off", "voided",
);
const effectClass: Check<EffectClass> = oneOf("read_only", "idempotent_keyed", "unsafe");
const verdict: Check<Verdict> = oneOf("applied", "not_applied", "indeterminate");

export const claim: Check<Claim> = shape<Claim>({
  run_id: string, mission_id: string, segment: string, epoch: integer, claim: string,
  lease_ms: integer, status: runStatus,
});

export const renewed: Check<Renewed> = shape<Renewed>({ run_id: string, segment: string, epoch: integer, lease_ms: integer });

export const admitted: Check<Admitted> = shape<Admitted>({
  action: oneOf("send", "replay", "blocked", "voided"),
  attempt_id: string,
  status: attemptStatus,
  idempotency_key: optional(string),
  fencing_token: optional(string),
  send_deadline_ms: optional(integer),
  run_id: optional(string),
  epoch: optional(integer),
  result: json,
  cost: optional(nullable(amounts)),
  receipt: json,
  reason: optional(nullable(string)),
});

/** A `send` answer carries what the send needs: checked before anything is sent. */
export const sendOrder: Check<Required<Pick<Admitted, "idempotency_key" | "fencing_token" | "send_deadline_ms">>> = shape({
  idempotency_key: string,
  fencing_token: string,
  send_deadline_ms: integer,
});

export const reported: Check<Reported> = shape<Reported>({
  attempt_id: string, status: attemptStatus, settled: boolean, late: boolean,
});

export const nodeStarted: Check<NodeStarted> = shape<NodeStarted>({ run_id: string, node_id: string, execution: integer });

export const nodeCompleted: Check<NodeCompleted> = shape<NodeCompleted>({
  run_id: string, node_id: string, execution: integer, result_hash: string,
});

export const run: Check<Run> = shape<Run>({
  id: string, mission_id: string, principal: string, status: runStatus, status_reason: nullable(string),
  epoch: integer, owner_segment: nullable(string), lease_expires_us: integer, recoveries: integer,
  linked_from: nullable(string), created_at_us: integer, updated_at_us: integer,
});

const attemptFields = {
  id: string, mission_id: string, run_id: string, node_id: nullable(string), execution: nullable(integer),
  effect_key: string, adapter: string, operation: string, effect_class: effectClass, status: attemptStatus,
  principal: string, admitted_epoch: integer, dispatched_epoch: nullable(integer), idempotency_key: string,
  request_hash: string, request: json, estimate: amounts, actual: nullable(amounts), result: json,
  receipt: json, price_source: nullable(string), retry_of: nullable(string), reason: nullable(string),
  prepared_at_us: integer, dispatched_at_us: nullable(integer), settled_at_us: nullable(integer),
  generation: integer, answered: boolean,
};

export const attempt: Check<Attempt> = shape<Attempt>(attemptFields);

const flag: Check<boolean | 0 | 1> = (v, at) => (v === 0 || v === 1 ? v : boolean(v, at));
const evidence: Check<EvidenceRecord> = shape<EvidenceRecord>({ id: string, verdict, settled: optional(flag) });

export const attemptDetail: Check<AttemptDetail> = shape<AttemptDetail>({
  ...attemptFields,
  evidence: array(evidence),
  next_action: nullable(string),
});

const node: Check<NodeRecord> = shape<NodeRecord>({
  node_id: string, execution: integer, status: string, crashes: integer,
  result_hash: nullable(string), error: nullable(string),
});

const nextAction: Check<NextAction> = shape<NextAction>({
  kind: oneOf("attempt", "attempts", "node", "run"), id: string, phase: string, action: string,
});

export const recovery: Check<RecoveryRecord> = shape<RecoveryRecord>({
  run_id: string, epoch: integer, status: runStatus, status_reason: nullable(string),
  owner_segment: nullable(string), linked_from: nullable(string), contract_version: integer,
  plan: nullable(string), nodes: array(node), unresolved: array(string), attempts: array(attempt),
  voided: array(string), settled_counts: dict(integer), waits: array(dict(json)), assessment: dict(json),
  next_actions: array(nextAction),
});

export const reconciled: Check<Reconciled> = shape<Reconciled>({
  attempt_id: string, verdict, detail: json, status: attemptStatus, settled: boolean,
});

export const resumed: Check<Resumed> = shape<Resumed>({
  run_id: string, status: runStatus, epoch: integer, result: json,
  blocked: optional(shape<NonNullable<Resumed["blocked"]>>({ reason: string, attempt_id: nullable(string) })),
  go_ahead: optional(string),
});

const balance = {
  limit: integer, available: integer, held: integer, spent: integer, overrun: integer,
};

export const ledger: Check<Ledger> = shape<Ledger>({
  mission_id: string,
  balances: array(shape<Balance & { unit: string }>({ ...balance, unit: string })),
  problems: array(string),
});

export const limitRaised: Check<LimitRaised> = shape<LimitRaised>({
  mission_id: string, contract_version: integer, balance: shape<Balance>(balance),
});

export const incident: Check<Incident> = shape<Incident>({
  id: string, mission_id: string, run_id: nullable(string), attempt_id: nullable(string), kind: string,
  detail: string, status: oneOf("open", "closed"), opened_at_us: integer, closed_at_us: nullable(integer),
  closed_by: nullable(string), close_note: nullable(string),
});

const chain: Check<ChainVerification> = shape<ChainVerification>({
  mission_id: string, events: integer, ok: boolean, broken_at: nullable(integer), problem: nullable(string),
});

export const audit: Check<AuditVerification> = shape<AuditVerification>({ ok: boolean, chains: array(chain) });

export const waits: Check<Waits> = shape<Waits>({ run_id: string, status: runStatus, waits: array(dict(json)) });

export function page<T>(item: Check<T>): Check<Page<T>> {
  return shape<Page<T>>({ items: array(item), next: nullable(string) });
}

export const decided: Check<Decided> = shape<Decided>({ approval_id: string, status: string });

export const incidentClosed: Check<IncidentClosed> = shape<IncidentClosed>({ incident_id: string, status: oneOf("closed") });

export const me: Check<Me> = shape<Me>({ principal: string });
