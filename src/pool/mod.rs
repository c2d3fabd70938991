//! A pool of server connections for one (database, user) pair.
//!
//! The pool's mutex is taken once to check out and once to check in, never across an
//! await. A released server goes straight to the longest waiter (FIFO), so waiters are never
//! overtaken and never stampede. A lent server is wrapped in a `Lease` whose drop gives the
//! slot back, so no path (error, panic, client gone) can leak a slot.

mod ahead;
mod checkin;
mod checkout;
mod close;
mod counts;
mod dedicated;
pub mod gates;
mod janitor;
mod lease;
mod limit;
mod login;
mod pipeline;
mod queue;
mod retry;
mod settings;
mod unused;

use std::collections::VecDeque;
use std::sync::atomic::AtomicUsize;
use std::sync::{Arc, Mutex, MutexGuard};
use std::time::Instant;

use arc_swap::ArcSwap;
use tokio::sync::oneshot;

use crate::protocol::PgError;
use crate::server::passenger::Grant;
use crate::server::welcome::Welcome;
use crate::server::{ScramCredential, ServerConn};
use crate::stats::Counters;
pub use ahead::Ahead;
pub use lease::Lease;
pub use limit::{Limit, Limits};
pub use pipeline::PipelineSettings;
pub use settings::PoolSettings;
pub use weir_config::PoolMode;

/// Boxed so that a lease, a grant and an idle slot move a pointer, and the futures that
/// hold a lease stay small.
pub type Conn = Box<ServerConn>;

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
    /// The last login failed and its retry delay (see `retry`) has not passed.
    LoginBlocked(PgError, retry::TellAtOnce),
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
    /// Since when the pool has been seen with no client and no server (unused).
    unused_since: Mutex<Option<Instant>>,
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
            unused_since: Mutex::new(None),
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

    fn lock(&self) -> MutexGuard<'_, PoolState> {
        // A panic while holding this lock cannot leave the state half-updated in a way that
        // matters more than stopping the whole pooler would.
        self.state.lock().unwrap_or_else(|p| p.into_inner())
    }

    /// The parameters a new client is shown, from the first server this pool opened.
    pub fn welcome(&self) -> Option<Arc<Welcome>> {
        self.lock().welcome.clone()
    }
}
