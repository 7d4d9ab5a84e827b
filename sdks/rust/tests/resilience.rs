//! What a client meets on a real network, against a real `charter serve`: an
//! outcome report whose answer is lost (sent again, settled once), a store
//! that is busy (the request sent again), a send whose deadline passed (the
//! effect admitted again), a server that does not answer (the configured
//! timeout), a node that runs longer than the lease (renewed in the
//! background), and typed requests and results. What the server recorded and
//! what the sandbox applied are checked, not what the SDK believes.

mod support;

use std::error::Error as _;
use std::net::TcpListener;
use std::sync::atomic::{AtomicUsize, Ordering};
use std::time::{Duration, Instant};

use charter::{
    Adapter, AttemptStatus, Code, Dispatch, Error, Estimate, Evidence, Operation, Outcome,
    RecordedAttempt, Retry, SendError,
};
use serde::{Deserialize, Serialize};
use serde_json::{json, Value};
use support::proxy::Proxy;
use support::{invoice, Desk};

/// The run's attempts as the server lists them: `[effect_key, status]`.
fn attempts(desk: &Desk, run_id: &str) -> Vec<Value> {
    let listed = desk.client("ops").request("GET", &format!("/attempts?run={run_id}"), None);
    let listed = listed.unwrap();
    let mut items: Vec<Value> = listed["items"]
        .as_array()
        .unwrap()
        .iter()
        .map(|a| json!([a["effect_key"], a["status"], a["id"]]))
        .collect();
    items.sort_by_key(|a| a[2].as_str().unwrap().to_string());
    items.iter().map(|a| json!([a[0], a[1]])).collect()
}

/// The mission's `usd_cents` balance: `(spent, held)`.
fn spent_and_held(desk: &Desk, mission: &str) -> (i64, i64) {
    let ledger = desk.client("ops").ledger(mission).unwrap();
    assert!(ledger.problems.is_empty(), "{ledger:?}");
    let usd = ledger.balance("usd_cents").unwrap();
    (usd.spent, usd.held)
}

#[test]
fn x1_a4_item8_a_report_whose_answer_is_lost_is_sent_again_and_settled_once() {
    let desk = Desk::start();
    let proxy = Proxy::losing(&desk.url, "/report", 1);
    let agent = charter::Client::builder(&proxy.url, desk.credential("agent")).build().unwrap();
    let segment = agent.start_run(&desk.mission, "rs-1", &json!({})).unwrap();
    let node = segment.start_node("pay").unwrap();
    let paid: Value =
        node.attempt(&desk.payments(), "pay", &invoice("inv-1", 450), "inv-1").unwrap();
    assert_eq!(paid["amount"], 450);

    // The server got the report twice (the first answer was lost) and settled it once.
    assert_eq!(proxy.seen("/report"), 2);
    assert_eq!(desk.paid("inv-1"), 1);
    assert_eq!(attempts(&desk, segment.run_id()), vec![json!(["inv-1", "succeeded"])]);
    let listed =
        desk.client("ops").request("GET", &format!("/attempts?run={}", segment.run_id()), None);
    let recorded = desk.client("ops").attempt(listed.unwrap()["items"][0]["id"].as_str().unwrap());
    let recorded = recorded.unwrap();
    assert!(recorded.evidence.is_empty(), "no second settlement, no late evidence: {recorded:?}");
    assert_eq!(spent_and_held(&desk, &desk.mission), (450, 0));
}

#[test]
fn x1_a4_item8_a_report_lost_every_time_is_settlement_unrecorded_with_its_cause() {
    let desk = Desk::start();
    let proxy = Proxy::losing(&desk.url, "/report", usize::MAX);
    let retry = Retry::default().backoff(Duration::from_millis(20), Duration::from_millis(50));
    let agent = charter::Client::builder(&proxy.url, desk.credential("agent")).retry(retry).build();
    let segment = agent.unwrap().start_run(&desk.mission, "rs-1", &json!({})).unwrap();
    let node = segment.start_node("pay").unwrap();
    let lost =
        node.attempt::<_, _, Value>(&desk.payments(), "pay", &invoice("inv-2", 200), "inv-2");
    let lost = lost.unwrap_err();
    assert!(matches!(lost, Error::SettlementUnrecorded { .. }), "{lost:?}");
    // Its cause, and the transport's own error under it, are reachable.
    let cause = lost.source().expect("the report's failure");
    assert!(matches!(cause.downcast_ref::<Error>(), Some(Error::Transport { sent: true, .. })));
    assert!(cause.source().is_some(), "the transport's own error: {cause:?}");
    assert_eq!(proxy.seen("/report"), 5, "the first try and four retries");
    // Sent once. The server heard every report (only its answers were lost)
    // and settled the first, once: the client was told it cannot know that.
    assert_eq!(desk.paid("inv-2"), 1);
    assert_eq!(attempts(&desk, segment.run_id()), vec![json!(["inv-2", "succeeded"])]);
    assert_eq!(spent_and_held(&desk, &desk.mission), (200, 0));
}

