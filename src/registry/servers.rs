//! Open server connections and what each is doing.

use std::sync::atomic::{AtomicU32, AtomicU64, AtomicU8, Ordering};
use std::sync::{Arc, LazyLock, OnceLock};

use super::{now_micros, Registry};
use crate::protocol::startup::Replication;
use crate::stream::Endpoint;
use crate::stream::ServerAddr;

pub static SERVERS: LazyLock<Registry<u64, ServerInfo>> = LazyLock::new(Registry::new);

#[derive(Debug, Clone, Copy, PartialEq, Eq)]
#[repr(u8)]
pub enum ServerState {
    Login = 0,
    Idle = 1,
    Active = 2,
}

#[derive(Debug)]
pub struct ServerInfo {
    pub id: u64,
    pub user: String,
    /// The database name PostgreSQL was asked for.
    pub database: String,
    /// The pooler's name for it (the `[databases]` entry), which log lines name, as
    /// PgBouncer's `S-` prefix does.
    pub pool_database: Box<str>,
    pub addr: ServerAddr,
    pub connect_time: u64,
    remote_pid: AtomicU32,
    state: AtomicU8,
    request_time: AtomicU64,
    /// The client's cancel pid while lent, 0 otherwise.
    client: AtomicU32,
    /// Statements prepared on it under Weir's names, as of the end of its last lend.
    prepared: AtomicU32,
    /// Cancel requests forwarded for it that PostgreSQL has not finished with (see
    /// `cancel::send`): it is not lent to another client meanwhile.
    cancels: AtomicU32,
    /// Our end of the connection (SHOW SERVERS local_addr/local_port), once connected.
    local: OnceLock<Endpoint>,
    /// The TLS session (SHOW SERVERS tls), empty in the clear.
    tls: OnceLock<Box<str>>,
    /// The database entry it was opened for (SHOW HOSTS), once logged in.
    entry: OnceLock<Arc<str>>,
    /// A replication client's own server (protocol::startup::Replication), never pooled.
    replication: AtomicU8,
}

impl ServerInfo {
    pub fn state(&self) -> ServerState {
        match self.state.load(Ordering::Relaxed) {
            1 => ServerState::Idle,
            2 => ServerState::Active,
            _ => ServerState::Login,
        }
    }
    pub fn remote_pid(&self) -> u32 {
        self.remote_pid.load(Ordering::Relaxed)
    }
    pub fn request_time(&self) -> u64 {
        self.request_time.load(Ordering::Relaxed)
    }
    pub fn local(&self) -> Option<&Endpoint> {
        self.local.get()
    }
    pub fn tls(&self) -> &str {
        self.tls.get().map_or("", |t| t)
    }
    pub fn set_tls(&self, tls: String) {
        let _ = self.tls.set(tls.into());
    }
    pub fn entry(&self) -> Option<&str> {
        self.entry.get().map(|e| &**e)
    }
    pub fn set_entry(&self, name: Arc<str>) {
        let _ = self.entry.set(name);
    }
    pub fn set_local(&self, end: Endpoint) {
        let _ = self.local.set(end);
    }
    pub fn client(&self) -> Option<u32> {
        match self.client.load(Ordering::Relaxed) {
            0 => None,
            c => Some(c),
        }
    }
    pub fn set_logged_in(&self, remote_pid: u32) {
        self.remote_pid.store(remote_pid, Ordering::Relaxed);
        self.state.store(ServerState::Idle as u8, Ordering::Relaxed);
    }
    pub fn set_active(&self, client_pid: u32) {
        self.request_time.store(now_micros(), Ordering::Relaxed);
        self.client.store(client_pid, Ordering::Relaxed);
        self.state
            .store(ServerState::Active as u8, Ordering::Relaxed);
    }
    pub fn prepared(&self) -> u32 {
        self.prepared.load(Ordering::Relaxed)
    }
    pub fn set_prepared(&self, n: usize) {
        self.prepared.store(n as u32, Ordering::Relaxed);
    }
    pub fn cancel_started(&self) {
        self.cancels.fetch_add(1, Ordering::AcqRel);
    }
    pub fn cancel_done(&self) {
        self.cancels.fetch_sub(1, Ordering::AcqRel);
    }
    /// A cancel request for it is on its way: PostgreSQL may still interrupt whatever the
    /// server runs next.
    pub fn being_canceled(&self) -> bool {
        self.cancels.load(Ordering::Acquire) != 0
    }
    pub fn replication(&self) -> Replication {
        Replication::from_u8(self.replication.load(Ordering::Relaxed))
    }
    pub fn set_replication(&self, r: Replication) {
        self.replication.store(r as u8, Ordering::Relaxed);
    }
    pub fn set_idle(&self) {
        self.client.store(0, Ordering::Relaxed);
        self.state.store(ServerState::Idle as u8, Ordering::Relaxed);
    }
}

/// A server's registration; dropping it removes the entry.
#[derive(Debug)]
pub struct ServerHandle(pub Arc<ServerInfo>);

impl ServerHandle {
    pub fn register(
        id: u64,
        user: &str,
        (database, pool_database): (&str, &str),
        addr: &ServerAddr,
    ) -> ServerHandle {
        let info = SERVERS.insert_with(
            || id,
            |id| ServerInfo {
                id,
                user: user.to_owned(),
                database: database.to_owned(),
                pool_database: pool_database.into(),
                addr: addr.clone(),
                connect_time: now_micros(),
                remote_pid: AtomicU32::new(0),
                state: AtomicU8::new(ServerState::Login as u8),
                request_time: AtomicU64::new(0),
                client: AtomicU32::new(0),
                prepared: AtomicU32::new(0),
                cancels: AtomicU32::new(0),
                local: OnceLock::new(),
                tls: OnceLock::new(),
                entry: OnceLock::new(),
                replication: AtomicU8::new(0),
            },
        );
        ServerHandle(info)
    }
}

impl Drop for ServerHandle {
    fn drop(&mut self) {
        SERVERS.remove(self.0.id);
    }
}
