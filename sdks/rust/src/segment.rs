//! A segment: this process's claim on a run (F1), kept by renewing its lease
//! (by hand, or in the background with [`Segment::keep_renewing`]); the node
//! journal the server keeps for it (`start_node`, `complete_node`) and the end
//! of the run (`finish`); and the node context whose `attempt` admits an
//! effect as the node's execution, sends it within its deadline, reports what
//! happened and replays what is already settled.

use std::panic::{catch_unwind, resume_unwind, AssertUnwindSafe};
use std::sync::mpsc::{self, RecvTimeoutError};
use std::sync::Arc;
use std::thread::JoinHandle;
use std::time::{Duration, Instant};

use serde::de::DeserializeOwned;
use serde::Serialize;
use serde_json::Value;

use crate::adapter::{Adapter, Dispatch};
use crate::calls::{self, to_json};
use crate::client::{Client, Coordinator};
use crate::error::Result;
use crate::protocol::{self, Admission, Concluded, NodeStarted, Renewed, SegmentCore};
use crate::records::{Claim, NodeCompletion, Run, Settlement};

pub use crate::protocol::Ending;

impl Client {
    /// Start a run of `mission_id` whose nodes run here, as its first segment;
    /// `input` (any `Serialize`) is recorded with the run.
    pub fn start_run<I: Serialize + ?Sized>(
        &self,
        mission_id: &str,
        segment: &str,
        input: &I,
    ) -> Result<Segment> {
        let claim: Claim =
            self.send(calls::start_run(mission_id, segment, to_json(input, "the input")?))?;
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
        let claim: Claim = self.client.send(calls::claim(run_id, segment_id, force))?;
        Ok(Segment::new(self.client.clone(), claim))
    }
}

/// This process's hold on a run, as one segment of it. Clones share the hold:
/// a clone may renew it (or a [`Renewal`] may) while a node runs on another.
#[derive(Debug, Clone)]
pub struct Segment {
    client: Client,
    core: Arc<SegmentCore>,
}

impl Segment {
    pub(crate) fn new(client: Client, claim: Claim) -> Segment {
        Segment { client, core: SegmentCore::new(claim) }
    }

    pub fn run_id(&self) -> &str {
        &self.core.claim.run_id
    }

    pub fn epoch(&self) -> u64 {
        self.core.claim.epoch
    }

    /// The claim as the server answered it (its `claim` token is a secret).
    pub fn claim(&self) -> &Claim {
        &self.core.claim
    }

    /// The lease left when the server last answered a claim or a renewal.
    pub fn lease(&self) -> Duration {
        self.core.lease()
    }

    /// Whether the server said this segment no longer holds the run: every
    /// call it makes then fails with that answer, sending nothing.
    pub fn is_fenced(&self) -> bool {
        self.core.fenced().is_some()
    }

    /// A call as this segment, its `fenced` answer remembered.
    fn send<T: DeserializeOwned>(&self, call: Result<crate::calls::Call>) -> Result<T> {
        self.core.note(call.and_then(|call| self.client.send(call)))
    }

    /// Renew the lease; `fenced` if the segment no longer holds the run.
    /// Callable while a node of this segment runs (from another thread, or a
    /// clone): see also [`Segment::keep_renewing`].
    pub fn renew(&self) -> Result<Duration> {
        let renewed: Renewed = self.send(self.core.renew_call())?;
        Ok(self.core.renewed(&renewed))
    }

    /// Renew the lease at half of it, on a thread of its own, until the
    /// returned [`Renewal`] is dropped (or stopped), the segment is released
    /// or finished, or a renewal is answered `fenced` (the next call of the
    /// segment then fails with it). A renewal that gets no answer is tried
    /// again at the next tick. A node may then run longer than the lease.
    pub fn keep_renewing(&self) -> Renewal {
        let (stop, stopped) = mpsc::channel::<()>();
        let segment = self.clone();
        let thread = std::thread::Builder::new()
            .name(format!("charter-renew-{}", self.run_id()))
            .spawn(move || loop {
                match stopped.recv_timeout(segment.core.renew_every()) {
                    Err(RecvTimeoutError::Timeout) if !segment.core.ended() => {
                        let _ = segment.renew(); // a `fenced` answer is remembered
                    }
                    _ => return,
                }
            })
            .expect("a thread to renew the lease");
        Renewal { stop: Some(stop), thread: Some(thread) }
    }

    /// Let go of the run so that it can be claimed at once (after its nodes
    /// block, say).
    pub fn release(self) -> Result<()> {
        self.core.end();
        let _: Value = self.send(self.core.release_call())?;
        Ok(())
    }

