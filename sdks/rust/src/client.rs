//! The client of `charter serve`'s `/api/v1`: [`ClientBuilder`] checks the
//! address and the credential and sets the timeouts and the retries once, for
//! the blocking [`Client`] (ureq) and, with the `async` feature, the
//! [`AsyncClient`](crate::AsyncClient) (reqwest). Then the coordinator: the
//! recovery API with the seed's names (`recover`, `reconcile`, `confirm`,
//! `resolve`, `state`; `resume` and `start_run`, which answer a segment, are
//! with the segment in `segment.rs`).

use std::io::Read;
use std::sync::Arc;
use std::time::Duration;

use serde::de::DeserializeOwned;
use serde_json::Value;

use crate::adapter::Adapter;
use crate::calls::{self, Call, Resolution};
use crate::error::{Error, Result};
use crate::records::{Attempt, Recovery, Settlement, Snapshot};
use crate::retry::{Again, Retry};

/// The longest answer read: anything longer is cut off and refused as not JSON.
const ANSWER_LIMIT: u64 = 64 * 1024 * 1024;

/// How a [`Client`] (or an [`AsyncClient`](crate::AsyncClient)) reaches its
/// server: `ClientBuilder::new(base_url, credential)`, then what differs from
/// the defaults, then `build()`.
///
/// Defaults: 5 s to connect, 10 s for a whole request (a third of the default
/// 30 s lease, so that a renewal that hangs leaves time for another), and
/// [`Retry::default`].
#[derive(Clone)]
pub struct ClientBuilder {
    base_url: String,
    credential: String,
    pub(crate) connect_timeout: Duration,
    pub(crate) timeout: Duration,
    retry: Retry,
    agent: Option<ureq::Agent>,
    #[cfg(feature = "async")]
    pub(crate) http: Option<reqwest::Client>,
}

impl std::fmt::Debug for ClientBuilder {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.debug_struct("ClientBuilder")
            .field("base_url", &self.base_url)
            .field("connect_timeout", &self.connect_timeout)
            .field("timeout", &self.timeout)
            .field("retry", &self.retry)
            .finish_non_exhaustive()
    }
}

impl ClientBuilder {
    /// `base_url` is the server's address (`http://127.0.0.1:8765`, with or
    /// without `/api/v1`); `credential` is `NAME:SECRET` (`charter credential
    /// new NAME`). Both are checked by `build`.
    pub fn new(base_url: impl Into<String>, credential: impl Into<String>) -> ClientBuilder {
        ClientBuilder {
            base_url: base_url.into(),
            credential: credential.into(),
            connect_timeout: Duration::from_secs(5),
            timeout: Duration::from_secs(10),
            retry: Retry::default(),
            agent: None,
            #[cfg(feature = "async")]
            http: None,
        }
    }

    /// How long making a connection may take.
    pub fn connect_timeout(mut self, timeout: Duration) -> ClientBuilder {
        self.connect_timeout = timeout;
        self
    }

    /// How long one request may take, answer read included. Keep it well under
    /// the lease: a renewal that waits longer than the lease is worth nothing.
    pub fn timeout(mut self, timeout: Duration) -> ClientBuilder {
        self.timeout = timeout;
        self
    }

    /// When and how often a failed request is sent again (see [`Retry`]).
    pub fn retry(mut self, retry: Retry) -> ClientBuilder {
        self.retry = retry;
        self
    }

    /// Your own ureq agent (a proxy, TLS, a connection pool of your own) for
    /// the blocking client. Its timeouts are yours: the builder's are not
    /// applied to it. It must not follow redirects (every write is a decision).
    pub fn agent(mut self, agent: ureq::Agent) -> ClientBuilder {
        self.agent = Some(agent);
        self
    }

    /// Your own reqwest client for the async client; as for [`Self::agent`],
    /// its timeouts and redirect policy are yours.
    #[cfg(feature = "async")]
    pub fn http_client(mut self, client: reqwest::Client) -> ClientBuilder {
        self.http = Some(client);
        self
    }

    /// The blocking client, once the address and the credential are checked.
    pub fn build(self) -> Result<Client> {
        let endpoint = self.endpoint()?;
        let agent = self.agent.unwrap_or_else(|| {
            ureq::AgentBuilder::new()
                .timeout_connect(self.connect_timeout)
                .timeout(self.timeout)
                .redirects(0)
                .build()
        });
        Ok(Client { endpoint: Arc::new(endpoint), agent })
    }

    pub(crate) fn endpoint(&self) -> Result<Endpoint> {
        let base = base_url(&self.base_url)?;
        check_credential(&self.credential)?;
        Ok(Endpoint {
            base,
            authorization: format!("Bearer {}", self.credential),
            retry: self.retry,
        })
    }
}

