//! Traffic counters, kept per pool and summed per database by the admin console and the
//! metrics endpoint. A client task counts into a plain `Delta` while it relays and adds it
//! to the shared atomics once per transaction, so the hot path touches no shared memory.

use std::sync::atomic::{AtomicU64, Ordering};

/// What a client task counts while it relays; its prepared-statement counters travel
/// with its statements instead (client::prepare), so that every client's session stays
/// small.
#[derive(Debug, Default, Clone, Copy, PartialEq, Eq)]
pub struct Traffic {
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

/// What happened to prepared statements (pooled modes, see prepared).
#[derive(Debug, Default, Clone, Copy, PartialEq, Eq)]
pub struct PreparedCounts {
    /// Named statements prepared by clients (Parse, SQL PREPARE).
    pub client_parses: u64,
    /// Statements Weir prepared on servers.
    pub server_parses: u64,
    /// Executions of named statements (Bind, SQL EXECUTE).
    pub binds: u64,
    /// Named statements that needed no prepare on the server: it held them already, or
    /// Weir answered the Parse itself.
    pub hits: u64,
    /// Statements closed on a server to keep within max_prepared_statements.
    pub evictions: u64,
}

impl PreparedCounts {
    pub fn is_empty(&self) -> bool {
        *self == PreparedCounts::default()
    }
}

/// A pool's counters: the traffic (reached through Deref, `d.xacts`), the
/// prepared-statement counts and the logins.
#[derive(Debug, Default, Clone, Copy, PartialEq, Eq)]
pub struct Delta {
    pub traffic: Traffic,
    pub prepared: PreparedCounts,
    /// Clients that logged in to the pool (PgBouncer's client_login_count): counted once
    /// per session, at login, so that a client reconnecting for every transaction shows.
    pub client_logins: u64,
    /// Requests sent to a server behind another client's (pool::pipeline).
    pub pipelined: u64,
    /// Servers put into a client's session state (parameters, settings) at a lend; of
    /// those, `state_apart` by a query of their own, a round trip before the request
    /// (the others in front of it, in the same write).
    pub state_applied: u64,
    pub state_apart: u64,
}

impl std::ops::Deref for Delta {
    type Target = Traffic;
    fn deref(&self) -> &Traffic {
        &self.traffic
    }
}

impl std::ops::DerefMut for Delta {
    fn deref_mut(&mut self) -> &mut Traffic {
        &mut self.traffic
    }
}

impl From<Traffic> for Delta {
    fn from(traffic: Traffic) -> Delta {
        Delta {
            traffic,
            ..Delta::default()
        }
    }
}

impl Traffic {
    pub fn is_empty(&self) -> bool {
        *self == Traffic::default()
    }
}

#[derive(Debug, Default)]
pub struct Counters {
    /// Transaction and query latencies, observed where their times are measured.
    pub xact_latency: Histogram,
    pub query_latency: Histogram,
    server_assignments: AtomicU64,
    xacts: AtomicU64,
    queries: AtomicU64,
    received: AtomicU64,
    sent: AtomicU64,
    xact_time_us: AtomicU64,
    query_time_us: AtomicU64,
    wait_time_us: AtomicU64,
    client_parses: AtomicU64,
    server_parses: AtomicU64,
    binds: AtomicU64,
    hits: AtomicU64,
    evictions: AtomicU64,
    client_logins: AtomicU64,
    pipelined: AtomicU64,
    state_applied: AtomicU64,
    state_apart: AtomicU64,
}

impl Counters {
    pub fn add_traffic(&self, t: &Traffic) {
        self.add(&Delta::from(*t));
    }

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
            (&self.client_parses, d.prepared.client_parses),
            (&self.server_parses, d.prepared.server_parses),
            (&self.binds, d.prepared.binds),
            (&self.hits, d.prepared.hits),
            (&self.evictions, d.prepared.evictions),
            (&self.client_logins, d.client_logins),
            (&self.pipelined, d.pipelined),
            (&self.state_applied, d.state_applied),
            (&self.state_apart, d.state_apart),
        ];
        for (counter, v) in pairs {
            if v != 0 {
                counter.fetch_add(v, Ordering::Relaxed);
            }
        }
    }

    pub fn read(&self) -> Delta {
        Delta {
            traffic: Traffic {
                server_assignments: self.server_assignments.load(Ordering::Relaxed),
                xacts: self.xacts.load(Ordering::Relaxed),
                queries: self.queries.load(Ordering::Relaxed),
                received: self.received.load(Ordering::Relaxed),
                sent: self.sent.load(Ordering::Relaxed),
                xact_time_us: self.xact_time_us.load(Ordering::Relaxed),
                query_time_us: self.query_time_us.load(Ordering::Relaxed),
                wait_time_us: self.wait_time_us.load(Ordering::Relaxed),
            },
            prepared: PreparedCounts {
                client_parses: self.client_parses.load(Ordering::Relaxed),
                server_parses: self.server_parses.load(Ordering::Relaxed),
                binds: self.binds.load(Ordering::Relaxed),
                hits: self.hits.load(Ordering::Relaxed),
                evictions: self.evictions.load(Ordering::Relaxed),
            },
            client_logins: self.client_logins.load(Ordering::Relaxed),
            pipelined: self.pipelined.load(Ordering::Relaxed),
            state_applied: self.state_applied.load(Ordering::Relaxed),
            state_apart: self.state_apart.load(Ordering::Relaxed),
        }
    }

    /// Counts a client that has just logged in to the pool.
    pub fn count_login(&self) {
        self.client_logins.fetch_add(1, Ordering::Relaxed);
    }

    /// A server was put into a client's state; `apart`: by a round trip of its own.
    pub fn count_state_applied(&self, apart: bool) {
        self.state_applied.fetch_add(1, Ordering::Relaxed);
        if apart {
            self.state_apart.fetch_add(1, Ordering::Relaxed);
        }
    }

    pub fn add_pipelined(&self, n: u64) {
        self.pipelined.fetch_add(n, Ordering::Relaxed);
    }

    pub fn add_prepared(&self, prepared: &PreparedCounts) {
        self.add(&Delta {
            prepared: *prepared,
            ..Delta::default()
        });
    }
}

