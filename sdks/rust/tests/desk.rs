//! The desk's decisions from Rust, typed (N5, L5, L7, S1), against a real
//! `charter serve`: a limit raised, a run stopped, incidents read, the audit
//! chains verified. A principal without the right gets its typed error and
//! nothing changes; what the server recorded is read back each time.

mod support;

use charter::{Code, Error, RunStatus};
use serde_json::json;
use support::Desk;

fn refused_as(error: Error, code: &Code) {
    assert!(error.is(code), "{error:?}");
}

#[test]
fn l7_a_raised_limit_is_a_new_contract_version_and_a_stranger_raises_nothing() {
    let desk = Desk::start();
    let ops = desk.client("ops");
    let before = ops.ledger(&desk.tight).unwrap();
    assert!(before.problems.is_empty());
    let usd = before.balance("usd_cents").unwrap().clone();
    let limit = (usd.limit + 500) as u64;

    let refused = desk.client("agent").raise_limit(&desk.tight, "usd_cents", limit).unwrap_err();
    refused_as(refused, &Code::NotAuthorized);
    assert_eq!(ops.ledger(&desk.tight).unwrap(), before, "the refusal changed nothing");

    let raised = ops.raise_limit(&desk.tight, "usd_cents", limit).unwrap();
    assert_eq!(raised.mission_id, desk.tight);
    assert_eq!(raised.balance.limit, limit as i64);
    let b = &raised.balance;
    assert_eq!(b.available + b.held + b.spent, b.limit, "L0");
    let after = ops.ledger(&desk.tight).unwrap();
    assert_eq!(after.balance("usd_cents").unwrap().limit, limit as i64);
}

#[test]
fn n5_a_run_stopped_by_ops_is_stopped_and_a_stranger_stops_nothing() {
    let desk = Desk::start();
    let segment = desk.client("agent").start_run(&desk.mission, "rs-1", &json!({})).unwrap();
    let run_id = segment.run_id().to_string();

    let refused = desk.client("nobody").stop(&run_id, "not mine").unwrap_err();
    refused_as(refused, &Code::NotAuthorized);
    let ops = desk.client("ops");
    assert_eq!(ops.coordinator().state(&run_id).unwrap().status, RunStatus::Active);

    let stopped = ops.stop(&run_id, "the wrong week").unwrap();
    assert_eq!((stopped.id.as_str(), stopped.status), (run_id.as_str(), RunStatus::Stopped));
    assert_eq!(ops.coordinator().state(&run_id).unwrap().status, RunStatus::Stopped);
}

#[test]
fn l5_s1_incidents_read_as_records_and_the_audit_chains_verify() {
    let desk = Desk::start();
    let ops = desk.client("ops");
    assert!(ops.incidents(&desk.mission, true).unwrap().iter().all(|i| i.status == "open"));
    let missing = ops.close_incident("inc_nonesuch", "nothing to close").unwrap_err();
    refused_as(missing, &Code::NotFound);

    let verified = ops.audit(Some(&desk.mission)).unwrap();
    assert!(verified.ok);
    let chain = &verified.chains[0];
    assert_eq!(chain.mission_id, desk.mission);
    assert!(chain.events > 0 && chain.broken_at.is_none());
    assert!(ops.audit(None).unwrap().ok);
}
