//! Who is connected right now: every logged-in client and every server connection, with
//! the little each one publishes about itself (state, times, link), for cancel requests and
//! the admin console. Entries live exactly as long as their connection.

pub mod client_limits;
pub mod client_tls;
pub mod clients;
pub mod handover;
pub mod keys;
pub mod servers;

use std::collections::HashMap;
use std::hash::Hash;
use std::sync::{Arc, Mutex, MutexGuard};
use std::time::{SystemTime, UNIX_EPOCH};

/// A map of live entries. Touched at connect and disconnect only, never per query.
pub struct Registry<K, T> {
    map: Mutex<HashMap<K, Arc<T>>>,
}

impl<K: Eq + Hash + Copy, T> Registry<K, T> {
    pub fn new() -> Self {
        Registry {
            map: Mutex::new(HashMap::new()),
        }
    }

    fn lock(&self) -> MutexGuard<'_, HashMap<K, Arc<T>>> {
        self.map.lock().unwrap_or_else(|p| p.into_inner())
    }

    pub fn get(&self, key: K) -> Option<Arc<T>> {
        self.lock().get(&key).cloned()
    }

    /// Inserts under a key `make_key` draws until one is free.
    pub fn insert_with(
        &self,
        mut make_key: impl FnMut() -> K,
        make: impl FnOnce(K) -> T,
    ) -> Arc<T> {
        let mut map = self.lock();
        let key = loop {
            let k = make_key();
            if !map.contains_key(&k) {
                break k;
            }
        };
        let entry = Arc::new(make(key));
        map.insert(key, entry.clone());
        entry
    }

    /// Inserts under `key` when it is free, else under a key `make_key` draws.
    pub fn insert_at_or_with(
        &self,
        key: K,
        make_key: impl FnMut() -> K,
        make: impl FnOnce(K) -> T,
    ) -> Arc<T> {
        let mut map = self.lock();
        if map.contains_key(&key) {
            drop(map);
            return self.insert_with(make_key, make);
        }
        let entry = Arc::new(make(key));
        map.insert(key, entry.clone());
        entry
    }

    pub fn remove(&self, key: K) {
        self.lock().remove(&key);
    }

    /// Visits every entry under the lock: for a quick look at each, without copying.
    pub fn for_each(&self, mut f: impl FnMut(&T)) {
        for v in self.lock().values() {
            f(v);
        }
    }

    /// A copy of every entry, for listing without holding the lock.
    pub fn snapshot(&self) -> Vec<Arc<T>> {
        self.lock().values().cloned().collect()
    }
}

impl<K: Eq + Hash + Copy, T> Default for Registry<K, T> {
    fn default() -> Self {
        Self::new()
    }
}

/// Microseconds since the epoch, 0 meaning "never": what the admin console shows as times.
/// SHOW CLIENTS/SERVERS/SOCKETS `id`: one sequence for clients, console sessions and
/// servers alike, as PgBouncer numbers its sockets, so that an id names one of them.
static NEXT_ID: std::sync::atomic::AtomicU64 = std::sync::atomic::AtomicU64::new(1);

pub fn next_id() -> u64 {
    NEXT_ID.fetch_add(1, std::sync::atomic::Ordering::Relaxed)
}

pub fn now_micros() -> u64 {
    SystemTime::now()
        .duration_since(UNIX_EPOCH)
        .map(|d| d.as_micros() as u64)
        .unwrap_or(0)
}
