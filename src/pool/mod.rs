//! A pool of server connections for one (database, user) pair.
//!
//! The pool's mutex is taken once to check out and once to check in, never across an
//! await. A released server goes straight to the longest waiter (FIFO), so waiters are never
//! overtaken and never stampede. A lent server is wrapped in a `Lease` whose drop gives the
//! slot back, so no path (error, panic, client gone) can leak a slot.

mod lease;

use std::collections::VecDeque;
use std::sync::atomic::{AtomicUsize, Ordering};
use std::sync::{Arc, Mutex, MutexGuard};
use std::time::{Duration, Instant};

use arc_swap::ArcSwap;
use tokio::sync::oneshot;

use crate::params::ParamSet;
use crate::protocol::PgError;
use crate::server::{self, ScramCredential, ServerConn, ServerTarget};
use crate::stats::Counters;
pub use lease::Lease;
pub use weir_config::PoolMode;

/// How a pool behaves; replaced whole on reload.
#[derive(Debug, Clone)]
pub struct PoolSettings {
    pub pool_size: usize,
    pub target: ServerTarget,
    pub query_wait_timeout: Duration,
    pub server_lifetime: Duration,
    pub server_idle_timeout: Duration,
    pub server_login_retry: Duration,
    pub server_reset_query: String,
    pub server_reset_query_always: bool,
    pub round_robin: bool,
}

enum Grant {
    Server(ServerConn),
    /// A slot is yours: open a new connection in it.
    Connect,
}

#[derive(Default)]
struct PoolState {
    idle: VecDeque<ServerConn>,
    /// Servers open, lent or being connected: what counts against pool_size.
    total: usize,
    /// Slots being connected (counted in `total` too).
    connecting: usize,
    waiters: VecDeque<(Instant, oneshot::Sender<Grant>)>,
    welcome: Option<Arc<ParamSet>>,
    last_login_failure: Option<(Instant, PgError)>,
}

pub struct Pool {
    pub database: String,
    pub user: String,
    pub stats: Counters,
    /// Logged-in clients of this pool.
    pub clients: AtomicUsize,
    settings: ArcSwap<PoolSettings>,
    state: Mutex<PoolState>,
}

impl Pool {
    pub fn new(database: String, user: String, settings: PoolSettings) -> Arc<Pool> {
        Arc::new(Pool {
            database,
            user,
            settings: ArcSwap::from_pointee(settings),
            stats: Counters::default(),
            clients: AtomicUsize::new(0),
            state: Mutex::new(PoolState::default()),
        })
    }

    pub fn settings(&self) -> arc_swap::Guard<Arc<PoolSettings>> {
        self.settings.load()
    }

    /// Applies reloaded settings: new connections use them; a waiter gets a slot at once if
    /// the pool grew.
    pub fn update_settings(&self, settings: PoolSettings) {
        let generation = settings.target.generation;
        self.settings.store(Arc::new(settings));
        let mut st = self.lock();
        let (keep, stale): (VecDeque<_>, VecDeque<_>) =
            st.idle.drain(..).partition(|s| s.generation == generation);
        st.idle = keep;
        st.total -= stale.len();
        for s in stale {
            tokio::spawn(s.terminate());
        }
        self.grant_free_slots(&mut st);
    }

