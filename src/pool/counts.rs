//! What SHOW POOLS reports of a pool, read in one pass under its lock so that the counts
//! agree with one another.

use std::sync::atomic::Ordering;
use std::time::{Duration, Instant};

use super::Pool;

impl Pool {
    /// What SHOW POOLS reports.
    pub fn counts(&self) -> PoolCounts {
        let st = self.lock();
        let mut waiting = 0;
        let mut oldest: Option<Instant> = None;
        for w in &st.waiters {
            if !w.tx.is_closed() {
                waiting += 1;
                oldest = Some(oldest.map_or(w.since, |o| o.min(w.since)));
            }
        }
        PoolCounts {
            active: st.total - st.idle.len() - st.connecting,
            idle: st.idle.len(),
            connecting: st.connecting,
            waiting,
            max_wait: oldest.map(|t| t.elapsed()).unwrap_or_default(),
            clients: self.clients.load(Ordering::Relaxed),
        }
    }
}

#[derive(Debug, Clone, Copy, Default)]
pub struct PoolCounts {
    /// Servers lent to clients.
    pub active: usize,
    pub idle: usize,
    /// Servers logging in.
    pub connecting: usize,
    /// Clients waiting for a server.
    pub waiting: usize,
    /// How long the oldest waiter has waited.
    pub max_wait: Duration,
    /// Logged-in clients.
    pub clients: usize,
}
