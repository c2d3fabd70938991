//! The TLS sessions of clients (SHOW CLIENTS tls, the login log line), kept apart from
//! `ClientInfo`: most clients are plain, and every idle client pays for ClientInfo's
//! size. A TLS client already holds tens of KB of session state; its entry here is a
//! few dozen bytes more.

use std::collections::HashMap;
use std::sync::{Arc, LazyLock, Mutex, Weak};

use super::clients::ClientInfo;

struct Table {
    /// Cancel pid -> the client (to tell a live entry from one left by a client gone
    /// since) and its session's description.
    entries: HashMap<u32, (Weak<ClientInfo>, Box<str>)>,
    /// Entries of clients that have gone are dropped when the table reaches this size,
    /// so it never holds more than about twice the TLS clients there are, and a client
    /// that leaves costs no lock.
    prune_at: usize,
}

static TABLE: LazyLock<Mutex<Table>> = LazyLock::new(|| {
    Mutex::new(Table {
        entries: HashMap::new(),
        prune_at: 64,
    })
});

fn table() -> std::sync::MutexGuard<'static, Table> {
    TABLE.lock().unwrap_or_else(|e| e.into_inner())
}

pub fn set(client: &Arc<ClientInfo>, tls: String) {
    let mut t = table();
    if t.entries.len() >= t.prune_at {
        t.entries.retain(|_, (c, _)| c.strong_count() > 0);
        t.prune_at = (t.entries.len() * 2).max(64);
    }
    t.entries
        .insert(client.key.pid, (Arc::downgrade(client), tls.into()));
}

/// The client's TLS session, empty when it is in the clear.
pub fn get(client: &Arc<ClientInfo>) -> String {
    let t = table();
    match t.entries.get(&client.key.pid) {
        Some((c, tls)) if std::ptr::eq(c.as_ptr(), Arc::as_ptr(client)) => tls.to_string(),
        _ => String::new(),
    }
}

/// Clients connected over TLS now (entries of clients gone since are not counted).
pub fn count() -> usize {
    table()
        .entries
        .values()
        .filter(|(c, _)| c.strong_count() > 0)
        .count()
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::registry::clients::ClientHandle;
    use crate::stream::Endpoint;

    #[test]
    fn entries_belong_to_their_client_and_go_with_it() {
        let a = ClientHandle::register("tls-u", "tls-d", Endpoint::Unix, Endpoint::Unix, "", false);
        let b = ClientHandle::register("tls-u", "tls-d", Endpoint::Unix, Endpoint::Unix, "", false);
        set(&a.0, "TLSv1.3/x".into());
        assert_eq!(get(&a.0), "TLSv1.3/x");
        assert_eq!(get(&b.0), "");
        let pid = a.0.key.pid;
        drop(a);
        for _ in 0..200 {
            let c =
                ClientHandle::register("tls-u", "tls-d", Endpoint::Unix, Endpoint::Unix, "", false);
            set(&c.0, "t".into());
        }
        let t = table();
        assert!(t.entries.len() < 200, "{}", t.entries.len());
        assert!(t
            .entries
            .get(&pid)
            .is_none_or(|(c, _)| c.strong_count() == 0));
    }
}
