//! Adapters: how an effect reaches the outside world, in this process.
//!
//! The server never calls an adapter of a client's run: it admits the effect
//! and records what the client reports. So the rules an adapter keeps are the
//! Python engine's (docs/adapters.md): declare each operation's effect class
//! (A7), estimate an upper bound (L8), send the attempt's idempotency key (A5)
//! and fencing token (F3), check the send deadline right before the bytes go
//! out, and claim "not applied" only with proof (A3).

use std::time::{Duration, Instant};

use serde::de::DeserializeOwned;
use serde_json::{json, Value};

use crate::records::Verdict;
pub use crate::records::{Amounts, EffectClass, RecordedAttempt};

/// An operation an adapter offers.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub struct Operation {
    pub effect_class: EffectClass,
    /// For `IdempotentKeyed`: how long the target remembers a key.
    pub dedupe_window_seconds: Option<u64>,
}

impl Operation {
    pub fn read_only() -> Operation {
        Operation { effect_class: EffectClass::ReadOnly, dedupe_window_seconds: None }
    }

    pub fn unsafe_effect() -> Operation {
        Operation { effect_class: EffectClass::Unsafe, dedupe_window_seconds: None }
    }

    pub fn idempotent_keyed(dedupe_window_seconds: u64) -> Operation {
        Operation {
            effect_class: EffectClass::IdempotentKeyed,
            dedupe_window_seconds: Some(dedupe_window_seconds),
        }
    }
}

/// An upper bound on what an operation may cost, and where its prices came from.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct Estimate {
    pub amounts: Amounts,
    pub price_source: Option<String>,
}

impl Estimate {
    pub fn new<I, U>(amounts: I, price_source: &str) -> Estimate
    where
        I: IntoIterator<Item = (U, u64)>,
        U: Into<String>,
    {
        Estimate {
            amounts: amounts.into_iter().map(|(u, a)| (u.into(), a)).collect(),
            price_source: Some(price_source.to_string()),
        }
    }
}

/// What the target answered to a send it processed.
#[derive(Debug, Clone, PartialEq)]
pub struct Outcome {
    /// `true`: applied; `false`: applied as a failure (a declined card).
    pub succeeded: bool,
    pub result: Value,
    /// The actual cost as the target reported it, never clamped (L5).
    pub cost: Amounts,
    pub receipt: Value,
}

impl Outcome {
    pub fn succeeded(result: Value, cost: Amounts, receipt: Value) -> Outcome {
        Outcome { succeeded: true, result, cost, receipt }
    }

    pub fn failed(result: Value, cost: Amounts, receipt: Value) -> Outcome {
        Outcome { succeeded: false, result, cost, receipt }
    }

    pub(crate) fn to_json(&self) -> Value {
        json!({
            "status": if self.succeeded { "succeeded" } else { "failed" },
            "result": self.result,
            "cost": self.cost,
            "receipt": self.receipt,
        })
    }
}

/// Why a send did not produce an [`Outcome`].
#[derive(Debug, Clone, PartialEq)]
pub enum SendError {
    /// Proven: nothing reached the target (no connection was made, the deadline
    /// had passed, a refusal the target documents as made before applying).
    NotApplied { proof: Value },
    /// Anything else: a timeout, a reset, a 5xx after the request went out. The
    /// attempt stays UNKNOWN with its hold (A3).
    Unknown { reason: String, detail: Value },
}

impl SendError {
    pub fn not_applied(proof: Value) -> SendError {
        SendError::NotApplied { proof }
    }

    pub fn unknown(reason: impl Into<String>, detail: Value) -> SendError {
        SendError::Unknown { reason: reason.into(), detail }
    }
}

/// One admitted send, as the adapter gets it.
#[derive(Debug, Clone)]
pub struct Dispatch {
    pub attempt_id: String,
    pub run_id: String,
    pub epoch: u64,
    pub operation: String,
    pub request: Value,
    /// Send it to the target (A5): stable forever for this attempt.
    pub idempotency_key: String,
    /// `"<run_id>:<epoch>"`: send it where the target fences (F3).
    pub fencing_token: String,
    /// The time the store left for the send...
    pub send_deadline: Duration,
    /// ...counted on this process's monotonic clock from just before the
    /// admission was asked for, so it can only err early.
    pub counted_from: Instant,
}

