//! The protocol of a segment, without its transport: what every call made as
//! the segment carries (the claim), what the segment remembers (its lease, and
//! that it was fenced), how an admission's answer reads, what a report says,
//! and what an attempt comes to. The blocking and the async segments share it
//! and differ only in how they wait.

use std::sync::atomic::{AtomicBool, AtomicU64, Ordering};
use std::sync::{Arc, Mutex};
use std::time::{Duration, Instant};

use serde::de::DeserializeOwned;
use serde::Deserialize;
use serde_json::{json, Value};

use crate::adapter::{Dispatch, Estimate, Operation, Outcome, SendError};
use crate::calls::{seg, Call};
use crate::error::{Code, Error, Result};
use crate::records::{Attempt, AttemptStatus, Claim, Settlement};

/// How many admissions one `attempt` makes at most when its attempt was
/// proven not sent (its deadline passed here, or the target refused it before
/// applying it): the server decides each time whether to send anew.
pub(crate) const ADMISSIONS: u32 = 4;

/// What a segment holds, shared by its clones and its renewal.
pub(crate) struct SegmentCore {
    pub claim: Claim,
    lease_ms: AtomicU64,
    /// The `fenced` answer once one came: every later call fails with it.
    fenced: Mutex<Option<Error>>,
    /// Released or finished: nothing keeps renewing it.
    ended: AtomicBool,
}

impl std::fmt::Debug for SegmentCore {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.debug_struct("Segment")
            .field("run_id", &self.claim.run_id)
            .field("segment", &self.claim.segment)
            .field("epoch", &self.claim.epoch)
            .field("lease", &self.lease())
            .finish_non_exhaustive()
    }
}

impl SegmentCore {
    pub fn new(claim: Claim) -> Arc<SegmentCore> {
        Arc::new(SegmentCore {
            lease_ms: AtomicU64::new(claim.lease_ms),
            claim,
            fenced: Mutex::new(None),
            ended: AtomicBool::new(false),
        })
    }

    pub fn lease(&self) -> Duration {
        Duration::from_millis(self.lease_ms.load(Ordering::SeqCst))
    }

    /// How often a renewal keeps the lease: at half of it.
    pub fn renew_every(&self) -> Duration {
        (self.lease() / 2).max(Duration::from_millis(50))
    }

    pub fn ended(&self) -> bool {
        self.ended.load(Ordering::SeqCst) || self.fenced().is_some()
    }

    pub fn end(&self) {
        self.ended.store(true, Ordering::SeqCst);
    }

    pub fn fenced(&self) -> Option<Error> {
        self.fenced.lock().unwrap_or_else(|p| p.into_inner()).clone()
    }

    /// A call as the segment: its claim added to `fields`. Once the segment
    /// was fenced, nothing is sent: the `fenced` answer is the answer.
    pub fn call(&self, path: String, fields: Value) -> Result<Call> {
        if let Some(fenced) = self.fenced() {
            return Err(fenced);
        }
        let mut body = json!({
            "segment": self.claim.segment, "epoch": self.claim.epoch, "claim": self.claim.claim,
        });
        if let (Some(body), Value::Object(fields)) = (body.as_object_mut(), fields) {
            body.extend(fields);
        }
        Ok(Call::post(path, body))
    }

    /// `answered`, remembering a `fenced` answer.
    pub fn note<T>(&self, answered: Result<T>) -> Result<T> {
        if let Err(e) = &answered {
            if e.code() == Some(&Code::Fenced) {
                *self.fenced.lock().unwrap_or_else(|p| p.into_inner()) = Some(e.clone());
            }
        }
        answered
    }

    pub fn renew_call(&self) -> Result<Call> {
        Ok(self.call(self.run_path("renew"), json!({}))?.idempotent())
    }

    pub fn renewed(&self, answer: &Renewed) -> Duration {
        self.lease_ms.store(answer.lease_ms, Ordering::SeqCst);
        self.lease()
    }

    pub fn release_call(&self) -> Result<Call> {
        self.call(self.run_path("release"), json!({}))
    }

    pub fn start_node_call(&self, node_id: &str) -> Result<Call> {
        Ok(self.call(self.node_path(node_id, "start"), json!({}))?.idempotent())
    }

    pub fn complete_call(&self, node_id: &str, execution: u64, result: Value) -> Result<Call> {
        let fields = json!({"execution": execution, "result": result});
        Ok(self.call(self.node_path(node_id, "complete"), fields)?.idempotent())
    }

    pub fn finish_call(&self, ending: Ending, reason: Option<&str>) -> Result<Call> {
        let mut fields = json!({"status": ending.as_str()});
        if let Some(reason) = reason {
            fields["reason"] = json!(reason);
        }
        self.call(self.run_path("finish"), fields)
    }

