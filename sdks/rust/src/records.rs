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
