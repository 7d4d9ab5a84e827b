//! A segment: this process's claim on a run (F1); the node journal the server
//! keeps for it (`start_node`, `complete_node`) and the end of the run
//! (`finish`); and the node context whose `attempt` admits an effect as the
//! node's execution, sends it within its deadline, reports what happened and
//! replays what is already settled.

use std::panic::{catch_unwind, resume_unwind, AssertUnwindSafe};
use std::time::{Duration, Instant};

use serde::Deserialize;
use serde_json::{json, Value};

use crate::adapter::{Adapter, Dispatch, Outcome, SendError};
use crate::client::{seg, Client, Coordinator};
use crate::error::{Error, Result};
use crate::records::{Claim, NodeCompletion, Run, Settlement};

impl Client {
    /// Start a run of `mission_id` whose nodes run here, as its first segment.
    pub fn start_run(&self, mission_id: &str, segment: &str, input: Value) -> Result<Segment> {
        let body = json!({"segment": segment, "input": input});
        let claim: Claim = self.post(&format!("/missions/{}/runs", seg(mission_id)), body)?;
        Ok(Segment::new(self.clone(), claim))
    }
}

impl Coordinator {
    /// Continue the run here as `segment_id` under the resume policy (R9): the
    /// run's owner segment continues with a new claim; a segment the run has
    /// never used takes it over first, as `recover` would. Then run its nodes
    /// again through the returned segment: settled effects replay.
    pub fn resume(&self, run_id: &str, segment_id: &str) -> Result<Segment> {
        self.claim(run_id, segment_id, false)
    }

    /// `resume`, with `force` past a live lease (needs `stop`; audited).
    pub fn claim(&self, run_id: &str, segment_id: &str, force: bool) -> Result<Segment> {
        let body = json!({"segment": segment_id, "force": force});
        let claim: Claim = self.client.post(&format!("/runs/{}/claim", seg(run_id)), body)?;
        Ok(Segment::new(self.client.clone(), claim))
    }
}

/// This process's hold on a run, as one segment of it.
#[derive(Debug, Clone)]
pub struct Segment {
    client: Client,
    claim: Claim,
}

impl Segment {
    pub(crate) fn new(client: Client, claim: Claim) -> Segment {
        Segment { client, claim }
    }

    pub fn run_id(&self) -> &str {
        &self.claim.run_id
    }

    pub fn epoch(&self) -> u64 {
        self.claim.epoch
    }

    /// The claim as the server answered it (its `claim` token is a secret).
    pub fn claim(&self) -> &Claim {
        &self.claim
    }

    /// The lease left when the server last answered: renew at half of it.
    pub fn lease(&self) -> Duration {
        Duration::from_millis(self.claim.lease_ms)
    }

    fn credentials(&self) -> Value {
        json!({"segment": self.claim.segment, "epoch": self.claim.epoch, "claim": self.claim.claim})
    }

    fn with_credentials(&self, fields: Value) -> Value {
        let mut body = self.credentials();
        if let (Some(body), Value::Object(fields)) = (body.as_object_mut(), fields) {
            body.extend(fields);
        }
        body
    }

    /// Renew the lease. `fenced` if the segment no longer holds the run.
    pub fn renew(&mut self) -> Result<Duration> {
        let path = format!("/runs/{}/renew", seg(&self.claim.run_id));
        let answer: Value = self.client.post(&path, self.credentials())?;
        if let Some(ms) = answer["lease_ms"].as_u64() {
            self.claim.lease_ms = ms;
        }
        Ok(self.lease())
    }

    /// Let go of the run so that it can be claimed at once (after its nodes
    /// block, say).
    pub fn release(self) -> Result<()> {
        let path = format!("/runs/{}/release", seg(&self.claim.run_id));
        let _: Value = self.client.post(&path, self.credentials())?;
        Ok(())
    }