    pub fn admit_call(&self, fields: Value) -> Result<Call> {
        self.call(self.run_path("attempts"), fields)
    }

    /// The report of a send: the protocol answers it the same when sent twice.
    pub fn report_call(
        &self,
        attempt_id: &str,
        sent: &std::result::Result<Outcome, SendError>,
    ) -> Result<Call> {
        let path = format!("/attempts/{}/report", seg(attempt_id));
        Ok(self.call(path, report_body(sent))?.idempotent())
    }

    fn run_path(&self, what: &str) -> String {
        format!("/runs/{}/{what}", seg(&self.claim.run_id))
    }

    fn node_path(&self, node_id: &str, what: &str) -> String {
        format!("/runs/{}/nodes/{}/{what}", seg(&self.claim.run_id), seg(node_id))
    }
}

/// How a run ends (`Segment::finish`).
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
#[non_exhaustive]
pub enum Ending {
    Completed,
    Failed,
}

impl Ending {
    pub fn as_str(self) -> &'static str {
        match self {
            Ending::Completed => "completed",
            Ending::Failed => "failed",
        }
    }
}

/// What a renewal answers.
#[derive(Deserialize)]
pub(crate) struct Renewed {
    lease_ms: u64,
}

/// What starting a node answers.
#[derive(Deserialize)]
pub(crate) struct NodeStarted {
    pub execution: u64,
}

/// One effect of a node's execution, through an adapter's operation.
pub(crate) struct Effect<'a> {
    pub node_id: &'a str,
    pub execution: u64,
    pub key: &'a str,
    pub adapter: &'a str,
    pub operation: &'a str,
}

/// The admission's body of `effect`.
pub(crate) fn admission(
    effect: &Effect<'_>,
    op: Operation,
    estimate: &Estimate,
    request: &Value,
) -> Value {
    let mut body = json!({
        "node_id": effect.node_id,
        "execution": effect.execution,
        "effect_key": effect.key,
        "adapter": effect.adapter,
        "operation": effect.operation,
        "effect_class": op.effect_class,
        "request": request,
        "estimate": estimate.amounts,
    });
    if let Some(window) = op.dedupe_window_seconds {
        body["dedupe_window_seconds"] = json!(window);
    }
    if let Some(source) = &estimate.price_source {
        body["price_source"] = json!(source);
    }
    body
}

/// An operation `adapter` offers, or a usage error before anything is asked.
pub(crate) fn offered(adapter: &str, operation: &str, op: Option<Operation>) -> Result<Operation> {
    op.ok_or_else(|| Error::Usage(format!("adapter {adapter:?} offers no operation {operation:?}")))
}

/// A lookup through the adapter the attempt was made through, or a usage error.
pub(crate) fn same_adapter(attempt: &Attempt, adapter: &str) -> Result<()> {
    if attempt.adapter == adapter {
        return Ok(());
    }
    Err(Error::Usage(format!(
        "attempt {} was made through adapter {:?}, not {adapter:?}",
        attempt.id, attempt.adapter
    )))
}

#[derive(Deserialize)]
struct Admitted {
    action: String,
    attempt_id: String,
    status: AttemptStatus,
    idempotency_key: Option<String>,
    fencing_token: Option<String>,
    send_deadline_ms: Option<u64>,
    epoch: Option<u64>,
    #[serde(default)]
    result: Value,
    #[serde(default)]
    reason: Option<String>,
}

/// What an admission's answer says to do.
pub(crate) enum Admission {
    /// Send it, now.
    Send(Dispatch),
    /// Nothing to send: the effect's record (a replay) or why not.
    Answered(Result<Done>),
}

/// A settled success: the attempt and its result, not yet typed.
pub(crate) struct Done {
    attempt_id: String,
    result: Value,
}

