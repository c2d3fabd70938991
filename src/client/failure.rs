//! What a client hears when its server or its request fails: a lost server mid-request,
//! a request answered with an error instead of being run, a session ended with a FATAL.
//! Rare steps, kept apart from the relay's hot path.

use tokio::io::AsyncWriteExt;

use super::relay::Exchange;
use super::{prepare, refuse, Session, LOST};
use crate::pool::{lost_request, Lease, PoolMode};
use crate::protocol::framer::Framer;
use crate::protocol::messages;
use crate::protocol::PgError;

impl Session {
    /// The server of a transaction (in transaction or statement mode) went away: what it
    /// sent whole is passed on (a FATAL sent while the client owed nothing was held back
    /// by the relay), the requests it left unanswered are answered with an error, a client
    /// idle in its transaction gets the error at its next request, and the client stays,
    /// to run its next transaction on another server. Some(reason) if the client is gone.
    pub(super) async fn survive_lost_server(&mut self) -> Option<String> {
        let pending = self.drop_unanswered();
        if !self.flush_client().await {
            return Some("client unexpected eof".into());
        }
        if pending == 0 {
            self.set_tie(LOST, true);
            return None;
        }
        let e = lost_request();
        crate::conn_log::pooler_error(&self.client.0, &e.message);
        self.answer_pending(&e, pending).await
    }

    /// The client's request was refused unrun on a server now closed (a cancel hit the
    /// state query in front of it, see on_the_way): it is answered with `error`, as a
    /// direct connection answers a cancelled request, and the client stays. Extended-
    /// protocol messages whose Sync is still to come are answered when it comes, the
    /// rest up to it dropped, as PostgreSQL skips to Sync after an error.
    pub(super) async fn answer_unrun(&mut self, error: PgError) -> Option<String> {
        let unsynced = self.exchange.has(super::relay::UNSYNCED);
        let pending = self.drop_unanswered();
        if !self.flush_client().await {
            return Some("client unexpected eof".into());
        }
        if unsynced {
            return self.fail_request(&error).await.err();
        }
        self.answer_pending(&error, pending).await
    }

    /// Forgets what was framed for a server that is gone, and the requests it owed an
    /// answer; returns how many those were.
    fn drop_unanswered(&mut self) -> u32 {
        // Client messages framed (and counted as owed an answer) but not sent are
        // answered with the others.
        let framed = self.cframe.scanned();
        let _ = self.inbuf.split_to(framed);
        // The replies the relay expected from the lost server (ParseComplete, a Describe
        // to answer, statements it was to prepare) will not come: left, they would be
        // matched against the next server's answers, and a client waiting for one would
        // hang.
        self.forget_framed();
        let pending = self.exchange.pending;
        self.exchange = Exchange::fresh();
        self.query_started = None;
        self.xact_started = None;
        pending
    }

    /// The error and a ReadyForQuery for each of the `pending` requests: a request
    /// answered by a ReadyForQuery alone would look done (an INSERT that never ran).
    async fn answer_pending(&mut self, error: &PgError, pending: u32) -> Option<String> {
        let mut out = bytes::BytesMut::new();
        for _ in 0..pending {
            out.extend_from_slice(&crate::stats::error_response(error));
            messages::ready_for_query(&mut out, b'I');
        }
        if self.stream.write_all(&out).await.is_err() {
            return Some("client unexpected eof".into());
        }
        None
    }

    /// Closes a server something of the client's may linger in, then ends the client with
    /// `error`, first passing on what the server already said when `flush` is set.
    pub(super) async fn close_and_refuse(
        &mut self,
        held: Lease,
        error: PgError,
        flush: bool,
    ) -> String {
        crate::conn_log::server_closing(&held.info.0, &error.message);
        held.close().await;
        if flush {
            self.flush_client().await;
        }
        self.refuse(error).await
    }

    /// Forgets the request framed so far, and what its answer was expected to hold.
    pub(super) fn forget_framed(&mut self) {
        self.cframe.reset();
        // Weir's own queries framed with it (on_the_way) are gone with it too.
        self.set_tie(super::OWED, false);
        self.exchange.set(super::relay::TRAILING, false);
        if let Some(x) = self.extras.as_mut() {
            x.read_back = None;
            x.state_cut = None;
        }
        if let Some(p) = prepare::statements(&mut self.extras) {
            p.clear_replies();
            p.ahead.clear();
        }
    }

    /// Answers the client's queued request with an error instead of running it: its
    /// messages up to the next Query or Sync are dropped, as PostgreSQL skips to Sync
    /// after an error. Errs with the reason when the client is gone.
    pub(super) async fn fail_request(&mut self, error: &PgError) -> Result<(), String> {
        loop {
            let mut framer = Framer::default();
            let mut end = None;
            while let Ok(Some(f)) = framer.next(&self.inbuf, self.max_packet as usize, |_| true) {
                if matches!(f.tag, b'Q' | b'S') {
                    end = Some(framer.scanned());
                    break;
                }
            }
            if let Some(end) = end {
                let _ = self.inbuf.split_to(end);
                // What was framed while queueing is dropped with it.
                self.forget_framed();
                break;
            }
            match self.read_more().await {
                Ok(0) | Err(_) => return Err("client unexpected eof".into()),
                Ok(_) => {}
            }
        }
        crate::conn_log::pooler_error(&self.client.0, &error.message);
        let mut out = crate::stats::error_response(error);
        messages::ready_for_query(&mut out, b'I');
        self.stream
            .write_all(&out)
            .await
            .map_err(|_| "client unexpected eof".to_string())
    }

    /// Sends the client a fatal error and says why the session ended.
    pub(super) async fn refuse(&mut self, error: PgError) -> String {
        crate::conn_log::pooler_error(&self.client.0, &error.message);
        refuse(&mut self.stream, &error).await;
        error.into_fields().message
    }

    /// server_fast_close in session mode: the server must go (a reload changed how the
    /// pool connects, or RECONNECT marked it) and the session on it with it, as PgBouncer
    /// does, so that the client notices its session state is gone rather than carry on
    /// without it on another server.
    pub(super) fn fast_closed(&self, held: &Lease) -> bool {
        // RECONNECT retires servers by their generation too (admin::control).
        self.fast_close
            && self.mode == PoolMode::Session
            && held.generation != self.pool.settings().target.generation
    }

    /// Closes the server of a session `fast_closed` ends, then the client.
    pub(super) async fn end_fast_closed(&mut self, held: Lease) -> String {
        let e = PgError::fatal(
            "57P01",
            "server_fast_close: the server was closed by a configuration change (RECONNECT or RELOAD)",
        );
        self.close_and_refuse(held, e, true).await
    }
}