    /// Start node `node_id` (its journal is kept by the server, as the plan
    /// runner keeps a Python node's) and return its context. The execution is
    /// the server's: the same one after a crash (the node was left running or
    /// blocked), so its settled effects replay in it; a new one after the node
    /// failed. Every `attempt` of the context is admitted as that execution.
    pub fn start_node(&self, node_id: &str) -> Result<Context<'_>> {
        let path = format!("/runs/{}/nodes/{}/start", seg(&self.claim.run_id), seg(node_id));
        let started: NodeStarted = self.client.post(&path, self.credentials())?;
        Ok(self.node(node_id, started.execution))
    }

    /// The context of an execution of node `node_id` already started (the
    /// number `start_node` answered, kept by this process). Prefer
    /// `start_node`: an execution the node's journal does not run cannot be
    /// completed.
    pub fn node(&self, node_id: &str, execution: u64) -> Context<'_> {
        Context { segment: self, node_id: node_id.to_string(), execution }
    }

    /// Record node `node_id`'s result for its running execution, with its
    /// hash, before anything consumes it (N1). The same completion again
    /// answers the same; another result, or an execution that is not the
    /// node's running one, is `invalid_state`.
    pub fn complete_node(
        &self,
        node_id: &str,
        execution: u64,
        result: Value,
    ) -> Result<NodeCompletion> {
        let path = format!("/runs/{}/nodes/{}/complete", seg(&self.claim.run_id), seg(node_id));
        let body = json!({"execution": execution, "result": result});
        self.client.post(&path, self.with_credentials(body))
    }

    /// End the run, completed or failed (with why), and return it as recorded.
    /// Refused as `invalid_state` (`unresolved` in its details) while any
    /// attempt of the run is unresolved: settle those first.
    pub fn finish(&self, ending: Ending, reason: Option<&str>) -> Result<Run> {
        let mut body = json!({"status": ending.as_str()});
        if let Some(reason) = reason {
            body["reason"] = json!(reason);
        }
        let path = format!("/runs/{}/finish", seg(&self.claim.run_id));
        self.client.post(&path, self.with_credentials(body))
    }
}

/// How a run ends (`Segment::finish`).
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
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

/// What starting a node answers.
#[derive(Deserialize)]
struct NodeStarted {
    execution: u64,
}

/// A node's context: where its effects are performed as attempts.
#[derive(Debug)]
pub struct Context<'s> {
    segment: &'s Segment,
    node_id: String,
    execution: u64,
}