/// `…/api/v1` of an `http` or `https` address with a host and nothing after
/// its path; a usage error naming what is wrong otherwise.
fn base_url(given: &str) -> Result<String> {
    let refused = |why: &str| Error::Usage(format!("base URL {given:?}: {why}"));
    let url = url::Url::parse(given).map_err(|e| refused(&e.to_string()))?;
    if !matches!(url.scheme(), "http" | "https") {
        return Err(refused("the scheme must be http or https"));
    }
    if url.host_str().map_or(true, str::is_empty) {
        return Err(refused("no host"));
    }
    if url.query().is_some() || url.fragment().is_some() || !url.username().is_empty() {
        return Err(refused("no query, fragment or user belongs in it"));
    }
    let base = url.as_str().trim_end_matches('/');
    Ok(if base.ends_with("/api/v1") { base.to_string() } else { format!("{base}/api/v1") })
}

/// `NAME:SECRET`, as `charter credential new` prints it.
fn check_credential(credential: &str) -> Result<()> {
    let well_formed = match credential.split_once(':') {
        Some((name, secret)) => {
            !name.is_empty()
                && !secret.is_empty()
                && !credential.chars().any(|c| c.is_whitespace() || c.is_control())
        }
        None => false,
    };
    if well_formed {
        return Ok(());
    }
    // The credential is a secret: it is never shown, even refused.
    Err(Error::Usage(
        "the credential must be NAME:SECRET, as `charter credential new` prints it".into(),
    ))
}

/// What both clients share: where the API is, who speaks, how to retry.
pub(crate) struct Endpoint {
    pub base: String,
    pub authorization: String,
    pub retry: Retry,
}

/// A principal's connection to one Charter server, blocking. Cheap to clone:
/// clones share the connection pool.
#[derive(Clone)]
pub struct Client {
    endpoint: Arc<Endpoint>,
    agent: ureq::Agent,
}

impl std::fmt::Debug for Client {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        // The credential is a secret: never printed.
        f.debug_struct("Client").field("base", &self.endpoint.base).finish_non_exhaustive()
    }
}

impl Client {
    /// A client with the builder's defaults: `ClientBuilder::new(base_url,
    /// credential).build()`.
    pub fn new(base_url: &str, credential: &str) -> Result<Client> {
        ClientBuilder::new(base_url, credential).build()
    }

    pub fn builder(base_url: impl Into<String>, credential: impl Into<String>) -> ClientBuilder {
        ClientBuilder::new(base_url, credential)
    }

    /// The recovery API over this client.
    pub fn coordinator(&self) -> Coordinator {
        Coordinator { client: self.clone() }
    }

    /// One request, sent once; the answer's status and JSON body, whatever the
    /// status (an error only when no answer came). What the conformance driver
    /// speaks.
    pub fn call(&self, method: &str, path: &str, body: Option<&Value>) -> Result<(u16, Value)> {
        let name = format!("{method} {path}");
        let request = self
            .agent
            .request(method, &format!("{}{}", self.endpoint.base, path))
            .set("Authorization", &self.endpoint.authorization);
        let answer = match body {
            Some(body) => request.send_json(body),
            None => request.call(),
        };
        let response = match answer {
            Ok(response) => response,
            Err(ureq::Error::Status(_, response)) => response,
            Err(ureq::Error::Transport(t)) => {
                let sent = !matches!(
                    t.kind(),
                    ureq::ErrorKind::ConnectionFailed
                        | ureq::ErrorKind::Dns
                        | ureq::ErrorKind::InvalidUrl
                        | ureq::ErrorKind::UnknownScheme
                );
                return Err(Error::transport(name, sent, t));
            }
        };
        let status = response.status();
        let mut text = String::new();
        let read = response.into_reader().take(ANSWER_LIMIT).read_to_string(&mut text);
        read.map_err(|e| Error::transport(name, true, e))?;
        Ok((status, calls::body(status, &text)?))
    }

    /// A request whose 2xx answer is returned, any other status its typed
    /// error; sent again only on `store_busy` or when no connection was made
    /// (and, for a `GET`, when its answer was lost).
    pub fn request(&self, method: &str, path: &str, body: Option<&Value>) -> Result<Value> {
        let again = if method == "GET" { Again::Idempotent } else { Again::IfNotSent };
        self.exchange(method, path, body, again)
    }

    /// A described call, sent again as its kind and the client's [`Retry`] allow.
    pub(crate) fn send<T: DeserializeOwned>(&self, call: Call) -> Result<T> {
        calls::decode(self.exchange(call.method, &call.path, call.body.as_ref(), call.again)?)
    }

