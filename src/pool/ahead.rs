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

use bytes::{Bytes, BytesMut};

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
    /// server held them, so it may only go to one that does; with the hash of the
    /// description the client was given of each it described, which the server's must
    /// be (prepared::check).
    pub statements: Vec<(u64, Option<u64>)>,
    /// The request is one plain implicit transaction, whole (sql::pipeline): it may be
    /// sent behind another's.
    pub plain: bool,
}

/// What went of a request boarded behind another's (`Ahead::board`).
pub(super) struct Boarded {
    /// Bytes of the request written.
    pub sent: usize,
    /// The answers to Weir's query that puts the server into the client's state, written
    /// in front of the request, that the client is to remove (see ServerConn).
    pub owed_internal: u8,
    /// What of that query is still to be written.
    pub prefix_rest: Bytes,
}

impl Ahead {
    /// Writes the request to `conn` if it can go without waiting, and records in
    /// `conn.sent_ahead` how many bytes went (the waiter sends the rest). Nothing is sent
    /// once the waiter has withdrawn.
    pub(super) fn send(&self, conn: &mut ServerConn) {
        let Some(prefix) = self.prefix(conn) else {
            return;
        };
        if !self.client.claim_handoff() {
            return;
        }
        let b = self.write(conn, prefix);
        conn.sent_ahead = b.sent;
        conn.owed_internal = b.owed_internal;
        conn.prefix_rest = b.prefix_rest;
    }

    /// Writes the request to `conn` behind the request running there (see pipeline), if
    /// it is one plain implicit transaction that fits the server. Returns what was
    /// written (perhaps nothing: the waiter then sends it all once it has the server),
    /// or None when it may not go.
    pub(super) fn board(&self, conn: &mut ServerConn) -> Option<Boarded> {
        if !self.plain {
            return None;
        }
        let prefix = self.prefix(conn)?;
        if !self.client.claim_handoff() {
            return None;
        }
        Some(self.write(conn, prefix))
    }

    /// Writes the request, behind the query that puts the server into the client's state
    /// when there is one; the server is taken to hold that state from now on (should the
    /// query fail, the client's request fails with it and the server is closed).
    fn write(&self, conn: &mut ServerConn, prefix: Option<BytesMut>) -> Boarded {
        let Some(mut buf) = prefix else {
            return Boarded {
                sent: conn.stream.try_write(&self.bytes).unwrap_or(0),
                owed_internal: 0,
                prefix_rest: Bytes::new(),
            };
        };
        let prefix_len = buf.len();
        buf.extend_from_slice(&self.bytes);
        let n = conn.stream.try_write(&buf).unwrap_or(0);
        // As the server will be once the query has run: another request boarding
        // behind this one is compared with that, not with what it held before.
        conn.params.take_values(&self.wanted);
        conn.gucs = self.gucs.clone();
        conn.synced_to = Some(self.wanted.clone());
        Boarded {
            sent: n.saturating_sub(prefix_len),
            owed_internal: 1,
            prefix_rest: Bytes::copy_from_slice(&buf[n.min(prefix_len)..prefix_len]),
        }
    }

    /// Whether the request may go to `conn`: Some(None) when the server holds what it
    /// was written for; Some(query) when it is plain and the server can be put into the
    /// client's state by a query written in front of it (gucs::on_the_way); None when it
    /// may not go.
    fn prefix(&self, conn: &mut ServerConn) -> Option<Option<BytesMut>> {
        let held = |&(id, told): &(u64, Option<u64>)| {
            conn.statements.touch(id)
                && told.is_none_or(|h| conn.statements.described(id) == Some(h))
        };
        if !self.statements.iter().all(held) {
            return None;
        }
        // Clients with the same parameters mostly share one set (server::welcome); one
        // with its own copy is compared value by value.
        let params_synced = conn
            .synced_to
            .as_ref()
            .is_some_and(|s| Arc::ptr_eq(s, &self.wanted) || **s == *self.wanted);
        if params_synced && crate::gucs::same(conn.gucs.as_ref(), self.gucs.as_ref()) {
            return Some(None);
        }
        if !self.plain
            || !crate::gucs::leaves_time(conn.gucs.as_ref())
            || !crate::gucs::leaves_time(self.gucs.as_ref())
        {
            return None;
        }
        match crate::gucs::on_the_way(
            &conn.params,
            params_synced,
            &self.wanted,
            conn.gucs.as_ref(),
            self.gucs.as_ref(),
        ) {
            crate::gucs::Way::Nothing => Some(None),
            crate::gucs::Way::Ahead(query) => Some(Some(query)),
            crate::gucs::Way::Apart => None,
        }
    }
}
