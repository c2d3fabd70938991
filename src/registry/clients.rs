//! Logged-in clients: their cancel key, where they are, what they are doing.

use std::sync::atomic::{AtomicU64, AtomicU8, Ordering};
use std::sync::{Arc, LazyLock, Mutex, OnceLock};

use std::task::{Context, Poll};

use atomic_waker::AtomicWaker;
use tokio::sync::Notify;

use super::{now_micros, Registry};
use crate::server::{BackendKey, ServerAddr};
use crate::stream::Endpoint;

pub static CLIENTS: LazyLock<Registry<u32, ClientInfo>> = LazyLock::new(Registry::new);

#[derive(Debug, Clone, Copy, PartialEq, Eq)]
#[repr(u8)]
pub enum ClientState {
    /// Logged in, no server, nothing asked.
    Idle = 0,
    /// Linked to a server.
    Active = 1,
    /// Waiting in a pool's queue.
    Waiting = 2,
}

/// Where a cancel request for this client must go.
#[derive(Debug, Clone)]
pub struct CancelTarget {
    pub addr: Arc<ServerAddr>,
    pub key: BackendKey,
    pub server_id: u64,
}

pub const STOP: u8 = 1;
pub const KILL: u8 = 2;

#[derive(Debug)]
pub struct ClientInfo {
    pub key: BackendKey,
    pub user: String,
    pub database: String,
    pub peer: Endpoint,
    pub local: Endpoint,
    pub application_name: String,
    pub connect_time: u64,
    state: AtomicU8,
    request_time: AtomicU64,
    wait_since: AtomicU64,
    link: Mutex<Option<CancelTarget>>,
    /// Woken by a cancel request that finds the client waiting in a queue.
    pub cancel_wait: Notify,
    /// STOP and KILL, set by a safe shutdown and by the admin console; they stay set.
    signals: AtomicU8,
    /// The client's task, woken when a signal is set. Registering is a compare-and-swap,
    /// cheap enough for every poll of the task; a Notify locked a mutex each time.
    waker: AtomicWaker,
    kill_reason: OnceLock<&'static str>,
}

impl ClientInfo {
    pub fn state(&self) -> ClientState {
        match self.state.load(Ordering::Relaxed) {
            1 => ClientState::Active,
            2 => ClientState::Waiting,
            _ => ClientState::Idle,
        }
    }

    pub fn request_time(&self) -> u64 {
        self.request_time.load(Ordering::Relaxed)
    }

    /// When the current wait began, if the client is waiting.
    pub fn wait_since(&self) -> Option<u64> {
        match self.wait_since.load(Ordering::Relaxed) {
            0 => None,
            t => Some(t),
        }
    }

    pub fn link(&self) -> Option<CancelTarget> {
        self.link.lock().unwrap_or_else(|p| p.into_inner()).clone()
    }

    /// Asks the client's session to disconnect it, telling it `reason`.
    pub fn kill(&self, reason: &'static str) {
        let _ = self.kill_reason.set(reason);
        self.raise(KILL);
    }

    /// A safe shutdown began: the session leaves when it holds no server in a transaction.
    pub fn stop(&self) {
        self.raise(STOP);
    }

    fn raise(&self, signal: u8) {
        self.signals.fetch_or(signal, Ordering::AcqRel);
        self.waker.wake();
    }

    /// Registers the polling task for wake-ups and returns the signals set so far. Only
    /// the client's own task polls this.
    pub fn poll_signals(&self, cx: &mut Context<'_>) -> u8 {
        self.waker.register(cx.waker());
        self.signals.load(Ordering::Acquire)
    }

    /// Resolves once the client was killed, with the reason to tell it.
    pub async fn killed(&self) -> &'static str {
        std::future::poll_fn(|cx| {
            if self.poll_signals(cx) & KILL != 0 {
                Poll::Ready(self.kill_reason.get().copied().unwrap_or("killed"))
            } else {
                Poll::Pending
            }
        })
        .await
    }

    /// Resolves once a safe shutdown has begun.
    pub async fn stopped(&self) {
        std::future::poll_fn(|cx| {
            if self.poll_signals(cx) & STOP != 0 {
                Poll::Ready(())
            } else {
                Poll::Pending
            }
        })
        .await
    }

    pub fn set_waiting(&self) {
        let now = now_micros();
        self.request_time.store(now, Ordering::Relaxed);
        self.wait_since.store(now, Ordering::Relaxed);
        self.state
            .store(ClientState::Waiting as u8, Ordering::Relaxed);
    }

    pub fn set_active(&self, target: CancelTarget) {
        *self.link.lock().unwrap_or_else(|p| p.into_inner()) = Some(target);
        self.wait_since.store(0, Ordering::Relaxed);
        self.state
            .store(ClientState::Active as u8, Ordering::Relaxed);
    }

    pub fn set_idle(&self) {
        *self.link.lock().unwrap_or_else(|p| p.into_inner()) = None;
        self.wait_since.store(0, Ordering::Relaxed);
        self.state.store(ClientState::Idle as u8, Ordering::Relaxed);
    }
}

/// A client's registration; dropping it removes the client (and its cancel key).
pub struct ClientHandle(pub Arc<ClientInfo>);

impl ClientHandle {
    pub fn register(
        user: &str,
        database: &str,
        peer: Endpoint,
        local: Endpoint,
        application_name: &str,
    ) -> ClientHandle {
        let info = CLIENTS.insert_with(
            // The high bit stays clear: some drivers treat the pid as a signed int.
            || rand::random::<u32>() & 0x7fff_ffff | 1,
            |pid| ClientInfo {
                key: BackendKey {
                    pid,
                    secret: rand::random(),
                },
                user: user.to_owned(),
                database: database.to_owned(),
                peer,
                local,
                application_name: application_name.to_owned(),
                connect_time: now_micros(),
                state: AtomicU8::new(ClientState::Idle as u8),
                request_time: AtomicU64::new(0),
                wait_since: AtomicU64::new(0),
                link: Mutex::new(None),
                cancel_wait: Notify::new(),
                signals: AtomicU8::new(0),
                waker: AtomicWaker::new(),
                kill_reason: OnceLock::new(),
            },
        );
        ClientHandle(info)
    }
}

impl Drop for ClientHandle {
    fn drop(&mut self) {
        CLIENTS.remove(self.0.key.pid);
    }
}

/// The client a cancel request's key names, if the key is genuine.
pub fn by_cancel_key(key: BackendKey) -> Option<Arc<ClientInfo>> {
    let client = CLIENTS.get(key.pid)?;
    (client.key.secret == key.secret).then_some(client)
}
