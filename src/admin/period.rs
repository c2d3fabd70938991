//! Averages over the stats period, computed as PgBouncer's stats.c does: every
//! `stats_period` each pool's totals are snapshotted; an average is
//! (totals now - totals at the snapshot before the last one) / (time since then), rates per
//! second, times per transaction/query/assignment. The same tick logs the pooler-wide
//! averages when `log_stats` is on.

use std::collections::HashMap;
use std::sync::{Arc, LazyLock, Mutex, MutexGuard, Once};
use std::time::Duration;

use crate::app::App;
use crate::registry::now_micros;
use crate::stats::{Delta, PreparedCounts, Traffic};

struct Snapshots {
    /// When the previous refresh ran (the start of the averaging window).
    old_stamp: u64,
    new_stamp: u64,
    /// Per pool (database, user): totals at the previous and at the last refresh.
    older: HashMap<(String, String), Delta>,
    newer: HashMap<(String, String), Delta>,
}

static SNAPSHOTS: LazyLock<Mutex<Snapshots>> = LazyLock::new(|| {
    let now = now_micros();
    Mutex::new(Snapshots {
        old_stamp: now.saturating_sub(1_000_000),
        new_stamp: now,
        older: HashMap::new(),
        newer: HashMap::new(),
    })
});

fn snapshots() -> MutexGuard<'static, Snapshots> {
    SNAPSHOTS.lock().unwrap_or_else(|p| p.into_inner())
}

static STARTED: Once = Once::new();

/// Starts the stats-period task (once; later calls do nothing). main calls it at startup;
/// the console also calls it on first use so averages exist even if main did not.
pub fn start(app: &Arc<App>) {
    STARTED.call_once(|| {
        LazyLock::force(&SNAPSHOTS);
        let app = app.clone();
        tokio::spawn(async move {
            loop {
                let period = app.snapshot.load().config.general.stats_period;
                let period = if period.is_zero() {
                    Duration::from_secs(60)
                } else {
                    period
                };
                tokio::select! {
                    _ = crate::timers::sleep(period) => {}
                    _ = app.shutdown.cancelled() => return,
                }
                refresh(&app);
            }
        });
    });
}

fn refresh(app: &App) {
    let pools = app.all_pools();
    let mut s = snapshots();
    s.old_stamp = s.new_stamp;
    s.new_stamp = now_micros();
    let mut cur_total = Delta::default();
    let mut old_total = Delta::default();
    for p in &pools {
        let key = (p.database.clone(), p.user.clone());
        let newer = s.newer.get(&key).copied().unwrap_or_default();
        let now = p.stats.read();
        s.older.insert(key.clone(), newer);
        s.newer.insert(key, now);
        add(&mut cur_total, &now);
        add(&mut old_total, &newer);
    }
    // The console's counters, under the key SHOW STATS looks them up by.
    let key = (crate::pool::gates::ADMIN_DB.to_owned(), String::new());
    let newer = s.newer.get(&key).copied().unwrap_or_default();
    s.older.insert(key.clone(), newer);
    s.newer.insert(key, super::sessions::console_stats());
    let window = now_micros().saturating_sub(s.old_stamp);
    drop(s);
    if app.snapshot.load().config.general.log_stats {
        let a = averages(&cur_total, &old_total, window);
        tracing::info!(
            "stats: {} xacts/s, {} queries/s, {} client parses/s, {} server parses/s, {} binds/s, in {} B/s, out {} B/s, xact {} us, query {} us, wait {} us",
            a.xacts, a.queries, a.prepared.client_parses, a.prepared.server_parses, a.prepared.binds, a.received, a.sent, a.xact_time_us, a.query_time_us, a.wait_time_us
        );
    }
}

pub fn add(total: &mut Delta, d: &Delta) {
    total.server_assignments += d.server_assignments;
    total.xacts += d.xacts;
    total.queries += d.queries;
    total.received += d.received;
    total.sent += d.sent;
    total.xact_time_us += d.xact_time_us;
    total.query_time_us += d.query_time_us;
    total.wait_time_us += d.wait_time_us;
    total.client_logins += d.client_logins;
    total.pipelined += d.pipelined;
    total.state_applied += d.state_applied;
    total.state_apart += d.state_apart;
    let (t, d) = (&mut total.prepared, &d.prepared);
    t.client_parses += d.client_parses;
    t.server_parses += d.server_parses;
    t.binds += d.binds;
    t.hits += d.hits;
    t.evictions += d.evictions;
}

