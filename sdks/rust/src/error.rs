//! Errors: the server's codes as a typed enum, and what the SDK itself meets.
//!
//! A client reacts to a code, never to a message's wording. The server's codes
//! form a small tree (`lease_held` is a kind of `invalid_state`,
//! `allowance_exceeded` a kind of `admission_refused`, `malformed_body` a kind
//! of `usage_error`), so [`Error::is`] answers for a code and its kinds alike.
//! Both enums are `#[non_exhaustive]`: a code or a failure added later is a
//! new variant, and a `match` written today keeps compiling.

use std::error::Error as StdError;
use std::fmt;
use std::sync::Arc;

use serde_json::{Map, Value};

use crate::records::AttemptStatus;

/// One of the engine's error codes, as the server answers them
/// (`src/charter/errors.py`, and the HTTP gate's own two).
#[derive(Debug, Clone, PartialEq, Eq, Hash)]
#[non_exhaustive]
pub enum Code {
    CharterError,
    UsageError,
    TextRefused,
    MalformedBody,
    BodyTooLarge,
    ContractError,
    Unauthenticated,
    NotAuthorized,
    NotFound,
    InvalidState,
    AttemptSettled,
    RunTerminal,
    SegmentReused,
    LeaseHeld,
    NeedsIntervention,
    ApprovalRequired,
    InvalidPlan,
    InvalidWait,
    AmountOverflow,
    MissionSealed,
    SliceUnavailable,
    Fenced,
    InvalidArtifact,
    AdmissionRefused,
    AllowanceExceeded,
    AttemptFailed,
    AnswerNotRecorded,
    NodeFailed,
    NonDeterminism,
    AdapterError,
    SecretUnavailable,
    AuditBroken,
    SnapshotRefused,
    SnapshotMalformed,
    SnapshotTampered,
    SignatureInvalid,
    ExportRefused,
    ConfigError,
    MissingExtra,
    StoreError,
    StoreBusy,
    StoreConflict,
    StoreChanged,
    SchemaError,
    SettlementUnrecorded,
    StoreNotFound,
    /// A code this SDK does not know yet, kept as the server spelled it.
    Other(String),
}

const NAMES: &[(&str, Code)] = &[
    ("charter_error", Code::CharterError),
    ("usage_error", Code::UsageError),
    ("text_refused", Code::TextRefused),
    ("malformed_body", Code::MalformedBody),
    ("body_too_large", Code::BodyTooLarge),
    ("contract_error", Code::ContractError),
    ("unauthenticated", Code::Unauthenticated),
    ("not_authorized", Code::NotAuthorized),
    ("not_found", Code::NotFound),
    ("invalid_state", Code::InvalidState),
    ("attempt_settled", Code::AttemptSettled),
    ("run_terminal", Code::RunTerminal),
    ("segment_reused", Code::SegmentReused),
    ("lease_held", Code::LeaseHeld),
    ("needs_intervention", Code::NeedsIntervention),
    ("approval_required", Code::ApprovalRequired),
    ("invalid_plan", Code::InvalidPlan),
    ("invalid_wait", Code::InvalidWait),
    ("amount_overflow", Code::AmountOverflow),
    ("mission_sealed", Code::MissionSealed),
    ("slice_unavailable", Code::SliceUnavailable),
    ("fenced", Code::Fenced),
    ("invalid_artifact", Code::InvalidArtifact),
    ("admission_refused", Code::AdmissionRefused),
    ("allowance_exceeded", Code::AllowanceExceeded),
    ("attempt_failed", Code::AttemptFailed),
    ("answer_not_recorded", Code::AnswerNotRecorded),
    ("node_failed", Code::NodeFailed),
    ("non_determinism", Code::NonDeterminism),
    ("adapter_error", Code::AdapterError),
    ("secret_unavailable", Code::SecretUnavailable),
    ("audit_broken", Code::AuditBroken),
    ("snapshot_refused", Code::SnapshotRefused),
    ("snapshot_malformed", Code::SnapshotMalformed),
    ("snapshot_tampered", Code::SnapshotTampered),
    ("signature_invalid", Code::SignatureInvalid),
    ("export_refused", Code::ExportRefused),
    ("config_error", Code::ConfigError),
    ("missing_extra", Code::MissingExtra),
    ("store_error", Code::StoreError),
    ("store_busy", Code::StoreBusy),
    ("store_conflict", Code::StoreConflict),
    ("store_changed", Code::StoreChanged),
    ("schema_error", Code::SchemaError),
    ("settlement_unrecorded", Code::SettlementUnrecorded),
    ("store_not_found", Code::StoreNotFound),
];

