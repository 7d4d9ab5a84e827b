//! The remote attempt protocol (X1) through this SDK (X2), against a real
//! `charter serve` and the payments sandbox: what the server recorded and what
//! the sandbox applied are checked, not what the SDK believes.

mod support;

use charter::{
    Adapter, AttemptStatus, Code, Context, Ending, Error, Resolution, Resolved, RunStatus,
};
use serde_json::{json, Value};
use support::{invoice, journal, Desk};

/// Pay invoice `reference` as the effect keyed by its reference.
fn pay<A: Adapter + ?Sized>(
    node: &Context<'_>,
    adapter: &A,
    reference: &str,
    amount: u64,
) -> Result<Value, Error> {
    node.attempt(adapter, "pay", &invoice(reference, amount), reference)
}

#[test]
fn x1_an_effect_is_sent_once_and_replayed_from_its_record() {
    let desk = Desk::start();
    let payments = desk.payments();
    let segment = desk.client("agent").start_run(&desk.mission, "rs-1", &json!({})).unwrap();
    assert_eq!(segment.epoch(), 1);
    let node = segment.start_node("pay").unwrap();
    let paid = pay(&node, &payments, "inv-1", 450).unwrap();
    assert_eq!(paid["amount"], 450);
    // The same effect again (a node run twice): its record, not a second send (A4).
    let again = pay(&node, &payments, "inv-1", 450).unwrap();
    assert_eq!(again, paid);
    assert_eq!(desk.paid("inv-1"), 1);

    let attempts = desk.client("ops").coordinator().state(segment.run_id()).unwrap();
    assert!(attempts.unresolved.is_empty());
    let ledger =
        desk.client("ops").request("GET", &format!("/missions/{}/ledger", desk.mission), None);
    let spent = &ledger.unwrap()["balances"][0];
    assert_eq!((spent["unit"].as_str(), spent["spent"].as_u64()), (Some("usd_cents"), Some(450)));
}

#[test]
fn a3_a_lost_answer_blocks_the_node_until_evidence_is_confirmed_then_replays() {
    let desk = Desk::start();
    let payments = desk.payments();
    let ops = desk.client("ops").coordinator();
    let segment = desk.client("agent").start_run(&desk.mission, "rs-1", &json!({})).unwrap();
    payments.fault("drop_after_apply", 0.0, "inv-2").unwrap();
    let node = segment.start_node("pay").unwrap();
    let lost = pay(&node, &payments, "inv-2", 1200).unwrap_err();
    let (attempt_id, status) = match lost {
        Error::Blocked { attempt_id, status } => (attempt_id, status),
        other => panic!("not blocked: {other:?}"),
    };
    assert_eq!(status, AttemptStatus::Unknown);
    assert_eq!(desk.paid("inv-2"), 1, "the sandbox applied it; the answer was lost");

    // Never re-sent on a guess: admitting it again is blocked.
    let again = pay(&node, &payments, "inv-2", 1200).unwrap_err();
    assert!(matches!(again, Error::Blocked { .. }), "{again:?}");
    assert_eq!(ops.state(segment.run_id()).unwrap().unresolved, vec![attempt_id.clone()]);

    // This process's adapter looks it up; the evidence is recorded, a person confirms.
    let found = ops.reconcile(&attempt_id, &payments).unwrap();
    assert_eq!((found.verdict, found.settled), (Some(charter::Verdict::Applied), false));
    let settled = ops.confirm(&attempt_id, None).unwrap();
    assert_eq!(
        (settled.status, settled.actual.clone().unwrap()["usd_cents"]),
        (AttemptStatus::Succeeded, 1200)
    );

    let replayed = pay(&node, &payments, "inv-2", 1200).unwrap();
    assert_eq!(replayed["amount"], 1200);
    assert_eq!(desk.paid("inv-2"), 1);
}

