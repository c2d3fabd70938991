//! Thread per core. Each worker thread runs a single-threaded runtime that accepts on its
//! own sockets and runs its clients' tasks start to finish: no work stealing, no waking a
//! parked thread to hand it a task (a multi-threaded runtime spent more CPU on that, futex
//! waits and wakes, than on relaying when clients connect per transaction). Pools, limits
//! and statistics are shared by all workers, so the limits stay global.

use std::cell::Cell;
use std::io;

/// Not a worker: the main thread (signals, admin timers, metrics).
pub const MAIN: usize = usize::MAX;

thread_local! {
    static CURRENT: Cell<usize> = const { Cell::new(MAIN) };
}

/// The worker this code runs on.
pub fn current() -> usize {
    CURRENT.with(Cell::get)
}

static MAIN_RUNTIME: std::sync::OnceLock<tokio::runtime::Handle> = std::sync::OnceLock::new();

/// Records the main thread's runtime, for `spawn_background`.
pub fn set_main_runtime(handle: tokio::runtime::Handle) {
    let _ = MAIN_RUNTIME.set(handle);
}

/// Runs periodic housekeeping on the main thread. A timer on a worker would make every
/// one of that worker's trips through its event loop look at the timer wheel, on the
/// path of every client it serves.
pub fn spawn_background<F>(future: F)
where
    F: std::future::Future<Output = ()> + Send + 'static,
{
    match MAIN_RUNTIME.get() {
        Some(main) => {
            main.spawn(future);
        }
        None => {
            tokio::spawn(future);
        }
    }
}

/// The workers' runtimes, for sessions resumed from the parking lot (client::park).
static WORKERS: std::sync::OnceLock<Vec<tokio::runtime::Handle>> = std::sync::OnceLock::new();

/// Runs a client's task on worker `i` (the main thread's runtime if there is no such
/// worker).
pub fn spawn_on<F>(i: usize, future: F)
where
    F: std::future::Future<Output = ()> + Send + 'static,
{
    match WORKERS.get().and_then(|w| w.get(i)) {
        Some(worker) => {
            worker.spawn(future);
        }
        None => spawn_background(future),
    }
}

/// How many workers run.
pub fn count() -> usize {
    WORKERS.get().map_or(0, Vec::len)
}

/// Starts a worker thread for each element of `per_worker`, each with its own runtime,
/// on which `serve(i, element)` runs first (it spawns the worker's listeners); the
/// runtime then serves what they spawned until the process exits. What a worker serves is
/// the caller's: this layer knows threads and runtimes, not listeners.
pub fn start<W, F, Fut>(per_worker: Vec<W>, serve: F) -> io::Result<()>
where
    W: Send + 'static,
    F: Fn(usize, W) -> Fut + Clone + Send + 'static,
    Fut: std::future::Future<Output = ()>,
{
    let mut runtimes = Vec::new();
    for _ in 0..per_worker.len() {
        runtimes.push(
            // No time driver: timers are armed in the main runtime (see `timers`).
            tokio::runtime::Builder::new_current_thread()
                .enable_io()
                .build()?,
        );
    }
    let _ = WORKERS.set(runtimes.iter().map(|r| r.handle().clone()).collect());
    for (i, (work, runtime)) in per_worker.into_iter().zip(runtimes).enumerate() {
        let serve = serve.clone();
        std::thread::Builder::new()
            .name(format!("weir-worker-{i}"))
            .spawn(move || {
                CURRENT.with(|c| c.set(i));
                runtime.block_on(async move {
                    serve(i, work).await;
                    // Clients and their timers live on this runtime until the process exits.
                    std::future::pending::<()>().await
                })
            })?;
    }
    Ok(())
}