/// Upper bounds (microseconds, inclusive) of the latency histogram buckets; one more
/// bucket counts everything slower. Fixed, so an observation is one atomic add.
pub const LATENCY_BOUNDS_US: [u64; 16] = [
    100, 250, 500, 1_000, 2_500, 5_000, 10_000, 25_000, 50_000, 100_000, 250_000, 500_000,
    1_000_000, 2_500_000, 5_000_000, 10_000_000,
];
pub const LATENCY_BUCKETS: usize = LATENCY_BOUNDS_US.len() + 1;

/// A fixed-bucket latency histogram. Each bucket counts only its own observations (not
/// cumulative); the sum is the matching time counter (`xact_time_us`, `query_time_us`).
#[derive(Debug, Default)]
pub struct Histogram {
    buckets: [AtomicU64; LATENCY_BUCKETS],
}

impl Histogram {
    pub fn observe(&self, micros: u64) {
        let i = LATENCY_BOUNDS_US.partition_point(|&b| b < micros);
        self.buckets[i].fetch_add(1, Ordering::Relaxed);
    }

    pub fn read(&self) -> [u64; LATENCY_BUCKETS] {
        std::array::from_fn(|i| self.buckets[i].load(Ordering::Relaxed))
    }
}

// ---- Process-wide events, for the metrics endpoint ----

/// Who produced an error a client received.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum ErrorSource {
    /// Weir itself (refused logins, timeouts, protocol violations, console errors).
    Pooler = 0,
    /// A server, relayed to its client.
    Server = 1,
}

/// SQLSTATE classes are two characters of [0-9A-Z]: 36 * 36 counters per source.
const CLASSES: usize = 36 * 36;
static ERRORS: [[AtomicU64; CLASSES]; 2] = [const { [const { AtomicU64::new(0) }; CLASSES] }; 2];

fn class_index(code: &[u8]) -> usize {
    let digit = |c: u8| match c.to_ascii_uppercase() {
        c @ b'0'..=b'9' => (c - b'0') as usize,
        c @ b'A'..=b'Z' => (c - b'A') as usize + 10,
        _ => 35,
    };
    match code {
        [a, b, ..] => digit(*a) * 36 + digit(*b),
        // A code too short to have a class: XX, internal error.
        _ => 33 * 36 + 33,
    }
}

fn class_name(i: usize) -> String {
    let c = |d: usize| {
        char::from_digit(d as u32, 36)
            .unwrap_or('X')
            .to_ascii_uppercase()
    };
    format!("{}{}", c(i / 36), c(i % 36))
}

/// Errors sent to clients so far, by source and SQLSTATE class (e.g. "08"); only classes
/// seen at least once.
pub fn error_counts() -> Vec<(ErrorSource, String, u64)> {
    let mut out = Vec::new();
    for (src, table) in [ErrorSource::Pooler, ErrorSource::Server]
        .into_iter()
        .zip(&ERRORS)
    {
        for (i, n) in table.iter().enumerate() {
            let n = n.load(Ordering::Relaxed);
            if n > 0 {
                out.push((src, class_name(i), n));
            }
        }
    }
    out
}

/// An error a client received, kept for the dashboard.
#[derive(Debug, Clone)]
pub struct RecentError {
    pub at_micros: u64,
    pub source: ErrorSource,
    pub severity: String,
    pub code: String,
    pub message: String,
    pub database: Option<String>,
}

const RECENT_ERRORS: usize = 50;
/// Set when the HTTP endpoint runs: only then are recent errors kept (their text costs an
/// allocation; counting costs one atomic add).
pub static KEEP_RECENT_ERRORS: std::sync::atomic::AtomicBool =
    std::sync::atomic::AtomicBool::new(false);
