//! The async client (feature `async`): the same protocol as the blocking
//! client, described by the same calls (`calls.rs`) and read by the same
//! segment protocol (`protocol.rs`), carried by reqwest on tokio. Adapters
//! are [`AsyncAdapter`]s: their sends and lookups are futures.
//!
//! An attempt is cancel-safe in the one way that matters: if the future of
//! [`AsyncContext::attempt`] is dropped once its effect was admitted (a
//! `tokio::time::timeout` around it, a `select!` that took another branch),
//! the report is still sent, on a task of its own: `unknown` if the send was
//! under way (the bytes may have left, A3), or what the target answered if
//! the send had ended. The attempt is never left DISPATCHED by a cancellation.

use std::future::Future;
use std::pin::Pin;
use std::sync::Arc;
use std::time::{Duration, Instant};

use serde::de::DeserializeOwned;
use serde::Serialize;
use serde_json::Value;

use crate::adapter::{
    Dispatch, Estimate, Evidence, Operation, Outcome, RecordedAttempt, SendError,
};
use crate::calls::{self, to_json, Call, Page, Resolution};
use crate::client::{ClientBuilder, Endpoint};
use crate::error::{Error, Result};
use crate::protocol::{self, Admission, Concluded, Ending, NodeStarted, Renewed, SegmentCore};
use crate::records::{
    Attempt, AuditVerification, Claim, Incident, Ledger, LimitRaised, NodeCompletion, Recovery,
    Run, Settlement, Snapshot,
};
use crate::retry::Again;

/// A boxed future an [`AsyncAdapter`] answers (Rust 1.63 has no `async fn`
/// in traits): `Box::pin(async move { ... })`.
pub type BoxFuture<'a, T> = Pin<Box<dyn Future<Output = T> + Send + 'a>>;

/// An adapter whose sends and lookups are async: the same five members as
/// [`Adapter`](crate::Adapter), with the same rules (docs/adapters.md).
pub trait AsyncAdapter: Send + Sync {
    /// The adapter's name: the `adapter` of the scope `adapter.operation` the
    /// mission's contract grants.
    fn name(&self) -> &str;

    /// The operations it offers, each with its effect class.
    fn operations(&self) -> Vec<(String, Operation)>;

    /// An upper bound on what `operation` may cost for `request`.
    fn estimate(&self, operation: &str, request: &Value) -> Estimate;

    /// Send one admitted attempt, once: its SDK's own retries off. Call
    /// `send.check_deadline()` right before the bytes go out.
    fn dispatch<'a>(
        &'a self,
        send: &'a Dispatch,
    ) -> BoxFuture<'a, std::result::Result<Outcome, SendError>>;

    /// Look an uncertain attempt up at the target (by key or by reference).
    fn lookup<'a>(&'a self, attempt: &'a RecordedAttempt) -> BoxFuture<'a, Evidence>;

    /// The operation named `operation`, if offered.
    fn operation(&self, operation: &str) -> Option<Operation> {
        self.operations().into_iter().find(|(n, _)| n == operation).map(|(_, o)| o)
    }
}

/// A principal's connection to one Charter server, async. Made by
/// [`ClientBuilder::build_async`](crate::ClientBuilder::build_async). Cheap to
/// clone: clones share the connection pool.
#[derive(Clone)]
pub struct AsyncClient {
    endpoint: Arc<Endpoint>,
    http: reqwest::Client,
}

impl std::fmt::Debug for AsyncClient {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        // The credential is a secret: never printed.
        f.debug_struct("AsyncClient").field("base", &self.endpoint.base).finish_non_exhaustive()
    }
}

impl ClientBuilder {
    /// The async client, once the address and the credential are checked.
    pub fn build_async(self) -> Result<AsyncClient> {
        let endpoint = self.endpoint()?;
        let http = match self.http {
            Some(http) => http,
            None => reqwest::Client::builder()
                .connect_timeout(self.connect_timeout)
                .timeout(self.timeout)
                .redirect(reqwest::redirect::Policy::none())
                .build()
                .map_err(|e| Error::Usage(format!("the HTTP client cannot be built: {e}")))?,
        };
        Ok(AsyncClient::new(Arc::new(endpoint), http))
    }
}

impl AsyncClient {
    pub(crate) fn new(endpoint: Arc<Endpoint>, http: reqwest::Client) -> AsyncClient {
        AsyncClient { endpoint, http }
    }

    /// A client with the builder's defaults.
    pub fn connect(base_url: &str, credential: &str) -> Result<AsyncClient> {
        ClientBuilder::new(base_url, credential).build_async()
    }

    /// The recovery API over this client.
    pub fn coordinator(&self) -> AsyncCoordinator {
        AsyncCoordinator { client: self.clone() }
    }

