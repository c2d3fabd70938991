//! The console's pause, suspend, disable and shutdown state, kept here so that the pool
//! and the client's login consult it without reaching up into the admin console: the
//! console's commands (admin::control) change it, a checkout waits on it
//! ([`wait_resumed`]), login ([`login_refusal`]) and SHOW read it.

use std::collections::HashSet;
use std::sync::atomic::{AtomicBool, Ordering};
use std::sync::{LazyLock, Mutex, MutexGuard};

use tokio::sync::{watch, Notify};

use crate::protocol::PgError;

/// The admin console's database (and its own user), whichever name a client gives.
pub const ADMIN_DB: &str = "pgbouncer";

/// The pooler-wide pause state, as SHOW STATE reports it.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum Mode {
    Running,
    Paused,
    Suspended,
}

pub struct State {
    pub mode: Mode,
    pub paused: HashSet<String>,
    pub disabled: HashSet<String>,
    /// Servers RECONNECT marked to close once released (SHOW SERVERS close_needed).
    pub close_needed: HashSet<u64>,
}

struct Gates {
    state: Mutex<State>,
    /// Woken whenever a database may have been resumed.
    resumed: Notify,
}

static GATES_STATE: LazyLock<Gates> = LazyLock::new(|| Gates {
    state: Mutex::new(State {
        mode: Mode::Running,
        paused: HashSet::new(),
        disabled: HashSet::new(),
        close_needed: HashSet::new(),
    }),
    resumed: Notify::new(),
});

pub fn state() -> MutexGuard<'static, State> {
    GATES_STATE.state.lock().unwrap_or_else(|p| p.into_inner())
}

/// True while anything is paused or suspended: lets checkouts skip the lock otherwise.
static GATES_CLOSED: AtomicBool = AtomicBool::new(false);

/// Recomputes [`GATES_CLOSED`] after a change of mode or of the paused set.
pub fn sync_gates() {
    let st = state();
    let closed = st.mode != Mode::Running || !st.paused.is_empty();
    GATES_CLOSED.store(closed, Ordering::Release);
}

fn is_open(database: &str) -> bool {
    let st = state();
    st.mode == Mode::Running && !st.paused.contains(database)
}

/// True while anything is paused or suspended (one atomic load).
pub fn gates_closed() -> bool {
    GATES_CLOSED.load(Ordering::Acquire)
}

/// Returns once `database` is neither paused nor the pooler paused or suspended.
/// Costs one atomic load when nothing is paused.
pub async fn wait_resumed(database: &str) {
    if !GATES_CLOSED.load(Ordering::Acquire) {
        return;
    }
    loop {
        let notified = GATES_STATE.resumed.notified();
        tokio::pin!(notified);
        notified.as_mut().enable();
        if is_open(database) {
            return;
        }
        notified.await;
    }
}

/// Wakes checkouts waiting on a paused database, to look again.
pub fn wake_resumed() {
    GATES_STATE.resumed.notify_waiters();
}

pub fn mode() -> Mode {
    state().mode
}

pub fn is_paused(database: &str) -> bool {
    state().paused.contains(database)
}

pub fn is_disabled(database: &str) -> bool {
    state().disabled.contains(database)
}

pub fn close_needed(server_id: u64) -> bool {
    state().close_needed.contains(&server_id)
}

/// How SHUTDOWN asked the process to end.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum ShutdownMode {
    /// Exit now (plain SHUTDOWN).
    Immediate,
    /// Release the queue, let every client finish its transaction (in session mode, its
    /// session), then exit (SIGINT).
    WaitForServers,
    /// Take no new clients; exit once the connected ones have left.
    WaitForClients,
}

pub(crate) static SHUTDOWN: LazyLock<watch::Sender<Option<ShutdownMode>>> =
    LazyLock::new(|| watch::Sender::new(None));

/// Why a new client of `database` must be turned away, if it must. During a graceful
/// shutdown only the Unix socket still accepts, and only for the admin console (whose
/// logins do not come here), as in PgBouncer 1.23+.
pub fn login_refusal(database: &str) -> Option<PgError> {
    if SHUTDOWN.borrow().is_some() {
        return Some(PgError::fatal("57P01", "pooler is shutting down"));
    }
    if state().disabled.contains(database) {
        return Some(PgError::fatal(
            "08P01",
            format!("database \"{database}\" is disabled"),
        ));
    }
    None
}

/// Resolves when the console asked the process to shut down, with how.
pub async fn shutdown_requested() -> ShutdownMode {
    let mut rx = SHUTDOWN.subscribe();
    loop {
        if let Some(mode) = *rx.borrow_and_update() {
            return mode;
        }
        if rx.changed().await.is_err() {
            std::future::pending::<()>().await;
        }
    }
}

/// Resolves when an immediate exit is asked for (plain SHUTDOWN), also during a graceful
/// shutdown.
pub async fn shutdown_now_requested() {
    let mut rx = SHUTDOWN.subscribe();
    loop {
        if *rx.borrow_and_update() == Some(ShutdownMode::Immediate) {
            return;
        }
        if rx.changed().await.is_err() {
            std::future::pending::<()>().await;
        }
    }
}

/// True once SHUTDOWN was issued (any mode).
pub fn shutdown_mode() -> Option<ShutdownMode> {
    *SHUTDOWN.borrow()
}

/// What a client waiting for a server is told when a safe shutdown empties the queue, as
/// PgBouncer's WAIT_FOR_SERVERS closes its waiting clients.
pub fn queue_released() -> PgError {
    PgError::fatal("08P01", "server shutting down")
}

/// Runs `wait` (a client's wait for a server) unless a safe shutdown (SIGINT, SHUTDOWN
/// WAIT_FOR_SERVERS) empties the queue first: then `queue_released`. For the waits that
/// happen outside a client's session and its stop signal (a login's wait for its pool's
/// first server or for auth_query's, a replication client's for its own server);
/// dropping the wait gives back whatever it held (its place in the queue, its slot, a
/// server granted late).
pub async fn unless_queue_released<T>(
    wait: impl std::future::Future<Output = Result<T, PgError>>,
) -> Result<T, PgError> {
    let mut rx = SHUTDOWN.subscribe();
    let released = async {
        loop {
            // WAIT_FOR_CLIENTS leaves clients be; WAIT_FOR_SERVERS is never taken back.
            if *rx.borrow_and_update() == Some(ShutdownMode::WaitForServers) {
                return;
            }
            if rx.changed().await.is_err() {
                std::future::pending::<()>().await;
            }
        }
    };
    tokio::select! {
        biased;
        () = released => Err(queue_released()),
        r = wait => r,
    }
}
