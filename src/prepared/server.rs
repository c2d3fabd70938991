//! The statements one server connection holds under Weir's names.

use std::collections::HashMap;
use std::sync::Arc;

use super::defs::Def;

/// Statement id -> (when it was last used, the statement, the hash of its description
/// when Weir saw one from this server: see `check`); the least recently used is
/// closed when a new one would exceed max_prepared_statements. A linear search for it is
/// cheaper than keeping an order on every use: it runs only when the cache is full and a
/// statement the server lacks is needed. Holding the statement keeps it interned while
/// no client has it (clients that reconnect for every transaction find the same one, and
/// the server need not prepare it again).
#[derive(Debug, Default)]
pub struct ServerStatements {
    used: HashMap<u64, (u64, Arc<Def>, Option<u64>)>,
    tick: u64,
}

impl ServerStatements {
    /// True when the server holds the statement; marks it used.
    pub fn touch(&mut self, id: u64) -> bool {
        self.tick += 1;
        match self.used.get_mut(&id) {
            Some((t, ..)) => {
                *t = self.tick;
                true
            }
            None => false,
        }
    }

    /// True when the server holds the statement (not counted as a use).
    pub fn holds(&self, id: u64) -> bool {
        self.used.contains_key(&id)
    }

    pub fn insert(&mut self, def: &Arc<Def>) {
        self.tick += 1;
        self.used.insert(def.id, (self.tick, def.clone(), None));
    }

    /// The hash of the statement's description on this server, if Weir saw it.
    pub fn described(&self, id: u64) -> Option<u64> {
        self.used.get(&id).and_then(|e| e.2)
    }

    pub fn set_described(&mut self, id: u64, hash: u64) {
        if let Some(e) = self.used.get_mut(&id) {
            e.2 = Some(hash);
        }
    }

    pub fn remove(&mut self, id: u64) {
        self.used.remove(&id);
    }

    /// Removes the statement and gives it back, if the server holds it.
    pub fn take(&mut self, id: u64) -> Option<Arc<Def>> {
        self.used.remove(&id).map(|(_, def, _)| def)
    }

    /// The statement to close before one more may be prepared within `cap`, if any.
    pub fn evict(&mut self, cap: usize) -> Option<Arc<Def>> {
        self.evict_except(cap, &[])
    }

    /// As `evict`, never taking one of `keep`; None when only those are left.
    pub fn evict_except(&mut self, cap: usize, keep: &[u64]) -> Option<Arc<Def>> {
        if self.used.len() < cap.max(1) {
            return None;
        }
        let candidates = self.used.iter().filter(|(id, _)| !keep.contains(id));
        let (&id, _) = candidates.min_by_key(|(_, (t, ..))| *t)?;
        self.used.remove(&id).map(|(_, def, _)| def)
    }

    pub fn len(&self) -> usize {
        self.used.len()
    }

    pub fn clear(&mut self) {
        self.used = HashMap::new();
    }

    /// Keeps the statements of `other` too (what a failed DEALLOCATE ALL left in place).
    pub fn absorb(&mut self, other: ServerStatements) {
        for (id, entry) in other.used {
            self.used.entry(id).or_insert(entry);
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::prepared::defs::intern;

    #[test]
    fn evicts_the_least_recently_used() {
        let (a, b) = (
            intern(b"select 'lru a'\0\0\0"),
            intern(b"select 'lru b'\0\0\0"),
        );
        let mut s = ServerStatements::default();
        s.insert(&a);
        s.insert(&b);
        assert!(s.evict(3).is_none());
        assert!(s.touch(a.id));
        assert_eq!(s.evict(2).map(|d| d.id), Some(b.id));
        assert!(!s.touch(b.id));
        assert_eq!(s.used.len(), 1);
    }
}