    /// One request, sent once: the answer's status and JSON body, whatever
    /// the status (an error only when no answer came).
    pub async fn call(
        &self,
        method: &str,
        path: &str,
        body: Option<&Value>,
    ) -> Result<(u16, Value)> {
        let name = format!("{method} {path}");
        let method = reqwest::Method::from_bytes(method.as_bytes())
            .map_err(|_| Error::Usage(format!("{method:?} is not an HTTP method")))?;
        let mut request = self
            .http
            .request(method, format!("{}{}", self.endpoint.base, path))
            .header("Authorization", &self.endpoint.authorization);
        if let Some(body) = body {
            request = request.json(body);
        }
        let response = request.send().await.map_err(|e| {
            let sent = !(e.is_connect() || e.is_builder());
            Error::transport(name.clone(), sent, e)
        })?;
        let status = response.status().as_u16();
        let text = response.text().await.map_err(|e| Error::transport(name, true, e))?;
        Ok((status, calls::body(status, &text)?))
    }

    /// A request whose 2xx answer is returned, any other status its typed
    /// error; sent again as [`Client::request`](crate::Client::request) is.
    pub async fn request(&self, method: &str, path: &str, body: Option<&Value>) -> Result<Value> {
        let again = if method == "GET" { Again::Idempotent } else { Again::IfNotSent };
        self.exchange(method, path, body, again).await
    }

    pub(crate) async fn send<T: DeserializeOwned>(&self, call: Call) -> Result<T> {
        calls::decode(self.exchange(call.method, &call.path, call.body.as_ref(), call.again).await?)
    }

    async fn exchange(
        &self,
        method: &str,
        path: &str,
        body: Option<&Value>,
        again: Again,
    ) -> Result<Value> {
        let mut retry = 0;
        loop {
            let answered = self.call(method, path, body).await;
            let failed = match answered.and_then(|(status, value)| calls::judge(status, value)) {
                Ok(value) => return Ok(value),
                Err(failed) => failed,
            };
            match self.endpoint.retry.next(retry, again, &failed) {
                Some(wait) => tokio::time::sleep(wait).await,
                None => return Err(failed),
            }
            retry += 1;
        }
    }

    /// The principal the credential proves.
    pub async fn me(&self) -> Result<String> {
        let me: Value = self.send(calls::me()).await?;
        me["principal"]
            .as_str()
            .map(str::to_string)
            .ok_or_else(|| Error::Protocol(format!("/me answered {me}")))
    }

    /// An attempt with its evidence and next safe action.
    pub async fn attempt(&self, attempt_id: &str) -> Result<Attempt> {
        self.send(calls::attempt(attempt_id)).await
    }

    /// The run's waits: approvals, timers, questions.
    pub async fn waits(&self, run_id: &str) -> Result<Value> {
        self.send(calls::waits(run_id)).await
    }

    /// Start a run of `mission_id` whose nodes run here, as its first segment.
    pub async fn start_run<I: Serialize + ?Sized>(
        &self,
        mission_id: &str,
        segment: &str,
        input: &I,
    ) -> Result<AsyncSegment> {
        let call = calls::start_run(mission_id, segment, to_json(input, "the input")?);
        let claim: Claim = self.send(call).await?;
        Ok(AsyncSegment { client: self.clone(), core: SegmentCore::new(claim) })
    }

    /// Stop a run (needs `stop`), as [`Client::stop`](crate::Client::stop).
    pub async fn stop(&self, run_id: &str, reason: &str) -> Result<Run> {
        self.send(calls::stop(run_id, reason)).await
    }

    /// Raise a mission's limit in one unit (needs `raise_limit`).
    pub async fn raise_limit(
        &self,
        mission_id: &str,
        unit: &str,
        limit: u64,
    ) -> Result<LimitRaised> {
        self.send(calls::raise_limit(mission_id, unit, limit)).await
    }

    /// A mission's balances per unit, and the ledger check.
    pub async fn ledger(&self, mission_id: &str) -> Result<Ledger> {
        self.send(calls::ledger(mission_id)).await
    }

    /// A mission's incidents by opening time (the first page).
    pub async fn incidents(&self, mission_id: &str, open_only: bool) -> Result<Vec<Incident>> {
        let page: Page<Incident> = self.send(calls::incidents(mission_id, open_only)).await?;
        Ok(page.items)
    }

    /// Close an incident with a note saying what was done (needs `resolve`).
    pub async fn close_incident(&self, incident_id: &str, note: &str) -> Result<()> {
        let _: Value = self.send(calls::close_incident(incident_id, note)).await?;
        Ok(())
    }

    /// Verify the audit hash chains: one mission's, or every chain.
    pub async fn audit(&self, mission_id: Option<&str>) -> Result<AuditVerification> {
        self.send(calls::audit(mission_id)).await
    }
}

