//! Idle clients without a task.
//!
//! A logged-in client that sends nothing still costs a Tokio task, whose future is sized
//! for the busiest state of a session (about 1 KB), and a readiness record in the runtime
//! (256 bytes), for nothing; PgBouncer keeps an idle client in about 800 bytes. So a
//! client idle for about a second is parked: its task ends, the session stays boxed here,
//! and its socket waits in one epoll set of the whole process, watched by one task on the
//! main thread. When the client sends something or hangs up, is killed, times out
//! (client_idle_timeout) or a shutdown begins, the session gets a new task on a worker and
//! carries on where it stopped.

use std::collections::HashMap;
use std::os::fd::{AsFd, AsRawFd, FromRawFd, OwnedFd, RawFd};
use std::sync::atomic::{AtomicU64, Ordering};
use std::sync::{LazyLock, Mutex, MutexGuard};
use std::task::{Poll, RawWaker, RawWakerVTable, Waker};
use std::time::{Duration, Instant};

use atomic_waker::AtomicWaker;
use tokio::io::unix::AsyncFd;
use tokio::io::Interest;

use super::Session;

/// Sessions woken per epoll_wait.
const BATCH: usize = 256;

struct Lot {
    epoll: OwnedFd,
    /// Clients parked so far, to notice when a burst of parking has ended.
    parks: AtomicU64,
    /// By the client's cancel-key pid, unique among logged-in clients. The session keeps
    /// its socket (Stream::Parked).
    parked: Mutex<HashMap<u32, Box<Session>>>,
    /// Clients whose signals (KILL, STOP) fired while parked.
    signalled: Mutex<Vec<u32>>,
    watcher: AtomicWaker,
}

impl Lot {
    fn parked(&self) -> MutexGuard<'_, HashMap<u32, Box<Session>>> {
        self.parked.lock().unwrap_or_else(|p| p.into_inner())
    }

    fn signal(&self, pid: u32) {
        self.signalled
            .lock()
            .unwrap_or_else(|p| p.into_inner())
            .push(pid);
        self.watcher.wake();
    }

    fn epoll_ctl(&self, op: libc::c_int, fd: RawFd, pid: u32) -> std::io::Result<()> {
        let mut ev = libc::epoll_event {
            events: (libc::EPOLLIN | libc::EPOLLRDHUP | libc::EPOLLONESHOT) as u32,
            u64: u64::from(pid),
        };
        // SAFETY: a valid epoll fd, a socket fd we own and an initialised event.
        let rc = unsafe { libc::epoll_ctl(self.epoll.as_raw_fd(), op, fd, &mut ev) };
        if rc == 0 {
            Ok(())
        } else {
            Err(std::io::Error::last_os_error())
        }
    }
}

/// None if the kernel refused an epoll instance: clients then keep their tasks.
static LOT: LazyLock<Option<Lot>> = LazyLock::new(|| {
    // SAFETY: plain syscall; the fd is owned from here on.
    let fd = unsafe { libc::epoll_create1(libc::EPOLL_CLOEXEC) };
    if fd < 0 {
        tracing::warn!(
            "epoll_create1 failed ({}): idle clients keep their tasks",
            std::io::Error::last_os_error()
        );
        return None;
    }
    Some(Lot {
        // SAFETY: fd was just created and nothing else owns it.
        epoll: unsafe { OwnedFd::from_raw_fd(fd) },
        parks: AtomicU64::new(0),
        parked: Mutex::new(HashMap::new()),
        signalled: Mutex::new(Vec::new()),
        watcher: AtomicWaker::new(),
    })
});

/// A waker that names a parked client: a signal raised for it (KILL, STOP) reaches the
/// lot's watcher. The pid is the waker's data, so making one allocates nothing.
fn waker_for(pid: u32) -> Waker {
    fn clone(data: *const ()) -> RawWaker {
        RawWaker::new(data, &VTABLE)
    }
    fn wake(data: *const ()) {
        if let Some(lot) = LOT.as_ref() {
            lot.signal(data as usize as u32);
        }
    }
    fn drop(_: *const ()) {}
    static VTABLE: RawWakerVTable = RawWakerVTable::new(clone, wake, wake, drop);
    // SAFETY: the vtable's functions only read the pid out of the data pointer, which is
    // never dereferenced.
    unsafe { Waker::from_raw(RawWaker::new(pid as usize as *const (), &VTABLE)) }
}

