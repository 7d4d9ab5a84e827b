//! Errors: the server's codes as a typed enum, and what the SDK itself meets.
//!
//! A client reacts to a code, never to a message's wording. The server's codes
//! form a small tree (`lease_held` is a kind of `invalid_state`,
//! `allowance_exceeded` a kind of `admission_refused`), so [`Error::is`]
//! answers for a code and its kinds alike.

use std::fmt;

use serde_json::{Map, Value};

/// One of the engine's error codes, as the server answers them.
#[derive(Debug, Clone, PartialEq, Eq, Hash)]
pub enum Code {
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
    AdmissionRefused,
    AllowanceExceeded,
    NonDeterminism,
    AdapterError,
    ConfigError,
    MissingExtra,
    StoreError,
    StoreBusy,
    StoreConflict,
    StoreChanged,
    /// A code this SDK does not know yet, kept as the server spelled it.
    Other(String),
}

const NAMES: &[(&str, Code)] = &[
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
    ("admission_refused", Code::AdmissionRefused),
    ("allowance_exceeded", Code::AllowanceExceeded),
    ("non_determinism", Code::NonDeterminism),
    ("adapter_error", Code::AdapterError),
    ("config_error", Code::ConfigError),
    ("missing_extra", Code::MissingExtra),
    ("store_error", Code::StoreError),
    ("store_busy", Code::StoreBusy),
    ("store_conflict", Code::StoreConflict),
    ("store_changed", Code::StoreChanged),
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

    /// The code this one is a kind of (docs/cli.md's table of codes).
    pub fn parent(&self) -> Option<Code> {
        use Code::*;
        match self {
            TextRefused => Some(UsageError),
            AttemptSettled | RunTerminal | SegmentReused | LeaseHeld | NeedsIntervention
            | ApprovalRequired | InvalidPlan | InvalidWait | AmountOverflow | MissionSealed
            | SliceUnavailable => Some(InvalidState),
            AllowanceExceeded => Some(AdmissionRefused),
            MissingExtra => Some(ConfigError),
            StoreBusy | StoreConflict | StoreChanged => Some(StoreError),
            _ => None,
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

/// Everything a call of this SDK can fail with.
#[derive(Debug, Clone)]
pub enum Error {
    /// The server refused the request with one of the engine's codes; `details`
    /// is the rest of the error object (an `attempt_id`, `blockers`...).
    Api { status: u16, code: Code, message: String, details: Map<String, Value> },
    /// No answer from the server (refused connection, timeout, reset). For a
    /// call that writes, whether the server recorded it is not known.
    Transport(String),
    /// The server answered something this protocol does not say it answers.
    Protocol(String),
    /// The caller's own input was refused before anything was sent.
    Usage(String),
    /// The effect settled failed, not applied or written off: its record.
    AttemptFailed { attempt_id: String, status: String, result: Value },
    /// The effect's outcome is uncertain (UNKNOWN or still DISPATCHED): the node
    /// must stop; evidence or a person settles it. Never re-sent on a guess.
    Blocked { attempt_id: String, status: String },
    /// The attempt was voided and never sent (an approval was denied).
    Voided { attempt_id: String, reason: String },
    /// This segment lost the run while the effect was being sent (a takeover):
    /// its report was kept as evidence, not as the settlement (F2). Send
    /// nothing more for this run; `status` is the attempt's as recorded.
    LateReport { attempt_id: String, status: String },
    /// The effect was sent and its report did not reach the server: the attempt
    /// stays DISPATCHED there. Recover, then reconcile; never send it again.
    SettlementUnrecorded { attempt_id: String, cause: Box<Error> },
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
        matches!(self, Error::LateReport { .. }) || self.is(&Code::Fenced)
    }

    /// A detail of the server's error (`attempt_id`, `approval_id`, ...).
    pub fn detail(&self, name: &str) -> Option<&Value> {
        match self {
            Error::Api { details, .. } => details.get(name),
            _ => None,
        }
    }
}

impl fmt::Display for Error {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        match self {
            Error::Api { status, code, message, .. } => write!(f, "{code} ({status}): {message}"),
            Error::Transport(why) => write!(f, "no answer from the server: {why}"),
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
            Error::SettlementUnrecorded { attempt_id, cause } => write!(
                f,
                "attempt {attempt_id} was sent and its report not recorded ({cause}): \
                 recover and reconcile it, never send it again"
            ),
        }
    }
}

impl std::error::Error for Error {}

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
        assert_eq!((new.as_str(), new.parent()), ("some_new_code", None));
    }

    #[test]
    fn a_kind_is_its_parent_code_too_and_not_the_other_way() {
        assert!(Code::LeaseHeld.is_a(&Code::InvalidState));
        assert!(Code::AllowanceExceeded.is_a(&Code::AdmissionRefused));
        assert!(Code::StoreBusy.is_a(&Code::StoreError));
        assert!(!Code::InvalidState.is_a(&Code::LeaseHeld));
        assert!(!Code::Fenced.is_a(&Code::InvalidState));
    }
}