    /// Start node `node_id` (its journal is kept by the server, as the plan
    /// runner keeps a Python node's) and return its context. The execution is
    /// the server's: the same one after a crash (the node was left running or
    /// blocked), so its settled effects replay in it; a new one after the node
    /// failed. Every `attempt` of the context is admitted as that execution.
    pub fn start_node(&self, node_id: &str) -> Result<Context<'_>> {
        let started: NodeStarted = self.send(self.core.start_node_call(node_id))?;
        Ok(self.node(node_id, started.execution))
    }

    /// The context of an execution of node `node_id` already started (the
    /// number `start_node` answered, kept by this process). Prefer
    /// `start_node`: an execution the node's journal does not run cannot be
    /// completed.
    pub fn node(&self, node_id: &str, execution: u64) -> Context<'_> {
        Context { segment: self, node_id: node_id.to_string(), execution }
    }

    /// Record node `node_id`'s result (any `Serialize`) for its running
    /// execution, with its hash, before anything consumes it (N1). The same
    /// completion again answers the same; another result, or an execution
    /// that is not the node's running one, is `invalid_state`.
    pub fn complete_node<T: Serialize + ?Sized>(
        &self,
        node_id: &str,
        execution: u64,
        result: &T,
    ) -> Result<NodeCompletion> {
        let result = to_json(result, "the node's result")?;
        self.send(self.core.complete_call(node_id, execution, result))
    }

    /// End the run, completed or failed (with why), and return it as recorded.
    /// Refused as `invalid_state` (`unresolved` in its details) while any
    /// attempt of the run is unresolved: settle those first.
    pub fn finish(&self, ending: Ending, reason: Option<&str>) -> Result<Run> {
        let run: Run = self.send(self.core.finish_call(ending, reason))?;
        self.core.end();
        Ok(run)
    }
}

/// A segment's lease kept in the background ([`Segment::keep_renewing`]):
/// renewing stops when this is dropped.
#[derive(Debug)]
pub struct Renewal {
    stop: Option<mpsc::Sender<()>>,
    thread: Option<JoinHandle<()>>,
}

impl Renewal {
    /// Stop renewing, and wait for a renewal under way to end.
    pub fn stop(mut self) {
        self.stop.take();
        if let Some(thread) = self.thread.take() {
            let _ = thread.join();
        }
    }
}

impl Drop for Renewal {
    fn drop(&mut self) {
        self.stop.take(); // the thread wakes and returns; not waited for here
    }
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
    pub fn complete<T: Serialize + ?Sized>(&self, result: &T) -> Result<NodeCompletion> {
        self.segment.complete_node(&self.node_id, self.execution, result)
    }

    /// Perform one effect of this node as an attempt: admitted against the
    /// allowance and written down before it is sent (A1, A2), sent once within
    /// its deadline, reported after (the report sent again if its answer is
    /// lost: the server settles it once). An effect already settled for this
    /// node (`key`, A6) is not sent again: its record is returned (A4). An
    /// attempt proven not sent (its deadline passed before the send, or the
    /// target refused it before applying it) is admitted again, up to four
    /// admissions in all: the server decides whether to send anew (for a
    /// client's run it answers with that attempt's record: `AttemptFailed`,
    /// with the proof the send gave).
    ///
    /// `request` is any `Serialize`; the result is read as `R`. Ok is the
    /// target's result. `AttemptFailed` is a failure or a proven
    /// non-application; `Blocked` an outcome nobody knows yet (the node must
    /// stop; evidence or a person settles it); `SettlementUnrecorded` a send
    /// whose report did not reach the server (recover, never send again);
    /// `LateReport` a send during which the run was taken over (stop);
    /// `UnexpectedResult` a success whose result is not an `R`.
    pub fn attempt<A, T, R>(
        &self,
        adapter: &A,
        operation: &str,
        request: &T,
        key: &str,
    ) -> Result<R>
    where
        A: Adapter + ?Sized,
        T: Serialize + ?Sized,
        R: DeserializeOwned,
    {
        let op = protocol::offered(adapter.name(), operation, adapter.operation(operation))?;
        let request = to_json(request, "the request")?;
        let estimate = adapter.estimate(operation, &request);
        let effect = protocol::Effect {
            node_id: &self.node_id,
            execution: self.execution,
            key,
            adapter: adapter.name(),
            operation,
        };
        let body = protocol::admission(&effect, op, &estimate, &request);
        let segment = self.segment;
        let mut admissions = 0;
        let mut unsent = None;
        loop {
            admissions += 1;
            let counted_from = Instant::now();
            let answer: Value = segment.send(segment.core.admit_call(body.clone()))?;
            let send = match protocol::admitted(
                &segment.core,
                answer,
                operation,
                request.clone(),
                counted_from,
            )? {
                Admission::Send(send) => send,
                Admission::Answered(done) => {
                    return protocol::typed(protocol::again(done, unsent.as_ref()))
                }
            };
            let sent = self.dispatch(adapter, &send);
            let settled = self.report(&send, &sent)?;
            match protocol::concluded(send, sent, settled, admissions) {
                Concluded::Done(done) => return protocol::typed(done),
                Concluded::Readmit(proven) => unsent = Some(proven),
            }
        }
    }

    /// Send an admitted attempt, unless its deadline passed. A panic in the
    /// adapter is reported UNKNOWN (the bytes may have left), then goes on.
    fn dispatch<A: Adapter + ?Sized>(
        &self,
        adapter: &A,
        send: &Dispatch,
    ) -> std::result::Result<crate::Outcome, crate::SendError> {
        send.check_deadline()?;
        match catch_unwind(AssertUnwindSafe(|| adapter.dispatch(send))) {
            Ok(sent) => sent,
            Err(panic) => {
                let _ = self.report(send, &Err(protocol::panicked()));
                resume_unwind(panic)
            }
        }
    }

    fn report(
        &self,
        send: &Dispatch,
        sent: &std::result::Result<crate::Outcome, crate::SendError>,
    ) -> Result<Settlement> {
        let segment = self.segment;
        let call = segment.core.report_call(&send.attempt_id, sent)?;
        let reported = segment.client.send(call);
        // A `fenced` report is judged, not lost; it is remembered like any.
        segment.core.note(reported).map_err(|e| protocol::unrecorded(&send.attempt_id, e))
    }
}
