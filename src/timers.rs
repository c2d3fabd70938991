//! Every timer lives in the main thread's runtime, whichever thread arms it.
//!
//! A runtime with a time driver consults its timer wheel, and reads the clock, on every
//! trip through its event loop: on a worker that is twice per transaction of every client
//! it serves (~900 instructions per transaction at one client, a tenth of Weir's user time
//! in `pgbench -S`). Timers here are rare (timeouts that almost never fire), so the workers
//! run without a time driver and arm theirs in the main thread's wheel: the main thread
//! wakes the worker's task when one fires, as any cross-thread wake. Code on a worker must
//! use these functions, never `tokio::time`'s (that panics there: clippy.toml forbids it).

use std::future::Future;
use std::time::{Duration, Instant};

use tokio::runtime::{EnterGuard, Handle};
pub use tokio::time::{Interval, MissedTickBehavior, Sleep, Timeout};

/// The main thread's runtime, whose time driver holds every timer.
static MAIN: std::sync::OnceLock<Handle> = std::sync::OnceLock::new();

/// Records the main thread's runtime; timers armed before this use the current one.
pub fn set_home(handle: Handle) {
    let _ = MAIN.set(handle);
}

/// Enters the main runtime for the duration of arming a timer.
fn home() -> Option<EnterGuard<'static>> {
    MAIN.get().map(Handle::enter)
}

#[allow(clippy::disallowed_methods)]
pub fn sleep(duration: Duration) -> Sleep {
    let _home = home();
    tokio::time::sleep(duration)
}

#[allow(clippy::disallowed_methods)]
pub fn sleep_until(at: Instant) -> Sleep {
    let _home = home();
    tokio::time::sleep_until(at.into())
}

#[allow(clippy::disallowed_methods)]
pub fn timeout<F: Future>(duration: Duration, future: F) -> Timeout<F> {
    let _home = home();
    tokio::time::timeout(duration, future)
}

#[allow(clippy::disallowed_methods)]
pub fn timeout_at<F: Future>(at: Instant, future: F) -> Timeout<F> {
    let _home = home();
    tokio::time::timeout_at(at.into(), future)
}

#[allow(clippy::disallowed_methods)]
pub fn interval(period: Duration, missed: MissedTickBehavior) -> Interval {
    let _home = home();
    let mut tick = tokio::time::interval(period);
    tick.set_missed_tick_behavior(missed);
    tick
}
