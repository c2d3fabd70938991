//! `cancel_wait_timeout`: how long a cancel request sent to a server (or a peer) may take
//! before it is given up. Kept here, below the configuration's holder (app) and the
//! cancel path (cancel, client), which both reach down to it.

use std::sync::atomic::{AtomicU64, Ordering};
use std::time::Duration;

/// In milliseconds; 0: no limit.
static WAIT_MS: AtomicU64 = AtomicU64::new(10_000);

/// Takes `cancel_wait_timeout` from the configuration (at start and on each reload).
pub fn configure(g: &weir_config::General) {
    let ms = u64::try_from(g.cancel_wait_timeout.as_millis()).unwrap_or(u64::MAX);
    WAIT_MS.store(ms, Ordering::Relaxed);
}

/// The limit now, None for no limit.
pub fn limit() -> Option<Duration> {
    match WAIT_MS.load(Ordering::Relaxed) {
        0 => None,
        ms => Some(Duration::from_millis(ms)),
    }
}
