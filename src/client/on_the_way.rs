//! Putting a lent server into the client's session state on the way: the query that does
//! it (gucs::on_the_way) goes in the same write as the client's request, and its answers
//! are removed from what the server sends back, so a hand-over to a client with state of
//! its own costs no round trip. Where that is not safe, the query runs first, apart.
//! Likewise the read-back after a request of SETs (client::state) is written behind it,
//! and its rows taken from what the server sends after the request's answer.

use super::relay::{Event, MAX_MESSAGE, PLAIN, TRAILING, UNSYNCED};
use super::{prepare, Session, INTERNAL_QUERY_TIMEOUT, OWED};
use crate::pool::{Lease, PoolMode};
use crate::protocol::framer::Frame;
use crate::protocol::{messages, PgError};
use crate::server::ServerConn;

/// What a read-back written behind a request has answered so far.
#[derive(Default)]
pub(super) struct ReadBackRows {
    rows: Vec<Vec<Option<String>>>,
    /// It failed (cut by the client's new statement_timeout, say): the session is read
    /// back apart after the transaction instead, as without this.
    failed: bool,
}

impl Session {
    /// On a server just lent for the client's request: makes it hold the client's
    /// parameters and settings, by a query written in front of the request when that is
    /// safe, else by one run first.
    pub(super) async fn put_state(&mut self, held: &mut Lease) -> Result<(), PgError> {
        let params_synced = self.params_synced(held);
        if params_synced && crate::gucs::same(held.gucs.as_ref(), self.gucs()) {
            return Ok(());
        }
        // No timeout short enough to cut Weir's statements, on the server as it is nor
        // once it has the client's settings.
        let time_ok =
            crate::gucs::leaves_time(held.gucs.as_ref()) && crate::gucs::leaves_time(self.gucs());
        if time_ok && self.may_go_on_the_way(held) {
            let way = crate::gucs::on_the_way(
                &held.params,
                params_synced,
                &self.wanted,
                held.gucs.as_ref(),
                self.gucs(),
            );
            if let crate::gucs::Way::Ahead(query) = &way {
                self.prepend(query);
                self.set_tie(OWED, true);
                self.pool.stats.count_state_applied(false);
            }
            if !matches!(way, crate::gucs::Way::Apart) {
                // As the server will be once the query has run: a request boarding
                // behind the client's (pool::pipeline) is compared with that, not with
                // what it was.
                held.params.take_values(&self.wanted);
                held.synced_to = Some(self.wanted.clone());
                held.gucs = self.gucs().cloned();
                return Ok(());
            }
        }
        let sql = self.state_sql(held);
        if sql.is_empty() {
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
    /// a statement that reads or writes rows, and nothing is framed after it; so is one
    /// whole request that opens a block (`opens_block_alone`).
    fn may_go_on_the_way(&mut self, held: &mut Lease) -> bool {
        if self.mode == PoolMode::Session {
            return false;
        }
        // Framed now rather than in the relay's first round: the same work, earlier.
        if self.scan_client(Some(&mut held.statements)).is_err() {
            return false;
        }
        self.cframe.scanned() > 0 && (self.exchange.has(PLAIN) || self.led_by_a_refusable())
    }

    /// One whole request (a Query, or extended-protocol messages up to their Sync) whose
    /// first message is a Query or Parse of BEGIN or START TRANSACTION (the transactions
    /// of ORMs and drivers that are not in autocommit), or a Query of SETs and RESETs only
    /// (a schema-per-tenant app's `SET search_path` at each checkout). In the block a
    /// failed state query leaves, PostgreSQL refuses that first statement (only COMMIT,
    /// ROLLBACK and PREPARE TRANSACTION pass there) and so skips the rest of the Query, or
    /// all up to the Sync.
    fn led_by_a_refusable(&self) -> bool {
        let x = &self.exchange;
        if x.pending != 1 || x.has(UNSYNCED) || !self.cframe.at_boundary() {
            return false;
        }
        let framed = self.inbuf.get(..self.cframe.scanned()).unwrap_or_default();
        let (Some(&tag), Some(len)) = (framed.first(), framed.get(1..5)) else {
            return false;
        };
        let len = u32::from_be_bytes([len[0], len[1], len[2], len[3]]) as usize;
        let Some(body) = framed.get(5..(1 + len).max(5)) else {
            return false;
        };
        match tag {
            b'Q' => {
                let text = body.strip_suffix(b"\0").unwrap_or(body);
                crate::sql::opens_block(text) || crate::sql::effects::only_settings(text)
            }
            // The statement's name, then its text.
            b'P' => crate::sql::opens_block(body.splitn(3, |&c| c == 0).nth(1).unwrap_or_default()),
            _ => false,
        }
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
        let owed = std::mem::take(&mut held.owed_internal) > 0;
        self.set_tie(OWED, owed);
        let rest = std::mem::take(&mut held.prefix_rest);
        if !rest.is_empty() {
            self.prepend(&rest);
        }
    }

    /// After the client's request `frame` (a Query just framed): when it is a whole
    /// implicit transaction on an idle server (nothing before it outstanding, and no
    /// statement in it that controls transactions or copies, sql::effects::stays_idle),
    /// writes the read-back it calls for behind it, in the same write, so that the
    /// session needs no round trip of its own to be read: after SETs, RESET ALL,
    /// set_config(), DO. The read-back runs in a transaction of its own, after the
    /// request, whatever it did; a read-back that fails there (cut by the client's new
    /// statement_timeout, say) is run apart instead.
    pub(super) fn read_back_on_the_way(&mut self, frame: &Frame) -> bool {
        let x = &self.exchange;
        if x.has(TRAILING)
            || self.owed()
            || self.touched == 0
            || x.pending != 1
            || x.has(UNSYNCED)
            || x.status != b'I'
            || self.pinned()
            || self.listening()
            || !self.cframe.at_boundary()
        {
            return false;
        }
        let end = self.cframe.scanned();
        let Some(text) = frame
            .body
            .as_ref()
            .filter(|b| b.end == end)
            .and_then(|b| self.inbuf.get(b.clone()))
            .and_then(|b| b.strip_suffix(b"\0"))
        else {
            return false;
        };
        if !crate::sql::effects::stays_idle(text) {
            return false;
        }
        let Some(sql) = self.read_back_sql() else {
            return false;
        };
        let mut query = bytes::BytesMut::new();
        messages::query(&mut query, &sql);
        prepare::splice(&mut self.inbuf, end..end, &query);
        self.cframe.rewritten(end, query.len());
        self.delta.received = self.delta.received.saturating_sub(query.len() as u64);
        self.exchange.set(TRAILING, true);
        self.extras.get_or_insert_with(Box::default).read_back = Some(Box::default());
        true
    }

    /// A read-back was written behind the client's request and its answer is not in.
    pub(super) fn reading_back(&self) -> bool {
        self.exchange.has(TRAILING) || self.extras.as_ref().is_some_and(|x| x.read_back.is_some())
    }

    /// Removes the next message of the answer to Weir's query from what the server sent.
    /// Ok(false) when it has not all come yet; Err with what ends the relay when the
    /// query failed (the client's request behind it was refused) or the server sent
    /// something that is no message.
    pub(super) fn swallow_internal(&mut self, server: &mut ServerConn) -> Result<bool, Event> {
        let frame = match self.sframe.next(&self.outbuf, MAX_MESSAGE, |_| true) {
            Ok(Some(f)) => f,
            Ok(None) => return Ok(false),
            Err(_) => return Err(Event::ServerGone),
        };
        let body = frame.body.clone().unwrap_or_default();
        let body = self.outbuf.get(body).unwrap_or_default();
        // While the read-back is still behind the request (TRAILING), what is owed is the
        // state query in front of it.
        let read_back = match self.exchange.has(TRAILING) {
            true => None,
            false => self.extras.as_mut().and_then(|x| x.read_back.take()),
        };
        if let Some(mut rb) = read_back {
            match frame.tag {
                b'D' => match crate::server::data_row(body) {
                    Some(row) => rb.rows.push(row),
                    None => rb.failed = true,
                },
                b'E' => rb.failed = true,
                b'Z' => {
                    let idle = body.first() == Some(&b'I');
                    self.set_tie(OWED, false);
                    self.remove_server_message(&frame);
                    if !rb.failed && idle {
                        let flags = std::mem::take(&mut self.touched);
                        if let Some(x) = self.extras.as_mut() {
                            x.touched_names.clear();
                        }
                        self.apply_read_back(&mut server.gucs, flags, rb.rows);
                    }
                    return Ok(true);
                }
                _ => {}
            }
            if let Some(x) = self.extras.as_mut() {
                x.read_back = Some(rb);
            }
            self.remove_server_message(&frame);
            return Ok(true);
        }
        let status = body.first().copied();
        let cut = self.extras.as_mut().and_then(|x| x.state_cut.take());
        let mut keep = None;
        let outcome = match (frame.tag, cut) {
            (b'E', None) if crate::protocol::error_code(body) == Some(b"57014".as_slice()) => {
                keep = Some(StateCut::Cancelled(PgError::parse(body)));
                Ok(())
            }
            (b'E', _) => {
                let mut e = PgError::parse(body);
                e.severity = "FATAL".into();
                Err(Event::StateFailed(e))
            }
            // BEGIN's answer: the rest's is still to come.
            (b'Z', None) if status == Some(b'T') => Ok(()),
            // The block is aborted: PostgreSQL refuses the client's request behind (it
            // does not begin by ending a block, see may_go_on_the_way), and everything
            // after it.
            (b'Z', Some(StateCut::Cancelled(e))) if status == Some(b'E') => {
                Err(Event::StateCancelled(e))
            }
            // BEGIN itself was cancelled: the rest runs outside a block, as the
            // transaction of its own Query, and its answers are still owed.
            (b'Z', Some(StateCut::Cancelled(_))) => {
                keep = Some(StateCut::BeginRefused);
                Ok(())
            }
            (b'Z', _) => {
                self.ties &= !OWED;
                // Without an error before it, the block was committed.
                match status {
                    Some(b'I') => Ok(()),
                    _ => Err(Event::StateFailed(PgError::fatal(
                        "08P01",
                        "session state query left a transaction open",
                    ))),
                }
            }
            // The values asked for, which the server was taken to hold when the query was
            // written. Not applied now: a request that boarded behind the client's since
            // has had its own taken in the same way, which these would overwrite.
            (_, cut) => {
                keep = cut;
                Ok(())
            }
        };
        if keep.is_some() {
            self.extras.get_or_insert_with(Box::default).state_cut = keep;
        }
        self.remove_server_message(&frame);
        outcome.map(|()| true)
    }
}

/// A cancel (57014) that hit Weir's state query written in front of the client's request,
/// until that query's ReadyForQuery says what it did.
pub(super) enum StateCut {
    /// Its error, to be given to the client once the block it aborted is seen.
    Cancelled(PgError),
    /// It hit BEGIN: the block never opened, and the rest of the query runs on its own.
    BeginRefused,
}
