//! The desk's decisions and reads, typed: stop a run (N5), raise a limit
//! (L7), read the ledger and the incidents (L0-L2, L5), close an incident,
//! verify the audit chains (S1). Each is one request the engine authorises
//! and audits under the client's principal; a refusal is its typed error.

use serde::Deserialize;
use serde_json::json;

use crate::client::{seg, Client};
use crate::error::Result;
use crate::records::{AuditVerification, Incident, Ledger, LimitRaised, Run};

#[derive(Deserialize)]
struct Page<T> {
    items: Vec<T>,
}

impl Client {
    /// Stop a run (needs `stop`): nothing new is admitted; it ends `stopped`
    /// once what was sent has settled (until then `stopping`).
    pub fn stop(&self, run_id: &str, reason: &str) -> Result<Run> {
        self.post(&format!("/runs/{}/stop", seg(run_id)), json!({"reason": reason}))
    }

    /// Raise a mission's limit in one unit to `limit` (whole smallest steps;
    /// needs `raise_limit`): a new contract version. Runs paused for the
    /// allowance go on by themselves once it covers them (K2).
    pub fn raise_limit(&self, mission_id: &str, unit: &str, limit: u64) -> Result<LimitRaised> {
        let body = json!({"unit": unit, "limit": limit});
        self.post(&format!("/missions/{}/raise-limit", seg(mission_id)), body)
    }

    /// A mission's balances per unit, and the ledger check.
    pub fn ledger(&self, mission_id: &str) -> Result<Ledger> {
        self.get(&format!("/missions/{}/ledger", seg(mission_id)))
    }

    /// A mission's incidents by opening time (the first page); `open_only`
    /// for the open ones.
    pub fn incidents(&self, mission_id: &str, open_only: bool) -> Result<Vec<Incident>> {
        let query = if open_only { "?open=true" } else { "" };
        let page: Page<Incident> =
            self.get(&format!("/missions/{}/incidents{query}", seg(mission_id)))?;
        Ok(page.items)
    }

    /// Close an incident with a note saying what was done (needs `resolve`).
    pub fn close_incident(&self, incident_id: &str, note: &str) -> Result<()> {
        let path = format!("/incidents/{}/close", seg(incident_id));
        let _: serde_json::Value = self.post(&path, json!({"note": note}))?;
        Ok(())
    }

    /// Verify the audit hash chains: one mission's, or every chain the store keeps.
    pub fn audit(&self, mission_id: Option<&str>) -> Result<AuditVerification> {
        match mission_id {
            Some(m) => self.get(&format!("/audit?mission={}", seg(m))),
            None => self.get("/audit"),
        }
    }
}
