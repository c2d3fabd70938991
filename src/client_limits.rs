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
    /// Counts one more client under `name`; Err when `max` is reached. With no limit
    /// (`max` 0) nothing is counted, so logins under no limit take no lock here.
    pub fn enter(
        self: &Arc<Self>,
        scope: Scope,
        name: &str,
        max: usize,
    ) -> Result<Option<ClientSlot>, ()> {
        if max == 0 {
            return Ok(None);
        }
        let mut counts = self.counts.lock().unwrap_or_else(|p| p.into_inner());
        let n = counts.entry((scope, name.to_owned())).or_insert(0);
        if *n >= max {
            return Err(());
        }
        *n += 1;
        Ok(Some(ClientSlot {
            limits: self.clone(),
            key: (scope, name.to_owned()),
        }))
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
        let a = l.enter(Scope::Database, "db", 2).unwrap();
        let b = l.enter(Scope::Database, "db", 2).unwrap();
        assert!(a.is_some() && b.is_some());
        assert!(l.enter(Scope::Database, "db", 2).is_err());
        assert!(l.enter(Scope::User, "db", 2).unwrap().is_some());
        drop(a);
        assert!(l.enter(Scope::Database, "db", 2).unwrap().is_some());
        assert!(l.enter(Scope::Database, "other", 0).unwrap().is_none());
    }
}
