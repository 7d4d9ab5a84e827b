//! The async client (feature `async`) against a real `charter serve` and the
//! payments sandbox: an effect sent once and replayed, typed; a send cancelled
//! by a timeout around it reported UNKNOWN, never left DISPATCHED and never
//! sent again; a lost report sent again and settled once; a busy store asked
//! again; a takeover during a send surfaced as a late report; a node longer
//! than its lease kept by a renewal task. What the server recorded and what
//! the sandbox applied are checked.

#![cfg(feature = "async")]

mod support;

use std::time::Duration;

use charter::{
    AsyncAdapter, AsyncClient, AttemptStatus, BoxFuture, Code, Dispatch, Ending, Error, Estimate,
    Evidence, Operation, Outcome, RecordedAttempt, RunStatus, SendError,
};
use serde::Deserialize;
use serde_json::{json, Value};
use support::proxy::Proxy;
use support::{invoice, Desk};

#[derive(Debug, Deserialize, PartialEq)]
struct Payment {
    id: String,
    amount: u64,
}

async fn status(ops: &AsyncClient, attempt_id: &str) -> AttemptStatus {
    ops.attempt(attempt_id).await.unwrap().status
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn x1_item10_an_async_effect_is_sent_once_replayed_and_the_run_completed() {
    let desk = Desk::start();
    let payments = desk.async_payments();
    let agent = desk.async_client("agent");
    let segment = agent.start_run(&desk.mission, "rs-1", &json!({"week": 49})).await.unwrap();
    let node = segment.start_node("pay").await.unwrap();
    let paid: Payment =
        node.attempt(&payments, "pay", &invoice("inv-1", 450), "inv-1").await.unwrap();
    let again: Payment =
        node.attempt(&payments, "pay", &invoice("inv-1", 450), "inv-1").await.unwrap();
    assert_eq!((paid.amount, &again), (450, &paid), "replayed from its record (A4)");
    node.complete(&[&paid.id]).await.unwrap();
    let run = segment.finish(Ending::Completed, None).await.unwrap();
    assert_eq!(run.status, RunStatus::Completed);
    assert_eq!(desk.paid("inv-1"), 1);
    let ledger = desk.async_client("ops").ledger(&desk.mission).await.unwrap();
    assert_eq!(ledger.balance("usd_cents").map(|b| (b.spent, b.held)), Some((450, 0)));
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a3_x1_item10_a_send_cancelled_by_a_timeout_is_reported_unknown_and_never_sent_again() {
    let desk = Desk::start();
    let payments = desk.async_payments();
    let ops = desk.async_client("ops");
    // The sandbox applies the payment, then holds its answer back for 3 s.
    desk.payments().fault("slow", 3.0, "inv-2").unwrap();
    let segment =
        desk.async_client("agent").start_run(&desk.mission, "rs-1", &json!({})).await.unwrap();
    let node = segment.start_node("pay").await.unwrap();
    let cancelled = tokio::time::timeout(
        Duration::from_millis(800),
        node.attempt::<_, _, Value>(&payments, "pay", &invoice("inv-2", 200), "inv-2"),
    )
    .await;
    assert!(cancelled.is_err(), "the timeout cancelled the attempt: {cancelled:?}");

    // The report of the cancelled send reaches the server on a task of its own.
    let state = ops.coordinator().state(segment.run_id()).await.unwrap();
    let attempt_id = state.attempts[0].id.clone();
    let deadline = std::time::Instant::now() + Duration::from_secs(10);
    while status(&ops, &attempt_id).await != AttemptStatus::Unknown {
        assert!(std::time::Instant::now() < deadline, "left {:?}", status(&ops, &attempt_id).await);
        tokio::time::sleep(Duration::from_millis(50)).await;
    }
    let recorded = ops.attempt(&attempt_id).await.unwrap();
    assert!(recorded.reason.unwrap_or_default().contains("cancelled"));
    assert_eq!(desk.paid("inv-2"), 1, "it was applied: unknown, not failed (A3)");
    // Never sent again on a guess.
    let again =
        node.attempt::<_, _, Value>(&payments, "pay", &invoice("inv-2", 200), "inv-2").await;
    assert!(
        matches!(again, Err(Error::Blocked { status: AttemptStatus::Unknown, .. })),
        "{again:?}"
    );
    assert_eq!(desk.paid("inv-2"), 1);
    let ledger = ops.ledger(&desk.mission).await.unwrap();
    assert_eq!(ledger.balance("usd_cents").map(|b| (b.spent, b.held)), Some((0, 200)), "hold kept");
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn x1_a4_item10_a_lost_report_is_sent_again_and_settled_once() {
    let desk = Desk::start();
    let proxy = Proxy::losing(&desk.url, "/report", 1);
    let agent =
        charter::Client::builder(&proxy.url, desk.credential("agent")).build_async().unwrap();
    let segment = agent.start_run(&desk.mission, "rs-1", &json!({})).await.unwrap();
    let node = segment.start_node("pay").await.unwrap();
    let paid: Payment =
        node.attempt(&desk.async_payments(), "pay", &invoice("inv-3", 300), "inv-3").await.unwrap();
    assert_eq!(paid.amount, 300);
    assert_eq!(proxy.seen("/report"), 2);
    assert_eq!(desk.paid("inv-3"), 1);
    let ops = desk.async_client("ops");
    let listed = ops.request("GET", &format!("/attempts?run={}", segment.run_id()), None).await;
    let listed = listed.unwrap();
    let items = listed["items"].as_array().unwrap();
    assert_eq!(items.len(), 1, "{listed}");
    let recorded = ops.attempt(items[0]["id"].as_str().unwrap()).await.unwrap();
    assert_eq!((recorded.status, recorded.evidence.len()), (AttemptStatus::Succeeded, 0));
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn x1_item10_a_busy_store_is_asked_again() {
    let desk = Desk::start_with(None, Some(0.2));
    let mut lock = desk.lock_store(1.0);
    let segment = desk.async_client("agent").start_run(&desk.mission, "rs-1", &json!({})).await;
    lock.wait().unwrap();
    assert_eq!(segment.unwrap().epoch(), 1);
    let runs = desk.client("ops").request("GET", &format!("/runs?mission={}", desk.mission), None);
    assert_eq!(runs.unwrap()["items"].as_array().unwrap().len(), 1);
}

/// The sandbox's async adapter, whose run an operator takes over while it sends.
struct TakenOverMidSend {
    inner: charter::sandbox::AsyncPayments,
    ops: AsyncClient,
}

impl AsyncAdapter for TakenOverMidSend {
    fn name(&self) -> &str {
        self.inner.name()
    }

    fn operations(&self) -> Vec<(String, Operation)> {
        self.inner.operations()
    }

    fn estimate(&self, operation: &str, request: &Value) -> Estimate {
        self.inner.estimate(operation, request)
    }

    fn dispatch<'a>(&'a self, send: &'a Dispatch) -> BoxFuture<'a, Result<Outcome, SendError>> {
        Box::pin(async move {
            let sent = self.inner.dispatch(send).await;
            self.ops.coordinator().recover_with(&send.run_id, "rs-2", true).await.unwrap();
            sent
        })
    }

    fn lookup<'a>(&'a self, attempt: &'a RecordedAttempt) -> BoxFuture<'a, Evidence> {
        self.inner.lookup(attempt)
    }
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn f2_x1_item10_a_report_after_a_takeover_is_surfaced_as_late_and_the_segment_stops() {
    let desk = Desk::start();
    let adapter = TakenOverMidSend { inner: desk.async_payments(), ops: desk.async_client("ops") };
    let segment =
        desk.async_client("agent").start_run(&desk.mission, "rs-1", &json!({})).await.unwrap();
    let node = segment.start_node("pay").await.unwrap();
    let late = node.attempt::<_, _, Value>(&adapter, "pay", &invoice("inv-4", 400), "inv-4").await;
    let (attempt_id, status) = match late {
        Err(Error::LateReport { attempt_id, status }) => (attempt_id, status),
        other => panic!("{other:?}"),
    };
    let recorded = desk.async_client("ops").attempt(&attempt_id).await.unwrap();
    assert_eq!((recorded.status, status), (AttemptStatus::Unknown, AttemptStatus::Unknown));
    assert_eq!(recorded.evidence.len(), 1, "kept as evidence: {recorded:?}");
    assert_eq!(recorded.evidence[0].epoch, Some(1));
    // The stale segment sends nothing more.
    let more = node
        .attempt::<_, _, Value>(&desk.async_payments(), "pay", &invoice("inv-5", 500), "inv-5")
        .await;
    assert!(more.unwrap_err().is_fenced());
    assert_eq!((desk.paid("inv-4"), desk.paid("inv-5")), (1, 0));
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn f1_x1_item10_a_renewal_task_keeps_the_run_through_a_node_longer_than_the_lease() {
    let desk = Desk::start_with_lease(Some(2));
    let payments = desk.async_payments();
    let segment =
        desk.async_client("agent").start_run(&desk.mission, "rs-1", &json!({})).await.unwrap();
    let renewal = segment.keep_renewing();
    let node = segment.start_node("pay").await.unwrap();
    tokio::time::sleep(Duration::from_millis(2_500)).await;
    let taken = desk.async_client("ops").coordinator().recover(segment.run_id(), "rs-2").await;
    assert!(taken.unwrap_err().is(&Code::LeaseHeld));
    let paid: Payment =
        node.attempt(&payments, "pay", &invoice("inv-6", 600), "inv-6").await.unwrap();
    drop(renewal);
    assert_eq!((paid.amount, desk.paid("inv-6")), (600, 1));
}
