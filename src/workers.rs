//! Thread per core. Each worker thread runs a single-threaded runtime that accepts on its
//! own sockets and runs its clients' tasks start to finish: no work stealing, no waking a
//! parked thread to hand it a task (a multi-threaded runtime spent more CPU on that, futex
//! waits and wakes, than on relaying when clients connect per transaction). Pools, limits
//! and statistics are shared by all workers, so the limits stay global.

use std::cell::Cell;
use std::io;
use std::sync::Arc;

use crate::app::App;
use crate::listener::{self, StdListener};

/// Not a worker: the main thread (signals, admin timers, metrics).
pub const MAIN: usize = usize::MAX;

thread_local! {
    static CURRENT: Cell<usize> = const { Cell::new(MAIN) };
}

/// The worker this code runs on.
pub fn current() -> usize {
    CURRENT.with(Cell::get)
}

pub fn start(app: &Arc<App>, per_worker: Vec<Vec<StdListener>>) -> io::Result<()> {
    for (i, listeners) in per_worker.into_iter().enumerate() {
        let runtime = tokio::runtime::Builder::new_current_thread()
            .enable_all()
            .build()?;
        let app = app.clone();
        std::thread::Builder::new()
            .name(format!("weir-worker-{i}"))
            .spawn(move || {
                CURRENT.with(|c| c.set(i));
                runtime.block_on(async move {
                    for l in listeners {
                        match l.into_tokio() {
                            Ok(l) => {
                                tokio::spawn(listener::run(app.clone(), l));
                            }
                            Err(e) => tracing::error!("worker {i} cannot listen: {e}"),
                        }
                    }
                    // Clients and their timers live on this runtime until the process exits.
                    std::future::pending::<()>().await
                })
            })?;
    }
    Ok(())
}
