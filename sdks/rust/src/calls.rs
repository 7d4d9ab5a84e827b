//! Every request of the API this crate makes, described once (method, path,
//! body, whether it may be sent again) and decoded once, so that the blocking
//! and the async clients speak the same protocol: each only carries the
//! described request over its own HTTP stack.

use serde::de::DeserializeOwned;
use serde::Serialize;
use serde_json::{json, Map, Value};

use crate::adapter::Amounts;
use crate::error::{Code, Error, Result};
use crate::retry::Again;

/// One request of the API, not yet sent.
#[derive(Debug, Clone)]
pub(crate) struct Call {
    pub method: &'static str,
    /// Under `/api/v1`, each identifier escaped by [`seg`].
    pub path: String,
    pub body: Option<Value>,
    pub again: Again,
}

impl Call {
    pub fn get(path: String) -> Call {
        Call { method: "GET", path, body: None, again: Again::Idempotent }
    }

    /// A write: sent again only if the server surely did not act.
    pub fn post(path: String, body: Value) -> Call {
        Call { method: "POST", path, body: Some(body), again: Again::IfNotSent }
    }

    /// A write the protocol answers the same when sent twice.
    pub fn idempotent(mut self) -> Call {
        self.again = Again::Idempotent;
        self
    }
}

/// A value as JSON, or a usage error naming what it is.
pub(crate) fn to_json<T: Serialize + ?Sized>(value: &T, what: &str) -> Result<Value> {
    serde_json::to_value(value).map_err(|e| Error::Usage(format!("{what} is not JSON: {e}")))
}

/// The answer of a call as `T`: a 2xx answer decoded, or the typed error of
/// any other status.
pub(crate) fn judge<T: DeserializeOwned>(status: u16, value: Value) -> Result<T> {
    if !(200..300).contains(&status) {
        return Err(api_error(status, value));
    }
    decode(value)
}

pub(crate) fn decode<T: DeserializeOwned>(value: Value) -> Result<T> {
    let shown = clip(&value);
    serde_json::from_value(value).map_err(|e| Error::Protocol(format!("{e}: {shown}")))
}

/// An answer's body: JSON, `null` when empty, a protocol error otherwise.
pub(crate) fn body(status: u16, text: &str) -> Result<Value> {
    if text.is_empty() {
        return Ok(Value::Null);
    }
    serde_json::from_str(text)
        .map_err(|e| Error::Protocol(format!("HTTP {status}, not JSON ({e}): {text:.200}")))
}

pub(crate) fn api_error(status: u16, value: Value) -> Error {
    let mut error = match value.get("error") {
        Some(Value::Object(error)) => error.clone(),
        _ => {
            let shown = clip(&value);
            return Error::Protocol(format!("HTTP {status} without an error object: {shown}"));
        }
    };
    let code = match error.remove("code") {
        Some(Value::String(code)) => Code::parse(&code),
        _ => {
            return Error::Protocol(format!(
                "HTTP {status}, an error without a code: {}",
                clip(&value)
            ))
        }
    };
    let message = match error.remove("message") {
        Some(Value::String(m)) => m,
        _ => String::new(),
    };
    Error::Api { status, code, message, details: error }
}

/// An identifier as one path segment: what is not safe in a URL's path is
/// percent-encoded, so an ID can never reach another endpoint.
pub(crate) fn seg(id: &str) -> String {
    let mut out = String::with_capacity(id.len());
    for b in id.bytes() {
        if b.is_ascii_alphanumeric() || b"-._~".contains(&b) {
            out.push(b as char);
        } else {
            out.push_str(&format!("%{b:02X}"));
        }
    }
    out
}

/// A value's JSON, cut short for an error message.
fn clip(value: &Value) -> String {
    value.to_string().chars().take(300).collect()
}

/// A person's settlement of an uncertain attempt (R8).
#[derive(Debug, Clone, PartialEq)]
pub struct Resolution {
    pub outcome: Resolved,
    /// What the person saw: required.
    pub evidence: String,
    pub cost: Amounts,
    /// A cost above ten times the hold is a typo unless this says it is meant.
    pub confirm_above_hold: bool,
}

