"""Charter's errors: one root, a shallow tree, behaviour carried as data.

This module is where errors are imported from (``from charter.errors import
NeedsIntervention``), as a client's exceptions are in httpx or Temporal.
Every error a caller can act on derives from :class:`CharterError` and carries
a stable ``code`` (the JSON CLI output and the HTTP API answer with it) and its
details as data (``to_dict``). The message says what was wrong and what to do
about it::

    CharterError
    ├── ConfigError                 engine configuration is unusable
    │   └── MissingExtra            a feature's optional extra is not installed
    ├── ContractError               a contract is malformed
    ├── NotFound                    an unknown mission, run, attempt, incident
    ├── AuthenticationError         unknown or forged identity (P1)
    ├── NotAuthorized               authenticated, but lacks the right (P1)
    ├── StateError                  the request does not fit the recorded state
    │   ├── AttemptAlreadySettled   settling what is settled (A4)
    │   ├── RunTerminal             a terminal run is never reopened (N4)
    │   ├── SegmentReused           a segment ID the run has used (R1)
    │   ├── LeaseHeld               the owner's lease has not expired (R1)
    │   ├── NeedsIntervention       the run needs a person (R6, A6)
    │   ├── SegmentFenced           a remote segment's call after it was fenced (X1, F1)
    │   ├── ApprovalRequired        the effect waits for an approval (W2)
    │   ├── PlanError               a plan or a change to it is refused; nothing ran
    │   ├── WaitError               an answer or a signal is refused (W1)
    │   ├── AmountOverflow          a ledger sum would pass 2^63 - 1 (A9)
    │   ├── MissionSealed           an imported or handed-over mission is read-only (S2, S5)
    │   └── SliceUnavailable        an escrow slice cannot serve this; its mission's gate does (L10)
    ├── ArtifactError               an artifact's name, hash or object is refused (N2)
    ├── AdmissionRefused            A1 checks failed; nothing was recorded
    │   └── AllowanceExceeded       L3/L7: the allowance cannot cover it
    ├── AttemptFailed               an effect settled FAILED or WRITTEN_OFF (A4)
    ├── AnswerNotRecorded           an effect settled applied, its answer never recorded (N6)
    ├── NodeFailed                  node code declares its step failed (N6)
    ├── AdapterError                an adapter broke its protocol
    ├── SecretUnavailable           a secret's value is not to be had here (S3)
    ├── NonDeterminismError         a replayed call differs from its record (A6)
    ├── AuditError                  the hash chain does not verify (S1)
    ├── SnapshotRefused             an import refused; nothing was written (S2)
    │   ├── SnapshotMalformed       not a snapshot of a known format, or unsafe to read
    │   ├── SnapshotTampered        the chain, a digest or the state does not check
    │   ├── SignatureInvalid        no trusted key signed it as it is
    │   └── ExportRefused           an export an import would refuse; nothing fenced (S5)
    ├── UsageError                  a request malformed as written (CLI arguments, paging)
    │   └── TextRefused             text no store keeps as given: a NUL, a lone surrogate (A10)
    └── StoreError                  the store cannot serve the request
        ├── StoreBusy               bounded busy wait ran out
        ├── StoreConflict           a uniqueness or integrity rule refused a write
        ├── StoreChanged            rows a transaction recalled had changed; nothing written
        ├── SchemaError             the store's schema is unknown or newer
        ├── SettlementUnrecorded    sent, but its settlement could not be committed (A4)
        └── StoreNotFound           no store there, and none was to be created

Signals that user code must not swallow derive from ``BaseException``, so
that a node's ``except Exception`` lets them through; what an adapter raises
to say what became of a send derives from ``Exception`` and is no caller's
error (A3)::

    BaseException
    ├── Fenced                      this executor no longer owns the run (F1, F2)
    └── Blocked                     a node cannot go on past an unresolved attempt or a wait
        └── WaitPending             the node waits for an answer, a timer or a signal (W1)
    Exception
    ├── NotApplied                  the adapter proves the target did not apply it (A3)
    └── OutcomeUnknown              the adapter cannot tell, and has evidence (A3)

The face, ``charter``, lists in its ``__all__`` only the errors user code
meets in its own code: :class:`CharterError`; the signals :class:`Blocked`
and :class:`Fenced` a node lets through; :class:`AttemptFailed` and
:class:`AnswerNotRecorded` that ``ctx.attempt`` raises and
:class:`ApprovalRequired` that ``executor.perform`` raises; :class:`NodeFailed`
that node code raises; :class:`NotApplied` and :class:`OutcomeUnknown` that
an adapter raises. Every other error is still reachable as ``charter.<Name>``,
so code written against the face before keeps working (httpx and Temporal
re-export theirs the same way), but the face does not list it: new code
imports it from here.
"""