/// The recovery API, async, with the seed's names.
#[derive(Debug, Clone)]
pub struct AsyncCoordinator {
    client: AsyncClient,
}

impl AsyncCoordinator {
    /// Take the run over as `segment_id` (R1-R5), as `Coordinator::recover`.
    pub async fn recover(&self, run_id: &str, segment_id: &str) -> Result<Recovery> {
        self.recover_with(run_id, segment_id, false).await
    }

    /// `recover`, forced past a live lease (needs `stop`; audited).
    pub async fn recover_with(
        &self,
        run_id: &str,
        segment_id: &str,
        force: bool,
    ) -> Result<Recovery> {
        let snapshot: Snapshot =
            self.client.send(calls::recover(run_id, segment_id, force)).await?;
        Ok(Recovery { unresolved: snapshot.unresolved.clone(), snapshot })
    }

    /// The run's recorded state.
    pub async fn state(&self, run_id: &str) -> Result<Snapshot> {
        self.client.send(calls::state(run_id)).await
    }

    /// Ask `adapter` what became of an uncertain attempt and record it as evidence (A8).
    pub async fn reconcile<A: AsyncAdapter + ?Sized>(
        &self,
        attempt_id: &str,
        adapter: &A,
    ) -> Result<Settlement> {
        let attempt = self.client.attempt(attempt_id).await?;
        protocol::same_adapter(&attempt, adapter.name())?;
        let evidence = adapter.lookup(&attempt.recorded()).await;
        self.client.send(calls::evidence(attempt_id, evidence.to_json())).await
    }

    /// Settle an uncertain attempt on its recorded evidence (R7).
    pub async fn confirm(&self, attempt_id: &str, evidence_id: Option<&str>) -> Result<Attempt> {
        self.client.send(calls::confirm(attempt_id, evidence_id)).await
    }

    /// A person's settlement, with the evidence they saw (R8).
    pub async fn resolve(&self, attempt_id: &str, resolution: &Resolution) -> Result<Attempt> {
        self.client.send(calls::resolve(attempt_id, resolution)).await
    }

    /// Continue the run here as `segment_id` under the resume policy (R9).
    pub async fn resume(&self, run_id: &str, segment_id: &str) -> Result<AsyncSegment> {
        self.claim(run_id, segment_id, false).await
    }

    /// `resume`, with `force` past a live lease (needs `stop`; audited).
    pub async fn claim(&self, run_id: &str, segment_id: &str, force: bool) -> Result<AsyncSegment> {
        let claim: Claim = self.client.send(calls::claim(run_id, segment_id, force)).await?;
        Ok(AsyncSegment { client: self.client.clone(), core: SegmentCore::new(claim) })
    }

    /// Continue a run whose plan runs on the server.
    pub async fn resume_on_server(&self, run_id: &str, segment_id: Option<&str>) -> Result<Value> {
        self.client.send(calls::resume_on_server(run_id, segment_id)).await
    }
}

/// This process's hold on a run, async: as [`Segment`](crate::Segment).
#[derive(Debug, Clone)]
pub struct AsyncSegment {
    client: AsyncClient,
    core: Arc<SegmentCore>,
}

impl AsyncSegment {
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

    /// Whether the server said this segment no longer holds the run.
    pub fn is_fenced(&self) -> bool {
        self.core.fenced().is_some()
    }

    async fn send<T: DeserializeOwned>(&self, call: Result<Call>) -> Result<T> {
        let answered = match call {
            Ok(call) => self.client.send(call).await,
            Err(e) => Err(e),
        };
        self.core.note(answered)
    }

    /// Renew the lease; `fenced` if the segment no longer holds the run.
    pub async fn renew(&self) -> Result<Duration> {
        let renewed: Renewed = self.send(self.core.renew_call()).await?;
        Ok(self.core.renewed(&renewed))
    }

    /// Renew the lease at half of it on a task of its own (tokio::spawn),
    /// until the returned [`AsyncRenewal`] is dropped, the segment is released
    /// or finished, or a renewal is answered `fenced`.
    pub fn keep_renewing(&self) -> AsyncRenewal {
        let segment = self.clone();
        let task = tokio::spawn(async move {
            loop {
                tokio::time::sleep(segment.core.renew_every()).await;
                if segment.core.ended() {
                    return;
                }
                let _ = segment.renew().await; // a `fenced` answer is remembered
            }
        });
        AsyncRenewal { task }
    }

    /// Let go of the run so that it can be claimed at once.
    pub async fn release(self) -> Result<()> {
        self.core.end();
        let _: Value = self.send(self.core.release_call()).await?;
        Ok(())
    }

