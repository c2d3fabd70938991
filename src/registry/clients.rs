//! Logged-in clients: their cancel key, where they are, what they are doing.

use std::sync::atomic::{AtomicBool, AtomicU32, AtomicU64, AtomicU8, Ordering};
use std::sync::{Arc, LazyLock, Mutex};

use std::task::{Context, Poll};
use std::time::Duration;

use atomic_waker::AtomicWaker;

use super::{now_micros, Registry};
use crate::protocol::startup::Replication;
use crate::protocol::BackendKey;
use crate::stream::Endpoint;
use crate::stream::ServerAddr;

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
/// A cancel request arrived while the client waited in a pool's queue.
pub const CANCEL: u8 = 4;
/// The client has waited query_wait_notify: it is told it is queued.
pub const WAIT_NOTIFY: u8 = 8;
/// The client has waited query_wait_timeout.
pub const WAIT_TIMEOUT: u8 = 16;
/// The signals of one wait in a queue, cleared when the next wait begins.
const WAIT_SIGNALS: u8 = CANCEL | WAIT_NOTIFY | WAIT_TIMEOUT;
/// The task releasing a server sent the waiting client's request to it (pool::ahead).
const HANDED: u8 = 32;
/// The waiting client gave up its place; its request must not be sent for it.
const WITHDRAWN: u8 = 64;
/// The client has been idle long enough to give up its task (client::park).
pub const PARK: u8 = 128;
/// Janitor rounds (250 ms apart) a client must be seen idle before it is parked: about a
/// second, long enough that a client between two transactions is not.
const PARK_AFTER_ROUNDS: u8 = 5;

#[derive(Debug)]
pub struct ClientInfo {
    pub key: BackendKey,
    /// SHOW CLIENTS `id` and KILL_CLIENT's argument (see `registry::next_id`).
    pub id: u64,
    /// Names shared by the clients that give the same (see `shared_name`).
    pub user: Arc<str>,
    pub database: Arc<str>,
    pub peer: Endpoint,
    pub local: Endpoint,
    pub application_name: Arc<str>,
    pub connect_time: u64,
    state: AtomicU8,
    /// Janitor rounds that saw the client idle since it last had a server.
    idle_rounds: AtomicU8,
    request_time: AtomicU64,
    wait_since: AtomicU64,
    link: Mutex<Option<CancelTarget>>,
    /// While waiting in a queue: when (microseconds, 0 for never) the janitor raises
    /// WAIT_NOTIFY and WAIT_TIMEOUT. The queue's timeouts cost a client no timer of its
    /// own; `enforce_waits` looks at every waiting client a few times a second, as
    /// PgBouncer's janitor does.
    notify_at: AtomicU64,
    give_up_at: AtomicU64,
    /// STOP and KILL (set by a safe shutdown and by the admin console; they stay set) and
    /// the signals of the current wait in a queue (cleared as they are taken).
    signals: AtomicU8,
    /// The client's task, woken when a signal is set. Registering is a compare-and-swap,
    /// cheap enough for every poll of the task; a Notify locked a mutex each time.
    waker: AtomicWaker,
    /// Why the admin console killed the client (KillReason), 0 until then.
    kill_reason: AtomicU8,
    /// Its named prepared statements (pooled modes), as of the end of its last transaction.
    prepared: AtomicU32,
    /// What keeps it on its server in a pooled mode (gucs::pin_bits), 0 when nothing.
    pinned: AtomicU8,
    /// A replication connection (protocol::startup::Replication), with a server of its own.
    replication: AtomicU8,
    /// Notifications wait for it in its pool's listening hub (crate::listen).
    notified: AtomicBool,
    /// Cancel requests it sent so far: a request of its own cancelled with none sent is
    /// another's doing (client::stray_cancel).
    cancels: AtomicU32,
    /// Its session parameters as of its login, for RESET ALL (client::state). Kept here
    /// rather than in the session, whose size every idle client pays in a size class.
    startup: arc_swap::ArcSwapOption<crate::params::ParamSet>,
}

