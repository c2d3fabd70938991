//! Putting a lent server into the client's session state on the way: the query that does
//! it (gucs::on_the_way) goes in the same write as the client's request, and its answers
//! are removed from what the server sends back, so a hand-over to a client with state of
//! its own costs no round trip. Where that is not safe, the query runs first, apart.

use super::relay::{MAX_MESSAGE, PLAIN};
use super::{prepare, Session, INTERNAL_QUERY_TIMEOUT};
use crate::pool::{Lease, PoolMode};
use crate::protocol::PgError;

impl Session {
    /// On a server just lent for the client's request: makes it hold the client's
    /// parameters and settings, by a query written in front of the request when that is
    /// safe, else by one run first.
    pub(super) async fn put_state(&mut self, held: &mut Lease) -> Result<(), PgError> {
        // Of the server as it is, before the client's settings are taken for its own.
        let time_ok = crate::gucs::leaves_time(held.gucs.as_ref());
        let sql = self.state_sql(held);
        if sql.is_empty() {
            return Ok(());
        }
        if time_ok && self.may_go_on_the_way(held) {
            let query = crate::gucs::on_the_way(&sql);
            self.prepend(&query);
            self.internal = 1;
            // As the server will be once the query has run: a request boarding behind the
            // client's (pool::pipeline) is compared with that, not with what it was.
            held.params.take_values(&self.wanted);
            held.synced_to = Some(self.wanted.clone());
            self.pool.stats.count_state_applied(false);
            return Ok(());
        }
        self.pool.stats.count_state_applied(true);
        held.run_internal_boxed(&sql, INTERNAL_QUERY_TIMEOUT)
            .await
            .map_err(|e| e.to_client_error())
    }

    /// Whether the request may follow Weir's query in one write. Should the query fail,
    /// PostgreSQL refuses what follows in its aborted block; that protects the request
    /// only if it does not begin by ending the block (COMMIT, ROLLBACK) and nothing after
    /// it is written before the query's answer is in (the relay frames nothing more
    /// meanwhile). A plain request (sql::pipeline) is one whole implicit transaction of
    /// a statement that reads or writes rows, and nothing is framed after it.
    fn may_go_on_the_way(&mut self, held: &mut Lease) -> bool {
        if self.mode == PoolMode::Session {
            return false;
        }
        // Framed now rather than in the relay's first round: the same work, earlier.
        if self.scan_client(Some(&mut held.statements)).is_err() {
            return false;
        }
        self.exchange.has(PLAIN) && self.cframe.scanned() > 0
    }

    /// Puts whole messages of Weir's in front of what the client sent, to be written
    /// first.
    pub(super) fn prepend(&mut self, bytes: &[u8]) {
        prepare::splice(&mut self.inbuf, 0..0, bytes);
        self.cframe.prepended(bytes.len());
        // They are not the client's traffic, which the relay counts as it writes.
        self.delta.received = self.delta.received.saturating_sub(bytes.len() as u64);
    }

    /// On a server handed over with Weir's query already written in front of the
    /// client's request (pool::ahead): its answers are owed first, and what of it could
    /// not be written then goes now.
    pub(super) fn take_owed_state(&mut self, held: &mut Lease) {
        self.internal = std::mem::take(&mut held.owed_internal);
        let rest = std::mem::take(&mut held.prefix_rest);
        if !rest.is_empty() {
            self.prepend(&rest);
        }
    }

    /// Removes the next message of the answer to Weir's query from what the server sent.
    /// Ok(false) when it has not all come yet; Err(Some(error)) when the query failed
    /// (the client's request behind it was refused), Err(None) when the server sent
    /// something that is no message.
    pub(super) fn swallow_internal(&mut self) -> Result<bool, Option<PgError>> {
        let frame = match self.sframe.next(&self.outbuf, MAX_MESSAGE, |_| true) {
            Ok(Some(f)) => f,
            Ok(None) => return Ok(false),
            Err(_) => return Err(None),
        };
        let body = frame.body.clone().unwrap_or_default();
        let body = self.outbuf.get(body).unwrap_or_default();
        let outcome = match frame.tag {
            b'Z' => {
                self.internal = self.internal.saturating_sub(1);
                // Without an error before it, the block was committed.
                match body.first() {
                    Some(b'I') => Ok(()),
                    _ => Err(PgError::fatal(
                        "08P01",
                        "session state query left a transaction open",
                    )),
                }
            }
            b'E' => {
                let mut e = PgError::parse(body);
                e.severity = "FATAL".into();
                Err(e)
            }
            // The values asked for, which the server was taken to hold when the query was
            // written. Not applied now: a request that boarded behind the client's since
            // has had its own taken in the same way, which these would overwrite.
            _ => Ok(()),
        };
        self.remove_server_message(&frame);
        outcome.map(|()| true).map_err(Some)
    }
}