#[test]
fn x1_item8_a_busy_store_is_asked_again_and_the_run_starts_once() {
    let desk = Desk::start_with(None, Some(0.2));
    let runs = |desk: &Desk| {
        let listed =
            desk.client("ops").request("GET", &format!("/runs?mission={}", desk.mission), None);
        listed.unwrap()["items"].as_array().unwrap().len()
    };
    // Without retries, the server's 503 is the answer: nothing was written.
    let mut lock = desk.lock_store(1.5);
    let once = desk.builder("agent").retry(Retry::none()).build().unwrap();
    let refused = once.start_run(&desk.mission, "rs-1", &json!({})).unwrap_err();
    assert!(refused.is(&Code::StoreBusy) && refused.is(&Code::StoreError), "{refused:?}");
    assert!(matches!(refused, Error::Api { status: 503, .. }), "{refused:?}");
    lock.wait().unwrap();
    assert_eq!(runs(&desk), 0);

    // With the default retries, the request waits the lock out.
    let mut lock = desk.lock_store(1.0);
    let started = Instant::now();
    let segment = desk.client("agent").start_run(&desk.mission, "rs-2", &json!({})).unwrap();
    assert!(started.elapsed() >= Duration::from_millis(700), "it did wait for the lock");
    lock.wait().unwrap();
    assert_eq!(runs(&desk), 1);
    assert_eq!(segment.epoch(), 1);
}

/// The sandbox's adapter whose first `late` sends are held up past their deadline.
struct HeldUp {
    inner: charter::sandbox::Payments,
    late: AtomicUsize,
}

impl Adapter for HeldUp {
    fn name(&self) -> &str {
        self.inner.name()
    }

    fn operations(&self) -> Vec<(String, Operation)> {
        self.inner.operations()
    }

    fn estimate(&self, operation: &str, request: &Value) -> Estimate {
        self.inner.estimate(operation, request)
    }

    fn dispatch(&self, send: &Dispatch) -> Result<Outcome, SendError> {
        if self.late.load(Ordering::SeqCst) > 0 {
            self.late.fetch_sub(1, Ordering::SeqCst);
            std::thread::sleep(send.remaining()); // held up before the bytes go out
        }
        self.inner.dispatch(send)
    }

    fn lookup(&self, attempt: &RecordedAttempt) -> Evidence {
        self.inner.lookup(attempt)
    }
}

#[test]
fn f3_x1_item8_a_send_whose_deadline_passed_is_reported_not_applied_and_admitted_again() {
    let desk = Desk::start_with_lease(Some(2));
    let proxy = Proxy::losing(&desk.url, "nothing is lost", 0);
    let agent = charter::Client::builder(&proxy.url, desk.credential("agent")).build().unwrap();
    let adapter = HeldUp { inner: desk.payments(), late: AtomicUsize::new(1) };
    let segment = agent.start_run(&desk.mission, "rs-1", &json!({})).unwrap();
    let node = segment.start_node("pay").unwrap();
    let refused = node.attempt::<_, _, Value>(&adapter, "pay", &invoice("inv-3", 300), "inv-3");
    match refused {
        Err(Error::AttemptFailed { status: AttemptStatus::Failed, result, .. }) => {
            assert_eq!(result["reason"], "send deadline passed")
        }
        other => panic!("expected the deadline to refuse the send: {other:?}"),
    }
    // Admitted twice, reported once: the server decided the second admission
    // (for a client's run it answers the failed attempt's record: never sent).
    let admissions = proxy.seen("/attempts") - proxy.seen("/report");
    assert_eq!((admissions, proxy.seen("/report")), (2, 1));
    assert_eq!(attempts(&desk, segment.run_id()), vec![json!(["inv-3", "failed"])]);
    assert_eq!(desk.paid("inv-3"), 0);
    assert_eq!(spent_and_held(&desk, &desk.mission), (0, 0));
}

