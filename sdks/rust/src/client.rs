//! The HTTP client of `charter serve`'s `/api/v1`, and the coordinator: the
//! recovery API with the seed's names (`recover`, `reconcile`, `confirm`,
//! `resolve`, `state`; `resume` and `start_run`, which answer a segment, are
//! with the segment in `segment.rs`, so that this module knows nothing of it).

use std::io::Read;
use std::time::Duration;

use serde::de::DeserializeOwned;
use serde_json::{json, Map, Value};

use crate::adapter::{Adapter, Amounts};
use crate::error::{Code, Error, Result};
use crate::records::{Attempt, Recovery, Settlement, Snapshot};

/// A principal's connection to one Charter server.
#[derive(Clone)]
pub struct Client {
    base: String,
    authorization: String,
    agent: ureq::Agent,
}

impl std::fmt::Debug for Client {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        // The credential is a secret: never printed.
        f.debug_struct("Client").field("base", &self.base).finish_non_exhaustive()
    }
}

impl Client {
    /// `base_url` is the server's address (`http://127.0.0.1:8765`);
    /// `credential` is `NAME:SECRET` (`charter credential new NAME`).
    pub fn new(base_url: &str, credential: &str) -> Client {
        let agent = ureq::AgentBuilder::new()
            .timeout_connect(Duration::from_secs(5))
            .timeout(Duration::from_secs(60))
            .redirects(0)
            .build();
        Client {
            base: format!("{}/api/v1", base_url.trim_end_matches('/')),
            authorization: format!("Bearer {credential}"),
            agent,
        }
    }

    /// The recovery API over this client.
    pub fn coordinator(&self) -> Coordinator {
        Coordinator { client: self.clone() }
    }

    /// One request; the answer's status and JSON body, whatever the status (an
    /// error only when no answer came). What the conformance driver speaks.
    pub fn call(&self, method: &str, path: &str, body: Option<&Value>) -> Result<(u16, Value)> {
        let request = self
            .agent
            .request(method, &format!("{}{}", self.base, path))
            .set("Authorization", &self.authorization);
        let answer = match body {
            Some(body) => request.send_json(body),
            None => request.call(),
        };
        let response = match answer {
            Ok(response) => response,
            Err(ureq::Error::Status(_, response)) => response,
            Err(ureq::Error::Transport(t)) => return Err(Error::Transport(t.to_string())),
        };
        let status = response.status();
        let mut text = String::new();
        response
            .into_reader()
            .take(64 * 1024 * 1024)
            .read_to_string(&mut text)
            .map_err(|e| Error::Transport(format!("reading the answer: {e}")))?;
        if text.is_empty() {
            return Ok((status, Value::Null));
        }
        let value = serde_json::from_str(&text)
            .map_err(|e| Error::Protocol(format!("HTTP {status}, not JSON ({e}): {text:.200}")))?;
        Ok((status, value))
    }

    /// A request whose 2xx answer is returned; any other is its typed error.
    pub fn request(&self, method: &str, path: &str, body: Option<&Value>) -> Result<Value> {
        let (status, value) = self.call(method, path, body)?;
        if (200..300).contains(&status) {
            return Ok(value);
        }
        Err(api_error(status, value))
    }

    pub(crate) fn get<T: DeserializeOwned>(&self, path: &str) -> Result<T> {
        decode(self.request("GET", path, None)?)
    }

    pub(crate) fn post<T: DeserializeOwned>(&self, path: &str, body: Value) -> Result<T> {
        decode(self.request("POST", path, Some(&body))?)
    }

    /// The principal the credential proves.
    pub fn me(&self) -> Result<String> {
        let me: Value = self.get("/me")?;
        me["principal"]
            .as_str()
            .map(str::to_string)
            .ok_or_else(|| Error::Protocol(format!("/me answered {me}")))
    }

    /// An attempt with its evidence and next safe action.
    pub fn attempt(&self, attempt_id: &str) -> Result<Attempt> {
        self.get(&format!("/attempts/{}", seg(attempt_id)))
    }

    /// The run's waits: approvals, timers, questions.
    pub fn waits(&self, run_id: &str) -> Result<Value> {
        self.get(&format!("/runs/{}/waits", seg(run_id)))
    }
}

