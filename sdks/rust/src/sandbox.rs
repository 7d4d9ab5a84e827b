//! An adapter for Charter's payments sandbox (`charter sandbox`): a complete
//! adapter written by hand, and what the examples and tests pay through.
//!
//! `pay` is idempotent by key (the sandbox answers a repeated key with the
//! first payment and applies nothing), fenced by `X-Fencing-Token`, and looked
//! up by key; the sandbox closes a key it reports absent, so a 404 from the
//! lookup is proof that the payment was not, and can no longer be, applied.

use std::io::Read;
use std::time::Duration;

use serde_json::{json, Value};

use crate::adapter::{
    Adapter, Amounts, Dispatch, Estimate, Evidence, Operation, Outcome, RecordedAttempt, SendError,
};

/// How long the sandbox remembers an idempotency key.
pub const DEDUPE_WINDOW_SECONDS: u64 = 86_400;

/// The sandbox's payments API as an adapter named `payments`.
#[derive(Debug, Clone)]
pub struct Payments {
    url: String,
    timeout: Duration,
    agent: ureq::Agent,
}

impl Payments {
    /// The sandbox at `url`; each send waits at most `timeout` for its answer.
    pub fn new(url: &str, timeout: Duration) -> Payments {
        // Timeouts always set; ureq never retries a POST with a body, and
        // redirects are not followed: every request that leaves is an attempt.
        let agent = ureq::AgentBuilder::new()
            .timeout_connect(Duration::from_secs(2))
            .timeout(timeout)
            .redirects(0)
            .build();
        Payments { url: url.trim_end_matches('/').to_string(), timeout, agent }
    }

    /// Every payment the sandbox applied, as it records them.
    pub fn payments(&self) -> Result<Vec<Value>, String> {
        let (status, body) = answer(self.agent.get(&format!("{}/v1/payments", self.url)).call())
            .map_err(|e| format!("{e:?}"))?;
        match body["data"].as_array() {
            Some(found) if status == 200 => Ok(found.clone()),
            _ => Err(format!("HTTP {status}: {body}")),
        }
    }

    /// Arm one of the sandbox's misbehaviours (`slow`, `drop_after_apply`...)
    /// for the payment with client reference `reference`.
    pub fn fault(&self, fault: &str, seconds: f64, reference: &str) -> Result<(), String> {
        let body = json!({"fault": fault, "seconds": seconds, "reference": reference});
        match answer(self.agent.post(&format!("{}/_sandbox/faults", self.url)).send_json(body)) {
            Ok((200..=299, _)) => Ok(()),
            other => Err(format!("{other:?}")),
        }
    }

    fn settled(payment: &Value) -> Outcome {
        let cost = payment["amount"].as_u64().unwrap_or(0);
        Outcome::succeeded(
            payment.clone(),
            Amounts::from([("usd_cents".to_string(), cost)]),
            json!({"payment": payment["id"]}),
        )
    }
}

/// A status and a JSON body, or the transport error when no answer came.
fn answer(sent: Result<ureq::Response, ureq::Error>) -> Result<(u16, Value), Box<ureq::Transport>> {
    let response = match sent {
        Ok(r) => r,
        Err(ureq::Error::Status(_, r)) => r,
        Err(ureq::Error::Transport(t)) => return Err(Box::new(t)),
    };
    let status = response.status();
    let mut text = String::new();
    // A body cut off half-way is read as no JSON: the status still says what it said.
    let _ = response.into_reader().take(1 << 20).read_to_string(&mut text);
    Ok((status, serde_json::from_str(&text).unwrap_or(Value::Null)))
}

impl Adapter for Payments {
    fn name(&self) -> &str {
        "payments"
    }

    fn operations(&self) -> Vec<(String, Operation)> {
        operations()
    }

    fn estimate(&self, _operation: &str, request: &Value) -> Estimate {
        estimate(request)
    }

    fn dispatch(&self, send: &Dispatch) -> Result<Outcome, SendError> {
        let request = self
            .agent
            .post(&format!("{}/v1/payments", self.url))
            .timeout(self.timeout)
            .set("Idempotency-Key", &send.idempotency_key)
            .set("X-Fencing-Token", &send.fencing_token);
        send.check_deadline()?; // right before the bytes go out (F3)
        match answer(request.send_json(&send.request)) {
            Ok((status, body)) => judged(status, body),
            Err(t)
                if t.kind() == ureq::ErrorKind::ConnectionFailed
                    || t.kind() == ureq::ErrorKind::Dns =>
            {
                // No connection was made: not one byte was sent. That is proof.
                Err(SendError::not_applied(json!({"error": t.to_string()})))
            }
            // A timeout, a reset after the request went out: it may have applied (A3).
            Err(t) => Err(SendError::unknown(t.to_string(), Value::Null)),
        }
    }