from __future__ import annotations

from typing import Any

__all__ = [
    "AdapterError",
    "AdmissionRefused",
    "AllowanceExceeded",
    "AmountOverflow",
    "AnswerNotRecorded",
    "ApprovalRequired",
    "ArtifactError",
    "AttemptAlreadySettled",
    "AttemptFailed",
    "AuditError",
    "AuthenticationError",
    "Blocked",
    "CharterError",
    "ConfigError",
    "ContractError",
    "ExportRefused",
    "Fenced",
    "LeaseHeld",
    "MissingExtra",
    "MissionSealed",
    "NeedsIntervention",
    "NodeFailed",
    "NonDeterminismError",
    "NotApplied",
    "NotAuthorized",
    "NotFound",
    "OutcomeUnknown",
    "PlanError",
    "RunTerminal",
    "SchemaError",
    "SecretUnavailable",
    "SegmentFenced",
    "SegmentReused",
    "SettlementUnrecorded",
    "SignatureInvalid",
    "SliceUnavailable",
    "SnapshotMalformed",
    "SnapshotRefused",
    "SnapshotTampered",
    "StateError",
    "StoreBusy",
    "StoreChanged",
    "StoreConflict",
    "StoreError",
    "StoreNotFound",
    "TextRefused",
    "UsageError",
    "WaitError",
    "WaitPending",
]


class CharterError(Exception):
    """Root of every error Charter raises for a caller to handle."""

    code = "charter_error"

    def __init__(self, message: str, **details: Any) -> None:
        super().__init__(message)
        self.message = message
        self.details = details

    def to_dict(self) -> dict[str, Any]:
        """The error as data: stable code, message and details (for ``--json``)."""
        return {"code": self.code, "message": self.message, **self.details}


class ConfigError(CharterError):
    code = "config_error"


class MissingExtra(ConfigError, ImportError):
    """A feature needs an optional extra that is not installed; ``extra`` names it.

    Also an :class:`ImportError`, since that is what it is.
    """

    code = "missing_extra"


class ContractError(CharterError):
    code = "contract_error"


class NotFound(CharterError):
    code = "not_found"


class AuthenticationError(CharterError):
    code = "unauthenticated"


class NotAuthorized(CharterError):
    code = "not_authorized"


class StateError(CharterError):
    code = "invalid_state"


class AttemptAlreadySettled(StateError):
    code = "attempt_settled"


class RunTerminal(StateError):
    code = "run_terminal"


class SegmentReused(StateError):
    code = "segment_reused"


class LeaseHeld(StateError):
    code = "lease_held"


class NeedsIntervention(StateError):
    code = "needs_intervention"


class SegmentFenced(StateError):
    """A remote client's call as a segment that no longer holds its run (X1,
    F1): taken over, its lease expired, or another executor holds the segment.
    :class:`Fenced` as an answer: the client must send nothing more for the run;
    ``current_epoch`` is the run's epoch now."""

    code = "fenced"


class ApprovalRequired(StateError):
    code = "approval_required"


class PlanError(StateError):
    """A plan or a change to it is refused before anything runs: a cycle, an
    unknown dependency, a duplicate node id, a node function the plan does not
    offer. ``plan`` names the plan; nothing was recorded."""

    code = "invalid_plan"


class ArtifactError(CharterError):
    """An artifact name, hash or object is refused (N2): a hostile name, a hash
    that is not SHA-256 hex, an object that is missing or is not a plain file
    inside the store. Nothing outside the store was read or written."""

    code = "invalid_artifact"


