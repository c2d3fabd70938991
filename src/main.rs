//! Weir: a multi-threaded PostgreSQL connection pooler, a drop-in replacement for PgBouncer.

use std::process::ExitCode;

#[global_allocator]
static ALLOCATOR: mimalloc::MiMalloc = mimalloc::MiMalloc;

/// mimalloc.h (v2) `mi_option_purge_delay`, which the -sys crate does not name.
const MI_OPTION_PURGE_DELAY: libmimalloc_sys::mi_option_t = 15;

fn main() -> ExitCode {
    // mimalloc v2 hands freed pages back to the OS 10 ms after they empty; with a client
    // per transaction (-C) that is a madvise and fresh page faults many times a second
    // (+3-5% of the pooler's system time measured). A second is plenty; the memory of
    // parked clients' tasks is handed back on purpose (client::park).
    // SAFETY: sets a plain option before any thread is started.
    unsafe { libmimalloc_sys::mi_option_set(MI_OPTION_PURGE_DELAY, 1000) };
    weir::run()
}
