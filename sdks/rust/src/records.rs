//! What the server answers, as typed records. Fields the server may add later
//! are ignored. An identifier the server always sends is required: an answer
//! without one is a protocol error, never an empty string. Only what the
//! server may leave out (a list, an optional reference) has a default.
//! Statuses and verdicts are enums, `#[non_exhaustive]`, with a variant for
//! a value a newer server may send.

use std::collections::BTreeMap;
use std::fmt;

use serde::{Deserialize, Serialize};
use serde_json::{Map, Value};

/// Amounts per unit, in each unit's smallest step (A9: 0 to 2^63 - 1).
pub type Amounts = BTreeMap<String, u64>;

/// An attempt as recorded, as a lookup gets it.
#[derive(Debug, Clone, PartialEq)]
pub struct RecordedAttempt {
    pub id: String,
    pub run_id: String,
    pub adapter: String,
    pub operation: String,
    pub status: AttemptStatus,
    pub idempotency_key: String,
    pub request: Value,
    pub estimate: Amounts,
}

macro_rules! wire_enum {
    ($(#[$doc:meta])* $name:ident { $($(#[$vdoc:meta])* $variant:ident = $wire:literal,)* }) => {
        $(#[$doc])*
        #[derive(Debug, Clone, Copy, PartialEq, Eq, Hash, Serialize, Deserialize)]
        #[non_exhaustive]
        pub enum $name {
            $($(#[$vdoc])* #[serde(rename = $wire)] $variant,)*
            /// A value this SDK does not know yet (a newer server's).
            #[serde(other)]
            Unrecognized,
        }

        impl $name {
            /// As the server spells it (`"?"` for [`Self::Unrecognized`]).
            pub fn as_str(self) -> &'static str {
                match self {
                    $($name::$variant => $wire,)*
                    $name::Unrecognized => "?",
                }
            }
        }

        impl fmt::Display for $name {
            fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
                f.write_str(self.as_str())
            }
        }
    };
}

wire_enum! {
    /// Where an attempt stands (A2-A4).
    AttemptStatus {
        /// Admitted and recorded, not yet sent (waiting for an approval, say).
        Prepared = "prepared",
        /// Written down as sent: its outcome is not reported yet.
        Dispatched = "dispatched",
        /// Sent, and nobody knows what the target did: evidence or a person settles it.
        Unknown = "unknown",
        Succeeded = "succeeded",
        Failed = "failed",
        /// Settled by a person at a cost without knowing more.
        WrittenOff = "written_off",
        /// Never sent (a denied approval, a recovery before the send).
        Voided = "voided",
    }
}

impl AttemptStatus {
    /// Whether the attempt is settled: succeeded, failed or written off.
    pub fn settled(self) -> bool {
        matches!(self, AttemptStatus::Succeeded | AttemptStatus::Failed | AttemptStatus::WrittenOff)
    }

    /// Whether nobody knows yet what the send did (UNKNOWN, or DISPATCHED).
    pub fn unresolved(self) -> bool {
        matches!(self, AttemptStatus::Unknown | AttemptStatus::Dispatched)
    }
}

wire_enum! {
    /// Where a run stands.
    RunStatus {
        Queued = "queued",
        Active = "active",
        Waiting = "waiting",
        Paused = "paused",
        NeedsIntervention = "needs_intervention",
        Stopping = "stopping",
        Completed = "completed",
        Failed = "failed",
        Cancelled = "cancelled",
        Stopped = "stopped",
        HandedOff = "handed_off",
    }
}

wire_enum! {
    /// What a lookup found, as recorded (A8).
    Verdict {
        Applied = "applied",
        NotApplied = "not_applied",
        Indeterminate = "indeterminate",
    }
}

wire_enum! {
    /// One execution of a node, as its journal records it.
    NodeStatus {
        Running = "running",
        Blocked = "blocked",
        Completed = "completed",
        Failed = "failed",
    }
}

/// What an uncertain send of an operation may have done (A7).
#[derive(Debug, Clone, Copy, PartialEq, Eq, Hash, Serialize, Deserialize)]
#[serde(rename_all = "snake_case")]
#[non_exhaustive]
pub enum EffectClass {
    /// No outside effect: a read, a search, a model call.
    ReadOnly,
    /// The target deduplicates by our key inside a window.
    IdempotentKeyed,
    /// Anything else.
    Unsafe,
}

impl EffectClass {
    pub fn as_str(self) -> &'static str {
        match self {
            EffectClass::ReadOnly => "read_only",
            EffectClass::IdempotentKeyed => "idempotent_keyed",
            EffectClass::Unsafe => "unsafe",
        }
    }
}

/// One piece of evidence kept on an attempt: a lookup's, a late report's, a
/// proof of non-application. What else the server keeps is in `fields`.
#[derive(Debug, Clone, PartialEq, Deserialize)]
pub struct EvidenceRecord {
    pub id: String,
    pub verdict: Verdict,
    /// Where it came from (`client lookup`, a late report...).
    #[serde(default)]
    pub source: Option<String>,
    /// The epoch of the segment that gave it.
    #[serde(default)]
    pub epoch: Option<u64>,
    #[serde(default)]
    pub detail: Value,
    #[serde(flatten)]
    pub fields: Map<String, Value>,
}

/// An attempt as recorded (`GET /attempts/{id}` adds its evidence and next
/// safe action).
#[derive(Debug, Clone, PartialEq, Deserialize)]
pub struct Attempt {
    pub id: String,
    pub mission_id: String,
    pub run_id: String,
    #[serde(default)]
    pub node_id: Option<String>,
    #[serde(default)]
    pub execution: Option<u64>,
    pub effect_key: String,
    pub adapter: String,
    pub operation: String,
    pub effect_class: EffectClass,
    pub status: AttemptStatus,
    pub principal: String,
    pub admitted_epoch: u64,
    #[serde(default)]
    pub dispatched_epoch: Option<u64>,
    pub idempotency_key: String,
    #[serde(default)]
    pub request: Value,
    #[serde(default)]
    pub estimate: Amounts,
    #[serde(default)]
    pub actual: Option<Amounts>,
    #[serde(default)]
    pub result: Value,
    #[serde(default)]
    pub receipt: Value,
    #[serde(default)]
    pub reason: Option<String>,
    #[serde(default)]
    pub evidence: Vec<EvidenceRecord>,
    #[serde(default)]
    pub next_action: Option<Value>,
}

impl Attempt {
    /// Whether the attempt is settled: succeeded, failed or written off.
    pub fn settled(&self) -> bool {
        self.status.settled()
    }

    /// The record a lookup gets.
    pub fn recorded(&self) -> RecordedAttempt {
        RecordedAttempt {
            id: self.id.clone(),
            run_id: self.run_id.clone(),
            adapter: self.adapter.clone(),
            operation: self.operation.clone(),
            status: self.status,
            idempotency_key: self.idempotency_key.clone(),
            request: self.request.clone(),
            estimate: self.estimate.clone(),
        }
    }
}

/// A next safe action the engine names (R5).
#[derive(Debug, Clone, PartialEq, Eq, Deserialize)]
pub struct NextAction {
    pub kind: String,
    pub id: String,
    pub phase: String,
    pub action: String,
}

/// One execution of a node, as its journal records it.
#[derive(Debug, Clone, PartialEq, Eq, Deserialize)]
pub struct NodeRecord {
    pub node_id: String,
    pub execution: u64,
    pub status: NodeStatus,
    #[serde(default)]
    pub crashes: u64,
    /// The hash of the recorded result, once completed (N1).
    #[serde(default)]
    pub result_hash: Option<String>,
    #[serde(default)]
    pub error: Option<String>,
}

/// A run's recorded state (R5): what `recover` and `state` answer.
#[derive(Debug, Clone, PartialEq, Deserialize)]
pub struct Snapshot {
    pub run_id: String,
    pub epoch: u64,
    pub status: RunStatus,
    #[serde(default)]
    pub status_reason: Option<String>,
    #[serde(default)]
    pub owner_segment: Option<String>,
    #[serde(default)]
    pub linked_from: Option<String>,
    pub contract_version: u64,
    #[serde(default)]
    pub plan: Option<String>,
    #[serde(default)]
    pub nodes: Vec<NodeRecord>,
    #[serde(default)]
    pub unresolved: Vec<String>,
    #[serde(default)]
    pub attempts: Vec<Attempt>,
    #[serde(default)]
    pub voided: Vec<String>,
    #[serde(default)]
    pub waits: Vec<Value>,
    #[serde(default)]
    pub assessment: Value,
    #[serde(default)]
    pub next_actions: Vec<NextAction>,
}

/// What `coordinator.recover(run_id, segment_id)` returns: the recorded state
/// and the IDs of the attempts whose outcome is not known.
#[derive(Debug, Clone, PartialEq)]
pub struct Recovery {
    pub snapshot: Snapshot,
    pub unresolved: Vec<String>,
}

/// A segment's hold on a run (F1): send `segment`, `epoch` and `claim` with
/// every call made as the segment. `claim` is a secret: never printed.
#[derive(Clone, PartialEq, Eq, Deserialize)]
pub struct Claim {
    pub run_id: String,
    pub mission_id: String,
    pub segment: String,
    pub epoch: u64,
    pub claim: String,
    pub lease_ms: u64,
    pub status: RunStatus,
}

impl fmt::Debug for Claim {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        f.debug_struct("Claim")
            .field("run_id", &self.run_id)
            .field("mission_id", &self.mission_id)
            .field("segment", &self.segment)
            .field("epoch", &self.epoch)
            .field("lease_ms", &self.lease_ms)
            .field("status", &self.status)
            .finish_non_exhaustive()
    }
}

