//! Console sessions, listed by SHOW CLIENTS (as PgBouncer lists its admin pool's clients)
//! and reachable by KILL_CLIENT.

use crate::stream::Endpoint;
use std::sync::atomic::{AtomicU64, Ordering};
use std::sync::{Arc, LazyLock, OnceLock};

use tokio_util::sync::CancellationToken;

use crate::registry::{now_micros, Registry};

pub struct AdminSession {
    /// Also the pid of the BackendKeyData the session was given.
    pub id: u32,
    /// SHOW CLIENTS `id` (see `registry::next_id`).
    pub serial: u64,
    pub user: String,
    pub peer: Endpoint,
    pub local: Endpoint,
    pub application_name: String,
    pub connect_time: u64,
    request_time: AtomicU64,
    kill: CancellationToken,
    kill_reason: OnceLock<&'static str>,
}

impl AdminSession {
    pub fn request_time(&self) -> u64 {
        self.request_time.load(Ordering::Relaxed)
    }

    pub fn touch(&self) {
        self.request_time.store(now_micros(), Ordering::Relaxed);
    }

    pub fn kill(&self, reason: &'static str) {
        let _ = self.kill_reason.set(reason);
        self.kill.cancel();
    }

    pub async fn killed(&self) -> &'static str {
        self.kill.cancelled().await;
        self.kill_reason
            .get()
            .copied()
            .unwrap_or("admin forced disconnect")
    }
}

static SESSIONS: LazyLock<Registry<u32, AdminSession>> = LazyLock::new(Registry::new);

/// A session's registration; dropping it removes the session.
pub struct SessionHandle(pub Arc<AdminSession>);

impl SessionHandle {
    pub fn register(
        user: &str,
        peer: Endpoint,
        local: Endpoint,
        application_name: &str,
    ) -> SessionHandle {
        let now = now_micros();
        SessionHandle(SESSIONS.insert_with(
            // Not a pid a client has: a cancel key must name one connection.
            // (Only this side checks: registering a client looking here too would take
            // the two locks in the other order.)
            || loop {
                let id = rand::random::<u32>() & 0x7fff_ffff | 1;
                if crate::registry::clients::CLIENTS.get(id).is_none() {
                    break id;
                }
            },
            |id| AdminSession {
                id,
                serial: crate::registry::next_id(),
                user: user.to_owned(),
                peer,
                local,
                application_name: application_name.to_owned(),
                connect_time: now,
                request_time: AtomicU64::new(now),
                kill: CancellationToken::new(),
                kill_reason: OnceLock::new(),
            },
        ))
    }
}

impl Drop for SessionHandle {
    fn drop(&mut self) {
        crate::registry::client_limits::leave(super::show::ADMIN_DB, &self.0.user);
        SESSIONS.remove(self.0.id);
    }
}

pub fn count() -> usize {
    SESSIONS.snapshot().len()
}

pub fn all() -> Vec<Arc<AdminSession>> {
    let mut v = SESSIONS.snapshot();
    v.sort_by_key(|s| (s.connect_time, s.id));
    v
}

/// The console's own traffic, which PgBouncer counts on its `pgbouncer` database (SHOW
/// STATS, TOTALS): a login per session, a transaction and a query per command message.
static LOGINS: AtomicU64 = AtomicU64::new(0);
static COMMANDS: AtomicU64 = AtomicU64::new(0);

pub fn count_login() {
    LOGINS.fetch_add(1, Ordering::Relaxed);
}

pub fn count_command() {
    COMMANDS.fetch_add(1, Ordering::Relaxed);
}

pub fn console_stats() -> crate::stats::Delta {
    let mut d = crate::stats::Delta {
        client_logins: LOGINS.load(Ordering::Relaxed),
        ..Default::default()
    };
    let commands = COMMANDS.load(Ordering::Relaxed);
    d.xacts = commands;
    d.queries = commands;
    d
}
