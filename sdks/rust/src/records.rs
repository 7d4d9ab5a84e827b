//! What the server answers, as typed records. Fields the server may add later
//! are ignored; fields it leaves out take their defaults.

use serde::Deserialize;
use serde_json::Value;

use crate::adapter::{Amounts, RecordedAttempt};

/// An attempt as recorded (`GET /attempts/{id}` adds its evidence and next
/// safe action).
#[derive(Debug, Clone, Default, PartialEq, Deserialize)]
#[serde(default)]
pub struct Attempt {
    pub id: String,
    pub mission_id: String,
    pub run_id: String,
    pub node_id: String,
    pub execution: u64,
    pub effect_key: String,
    pub adapter: String,
    pub operation: String,
    pub effect_class: String,
    pub status: String,
    pub principal: String,
    pub admitted_epoch: u64,
    pub dispatched_epoch: Option<u64>,
    pub idempotency_key: String,
    pub request: Value,
    pub estimate: Amounts,
    pub actual: Option<Amounts>,
    pub result: Value,
    pub receipt: Value,
    pub reason: Option<String>,
    pub evidence: Vec<Value>,
    pub next_action: Option<Value>,
}

impl Attempt {
    /// Whether the attempt is settled: succeeded, failed or written off.
    pub fn settled(&self) -> bool {
        matches!(self.status.as_str(), "succeeded" | "failed" | "written_off")
    }

    /// The record a lookup gets.
    pub fn recorded(&self) -> RecordedAttempt {
        RecordedAttempt {
            id: self.id.clone(),
            run_id: self.run_id.clone(),
            adapter: self.adapter.clone(),
            operation: self.operation.clone(),
            status: self.status.clone(),
            idempotency_key: self.idempotency_key.clone(),
            request: self.request.clone(),
            estimate: self.estimate.clone(),
        }
    }
}

/// A next safe action the engine names (R5).
#[derive(Debug, Clone, Default, PartialEq, Eq, Deserialize)]
#[serde(default)]
pub struct NextAction {
    pub kind: String,
    pub id: String,
    pub phase: String,
    pub action: String,
}

/// A run's recorded state (R5): what `recover` and `state` answer.
#[derive(Debug, Clone, Default, PartialEq, Deserialize)]
#[serde(default)]
pub struct Snapshot {
    pub run_id: String,
    pub epoch: u64,
    pub status: String,
    pub status_reason: Option<String>,
    pub owner_segment: Option<String>,
    pub linked_from: Option<String>,
    pub contract_version: u64,
    pub plan: Option<String>,
    pub nodes: Vec<Value>,
    pub unresolved: Vec<String>,
    pub attempts: Vec<Attempt>,
    pub voided: Vec<String>,
    pub waits: Vec<Value>,
    pub assessment: Value,
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
/// every call made as the segment. `claim` is a secret.
#[derive(Debug, Clone, Default, PartialEq, Eq, Deserialize)]
#[serde(default)]
pub struct Claim {
    pub run_id: String,
    pub mission_id: String,
    pub segment: String,
    pub epoch: u64,
    pub claim: String,
    pub lease_ms: u64,
    pub status: String,
}

/// What completing a node answered: its result is recorded with this hash (N1).
#[derive(Debug, Clone, Default, PartialEq, Eq, Deserialize)]
#[serde(default)]
pub struct NodeCompletion {
    pub run_id: String,
    pub node_id: String,
    pub execution: u64,
    pub result_hash: String,
}

/// What a report or a posted evidence answered.
#[derive(Debug, Clone, Default, PartialEq, Deserialize)]
#[serde(default)]
pub struct Settlement {
    pub attempt_id: String,
    pub status: String,
    pub settled: bool,
    /// A report from a segment that no longer owns the run, kept as evidence.
    pub late: bool,
    pub verdict: Option<String>,
    pub detail: Value,
}

/// A run as recorded (what `stop` and `finish` answer).
#[derive(Debug, Clone, Default, PartialEq, Eq, Deserialize)]
#[serde(default)]
pub struct Run {
    pub id: String,
    pub mission_id: String,
    pub principal: String,
    pub status: String,
    pub status_reason: Option<String>,
    pub epoch: u64,
    pub owner_segment: Option<String>,
    pub lease_expires_us: u64,
    pub recoveries: u64,
    pub linked_from: Option<String>,
}

/// One unit's accounts in a mission (L0-L2): `available + held + spent == limit`.
#[derive(Debug, Clone, Default, PartialEq, Eq, Deserialize)]
#[serde(default)]
pub struct Balance {
    /// The unit, in a ledger's list of balances (empty where the unit is known).
    pub unit: String,
    pub limit: i64,
    pub available: i64,
    pub held: i64,
    pub spent: i64,
    pub overrun: i64,
}

/// A mission's balances per unit, and what the ledger check found wrong.
#[derive(Debug, Clone, Default, PartialEq, Eq, Deserialize)]
#[serde(default)]
pub struct Ledger {
    pub mission_id: String,
    pub balances: Vec<Balance>,
    pub problems: Vec<String>,
}

/// What raising a limit answers: the new contract version and the unit's balance.
#[derive(Debug, Clone, Default, PartialEq, Eq, Deserialize)]
#[serde(default)]
pub struct LimitRaised {
    pub mission_id: String,
    pub contract_version: u64,
    pub balance: Balance,
}

/// An incident (L5): an anomaly that pauses a mission's runs until a person closes it.
#[derive(Debug, Clone, Default, PartialEq, Eq, Deserialize)]
#[serde(default)]
pub struct Incident {
    pub id: String,
    pub mission_id: String,
    pub run_id: Option<String>,
    pub attempt_id: Option<String>,
    pub kind: String,
    pub detail: String,
    pub status: String,
    pub opened_at_us: u64,
    pub closed_at_us: Option<u64>,
    pub closed_by: Option<String>,
    pub close_note: Option<String>,
}

/// One audit hash chain as verified (S1): where it breaks, if it does.
#[derive(Debug, Clone, Default, PartialEq, Eq, Deserialize)]
#[serde(default)]
pub struct ChainVerification {
    pub mission_id: String,
    pub events: u64,
    pub ok: bool,
    pub broken_at: Option<u64>,
    pub problem: Option<String>,
}

/// The audit chains verified: `ok` only if every one of them is.
#[derive(Debug, Clone, Default, PartialEq, Eq, Deserialize)]
#[serde(default)]
pub struct AuditVerification {
    pub ok: bool,
    pub chains: Vec<ChainVerification>,
}