#[test]
fn r8_a_person_resolves_what_no_lookup_can_prove() {
    let desk = Desk::start();
    let payments = desk.payments();
    let ops = desk.client("ops").coordinator();
    let segment = desk.client("agent").start_run(&desk.mission, "rs-1", &json!({})).unwrap();
    payments.fault("error_after_apply", 0.0, "inv-3").unwrap();
    let node = segment.start_node("pay").unwrap();
    let attempt_id = match pay(&node, &payments, "inv-3", 300) {
        Err(Error::Blocked { attempt_id, .. }) => attempt_id,
        other => panic!("a 500 after applying must leave the attempt unknown: {other:?}"),
    };
    let resolution = Resolution::new(
        Resolved::Succeeded,
        "seen in the bank statement",
        [("usd_cents".to_string(), 300)].into(),
    );
    // Bad input changes nothing: an outcome that does not exist is refused.
    let wrong = json!({"outcome": "paid", "evidence": "x", "cost": {}});
    let path = format!("/attempts/{attempt_id}/resolve");
    let refused = desk.client("ops").request("POST", &path, Some(&wrong)).unwrap_err();
    assert!(refused.is(&Code::UsageError), "{refused:?}");
    assert_eq!(desk.client("ops").attempt(&attempt_id).unwrap().status, AttemptStatus::Unknown);

    let settled = ops.resolve(&attempt_id, &resolution).unwrap();
    assert_eq!(settled.status, AttemptStatus::Succeeded);
    let twice = ops.resolve(&attempt_id, &resolution).unwrap_err();
    assert!(twice.is(&Code::AttemptSettled) && twice.is(&Code::InvalidState), "{twice:?}");
    assert_eq!(desk.paid("inv-3"), 1);
}

#[test]
fn f1_a_segment_taken_over_is_fenced_and_sends_nothing() {
    let desk = Desk::start();
    let payments = desk.payments();
    let segment = desk.client("agent").start_run(&desk.mission, "rs-1", &json!({})).unwrap();
    let node = segment.start_node("pay").unwrap();
    let recovery = desk.client("ops").coordinator().recover_with(segment.run_id(), "rs-2", true);
    let recovery = recovery.unwrap();
    assert_eq!(recovery.snapshot.epoch, 2);
    assert!(recovery.unresolved.is_empty());

    let refused = pay(&node, &payments, "inv-4", 100);
    let refused = refused.unwrap_err();
    assert!(refused.is_fenced(), "{refused:?}");
    assert_eq!(desk.paid("inv-4"), 0);
    assert!(segment.renew().unwrap_err().is_fenced());
    assert!(segment.is_fenced(), "remembered: nothing more is sent");
}

#[test]
fn p1_errors_carry_the_servers_codes() {
    let desk = Desk::start();
    let payments = desk.payments();
    let stranger = charter::Client::new(&desk.url, "agent:not-the-secret").unwrap();
    assert_eq!(stranger.me().unwrap_err().code(), Some(&Code::Unauthenticated));
    let ops = desk.client("ops").coordinator();
    assert_eq!(ops.state("run_nope").unwrap_err().code(), Some(&Code::NotFound));
    let nobody = desk.client("nobody").start_run(&desk.mission, "rs-1", &json!({}));
    assert_eq!(nobody.unwrap_err().code(), Some(&Code::NotAuthorized));

    // L3: an estimate the allowance cannot cover is refused; nothing is sent.
    let segment = desk.client("agent").start_run(&desk.tight, "rs-1", &json!({})).unwrap();
    let refused = pay(&segment.start_node("pay").unwrap(), &payments, "big", 5_000);
    let refused = refused.unwrap_err();
    assert_eq!(refused.code(), Some(&Code::AllowanceExceeded));
    assert!(refused.is(&Code::AdmissionRefused));
    assert_eq!(desk.paid("big"), 0);

    // An operation the adapter does not offer is refused before anything is asked.
    let unknown = segment
        .start_node("pay")
        .unwrap()
        .attempt::<_, _, Value>(&payments, "refund", &json!({}), "r")
        .unwrap_err();
    assert!(matches!(unknown, Error::Usage(_)), "{unknown:?}");
}

