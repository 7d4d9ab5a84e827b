/**
 * Typed errors: one root, `CharterError`, whose `code` is the engine's stable
 * code (docs/cli.md, "Errors"). The server answers `{"error": {"code",
 * "message", ...details}}`; `fromAnswer` turns that into the most specific
 * class the SDK knows, so a caller can `catch (e) { if (LeaseHeld.isInstance(e)) ... }`
 * or match on `e.code`. A code this SDK does not know yet still arrives as a
 * `CharterError` carrying that code: the code is the contract, the class a
 * convenience. Kinds mirror the engine's hierarchy (`LeaseHeld` is a
 * `StateError`), so handling a general code handles its kinds alike.
 *
 * Two copies of this package in one program (its ES module and its CommonJS
 * build, or two versions side by side) have two sets of classes, and
 * `instanceof` fails across them. Every error here carries a marker under
 * `Symbol.for(...)`, the same in every copy, and each class's static
 * `isInstance` recognises its kinds by the codes they carry: prefer it to
 * `instanceof` where the error may come from another copy.
 */

export type Details = Readonly<Record<string, unknown>>;

/** The marker every CharterError carries, the same symbol in every copy of the package. */
const MARKER = Symbol.for("@charter/sdk.error");
/** The marker of an adapter's signals (`NotApplied`, `OutcomeUnknown`), keyed by their name. */
const SIGNAL = Symbol.for("@charter/sdk.signal");

export interface ErrorOptions {
  code?: string;
  status?: number;
  details?: Details;
  /** What went wrong underneath: the network's error, the answer it came from. */
  cause?: unknown;
  /** Whether the same call may be made again as is (overrides the class's default). */
  retryable?: boolean;
}

export class CharterError extends Error {
  static readonly code: string = "charter_error";
  /** Whether an error of this class may be retried as is, unless told otherwise. */
  static readonly retryable: boolean = false;
  /** The engine's stable code: the thing to match on. */
  readonly code: string;
  /** The HTTP status the server answered with, when the error came from it. */
  readonly status: number | undefined;
  /** Further keys of the error: the IDs involved, `status`, `epoch`, ... */
  readonly details: Details;
  /**
   * Whether making the same call again is safe and may succeed: a busy store
   * (`store_busy`, nothing was written), or no answer to a call the server
   * answers the same when repeated (a read, a report). The client's retry
   * policy retries exactly these; an error it gives up on keeps the flag.
   */
  readonly retryable: boolean;
  /** The codes of this error's class and of every class above it, most specific first. */
  readonly kinds: readonly string[];
  readonly [MARKER] = true;

  constructor(message: string, options: ErrorOptions = {}) {
    super(message, options.cause === undefined ? undefined : { cause: options.cause });
    const cls = new.target as typeof CharterError;
    this.name = cls.name;
    this.code = options.code ?? cls.code;
    this.status = options.status;
    this.details = options.details ?? {};
    this.retryable = options.retryable ?? cls.retryable;
    const kinds: string[] = options.code !== undefined && options.code !== cls.code ? [options.code] : [];
    for (let c: unknown = cls; typeof c === "function" && c !== Error; c = Object.getPrototypeOf(c)) {
      kinds.push((c as typeof CharterError).code);
    }
    this.kinds = kinds;
  }

