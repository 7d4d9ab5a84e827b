//! When a request is sent again, and how long to wait before it.
//!
//! A request is sent again only when that cannot do anything twice: the
//! server answered `503 store_busy` (it wrote nothing and says to try again),
//! the connection was never made (not one byte was sent), or the request is
//! one the protocol makes idempotent (a read, an outcome report, a renewal,
//! a node's start or completion) and its answer was lost. An admission, a
//! decision or an end whose answer was lost is never sent again by itself:
//! whether the server acted is then unknown, and the caller reads the state.

use std::time::{Duration, SystemTime, UNIX_EPOCH};

use crate::error::{Code, Error};

/// How many times, and how far apart, a failed request is sent again.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub struct Retry {
    max_retries: u32,
    initial_backoff: Duration,
    max_backoff: Duration,
}

impl Default for Retry {
    /// Four more tries, 100 ms apart and doubling to at most 2 s (about 3 s in
    /// all): well within a 30 s lease, and past a store's short busy spell.
    fn default() -> Retry {
        Retry {
            max_retries: 4,
            initial_backoff: Duration::from_millis(100),
            max_backoff: Duration::from_secs(2),
        }
    }
}

impl Retry {
    /// Never send a request again.
    pub fn none() -> Retry {
        Retry { max_retries: 0, ..Retry::default() }
    }

    /// At most `max_retries` more tries after the first.
    pub fn max_retries(mut self, max_retries: u32) -> Retry {
        self.max_retries = max_retries;
        self
    }

    /// The wait before the first retry; each next one waits twice as long, up
    /// to `max`. A random tenth is added so that clients do not retry in step.
    pub fn backoff(mut self, initial: Duration, max: Duration) -> Retry {
        self.initial_backoff = initial;
        self.max_backoff = max.max(initial);
        self
    }

    pub fn retries(&self) -> u32 {
        self.max_retries
    }

    /// The wait before retry number `retry` (0 for the first), or `None` when
    /// `failed` is not to be sent again.
    pub(crate) fn next(&self, retry: u32, again: Again, failed: &Error) -> Option<Duration> {
        if retry >= self.max_retries || !again.allows(failed) {
            return None;
        }
        let doubled = self.initial_backoff.saturating_mul(1u32 << retry.min(16));
        let wait = doubled.min(self.max_backoff);
        Some(wait + jitter(wait / 10))
    }
}

/// Whether a request may be sent again after its answer was lost.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub(crate) enum Again {
    /// Only if the server did not act: `store_busy`, or no connection made.
    IfNotSent,
    /// Whatever happened: the protocol answers it the same the second time.
    Idempotent,
}

impl Again {
    fn allows(self, failed: &Error) -> bool {
        match (self, failed) {
            (_, Error::Api { code, .. }) => code == &Code::StoreBusy,
            (_, Error::Transport { sent: false, .. }) => true,
            (Again::Idempotent, Error::Transport { .. }) => true,
            _ => false,
        }
    }
}

/// Up to `most`, from the clock's nanoseconds: enough to spread retries.
fn jitter(most: Duration) -> Duration {
    let nanos = SystemTime::now().duration_since(UNIX_EPOCH).map_or(0, |d| d.subsec_nanos());
    let most = most.as_nanos() as u64;
    if most == 0 {
        return Duration::ZERO;
    }
    Duration::from_nanos(u64::from(nanos) % most)
}

#[cfg(test)]
mod tests {
    use super::*;
    use serde_json::Map;

    fn api(code: Code) -> Error {
        Error::Api { status: 503, code, message: String::new(), details: Map::new() }
    }

    fn lost(sent: bool) -> Error {
        let io = std::io::Error::new(std::io::ErrorKind::TimedOut, "timed out");
        Error::transport("POST /x".into(), sent, io)
    }

    #[test]
    fn x1_item8_only_what_cannot_act_twice_is_sent_again() {
        let retry = Retry::default();
        assert!(retry.next(0, Again::IfNotSent, &api(Code::StoreBusy)).is_some());
        assert!(retry.next(0, Again::IfNotSent, &lost(false)).is_some());
        assert!(retry.next(0, Again::IfNotSent, &lost(true)).is_none(), "an admission");
        assert!(retry.next(0, Again::Idempotent, &lost(true)).is_some(), "a report");
        assert!(retry.next(0, Again::Idempotent, &api(Code::InvalidState)).is_none());
        assert!(retry.next(4, Again::Idempotent, &lost(true)).is_none(), "spent");
        assert!(Retry::none().next(0, Again::Idempotent, &lost(true)).is_none());
    }

    #[test]
    fn x1_item8_the_wait_doubles_up_to_its_bound() {
        let retry =
            Retry::default().backoff(Duration::from_millis(100), Duration::from_millis(300));
        let wait = |n| retry.next(n, Again::Idempotent, &lost(true)).unwrap();
        assert!(wait(0) >= Duration::from_millis(100) && wait(0) < Duration::from_millis(111));
        assert!(wait(1) >= Duration::from_millis(200) && wait(1) < Duration::from_millis(221));
        assert!(wait(3) >= Duration::from_millis(300) && wait(3) < Duration::from_millis(331));
    }
}