#[test]
fn p1_item6_every_code_the_engine_defines_is_known() {
    // Each `code = "..."` of the engine's errors.py, and the HTTP gate's two.
    let errors = include_str!("../../../src/charter/errors.py");
    let mut defined: Vec<&str> = errors
        .lines()
        .filter_map(|l| l.trim().strip_prefix("code = \"")?.strip_suffix('"'))
        .collect();
    defined.extend(["malformed_body", "body_too_large"]);
    assert!(defined.len() > 40, "{defined:?}");
    for name in defined {
        let code = Code::parse(name);
        assert!(!matches!(code, Code::Other(_)), "{name} is not known");
        assert_eq!(code.as_str(), name);
    }
}

/// The sandbox's adapter, with a send that misbehaves as told.
struct Misbehaving {
    inner: charter::sandbox::Payments,
    wait_out_the_deadline: bool,
    panic: bool,
}

impl charter::Adapter for Misbehaving {
    fn name(&self) -> &str {
        self.inner.name()
    }

    fn operations(&self) -> Vec<(String, charter::Operation)> {
        self.inner.operations()
    }

    fn estimate(&self, operation: &str, request: &Value) -> charter::Estimate {
        self.inner.estimate(operation, request)
    }

    fn dispatch(&self, send: &charter::Dispatch) -> Result<charter::Outcome, charter::SendError> {
        if self.wait_out_the_deadline {
            std::thread::sleep(send.remaining()); // held up before the bytes go out
        }
        if self.panic {
            self.inner.dispatch(send)?;
            panic!("the adapter broke after sending");
        }
        self.inner.dispatch(send)
    }

    fn lookup(&self, attempt: &charter::RecordedAttempt) -> charter::Evidence {
        self.inner.lookup(attempt)
    }
}

#[test]
fn f3_a_send_held_up_past_its_deadline_is_reported_not_applied_and_never_sent() {
    let desk = Desk::start_with_lease(Some(2));
    let late = Misbehaving { inner: desk.payments(), wait_out_the_deadline: true, panic: false };
    let segment = desk.client("agent").start_run(&desk.mission, "rs-1", &json!({})).unwrap();
    let started = std::time::Instant::now();
    let refused = pay(&segment.start_node("pay").unwrap(), &late, "inv-5", 500);
    let (attempt_id, status) = match refused {
        Err(Error::AttemptFailed { attempt_id, status, result }) => {
            assert_eq!(result["reason"], "send deadline passed");
            (attempt_id, status)
        }
        other => panic!("expected the deadline to refuse the send: {other:?}"),
    };
    // Counted from before the admission: never later than the store's deadline.
    assert!(started.elapsed() <= std::time::Duration::from_millis(2_500));
    assert_eq!(status, AttemptStatus::Failed);
    assert_eq!(desk.paid("inv-5"), 0);
    assert_eq!(desk.client("ops").attempt(&attempt_id).unwrap().status, AttemptStatus::Failed);
    // At no cost, its hold released (A3).
    let ledger =
        desk.client("ops").request("GET", &format!("/missions/{}/ledger", desk.mission), None);
    let balance = &ledger.unwrap()["balances"][0];
    assert_eq!(
        (balance["spent"].as_u64(), balance["held"].as_u64()),
        (Some(0), Some(0)),
        "{balance}"
    );
}

