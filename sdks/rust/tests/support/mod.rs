//! A real Charter server for the tests: a fresh store made by `setup.py` (with
//! the project's Python), `charter serve` over it and `charter sandbox` beside
//! it, each a child process stopped when the `Desk` is dropped.
//!
//! The project's virtualenv is found at the repository's `.venv` (what
//! `python3 tasks.py test` makes); `CHARTER_VENV` names another.

#![allow(dead_code)]

pub mod proxy;
pub mod story;

use std::collections::HashMap;
use std::io::{BufRead, BufReader};
use std::path::{Path, PathBuf};
use std::process::{Child, Command, Stdio};
use std::sync::atomic::{AtomicUsize, Ordering};
use std::time::Duration;

use charter::sandbox::Payments;
use charter::{Client, ClientBuilder};
use serde_json::{json, Value};

static COUNT: AtomicUsize = AtomicUsize::new(0);

pub fn venv() -> PathBuf {
    match std::env::var_os("CHARTER_VENV") {
        Some(v) => PathBuf::from(v),
        None => Path::new(env!("CARGO_MANIFEST_DIR")).join("../../.venv"),
    }
}

pub fn tool(name: &str) -> PathBuf {
    venv().join("bin").join(name)
}

pub struct Desk {
    pub dir: PathBuf,
    pub url: String,
    pub sandbox_url: String,
    pub mission: String,
    pub tight: String,
    pub gated: String,
    pub config: String,
    credentials: HashMap<String, String>,
    server: Child,
    sandbox: Child,
}

fn first_line(child: &mut Child) -> String {
    let out = child.stdout.take().expect("piped stdout");
    let mut line = String::new();
    BufReader::new(out).read_line(&mut line).expect("a first line");
    line
}

impl Desk {
    pub fn start() -> Desk {
        Desk::start_with_lease(None)
    }

    /// A desk whose engine gives segments `lease_seconds` (default: the engine's).
    pub fn start_with_lease(lease_seconds: Option<u64>) -> Desk {
        Desk::start_with(lease_seconds, None)
    }

    /// A desk whose engine gives segments `lease_seconds` and waits at most
    /// `busy_seconds` for the store's write lock (default: the engine's).
    pub fn start_with(lease_seconds: Option<u64>, busy_seconds: Option<f64>) -> Desk {
        let n = COUNT.fetch_add(1, Ordering::SeqCst);
        let dir = std::env::temp_dir().join(format!("charter-rs-{}-{n}", std::process::id()));
        let _ = std::fs::remove_dir_all(&dir);
        std::fs::create_dir_all(&dir).unwrap();
        let setup = Path::new(env!("CARGO_MANIFEST_DIR")).join("tests/support/setup.py");
        let made = Command::new(tool("python"))
            .arg(&setup)
            .arg(&dir)
            .arg(lease_seconds.map_or("-".to_string(), |s| s.to_string()))
            .arg(busy_seconds.map_or("-".to_string(), |s| s.to_string()))
            .output()
            .expect(
                "the project's Python (python3 tasks.py test makes .venv; or set CHARTER_VENV)",
            );
        assert!(made.status.success(), "setup.py: {}", String::from_utf8_lossy(&made.stderr));
        let facts: Value = serde_json::from_slice(&made.stdout).expect("setup.py's JSON line");

        let mut sandbox = Command::new(tool("charter"))
            .args(["sandbox", "--port", "0", "--json", "--data"])
            .arg(dir.join("sandbox.db"))
            .stdout(Stdio::piped())
            .spawn()
            .expect("charter sandbox");
        let said: Value = serde_json::from_str(&first_line(&mut sandbox)).expect("sandbox's url");

        let config = facts["config"].as_str().unwrap().to_string();
        // Port 0: the server binds a port the system chooses and prints it once
        // it serves (a port chosen here and bound later could be taken meanwhile).
        let mut server = Command::new(tool("charter"))
            .args(["serve", "--config", &config, "--port", "0"])
            .stdout(Stdio::piped())
            .spawn()
            .expect("charter serve");
        let announced = first_line(&mut server);
        let url = announced
            .strip_prefix("serving ")
            .and_then(|rest| rest.split_once("/api/v1 "))
            .map(|(url, _)| url.to_string())
            .unwrap_or_else(|| panic!("charter serve did not say where it serves: {announced:?}"));
        let credentials = facts["credentials"]
            .as_object()
            .unwrap()
            .iter()
            .map(|(k, v)| (k.clone(), v.as_str().unwrap().to_string()))
            .collect();
        Desk {
            url,
            sandbox_url: said["url"].as_str().unwrap().to_string(),
            mission: facts["mission"].as_str().unwrap().to_string(),
            tight: facts["tight"].as_str().unwrap().to_string(),
            gated: facts["gated"].as_str().unwrap().to_string(),
            config,
            dir,
            credentials,
            server,
            sandbox,
        }
    }

    /// `NAME:SECRET` of principal `name`.
    pub fn credential(&self, name: &str) -> &str {
        &self.credentials[name]
    }

    pub fn client(&self, name: &str) -> Client {
        self.builder(name).build().unwrap()
    }

    pub fn builder(&self, name: &str) -> ClientBuilder {
        Client::builder(&self.url, self.credential(name))
    }

    #[cfg(feature = "async")]
    pub fn async_client(&self, name: &str) -> charter::AsyncClient {
        self.builder(name).build_async().unwrap()
    }

    #[cfg(feature = "async")]
    pub fn async_payments(&self) -> charter::sandbox::AsyncPayments {
        charter::sandbox::AsyncPayments::new(&self.sandbox_url, Duration::from_secs(2))
    }

    /// Hold the store's write lock for `seconds` (as another process writing
    /// would), from a process of the project's Python; returns once it holds it.
    pub fn lock_store(&self, seconds: f64) -> Child {
        let script = "import sqlite3, sys, time\n\
            c = sqlite3.connect(sys.argv[1], isolation_level=None)\n\
            c.execute('BEGIN IMMEDIATE')\n\
            print('locked', flush=True)\n\
            time.sleep(float(sys.argv[2]))\n\
            c.execute('ROLLBACK')\n";
        let mut child = Command::new(tool("python"))
            .args(["-c", script])
            .arg(self.dir.join("charter.db"))
            .arg(seconds.to_string())
            .stdout(Stdio::piped())
            .spawn()
            .expect("the project's Python");
        assert_eq!(first_line(&mut child).trim(), "locked");
        child
    }

    pub fn payments(&self) -> Payments {
        Payments::new(&self.sandbox_url, Duration::from_secs(2))
    }

    /// How many times the sandbox applied a payment with client reference `reference`.
    pub fn paid(&self, reference: &str) -> usize {
        let all = self.payments().payments().expect("the sandbox's payments");
        all.iter().filter(|p| p["reference"].as_str() == Some(reference)).count()
    }
}

impl Drop for Desk {
    fn drop(&mut self) {
        let _ = self.server.kill();
        let _ = self.sandbox.kill();
        let _ = self.server.wait();
        let _ = self.sandbox.wait();
        let _ = std::fs::remove_dir_all(&self.dir);
    }
}

pub fn invoice(reference: &str, amount: u64) -> Value {
    json!({"amount": amount, "currency": "usd", "payee": "acme", "reference": reference})
}

/// The node journal as the run's state shows it: `[node_id, execution, status, result_hash]`.
pub fn journal(desk: &Desk, run_id: &str) -> Vec<Value> {
    let state = desk.client("ops").coordinator().state(run_id).unwrap();
    state.nodes.iter().map(|n| json!([n.node_id, n.execution, n.status, n.result_hash])).collect()
}
