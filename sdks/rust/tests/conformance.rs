//! X2: the language-neutral conformance suite (`sdks/conformance/cases.json`),
//! driven through this SDK's client against a real server: the fixture served
//! by `tests/test_conformance_protocol.py serve DIR` (a fresh store, a mission
//! per case, a credential per principal). Every case runs; the test fails
//! naming each step that does not hold.

mod support;

use std::collections::HashMap;
use std::io::{BufRead, BufReader};
use std::path::{Path, PathBuf};
use std::process::{Child, Command, Stdio};

use charter::Client;
use serde_json::{Map, Value};

fn repo() -> PathBuf {
    Path::new(env!("CARGO_MANIFEST_DIR")).join("../..")
}

/// The suite's fixture, served until dropped.
struct Fixture {
    child: Child,
    dir: PathBuf,
    url: String,
    credentials: HashMap<String, String>,
    missions: HashMap<String, String>,
}

impl Fixture {
    fn serve() -> Fixture {
        let dir =
            std::env::temp_dir().join(format!("charter-rs-conformance-{}", std::process::id()));
        let _ = std::fs::remove_dir_all(&dir);
        let mut child = Command::new(support::tool("python"))
            .arg(repo().join("tests/test_conformance_protocol.py"))
            .arg("serve")
            .arg(&dir)
            .current_dir(repo())
            .stdout(Stdio::piped())
            .spawn()
            .expect("the project's Python");
        let mut line = String::new();
        BufReader::new(child.stdout.take().unwrap()).read_line(&mut line).unwrap();
        let said: Value = serde_json::from_str(&line).expect("the fixture's JSON line");
        let strings = |v: &Value| -> HashMap<String, String> {
            v.as_object()
                .unwrap()
                .iter()
                .map(|(k, v)| (k.clone(), v.as_str().unwrap().to_string()))
                .collect()
        };
        Fixture {
            url: said["url"].as_str().unwrap().to_string(),
            credentials: strings(&said["credentials"]),
            missions: strings(&said["missions"]),
            child,
            dir,
        }
    }
}

impl Drop for Fixture {
    fn drop(&mut self) {
        // SIGTERM, as the fixture asks, to this process only; then make sure.
        let _ = Command::new("kill").args(["-TERM", &self.child.id().to_string()]).status();
        let _ = self.child.wait();
        let _ = std::fs::remove_dir_all(&self.dir);
    }
}

/// `value` with each `{name}` replaced by a saved variable; a string that is
/// exactly `"{name}"` becomes the variable itself, keeping its JSON type.
fn fill(value: &Value, saved: &Map<String, Value>) -> Value {
    match value {
        Value::String(text) => {
            if let Some(name) = text.strip_prefix('{').and_then(|t| t.strip_suffix('}')) {
                if let Some(found) = saved.get(name) {
                    return found.clone();
                }
            }
            let mut out = text.clone();
            for (name, found) in saved {
                let shown = match found {
                    Value::String(s) => s.clone(),
                    other => other.to_string(),
                };
                out = out.replace(&format!("{{{name}}}"), &shown);
            }
            Value::String(out)
        }
        Value::Array(items) => Value::Array(items.iter().map(|v| fill(v, saved)).collect()),
        Value::Object(fields) => {
            Value::Object(fields.iter().map(|(k, v)| (k.clone(), fill(v, saved))).collect())
        }
        other => other.clone(),
    }
}

/// Where `answer` does not hold `expected`: objects key by key, recursively;
/// lists and scalars exactly; `"$any"` matches anything present.
fn contains(answer: &Value, expected: &Value, at: &str, wrong: &mut Vec<String>) {
    match expected {
        Value::String(s) if s == "$any" => {}
        Value::Object(fields) => match answer.as_object() {
            None => wrong.push(format!("{at}: expected an object, got {answer}")),
            Some(got) => {
                for (key, value) in fields {
                    match got.get(key) {
                        None => wrong.push(format!("{at}.{key}: missing")),
                        Some(found) => contains(found, value, &format!("{at}.{key}"), wrong),
                    }
                }
            }
        },
        _ if answer != expected => wrong.push(format!("{at}: expected {expected}, got {answer}")),
        _ => {}
    }
}

