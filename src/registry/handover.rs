//! Where an online restart stands (takeover): whether idle clients are being handed to a
//! new process, whether the sockets were given away, and the way to the previous process
//! for cancel requests. Written by takeover, read by the layers below it (the client's
//! relay, the pool's janitor, listeners, cancel forwarding), so kept here, process-wide
//! as the restart itself is.

use std::sync::atomic::{AtomicBool, Ordering};
use std::sync::mpsc;
use std::sync::Mutex;

use crate::protocol::BackendKey;

/// The old process hands its idle clients over.
static MOVING: AtomicBool = AtomicBool::new(false);
/// The old process has given its sockets away: files they have belong to the new one.
static HANDED_OVER: AtomicBool = AtomicBool::new(false);
/// The new process: cancel keys for the old one.
static TO_PREDECESSOR: Mutex<Option<mpsc::Sender<BackendKey>>> = Mutex::new(None);

fn to_predecessor() -> std::sync::MutexGuard<'static, Option<mpsc::Sender<BackendKey>>> {
    TO_PREDECESSOR.lock().unwrap_or_else(|p| p.into_inner())
}

/// Idle clients are being handed to a new process.
pub fn moving() -> bool {
    MOVING.load(Ordering::Relaxed)
}

pub fn set_moving(on: bool) {
    MOVING.store(on, Ordering::SeqCst);
}

pub fn handed_over() -> bool {
    HANDED_OVER.load(Ordering::Relaxed)
}

pub fn set_handed_over(on: bool) {
    HANDED_OVER.store(on, Ordering::SeqCst);
}

/// The new process: where cancel keys for the previous one go while it runs.
pub fn set_predecessor(tx: Option<mpsc::Sender<BackendKey>>) {
    *to_predecessor() = tx;
}

/// The previous process still runs (and may still send clients here): this process must
/// not exit before it, or the clients on their way here would be lost.
pub fn predecessor_running() -> bool {
    to_predecessor().is_some()
}

/// A cancel request for a key this process does not know goes to the previous process
/// while it runs: its client may still be there. False when there is none.
pub fn forward_cancel(key: BackendKey) -> bool {
    to_predecessor()
        .as_ref()
        .is_some_and(|tx| tx.send(key).is_ok())
}

/// Files of the listening sockets are kept at exit: a new process has them now, or a
/// previous one still serves on them.
pub fn keeps_socket_files() -> bool {
    handed_over() || predecessor_running()
}
