//! Sending a queued client's request from the task that releases a server.
//!
//! When clients outnumber servers, a released server goes to the longest waiter. Waking
//! the waiter and letting it write its query leaves the server idle until the waiter's
//! task gets its turn on the worker, behind every other task that became ready meanwhile
//! (hundreds, with a thousand clients). PgBouncer forwards the waiting client's query in
//! the same step that frees the server; so does this: the waiter leaves a copy of its
//! request in the queue, and the releasing task writes it to the server before handing
//! the server over, so PostgreSQL works while the waiter is still on its way.

use std::sync::Arc;

use bytes::Bytes;

use crate::gucs::Gucs;
use crate::params::ParamSet;
use crate::registry::clients::ClientInfo;
use crate::server::ServerConn;

/// A waiter's request, whole messages only, as it arrived.
pub struct Ahead {
    pub bytes: Bytes,
    /// The session parameters the client expects: the request may only go ahead to a
    /// server already known to have them (otherwise SETs must run first).
    pub wanted: Arc<ParamSet>,
    /// Likewise its unreported settings (see gucs).
    pub gucs: Option<Arc<Gucs>>,
    /// Where the waiter and the releaser agree which of them sends the request: the
    /// releaser claims it unless the waiter has given up its place (cancel, timeout).
    pub client: Arc<ClientInfo>,
    /// Prepared statements (Weir's ids) the request names: it was rewritten as if the
    /// server held them, so it may only go to one that does.
    pub statements: Vec<u64>,
    /// The request is one plain implicit transaction, whole (sql::pipeline): it may be
    /// sent behind another's.
    pub plain: bool,
}

impl Ahead {
    /// Writes the request to `conn` if it can go without waiting, and records in
    /// `conn.sent_ahead` how many bytes went (the waiter sends the rest). Nothing is sent
    /// once the waiter has withdrawn.
    pub(super) fn send(&self, conn: &mut ServerConn) {
        if self.fits(conn) && self.client.claim_handoff() {
            conn.sent_ahead = conn.stream.try_write(&self.bytes).unwrap_or(0);
        }
    }

    /// Writes the request to `conn` behind the request running there (see pipeline), if
    /// it is one plain implicit transaction that fits the server. Returns the bytes
    /// written (perhaps none: the waiter then sends it all once it has the server), or
    /// None when it may not go.
    pub(super) fn board(&self, conn: &mut ServerConn) -> Option<usize> {
        if !self.plain || !self.fits(conn) || !self.client.claim_handoff() {
            return None;
        }
        Some(conn.stream.try_write(&self.bytes).unwrap_or(0))
    }

    /// The server holds what the request was written for.
    fn fits(&self, conn: &mut ServerConn) -> bool {
        // Clients with the same parameters mostly share one set (server::welcome); one
        // with its own copy is compared value by value.
        let synced = conn
            .synced_to
            .as_ref()
            .is_some_and(|s| Arc::ptr_eq(s, &self.wanted) || **s == *self.wanted);
        synced
            && crate::gucs::same(conn.gucs.as_ref(), self.gucs.as_ref())
            && self.statements.iter().all(|&id| conn.statements.touch(id))
    }
}