/// Clients parked now.
pub fn count() -> usize {
    LOT.as_ref().map_or(0, |lot| lot.parked().len())
}

/// Parks an idle session. Err gives it back when it cannot be parked (no epoll, a
/// signal pending): the caller carries on with it.
pub(crate) fn park(mut session: Box<Session>) -> Result<(), Box<Session>> {
    let Some(lot) = LOT.as_ref() else {
        return Err(session);
    };
    // The TLS session would have to be kept apart from the socket: TLS clients keep
    // their tasks instead.
    if session.stream.is_tls() {
        return Err(session);
    }
    let info = session.client.0.clone();
    let pid = info.key.pid;
    // No timer (it belongs to this worker's runtime) and no buffers (they go back to this
    // worker's free list): a parked client holds neither.
    if let Some(extras) = &mut session.extras {
        extras.timer = None;
    }
    if let Some(extras) = &mut session.extras {
        if extras.prepared.as_ref().is_some_and(|p| p.is_empty()) {
            extras.prepared = None;
        }
        if let Some(p) = &mut extras.prepared {
            p.retry.release();
        }
    }
    session.trim_extras();
    crate::bufpool::park(&mut session.inbuf);
    crate::bufpool::park(&mut session.outbuf);
    let fd = match session.stream.park() {
        Ok(fd) => fd,
        Err(e) => {
            // The socket is gone from the session: it cannot go on.
            tracing::warn!(client = %info.peer, "could not park an idle client: {e}");
            return Ok(());
        }
    };
    lot.parks.fetch_add(1, Ordering::Relaxed);
    info.set_parked(&waker_for(pid));
    lot.parked().insert(pid, session);
    if let Err(e) = lot.epoll_ctl(libc::EPOLL_CTL_ADD, fd, pid) {
        tracing::warn!(client = %info.peer, "could not watch a parked client: {e}");
        lot.signal(pid);
    } else if info.must_wake() {
        // Raised before the waker was set: nobody else will wake it.
        lot.signal(pid);
    }
    Ok(())
}

/// Gives a parked session a task again, on a worker chosen by its pid (the socket is
/// registered anew wherever it goes, so any worker will do).
fn resume(lot: &Lot, pid: u32) {
    let Some(mut session) = lot.parked().remove(&pid) else {
        return;
    };
    session.client.0.set_unparked();
    // Off the lot's set before the socket is closed or registered elsewhere. It may
    // already be off (a failed add); nothing to undo then.
    if let Some(fd) = session.stream.parked_fd() {
        let _ = lot.epoll_ctl(libc::EPOLL_CTL_DEL, fd, pid);
    }
    let worker = pid as usize % crate::workers::count().max(1);
    crate::workers::spawn_on(worker, async move {
        match session.stream.unpark() {
            Ok(()) => super::run_session(session, true).await,
            Err(e) => {
                let c = &session.client.0;
                tracing::warn!(client = %c.peer, "could not resume a parked client: {e}");
            }
        }
    });
}