impl Context<'_> {
    pub fn node_id(&self) -> &str {
        &self.node_id
    }

    /// The node's execution every attempt of this context is admitted as.
    pub fn execution(&self) -> u64 {
        self.execution
    }

    /// Record this execution's result (see `Segment::complete_node`).
    pub fn complete(&self, result: Value) -> Result<NodeCompletion> {
        self.segment.complete_node(&self.node_id, self.execution, result)
    }

    /// Perform one effect of this node as an attempt: admitted against the
    /// allowance and written down before it is sent (A1, A2), sent once within
    /// its deadline, reported after. An effect already settled for this node
    /// (`key`, A6) is not sent again: its record is returned (A4).
    ///
    /// Ok is the target's result. `AttemptFailed` is a failure or a proven
    /// non-application; `Blocked` an outcome nobody knows yet (the node must
    /// stop; evidence or a person settles it); `SettlementUnrecorded` a send
    /// whose report did not reach the server (recover, never send again);
    /// `LateReport` a send during which the run was taken over (stop).
    pub fn attempt<A: Adapter + ?Sized>(
        &self,
        adapter: &A,
        operation: &str,
        request: Value,
        key: &str,
    ) -> Result<Value> {
        let op = adapter.operation(operation).ok_or_else(|| {
            Error::Usage(format!("adapter {:?} offers no operation {operation:?}", adapter.name()))
        })?;
        let estimate = adapter.estimate(operation, &request);
        let mut body = json!({
            "node_id": self.node_id,
            "execution": self.execution,
            "effect_key": key,
            "adapter": adapter.name(),
            "operation": operation,
            "effect_class": op.effect_class.as_str(),
            "request": request,
            "estimate": estimate.amounts,
        });
        if let Some(window) = op.dedupe_window_seconds {
            body["dedupe_window_seconds"] = json!(window);
        }
        if let Some(source) = &estimate.price_source {
            body["price_source"] = json!(source);
        }
        let segment = self.segment;
        let path = format!("/runs/{}/attempts", seg(segment.run_id()));
        // The deadline is counted from before the admission is asked for: the
        // store starts it at its dispatch commit, later, so this errs early (F3).
        let counted_from = Instant::now();
        let answer: Value = segment.client.post(&path, segment.with_credentials(body))?;
        let attempt_id = text(&answer, "attempt_id");
        match answer["action"].as_str() {
            Some("send") => {
                let send = Dispatch {
                    attempt_id,
                    run_id: text(&answer, "run_id"),
                    epoch: answer["epoch"].as_u64().unwrap_or(segment.epoch()),
                    operation: operation.to_string(),
                    request, // what was admitted (and hashed) is what is sent
                    idempotency_key: text(&answer, "idempotency_key"),
                    fencing_token: text(&answer, "fencing_token"),
                    send_deadline: Duration::from_millis(
                        answer["send_deadline_ms"].as_u64().unwrap_or(0),
                    ),
                    counted_from,
                };
                self.send(adapter, send)
            }
            Some("replay") => replayed(attempt_id, &answer),
            Some("blocked") => Err(Error::Blocked { attempt_id, status: text(&answer, "status") }),
            Some("voided") => Err(Error::Voided { attempt_id, reason: text(&answer, "reason") }),
            _ => Err(Error::Protocol(format!("admission answered no known action: {answer}"))),
        }
    }

    /// Send an admitted attempt and report what happened. A panic in the
    /// adapter is reported UNKNOWN (the bytes may have left), then goes on.
    fn send<A: Adapter + ?Sized>(&self, adapter: &A, send: Dispatch) -> Result<Value> {
        let sent = match send.check_deadline() {
            Err(late) => Err(late),
            Ok(()) => match catch_unwind(AssertUnwindSafe(|| adapter.dispatch(&send))) {
                Ok(sent) => sent,
                Err(panic) => {
                    let reason = "the adapter panicked during the send".to_string();
                    let _ = self.report(&send, Err(SendError::unknown(reason, Value::Null)));
                    resume_unwind(panic)
                }
            },
        };
        let settled = self.report(&send, sent.clone())?;
        if settled.late {
            return Err(Error::LateReport { attempt_id: send.attempt_id, status: settled.status });
        }
        match sent {
            Ok(outcome) if outcome.succeeded => Ok(outcome.result),
            Ok(outcome) => Err(Error::AttemptFailed {
                attempt_id: send.attempt_id,
                status: settled.status,
                result: outcome.result,
            }),
            Err(SendError::NotApplied { proof }) => Err(Error::AttemptFailed {
                attempt_id: send.attempt_id,
                status: settled.status,
                result: proof,
            }),
            Err(SendError::Unknown { .. }) => {
                Err(Error::Blocked { attempt_id: send.attempt_id, status: settled.status })
            }
        }
    }

    fn report(
        &self,
        send: &Dispatch,
        sent: std::result::Result<Outcome, SendError>,
    ) -> Result<Settlement> {
        let body = match sent {
            Ok(outcome) => json!({
                "outcome": if outcome.succeeded { "succeeded" } else { "failed" },
                "cost": outcome.cost,
                "result": outcome.result,
                "receipt": outcome.receipt,
            }),
            Err(SendError::NotApplied { proof }) => {
                json!({"outcome": "not_applied", "proof": proof})
            }
            Err(SendError::Unknown { reason, detail }) => {
                json!({"outcome": "unknown", "reason": reason, "detail": detail})
            }
        };
        let segment = self.segment;
        let path = format!("/attempts/{}/report", seg(&send.attempt_id));
        segment.client.post(&path, segment.with_credentials(body)).map_err(|cause| match cause {
            // The server answered: the report was judged, not lost.
            Error::Api { .. } => cause,
            lost => Error::SettlementUnrecorded {
                attempt_id: send.attempt_id.clone(),
                cause: Box::new(lost),
            },
        })
    }
}

fn text(answer: &Value, name: &str) -> String {
    answer[name].as_str().unwrap_or_default().to_string()
}

fn replayed(attempt_id: String, answer: &Value) -> Result<Value> {
    let status = text(answer, "status");
    if status == "succeeded" {
        return Ok(answer["result"].clone());
    }
    Err(Error::AttemptFailed { attempt_id, status, result: answer["result"].clone() })
}