    fn lock(&self) -> MutexGuard<'_, PoolState> {
        // A panic while holding this lock cannot leave the state half-updated in a way that
        // matters more than stopping the whole pooler would.
        self.state.lock().unwrap_or_else(|p| p.into_inner())
    }

    /// The parameters a new client is shown, from the first server this pool opened.
    pub fn welcome(&self) -> Option<Arc<ParamSet>> {
        self.lock().welcome.clone()
    }

    /// Lends a server: an idle one, a new one if the pool has room, or the next one released
    /// if the client waits its turn.
    pub async fn checkout(
        self: &Arc<Self>,
        scram: Option<ScramCredential>,
    ) -> Result<Lease, PgError> {
        let started = Instant::now();
        loop {
            let settings = self.settings();
            let grant = {
                let mut st = self.lock();
                match self.take_idle(&mut st, &settings) {
                    Some(s) => Ok(Grant::Server(s)),
                    None if st.total < settings.pool_size => {
                        st.total += 1;
                        Ok(Grant::Connect)
                    }
                    None => {
                        let (tx, rx) = oneshot::channel();
                        st.waiters.push_back((Instant::now(), tx));
                        Err(rx)
                    }
                }
            };
            let grant = match grant {
                Ok(g) => g,
                Err(rx) => {
                    let left = settings
                        .query_wait_timeout
                        .saturating_sub(started.elapsed());
                    match self
                        .wait(rx, left, settings.query_wait_timeout.is_zero())
                        .await
                    {
                        Some(g) => g,
                        None => return Err(PgError::fatal("08P01", "query_wait_timeout")),
                    }
                }
            };
            match grant {
                Grant::Server(s) => {
                    if s.is_healthy() {
                        return Ok(Lease::new(s, self.clone()));
                    }
                    tracing::info!(server = ?s, "closing server connection found dead in the pool");
                    self.forget();
                }
                Grant::Connect => return self.connect(&settings, scram).await,
            }
        }
    }

    async fn wait(
        self: &Arc<Self>,
        rx: oneshot::Receiver<Grant>,
        left: Duration,
        forever: bool,
    ) -> Option<Grant> {
        let mut waiting = lease::Waiting::new(self.clone(), rx);
        if forever {
            return waiting.rx().await.ok();
        }
        match tokio::time::timeout(left, waiting.rx()).await {
            Ok(r) => r.ok(),
            Err(_) => waiting.take_late_grant(),
        }
    }

    async fn connect(
        self: &Arc<Self>,
        settings: &PoolSettings,
        scram: Option<ScramCredential>,
    ) -> Result<Lease, PgError> {
        let slot = lease::Slot::new(self.clone());
        if let Some((at, err)) = &self.lock().last_login_failure {
            if at.elapsed() < settings.server_login_retry {
                return Err(err.clone());
            }
        }
        match server::connect(&settings.target, scram).await {
            Ok(conn) => {
                let mut st = self.lock();
                st.last_login_failure = None;
                if st.welcome.is_none() {
                    st.welcome = Some(Arc::new(conn.params.clone()));
                }
                drop(st);
                tracing::debug!(server = ?conn, db = %self.database, user = %self.user, "new server connection");
                Ok(slot.fill(conn))
            }
            Err(e) => {
                let err = e.to_client_error();
                tracing::warn!(db = %self.database, user = %self.user, addr = %settings.target.addr, "server login failed: {e}");
                self.lock().last_login_failure = Some((Instant::now(), err.clone()));
                Err(err)
            }
        }
    }

    fn take_idle(&self, st: &mut PoolState, settings: &PoolSettings) -> Option<ServerConn> {
        loop {
            let s = if settings.round_robin {
                st.idle.pop_front()
            } else {
                st.idle.pop_back()
            }?;
            if self.expired(&s, settings) {
                st.total -= 1;
                tokio::spawn(s.terminate());
                continue;
            }
            return Some(s);
        }
    }

    fn expired(&self, s: &ServerConn, settings: &PoolSettings) -> bool {
        s.generation != settings.target.generation
            || (!settings.server_lifetime.is_zero()
                && s.created.elapsed() >= settings.server_lifetime)
            || (!settings.server_idle_timeout.is_zero()
                && s.idle_since.elapsed() >= settings.server_idle_timeout)
    }

    /// Takes back a clean server: the longest waiter gets it, else it goes idle.
    fn checkin(&self, mut conn: ServerConn) {
        let settings = self.settings();
        let mut st = self.lock();
        if self.expired(&conn, &settings) || st.total > settings.pool_size && st.waiters.is_empty()
        {
            st.total -= 1;
            self.grant_free_slots(&mut st);
            drop(st);
            tokio::spawn(conn.terminate());
            return;
        }
        while let Some((_, w)) = st.waiters.pop_front() {
            match w.send(Grant::Server(conn)) {
                Ok(()) => return,
                Err(Grant::Server(c)) => conn = c,
                Err(Grant::Connect) => return,
            }
        }
        conn.idle_since = Instant::now();
        st.idle.push_back(conn);
    }

    /// A lent or granted slot is gone (its server closed, or its connect failed).
    fn forget(&self) {
        let mut st = self.lock();
        st.total -= 1;
        self.grant_free_slots(&mut st);
    }

    fn grant_free_slots(&self, st: &mut PoolState) {
        let size = self.settings.load().pool_size;
        while st.total < size {
            let Some((_, w)) = st.waiters.pop_front() else {
                break;
            };
            if w.send(Grant::Connect).is_ok() {
                st.total += 1;
            }
        }
    }

    /// What SHOW POOLS reports.
    pub fn counts(&self) -> PoolCounts {
        let st = self.lock();
        let mut waiting = 0;
        let mut oldest: Option<Instant> = None;
        for (t, w) in &st.waiters {
            if !w.is_closed() {
                waiting += 1;
                oldest = Some(oldest.map_or(*t, |o| o.min(*t)));
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