/// Why the admin console (or a shutdown) disconnects a client: what the client is told.
#[derive(Debug, Clone, Copy)]
#[repr(u8)]
pub enum KillReason {
    DatabaseRemoved = 1,
    AdminForced = 2,
    /// A graceful shutdown ran out of `shutdown_drain_timeout`.
    Shutdown = 3,
}

impl KillReason {
    fn from_code(code: u8) -> Option<KillReason> {
        match code {
            1 => Some(KillReason::DatabaseRemoved),
            2 => Some(KillReason::AdminForced),
            3 => Some(KillReason::Shutdown),
            _ => None,
        }
    }

    /// A shutdown's drain timeout is the server going away (57P01, as PostgreSQL's own
    /// shutdown says); KILL and a removed database, 08P01 as PgBouncer's.
    pub fn sqlstate(self) -> &'static str {
        match self {
            KillReason::Shutdown => "57P01",
            KillReason::DatabaseRemoved | KillReason::AdminForced => "08P01",
        }
    }

    pub fn message(self) -> &'static str {
        match self {
            KillReason::DatabaseRemoved => "database removed",
            KillReason::AdminForced => "admin forced disconnect",
            KillReason::Shutdown => "pooler is shutting down",
        }
    }
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
    pub fn kill(&self, reason: KillReason) {
        // The first reason given is the one told.
        let _ =
            self.kill_reason
                .compare_exchange(0, reason as u8, Ordering::AcqRel, Ordering::Relaxed);
        self.raise(KILL);
    }

    /// A safe shutdown began: the session leaves when it holds no server in a transaction.
    pub fn stop(&self) {
        self.raise(STOP);
    }

    /// Notifications arrived for it (crate::listen): its task is woken to pass them on.
    pub fn notify(&self) {
        self.notified.store(true, Ordering::Release);
        self.waker.wake();
    }

    pub fn take_notified(&self) -> bool {
        self.notified.load(Ordering::Acquire) && self.notified.swap(false, Ordering::AcqRel)
    }

    /// Resolves with STOP or PARK when set, and (with no bits) when notified.
    pub async fn stopped_parking_or_notified(&self) -> u8 {
        std::future::poll_fn(|cx| {
            let bits = self.poll_signals(cx) & (STOP | PARK);
            if bits != 0 || self.notified.load(Ordering::Acquire) {
                Poll::Ready(bits)
            } else {
                Poll::Pending
            }
        })
        .await
    }

    pub fn raise(&self, signal: u8) {
        self.signals.fetch_or(signal, Ordering::AcqRel);
        self.waker.wake();
    }

    /// Registers the polling task for wake-ups and returns the signals set so far. Only
    /// the client's own task polls this.
    pub fn poll_signals(&self, cx: &mut Context<'_>) -> u8 {
        self.waker.register(cx.waker());
        self.signals.load(Ordering::Acquire)
    }

    /// Resolves with those of the signals in `mask` that are set.
    async fn any_of(&self, mask: u8) -> u8 {
        std::future::poll_fn(|cx| match self.poll_signals(cx) & mask {
            0 => Poll::Pending,
            bits => Poll::Ready(bits),
        })
        .await
    }

    /// Resolves once the client was killed, with the reason to tell it.
    /// Waits for a kill; returns the SQLSTATE and message the client is to be told.
    pub async fn killed(&self) -> (&'static str, &'static str) {
        self.any_of(KILL).await;
        KillReason::from_code(self.kill_reason.load(Ordering::Acquire))
            .map_or(("08P01", "killed"), |r| (r.sqlstate(), r.message()))
    }

    fn end_wait(&self) {
        if self.wait_since.load(Ordering::Relaxed) != 0 {
            self.notify_at.store(0, Ordering::Relaxed);
            self.give_up_at.store(0, Ordering::Relaxed);
        }
    }

    /// Resolves with the signals of the current wait in a queue (CANCEL, WAIT_NOTIFY,
    /// WAIT_TIMEOUT), clearing them, or with STOP (left set) when `stop` is asked for.
    pub async fn wait_signals(&self, stop: bool) -> u8 {
        let mask = if stop {
            WAIT_SIGNALS | STOP
        } else {
            WAIT_SIGNALS
        };
        let bits = self.any_of(mask).await;
        self.signals
            .fetch_and(!(bits & WAIT_SIGNALS), Ordering::AcqRel);
        bits
    }

    /// The releaser of a server takes on sending this waiting client's request, unless the
    /// client has withdrawn. Exactly one of this and `withdraw` succeeds in a wait.
    pub fn claim_handoff(&self) -> bool {
        self.signals
            .fetch_update(Ordering::AcqRel, Ordering::Acquire, |s| {
                (s & WITHDRAWN == 0).then_some(s | HANDED)
            })
            .is_ok()
    }

    /// A releaser has taken on sending this waiting client's request (`claim_handoff`).
    pub fn is_handed(&self) -> bool {
        self.signals.load(Ordering::Acquire) & HANDED != 0
    }

    /// Takes a cancel raised during the current wait in a queue that was not seen yet
    /// (the wait ended with its grant first).
    pub fn take_cancel(&self) -> bool {
        self.signals.fetch_and(!CANCEL, Ordering::AcqRel) & CANCEL != 0
    }

    /// The client sent a cancel request.
    pub fn note_cancel(&self) {
        self.cancels.fetch_add(1, Ordering::AcqRel);
    }

    /// How many cancel requests the client sent so far.
    pub fn cancels(&self) -> u32 {
        self.cancels.load(Ordering::Acquire)
    }

    /// The waiter queues again, its request on no server (pool::checkout).
    pub fn reset_handoff(&self) {
        self.signals
            .fetch_and(!(HANDED | WITHDRAWN), Ordering::AcqRel);
    }

    /// The waiting client gives up its place (cancel, query_wait_timeout). False when its
    /// request was already sent to a server: the grant is on its way and must be taken.
    pub fn withdraw(&self) -> bool {
        self.signals
            .fetch_update(Ordering::AcqRel, Ordering::Acquire, |s| {
                (s & HANDED == 0).then_some(s | WITHDRAWN)
            })
            .is_ok()
    }

    /// The client starts waiting in a queue; the janitor signals it after `notify` and
    /// after `give_up`, when set.
    pub fn set_waiting(&self, notify: Option<Duration>, give_up: Option<Duration>) {
        let now = now_micros();
        let at = |d: Option<Duration>| d.map_or(0, |d| now.saturating_add(d.as_micros() as u64));
        self.signals
            .fetch_and(!(WAIT_SIGNALS | HANDED | WITHDRAWN), Ordering::AcqRel);
        self.notify_at.store(at(notify), Ordering::Relaxed);
        self.give_up_at.store(at(give_up), Ordering::Relaxed);
        self.request_time.store(now, Ordering::Relaxed);
        self.wait_since.store(now, Ordering::Relaxed);
        self.state
            .store(ClientState::Waiting as u8, Ordering::Relaxed);
    }

    /// Takes the PARK signal; the idle count starts again, so a client that stays
    /// unparked (or is woken with nothing to do) is asked again a second later.
    pub fn take_park(&self) {
        self.signals.fetch_and(!PARK, Ordering::AcqRel);
        self.idle_rounds.store(0, Ordering::Relaxed);
    }

    /// Signals that must end a parked client's rest: its session acts on them.
    pub fn must_wake(&self) -> bool {
        self.signals.load(Ordering::Acquire) & (STOP | KILL) != 0
    }

    /// The client is parked: signals wake `waker` (the lot's) instead of the client's last
    /// task, and the janitor stops counting its idle rounds (a PARK would only wake it).
    pub fn set_parked(&self, waker: &std::task::Waker) {
        self.idle_rounds.store(u8::MAX, Ordering::Relaxed);
        self.waker.register(waker);
    }

    /// The client has a task again: the idle count starts over.
    pub fn set_unparked(&self) {
        self.idle_rounds.store(0, Ordering::Relaxed);
    }

    pub fn set_active(&self, target: CancelTarget) {
        *self.link.lock().unwrap_or_else(|p| p.into_inner()) = Some(target);
        self.idle_rounds.store(0, Ordering::Relaxed);
        self.end_wait();
        self.wait_since.store(0, Ordering::Relaxed);
        self.state
            .store(ClientState::Active as u8, Ordering::Relaxed);
    }

    pub fn prepared(&self) -> u32 {
        self.prepared.load(Ordering::Relaxed)
    }

    pub fn pinned(&self) -> u8 {
        self.pinned.load(Ordering::Relaxed)
    }

    pub fn set_pinned(&self, bits: u8) {
        self.pinned.store(bits, Ordering::Relaxed);
    }

    pub fn replication(&self) -> Replication {
        Replication::from_u8(self.replication.load(Ordering::Relaxed))
    }

    pub fn set_replication(&self, r: Replication) {
        self.replication.store(r as u8, Ordering::Relaxed);
    }

    pub fn startup(&self) -> Option<Arc<crate::params::ParamSet>> {
        self.startup.load_full()
    }

    pub fn set_startup(&self, params: Arc<crate::params::ParamSet>) {
        self.startup.store(Some(params));
    }

    /// Cancel requests reach no server for now; the client stays active (SHOW CLIENTS).
    pub fn unlink(&self) {
        *self.link.lock().unwrap_or_else(|p| p.into_inner()) = None;
    }

    pub fn set_prepared(&self, n: usize) {
        self.prepared.store(n as u32, Ordering::Relaxed);
    }

    pub fn set_idle(&self) {
        *self.link.lock().unwrap_or_else(|p| p.into_inner()) = None;
        self.end_wait();
        self.wait_since.store(0, Ordering::Relaxed);
        self.state.store(ClientState::Idle as u8, Ordering::Relaxed);
    }
}