#[test]
fn a3_an_adapter_that_panics_after_sending_leaves_the_attempt_unknown() {
    let desk = Desk::start();
    let broken = Misbehaving { inner: desk.payments(), wait_out_the_deadline: false, panic: true };
    let segment = desk.client("agent").start_run(&desk.mission, "rs-1", &json!({})).unwrap();
    let node = segment.start_node("pay").unwrap();
    let panicked = std::panic::catch_unwind(std::panic::AssertUnwindSafe(|| {
        pay(&node, &broken, "inv-6", 600)
    }));
    assert!(panicked.is_err(), "the panic goes on once reported");
    assert_eq!(desk.paid("inv-6"), 1);
    let state = desk.client("ops").coordinator().state(segment.run_id()).unwrap();
    assert_eq!(state.attempts.len(), 1, "{state:?}");
    assert_eq!(state.attempts[0].status, AttemptStatus::Unknown, "never guessed (A3)");
    // And never sent again: the same effect is blocked.
    let again = pay(&node, &desk.payments(), "inv-6", 600);
    assert!(matches!(again, Err(Error::Blocked { .. })), "{again:?}");
    assert_eq!(desk.paid("inv-6"), 1);
}

#[test]
fn w2_an_effect_waits_for_its_approval_then_the_same_attempt_is_sent_once() {
    let desk = Desk::start();
    let payments = desk.payments();
    let segment = desk.client("agent").start_run(&desk.gated, "rs-1", &json!({})).unwrap();
    let node = segment.start_node("pay").unwrap();
    let waiting = pay(&node, &payments, "inv-7", 700).unwrap_err();
    assert!(waiting.is(&Code::ApprovalRequired) && waiting.is(&Code::InvalidState), "{waiting:?}");
    let approval = waiting.detail("approval_id").and_then(Value::as_str).unwrap().to_string();
    let attempt = waiting.detail("attempt_id").and_then(Value::as_str).unwrap().to_string();
    assert_eq!(desk.paid("inv-7"), 0);
    assert_eq!(desk.client("ops").attempt(&attempt).unwrap().status, AttemptStatus::Prepared);

    // The agent cannot approve its own payment; ops can.
    let path = format!("/approvals/{approval}/approve");
    let refused = desk.client("agent").request("POST", &path, Some(&json!({}))).unwrap_err();
    assert_eq!(refused.code(), Some(&Code::NotAuthorized));
    desk.client("ops").request("POST", &path, Some(&json!({}))).unwrap();

    let paid = pay(&node, &payments, "inv-7", 700).unwrap();
    assert_eq!(paid["amount"], 700);
    let sent = desk.client("ops").attempt(&attempt).unwrap();
    assert_eq!((sent.status, sent.id.as_str()), (AttemptStatus::Succeeded, attempt.as_str()));
    assert_eq!(desk.paid("inv-7"), 1);
}

/// The sandbox's adapter, whose run is taken over by an operator while it sends.
struct TakenOverMidSend {
    inner: charter::sandbox::Payments,
    ops: charter::Client,
}

impl charter::Adapter for TakenOverMidSend {
    fn name(&self) -> &str {
        self.inner.name()
    }

    fn operations(&self) -> Vec<(String, charter::Operation)> {
        self.inner.operations()
    }

    fn estimate(&self, operation: &str, request: &Value) -> charter::Estimate {
        self.inner.estimate(operation, request)
    }

    fn dispatch(&self, send: &charter::Dispatch) -> Result<charter::Outcome, charter::SendError> {
        let sent = self.inner.dispatch(send);
        self.ops.coordinator().recover_with(&send.run_id, "rs-2", true).unwrap();
        sent
    }

    fn lookup(&self, attempt: &charter::RecordedAttempt) -> charter::Evidence {
        self.inner.lookup(attempt)
    }
}