/// What completing a node answered: its result is recorded with this hash (N1).
#[derive(Debug, Clone, PartialEq, Eq, Deserialize)]
pub struct NodeCompletion {
    pub run_id: String,
    pub node_id: String,
    pub execution: u64,
    pub result_hash: String,
}

/// What a report or a posted evidence answered.
#[derive(Debug, Clone, PartialEq, Deserialize)]
pub struct Settlement {
    pub attempt_id: String,
    pub status: AttemptStatus,
    pub settled: bool,
    /// A report from a segment that no longer owns the run, kept as evidence.
    #[serde(default)]
    pub late: bool,
    #[serde(default)]
    pub verdict: Option<Verdict>,
    #[serde(default)]
    pub detail: Value,
}

/// A run as recorded (what `stop` and `finish` answer).
#[derive(Debug, Clone, PartialEq, Eq, Deserialize)]
pub struct Run {
    pub id: String,
    pub mission_id: String,
    pub principal: String,
    pub status: RunStatus,
    #[serde(default)]
    pub status_reason: Option<String>,
    pub epoch: u64,
    #[serde(default)]
    pub owner_segment: Option<String>,
    #[serde(default)]
    pub lease_expires_us: u64,
    #[serde(default)]
    pub recoveries: u64,
    #[serde(default)]
    pub linked_from: Option<String>,
}

