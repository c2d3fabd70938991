//! Limits shared by several pools: `max_db_connections` (all users of a database) and
//! `max_user_connections` (all databases of a user).

use std::sync::atomic::{AtomicUsize, Ordering};
use std::sync::{Arc, Mutex, Weak};

use super::Pool;

#[derive(Debug, Default)]
pub struct Limit {
    /// 0 means unlimited.
    max: AtomicUsize,
    used: Mutex<usize>,
    members: Mutex<Vec<Weak<Pool>>>,
}

impl Limit {
    pub fn new(max: usize) -> Arc<Limit> {
        Arc::new(Limit {
            max: AtomicUsize::new(max),
            ..Limit::default()
        })
    }

    pub fn set_max(&self, max: usize) {
        self.max.store(max, Ordering::Relaxed);
    }

    pub fn join(&self, pool: &Arc<Pool>) {
        let mut members = self.members.lock().unwrap_or_else(|p| p.into_inner());
        members.retain(|w| w.strong_count() > 0);
        members.push(Arc::downgrade(pool));
    }

    fn try_acquire(&self) -> bool {
        let max = self.max.load(Ordering::Relaxed);
        let mut used = self.used.lock().unwrap_or_else(|p| p.into_inner());
        if max != 0 && *used >= max {
            return false;
        }
        *used += 1;
        true
    }

    /// Whether every unit is taken (never, when unlimited).
    fn is_full(&self) -> bool {
        let max = self.max.load(Ordering::Relaxed);
        max != 0 && *self.used.lock().unwrap_or_else(|p| p.into_inner()) >= max
    }

    fn release_unit(&self) {
        let mut used = self.used.lock().unwrap_or_else(|p| p.into_inner());
        *used = used.saturating_sub(1);
    }

    fn members(&self) -> Vec<Arc<Pool>> {
        self.members
            .lock()
            .unwrap_or_else(|p| p.into_inner())
            .iter()
            .filter_map(Weak::upgrade)
            .collect()
    }
}

/// The shared limits one pool's servers count against.
#[derive(Debug, Clone, Default)]
pub struct Limits {
    pub db: Option<Arc<Limit>>,
    pub user: Option<Arc<Limit>>,
}

impl Limits {
    /// No shared limit applies.
    pub fn is_empty(&self) -> bool {
        self.db.is_none() && self.user.is_none()
    }

    fn all(&self) -> impl Iterator<Item = &Arc<Limit>> {
        self.db.iter().chain(self.user.iter())
    }

    /// Takes one unit of every limit, past its maximum if need be: for a server that exists
    /// already (one moved here by an online restart).
    pub fn acquire_anyway(&self) {
        for l in self.all() {
            *l.used.lock().unwrap_or_else(|p| p.into_inner()) += 1;
        }
    }

    /// Takes one unit of every limit, or none.
    pub fn try_acquire(&self) -> bool {
        let mut taken: Vec<&Arc<Limit>> = Vec::new();
        for l in self.all() {
            if !l.try_acquire() {
                taken.iter().for_each(|t| t.release_unit());
                return false;
            }
            taken.push(l);
        }
        true
    }

    /// Gives a unit back and lets the other pools under these limits use it. Must be called
    /// without any pool's lock held.
    pub fn release(&self) {
        self.return_units();
        for l in self.all() {
            for pool in l.members() {
                pool.grant_free_slots();
            }
        }
    }

    /// Gives units back without waking anyone, for a slot that was taken and not used.
    pub fn return_units(&self) {
        for l in self.all() {
            l.release_unit();
        }
    }

    /// Whether another pool under a reached limit has clients waiting: a server this pool
    /// no longer needs should then be closed to make room for them rather than kept idle.
    /// Must be called without any pool's lock held.
    pub fn others_waiting(&self, except: &Pool) -> bool {
        self.all().filter(|l| l.is_full()).any(|l| {
            l.members()
                .iter()
                .any(|p| !std::ptr::eq(Arc::as_ptr(p), except) && p.starved_by_limit())
        })
    }

    /// Closes an idle server of another pool under these limits, to make room: a pool that
    /// has idle servers while another has waiting clients is the waste the limit would
    /// otherwise cause.
    pub fn evict_idle(&self, except: &Pool) -> bool {
        for l in self.all() {
            for pool in l.members() {
                if !std::ptr::eq(Arc::as_ptr(&pool), except) && pool.close_one_idle() {
                    return true;
                }
            }
        }
        false
    }
}

impl Pool {
    /// Whether clients of this pool wait for a server while the pool itself has room: what
    /// holds them up is a shared limit.
    fn starved_by_limit(&self) -> bool {
        let pool_size = self.settings().pool_size;
        let st = self.lock();
        st.total < pool_size && st.waiters.iter().any(|w| !w.tx.is_closed())
    }

    /// Closes this pool's longest-idle server, for another pool that needs the room.
    fn close_one_idle(&self) -> bool {
        let conn = {
            let mut st = self.lock();
            let Some(c) = st.idle.pop_front() else {
                return false;
            };
            st.total -= 1;
            c
        };
        crate::conn_log::server_closing(&conn.info.0, "evicted");
        self.closed_idle(*conn);
        true
    }
}