    fn lookup(&self, attempt: &RecordedAttempt) -> Evidence {
        let url = by_key(&self.url, &attempt.idempotency_key);
        match answer(self.agent.get(&url).call()) {
            Ok((status, body)) => found(&attempt.idempotency_key, status, body),
            Err(t) => Evidence::Indeterminate(json!({"lookup": t.to_string()})),
        }
    }
}

fn operations() -> Vec<(String, Operation)> {
    vec![("pay".to_string(), Operation::idempotent_keyed(DEDUPE_WINDOW_SECONDS))]
}

fn estimate(request: &Value) -> Estimate {
    Estimate::new([("usd_cents", request["amount"].as_u64().unwrap_or(0))], "sandbox/amount")
}

fn by_key(url: &str, key: &str) -> String {
    format!("{url}/v1/payments/by-key/{}", crate::calls::seg(key))
}

/// What the sandbox's answer to a payment says happened.
fn judged(status: u16, body: Value) -> Result<Outcome, SendError> {
    match status {
        200 | 201 => Ok(Payments::settled(&body)),
        // Documented by the sandbox as refused before anything was applied.
        409 | 429 => Err(SendError::not_applied(json!({"status": status, "body": body}))),
        400 | 401 | 403 | 404 | 422 => {
            Ok(Outcome::failed(body, Amounts::new(), json!({"status": status})))
        }
        _ => Err(SendError::unknown(format!("HTTP {status}"), body)),
    }
}

/// What the sandbox's answer to a lookup by key proves.
fn found(key: &str, status: u16, body: Value) -> Evidence {
    match status {
        // The effect itself, and ours: proof it was applied.
        200 if body["idempotency_key"].as_str() == Some(key) => {
            Evidence::Applied(Payments::settled(&body))
        }
        // Proof only because the sandbox closes a key it reports absent.
        404 => Evidence::NotApplied(json!({"lookup": "no payment with this key", "body": body})),
        _ => Evidence::Indeterminate(json!({"status": status, "body": body})),
    }
}

/// The sandbox's payments API as an async adapter named `payments` (reqwest).
#[cfg(feature = "async")]
#[derive(Debug, Clone)]
pub struct AsyncPayments {
    url: String,
    http: reqwest::Client,
}

#[cfg(feature = "async")]
impl AsyncPayments {
    /// The sandbox at `url`; each send waits at most `timeout` for its answer.
    pub fn new(url: &str, timeout: Duration) -> AsyncPayments {
        // Redirects are not followed and reqwest never retries: every request
        // that leaves is an attempt.
        let http = reqwest::Client::builder()
            .connect_timeout(Duration::from_secs(2))
            .timeout(timeout)
            .redirect(reqwest::redirect::Policy::none())
            .build()
            .expect("a reqwest client without TLS builds");
        AsyncPayments { url: url.trim_end_matches('/').to_string(), http }
    }

    async fn answer(sent: reqwest::RequestBuilder) -> Result<(u16, Value), reqwest::Error> {
        let response = sent.send().await?;
        let status = response.status().as_u16();
        // A body cut off half-way is read as no JSON: the status still says what it said.
        let text = response.text().await.unwrap_or_default();
        Ok((status, serde_json::from_str(&text).unwrap_or(Value::Null)))
    }
}

#[cfg(feature = "async")]
impl crate::AsyncAdapter for AsyncPayments {
    fn name(&self) -> &str {
        "payments"
    }

    fn operations(&self) -> Vec<(String, Operation)> {
        operations()
    }

    fn estimate(&self, _operation: &str, request: &Value) -> Estimate {
        estimate(request)
    }

    fn dispatch<'a>(
        &'a self,
        send: &'a Dispatch,
    ) -> crate::BoxFuture<'a, Result<Outcome, SendError>> {
        Box::pin(async move {
            let request = self
                .http
                .post(format!("{}/v1/payments", self.url))
                .header("Idempotency-Key", &send.idempotency_key)
                .header("X-Fencing-Token", &send.fencing_token)
                .json(&send.request);
            send.check_deadline()?; // right before the bytes go out (F3)
            match AsyncPayments::answer(request).await {
                Ok((status, body)) => judged(status, body),
                // No connection was made: not one byte was sent. That is proof.
                Err(e) if e.is_connect() => {
                    Err(SendError::not_applied(json!({"error": e.to_string()})))
                }
                // A timeout, a reset after the request went out: it may have applied (A3).
                Err(e) => Err(SendError::unknown(e.to_string(), Value::Null)),
            }
        })
    }

    fn lookup<'a>(&'a self, attempt: &'a RecordedAttempt) -> crate::BoxFuture<'a, Evidence> {
        Box::pin(async move {
            let url = by_key(&self.url, &attempt.idempotency_key);
            match AsyncPayments::answer(self.http.get(url)).await {
                Ok((status, body)) => found(&attempt.idempotency_key, status, body),
                Err(e) => Evidence::Indeterminate(json!({"lookup": e.to_string()})),
            }
        })
    }
}