impl Dispatch {
    /// The time left before the send must not start.
    pub fn remaining(&self) -> Duration {
        self.send_deadline.saturating_sub(self.counted_from.elapsed())
    }

    /// The request as the type the adapter sends (what `attempt` was given).
    pub fn request_as<T: DeserializeOwned>(&self) -> Result<T, SendError> {
        // Refused before anything was sent: that is proof.
        T::deserialize(&self.request).map_err(|e| {
            SendError::not_applied(
                json!({"reason": "the request does not fit", "error": e.to_string()}),
            )
        })
    }

    /// Call right before the bytes go out: `NotApplied` once the deadline passed.
    pub fn check_deadline(&self) -> Result<(), SendError> {
        if self.remaining().is_zero() {
            return Err(SendError::not_applied(json!({"reason": "send deadline passed"})));
        }
        Ok(())
    }
}

/// What a lookup found about an uncertain attempt.
#[derive(Debug, Clone, PartialEq)]
pub enum Evidence {
    /// The target holds the effect itself: here is what it did.
    Applied(Outcome),
    /// Proof that the target did not, and no longer can, apply it.
    NotApplied(Value),
    /// Nothing proves either (an empty list, a lookup that is down).
    Indeterminate(Value),
}

impl Evidence {
    pub fn verdict(&self) -> Verdict {
        match self {
            Evidence::Applied(_) => Verdict::Applied,
            Evidence::NotApplied(_) => Verdict::NotApplied,
            Evidence::Indeterminate(_) => Verdict::Indeterminate,
        }
    }

    pub(crate) fn to_json(&self) -> Value {
        match self {
            Evidence::Applied(outcome) => json!({
                "verdict": "applied", "outcome": outcome.to_json(), "detail": outcome.receipt,
            }),
            Evidence::NotApplied(proof) => json!({"verdict": "not_applied", "detail": proof}),
            Evidence::Indeterminate(detail) => {
                json!({"verdict": "indeterminate", "detail": detail})
            }
        }
    }
}

/// An adapter: five members, as the Python engine's `charter.Adapter`.
pub trait Adapter {
    /// The adapter's name: the `adapter` of the scope `adapter.operation` the
    /// mission's contract grants.
    fn name(&self) -> &str;

    /// The operations it offers, each with its effect class.
    fn operations(&self) -> Vec<(String, Operation)>;

    /// An upper bound on what `operation` may cost for `request`.
    fn estimate(&self, operation: &str, request: &Value) -> Estimate;

    /// Send one admitted attempt, once: its SDK's own retries off.
    fn dispatch(&self, send: &Dispatch) -> Result<Outcome, SendError>;

    /// Look an uncertain attempt up at the target (by key or by reference).
    fn lookup(&self, attempt: &RecordedAttempt) -> Evidence;

    /// The operation named `operation`, if offered.
    fn operation(&self, operation: &str) -> Option<Operation> {
        self.operations().into_iter().find(|(n, _)| n == operation).map(|(_, o)| o)
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    fn send(deadline: Duration) -> Dispatch {
        Dispatch {
            attempt_id: "att_1".into(),
            run_id: "run_1".into(),
            epoch: 1,
            operation: "pay".into(),
            request: Value::Null,
            idempotency_key: "charter-att_1".into(),
            fencing_token: "run_1:1".into(),
            send_deadline: deadline,
            counted_from: Instant::now(),
        }
    }

    #[test]
    fn f3_the_send_deadline_is_counted_on_the_monotonic_clock() {
        let open = send(Duration::from_secs(60));
        assert!(open.check_deadline().is_ok());
        assert!(open.remaining() <= Duration::from_secs(60));
        let passed = send(Duration::ZERO);
        let refused = passed.check_deadline().unwrap_err();
        assert_eq!(refused, SendError::not_applied(json!({"reason": "send deadline passed"})));
    }
}
