//! The console's pause, suspend and disable state, kept here so that the pool consults it
//! without reaching up into the admin console: the console's commands (admin::control)
//! change it, a checkout waits on it ([`wait_resumed`]), login and SHOW read it.

use std::collections::HashSet;
use std::sync::atomic::{AtomicBool, Ordering};
use std::sync::{LazyLock, Mutex, MutexGuard};

use tokio::sync::Notify;

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