    fn exchange(
        &self,
        method: &str,
        path: &str,
        body: Option<&Value>,
        again: Again,
    ) -> Result<Value> {
        let mut retry = 0;
        loop {
            let answered = self.call(method, path, body);
            let failed = match answered.and_then(|(status, value)| calls::judge(status, value)) {
                Ok(value) => return Ok(value),
                Err(failed) => failed,
            };
            match self.endpoint.retry.next(retry, again, &failed) {
                Some(wait) => std::thread::sleep(wait),
                None => return Err(failed),
            }
            retry += 1;
        }
    }

    /// The principal the credential proves.
    pub fn me(&self) -> Result<String> {
        let me: Value = self.send(calls::me())?;
        me["principal"]
            .as_str()
            .map(str::to_string)
            .ok_or_else(|| Error::Protocol(format!("/me answered {me}")))
    }

    /// An attempt with its evidence and next safe action.
    pub fn attempt(&self, attempt_id: &str) -> Result<Attempt> {
        self.send(calls::attempt(attempt_id))
    }

    /// The run's waits: approvals, timers, questions.
    pub fn waits(&self, run_id: &str) -> Result<Value> {
        self.send(calls::waits(run_id))
    }
}

/// The recovery API, with the seed's names.
#[derive(Debug, Clone)]
pub struct Coordinator {
    pub(crate) client: Client,
}

impl Coordinator {
    /// Take the run over as `segment_id` (a new name per continuation): the
    /// epoch goes up, stale work is fenced, and the attempts whose outcome is
    /// not known are named (R1-R5). It does not continue the run.
    pub fn recover(&self, run_id: &str, segment_id: &str) -> Result<Recovery> {
        self.recover_with(run_id, segment_id, false)
    }

    /// `recover`, forced past a live lease (needs `stop`; audited).
    pub fn recover_with(&self, run_id: &str, segment_id: &str, force: bool) -> Result<Recovery> {
        let snapshot: Snapshot = self.client.send(calls::recover(run_id, segment_id, force))?;
        Ok(Recovery { unresolved: snapshot.unresolved.clone(), snapshot })
    }

    /// The run's recorded state: nodes, unresolved attempts, waits, next actions.
    pub fn state(&self, run_id: &str) -> Result<Snapshot> {
        self.client.send(calls::state(run_id))
    }

    /// Ask `adapter` (here, in this process) what became of an uncertain
    /// attempt, and record what it found as evidence (A8). Under the default
    /// `evidence_settles = "confirm"` a person then confirms it.
    pub fn reconcile<A: Adapter + ?Sized>(
        &self,
        attempt_id: &str,
        adapter: &A,
    ) -> Result<Settlement> {
        let attempt = self.client.attempt(attempt_id)?;
        crate::protocol::same_adapter(&attempt, adapter.name())?;
        let evidence = adapter.lookup(&attempt.recorded());
        self.client.send(calls::evidence(attempt_id, evidence.to_json()))
    }

    /// Settle an uncertain attempt on its recorded evidence (R7): the newest
    /// conclusive evidence, or the one named.
    pub fn confirm(&self, attempt_id: &str, evidence_id: Option<&str>) -> Result<Attempt> {
        self.client.send(calls::confirm(attempt_id, evidence_id))
    }

    /// A person's settlement, with the evidence they saw (R8).
    pub fn resolve(&self, attempt_id: &str, resolution: &Resolution) -> Result<Attempt> {
        self.client.send(calls::resolve(attempt_id, resolution))
    }

    /// Continue a run whose plan runs on the server (`charter worker`, a plan
    /// the server imports): the server runs its remaining nodes.
    pub fn resume_on_server(&self, run_id: &str, segment_id: Option<&str>) -> Result<Value> {
        self.client.send(calls::resume_on_server(run_id, segment_id))
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn p1_item7_build_checks_the_address_and_the_credential() {
        let ok = |url: &str| ClientBuilder::new(url, "agent:s3cret").endpoint().map(|e| e.base);
        assert_eq!(ok("http://127.0.0.1:8765").unwrap(), "http://127.0.0.1:8765/api/v1");
        assert_eq!(
            ok("https://charter.example/api/v1/").unwrap(),
            "https://charter.example/api/v1"
        );
        for wrong in ["127.0.0.1:8765", "ftp://host", "http://", "http://h/?x=1", "not a url"] {
            assert!(matches!(ok(wrong), Err(Error::Usage(_))), "{wrong} accepted");
        }
        for wrong in ["agent", "agent:", ":secret", "agent:sec ret", "agent:s\nx"] {
            let refused = ClientBuilder::new("http://h", wrong).build().unwrap_err();
            assert!(matches!(&refused, Error::Usage(m) if !m.contains("sec")), "{refused:?}");
        }
    }
}
