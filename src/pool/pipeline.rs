//! Pipelined transaction pooling: a waiting client's request sent to a busy server.
//!
//! In transaction mode a server is idle for a whole round trip between one client's
//! ReadyForQuery and the next client's request reaching it. When the pool has no idle
//! server and clients wait, the task holding a server whose request is all written (and
//! owes nothing but its answer) writes the request of the client at the head of the queue
//! behind it, and keeps that client's grant: at its own ReadyForQuery the server goes
//! straight to that client (pool::checkin), with the bytes of its answer already read
//! (`ServerConn::carry`). The server works while the answer travels.
//!
//! Only when that is indistinguishable from running the two one after the other: both
//! requests are one plain implicit transaction (sql::pipeline): one simple Query with one
//! statement, or one extended-protocol batch ending in its Sync, that neither opens a
//! transaction nor changes the session; and the server holds the waiter's statements
//! and, already or by a query written in front of its request (gucs::on_the_way), its
//! parameters and settings (`Ahead::board`). An error in the first does not
//! reach the second: PostgreSQL ends a failed simple Query at its ReadyForQuery, and
//! after an error in an extended batch it skips only to that batch's Sync, which precedes
//! the second request.
//!
//! A server lost with passengers aboard fails their requests as it fails its holder's
//! (`Passenger`'s drop): each is told what a client whose server died under its request
//! is told, and never has it run again (it may have run).

use std::sync::atomic::{AtomicU8, Ordering};
use std::sync::Arc;
use std::time::Duration;

use super::Pool;
use crate::server::passenger::{runs_again, Passenger};
use crate::server::ServerConn;

/// A waiting client asked to cancel its request, which has gone to a busy server already:
/// until it has that server (and sends the cancel on), nothing more is sent behind a
/// request on its pool, since once its request ends the cancel could only hit theirs.
pub struct HoldBoarding(Arc<Pool>);

impl Drop for HoldBoarding {
    fn drop(&mut self) {
        self.0.cancels_aboard.fetch_sub(1, Ordering::Relaxed);
    }
}

/// Settings of a pool's pipelining.
#[derive(Debug, Clone, Copy)]
pub struct PipelineSettings {
    /// Requests that may wait behind the running one on a server; 0: off.
    pub depth: usize,
    /// Nothing goes behind a request running this long, or like one that did lately.
    pub slow: Duration,
}

/// Slots of a pool's memory of slow requests, by fingerprint (sql::pipeline::fold).
const SLOW_SLOTS: usize = 4096;
/// What a run longer than pipeline_slow_query adds to its slot, and what a slot holds at
/// most; a quicker run of its like takes one off. A request is taken for slow while its
/// slot is above 0: after one slow run, until four quick ones have followed. A stall
/// (a checkpoint, a lock) does not stop pipelining behind a query for good, and a query
/// slow one time in four or more stays known.
const SLOW_RUN: u8 = 4;
const SLOW_MOST: u8 = 16;

fn slot(print: u16) -> usize {
    usize::from(print) % SLOW_SLOTS
}

impl Pool {
    /// Sends the requests of the clients at the head of the queue to `conn`, behind the
    /// holder's (fingerprint `print`, running for `age`), as far as depth allows.
    /// Returns how many went.
    pub(crate) fn board(&self, conn: &mut ServerConn, print: u16, age: Duration) -> usize {
        if !self.queued.load(Ordering::Relaxed) {
            return 0;
        }
        let settings = self.settings();
        let p = settings.pipeline;
        if conn.passengers.len() >= p.depth
            || age >= p.slow
            || self.cancels_aboard.load(Ordering::Relaxed) > 0
            // A cancel on its way for the running request could hit one behind it.
            || conn.info.0.being_canceled()
            || conn.stream.is_tls()
            || settings.server_reset_query_always
            || conn.passengers.back().is_some_and(|b| !b.whole)
            || self.known_slow(print)
        {
            return 0;
        }
        let mut boarded = 0;
        {
            let mut st = self.lock();
            while conn.passengers.len() < p.depth {
                while st.waiters.front().is_some_and(|w| w.tx.is_closed()) {
                    st.waiters.pop_front();
                }
                let Some(w) = st.waiters.front() else {
                    break;
                };
                // Only the head: a waiter behind one that cannot go is not let past it.
                let Some(b) = w.ahead.as_ref().and_then(|a| a.board(conn)) else {
                    break;
                };
                let Some(w) = st.waiters.pop_front() else {
                    break;
                };
                let whole = w.ahead.as_ref().is_some_and(|a| a.bytes.len() == b.sent);
                let again = whole && w.ahead.as_ref().is_some_and(|a| runs_again(&a.bytes));
                if b.owed_internal > 0 {
                    self.stats.count_state_applied(false);
                }
                let mut p = Passenger::new(w.tx, b.sent, whole, self.aboard.clone());
                p.owed_internal = b.owed_internal;
                p.prefix_rest = b.prefix_rest;
                p.runs_again = again;
                conn.passengers.push_back(p);
                boarded += 1;
                if !whole {
                    break;
                }
            }
            if st.waiters.is_empty() {
                self.queued.store(false, Ordering::Relaxed);
            }
        }
        if boarded > 0 {
            self.stats.add_pipelined(boarded as u64);
        }
        boarded
    }

    /// Requests that may go behind the running one on a server of this pool: 0 when
    /// pipelining is off (pool mode, settings); a server reached over TLS never pipelines.
    pub fn pipeline_depth(&self) -> usize {
        let settings = self.settings();
        if settings.server_reset_query_always {
            0
        } else {
            settings.pipeline.depth
        }
    }

    /// Holds all pipelining on this pool back while a passenger's cancel waits.
    pub fn hold_boarding(self: &Arc<Self>) -> HoldBoarding {
        self.cancels_aboard.fetch_add(1, Ordering::Relaxed);
        HoldBoarding(self.clone())
    }

    /// Whether clients may be waiting (a hint, cleared when `board` finds none).
    pub(crate) fn may_have_waiters(&self) -> bool {
        self.queued.load(Ordering::Relaxed)
    }

    /// Waiting clients whose request is on a busy server behind another's.
    pub fn pipelined_now(&self) -> usize {
        self.aboard.load(Ordering::Relaxed)
    }

    /// A plain request of fingerprint `print` ran longer than pipeline_slow_query, or
    /// did not: what is sent behind its like from now on depends on it (`SLOW_RUN`).
    pub(crate) fn note_run(&self, print: u16, slow: bool) {
        if slow {
            let slots = self
                .slow
                .get_or_init(|| (0..SLOW_SLOTS).map(|_| AtomicU8::new(0)).collect());
            let s = &slots[slot(print)];
            // Racing updates may lose one: it only steers a heuristic.
            let v = s.load(Ordering::Relaxed);
            s.store(v.saturating_add(SLOW_RUN).min(SLOW_MOST), Ordering::Relaxed);
        } else if let Some(slots) = self.slow.get() {
            let s = &slots[slot(print)];
            let v = s.load(Ordering::Relaxed);
            if v > 0 {
                s.store(v - 1, Ordering::Relaxed);
            }
        }
    }

    fn known_slow(&self, print: u16) -> bool {
        self.slow
            .get()
            .is_some_and(|slots| slots[slot(print)].load(Ordering::Relaxed) > 0)
    }
}