/// One unit's accounts in a mission (L0-L2): `available + held + spent == limit`.
#[derive(Debug, Clone, PartialEq, Eq, Deserialize)]
pub struct Balance {
    /// The unit, in a ledger's list of balances (absent where the unit is known).
    #[serde(default)]
    pub unit: Option<String>,
    pub limit: i64,
    pub available: i64,
    pub held: i64,
    pub spent: i64,
    #[serde(default)]
    pub overrun: i64,
}

/// A mission's balances per unit, and what the ledger check found wrong.
#[derive(Debug, Clone, PartialEq, Eq, Deserialize)]
pub struct Ledger {
    pub mission_id: String,
    pub balances: Vec<Balance>,
    #[serde(default)]
    pub problems: Vec<String>,
}

impl Ledger {
    /// The balance of `unit`, if the mission has one.
    pub fn balance(&self, unit: &str) -> Option<&Balance> {
        self.balances.iter().find(|b| b.unit.as_deref() == Some(unit))
    }
}

/// What raising a limit answers: the new contract version and the unit's balance.
#[derive(Debug, Clone, PartialEq, Eq, Deserialize)]
pub struct LimitRaised {
    pub mission_id: String,
    pub contract_version: u64,
    pub balance: Balance,
}

/// An incident (L5): an anomaly that pauses a mission's runs until a person closes it.
#[derive(Debug, Clone, PartialEq, Eq, Deserialize)]
pub struct Incident {
    pub id: String,
    pub mission_id: String,
    #[serde(default)]
    pub run_id: Option<String>,
    #[serde(default)]
    pub attempt_id: Option<String>,
    pub kind: String,
    #[serde(default)]
    pub detail: String,
    pub status: String,
    pub opened_at_us: u64,
    #[serde(default)]
    pub closed_at_us: Option<u64>,
    #[serde(default)]
    pub closed_by: Option<String>,
    #[serde(default)]
    pub close_note: Option<String>,
}

/// One audit hash chain as verified (S1): where it breaks, if it does.
#[derive(Debug, Clone, PartialEq, Eq, Deserialize)]
pub struct ChainVerification {
    pub mission_id: String,
    pub events: u64,
    pub ok: bool,
    #[serde(default)]
    pub broken_at: Option<u64>,
    #[serde(default)]
    pub problem: Option<String>,
}

/// The audit chains verified: `ok` only if every one of them is.
#[derive(Debug, Clone, PartialEq, Eq, Deserialize)]
pub struct AuditVerification {
    pub ok: bool,
    #[serde(default)]
    pub chains: Vec<ChainVerification>,
}

#[cfg(test)]
mod tests {
    use super::*;
    use serde_json::json;

    #[test]
    fn x1_item9_a_record_without_its_id_is_refused_not_read_as_empty() {
        let claim = json!({"mission_id": "mis_1", "segment": "s", "epoch": 1, "claim": "c",
                           "lease_ms": 1, "status": "active"});
        let refused = serde_json::from_value::<Claim>(claim).unwrap_err();
        assert!(refused.to_string().contains("run_id"), "{refused}");
        let settlement = json!({"status": "succeeded", "settled": true});
        assert!(serde_json::from_value::<Settlement>(settlement).is_err());
    }

    #[test]
    fn x1_item9_statuses_are_enums_and_a_newer_servers_value_is_kept_apart() {
        let s: AttemptStatus = serde_json::from_value(json!("written_off")).unwrap();
        assert_eq!(
            (s, s.settled(), s.to_string()),
            (AttemptStatus::WrittenOff, true, "written_off".into())
        );
        let new: RunStatus = serde_json::from_value(json!("hibernating")).unwrap();
        assert_eq!(new, RunStatus::Unrecognized);
        let class: EffectClass = serde_json::from_value(json!("idempotent_keyed")).unwrap();
        assert_eq!(class, EffectClass::IdempotentKeyed);
    }
}