/// Distinct names kept for sharing; past this many, new names get their own copy (a
/// client chooses its application_name, so the set must not grow without bound).
const SHARED_NAMES_MAX: usize = 4096;

/// One copy of each user, database and application name for all the clients that use it:
/// thousands of clients have a handful of names between them, and an idle client is
/// counted in bytes (client::park).
fn shared_name(name: &str) -> Arc<str> {
    static NAMES: LazyLock<Mutex<std::collections::HashSet<Arc<str>>>> =
        LazyLock::new(Mutex::default);
    let mut names = NAMES.lock().unwrap_or_else(|p| p.into_inner());
    if let Some(shared) = names.get(name) {
        return shared.clone();
    }
    let name: Arc<str> = Arc::from(name);
    if names.len() < SHARED_NAMES_MAX {
        names.insert(name.clone());
    }
    name
}

/// A client's registration; dropping it removes the client (and its cancel key).
pub struct ClientHandle(pub Arc<ClientInfo>);

impl ClientHandle {
    /// `long_key`: a protocol 3.2 client, given a 32-byte key (registry::keys).
    pub fn register(
        user: &str,
        database: &str,
        peer: Endpoint,
        local: Endpoint,
        application_name: &str,
        long_key: bool,
    ) -> ClientHandle {
        Self::insert(
            Wanted::New { long: long_key },
            now_micros(),
            [user, database, application_name],
            peer,
            local,
        )
    }

