//! Pay a week's invoices from Rust, and recover from a crash in the middle of
//! a payment without paying anything twice.
//!
//! ```sh
//! charter sandbox &                      # the payments API, on loopback
//! charter serve --config charter.toml &  # the store's HTTP API
//! export CHARTER_URL=http://127.0.0.1:8765 CHARTER_SANDBOX=http://127.0.0.1:PORT
//! export CHARTER_CREDENTIAL=agent:SECRET CHARTER_OPS_CREDENTIAL=ops:SECRET
//! cargo run --example pay_week -- work MISSION          # prints the run's id first
//! # ... kill -9 it in the middle of a payment, then, in a fresh process:
//! cargo run --example pay_week -- recover RUN rs-2
//! ```
//!
//! `work` starts a run, starts its node (the server's journal answers the
//! execution), pays each invoice as an attempt of it, completes the node and
//! finishes the run. The process may die at any point. `recover` is what a
//! fresh process does then: an operator recovers the run as a new segment
//! (once the dead one's lease has lapsed), looks each unresolved payment up at
//! the sandbox with this process's adapter and confirms what the lookup found;
//! then the agent claims the run as that segment and starts the node again: it
//! is given the execution the dead process was running, so paid invoices
//! replay from their records and the rest are paid; it completes the node and
//! finishes the run, which ends completed. Each step is printed as one JSON line.
//! `examples/pay_week_async.rs` is the same story on the async client.

use std::time::{Duration, Instant};

use charter::sandbox::Payments;
use charter::{Client, Code, Ending, Error, Segment, Verdict};
use serde::{Deserialize, Serialize};
use serde_json::json;

const WEEK: [(&str, u64); 5] = [
    ("inv-mon", 1_250),
    ("inv-tue", 4_000),
    ("inv-wed", 72_00),
    ("inv-thu", 310),
    ("inv-fri", 999),
];

/// What the sandbox is asked to pay.
#[derive(Serialize)]
struct Invoice<'a> {
    amount: u64,
    currency: &'a str,
    payee: &'a str,
    reference: &'a str,
}

/// What it answers: the payment, as recorded (replayed after a crash).
#[derive(Serialize, Deserialize)]
struct Payment {
    id: String,
    amount: u64,
    reference: String,
}

fn env(name: &str) -> String {
    std::env::var(name).unwrap_or_else(|_| panic!("set {name}"))
}

fn say(line: serde_json::Value) {
    println!("{line}");
}

/// The node, as its journal on the server says to run it now: the execution
/// `start_node` answers (after a crash, the one the dead process was running,
/// so its settled payments replay), each invoice one attempt keyed by its
/// reference (A6), and the node's result recorded (N1).
fn pay_week(segment: &Segment, payments: &Payments) -> Result<(), Error> {
    let node = segment.start_node("pay_week")?;
    say(json!({"node": node.node_id(), "execution": node.execution()}));
    let mut paid = Vec::new();
    for (reference, amount) in WEEK {
        let invoice = Invoice { amount, currency: "usd", payee: "acme", reference };
        say(json!({"paying": reference}));
        let payment: Payment = node.attempt(payments, "pay", &invoice, reference)?;
        say(json!({"paid": reference, "payment": payment.id}));
        paid.push(payment);
    }
    let completed = node.complete(&paid)?;
    say(json!({"completed": node.node_id(), "execution": completed.execution,
               "result_hash": completed.result_hash}));
    Ok(())
}

/// The plan is done: the run ends completed (refused while any attempt is unresolved).
fn finish(segment: &Segment) -> Result<(), Error> {
    let run = segment.finish(Ending::Completed, None)?;
    say(json!({"finished": run.id, "status": run.status}));
    Ok(())
}

fn work(mission: &str) -> Result<(), Error> {
    let agent = Client::new(&env("CHARTER_URL"), &env("CHARTER_CREDENTIAL"))?;
    let payments = Payments::new(&env("CHARTER_SANDBOX"), Duration::from_secs(60));
    let segment = agent.start_run(mission, "rs-1", &json!({"week": "2026-W49"}))?;
    say(json!({"run_id": segment.run_id(), "segment": "rs-1", "epoch": segment.epoch()}));
    let _renewal = segment.keep_renewing(); // the lease, kept while the node runs
    pay_week(&segment, &payments)?;
    finish(&segment)
}

/// Recover as `segment`, once the dead segment's lease has lapsed (R1).
fn recover_when_free(
    ops: &Client,
    run_id: &str,
    segment: &str,
) -> Result<charter::Recovery, Error> {
    let deadline = Instant::now() + Duration::from_secs(60);
    loop {
        match ops.coordinator().recover(run_id, segment) {
            Err(e) if e.is(&Code::LeaseHeld) && Instant::now() < deadline => {
                std::thread::sleep(Duration::from_millis(200))
            }
            answered => return answered,
        }
    }
}

fn recover(run_id: &str, segment: &str) -> Result<(), Error> {
    let url = env("CHARTER_URL");
    let ops = Client::new(&url, &env("CHARTER_OPS_CREDENTIAL"))?;
    let agent = Client::new(&url, &env("CHARTER_CREDENTIAL"))?;
    let payments = Payments::new(&env("CHARTER_SANDBOX"), Duration::from_secs(5));
    let coordinator = ops.coordinator();

    let recovery = recover_when_free(&ops, run_id, segment)?;
    let epoch = recovery.snapshot.epoch;
    say(json!({"recovered": run_id, "epoch": epoch, "unresolved": recovery.unresolved}));
    for attempt_id in &recovery.unresolved {
        let found = coordinator.reconcile(attempt_id, &payments)?;
        say(json!({"reconciled": attempt_id, "verdict": found.verdict}));
        if found.verdict == Some(Verdict::Indeterminate) {
            say(json!({"needs_a_person": attempt_id}));
            return Ok(());
        }
        let settled = coordinator.confirm(attempt_id, None)?;
        say(json!({"confirmed": attempt_id, "status": settled.status, "cost": settled.actual}));
    }
    // Nothing is unresolved now: the segment `recover` installed claims the
    // run (under the `human` policy, refused as needs_intervention until then).
    let resumed = agent.coordinator().resume(run_id, segment)?;
    say(json!({"resumed": run_id, "segment": segment, "epoch": resumed.epoch()}));
    let _renewal = resumed.keep_renewing();
    pay_week(&resumed, &payments)?;
    finish(&resumed)
}

fn main() {
    let args: Vec<String> = std::env::args().skip(1).collect();
    let done = match args.iter().map(String::as_str).collect::<Vec<_>>().as_slice() {
        ["work", mission] => work(mission),
        ["recover", run_id, segment] => recover(run_id, segment),
        _ => {
            eprintln!("usage: pay_week work MISSION | pay_week recover RUN SEGMENT");
            std::process::exit(2)
        }
    };
    if let Err(e) = done {
        say(json!({"error": e.to_string(), "code": e.code().map(|c| c.to_string())}));
        std::process::exit(1)
    }
}