/// How a person settles an attempt.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Serialize)]
#[serde(rename_all = "snake_case")]
#[non_exhaustive]
pub enum Resolved {
    Succeeded,
    Failed,
    WrittenOff,
}

impl Resolution {
    /// Settled `outcome` at `cost`, on the `evidence` the person saw.
    pub fn new(outcome: Resolved, evidence: impl Into<String>, cost: Amounts) -> Resolution {
        Resolution { outcome, evidence: evidence.into(), cost, confirm_above_hold: false }
    }
}

// The API's endpoints, one function each.

pub(crate) fn me() -> Call {
    Call::get("/me".into())
}

pub(crate) fn attempt(attempt_id: &str) -> Call {
    Call::get(format!("/attempts/{}", seg(attempt_id)))
}

pub(crate) fn waits(run_id: &str) -> Call {
    Call::get(format!("/runs/{}/waits", seg(run_id)))
}

pub(crate) fn start_run(mission_id: &str, segment: &str, input: Value) -> Call {
    let body = json!({"segment": segment, "input": input});
    Call::post(format!("/missions/{}/runs", seg(mission_id)), body)
}

pub(crate) fn claim(run_id: &str, segment: &str, force: bool) -> Call {
    Call::post(format!("/runs/{}/claim", seg(run_id)), json!({"segment": segment, "force": force}))
}

pub(crate) fn recover(run_id: &str, segment: &str, force: bool) -> Call {
    let body = json!({"segment": segment, "force": force});
    Call::post(format!("/runs/{}/recover", seg(run_id)), body)
}

pub(crate) fn state(run_id: &str) -> Call {
    Call::get(format!("/runs/{}", seg(run_id)))
}

pub(crate) fn evidence(attempt_id: &str, evidence: Value) -> Call {
    Call::post(format!("/attempts/{}/evidence", seg(attempt_id)), evidence)
}

pub(crate) fn confirm(attempt_id: &str, evidence_id: Option<&str>) -> Call {
    let mut body = Map::new();
    if let Some(id) = evidence_id {
        body.insert("evidence_id".into(), json!(id));
    }
    Call::post(format!("/attempts/{}/confirm", seg(attempt_id)), Value::Object(body))
}

pub(crate) fn resolve(attempt_id: &str, resolution: &Resolution) -> Call {
    let body = json!({
        "outcome": resolution.outcome,
        "evidence": resolution.evidence,
        "cost": resolution.cost,
        "confirm_above_hold": resolution.confirm_above_hold,
    });
    Call::post(format!("/attempts/{}/resolve", seg(attempt_id)), body)
}

pub(crate) fn resume_on_server(run_id: &str, segment: Option<&str>) -> Call {
    let body = match segment {
        Some(s) => json!({"segment": s}),
        None => json!({}),
    };
    Call::post(format!("/runs/{}/resume", seg(run_id)), body)
}

pub(crate) fn stop(run_id: &str, reason: &str) -> Call {
    Call::post(format!("/runs/{}/stop", seg(run_id)), json!({"reason": reason}))
}

pub(crate) fn raise_limit(mission_id: &str, unit: &str, limit: u64) -> Call {
    let body = json!({"unit": unit, "limit": limit});
    Call::post(format!("/missions/{}/raise-limit", seg(mission_id)), body)
}

pub(crate) fn ledger(mission_id: &str) -> Call {
    Call::get(format!("/missions/{}/ledger", seg(mission_id)))
}

pub(crate) fn incidents(mission_id: &str, open_only: bool) -> Call {
    let query = if open_only { "?open=true" } else { "" };
    Call::get(format!("/missions/{}/incidents{query}", seg(mission_id)))
}

pub(crate) fn close_incident(incident_id: &str, note: &str) -> Call {
    Call::post(format!("/incidents/{}/close", seg(incident_id)), json!({"note": note}))
}

pub(crate) fn audit(mission_id: Option<&str>) -> Call {
    match mission_id {
        Some(m) => Call::get(format!("/audit?mission={}", seg(m))),
        None => Call::get("/audit".into()),
    }
}

/// A page of a list the API answers.
#[derive(serde::Deserialize)]
pub(crate) struct Page<T> {
    pub items: Vec<T>,
}
