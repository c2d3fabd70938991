//! A pool of server connections for one (database, user) pair.
//!
//! The pool's mutex is taken once to check out and once to check in, never across an
//! await. A released server goes straight to the longest waiter (FIFO), so waiters are never
//! overtaken and never stampede. A lent server is wrapped in a `Lease` whose drop gives the
//! slot back, so no path (error, panic, client gone) can leak a slot.

mod ahead;
pub mod gates;
mod janitor;
mod lease;
mod limit;
mod pipeline;
mod retry;

use std::collections::VecDeque;
use std::sync::atomic::{AtomicUsize, Ordering};
use std::sync::{Arc, Mutex, MutexGuard};
use std::time::{Duration, Instant};

use arc_swap::ArcSwap;
use tokio::sync::oneshot;

use crate::protocol::PgError;
use crate::registry::clients::ClientInfo;
use crate::server::welcome::Welcome;
use crate::server::{self, ScramCredential, ServerConn, ServerTarget};

/// Boxed so that a lease, a grant and an idle slot move a pointer, and the futures that
/// hold a lease stay small.
pub type Conn = Box<ServerConn>;
use crate::server::passenger::Grant;
use crate::stats::Counters;
pub use ahead::Ahead;
pub use lease::Lease;
pub use limit::{Limit, Limits};
pub use pipeline::PipelineSettings;
pub use weir_config::PoolMode;

/// How a pool behaves; replaced whole on reload.
#[derive(Debug, Clone)]
pub struct PoolSettings {
    pub pool_size: usize,
    pub reserve_pool_size: usize,
    pub reserve_pool_timeout: Duration,
    pub min_pool_size: usize,
    pub target: ServerTarget,
    pub query_wait_timeout: Duration,
    pub server_lifetime: Duration,
    pub server_idle_timeout: Duration,
    pub server_login_retry: Duration,
    pub server_reset_query: String,
    pub server_reset_query_always: bool,
    /// Run on a server idle for longer than `server_check_delay` before lending it; None
    /// disables the check, an empty query is PgBouncer's `<empty>`.
    pub server_check_query: Option<String>,
    pub server_check_delay: Duration,
    pub round_robin: bool,
    pub limits: Limits,
    /// read_write_split: what the database entry's routing knows (see split); None when
    /// the entry does not split, or the pool mode keeps a server for the whole session.
    pub split: Option<Arc<crate::split::Entry>>,
    /// Pipelined transaction pooling (see pipeline); depth 0 in session mode.
    pub pipeline: PipelineSettings,
}

/// What a client is told when its server went away while running its request: if that
/// request was committing (a COMMIT, or a statement outside a transaction block), the
/// commit may have been done and replicated with only its answer lost (seen in
/// tests/failover_exact.rs), so it must not be told the transaction was rolled back.
pub fn lost_request() -> PgError {
    PgError::error(
        "08006",
        "server connection lost; the transaction was rolled back, unless the lost request was its commit (then whether it committed is unknown)",
    )
}

enum Slot {
    Granted,
    /// The pool is at its size.
    Full,
    /// A shared limit (max_db_connections, max_user_connections) is reached.
    Limited,
    /// The last login failed and its retry delay (see `retry`) has not passed; true when
    /// PostgreSQL turned it away.
    LoginBlocked(PgError, bool),
}

#[derive(Default)]
struct PoolState {
    idle: VecDeque<Conn>,
    /// Servers open, lent or being connected: what counts against pool_size.
    total: usize,
    /// Slots being connected (counted in `total` too).
    connecting: usize,
    waiters: VecDeque<Waiter>,
    welcome: Option<Arc<Welcome>>,
    login: retry::LoginBackoff,
    /// Keys of the last client that logged in with SCRAM, for connections opened with no
    /// client at hand (min_pool_size) when the auth_file has no plaintext password.
    scram: Option<ScramCredential>,
}

struct Waiter {
    since: Instant,
    tx: oneshot::Sender<Grant>,
    ahead: Option<Ahead>,
}