class WaitError(StateError):
    """An answer or a signal is refused (W1): no such wait, one already
    satisfied, or an answer of the wrong type. Nothing changed."""

    code = "invalid_wait"


class AmountOverflow(StateError):
    """A ledger sum (``spent``, ``held``, a limit) would pass 2^63 - 1 (A9).

    Each amount was valid; recorded together with the balances they are not.
    Nothing was written. ``unit``, ``account`` and ``amount`` say which sum.
    """

    code = "amount_overflow"


class AdmissionRefused(CharterError):
    code = "admission_refused"


class AllowanceExceeded(AdmissionRefused):
    code = "allowance_exceeded"


class AttemptFailed(CharterError):
    """A journaled call's attempt settled FAILED or WRITTEN_OFF.

    A node may catch it and try again: the next call with a new effect key is
    a new attempt (A4). ``attempt_id`` and ``status`` say which and how.
    """

    code = "attempt_failed"


class AnswerNotRecorded(CharterError):
    """A journaled call's effect was applied, and its answer was never recorded (N6).

    The attempt settled SUCCEEDED on evidence that names no result (a usage
    lookup, which proves what was billed and not what was said) or by a person
    who gave none, so there is nothing true to hand the node. It is raised,
    not returned, so that code which does not expect it stops instead of
    going on with a made-up value; a node that can go on without the answer
    catches it. ``attempt_id``, ``scope`` and ``status`` say which effect. A
    ``read_only`` effect never gets here while its retry policy lasts: it is
    asked again as a new attempt linked to the settled one (a model call's
    only consequence is its cost). A person resolving an attempt gives the
    answer with ``result=`` to let the node go on with it.
    """

    code = "answer_not_recorded"


class NodeFailed(CharterError):
    """Raised by node code to declare that its step failed (N6): a verdict on the
    work, such as a refused order, not a bug. The execution fails and counts
    against the node's ``retries``; when they are spent the run ends ``failed``.
    Any other exception a node raises leaves the run ``needs_intervention``."""

    code = "node_failed"


class AdapterError(CharterError):
    code = "adapter_error"


class SecretUnavailable(CharterError):
    """A secret's value is not to be had here: it was never recorded (S3)."""

    code = "secret_unavailable"


class NonDeterminismError(CharterError):
    code = "non_determinism"


class AuditError(CharterError):
    code = "audit_broken"


class MissionSealed(StateError):
    """The mission's chain is sealed: imported (a read-only copy) or handed over
    to another store (S2, S5). Nothing more is recorded on it here; ``reason`` says
    which, and what to do."""

    code = "mission_sealed"


class SliceUnavailable(StateError):
    """An escrow slice of a mission's allowance cannot serve a transaction (L10):
    it cannot cover the estimate, its lease lapsed, it was returned, or the
    mission cannot lend one now (``why`` says which). Inside a lane the
    transaction goes through the mission's gate instead; a lease refused says
    why, and the worker admits through the mission's gate meanwhile."""

    code = "slice_unavailable"


class SnapshotRefused(CharterError):
    """An import refused a snapshot before writing anything (S2). ``problem`` is a
    stable short name of what is wrong; ``entry`` (and ``seq``) say where."""

    code = "snapshot_refused"


class SnapshotMalformed(SnapshotRefused):
    """Not a snapshot this engine reads: the archive, an entry's name or size, the
    format version or a record's schema; or a request no snapshot can meet."""

    code = "snapshot_malformed"


class SnapshotTampered(SnapshotRefused):
    """Well formed, but the audit chain, an entry's digest or the state it carries
    does not check: the file was changed after it was signed."""

    code = "snapshot_tampered"


class SignatureInvalid(SnapshotRefused):
    """The signature does not verify with a trusted key: signed by an unknown key,
    or the signed statement was changed."""

    code = "signature_invalid"


class ExportRefused(SnapshotRefused):
    """An export refused to make a snapshot that an import would refuse (S5): an
    entry or the file past the format's bounds, or records that do not check.
    ``problem`` and ``entry`` are the import's. Checked before a handover fences
    anything, so the mission stays here, unfenced, and goes on here."""

    code = "export_refused"


