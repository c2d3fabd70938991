//! How long a pool has been of no use, for pool_idle_timeout (see crate::idle_pools):
//! PgBouncer frees a pool that has had no client and no server for that long.

use std::sync::atomic::Ordering;
use std::sync::Arc;
use std::time::{Duration, Instant};

use super::Pool;

impl Pool {
    /// Whether nothing is in the pool now: no client logged in or waiting, no server open,
    /// being opened or held for a cancel, and for a split pool, none in its pool of reads.
    /// A pool min_pool_size keeps open is never of no use: it is to have servers, and
    /// whether it has them depends on the server, not on clients (freed while its server
    /// is down, it would open none when the server comes back, and forget its login
    /// backoff meanwhile).
    pub(crate) fn is_unused(&self) -> bool {
        let empty = |p: &Pool| {
            let st = p.lock();
            st.total == 0
                && st.waiters.iter().all(|w| w.tx.is_closed())
                && p.clients.load(Ordering::Relaxed) == 0
                && p.being_canceled.load(Ordering::Relaxed) == 0
        };
        self.settings().min_pool_size == 0
            && empty(self)
            && self.reader.load().as_deref().is_none_or(empty)
    }

    /// Looks at the pool once (the sweep does, every second) and tells how long it has
    /// been of no use by those looks: None while it is in use. PgBouncer's janitor
    /// likewise sees a pool empty only when it looks.
    pub(crate) fn unused_for(&self, now: Instant) -> Option<Duration> {
        let unused = self.is_unused();
        let mut since = self.unused_since.lock().unwrap_or_else(|p| p.into_inner());
        if !unused {
            *since = None;
            return None;
        }
        Some(now.saturating_duration_since(*since.get_or_insert(now)))
    }

    /// Forgets when the pool was last seen unused: the looks stopped for a while
    /// (pool_idle_timeout was 0), and it may have been used in between.
    pub(crate) fn forget_unused(&self) {
        *self.unused_since.lock().unwrap_or_else(|p| p.into_inner()) = None;
    }

    /// Whether nothing but the pools map holds this pool (nor its pool of reads): then no
    /// client, lease, LISTEN hub or check has it, and none can get it without the map's
    /// lock, which the caller holds.
    pub(crate) fn held_only_by_map(self: &Arc<Self>) -> bool {
        // The pool of reads is taken with its own count (a guard of `load` may or may not
        // count): 2 is this pool's and ours.
        Arc::strong_count(self) == 1
            && self
                .reader
                .load_full()
                .is_none_or(|r| Arc::strong_count(&r) == 2)
    }
}
