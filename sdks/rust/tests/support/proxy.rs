//! A loopback HTTP proxy in front of `charter serve` that loses answers: it
//! forwards each request whole, reads the server's answer whole, and for the
//! first `times` requests whose path contains `path`, closes the client's
//! connection instead of answering. The server acted; the client never heard.
//! What a dropped connection after a successful write looks like.

use std::io::{BufRead, BufReader, Write};
use std::net::{TcpListener, TcpStream};
use std::sync::{Arc, Mutex};

pub struct Proxy {
    pub url: String,
    seen: Arc<Mutex<Vec<String>>>,
}

struct Rule {
    path: String,
    times: usize,
}

impl Proxy {
    /// A proxy to `upstream` (`http://127.0.0.1:PORT`) that loses the answer
    /// to the first `times` requests whose path contains `path`.
    pub fn losing(upstream: &str, path: &str, times: usize) -> Proxy {
        let listener = TcpListener::bind("127.0.0.1:0").unwrap();
        let url = format!("http://{}", listener.local_addr().unwrap());
        let upstream = upstream.trim_start_matches("http://").to_string();
        let seen = Arc::new(Mutex::new(Vec::new()));
        let rule = Arc::new(Mutex::new(Rule { path: path.to_string(), times }));
        let log = seen.clone();
        std::thread::spawn(move || {
            for client in listener.incoming().flatten() {
                let (upstream, log, rule) = (upstream.clone(), log.clone(), rule.clone());
                std::thread::spawn(move || serve(client, &upstream, &log, &rule));
            }
        });
        Proxy { url, seen }
    }

    /// How many requests whose path contains `path` reached the server.
    pub fn seen(&self, path: &str) -> usize {
        self.seen.lock().unwrap().iter().filter(|p| p.contains(path)).count()
    }
}

/// A request or an answer: its head (start line and headers, without the
/// blank line) and its body, read as its Content-Length says.
fn message(reader: &mut impl BufRead) -> Option<(Vec<String>, Vec<u8>)> {
    let mut head = Vec::new();
    loop {
        let mut line = String::new();
        if reader.read_line(&mut line).ok()? == 0 {
            return None;
        }
        let line = line.trim_end().to_string();
        if line.is_empty() {
            break;
        }
        head.push(line);
    }
    let length = head.iter().find_map(|h| {
        let (name, value) = h.split_once(':')?;
        name.eq_ignore_ascii_case("content-length").then(|| value.trim().parse::<usize>().ok())?
    });
    let mut body = Vec::new();
    match length {
        Some(n) => {
            body.resize(n, 0);
            reader.read_exact(&mut body).ok()?;
        }
        None if head[0].starts_with("HTTP/") => {
            reader.read_to_end(&mut body).ok()?;
        }
        None => {}
    }
    Some((head, body))
}

/// `head` with its Connection header replaced by `Connection: close`.
fn closing(head: &[String]) -> Vec<u8> {
    let mut out = String::new();
    for line in head.iter().filter(|h| !h.to_ascii_lowercase().starts_with("connection:")) {
        out.push_str(line);
        out.push_str("\r\n");
    }
    out.push_str("Connection: close\r\n\r\n");
    out.into_bytes()
}

fn serve(client: TcpStream, upstream: &str, seen: &Mutex<Vec<String>>, rule: &Mutex<Rule>) {
    let mut reader = BufReader::new(client.try_clone().unwrap());
    let (head, body) = match message(&mut reader) {
        Some(request) => request,
        None => return,
    };
    let path = head[0].split(' ').nth(1).unwrap_or("").to_string();
    seen.lock().unwrap().push(path.clone());
    let mut server = TcpStream::connect(upstream).unwrap();
    server.write_all(&closing(&head)).unwrap();
    server.write_all(&body).unwrap();
    let answer = message(&mut BufReader::new(server));
    let lose = {
        let mut rule = rule.lock().unwrap();
        let lose = rule.times > 0 && path.contains(&rule.path);
        if lose {
            rule.times -= 1;
        }
        lose
    };
    let mut client = client;
    match answer {
        Some((head, body)) if !lose => {
            let _ = client.write_all(&closing(&head));
            let _ = client.write_all(&body);
        }
        _ => {} // the answer is lost: the connection closes unanswered
    }
    let _ = client.shutdown(std::net::Shutdown::Both);
}