/// The admission's answer read: a send counted from `counted_from` (taken
/// before the admission was asked for, so the deadline can only err early).
pub(crate) fn admitted(
    core: &SegmentCore,
    answer: Value,
    operation: &str,
    request: Value,
    counted_from: Instant,
) -> Result<Admission> {
    let shown = answer.to_string();
    let a: Admitted = crate::calls::decode(answer)?;
    let missing = |what: &str| Error::Protocol(format!("a send without {what}: {shown:.300}"));
    let attempt_id = a.attempt_id;
    Ok(match a.action.as_str() {
        "send" => Admission::Send(Dispatch {
            run_id: core.claim.run_id.clone(),
            epoch: a.epoch.unwrap_or(core.claim.epoch),
            operation: operation.to_string(),
            request, // what was admitted (and hashed) is what is sent
            idempotency_key: a.idempotency_key.ok_or_else(|| missing("idempotency_key"))?,
            fencing_token: a.fencing_token.ok_or_else(|| missing("fencing_token"))?,
            send_deadline: Duration::from_millis(
                a.send_deadline_ms.ok_or_else(|| missing("send_deadline_ms"))?,
            ),
            counted_from,
            attempt_id,
        }),
        "replay" if a.status == AttemptStatus::Succeeded => {
            Admission::Answered(Ok(Done { attempt_id, result: a.result }))
        }
        "replay" => Admission::Answered(Err(Error::AttemptFailed {
            attempt_id,
            status: a.status,
            result: a.result,
        })),
        "blocked" => Admission::Answered(Err(Error::Blocked { attempt_id, status: a.status })),
        "voided" => Admission::Answered(Err(Error::Voided {
            attempt_id,
            reason: a.reason.unwrap_or_default(),
        })),
        _ => Admission::Answered(Err(Error::Protocol(format!("no known action: {shown:.300}")))),
    })
}

/// What a report says of a send.
fn report_body(sent: &std::result::Result<Outcome, SendError>) -> Value {
    match sent {
        Ok(outcome) => json!({
            "outcome": if outcome.succeeded { "succeeded" } else { "failed" },
            "cost": outcome.cost,
            "result": outcome.result,
            "receipt": outcome.receipt,
        }),
        Err(SendError::NotApplied { proof }) => json!({"outcome": "not_applied", "proof": proof}),
        Err(SendError::Unknown { reason, detail }) => {
            json!({"outcome": "unknown", "reason": reason, "detail": detail})
        }
    }
}

/// A report that failed: judged by the server, or (no answer, or the store
/// stayed busy, after every retry) not recorded, and the attempt DISPATCHED.
pub(crate) fn unrecorded(attempt_id: &str, failed: Error) -> Error {
    match failed {
        Error::Api { ref code, .. } if code != &Code::StoreBusy => failed,
        lost => Error::SettlementUnrecorded {
            attempt_id: attempt_id.to_string(),
            cause: Box::new(lost),
        },
    }
}

/// What an attempt comes to once its report was answered.
pub(crate) enum Concluded {
    Done(Result<Done>),
    /// Proven not sent: admit it again (the server decides whether to send).
    Readmit(Unsent),
}

/// An attempt proven not sent, admitted again: its proof is what the caller
/// is told if the server answers the admission with that attempt's record.
pub(crate) struct Unsent {
    attempt_id: String,
    proof: Value,
}

/// An admission's answer after `unsent` was admitted again: a replay of the
/// same failed attempt says what its own send said (the record holds no result).
pub(crate) fn again(done: Result<Done>, unsent: Option<&Unsent>) -> Result<Done> {
    match (done, unsent) {
        (Err(Error::AttemptFailed { attempt_id, status, result }), Some(u))
            if attempt_id == u.attempt_id && result.is_null() =>
        {
            Err(Error::AttemptFailed { attempt_id, status, result: u.proof.clone() })
        }
        (done, _) => done,
    }
}

pub(crate) fn concluded(
    send: Dispatch,
    sent: std::result::Result<Outcome, SendError>,
    settled: Settlement,
    admissions: u32,
) -> Concluded {
    let attempt_id = send.attempt_id;
    if settled.late {
        return Concluded::Done(Err(Error::LateReport { attempt_id, status: settled.status }));
    }
    let status = settled.status;
    Concluded::Done(match sent {
        Ok(outcome) if outcome.succeeded => Ok(Done { attempt_id, result: outcome.result }),
        Ok(outcome) => Err(Error::AttemptFailed { attempt_id, status, result: outcome.result }),
        Err(SendError::NotApplied { proof }) if admissions < ADMISSIONS => {
            return Concluded::Readmit(Unsent { attempt_id, proof })
        }
        Err(SendError::NotApplied { proof }) => {
            Err(Error::AttemptFailed { attempt_id, status, result: proof })
        }
        Err(SendError::Unknown { .. }) => Err(Error::Blocked { attempt_id, status }),
    })
}

/// A settled success as the type the caller asked for.
pub(crate) fn typed<R: DeserializeOwned>(done: Result<Done>) -> Result<R> {
    let Done { attempt_id, result } = done?;
    R::deserialize(&result).map_err(|e| Error::UnexpectedResult {
        attempt_id,
        result,
        source: Arc::new(e),
    })
}

/// The reason reported for a send the adapter's panic cut short.
pub(crate) fn panicked() -> SendError {
    SendError::unknown("the adapter panicked during the send", Value::Null)
}