pub struct Pool {
    pub database: String,
    pub user: String,
    pub stats: Counters,
    /// Logged-in clients of this pool.
    pub clients: AtomicUsize,
    /// Of those, the ones pinned to their server (client::state).
    pub pinned: AtomicUsize,
    settings: ArcSwap<PoolSettings>,
    state: Mutex<PoolState>,
    /// With read_write_split: the pool of the same database and user whose servers are on
    /// standbys (set by App); this pool's own go to the primary.
    pub reader: arc_swap::ArcSwapOption<Pool>,
    /// This is such a pool of reads. Not listed in SHOW POOLS, whose rows exporters key by
    /// database and user; its servers are in SHOW SERVERS and SHOW HOSTS.
    pub reads: bool,
    /// A reload removed its database: its clients leave when their transaction ends (in
    /// session mode, when the one in progress ends), as a safe shutdown would have them.
    removed: std::sync::atomic::AtomicBool,
    /// Clients may be waiting (set as one queues, cleared when the queue is seen empty):
    /// lets a busy server's holder skip the lock when there is no one to pipeline.
    queued: std::sync::atomic::AtomicBool,
    /// Servers kept from the pool until the cancel requests sent for them are done
    /// (lease::release; SHOW POOLS sv_being_canceled).
    pub being_canceled: AtomicUsize,
    /// Waiting clients whose request is on a busy server behind another's (pipeline;
    /// SHOW POOLS cl_pipelined), counted down by `Passenger`'s drop.
    pub(crate) aboard: Arc<AtomicUsize>,
    /// By fingerprint, how recently requests ran longer than pipeline_slow_query
    /// (pipeline); made at the first such request.
    slow: std::sync::OnceLock<Box<[std::sync::atomic::AtomicU8]>>,
    /// A holder whose request is all written, with no one queued then: woken when a
    /// client queues, so that its request may still go behind (pipeline).
    pub(crate) boarding: atomic_waker::AtomicWaker,
    /// Passengers whose client asked to cancel (pipeline::HoldBoarding).
    cancels_aboard: AtomicUsize,
}

impl Pool {
    pub fn new(database: String, user: String, settings: PoolSettings) -> Arc<Pool> {
        Pool::with_role(database, user, settings, false)
    }

    /// A pool, or with `reads` the pool of reads of a split database (see `reader`).
    pub fn with_role(
        database: String,
        user: String,
        settings: PoolSettings,
        reads: bool,
    ) -> Arc<Pool> {
        let limits = settings.limits.clone();
        let pool = Arc::new(Pool {
            database,
            user,
            stats: Counters::default(),
            clients: AtomicUsize::new(0),
            pinned: AtomicUsize::new(0),
            settings: ArcSwap::from_pointee(settings),
            state: Mutex::new(PoolState::default()),
            reader: arc_swap::ArcSwapOption::empty(),
            reads,
            removed: std::sync::atomic::AtomicBool::new(false),
            queued: std::sync::atomic::AtomicBool::new(false),
            being_canceled: AtomicUsize::new(0),
            aboard: Arc::new(AtomicUsize::new(0)),
            slow: std::sync::OnceLock::new(),
            boarding: atomic_waker::AtomicWaker::new(),
            cancels_aboard: AtomicUsize::new(0),
        });
        for l in limits.db.iter().chain(limits.user.iter()) {
            l.join(&pool);
        }
        janitor::spawn(&pool);
        pool
    }

    pub fn is_removed(&self) -> bool {
        self.removed.load(std::sync::atomic::Ordering::Relaxed)
    }

    /// A reload removed (or brought back) the pool's database.
    pub fn set_removed(&self, removed: bool) {
        self.removed
            .store(removed, std::sync::atomic::Ordering::Relaxed);
    }

    pub fn settings(&self) -> arc_swap::Guard<Arc<PoolSettings>> {
        self.settings.load()
    }