#[test]
fn f2_a_report_after_a_takeover_is_kept_as_late_evidence_and_the_stale_segment_stops() {
    let desk = Desk::start();
    let adapter = TakenOverMidSend { inner: desk.payments(), ops: desk.client("ops") };
    let segment = desk.client("agent").start_run(&desk.mission, "rs-1", &json!({})).unwrap();
    let node = segment.start_node("pay").unwrap();
    let late = pay(&node, &adapter, "inv-8", 800).unwrap_err();
    assert!(late.is_fenced(), "{late:?}");
    let (attempt_id, status) = match late {
        Error::LateReport { attempt_id, status } => (attempt_id, status),
        other => panic!("{other:?}"),
    };
    let recorded = desk.client("ops").attempt(&attempt_id).unwrap();
    assert_eq!(recorded.status, status);
    // Kept as evidence with the epoch that sent it, never a second settlement.
    assert_eq!(recorded.evidence.len(), 1, "{recorded:?}");
    assert_eq!(recorded.evidence[0].epoch, Some(1));
    assert!(recorded.evidence[0].source.as_deref().unwrap().contains("late"), "{recorded:?}");
    // Nothing more is sent by the stale segment.
    let more = pay(&node, &desk.payments(), "inv-9", 900).unwrap_err();
    assert!(more.is_fenced(), "{more:?}");
    assert_eq!((desk.paid("inv-8"), desk.paid("inv-9")), (1, 0));
}

#[test]
fn x1_n1_item18_a_node_started_and_completed_is_journaled_and_finish_ends_the_run_completed() {
    let desk = Desk::start();
    let payments = desk.payments();
    let segment = desk.client("agent").start_run(&desk.mission, "rs-1", &json!({})).unwrap();
    let node = segment.start_node("pay_week").unwrap();
    assert_eq!(node.execution(), 1);
    let restarted = segment.start_node("pay_week").unwrap();
    assert_eq!(restarted.execution(), 1, "a node left running continues its execution");
    let paid = pay(&node, &payments, "inv-10", 1000).unwrap();
    assert_eq!(journal(&desk, segment.run_id()), vec![json!(["pay_week", 1, "running", null])]);

    let completed = node.complete(&json!({"paid": [paid.clone()]})).unwrap();
    assert_eq!((completed.node_id.as_str(), completed.execution), ("pay_week", 1));
    assert_eq!(completed.run_id, segment.run_id());
    let again = segment.complete_node("pay_week", 1, &json!({"paid": [paid]})).unwrap();
    assert_eq!(again, completed, "the same completion answers the same");
    let other = segment.complete_node("pay_week", 1, &json!({"paid": []})).unwrap_err();
    assert!(other.is(&Code::InvalidState), "another result is refused: {other:?}");
    assert_eq!(
        journal(&desk, segment.run_id()),
        vec![json!(["pay_week", 1, "completed", completed.result_hash])]
    );

    let run = segment.finish(Ending::Completed, None).unwrap();
    assert_eq!((run.id.as_str(), run.status), (segment.run_id(), RunStatus::Completed));
    let state = desk.client("ops").coordinator().state(segment.run_id()).unwrap();
    assert_eq!(state.status, RunStatus::Completed);
    assert_eq!(desk.paid("inv-10"), 1);
}

#[test]
fn x1_item18_finish_is_refused_while_an_attempt_is_unresolved_and_a_failed_end_keeps_its_reason() {
    let desk = Desk::start();
    let payments = desk.payments();
    let ops = desk.client("ops").coordinator();
    let segment = desk.client("agent").start_run(&desk.mission, "rs-1", &json!({})).unwrap();
    let node = segment.start_node("pay").unwrap();
    payments.fault("drop_after_apply", 0.0, "inv-11").unwrap();
    let lost = match pay(&node, &payments, "inv-11", 1100) {
        Err(Error::Blocked { attempt_id, .. }) => attempt_id,
        other => panic!("not blocked: {other:?}"),
    };
    let refused = segment.finish(Ending::Completed, None).unwrap_err();
    assert!(refused.is(&Code::InvalidState), "{refused:?}");
    assert_eq!(refused.detail("unresolved"), Some(&json!(1)), "{refused:?}");
    assert_eq!(ops.state(segment.run_id()).unwrap().status, RunStatus::Active, "nothing changed");
    // An execution the node's journal is not running cannot be completed.
    let wrong = segment.complete_node("pay", node.execution() + 1, &Value::Null).unwrap_err();
    assert!(wrong.is(&Code::InvalidState), "{wrong:?}");

    // Once settled, the run can end; ended failed, it keeps why.
    ops.reconcile(&lost, &payments).unwrap();
    ops.confirm(&lost, None).unwrap();
    let run = segment.finish(Ending::Failed, Some("the payee closed its account")).unwrap();
    assert_eq!(
        (run.status, run.status_reason.as_deref()),
        (RunStatus::Failed, Some("the payee closed its account"))
    );
    let state = ops.state(segment.run_id()).unwrap();
    assert_eq!(
        (state.status, state.status_reason.as_deref()),
        (RunStatus::Failed, Some("the payee closed its account"))
    );
}

