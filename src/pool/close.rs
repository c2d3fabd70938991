//! Closing servers and giving their slots back: each path out of the pool (an idle
//! server closed, a lent one lost, a connect abandoned) must free its slot and its shared
//! units exactly once, then let the waiters have what was freed.

use std::collections::VecDeque;

use super::{Conn, Pool};
use crate::server::ServerConn;

impl Pool {
    /// Closes the idle servers connected to `addr` (a host whose role no longer fits the
    /// pool's target_session_attrs). Returns how many.
    pub fn close_idle_at(&self, addr: &crate::server::ServerAddr, reason: &str) -> usize {
        let gone: Vec<Conn> = {
            let mut st = self.lock();
            let (gone, keep): (VecDeque<Conn>, VecDeque<Conn>) = std::mem::take(&mut st.idle)
                .into_iter()
                .partition(|s| *s.addr == *addr);
            st.idle = keep;
            st.total -= gone.len();
            gone.into()
        };
        let n = gone.len();
        for s in gone {
            crate::conn_log::server_closing(&s.info.0, reason);
            self.closed_idle(*s);
        }
        n
    }

    /// Closes a server already taken out of the pool's count, and frees its shared units.
    pub(super) fn closed_idle(&self, conn: ServerConn) {
        let limits = self.settings().limits.clone();
        if limits.is_empty() {
            tokio::spawn(conn.terminate());
        } else {
            // Its unit of max_db_connections / max_user_connections goes to another pool
            // only once PostgreSQL has let the backend go: the server opened in its place
            // would otherwise find it still counted (as a role's connection limit counts
            // it), one over the limit for a moment.
            tokio::spawn(async move {
                conn.terminate_and_wait().await;
                limits.release();
            });
        }
        self.grant_free_slots();
    }

    /// Closes a server counted as lent (one that may not go back to the pool).
    pub(super) fn close_lent(&self, conn: ServerConn) {
        self.forget();
        tokio::spawn(conn.terminate());
    }

    /// A lent or granted slot is gone (its server closed, or its connect failed).
    pub(super) fn forget(&self) {
        self.lock().total -= 1;
        self.settings().limits.release();
        self.grant_free_slots();
    }

    /// A slot granted for a connection that will not be made (connect failed, or its
    /// holder gave up).
    pub(super) fn abandon_slot(&self) {
        {
            let mut st = self.lock();
            st.total -= 1;
            st.connecting -= 1;
        }
        self.settings().limits.release();
        self.grant_free_slots();
    }
}