    /// Applies reloaded settings: new connections use them, idle servers opened under a
    /// different target are closed, so are idle ones over a smaller size (the lent ones
    /// as they come back, see `checkin`), and waiters get slots at once if the pool grew.
    pub fn update_settings(&self, settings: PoolSettings) {
        let generation = settings.target.generation;
        let cap = settings.pool_size + settings.reserve_pool_size;
        self.settings.store(Arc::new(settings));
        let (stale, extra): (Vec<Conn>, Vec<Conn>) = {
            let mut st = self.lock();
            let (keep, stale): (VecDeque<_>, VecDeque<_>) =
                st.idle.drain(..).partition(|s| s.generation == generation);
            st.idle = keep;
            st.total -= stale.len();
            let mut extra = Vec::new();
            while st.total > cap {
                // Longest idle first, as PgBouncer's janitor does.
                let Some(c) = st.idle.pop_front() else { break };
                st.total -= 1;
                extra.push(c);
            }
            (stale.into(), extra)
        };
        for s in stale {
            crate::conn_log::server_closing(&s.info.0, "database configuration changed");
            self.closed_idle(*s);
        }
        for s in extra {
            crate::conn_log::server_closing(&s.info.0, "too many servers in the pool");
            self.closed_idle(*s);
        }
        self.grant_free_slots();
    }

    /// Sets the secret new server connections log in with, when it was learnt at a client's
    /// login (auth_query) rather than from the configuration.
    pub fn learn_secret(&self, secret: &weir_auth::Secret) {
        let current = self.settings();
        if current.target.secret.as_ref() == Some(secret) {
            return;
        }
        let mut next = (**current).clone();
        next.target.secret = Some(secret.clone());
        self.settings.store(Arc::new(next));
    }

