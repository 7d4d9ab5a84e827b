//! The desk's decisions and reads, typed: stop a run (N5), raise a limit
//! (L7), read the ledger and the incidents (L0-L2, L5), close an incident,
//! verify the audit chains (S1). Each is one request the engine authorises
//! and audits under the client's principal; a refusal is its typed error.

use serde_json::Value;

use crate::calls::{self, Page};
use crate::client::Client;
use crate::error::Result;
use crate::records::{AuditVerification, Incident, Ledger, LimitRaised, Run};

impl Client {
    /// Stop a run (needs `stop`): nothing new is admitted; it ends `stopped`
    /// once what was sent has settled (until then `stopping`).
    pub fn stop(&self, run_id: &str, reason: &str) -> Result<Run> {
        self.send(calls::stop(run_id, reason))
    }

    /// Raise a mission's limit in one unit to `limit` (whole smallest steps;
    /// needs `raise_limit`): a new contract version. Runs paused for the
    /// allowance go on by themselves once it covers them (K2).
    pub fn raise_limit(&self, mission_id: &str, unit: &str, limit: u64) -> Result<LimitRaised> {
        self.send(calls::raise_limit(mission_id, unit, limit))
    }

    /// A mission's balances per unit, and the ledger check.
    pub fn ledger(&self, mission_id: &str) -> Result<Ledger> {
        self.send(calls::ledger(mission_id))
    }

    /// A mission's incidents by opening time (the first page); `open_only`
    /// for the open ones.
    pub fn incidents(&self, mission_id: &str, open_only: bool) -> Result<Vec<Incident>> {
        let page: Page<Incident> = self.send(calls::incidents(mission_id, open_only))?;
        Ok(page.items)
    }

    /// Close an incident with a note saying what was done (needs `resolve`).
    pub fn close_incident(&self, incident_id: &str, note: &str) -> Result<()> {
        let _: Value = self.send(calls::close_incident(incident_id, note))?;
        Ok(())
    }

    /// Verify the audit hash chains: one mission's, or every chain the store keeps.
    pub fn audit(&self, mission_id: Option<&str>) -> Result<AuditVerification> {
        self.send(calls::audit(mission_id))
    }
}
