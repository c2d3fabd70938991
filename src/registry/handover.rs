//! Where an online restart stands (takeover): whether idle clients are being handed to a
//! new process, whether the sockets were given away, and the way to the previous process
//! for cancel requests, and the channel idle clients leave by. Written by takeover, read
//! by the layers below it (the client's relay, the pool's janitor, listeners, cancel
//! forwarding), so kept here, process-wide as the restart itself is.

use std::os::fd::OwnedFd;
use std::sync::atomic::{AtomicBool, AtomicUsize, Ordering};
use std::sync::mpsc;
use std::sync::Mutex;

use crate::protocol::BackendKey;

/// The old process hands its idle clients over.
static MOVING: AtomicBool = AtomicBool::new(false);
/// The old process has given its sockets away: files they have belong to the new one.
static HANDED_OVER: AtomicBool = AtomicBool::new(false);
/// The new process: cancel keys for the old one.
static TO_PREDECESSOR: Mutex<Option<mpsc::Sender<BackendKey>>> = Mutex::new(None);

/// The old process: clients on their way to the new one (client::moved writes them,
/// takeover sends them).
static OUTBOX: Mutex<Option<mpsc::Sender<Parcel>>> = Mutex::new(None);
/// Clients written out but not yet sent: no longer counted among the old process's
/// clients (their sessions are gone), yet it must not exit before they are on the
/// channel, or they would be closed with it.
static IN_FLIGHT: AtomicUsize = AtomicUsize::new(0);

/// One client on its way to the new process.
pub struct Parcel {
    pub text: Vec<u8>,
    /// The client's socket, and its server's when one moves with it.
    pub fds: Vec<OwnedFd>,
    _in_flight: InFlight,
}

impl Parcel {
    pub fn new(text: Vec<u8>, fds: Vec<OwnedFd>, in_flight: InFlight) -> Parcel {
        Parcel {
            text,
            fds,
            _in_flight: in_flight,
        }
    }
}

/// Counts a client in IN_FLIGHT from before its session goes until its parcel is sent.
pub struct InFlight(());

impl InFlight {
    pub fn new() -> InFlight {
        IN_FLIGHT.fetch_add(1, Ordering::SeqCst);
        InFlight(())
    }
}

impl Drop for InFlight {
    fn drop(&mut self) {
        IN_FLIGHT.fetch_sub(1, Ordering::SeqCst);
    }
}

/// Clients on their way to the new process (see IN_FLIGHT).
pub fn in_flight() -> usize {
    IN_FLIGHT.load(Ordering::SeqCst)
}

fn outbox() -> std::sync::MutexGuard<'static, Option<mpsc::Sender<Parcel>>> {
    OUTBOX.lock().unwrap_or_else(|p| p.into_inner())
}

/// The old process starts moving its idle clients; they arrive on the receiver.
pub fn start_moving() -> mpsc::Receiver<Parcel> {
    let (tx, rx) = mpsc::channel();
    *outbox() = Some(tx);
    set_moving(true);
    rx
}

/// Stops moving clients: those left stay here until they leave.
pub fn stop_moving() {
    set_moving(false);
    outbox().take();
}

/// Where a client that moves goes; None once moving has stopped.
pub fn outbox_sender() -> Option<mpsc::Sender<Parcel>> {
    outbox().clone()
}

fn to_predecessor() -> std::sync::MutexGuard<'static, Option<mpsc::Sender<BackendKey>>> {
    TO_PREDECESSOR.lock().unwrap_or_else(|p| p.into_inner())
}

/// Idle clients are being handed to a new process.
pub fn moving() -> bool {
    MOVING.load(Ordering::Relaxed)
}

fn set_moving(on: bool) {
    MOVING.store(on, Ordering::SeqCst);
}

/// The listening sockets went to a new process, which may accept on them (from before it
/// is ready until it goes away): this process must then only close its own copies.
static SOCKETS_SHARED: AtomicBool = AtomicBool::new(false);

pub fn sockets_shared() -> bool {
    SOCKETS_SHARED.load(Ordering::SeqCst)
}

pub fn set_sockets_shared(on: bool) {
    SOCKETS_SHARED.store(on, Ordering::SeqCst);
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