/// Drops what was kept of a freed pool (pool_idle_timeout): a pool made later under the
/// same names starts from zero, and its window must too.
pub fn forget(database: &str, user: &str) {
    let key = (database.to_owned(), user.to_owned());
    let mut s = snapshots();
    s.older.remove(&key);
    s.newer.remove(&key);
}

/// The totals of a pool at the start of the current averaging window.
pub fn window_start(database: &str, user: &str) -> Delta {
    snapshots()
        .older
        .get(&(database.to_owned(), user.to_owned()))
        .copied()
        .unwrap_or_default()
}

/// Microseconds from the start of the averaging window to now.
pub fn window_us() -> u64 {
    now_micros().saturating_sub(snapshots().old_stamp)
}

/// PgBouncer's calc_average: counts and bytes per second over `window_us`, times per
/// query, transaction and server assignment.
pub fn averages(cur: &Delta, old: &Delta, window_us: u64) -> Delta {
    if window_us == 0 {
        return Delta::default();
    }
    let per_sec =
        |c: u64, o: u64| (c.saturating_sub(o) as u128 * 1_000_000 / window_us as u128) as u64;
    let per = |c: u64, o: u64, n: u64| c.saturating_sub(o).checked_div(n).unwrap_or(0);
    let queries = cur.queries.saturating_sub(old.queries);
    let xacts = cur.xacts.saturating_sub(old.xacts);
    let assignments = cur
        .server_assignments
        .saturating_sub(old.server_assignments);
    Delta {
        traffic: Traffic {
            server_assignments: per_sec(cur.server_assignments, old.server_assignments),
            xacts: per_sec(cur.xacts, old.xacts),
            queries: per_sec(cur.queries, old.queries),
            received: per_sec(cur.received, old.received),
            sent: per_sec(cur.sent, old.sent),
            xact_time_us: per(cur.xact_time_us, old.xact_time_us, xacts),
            query_time_us: per(cur.query_time_us, old.query_time_us, queries),
            wait_time_us: per(cur.wait_time_us, old.wait_time_us, assignments),
        },
        prepared: PreparedCounts {
            client_parses: per_sec(cur.prepared.client_parses, old.prepared.client_parses),
            server_parses: per_sec(cur.prepared.server_parses, old.prepared.server_parses),
            binds: per_sec(cur.prepared.binds, old.prepared.binds),
            hits: per_sec(cur.prepared.hits, old.prepared.hits),
            evictions: per_sec(cur.prepared.evictions, old.prepared.evictions),
        },
        client_logins: per_sec(cur.client_logins, old.client_logins),
        pipelined: per_sec(cur.pipelined, old.pipelined),
        state_applied: per_sec(cur.state_applied, old.state_applied),
        state_apart: per_sec(cur.state_apart, old.state_apart),
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn averages_like_pgbouncer() {
        let old = Delta::from(Traffic {
            xacts: 10,
            queries: 20,
            xact_time_us: 1000,
            query_time_us: 1000,
            ..Traffic::default()
        });
        let cur = Delta::from(Traffic {
            xacts: 30,
            queries: 60,
            received: 4000,
            xact_time_us: 5000,
            query_time_us: 3000,
            ..Traffic::default()
        });
        let a = averages(&cur, &old, 2_000_000);
        assert_eq!(a.xacts, 10);
        assert_eq!(a.queries, 20);
        assert_eq!(a.received, 2000);
        assert_eq!(a.xact_time_us, 200);
        assert_eq!(a.query_time_us, 50);
        assert_eq!(a.wait_time_us, 0);
        assert_eq!(averages(&cur, &old, 0), Delta::default());
        // Logins are a rate, like transactions: 7 in 2 s is 3 per second (rounded down).
        let logins = |n| Delta {
            client_logins: n,
            ..Delta::default()
        };
        assert_eq!(
            averages(&logins(12), &logins(5), 2_000_000).client_logins,
            3
        );
    }
}