impl Code {
    /// The code the server spelled.
    pub fn parse(name: &str) -> Code {
        NAMES
            .iter()
            .find(|(n, _)| *n == name)
            .map(|(_, c)| c.clone())
            .unwrap_or_else(|| Code::Other(name.to_string()))
    }

    /// The code as the server spells it.
    pub fn as_str(&self) -> &str {
        match self {
            Code::Other(name) => name,
            known => NAMES.iter().find(|(_, c)| c == known).map(|(n, _)| *n).unwrap_or(""),
        }
    }

    /// The code this one is a kind of, as the engine's error classes inherit
    /// (every code is a kind of `charter_error`, the root, which has none).
    pub fn parent(&self) -> Option<Code> {
        use Code::*;
        match self {
            CharterError => None,
            TextRefused | MalformedBody | BodyTooLarge => Some(UsageError),
            AttemptSettled | RunTerminal | SegmentReused | LeaseHeld | NeedsIntervention
            | ApprovalRequired | InvalidPlan | InvalidWait | AmountOverflow | MissionSealed
            | SliceUnavailable => Some(InvalidState),
            AllowanceExceeded => Some(AdmissionRefused),
            SnapshotMalformed | SnapshotTampered | SignatureInvalid | ExportRefused => {
                Some(SnapshotRefused)
            }
            MissingExtra => Some(ConfigError),
            StoreBusy | StoreConflict | StoreChanged | SchemaError | SettlementUnrecorded
            | StoreNotFound => Some(StoreError),
            // A code this SDK does not know yet is still one of the engine's.
            _ => Some(CharterError),
        }
    }

    /// Whether this code is `other` or one of its kinds.
    pub fn is_a(&self, other: &Code) -> bool {
        let mut code = Some(self.clone());
        while let Some(c) = code {
            if &c == other {
                return true;
            }
            code = c.parent();
        }
        false
    }
}

impl fmt::Display for Code {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        f.write_str(self.as_str())
    }
}

/// The cause of a failure below this crate (an I/O error, a JSON error), kept
/// whole so that [`std::error::Error::source`] reaches it; shared, so that an
/// [`Error`] stays `Clone`.
pub type Cause = Arc<dyn StdError + Send + Sync + 'static>;

/// Everything a call of this SDK can fail with.
#[derive(Debug, Clone)]
#[non_exhaustive]
pub enum Error {
    /// The server refused the request with one of the engine's codes; `details`
    /// is the rest of the error object (an `attempt_id`, `blockers`...).
    Api { status: u16, code: Code, message: String, details: Map<String, Value> },
    /// No answer from the server (refused connection, timeout, reset), after
    /// the retries the client's [`crate::Retry`] allows. `request` names it
    /// (`POST /runs/{id}/attempts`). For a call that writes, whether the server
    /// recorded it is not known unless `sent` is false (the connection was
    /// never made). The transport's own error is the [`source`](StdError::source).
    Transport { request: String, sent: bool, source: Cause },
    /// The server answered something this protocol does not say it answers.
    Protocol(String),
    /// The caller's own input was refused before anything was sent.
    Usage(String),
    /// The effect settled failed, not applied or written off: its record.
    AttemptFailed { attempt_id: String, status: AttemptStatus, result: Value },
    /// The effect's outcome is uncertain (UNKNOWN or still DISPATCHED): the node
    /// must stop; evidence or a person settles it. Never re-sent on a guess.
    Blocked { attempt_id: String, status: AttemptStatus },
    /// The attempt was voided and never sent (an approval was denied).
    Voided { attempt_id: String, reason: String },
    /// This segment lost the run while the effect was being sent (a takeover):
    /// its report was kept as evidence, not as the settlement (F2). Send
    /// nothing more for this run; `status` is the attempt's as recorded.
    LateReport { attempt_id: String, status: AttemptStatus },
    /// The effect was sent and its report did not reach the server, even
    /// re-sent: the attempt stays DISPATCHED there. Recover, then reconcile;
    /// never send it again. `cause` (also the `source`) is the last failure.
    SettlementUnrecorded { attempt_id: String, cause: Box<Error> },
    /// The effect settled succeeded, and its recorded result is not of the
    /// type the caller asked for. It is not sent again: the record is `result`.
    UnexpectedResult { attempt_id: String, result: Value, source: Cause },
}

impl Error {
    /// The server's code, when the server answered one.
    pub fn code(&self) -> Option<&Code> {
        match self {
            Error::Api { code, .. } => Some(code),
            _ => None,
        }
    }

    /// Whether the server answered `code` or one of its kinds.
    pub fn is(&self, code: &Code) -> bool {
        self.code().map_or(false, |c| c.is_a(code))
    }

    /// Whether this segment lost the run: it must send nothing more for it.
    pub fn is_fenced(&self) -> bool {
        matches!(self, Error::LateReport { .. }) || self.code() == Some(&Code::Fenced)
    }

