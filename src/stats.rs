//! Traffic counters, kept per pool and summed per database by the admin console and the
//! metrics endpoint. A client task counts into a plain `Delta` while it relays and adds it
//! to the shared atomics once per transaction, so the hot path touches no shared memory.

use std::sync::atomic::{AtomicU64, Ordering};

#[derive(Debug, Default, Clone, Copy, PartialEq, Eq)]
pub struct Delta {
    pub server_assignments: u64,
    pub xacts: u64,
    pub queries: u64,
    /// Bytes received from clients.
    pub received: u64,
    /// Bytes sent to clients.
    pub sent: u64,
    pub xact_time_us: u64,
    pub query_time_us: u64,
    pub wait_time_us: u64,
}

impl Delta {
    pub fn is_empty(&self) -> bool {
        *self == Delta::default()
    }
}

#[derive(Debug, Default)]
pub struct Counters {
    server_assignments: AtomicU64,
    xacts: AtomicU64,
    queries: AtomicU64,
    received: AtomicU64,
    sent: AtomicU64,
    xact_time_us: AtomicU64,
    query_time_us: AtomicU64,
    wait_time_us: AtomicU64,
}

impl Counters {
    pub fn add(&self, d: &Delta) {
        let pairs = [
            (&self.server_assignments, d.server_assignments),
            (&self.xacts, d.xacts),
            (&self.queries, d.queries),
            (&self.received, d.received),
            (&self.sent, d.sent),
            (&self.xact_time_us, d.xact_time_us),
            (&self.query_time_us, d.query_time_us),
            (&self.wait_time_us, d.wait_time_us),
        ];
        for (counter, v) in pairs {
            if v != 0 {
                counter.fetch_add(v, Ordering::Relaxed);
            }
        }
    }

    pub fn read(&self) -> Delta {
        Delta {
            server_assignments: self.server_assignments.load(Ordering::Relaxed),
            xacts: self.xacts.load(Ordering::Relaxed),
            queries: self.queries.load(Ordering::Relaxed),
            received: self.received.load(Ordering::Relaxed),
            sent: self.sent.load(Ordering::Relaxed),
            xact_time_us: self.xact_time_us.load(Ordering::Relaxed),
            query_time_us: self.query_time_us.load(Ordering::Relaxed),
            wait_time_us: self.wait_time_us.load(Ordering::Relaxed),
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn add_and_read() {
        let c = Counters::default();
        let d = Delta {
            xacts: 2,
            queries: 3,
            sent: 10,
            ..Delta::default()
        };
        c.add(&d);
        c.add(&d);
        assert_eq!(c.read().queries, 6);
        assert_eq!(c.read().sent, 20);
        assert!(!c.read().is_empty());
    }
}
