/**
 * Typed errors: one root, `CharterError`, whose `code` is the engine's stable
 * code (docs/cli.md, "Errors"). The server answers `{"error": {"code",
 * "message", ...details}}`; `fromAnswer` turns that into the most specific
 * class the SDK knows, so a caller can `catch (e) { if (e instanceof LeaseHeld) ... }`
 * or match on `e.code`. A code this SDK does not know yet still arrives as a
 * `CharterError` carrying that code: the code is the contract, the class a
 * convenience. Kinds mirror the engine's hierarchy (`LeaseHeld` is a
 * `StateError`), so handling a general code handles its kinds alike.
 */

export type Details = Readonly<Record<string, unknown>>;

export class CharterError extends Error {
  static readonly code: string = "charter_error";
  /** The engine's stable code: the thing to match on. */
  readonly code: string;
  /** The HTTP status the server answered with, when the error came from it. */
  readonly status: number | undefined;
  /** Further keys of the error: the IDs involved, `status`, `epoch`, ... */
  readonly details: Details;

  constructor(message: string, options: { code?: string; status?: number; details?: Details } = {}) {
    super(message);
    this.name = new.target.name;
    this.code = options.code ?? (new.target as typeof CharterError).code;
    this.status = options.status;
    this.details = options.details ?? {};
  }
}

export class ConfigError extends CharterError { static override readonly code: string = "config_error"; }
export class MissingExtra extends ConfigError { static override readonly code: string = "missing_extra"; }
export class ContractError extends CharterError { static override readonly code: string = "contract_error"; }
export class NotFound extends CharterError { static override readonly code: string = "not_found"; }
export class AuthenticationError extends CharterError { static override readonly code: string = "unauthenticated"; }
export class NotAuthorized extends CharterError { static override readonly code: string = "not_authorized"; }
export class StateError extends CharterError { static override readonly code: string = "invalid_state"; }
export class AttemptAlreadySettled extends StateError { static override readonly code: string = "attempt_settled"; }
export class RunTerminal extends StateError { static override readonly code: string = "run_terminal"; }
export class SegmentReused extends StateError { static override readonly code: string = "segment_reused"; }
export class LeaseHeld extends StateError { static override readonly code: string = "lease_held"; }
export class NeedsIntervention extends StateError { static override readonly code: string = "needs_intervention"; }
export class ApprovalRequired extends StateError { static override readonly code: string = "approval_required"; }
export class PlanError extends StateError { static override readonly code: string = "invalid_plan"; }
export class WaitError extends StateError { static override readonly code: string = "invalid_wait"; }
export class AmountOverflow extends StateError { static override readonly code: string = "amount_overflow"; }
export class MissionSealed extends StateError { static override readonly code: string = "mission_sealed"; }
export class SliceUnavailable extends StateError { static override readonly code: string = "slice_unavailable"; }
export class AdmissionRefused extends CharterError { static override readonly code: string = "admission_refused"; }
export class AllowanceExceeded extends AdmissionRefused { static override readonly code: string = "allowance_exceeded"; }
export class AttemptFailed extends CharterError { static override readonly code: string = "attempt_failed"; }
export class AnswerNotRecorded extends CharterError { static override readonly code: string = "answer_not_recorded"; }
export class NodeFailed extends CharterError { static override readonly code: string = "node_failed"; }
export class AdapterError extends CharterError { static override readonly code: string = "adapter_error"; }
export class SecretUnavailable extends CharterError { static override readonly code: string = "secret_unavailable"; }
export class NonDeterminismError extends CharterError { static override readonly code: string = "non_determinism"; }
export class ArtifactError extends CharterError { static override readonly code: string = "invalid_artifact"; }
export class AuditError extends CharterError { static override readonly code: string = "audit_broken"; }
export class SnapshotRefused extends CharterError { static override readonly code: string = "snapshot_refused"; }
export class SnapshotMalformed extends SnapshotRefused { static override readonly code: string = "snapshot_malformed"; }
export class SnapshotTampered extends SnapshotRefused { static override readonly code: string = "snapshot_tampered"; }
export class SignatureInvalid extends SnapshotRefused { static override readonly code: string = "signature_invalid"; }
export class ExportRefused extends SnapshotRefused { static override readonly code: string = "export_refused"; }
export class StoreError extends CharterError { static override readonly code: string = "store_error"; }
export class StoreBusy extends StoreError { static override readonly code: string = "store_busy"; }
export class StoreConflict extends StoreError { static override readonly code: string = "store_conflict"; }
export class StoreChanged extends StoreError { static override readonly code: string = "store_changed"; }
export class SchemaError extends StoreError { static override readonly code: string = "schema_error"; }
export class SettlementUnrecorded extends StoreError { static override readonly code: string = "settlement_unrecorded"; }
export class StoreNotFound extends StoreError { static override readonly code: string = "store_not_found"; }
export class UsageError extends CharterError { static override readonly code: string = "usage_error"; }
export class TextRefused extends UsageError { static override readonly code: string = "text_refused"; }
export class CsrfRefused extends UsageError { static override readonly code: string = "csrf_refused"; }
export class BodyTooLarge extends UsageError { static override readonly code: string = "body_too_large"; }
export class MalformedBody extends UsageError { static override readonly code: string = "malformed_body"; }
/** This segment no longer owns the run (F1, F2): send nothing more. */
export class Fenced extends CharterError { static override readonly code: string = "fenced"; }
/** A node cannot go on past an unresolved attempt or a wait; the run is durable. */
export class Blocked extends CharterError { static override readonly code: string = "blocked"; }
export class UnexpectedError extends CharterError { static override readonly code: string = "unexpected_error"; }
/**
 * The SDK's own: the request never got an answer from the server (refused
 * connection, reset, timeout). For a decision (a POST) this says nothing about
 * whether the server acted: read the state again before deciding anew.
 */