    /// A detail of the server's error (`attempt_id`, `approval_id`, ...).
    pub fn detail(&self, name: &str) -> Option<&Value> {
        match self {
            Error::Api { details, .. } => details.get(name),
            _ => None,
        }
    }

    /// A transport failure from any error type the HTTP stack gives.
    pub(crate) fn transport<E>(request: String, sent: bool, source: E) -> Error
    where
        E: StdError + Send + Sync + 'static,
    {
        Error::Transport { request, sent, source: Arc::new(source) }
    }
}

impl fmt::Display for Error {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        match self {
            Error::Api { status, code, message, .. } => write!(f, "{code} ({status}): {message}"),
            Error::Transport { request, sent: false, .. } => {
                write!(f, "{request}: no connection to the server")
            }
            Error::Transport { request, .. } => write!(f, "{request}: no answer from the server"),
            Error::Protocol(why) => write!(f, "unexpected answer from the server: {why}"),
            Error::Usage(why) => write!(f, "refused before sending: {why}"),
            Error::AttemptFailed { attempt_id, status, .. } => {
                write!(f, "attempt {attempt_id} settled {status}")
            }
            Error::Blocked { attempt_id, status } => {
                write!(f, "attempt {attempt_id} is {status}: it waits for evidence or a person")
            }
            Error::Voided { attempt_id, reason } => {
                write!(f, "attempt {attempt_id} was voided: {reason}")
            }
            Error::LateReport { attempt_id, status } => write!(
                f,
                "attempt {attempt_id} was reported after this segment lost the run: kept as \
                 evidence, the attempt is {status}; send nothing more for this run"
            ),
            Error::SettlementUnrecorded { attempt_id, .. } => write!(
                f,
                "attempt {attempt_id} was sent and its report not recorded: recover and \
                 reconcile it, never send it again"
            ),
            Error::UnexpectedResult { attempt_id, .. } => write!(
                f,
                "attempt {attempt_id} succeeded and its recorded result is not of the type asked for"
            ),
        }
    }
}

impl StdError for Error {
    fn source(&self) -> Option<&(dyn StdError + 'static)> {
        match self {
            Error::Transport { source, .. } | Error::UnexpectedResult { source, .. } => {
                Some(source.as_ref())
            }
            Error::SettlementUnrecorded { cause, .. } => Some(cause.as_ref()),
            _ => None,
        }
    }
}

pub type Result<T> = std::result::Result<T, Error>;

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn every_code_reads_back_as_the_server_spells_it_and_unknown_ones_are_kept() {
        for (name, code) in NAMES {
            assert_eq!(Code::parse(name), *code);
            assert_eq!(code.as_str(), *name);
        }
        let new = Code::parse("some_new_code");
        assert_eq!((new.as_str(), new.parent()), ("some_new_code", Some(Code::CharterError)));
    }

    #[test]
    fn p1_item6_a_kind_is_its_parent_code_too_and_not_the_other_way() {
        assert!(Code::LeaseHeld.is_a(&Code::InvalidState));
        assert!(Code::AllowanceExceeded.is_a(&Code::AdmissionRefused));
        assert!(Code::StoreBusy.is_a(&Code::StoreError));
        assert!(Code::MalformedBody.is_a(&Code::UsageError));
        assert!(Code::BodyTooLarge.is_a(&Code::UsageError));
        assert!(Code::SettlementUnrecorded.is_a(&Code::StoreError));
        assert!(Code::SignatureInvalid.is_a(&Code::SnapshotRefused));
        // Fenced stands alone, as the engine's `Fenced` signal and the TypeScript SDK's do:
        // code that handles `invalid_state` must not swallow the loss of the run.
        assert!(!Code::Fenced.is_a(&Code::InvalidState));
        assert!(Code::NotFound.is_a(&Code::CharterError));
        assert!(!Code::InvalidState.is_a(&Code::LeaseHeld));
        assert!(!Code::UsageError.is_a(&Code::MalformedBody));
    }

    #[test]
    fn p1_item6_a_settlement_unrecorded_shows_its_cause_and_the_transport_error_under_it() {
        let io = std::io::Error::new(std::io::ErrorKind::ConnectionReset, "reset by peer");
        let lost = Error::transport("POST /attempts/att_1/report".into(), true, io);
        let unrecorded =
            Error::SettlementUnrecorded { attempt_id: "att_1".into(), cause: Box::new(lost) };
        let cause = unrecorded.source().expect("its cause");
        assert!(cause.to_string().contains("/attempts/att_1/report"), "{cause}");
        let io = cause.source().expect("the transport's own error");
        assert_eq!(io.to_string(), "reset by peer");
    }
}