    /// Start node `node_id` and return its context (see `Segment::start_node`).
    pub async fn start_node(&self, node_id: &str) -> Result<AsyncContext<'_>> {
        let started: NodeStarted = self.send(self.core.start_node_call(node_id)).await?;
        Ok(self.node(node_id, started.execution))
    }

    /// The context of an execution of node `node_id` already started.
    pub fn node(&self, node_id: &str, execution: u64) -> AsyncContext<'_> {
        AsyncContext { segment: self, node_id: node_id.to_string(), execution }
    }

    /// Record node `node_id`'s result for its running execution (N1).
    pub async fn complete_node<T: Serialize + ?Sized>(
        &self,
        node_id: &str,
        execution: u64,
        result: &T,
    ) -> Result<NodeCompletion> {
        let result = to_json(result, "the node's result")?;
        self.send(self.core.complete_call(node_id, execution, result)).await
    }

    /// End the run, completed or failed (with why).
    pub async fn finish(&self, ending: Ending, reason: Option<&str>) -> Result<Run> {
        let run: Run = self.send(self.core.finish_call(ending, reason)).await?;
        self.core.end();
        Ok(run)
    }
}

/// A segment's lease kept on a task ([`AsyncSegment::keep_renewing`]):
/// renewing stops when this is dropped.
#[derive(Debug)]
pub struct AsyncRenewal {
    task: tokio::task::JoinHandle<()>,
}

impl Drop for AsyncRenewal {
    fn drop(&mut self) {
        self.task.abort();
    }
}

/// A node's context, async: where its effects are performed as attempts.
#[derive(Debug)]
pub struct AsyncContext<'s> {
    segment: &'s AsyncSegment,
    node_id: String,
    execution: u64,
}

impl AsyncContext<'_> {
    pub fn node_id(&self) -> &str {
        &self.node_id
    }

    pub fn execution(&self) -> u64 {
        self.execution
    }

    /// Record this execution's result (see `AsyncSegment::complete_node`).
    pub async fn complete<T: Serialize + ?Sized>(&self, result: &T) -> Result<NodeCompletion> {
        self.segment.complete_node(&self.node_id, self.execution, result).await
    }

    /// Perform one effect of this node as an attempt, as
    /// [`Context::attempt`](crate::Context::attempt) does; dropped once the
    /// effect was admitted, it still reports (see the module's documentation).
    pub async fn attempt<A, T, R>(
        &self,
        adapter: &A,
        operation: &str,
        request: &T,
        key: &str,
    ) -> Result<R>
    where
        A: AsyncAdapter + ?Sized,
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
            let answer: Value = segment.send(segment.core.admit_call(body.clone())).await?;
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
            let mut pending = Unreported::new(segment, &send.attempt_id);
            let sent = match send.check_deadline() {
                Err(late) => Err(late),
                Ok(()) => adapter.dispatch(&send).await,
            };
            pending.report = sent.clone();
            let settled = report(segment, &send.attempt_id, &sent).await;
            pending.disarm();
            match protocol::concluded(send, sent, settled?, admissions) {
                Concluded::Done(done) => return protocol::typed(done),
                Concluded::Readmit(proven) => unsent = Some(proven),
            }
        }
    }
}

async fn report(
    segment: &AsyncSegment,
    attempt_id: &str,
    sent: &std::result::Result<Outcome, SendError>,
) -> Result<Settlement> {
    let call = segment.core.report_call(attempt_id, sent)?;
    let reported = segment.client.send(call).await;
    segment.core.note(reported).map_err(|e| protocol::unrecorded(attempt_id, e))
}

/// An admitted attempt whose report is not answered yet: dropped so (its
/// `attempt` future cancelled), it reports on a task of its own what is
/// known, `unknown` while the send was under way.
struct Unreported {
    client: AsyncClient,
    core: Arc<SegmentCore>,
    attempt_id: String,
    report: std::result::Result<Outcome, SendError>,
    armed: bool,
}

impl Unreported {
    fn new(segment: &AsyncSegment, attempt_id: &str) -> Unreported {
        Unreported {
            client: segment.client.clone(),
            core: segment.core.clone(),
            attempt_id: attempt_id.to_string(),
            report: Err(SendError::unknown("the send was cancelled while under way", Value::Null)),
            armed: true,
        }
    }

    fn disarm(&mut self) {
        self.armed = false;
    }
}

impl Drop for Unreported {
    fn drop(&mut self) {
        if !self.armed {
            return;
        }
        let (call, runtime) = match (
            self.core.report_call(&self.attempt_id, &self.report),
            tokio::runtime::Handle::try_current(),
        ) {
            (Ok(call), Ok(runtime)) => (call, runtime),
            // Fenced already, or no runtime left: a recovery makes it UNKNOWN.
            _ => return,
        };
        let client = self.client.clone();
        runtime.spawn(async move {
            let _: Result<Value> = client.send(call).await;
        });
    }
}