/// The recovery API, with the seed's names.
#[derive(Debug, Clone)]
pub struct Coordinator {
    pub(crate) client: Client,
}

/// A person's settlement of an uncertain attempt (R8).
#[derive(Debug, Clone, PartialEq)]
pub struct Resolution {
    /// `succeeded`, `failed` or `written_off`.
    pub outcome: String,
    /// What the person saw: required.
    pub evidence: String,
    pub cost: Amounts,
    /// A cost above ten times the hold is a typo unless this says it is meant.
    pub confirm_above_hold: bool,
}

impl Coordinator {
    /// Take the run over as `segment_id` (a new name per continuation): the
    /// epoch goes up, stale work is fenced, and the attempts whose outcome is
    /// not known are named (R1-R5). It does not continue the run.
    pub fn recover(&self, run_id: &str, segment_id: &str) -> Result<Recovery> {
        self.recover_with(run_id, segment_id, false)
    }

    /// `recover`, forced past a live lease (needs `stop`; audited).
    pub fn recover_with(&self, run_id: &str, segment_id: &str, force: bool) -> Result<Recovery> {
        let body = json!({"segment": segment_id, "force": force});
        let snapshot: Snapshot =
            self.client.post(&format!("/runs/{}/recover", seg(run_id)), body)?;
        Ok(Recovery { unresolved: snapshot.unresolved.clone(), snapshot })
    }

    /// The run's recorded state: nodes, unresolved attempts, waits, next actions.
    pub fn state(&self, run_id: &str) -> Result<Snapshot> {
        self.client.get(&format!("/runs/{}", seg(run_id)))
    }

    /// Ask `adapter` (here, in this process) what became of an uncertain
    /// attempt, and record what it found as evidence (A8). Under the default
    /// `evidence_settles = "confirm"` a person then confirms it.
    pub fn reconcile<A: Adapter + ?Sized>(
        &self,
        attempt_id: &str,
        adapter: &A,
    ) -> Result<Settlement> {
        let attempt = self.client.attempt(attempt_id)?;
        if attempt.adapter != adapter.name() {
            return Err(Error::Usage(format!(
                "attempt {attempt_id} was made through adapter {:?}, not {:?}",
                attempt.adapter,
                adapter.name()
            )));
        }
        let evidence = adapter.lookup(&attempt.recorded());
        let path = format!("/attempts/{}/evidence", seg(attempt_id));
        self.client.post(&path, evidence.to_json())
    }

    /// Settle an uncertain attempt on its recorded evidence (R7): the newest
    /// conclusive evidence, or the one named.
    pub fn confirm(&self, attempt_id: &str, evidence_id: Option<&str>) -> Result<Attempt> {
        let mut body = Map::new();
        if let Some(id) = evidence_id {
            body.insert("evidence_id".into(), json!(id));
        }
        let path = format!("/attempts/{}/confirm", seg(attempt_id));
        self.client.post(&path, Value::Object(body))
    }

    /// A person's settlement, with the evidence they saw (R8).
    pub fn resolve(&self, attempt_id: &str, resolution: &Resolution) -> Result<Attempt> {
        let body = json!({
            "outcome": resolution.outcome,
            "evidence": resolution.evidence,
            "cost": resolution.cost,
            "confirm_above_hold": resolution.confirm_above_hold,
        });
        self.client.post(&format!("/attempts/{}/resolve", seg(attempt_id)), body)
    }

    /// Continue a run whose plan runs on the server (`charter worker`, a plan
    /// the server imports): the server runs its remaining nodes.
    pub fn resume_on_server(&self, run_id: &str, segment_id: Option<&str>) -> Result<Value> {
        let body = match segment_id {
            Some(s) => json!({"segment": s}),
            None => json!({}),
        };
        self.client.post(&format!("/runs/{}/resume", seg(run_id)), body)
    }
}

fn decode<T: DeserializeOwned>(value: Value) -> Result<T> {
    let shown = clip(&value);
    serde_json::from_value(value).map_err(|e| Error::Protocol(format!("{e}: {shown}")))
}

fn api_error(status: u16, value: Value) -> Error {
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