    /// Registers a client taken over from the previous process (crate::takeover) under
    /// the key it was given there, unless a client here already has that pid.
    pub fn adopt(
        key: BackendKey,
        connect_time: u64,
        user: &str,
        database: &str,
        peer: Endpoint,
        local: Endpoint,
        application_name: &str,
    ) -> ClientHandle {
        Self::insert(
            Wanted::Kept(key),
            connect_time,
            [user, database, application_name],
            peer,
            local,
        )
    }

    /// Under the key kept when its pid is free, else under a random pid with a new secret
    /// (as long as the key it replaces).
    fn insert(
        key: Wanted,
        connect_time: u64,
        names: [&str; 3],
        peer: Endpoint,
        local: Endpoint,
    ) -> ClientHandle {
        let long = match &key {
            Wanted::New { long } => *long,
            Wanted::Kept(k) => k.tail.is_some(),
        };
        let make = |pid| {
            let key = match &key {
                Wanted::Kept(k) if k.pid == pid => k.clone(),
                _ => BackendKey {
                    pid,
                    secret: super::keys::new_secret(),
                    tail: long.then(super::keys::new_tail),
                },
            };
            ClientInfo::new(key, connect_time, names, peer, local)
        };
        let info = match &key {
            Wanted::Kept(k) => CLIENTS.insert_at_or_with(k.pid, random_pid, make),
            Wanted::New { .. } => CLIENTS.insert_with(random_pid, make),
        };
        ClientHandle(info)
    }
}