export class TransportError extends CharterError { static override readonly code: string = "transport_error"; }

const CLASSES: readonly (typeof CharterError)[] = [
  CharterError, ConfigError, MissingExtra, ContractError, NotFound, AuthenticationError,
  NotAuthorized, StateError, AttemptAlreadySettled, RunTerminal, SegmentReused, LeaseHeld,
  NeedsIntervention, ApprovalRequired, PlanError, WaitError, AmountOverflow, MissionSealed,
  SliceUnavailable, AdmissionRefused, AllowanceExceeded, AttemptFailed, AnswerNotRecorded,
  NodeFailed, AdapterError, SecretUnavailable, NonDeterminismError, ArtifactError, AuditError,
  SnapshotRefused, SnapshotMalformed, SnapshotTampered, SignatureInvalid, ExportRefused,
  StoreError, StoreBusy, StoreConflict, StoreChanged, SchemaError, SettlementUnrecorded,
  StoreNotFound, UsageError, TextRefused, CsrfRefused, BodyTooLarge, MalformedBody, Fenced,
  Blocked, UnexpectedError, TransportError,
];

/** Every code this SDK has a class for, and that class. */
export const ERRORS: ReadonlyMap<string, typeof CharterError> = new Map(
  CLASSES.map((cls) => [cls.code, cls]),
);

/**
 * The typed error for a server's error answer (`{"error": {...}}`). An answer
 * that is not one (a proxy's HTML page, say) still becomes a `CharterError`
 * with code `unexpected_error` and the status, never a guess at a known code.
 */
export function fromAnswer(status: number, body: unknown): CharterError {
  const error = isRecord(body) && isRecord(body["error"]) ? body["error"] : undefined;
  const code = typeof error?.["code"] === "string" ? error["code"] : undefined;
  if (error === undefined || code === undefined) {
    return new UnexpectedError(`the server answered ${status} without an error body`, {
      status,
      details: { body },
    });
  }
  const { code: _code, message, ...details } = error;
  const text = typeof message === "string" ? message : `the server answered ${status} ${code}`;
  const cls = ERRORS.get(code) ?? CharterError;
  return new cls(text, { code, status, details });
}

/**
 * Thrown by an adapter's `dispatch` to *prove* the target did not apply the
 * effect (A3): the connection was refused before a byte went out, the send
 * deadline had passed, or the target answered with a refusal it documents as
 * made before processing. Any other exception leaves the attempt UNKNOWN.
 */
export class NotApplied extends Error {
  readonly evidence: Record<string, unknown>;
  constructor(readonly reason: string, evidence: Record<string, unknown> = {}) {
    super(reason);
    this.name = "NotApplied";
    this.evidence = evidence;
  }
}

/**
 * Thrown by an adapter that cannot tell whether the target acted but has
 * something to show for it (A3): the attempt is UNKNOWN and `evidence` is kept.
 */
export class OutcomeUnknown extends Error {
  readonly evidence: Record<string, unknown>;
  constructor(readonly reason: string, evidence: Record<string, unknown> = {}) {
    super(reason);
    this.name = "OutcomeUnknown";
    this.evidence = evidence;
  }
}

export function isRecord(value: unknown): value is Record<string, unknown> {
  return typeof value === "object" && value !== null && !Array.isArray(value);
}