static RECENT: std::sync::Mutex<std::collections::VecDeque<RecentError>> =
    std::sync::Mutex::new(std::collections::VecDeque::new());

fn keep_recent(make: impl FnOnce() -> RecentError) {
    if !KEEP_RECENT_ERRORS.load(Ordering::Relaxed) {
        return;
    }
    // Never wait for the lock on the data path: under a storm of errors, losing a few
    // from the recent list is fine.
    if let Ok(mut list) = RECENT.try_lock() {
        if list.len() >= RECENT_ERRORS {
            list.pop_front();
        }
        list.push_back(make());
    }
}

/// The last errors clients received, oldest first.
pub fn recent_errors() -> Vec<RecentError> {
    RECENT
        .lock()
        .unwrap_or_else(|p| p.into_inner())
        .iter()
        .cloned()
        .collect()
}

/// Counts an error Weir sends a client (called by the ErrorResponse builder).
/// An ErrorResponse Weir itself sends a client, counted (SHOW STATS, /metrics).
pub fn error_response(err: &crate::protocol::PgError) -> bytes::BytesMut {
    pooler_error(err);
    crate::protocol::messages::error_response(err)
}

pub fn pooler_error(err: &crate::protocol::PgError) {
    ERRORS[0][class_index(err.code.as_bytes())].fetch_add(1, Ordering::Relaxed);
    keep_recent(|| RecentError {
        at_micros: crate::registry::now_micros(),
        source: ErrorSource::Pooler,
        severity: err.severity.clone(),
        code: err.code.clone(),
        message: err.message.clone(),
        database: None,
    });
}

/// Counts an ErrorResponse a server sends a client; `fields` is as much of its body as
/// has arrived (the SQLSTATE comes early).
pub fn server_error(fields: &[u8], database: &str) {
    let code = crate::protocol::error_code(fields).unwrap_or(b"XX000");
    ERRORS[1][class_index(code)].fetch_add(1, Ordering::Relaxed);
    keep_recent(|| {
        let e = crate::protocol::PgError::parse(fields).into_fields();
        RecentError {
            at_micros: crate::registry::now_micros(),
            source: ErrorSource::Server,
            severity: e.severity,
            code: e.code,
            message: e.message,
            database: Some(database.to_owned()),
        }
    });
}

static RELOADS_OK: AtomicU64 = AtomicU64::new(0);
static RELOADS_FAILED: AtomicU64 = AtomicU64::new(0);
static LAST_RELOAD_MICROS: AtomicU64 = AtomicU64::new(0);

/// Counts a configuration reload (SIGHUP or RELOAD).
pub fn config_reloaded(ok: bool) {
    if ok { &RELOADS_OK } else { &RELOADS_FAILED }.fetch_add(1, Ordering::Relaxed);
    if ok {
        LAST_RELOAD_MICROS.store(crate::registry::now_micros(), Ordering::Relaxed);
    }
}

/// (successful reloads, failed reloads, time of the last successful one or 0).
pub fn reloads() -> (u64, u64, u64) {
    (
        RELOADS_OK.load(Ordering::Relaxed),
        RELOADS_FAILED.load(Ordering::Relaxed),
        LAST_RELOAD_MICROS.load(Ordering::Relaxed),
    )
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn histogram_buckets_are_inclusive_upper_bounds() {
        let h = Histogram::default();
        h.observe(0);
        h.observe(100);
        h.observe(101);
        h.observe(10_000_001);
        let b = h.read();
        assert_eq!(b[0], 2);
        assert_eq!(b[1], 1);
        assert_eq!(b[LATENCY_BUCKETS - 1], 1);
        assert_eq!(b.iter().sum::<u64>(), 4);
    }

    #[test]
    fn sqlstate_classes() {
        assert_eq!(class_name(class_index(b"08P01")), "08");
        assert_eq!(class_name(class_index(b"57014")), "57");
        assert_eq!(class_name(class_index(b"XX000")), "XX");
        assert_eq!(class_name(class_index(b"3D000")), "3D");
        assert_eq!(class_name(class_index(b"")), "XX");
        let before = ERRORS[1][class_index(b"23")].load(Ordering::Relaxed);
        server_error(b"SERROR\0VERROR\0C23505\0Mduplicate key\0\0", "db");
        assert_eq!(
            ERRORS[1][class_index(b"23")].load(Ordering::Relaxed),
            before + 1
        );
    }

    #[test]
    fn add_and_read() {
        let c = Counters::default();
        let d = Delta::from(Traffic {
            xacts: 2,
            queries: 3,
            sent: 10,
            ..Traffic::default()
        });
        c.add(&d);
        c.add(&d);
        assert_eq!(c.read().queries, 6);
        assert_eq!(c.read().sent, 20);
        assert_ne!(c.read(), Delta::default());
    }
}