#[test]
fn x1_item18_after_a_takeover_the_node_started_again_continues_its_execution_and_the_run_completes()
{
    let desk = Desk::start();
    let payments = desk.payments();
    let ops = desk.client("ops").coordinator();
    let agent = desk.client("agent");
    let crashed = agent.start_run(&desk.mission, "rs-1", &json!({})).unwrap();
    let node = crashed.start_node("pay_week").unwrap();
    pay(&node, &payments, "inv-12", 1200).unwrap();
    payments.fault("drop_after_apply", 0.0, "inv-13").unwrap();
    let lost = match pay(&node, &payments, "inv-13", 1300) {
        Err(Error::Blocked { attempt_id, .. }) => attempt_id,
        other => panic!("not blocked: {other:?}"),
    };
    // This process "dies" here. An operator takes the run over (forced: its lease is live).
    let recovery = ops.recover_with(crashed.run_id(), "rs-2", true).unwrap();
    assert_eq!((recovery.snapshot.epoch, recovery.unresolved.clone()), (2, vec![lost.clone()]));
    // Continuing past an uncertain payment is refused until it is settled (R6).
    let early = agent.coordinator().resume(crashed.run_id(), "rs-2").unwrap_err();
    assert!(early.is(&Code::NeedsIntervention), "{early:?}");
    ops.reconcile(&lost, &payments).unwrap();
    assert_eq!(ops.confirm(&lost, None).unwrap().status, AttemptStatus::Succeeded);

    let resumed = agent.coordinator().resume(crashed.run_id(), "rs-2").unwrap();
    assert_eq!(resumed.epoch(), 2);
    let again = resumed.start_node("pay_week").unwrap();
    assert_eq!(again.execution(), node.execution(), "the same execution, not the epoch");
    let mut paid = Vec::new();
    for (reference, amount) in [("inv-12", 1200), ("inv-13", 1300), ("inv-14", 1400)] {
        paid.push(pay(&again, &payments, reference, amount).unwrap());
    }
    assert_eq!((desk.paid("inv-12"), desk.paid("inv-13"), desk.paid("inv-14")), (1, 1, 1));
    let path = format!("/attempts?run={}", crashed.run_id());
    let attempts = desk.client("ops").request("GET", &path, None).unwrap();
    let items = attempts["items"].as_array().unwrap();
    assert_eq!(items.len(), 3, "the first two replayed: no new attempt for them: {attempts}");
    assert!(items.iter().all(|a| a["execution"] == 1 && a["status"] == "succeeded"), "{attempts}");
    let completed = again.complete(&paid).unwrap();
    assert_eq!(completed.execution, 1);
    let run = resumed.finish(Ending::Completed, None).unwrap();
    assert_eq!(run.status, RunStatus::Completed);
    assert_eq!(
        journal(&desk, crashed.run_id()),
        vec![json!(["pay_week", 1, "completed", completed.result_hash])]
    );
    assert!(crashed.clone().renew().unwrap_err().is_fenced());
}