fn dotted<'v>(answer: &'v Value, path: &str) -> Option<&'v Value> {
    path.split('.').try_fold(answer, |v, key| v.get(key))
}

/// One case's steps in order: the first that does not hold, if any.
fn run_case(fixture: &Fixture, case: &Value) -> Result<(), String> {
    let name = case["name"].as_str().unwrap();
    let mut saved = Map::new();
    saved.insert("mission".into(), Value::String(fixture.missions[name].clone()));
    for (n, step) in case["steps"].as_array().unwrap().iter().enumerate() {
        let client =
            Client::new(&fixture.url, &fixture.credentials[step["as"].as_str().unwrap()]).unwrap();
        let method = step["method"].as_str().unwrap();
        let path = fill(&step["path"], &saved);
        let path = path.as_str().unwrap();
        let body = match method {
            "GET" => None,
            _ => Some(fill(step.get("body").unwrap_or(&Value::Object(Map::new())), &saved)),
        };
        let at = format!("{name} step {n} ({method} {})", step["path"]);
        let (status, said) =
            client.call(method, path, body.as_ref()).map_err(|e| format!("{at}: {e}"))?;
        let expect = &step["expect"];
        if Some(u64::from(status)) != expect["status"].as_u64() {
            return Err(format!("{at}: HTTP {status}, expected {}: {said}", expect["status"]));
        }
        if let Some(code) = expect.get("error") {
            if &said["error"]["code"] != code {
                return Err(format!("{at}: error {}, expected {code}: {said}", said["error"]));
            }
        }
        let mut wrong = Vec::new();
        let wanted = fill(expect.get("body").unwrap_or(&Value::Object(Map::new())), &saved);
        contains(&said, &wanted, "$", &mut wrong);
        if !wrong.is_empty() {
            return Err(format!("{at}: {wrong:?} in {said}"));
        }
        if let Some(Value::Object(save)) = step.get("save") {
            for (var, key) in save {
                let found = dotted(&said, key.as_str().unwrap())
                    .ok_or_else(|| format!("{at}: no {key} to save in {said}"))?;
                saved.insert(var.clone(), found.clone());
            }
        }
    }
    Ok(())
}

#[test]
fn x2_the_conformance_suite_holds_through_the_rust_client() {
    let suite: Value = serde_json::from_str(
        &std::fs::read_to_string(repo().join("sdks/conformance/cases.json")).unwrap(),
    )
    .unwrap();
    assert_eq!(suite["version"], 1, "a suite format this driver does not read");
    let cases = suite["cases"].as_array().unwrap();
    assert!(!cases.is_empty());
    let fixture = Fixture::serve();
    let failed: Vec<String> = cases.iter().filter_map(|c| run_case(&fixture, c).err()).collect();
    assert!(
        failed.is_empty(),
        "{} of {} cases fail:\n{}",
        failed.len(),
        cases.len(),
        failed.join("\n")
    );
}

#[test]
fn x2_the_driver_names_what_does_not_hold_and_fills_variables_with_their_types() {
    let answer = serde_json::json!({"a": 1, "b": [1, 2], "c": {"d": "x"}});
    let mut wrong = Vec::new();
    let expected = serde_json::json!({"a": 2, "b": [1], "c": {"d": "$any"}, "e": "$any"});
    contains(&answer, &expected, "$", &mut wrong);
    assert_eq!(wrong, ["$.a: expected 2, got 1", "$.b: expected [1], got [1,2]", "$.e: missing"]);

    let mut saved = Map::new();
    saved.insert("epoch".into(), serde_json::json!(2));
    saved.insert("run".into(), serde_json::json!("run_1"));
    let filled =
        fill(&serde_json::json!({"e": "{epoch}", "t": "{run}:{epoch}", "k": "{other}"}), &saved);
    assert_eq!(filled, serde_json::json!({"e": 2, "t": "run_1:2", "k": "{other}"}));
    assert_eq!(dotted(&answer, "c.d"), Some(&serde_json::json!("x")));
}
