//! max_db_client_connections and max_user_client_connections: how many clients may be
//! logged in per database and per user at once.

use std::collections::HashMap;
use std::sync::{Arc, Mutex};

#[derive(Default)]
pub struct ClientLimits {
    counts: Mutex<HashMap<(Scope, String), usize>>,
}

#[derive(Debug, Clone, Copy, PartialEq, Eq, Hash)]
pub enum Scope {
    Database,
    User,
}

impl ClientLimits {
    /// Counts one more client under `name`, unless `max` (0 = unlimited) is reached.
    pub fn enter(self: &Arc<Self>, scope: Scope, name: &str, max: usize) -> Option<ClientSlot> {
        let mut counts = self.counts.lock().unwrap_or_else(|p| p.into_inner());
        let n = counts.entry((scope, name.to_owned())).or_insert(0);
        if max != 0 && *n >= max {
            return None;
        }
        *n += 1;
        Some(ClientSlot {
            limits: self.clone(),
            key: (scope, name.to_owned()),
        })
    }
}

/// A client counted against a limit until dropped.
pub struct ClientSlot {
    limits: Arc<ClientLimits>,
    key: (Scope, String),
}

impl Drop for ClientSlot {
    fn drop(&mut self) {
        let mut counts = self.limits.counts.lock().unwrap_or_else(|p| p.into_inner());
        if let Some(n) = counts.get_mut(&self.key) {
            *n -= 1;
            if *n == 0 {
                counts.remove(&self.key);
            }
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn counts_and_frees() {
        let l = Arc::new(ClientLimits::default());
        let a = l.enter(Scope::Database, "db", 2);
        let b = l.enter(Scope::Database, "db", 2);
        assert!(a.is_some() && b.is_some());
        assert!(l.enter(Scope::Database, "db", 2).is_none());
        assert!(l.enter(Scope::User, "db", 2).is_some());
        drop(a);
        assert!(l.enter(Scope::Database, "db", 2).is_some());
        assert!(l.enter(Scope::Database, "other", 0).is_some());
    }
}