#[test]
fn x1_item7_a_server_that_never_answers_times_out_as_the_builder_says() {
    let silent = TcpListener::bind("127.0.0.1:0").unwrap();
    let url = format!("http://{}", silent.local_addr().unwrap());
    let client = charter::Client::builder(&url, "agent:secret")
        .timeout(Duration::from_millis(300))
        .retry(Retry::none())
        .build()
        .unwrap();
    let started = Instant::now();
    let lost = client.me().unwrap_err();
    assert!(started.elapsed() < Duration::from_secs(3), "{:?}", started.elapsed());
    assert!(matches!(lost, Error::Transport { sent: true, .. }), "{lost:?}");
    assert!(lost.source().is_some(), "the transport's own error is kept: {lost:?}");

    // Nobody listening: no connection was made, so any request may be sent again.
    drop(silent);
    let refused = client.start_run("mis_1", "rs-1", &json!({})).unwrap_err();
    assert!(matches!(refused, Error::Transport { sent: false, .. }), "{refused:?}");
}

#[test]
fn f1_x1_item8_a_node_longer_than_the_lease_keeps_the_run_while_renewed_in_the_background() {
    let desk = Desk::start_with_lease(Some(2));
    let payments = desk.payments();
    let agent = desk.client("agent");

    // Without renewing, a node that outlasts the lease loses the run.
    let lapsed = agent.start_run(&desk.mission, "rs-1", &json!({})).unwrap();
    let node = lapsed.start_node("pay").unwrap();
    std::thread::sleep(Duration::from_millis(2_500));
    let fenced = node.attempt::<_, _, Value>(&payments, "pay", &invoice("inv-5", 500), "inv-5");
    assert!(fenced.unwrap_err().is_fenced());
    assert_eq!(desk.paid("inv-5"), 0);

    // Renewed in the background (and by hand, while a node holds the segment).
    let kept = agent.start_run(&desk.mission, "rs-1", &json!({})).unwrap();
    let renewal = kept.keep_renewing();
    let node = kept.start_node("pay").unwrap();
    let _: Value = node.attempt(&payments, "pay", &invoice("inv-6", 600), "inv-6").unwrap();
    std::thread::sleep(Duration::from_millis(2_500));
    assert!(kept.renew().unwrap() > Duration::ZERO);
    let taken = desk.client("ops").coordinator().recover(kept.run_id(), "rs-2").unwrap_err();
    assert!(taken.is(&Code::LeaseHeld), "the lease is live by the store's clock: {taken:?}");
    let _: Value = node.attempt(&payments, "pay", &invoice("inv-7", 700), "inv-7").unwrap();
    renewal.stop();
    assert_eq!((desk.paid("inv-6"), desk.paid("inv-7")), (1, 1));
    assert_eq!(
        attempts(&desk, kept.run_id()),
        vec![json!(["inv-6", "succeeded"]), json!(["inv-7", "succeeded"])]
    );
}

#[derive(Serialize)]
struct Invoice<'a> {
    amount: u64,
    currency: &'a str,
    payee: &'a str,
    reference: &'a str,
}

#[derive(Debug, Deserialize)]
struct Payment {
    id: String,
    amount: u64,
}

#[derive(Debug, Deserialize)]
struct Refund {
    #[allow(dead_code)]
    refunded: bool,
}

#[test]
fn x1_item9_requests_and_results_are_typed_and_a_result_of_another_type_is_never_resent() {
    let desk = Desk::start();
    let payments = desk.payments();
    let segment = desk.client("agent").start_run(&desk.mission, "rs-1", &json!({})).unwrap();
    let node = segment.start_node("pay").unwrap();
    let invoice = Invoice { amount: 800, currency: "usd", payee: "acme", reference: "inv-8" };
    let paid: Payment = node.attempt(&payments, "pay", &invoice, "inv-8").unwrap();
    assert_eq!(paid.amount, 800);
    assert!(paid.id.starts_with("pay_") || !paid.id.is_empty(), "{paid:?}");

    // The same effect read as another type: its record, not a second send.
    let wrong = node.attempt::<_, _, Refund>(&payments, "pay", &invoice, "inv-8").unwrap_err();
    match &wrong {
        Error::UnexpectedResult { result, .. } => assert_eq!(result["amount"], 800),
        other => panic!("{other:?}"),
    }
    assert!(wrong.source().is_some(), "the decoding error is kept");
    assert_eq!(desk.paid("inv-8"), 1);
    assert_eq!(attempts(&desk, segment.run_id()), vec![json!(["inv-8", "succeeded"])]);
}