  /**
   * Whether `value` is an error of this class or one of its kinds, made by
   * this copy of the package or by any other: it carries the marker and this
   * class's code among its kinds.
   */
  static isInstance<T extends typeof CharterError>(this: T, value: unknown): value is InstanceType<T> {
    if (typeof value !== "object" || value === null || (value as Record<symbol, unknown>)[MARKER] !== true) return false;
    const kinds = (value as { kinds?: unknown }).kinds;
    return this.code === CharterError.code || (Array.isArray(kinds) && kinds.includes(this.code));
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
/** The store was busy and wrote nothing: the server says to try again (docs/protocol.md). */
export class StoreBusy extends StoreError {
  static override readonly code: string = "store_busy";
  static override readonly retryable: boolean = true;
}
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
/**
 * This segment lost the run while an effect was being sent (a takeover): its
 * report was kept as late evidence, not as the settlement (F2). A kind of
 * `Fenced`: send nothing more for this run. `details` names the attempt and
 * its status as recorded.
 */
export class LateReport extends Fenced { static override readonly code: string = "late_report"; }
/** A node cannot go on past an unresolved attempt or a wait; the run is durable. */
export class Blocked extends CharterError { static override readonly code: string = "blocked"; }
export class UnexpectedError extends CharterError { static override readonly code: string = "unexpected_error"; }
/**
 * The SDK's own: the request never got an answer from the server (refused
 * connection, reset, timeout). For a decision (a POST) this says nothing about
 * whether the server acted: read the state again before deciding anew.
 */
export class TransportError extends CharterError { static override readonly code: string = "transport_error"; }
/**
 * The SDK's own: the server answered something the protocol does not say it
 * answers (a field missing or of the wrong type). `details.at` says where.
 */
export class ProtocolError extends CharterError { static override readonly code: string = "protocol_error"; }

const CLASSES: readonly (typeof CharterError)[] = [
  CharterError, ConfigError, MissingExtra, ContractError, NotFound, AuthenticationError,
  NotAuthorized, StateError, AttemptAlreadySettled, RunTerminal, SegmentReused, LeaseHeld,
  NeedsIntervention, ApprovalRequired, PlanError, WaitError, AmountOverflow, MissionSealed,
  SliceUnavailable, AdmissionRefused, AllowanceExceeded, AttemptFailed, AnswerNotRecorded,
  NodeFailed, AdapterError, SecretUnavailable, NonDeterminismError, ArtifactError, AuditError,
  SnapshotRefused, SnapshotMalformed, SnapshotTampered, SignatureInvalid, ExportRefused,
  StoreError, StoreBusy, StoreConflict, StoreChanged, SchemaError, SettlementUnrecorded,
  StoreNotFound, UsageError, TextRefused, CsrfRefused, BodyTooLarge, MalformedBody, Fenced,
  Blocked, UnexpectedError, TransportError, LateReport, ProtocolError,
];

/** Every code this SDK has a class for, and that class. */
export const ERRORS: ReadonlyMap<string, typeof CharterError> = new Map(
  CLASSES.map((cls) => [cls.code, cls]),
);

const GATEWAY = new Set([502, 503, 504]);

/**
 * The typed error for a server's error answer (`{"error": {...}}`). An answer
 * that is not one (a proxy's HTML page, say) still becomes a `CharterError`
 * with code `unexpected_error` and the status, never a guess at a known code.
 */
export function fromAnswer(status: number, body: unknown, options: { idempotent?: boolean } = {}): CharterError {
  const error = isRecord(body) && isRecord(body["error"]) ? body["error"] : undefined;
  const code = typeof error?.["code"] === "string" ? error["code"] : undefined;
  if (error === undefined || code === undefined) {
    // A gateway's 502/503/504 (the engine never answers without its body): a
    // repeatable call may be asked again; whether a decision got through is unknown.
    return new UnexpectedError(`the server answered ${status} without an error body`, {
      status,
      details: { body },
      retryable: GATEWAY.has(status) && options.idempotent === true,
    });
  }
  const { code: _code, message, ...details } = error;
  const text = typeof message === "string" ? message : `the server answered ${status} ${code}`;
  const cls = ERRORS.get(code) ?? CharterError;
  return new cls(text, { code, status, details });
}

/** What `NotApplied` and `OutcomeUnknown` share: a reason, evidence, and a marker every copy reads. */
abstract class Signal extends Error {
  readonly evidence: Record<string, unknown>;
  readonly reason: string;
  readonly [SIGNAL]: string;

  constructor(name: string, reason: string, evidence: Record<string, unknown>, cause: unknown) {
    super(reason, cause === undefined ? undefined : { cause });
    this.name = name;
    this.reason = reason;
    this.evidence = evidence;
    this[SIGNAL] = name;
  }
}

function signalled(value: unknown, name: string): boolean {
  return typeof value === "object" && value !== null && (value as Record<symbol, unknown>)[SIGNAL] === name;
}

/**
 * Thrown by an adapter's `dispatch` to *prove* the target did not apply the
 * effect (A3): the connection was refused before a byte went out, the send
 * deadline had passed, or the target answered with a refusal it documents as
 * made before processing. Any other exception leaves the attempt UNKNOWN.
 */
export class NotApplied extends Signal {
  constructor(reason: string, evidence: Record<string, unknown> = {}, options: { cause?: unknown } = {}) {
    super("NotApplied", reason, evidence, options.cause);
  }

  /** Whether `value` is a `NotApplied` of any copy of the package. */
  static isInstance(value: unknown): value is NotApplied {
    return signalled(value, "NotApplied");
  }
}

/**
 * Thrown by an adapter that cannot tell whether the target acted but has
 * something to show for it (A3): the attempt is UNKNOWN and `evidence` is kept.
 */
export class OutcomeUnknown extends Signal {
  constructor(reason: string, evidence: Record<string, unknown> = {}, options: { cause?: unknown } = {}) {
    super("OutcomeUnknown", reason, evidence, options.cause);
  }

  /** Whether `value` is an `OutcomeUnknown` of any copy of the package. */
  static isInstance(value: unknown): value is OutcomeUnknown {
    return signalled(value, "OutcomeUnknown");
  }
}

export function isRecord(value: unknown): value is Record<string, unknown> {
  return typeof value === "object" && value !== null && !Array.isArray(value);
}
