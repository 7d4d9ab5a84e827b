//! The crash story with real processes: `examples/pay_week.rs` pays a week's
//! invoices and is SIGKILLed while the sandbox holds Wednesday's payment
//! applied and unanswered; a fresh process recovers the run, reconciles the
//! payment by lookup, confirms it, claims the run, starts the node again (the
//! same execution), replays or pays each invoice, completes the node and
//! finishes the run. Each invoice is paid exactly once, by the sandbox's own
//! records, the ledger agrees, and the run ends completed. The same story is
//! told by `examples/pay_week_async.rs` (the `async` feature), and by both
//! examples built outside this repository against the crate `cargo package`
//! makes (tests/outside.rs).

mod support;

use std::path::PathBuf;
use std::process::Command;

use support::story::crash_story;

/// An example's binary, which `cargo test` builds beside the tests.
fn example(name: &str) -> PathBuf {
    let deps = std::env::current_exe().unwrap();
    let dir = deps.parent().unwrap().parent().unwrap().join("examples");
    let found = dir.join(format!("{name}{}", std::env::consts::EXE_SUFFIX));
    if !found.exists() {
        // `cargo test` builds examples; `cargo test --test crash` does not.
        let built = Command::new(env!("CARGO"))
            .args(["build", "--offline", "--all-features", "--example", name])
            .current_dir(env!("CARGO_MANIFEST_DIR"))
            .status()
            .expect("cargo");
        assert!(built.success() && found.exists(), "{} not built", found.display());
    }
    found
}

#[test]
fn x1_r1_item18_a_worker_killed_mid_payment_is_recovered_in_a_fresh_process_paid_once_and_the_run_completed(
) {
    crash_story(&example("pay_week"));
}

#[cfg(feature = "async")]
#[test]
fn x1_r1_item10_the_crash_story_on_the_async_client_pays_once_and_completes_the_run() {
    crash_story(&example("pay_week_async"));
}
