//! The crash story, told by a program that speaks `work MISSION` and
//! `recover RUN SEGMENT` as `examples/pay_week.rs` does: the program is
//! SIGKILLed while the sandbox holds Wednesday's payment applied and
//! unanswered, a fresh process of it recovers and finishes the week, and
//! everything is checked on the record.

use std::io::{BufRead, BufReader};
use std::path::Path;
use std::process::{Child, Command, Stdio};
use std::time::{Duration, Instant};

use charter::{AttemptStatus, RunStatus};
use serde_json::{json, Value};

use super::{journal, Desk};

const WEEK: [(&str, u64); 5] = [
    ("inv-mon", 1_250),
    ("inv-tue", 4_000),
    ("inv-wed", 72_00),
    ("inv-thu", 310),
    ("inv-fri", 999),
];

fn spawn(desk: &Desk, program: &Path, args: &[&str]) -> Child {
    Command::new(program)
        .args(args)
        .env("CHARTER_URL", &desk.url)
        .env("CHARTER_SANDBOX", &desk.sandbox_url)
        .env("CHARTER_CREDENTIAL", desk.credential("agent"))
        .env("CHARTER_OPS_CREDENTIAL", desk.credential("ops"))
        .stdout(Stdio::piped())
        .spawn()
        .expect("the pay_week example")
}

fn lines(child: &mut Child) -> impl Iterator<Item = Value> {
    let out = BufReader::new(child.stdout.take().unwrap());
    out.lines().map(|l| serde_json::from_str(&l.unwrap()).expect("a JSON line"))
}

/// `program work MISSION` killed mid-payment; `program recover RUN rs-2` in a
/// fresh process finishes the week; everything checked on the record.
pub fn crash_story(program: &Path) {
    let desk = Desk::start_with_lease(Some(2));
    let payments = desk.payments();
    // Wednesday's payment is applied, then its answer held back for 60 s.
    payments.fault("slow", 60.0, "inv-wed").unwrap();

    let mut worker = spawn(&desk, program, &["work", &desk.mission]);
    let mut said = lines(&mut worker);
    let run_id = said.next().unwrap()["run_id"].as_str().unwrap().to_string();
    let started = said.next().unwrap();
    assert_eq!(started, serde_json::json!({"node": "pay_week", "execution": 1}));
    let deadline = Instant::now() + Duration::from_secs(30);
    while desk.paid("inv-wed") == 0 {
        assert!(Instant::now() < deadline, "the sandbox never applied Wednesday's payment");
        std::thread::sleep(Duration::from_millis(20));
    }
    worker.kill().unwrap(); // SIGKILL: no report, no release, no goodbye
    worker.wait().unwrap();
    assert_eq!(desk.paid("inv-thu"), 0);

    let mut fresh = spawn(&desk, program, &["recover", &run_id, "rs-2"]);
    let story: Vec<Value> = lines(&mut fresh).collect();
    assert!(fresh.wait().unwrap().success(), "{story:#?}");

    let recovered = &story[0];
    assert_eq!(recovered["epoch"], 2);
    let unresolved = recovered["unresolved"].as_array().unwrap();
    assert_eq!(unresolved.len(), 1, "{story:#?}");
    let wed = unresolved[0].as_str().unwrap();
    assert_eq!(story[1]["verdict"], "applied", "{story:#?}");
    assert_eq!(story[2]["status"], "succeeded");
    assert_eq!(story[3]["segment"], "rs-2", "{story:#?}");
    // The node started again continues the execution the dead worker ran, not the epoch.
    assert_eq!(story[4], started, "{story:#?}");
    let paying: Vec<&Value> = story[5..story.len() - 2].iter().collect();
    assert_eq!(paying.len(), 2 * WEEK.len(), "{story:#?}");
    let completed = &story[story.len() - 2];
    assert_eq!((&completed["completed"], &completed["execution"]), (&json!("pay_week"), &json!(1)));
    let finished = story.last().unwrap();
    assert_eq!(finished, &json!({"finished": run_id, "status": "completed"}), "{story:#?}");

    // The sandbox's own records: each invoice applied once.
    for (reference, _) in WEEK {
        assert_eq!(desk.paid(reference), 1, "{reference}: {story:#?}");
    }
    // The store's: Wednesday's attempt settled by the confirmation, the ledger
    // spent what the sandbox took, and it checks.
    let ops = desk.client("ops");
    assert_eq!(ops.attempt(wed).unwrap().status, AttemptStatus::Succeeded);
    let state = ops.coordinator().state(&run_id).unwrap();
    assert!(state.unresolved.is_empty());
    assert_eq!(state.status, RunStatus::Completed, "the run ended completed on the record");
    // The node's journal: one execution, completed with the result the node returned.
    assert_eq!(
        journal(&desk, &run_id),
        vec![json!(["pay_week", 1, "completed", completed["result_hash"]])]
    );
    let attempts = ops.request("GET", &format!("/attempts?run={run_id}"), None).unwrap();
    let items = attempts["items"].as_array().unwrap();
    assert_eq!(items.len(), WEEK.len(), "one attempt per invoice: {attempts}");
    assert!(items.iter().all(|a| a["execution"] == 1 && a["status"] == "succeeded"), "{attempts}");
    let ledger = ops.request("GET", &format!("/missions/{}/ledger", desk.mission), None).unwrap();
    let total: u64 = WEEK.iter().map(|(_, a)| a).sum();
    assert_eq!(ledger["balances"][0]["spent"].as_u64(), Some(total), "{ledger}");
    assert_eq!(ledger["balances"][0]["held"].as_u64(), Some(0), "{ledger}");
    assert_eq!(ledger["problems"], json!([]));
}