    fn lock(&self) -> MutexGuard<'_, PoolState> {
        // A panic while holding this lock cannot leave the state half-updated in a way that
        // matters more than stopping the whole pooler would.
        self.state.lock().unwrap_or_else(|p| p.into_inner())
    }

    /// The parameters a new client is shown, from the first server this pool opened.
    pub fn welcome(&self) -> Option<Arc<Welcome>> {
        self.lock().welcome.clone()
    }

    /// Lends a server: an idle one, a new one if the pool has room, or the next one released
    /// if the client waits its turn. A client still logging in (`for_login`) is told at
    /// once when the server refuses logins; one already in waits, up to query_wait_timeout,
    /// for the retry.
    ///
    /// `ahead` is the client's request, for the task that releases a server to send it
    /// before handing the server over (see `ahead`).
    pub async fn checkout(
        self: &Arc<Self>,
        scram: Option<ScramCredential>,
        for_login: bool,
        mut ahead: Option<Ahead>,
    ) -> Result<Lease, PgError> {
        // PAUSE / SUSPEND from the admin console: wait for RESUME before taking anything.
        gates::wait_resumed(&self.database).await;
        let started = Instant::now();
        let mut reserve = false;
        // Whether the releaser of a server has taken on the request is the client's to
        // know: a waiter whose request is on a server already must wait for that server.
        let client = ahead.as_ref().map(|a| a.client.clone());
        loop {
            let settings = self.settings();
            let mut expired = Vec::new();
            let (step, limited) = {
                let mut st = self.lock();
                match self.take_idle(&mut st, &settings, &mut expired) {
                    Some(s) => (Ok(Grant::Server(s)), false),
                    None => match self.take_slot(&mut st, &settings, reserve) {
                        Slot::Granted => (Ok(Grant::Connect), false),
                        // Turned away, the client is told now: waiting would only bring
                        // it the same refusal at the next retry.
                        Slot::LoginBlocked(e, turned_away) if for_login || turned_away => {
                            return Err(e)
                        }
                        other => {
                            let (tx, rx) = oneshot::channel();
                            let may_board = ahead.is_some();
                            st.waiters.push_back(Waiter {
                                since: Instant::now(),
                                tx,
                                ahead: ahead.take(),
                            });
                            self.queued.store(true, Ordering::Relaxed);
                            (Err((rx, may_board)), matches!(other, Slot::Limited))
                        }
                    },
                }
            };
            for s in expired {
                crate::conn_log::server_closing(&s.info.0, janitor::expiry_reason(&s, &settings));
                self.closed_idle(*s);
            }
            let grant = match step {
                Ok(g) => g,
                Err((rx, may_board)) => {
                    if may_board {
                        self.boarding.wake();
                    }
                    let mut waiting = lease::Waiting::new(self.clone(), rx);
                    if limited && settings.limits.evict_idle(self) {
                        // Room was made: the eviction's release hands it to the first waiter.
                        tracing::debug!(db = %self.database, "closed an idle server of another pool to stay within a shared limit");
                    }
                    let give_up = for_login && !settings.query_wait_timeout.is_zero();
                    match self
                        .wait(
                            &mut waiting,
                            &settings,
                            started,
                            give_up,
                            &mut reserve,
                            client.as_deref(),
                        )
                        .await
                    {
                        Some(g) => g,
                        None => return Err(self.wait_failure()),
                    }
                }
            };
            match grant {
                // Just released by a client and already at work on our request.
                Grant::Server(s) if s.sent_ahead > 0 => return Ok(Lease::new(s, self.clone())),
                Grant::Lost => return Err(lost_request()),
                Grant::Refused(e) => return Err(e),
                Grant::Server(s) => {
                    if let Some(lease) = self.vet(s, &settings).await {
                        return Ok(lease);
                    }
                }
                // Boxed: connecting is rare and its future large.
                Grant::Connect => match Box::pin(self.connect(&settings, scram.clone())).await {
                    Ok(lease) => return Ok(lease),
                    Err((e, turned_away)) if for_login || turned_away => return Err(e),
                    Err(_) => {
                        if !settings.query_wait_timeout.is_zero()
                            && started.elapsed() >= settings.query_wait_timeout
                        {
                            return Err(PgError::fatal("08P01", "query_wait_timeout"));
                        }
                    }
                },
            }
            // Queued again with nothing of its request on a server (it went with the
            // first place in the queue): it is the client's own again.
            if let Some(c) = &client {
                c.reset_handoff();
            }
        }
    }

    /// Counts a server that arrived already lent to its client (moved here by an online
    /// restart), over the pool's size if need be: the client had it before.
    pub fn adopt_lent(self: &Arc<Self>, conn: ServerConn) -> Lease {
        self.lock().total += 1;
        self.settings().limits.acquire_anyway();
        Lease::new(Box::new(conn), self.clone())
    }

    /// The common case, without awaiting: an idle server that needs no check, while
    /// nothing is paused. Anything else (waiting, connecting, checking) is for `checkout`.
    pub fn try_checkout_idle(self: &Arc<Self>) -> Option<Lease> {
        if gates::gates_closed() {
            return None;
        }
        let settings = self.settings();
        let conn = {
            let mut st = self.lock();
            let i = pick_idle(&st.idle, &settings)?;
            let s = &st.idle[i];
            let now = Instant::now();
            let check_due = settings.server_check_query.is_some()
                && now.saturating_duration_since(s.idle_since) >= settings.server_check_delay;
            if check_due || self.expired(s, &settings, now) {
                return None;
            }
            st.idle.remove(i)?
        };
        let lease = Lease::new(conn, self.clone());
        if !lease.is_healthy() {
            crate::conn_log::server_closing(&lease.info.0, "server conn crashed?");
            return None;
        }
        Some(lease)
    }

    /// Keeps the SCRAM keys of a client that logged in, for connections opened with no
    /// client at hand (min_pool_size).
    /// The SCRAM keys learnt from a client, for logins beside the pool's (host checks).
    pub fn scram_keys(&self) -> Option<ScramCredential> {
        self.lock().scram.clone()
    }

    pub fn remember_scram(&self, keys: &ScramCredential) {
        self.lock().scram = Some(keys.clone());
    }

    /// Waits in the queue. Returns None at query_wait_timeout when `give_up` (clients'
    /// waits are timed by the janitor instead). At reserve_pool_timeout a waiter may take a
    /// reserve slot, keeping its place otherwise.
    ///
    /// A waiter whose request a releaser has written to a server (`client` handed: sent
    /// ahead, or pipelined behind another's) gives up nothing: its request runs there,
    /// and taking a reserve slot or leaving would send it to PostgreSQL a second time or
    /// tell the client it failed while it ran.
    async fn wait(
        &self,
        waiting: &mut lease::Waiting,
        settings: &PoolSettings,
        started: Instant,
        give_up: bool,
        reserve: &mut bool,
        client: Option<&ClientInfo>,
    ) -> Option<Grant> {
        loop {
            let give_up = give_up.then(|| started + settings.query_wait_timeout);
            let try_reserve = (settings.reserve_pool_size > 0 && !*reserve)
                .then(|| started + settings.reserve_pool_timeout);
            let wake = match (give_up, try_reserve) {
                (Some(a), Some(b)) => Some(a.min(b)),
                (a, b) => a.or(b),
            };
            let got = match wake {
                None => waiting.rx().await.ok(),
                Some(at) => match crate::timers::timeout_at(at, waiting.rx()).await {
                    Ok(r) => r.ok(),
                    Err(_) => None,
                },
            };
            if got.is_some() {
                return got;
            }
            if try_reserve.is_some_and(|t| Instant::now() >= t) {
                *reserve = true;
                if let Some(g) = self.claim_reserve(waiting, settings, client) {
                    return Some(g);
                }
                continue;
            }
            if give_up.is_some_and(|t| Instant::now() >= t) {
                if client.is_some_and(|c| c.is_handed()) {
                    // Its grant (or news of the server's loss) is on its way.
                    return waiting.rx().await.ok();
                }
                return waiting.take_late_grant();
            }
            // The pool dropped our sender without a grant: should not happen, but waiting
            // again is always safe.
            let (tx, rx) = oneshot::channel();
            self.lock().waiters.push_front(Waiter {
                since: started,
                tx,
                ahead: None,
            });
            *waiting.rx() = rx;
        }
    }

    /// What a client that waited query_wait_timeout is told: why the last server login
    /// failed, if one did, else the timeout itself.
    pub fn wait_failure(&self) -> PgError {
        match self.lock().login.last() {
            Some((_, e)) => e.clone(),
            None => PgError::fatal("08P01", "query_wait_timeout"),
        }
    }

    /// Turns a waiter into the holder of a reserve slot, if one is free and its request is
    /// not on a server already. Under the lock, where releasers send requests ahead and
    /// pipeline them (`Ahead::send`, `board`), so that none can take it on meanwhile.
    fn claim_reserve(
        &self,
        waiting: &mut lease::Waiting,
        settings: &PoolSettings,
        client: Option<&ClientInfo>,
    ) -> Option<Grant> {
        let mut st = self.lock();
        if let Ok(g) = waiting.rx().try_recv() {
            return Some(g);
        }
        if client.is_some_and(|c| c.is_handed()) {
            return None;
        }
        if let Slot::Granted = self.take_slot(&mut st, settings, true) {
            // From here on no releaser may send its request: it runs on the new server.
            if let Some(c) = client {
                c.withdraw();
            }
            waiting.rx().close();
            crate::conn_log::reserve_taken(&self.database, &self.user);
            return Some(Grant::Connect);
        }
        None
    }

    /// Checks a server that sat idle before lending it: it must not have been closed, and
    /// after server_check_delay it must answer server_check_query.
    async fn vet(self: &Arc<Self>, s: Conn, settings: &PoolSettings) -> Option<Lease> {
        let mut lease = Lease::new(s, self.clone());
        if !lease.is_healthy() {
            crate::conn_log::server_closing(&lease.info.0, "server conn crashed?");
            return None;
        }
        if let Some(q) = &settings.server_check_query {
            if lease.idle_since.elapsed() >= settings.server_check_delay {
                if let Err(e) = lease
                    .run_internal_boxed(q, settings.target.connect_timeout)
                    .await
                {
                    crate::conn_log::server_closing(
                        &lease.info.0,
                        &format!("server check query failed: {e}"),
                    );
                    return None;
                }
            }
        }
        Some(lease)
    }

    /// Opens a server in a granted slot. The error says whether PostgreSQL turned the login
    /// away; the clients waiting were then told too.
    async fn connect(
        self: &Arc<Self>,
        settings: &PoolSettings,
        scram: Option<ScramCredential>,
    ) -> Result<Lease, (PgError, bool)> {
        let slot = lease::Slot::new(self.clone());
        let result = server::connect(&settings.target, scram).await;
        let mut st = self.lock();
        match result {
            Ok(conn) => {
                st.login.succeeded();
                if st.welcome.is_none() {
                    st.welcome = Some(Arc::new(Welcome::new(conn.params.clone())));
                }
                drop(st);
                tracing::debug!(server = ?conn, db = %self.database, user = %self.user, "new server connection");
                Ok(slot.fill(conn))
            }
            Err(e) => {
                tracing::warn!(db = %self.database, user = %self.user, addr = %settings.target.addr, "server login failed: {e}");
                let (err, retry) = st.login.failed(&e, settings.server_login_retry);
                let turned_away = st.login.turned_away().is_some();
                if turned_away {
                    self.turn_away(&mut st, &err);
                }
                drop(st);
                // Waiters get their turn again once the retry delay has passed.
                let me = self.clone();
                tokio::spawn(async move {
                    crate::timers::sleep(retry).await;
                    me.grant_free_slots();
                });
                Err((err, turned_away))
            }
        }
    }

    /// Tells every waiter that PostgreSQL turned the pool's login away, rather than keep
    /// it until query_wait_timeout while logins are retried and refused. Only waiters that
    /// still hold their own request are in the queue: one whose request a releaser wrote
    /// to a server (`Ahead::send`, `board`) left it in that step and gets that server.
    fn turn_away(&self, st: &mut PoolState, err: &PgError) {
        let mut kept = VecDeque::new();
        for w in st.waiters.drain(..) {
            if w.tx.is_closed() {
                continue;
            }
            // Withdrawn here, the request can no longer go ahead; a claimed one (which
            // the lock rules out) would be owed its server, so it keeps its place.
            if w.ahead.as_ref().is_some_and(|a| !a.client.withdraw()) {
                kept.push_back(w);
                continue;
            }
            let _ = w.tx.send(Grant::Refused(err.clone()));
        }
        if kept.is_empty() {
            self.queued.store(false, Ordering::Relaxed);
        }
        st.waiters = kept;
    }

    /// What a client logging in is told while it could only be served by a new server and
    /// PostgreSQL turned the pool's last login away (until the retry delay passes): with
    /// the welcome known it would otherwise log in, only for its first request to get the
    /// refusal.
    pub fn turned_away(&self) -> Option<PgError> {
        let pool_size = self.settings().pool_size;
        let st = self.lock();
        let err = st.login.turned_away()?;
        (st.idle.is_empty() && st.total < pool_size).then(|| err.clone())
    }

    /// Pops the next idle server; expired ones met on the way are put in `expired` for the
    /// caller to close once the lock is released.
    fn take_idle(
        &self,
        st: &mut PoolState,
        settings: &PoolSettings,
        expired: &mut Vec<Conn>,
    ) -> Option<Conn> {
        loop {
            let i = pick_idle(&st.idle, settings)?;
            let s = st.idle.remove(i)?;
            if self.expired(&s, settings, Instant::now()) {
                st.total -= 1;
                expired.push(s);
                continue;
            }
            return Some(s);
        }
    }

    /// Reserves a slot for a new connection if pool size, shared limits and the login retry
    /// delay allow.
    fn take_slot(&self, st: &mut PoolState, settings: &PoolSettings, reserve: bool) -> Slot {
        let cap = settings.pool_size
            + if reserve {
                settings.reserve_pool_size
            } else {
                0
            };
        if st.total >= cap {
            return Slot::Full;
        }
        if let Some(err) = st.login.blocked() {
            return Slot::LoginBlocked(err.clone(), st.login.turned_away().is_some());
        }
        if !settings.limits.try_acquire() {
            return Slot::Limited;
        }
        st.total += 1;
        st.connecting += 1;
        Slot::Granted
    }

    fn expired(&self, s: &ServerConn, settings: &PoolSettings, now: Instant) -> bool {
        s.generation != settings.target.generation
            || (!settings.server_lifetime.is_zero()
                && now.saturating_duration_since(s.created) >= settings.server_lifetime)
            || (!settings.server_idle_timeout.is_zero()
                && now.saturating_duration_since(s.idle_since) >= settings.server_idle_timeout)
    }

    /// Takes back a clean server: the client whose request was pipelined behind the
    /// last one gets it, else the longest waiter, else it goes idle.
    fn checkin(&self, mut conn: Conn) {
        if let Some(next) = conn.passengers.pop_front() {
            conn.sent_ahead = next.sent;
            match next.hand(conn) {
                Ok(()) => return,
                Err(c) if c.sent_ahead > 0 => {
                    // The passenger has gone: its request's answer is owed to nobody.
                    crate::conn_log::server_closing(
                        &c.info.0,
                        "client gone while its request was pipelined",
                    );
                    self.close_lent(*c);
                    return;
                }
                Err(c) => {
                    // Gone before anything of its request was written: the server is
                    // as after any request, but for what was read past the last answer
                    // (asynchronous messages), which is nobody's now.
                    conn = c;
                    conn.carry = bytes::Bytes::new();
                    conn.sent_ahead = 0;
                }
            }
        }
        let settings = self.settings();
        // Another pool waits on a shared limit this server counts against: unless a client
        // of this pool wants it, close it so that the other pool can connect (checked
        // before taking this pool's lock, as it locks the other pools).
        let make_room = settings.limits.others_waiting(self);
        let now = Instant::now();
        let mut st = self.lock();
        // Over the size only after a reload made the pool smaller: such a server is closed
        // even when clients wait, or a busy pool would never shrink (they wait for the
        // next one, as the pool is still at its size).
        let oversize = st.total > settings.pool_size + settings.reserve_pool_size;
        if conn.generation != settings.target.generation
            || (!settings.server_lifetime.is_zero()
                && now.saturating_duration_since(conn.created) >= settings.server_lifetime)
            || oversize
            || (make_room && st.waiters.is_empty())
        {
            st.total -= 1;
            drop(st);
            let stale = conn.generation != settings.target.generation;
            crate::conn_log::server_closing(
                &conn.info.0,
                crate::conn_log::checkin_reason(stale, oversize || make_room),
            );
            self.closed_idle(*conn);
            return;
        }
        while let Some(w) = st.waiters.pop_front() {
            if w.tx.is_closed() {
                continue;
            }
            // Under the lock, so that a waiter taking a reserve slot instead (also under
            // it) cannot have its request run twice.
            if let Some(a) = &w.ahead {
                a.send(&mut conn);
            }
            match w.tx.send(Grant::Server(conn)) {
                Ok(()) => return,
                Err(Grant::Server(c)) if c.sent_ahead > 0 => {
                    // The waiter left as its request went: the server owes an answer nobody
                    // reads, so it cannot be pooled.
                    drop(st);
                    self.close_lent(*c);
                    return;
                }
                Err(Grant::Server(c)) => conn = c,
                Err(Grant::Connect | Grant::Lost | Grant::Refused(_)) => return,
            }
        }
        conn.idle_since = now;
        st.idle.push_back(conn);
    }

    /// Closes a server already taken out of the pool's count, and frees its shared units.
    /// Closes the idle servers connected to `addr` (a host whose role no longer fits the
    /// pool's target_session_attrs). Returns how many.
    pub fn close_idle_at(&self, addr: &crate::server::ServerAddr, reason: &str) -> usize {
        let gone: Vec<Conn> = {
            let mut st = self.lock();
            let (gone, keep): (VecDeque<Conn>, VecDeque<Conn>) = std::mem::take(&mut st.idle)
                .into_iter()
                .partition(|s| *s.addr == *addr);
            st.idle = keep;
            st.total -= gone.len();
            gone.into()
        };
        let n = gone.len();
        for s in gone {
            crate::conn_log::server_closing(&s.info.0, reason);
            self.closed_idle(*s);
        }
        n
    }

    fn closed_idle(&self, conn: ServerConn) {
        let limits = self.settings().limits.clone();
        if limits.is_empty() {
            tokio::spawn(conn.terminate());
        } else {
            // Its unit of max_db_connections / max_user_connections goes to another pool
            // only once PostgreSQL has let the backend go: the server opened in its place
            // would otherwise find it still counted (as a role's connection limit counts
            // it), one over the limit for a moment.
            tokio::spawn(async move {
                conn.terminate_and_wait().await;
                limits.release();
            });
        }
        self.grant_free_slots();
    }

    /// Closes a server counted as lent (one that may not go back to the pool).
    fn close_lent(&self, conn: ServerConn) {
        self.forget();
        tokio::spawn(conn.terminate());
    }

    /// A lent or granted slot is gone (its server closed, or its connect failed).
    fn forget(&self) {
        self.lock().total -= 1;
        self.settings().limits.release();
        self.grant_free_slots();
    }

    /// A slot granted for a connection that will not be made (connect failed, or its
    /// holder gave up).
    fn abandon_slot(&self) {
        {
            let mut st = self.lock();
            st.total -= 1;
            st.connecting -= 1;
        }
        self.settings().limits.release();
        self.grant_free_slots();
    }

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

    /// Gives free slots to waiters, as long as size, limits and the login retry allow.
    pub fn grant_free_slots(&self) {
        let settings = self.settings();
        let mut unused_slot = false;
        {
            let mut st = self.lock();
            loop {
                while st.waiters.front().is_some_and(|w| w.tx.is_closed()) {
                    st.waiters.pop_front();
                }
                if st.waiters.is_empty() {
                    break;
                }
                if !matches!(self.take_slot(&mut st, &settings, false), Slot::Granted) {
                    break;
                }
                let mut sent = false;
                while let Some(w) = st.waiters.pop_front() {
                    if w.tx.send(Grant::Connect).is_ok() {
                        sent = true;
                        break;
                    }
                }
                if !sent {
                    st.total -= 1;
                    st.connecting -= 1;
                    unused_slot = true;
                    break;
                }
            }
        }
        if unused_slot {
            settings.limits.return_units();
        }
    }

    /// The last server login that failed, until one succeeds (for the dashboard).
    pub fn last_login_failure(&self) -> Option<(Instant, PgError)> {
        self.lock().login.last().cloned()
    }

    /// What SHOW POOLS reports.
    pub fn counts(&self) -> PoolCounts {
        let st = self.lock();
        let mut waiting = 0;
        let mut oldest: Option<Instant> = None;
        for w in &st.waiters {
            if !w.tx.is_closed() {
                waiting += 1;
                oldest = Some(oldest.map_or(w.since, |o| o.min(w.since)));
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

impl crate::split::Upstream for Pool {
    fn login(&self) -> (ServerTarget, Option<ScramCredential>) {
        (self.settings().target.clone(), self.scram_keys())
    }
}

/// Which idle server to lend: the oldest in round-robin mode, else the most recently used
/// (LIFO, PgBouncer's default) among those registered with this worker's runtime, looking
/// a few places back before settling for one registered elsewhere.
fn pick_idle(idle: &VecDeque<Conn>, settings: &PoolSettings) -> Option<usize> {
    let n = idle.len();
    if n == 0 {
        return None;
    }
    if settings.round_robin {
        return Some(0);
    }
    let here = crate::workers::current();
    (n.saturating_sub(8)..n)
        .rev()
        .find(|&i| idle[i].home == here)
        .or(Some(n - 1))
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