/// Watches the parked clients; runs on the main thread for the life of the process.
pub async fn watch() {
    let Some(lot) = LOT.as_ref() else {
        return;
    };
    // SAFETY: the epoll fd belongs to a static that is never dropped, so it stays open
    // and the same for as long as this registration lives.
    let registered =
        unsafe { AsyncFd::register_with_interest(lot.epoll.as_fd(), Interest::READABLE) };
    let epoll = match registered {
        Ok(a) => a,
        Err(e) => {
            tracing::error!("cannot watch parked clients: {e}");
            return;
        }
    };
    let mut tick = crate::timers::interval(
        Duration::from_secs(1),
        crate::timers::MissedTickBehavior::Delay,
    );
    let mut events = vec![libc::epoll_event { events: 0, u64: 0 }; BATCH];
    let mut reclaim = Reclaim::default();
    let mut wake: Vec<u32> = Vec::new();
    loop {
        tokio::select! {
            guard = epoll.readable() => {
                let Ok(mut guard) = guard else { return };
                loop {
                    // SAFETY: the buffer holds BATCH initialised events.
                    let n = unsafe {
                        libc::epoll_wait(lot.epoll.as_raw_fd(), events.as_mut_ptr(), BATCH as i32, 0)
                    };
                    if n <= 0 {
                        guard.clear_ready();
                        break;
                    }
                    wake.extend(events[..n as usize].iter().map(|e| e.u64 as u32));
                    if (n as usize) < BATCH {
                        guard.clear_ready();
                        break;
                    }
                }
            }
            () = std::future::poll_fn(|cx| {
                lot.watcher.register(cx.waker());
                let mut s = lot.signalled.lock().unwrap_or_else(|p| p.into_inner());
                if s.is_empty() {
                    Poll::Pending
                } else {
                    wake.append(&mut s);
                    Poll::Ready(())
                }
            }) => {}
            _ = tick.tick() => {
                reclaim.tick(lot.parks.load(Ordering::Relaxed));
                // client_idle_timeout keeps counting while a client is parked.
                let now = Instant::now();
                wake.extend(lot.parked().iter().filter_map(|(pid, s)| {
                    let limit = s.timeouts.client_idle()?;
                    (now >= s.idle_since + limit).then_some(*pid)
                }));
            }
        }
        for pid in wake.drain(..) {
            resume(lot, pid);
        }
    }
}

/// Hands the memory of parked clients' finished tasks back to the OS. mimalloc keeps
/// freed pages until the thread that freed them allocates again past a delay; a worker
/// whose clients all went idle does not, so its resident size would stay at its busiest.
/// Each worker is asked to collect once a burst of parking has ended (no parks for a
/// second), or every ten seconds while clients keep being parked; and once more three
/// seconds later, for what the runtime frees after the tasks end (readiness records are
/// released on the worker's next turn, task cells when the last waker is dropped).
#[derive(Default)]
struct Reclaim {
    parks_seen: u64,
    parks_collected: u64,
    last: Option<Instant>,
    /// Ticks until the follow-up collection; 0 when none is due.
    again_in: u8,
}

impl Reclaim {
    fn tick(&mut self, parks: u64) {
        let settled = parks == self.parks_seen;
        let overdue = self
            .last
            .is_none_or(|t| t.elapsed() >= Duration::from_secs(10));
        self.parks_seen = parks;
        if parks != self.parks_collected && (settled || overdue) {
            self.parks_collected = parks;
            self.last = Some(Instant::now());
            self.again_in = 3;
            collect_on_workers();
        } else if self.again_in > 0 {
            self.again_in -= 1;
            if self.again_in == 0 {
                collect_on_workers();
            }
        }
    }
}

fn collect_on_workers() {
    for worker in 0..crate::workers::count() {
        crate::workers::spawn_on(worker, async {
            // SAFETY: takes no pointers; collects the calling thread's heap.
            unsafe { libmimalloc_sys::mi_collect(true) };
        });
    }
}

/// Takes every parked session out of the lot (for an online restart, crate::takeover):
/// their sockets are off the lot's epoll set, their tasks are the caller's to give.
// Boxed as they were parked, and as they go on: unboxing would copy each session twice.
#[allow(clippy::vec_box)]
pub fn take_all() -> Vec<Box<Session>> {
    let Some(lot) = LOT.as_ref() else {
        return Vec::new();
    };
    let taken: Vec<(u32, Box<Session>)> = lot.parked().drain().collect();
    taken
        .into_iter()
        .map(|(pid, session)| {
            session.client.0.set_unparked();
            if let Some(fd) = session.stream.parked_fd() {
                let _ = lot.epoll_ctl(libc::EPOLL_CTL_DEL, fd, pid);
            }
            session
        })
        .collect()
}
