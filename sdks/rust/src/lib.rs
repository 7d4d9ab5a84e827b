//! Charter for Rust: a process in Rust runs a run's attempts as a segment of
//! it over Charter's HTTP API (the remote attempt protocol, docs/protocol.md),
//! and recovers, reconciles, confirms, resolves and resumes runs with the
//! seed's names:
//!
//! ```no_run
//! # fn main() -> Result<(), charter::Error> {
//! let client = charter::Client::new("http://127.0.0.1:8765", "ops:SECRET");
//! let coordinator = client.coordinator();
//! let recovery = coordinator.recover("run_1", "seg-2")?;
//! for attempt_id in &recovery.unresolved {
//!     println!("{attempt_id} waits for evidence or a person");
//! }
//! # Ok(())
//! # }
//! ```
//!
//! The server holds every rule (the same code the Python engine runs); this
//! crate holds a claim, a monotonic clock and the caller's adapters.

mod adapter;
mod client;
mod desk;
mod error;
mod records;
pub mod sandbox;
mod segment;

pub use adapter::{
    Adapter, Amounts, Dispatch, EffectClass, Estimate, Evidence, Operation, Outcome,
    RecordedAttempt, SendError,
};
pub use client::{Client, Coordinator, Resolution};
pub use error::{Code, Error, Result};
pub use records::{
    Attempt, AuditVerification, Balance, ChainVerification, Claim, Incident, Ledger, LimitRaised,
    NextAction, NodeCompletion, Recovery, Run, Settlement, Snapshot,
};
pub use segment::{Context, Ending, Segment};
