//! Taking a released server back: it goes to the client pipelined behind, else straight
//! to the longest waiter (its request written first when it left one, see ahead), else
//! idle; and free slots go to waiters as soon as size, shared limits and the login retry
//! allow. Handing over here, under the one lock, is what keeps waiters from being
//! overtaken.

use std::time::Instant;

use super::{Conn, Pool, Slot};
use crate::server::passenger::Grant;

impl Pool {
    /// Takes back a clean server: the client whose request was pipelined behind the
    /// last one gets it, else the longest waiter, else it goes idle.
    pub(super) fn checkin(&self, mut conn: Conn) {
        if let Some(next) = conn.passengers.pop_front() {
            conn.sent_ahead = next.sent;
            conn.owed_internal = next.owed_internal;
            conn.prefix_rest = next.prefix_rest.clone();
            match next.hand(conn) {
                Ok(()) => return,
                Err(c) if c.holds_ahead() => {
                    // The passenger has gone: its request's answer is owed to nobody.
                    crate::conn_log::server_closing(
                        &c.info.0,
                        "client gone while its request was pipelined",
                    );
                    self.close_lent(*c);
                    return;
                }
                Err(c) => {
                    // Gone before anything of its request was written: the server is
                    // as after any request, but for what was read past the last answer
                    // (asynchronous messages), which is nobody's now.
                    conn = c;
                    conn.carry = bytes::Bytes::new();
                    conn.sent_ahead = 0;
                    conn.prefix_rest = bytes::Bytes::new();
                }
            }
        }
        let settings = self.settings();
        // Another pool waits on a shared limit this server counts against: unless a client
        // of this pool wants it, close it so that the other pool can connect (checked
        // before taking this pool's lock, as it locks the other pools).
        let make_room = settings.limits.others_waiting(self);
        let now = Instant::now();
        let mut st = self.lock();
        // Over the size only after a reload made the pool smaller: such a server is closed
        // even when clients wait, or a busy pool would never shrink (they wait for the
        // next one, as the pool is still at its size).
        let oversize = st.total > settings.pool_size + settings.reserve_pool_size;
        if conn.generation != settings.target.generation
            || (!settings.server_lifetime.is_zero()
                && now.saturating_duration_since(conn.created) >= settings.server_lifetime)
            || oversize
            || (make_room && st.waiters.is_empty())
        {
            st.total -= 1;
            drop(st);
            let stale = conn.generation != settings.target.generation;
            crate::conn_log::server_closing(
                &conn.info.0,
                crate::conn_log::checkin_reason(stale, oversize || make_room),
            );
            self.closed_idle(*conn);
            return;
        }
        while let Some(w) = st.waiters.pop_front() {
            if w.tx.is_closed() {
                continue;
            }
            // Under the lock, so that a waiter taking a reserve slot instead (also under
            // it) cannot have its request run twice.
            if let Some(a) = &w.ahead {
                a.send(&mut conn);
                if conn.owed_internal > 0 {
                    self.stats.count_state_applied(false);
                }
            }
            match w.tx.send(Grant::Server(conn)) {
                Ok(()) => return,
                Err(Grant::Server(c)) if c.holds_ahead() => {
                    // The waiter left as its request went: the server owes an answer nobody
                    // reads, so it cannot be pooled.
                    drop(st);
                    self.close_lent(*c);
                    return;
                }
                Err(Grant::Server(c)) => conn = c,
                Err(Grant::Connect | Grant::Lost | Grant::Refused(_)) => return,
            }
        }
        conn.idle_since = now;
        st.idle.push_back(conn);
    }

    /// Gives free slots to waiters, as long as size, limits and the login retry allow.
    pub fn grant_free_slots(&self) {
        let settings = self.settings();
        let mut unused_slot = false;
        {
            let mut st = self.lock();
            loop {
                while st.waiters.front().is_some_and(|w| w.tx.is_closed()) {
                    st.waiters.pop_front();
                }
                if st.waiters.is_empty() {
                    break;
                }
                if !matches!(self.take_slot(&mut st, &settings, false), Slot::Granted) {
                    break;
                }
                let mut sent = false;
                while let Some(w) = st.waiters.pop_front() {
                    if w.tx.send(Grant::Connect).is_ok() {
                        sent = true;
                        break;
                    }
                }
                if !sent {
                    st.total -= 1;
                    st.connecting -= 1;
                    unused_slot = true;
                    break;
                }
            }
        }
        if unused_slot {
            settings.limits.return_units();
        }
    }
}
