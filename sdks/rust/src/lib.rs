//! Charter for Rust: a process in Rust runs a run's attempts as a segment of
//! it over Charter's HTTP API (the remote attempt protocol, docs/protocol.md),
//! and recovers, reconciles, confirms, resolves and resumes runs with the
//! seed's names.
//!
//! ```no_run
//! use charter::sandbox::Payments;
//! use charter::{Client, Ending};
//! use serde::{Deserialize, Serialize};
//! use std::time::Duration;
//!
//! #[derive(Serialize)]
//! struct Invoice<'a> { amount: u64, currency: &'a str, payee: &'a str, reference: &'a str }
//! #[derive(Deserialize)]
//! struct Payment { id: String }
//!
//! # fn main() -> Result<(), charter::Error> {
//! let agent = Client::builder("http://127.0.0.1:8765", "agent:SECRET")
//!     .timeout(Duration::from_secs(10))
//!     .build()?;
//! let payments = Payments::new("http://127.0.0.1:8766", Duration::from_secs(10));
//! let segment = agent.start_run("mis_1", "rs-1", &serde_json::json!({"week": "W49"}))?;
//! let _renewal = segment.keep_renewing();                  // the lease, kept meanwhile
//! let node = segment.start_node("pay")?;
//! let invoice = Invoice { amount: 1_250, currency: "usd", payee: "acme", reference: "inv-mon" };
//! let paid: Payment = node.attempt(&payments, "pay", &invoice, "inv-mon")?;
//! node.complete(&[&paid.id])?;
//! segment.finish(Ending::Completed, None)?;
//! # Ok(())
//! # }
//! ```
//!
//! The server holds every rule (the same code the Python engine runs); this
//! crate holds a claim, a monotonic clock and the caller's adapters. With the
//! `async` feature, [`AsyncClient`] does the same on tokio, with
//! [`AsyncAdapter`]s.

mod adapter;
#[cfg(feature = "async")]
mod asynchronous;
mod calls;
mod client;
mod desk;
mod error;
mod protocol;
mod records;
mod retry;
pub mod sandbox;
mod segment;

pub use adapter::{
    Adapter, Amounts, Dispatch, EffectClass, Estimate, Evidence, Operation, Outcome,
    RecordedAttempt, SendError,
};
#[cfg(feature = "async")]
pub use asynchronous::{
    AsyncAdapter, AsyncClient, AsyncContext, AsyncCoordinator, AsyncRenewal, AsyncSegment,
    BoxFuture,
};
pub use calls::{Resolution, Resolved};
pub use client::{Client, ClientBuilder, Coordinator};
pub use error::{Cause, Code, Error, Result};
pub use records::{
    Attempt, AttemptStatus, AuditVerification, Balance, ChainVerification, Claim, EvidenceRecord,
    Incident, Ledger, LimitRaised, NextAction, NodeCompletion, NodeRecord, NodeStatus, Recovery,
    Run, RunStatus, Settlement, Snapshot, Verdict,
};
pub use retry::Retry;
pub use segment::{Context, Ending, Renewal, Segment};

#[cfg(test)]
mod tests {
    #[test]
    fn x1_item8_clients_segments_and_errors_cross_threads() {
        fn is<T: Send + Sync + 'static>() {}
        is::<crate::Client>();
        is::<crate::Segment>();
        is::<crate::Error>();
    }
}