class StoreError(CharterError):
    code = "store_error"


class StoreBusy(StoreError):
    code = "store_busy"


class StoreConflict(StoreError):
    code = "store_conflict"


class StoreChanged(StoreError):
    """A transaction decided on rows it recalled from its engine's last commit on
    the mission, and the store found under the mission's gate that one of them
    had changed since: nothing of it was written. The engine runs it again on
    fresh reads; it reaches a caller only from a transaction opened by hand
    with ``recall=True``."""

    code = "store_changed"


class SchemaError(StoreError):
    code = "schema_error"


class SettlementUnrecorded(StoreError):
    """An attempt was sent and its settlement could not be committed (A4).

    The attempt stays DISPATCHED with its hold: an uncertainty, not a failure.
    Nothing may retry it; recover the run and reconcile the attempt. A node
    that meets it blocks (the engine turns it into :class:`Blocked`).
    """

    code = "settlement_unrecorded"


class StoreNotFound(StoreError):
    """Opening an existing store found none there (``Engine.open(create=False)``)."""

    code = "store_not_found"


class UsageError(CharterError):
    """A request that is malformed as written — a command line, an amount, a page
    size or cursor — refused before the store is read or written."""

    code = "usage_error"


class TextRefused(UsageError):
    """Text that cannot be stored as given is refused before anything is written
    (A10): a NUL (U+0000) in an identifier or in text kept as it is (PostgreSQL
    holds no NUL in text), or a lone surrogate anywhere (it is not Unicode: no
    store keeps it and no adapter can send it). ``field`` names the value (or
    the store's parameter), ``problem`` is ``"nul"`` or ``"surrogate"`` and
    ``position`` where in the text it is."""

    code = "text_refused"


class NotApplied(Exception):
    """Raised by an adapter to *prove* the target did not apply the effect (A3).

    Use it only when non-application is certain: the connection was refused
    before any byte was sent, the send deadline had passed so nothing was sent,
    or the target answered with an error class it documents as rejected before
    processing. Any other exception makes the attempt UNKNOWN.
    """

    def __init__(self, reason: str, *, evidence: dict[str, Any] | None = None) -> None:
        super().__init__(reason)
        self.reason = reason
        self.evidence = evidence or {}


class OutcomeUnknown(Exception):
    """Raised by an adapter that cannot tell whether the target acted but has
    something to show for it (A3): the attempt is UNKNOWN and ``evidence`` is
    recorded, e.g. the usage a model stream reported before it was cut off."""

    def __init__(self, reason: str, *, evidence: dict[str, Any] | None = None) -> None:
        super().__init__(reason)
        self.reason = reason
        self.evidence = evidence or {}


class Fenced(BaseException):
    """This executor lost ownership of its run (F1/F2): stop, send nothing more.

    A ``BaseException`` so that a node's broad ``except Exception`` cannot
    swallow it and carry on sending as a zombie.
    """

    def __init__(self, message: str, *, run_id: str, epoch: int, current_epoch: int) -> None:
        super().__init__(message)
        self.run_id = run_id
        self.epoch = epoch
        self.current_epoch = current_epoch


class Blocked(BaseException):
    """A node cannot go on: an attempt is unresolved or a wait is pending (A6, W1).

    The run is left in a durable state; ``reason`` and ``attempt_id`` say what
    must happen (reconcile, resolve, approve) before it can resume.
    """

    def __init__(self, reason: str, *, run_id: str, attempt_id: str | None = None) -> None:
        super().__init__(reason)
        self.reason = reason
        self.run_id = run_id
        self.attempt_id = attempt_id


class WaitPending(Blocked):
    """A node waits for an answer, a timer or a signal (W1); ``wait_id`` names it.

    Nothing runs meanwhile: the run is ``waiting`` and a resume (``charter
    wait`` does it when something is due) replays the node, which then reads
    what arrived.
    """

    def __init__(self, reason: str, *, run_id: str, wait_id: str) -> None:
        super().__init__(reason, run_id=run_id)
        self.wait_id = wait_id