/// The key a registration asks for.
enum Wanted {
    /// A new one; `long` for a protocol 3.2 client.
    New { long: bool },
    /// The key a client taken over was given by the previous process.
    Kept(BackendKey),
}

/// The high bit stays clear: some drivers treat the pid as a signed int.
fn random_pid() -> u32 {
    rand::random::<u32>() & 0x7fff_ffff | 1
}

impl ClientInfo {
    fn new(
        key: BackendKey,
        connect_time: u64,
        [user, database, application_name]: [&str; 3],
        peer: Endpoint,
        local: Endpoint,
    ) -> ClientInfo {
        ClientInfo {
            key,
            id: super::next_id(),
            user: shared_name(user),
            database: shared_name(database),
            peer,
            local,
            application_name: shared_name(application_name),
            connect_time,
            state: AtomicU8::new(ClientState::Idle as u8),
            idle_rounds: AtomicU8::new(0),
            request_time: AtomicU64::new(0),
            wait_since: AtomicU64::new(0),
            link: Mutex::new(None),
            notify_at: AtomicU64::new(0),
            give_up_at: AtomicU64::new(0),
            signals: AtomicU8::new(0),
            waker: AtomicWaker::new(),
            kill_reason: AtomicU8::new(0),
            prepared: AtomicU32::new(0),
            pinned: AtomicU8::new(0),
            replication: AtomicU8::new(0),
            cancels: AtomicU32::new(0),
            notified: AtomicBool::new(false),
            startup: arc_swap::ArcSwapOption::empty(),
        }
    }
}

impl Drop for ClientHandle {
    fn drop(&mut self) {
        super::client_limits::leave(&self.0.database, &self.0.user);
        CLIENTS.remove(self.0.key.pid);
    }
}

/// The client a cancel request's key names, if the key is genuine: all of it, at the
/// length the client was given (a 3.2 client's 32 bytes; its first 4 alone name nobody).
pub fn by_cancel_key(key: &BackendKey) -> Option<Arc<ClientInfo>> {
    let client = CLIENTS.get(key.pid)?;
    client.key.matches(key).then_some(client)
}

/// Asks clients idle for about a second to park (client::park), and signals every client
/// that has waited in a queue past query_wait_notify or query_wait_timeout. Each deadline is taken (swapped to 0) before its signal is raised,
/// so it fires once; a client that has meanwhile moved on to another wait checks the time
/// itself before acting on a signal.
pub fn enforce_waits() {
    let now = now_micros();
    CLIENTS.for_each(|c| {
        if c.state() == ClientState::Idle {
            // Counted up to the threshold and no further, so PARK is raised once per
            // idle spell (take_park starts the count again).
            // (A compare-and-swap: a lend that reset the count meanwhile wins.)
            let rounds = c.idle_rounds.load(Ordering::Relaxed);
            if rounds < PARK_AFTER_ROUNDS
                && c.idle_rounds
                    .compare_exchange(rounds, rounds + 1, Ordering::Relaxed, Ordering::Relaxed)
                    .is_ok()
                && rounds + 1 == PARK_AFTER_ROUNDS
            {
                c.raise(PARK);
            }
            return;
        }
        if c.state() != ClientState::Waiting {
            return;
        }
        for (deadline, signal) in [(&c.notify_at, WAIT_NOTIFY), (&c.give_up_at, WAIT_TIMEOUT)] {
            let at = deadline.load(Ordering::Relaxed);
            if at != 0
                && now >= at
                && deadline
                    .compare_exchange(at, 0, Ordering::AcqRel, Ordering::Relaxed)
                    .is_ok()
            {
                c.raise(signal);
            }
        }
    });
}
#[cfg(test)]
mod tests {
    /// Every logged-in client (parked ones too) holds an entry: with its Arc's two
    /// counts it stays within a 256-byte size class of the allocator (the next is 320).
    #[test]
    fn a_client_entry_fits_its_size_class() {
        let size = std::mem::size_of::<super::ClientInfo>() + 16;
        assert!(size <= 256, "{size}");
    }
}
