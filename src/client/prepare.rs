//! The relay's side of prepared statements in pooled modes (see crate::prepared): client
//! messages that name a statement are rewritten as they are framed, and the server's
//! replies are matched to them, with Weir's own removed and the ones it owes added.

use super::relay::{ANSWERED, CARRYING, TERMINATED, UNSYNCED};
use std::ops::Range;

use bytes::BytesMut;

use super::{Extras, Session};
use crate::pool::Pool;
use crate::prepared::answers::{self, ServerEdit};
use crate::prepared::check;
use crate::prepared::retry;
use crate::prepared::rewrite::{self, Context, Edit};
use crate::prepared::{ClientStatements, ServerStatements};
use crate::protocol::framer::Frame;
use crate::protocol::HEADER_LEN;

/// How much of a query to look at for DEALLOCATE ALL / DISCARD ALL.
const QUERY_PREFIX: usize = 64;

/// How much of a client message's body the relay must see before passing it on, when
/// statements are tracked.
pub fn client_wants(tag: u8) -> usize {
    match tag {
        b'P' | b'B' | b'D' | b'C' => usize::MAX,
        b'Q' => QUERY_PREFIX,
        _ => 0,
    }
}

/// Replaces `range` of `buf` with `with`, in place.
pub(super) fn splice(buf: &mut BytesMut, range: Range<usize>, with: &[u8]) {
    let (start, end) = (range.start, range.end);
    let old_len = buf.len();
    if with.len() > end - start {
        let grow = with.len() - (end - start);
        buf.resize(old_len + grow, 0);
        buf.copy_within(end..old_len, end + grow);
    } else {
        let shrink = (end - start) - with.len();
        buf.copy_within(end..old_len, end - shrink);
        buf.truncate(old_len - shrink);
    }
    buf[start..start + with.len()].copy_from_slice(with);
}

impl Session {
    /// Rewrites a framed client message if it names a statement. `Held` when it must wait
    /// (it was un-framed): for a server to check it against, or, for the first message
    /// that needs tracking, until what was sent before it is answered.
    pub(super) fn track_client(
        &mut self,
        frame: &Frame,
        server: Option<&mut ServerStatements>,
    ) -> Tracking {
        let tag = frame.tag;
        if !matches!(tag, b'P' | b'B' | b'D' | b'C' | b'E' | b'S' | b'Q' | b'F') {
            return Tracking::Go;
        }
        let at = frame.start + HEADER_LEN;
        let range = frame.body.clone().unwrap_or(at..at);
        let body = &self.inbuf[range.clone()];
        if statements(&mut self.extras).is_none() {
            // Clients that only ever send simple queries are not tracked at all.
            let needed = matches!(tag, b'P' | b'B' | b'D' | b'C' | b'E')
                || (tag == b'Q' && crate::prepared::queries::query_kind(body).is_some());
            if !needed {
                return Tracking::Go;
            }
            if self.exchange.pending > 0 || self.exchange.has(UNSYNCED) {
                return self.hold(frame);
            }
            self.extras.get_or_insert_with(Box::default).prepared = Some(Box::default());
        }
        let Some(p) = statements(&mut self.extras) else {
            return Tracking::Go;
        };
        if !self.exchange.has(UNSYNCED) {
            let maybe_idle = self.exchange.status == b'I' || p.status_pending();
            p.retry
                .batch_starts(tag, &self.inbuf[frame.start..], maybe_idle);
        }
        let cx = Context {
            status: self.exchange.status,
            cap: self.prepared_cap as usize,
            ahead: server.is_none(),
            unsynced: self.exchange.has(UNSYNCED),
            whole: self.cframe.at_boundary(),
        };
        let mut out = BytesMut::new();
        let e = rewrite::client_message(tag, body, p, server, &cx, &mut out);
        if let Some(name) = p.reused.take() {
            crate::conn_log::statement_reused(&self.client.0, &String::from_utf8_lossy(&name));
        }
        match e {
            Edit::Keep => Tracking::Go,
            Edit::Hold => self.hold(frame),
            Edit::Replace => {
                splice(&mut self.inbuf, frame.start..range.end, &out);
                self.cframe.rewritten(frame.start, out.len());
                // What Weir owes for it is added once the relay has counted the message.
                Tracking::Go
            }
            Edit::Before => {
                // Weir's messages go now; the client's waits for their answer.
                splice(&mut self.inbuf, frame.start..frame.start, &out);
                self.cframe.rewritten(frame.start, out.len());
                self.held_back = true;
                Tracking::Held
            }
            Edit::Drop => {
                // Whole (`Context::whole`): everything of it is framed.
                let end = self.cframe.scanned();
                splice(&mut self.inbuf, frame.start..end, &[]);
                self.cframe.rewritten(frame.start, 0);
                Tracking::Dropped
            }
        }
    }

    fn hold(&mut self, frame: &Frame) -> Tracking {
        self.cframe.truncate(frame.start);
        self.held_back = true;
        Tracking::Held
    }

    /// Matches a framed server message to what is owed: whether the relay is to look
    /// further at it.
    pub(super) fn track_server(&mut self, frame: &Frame, server: &mut ServerStatements) -> Tracked {
        // What a retry needs of the relay (see prepared::retry).
        let retry_safe = matches!(frame.tag, b'E' | b't')
            && self.exchange.status == b'I'
            && !self.exchange.has(TERMINATED)
            && self.cframe.scanned() == 0
            && self.cframe.at_boundary();
        let Some(p) = statements(&mut self.extras) else {
            return Tracked::Pass;
        };
        if answers::synth_due(p) {
            self.sframe.truncate(frame.start);
            self.emit_synths();
            return Tracked::Removed;
        }
        let body = frame.body.clone().map(|r| &self.outbuf[r]);
        if frame.tag == b't' && p.retry.describing() {
            // The server's next message says whether the client is to get this one or
            // the fresh statement's: it waits for it, when both are small.
            let len = self.outbuf.get(frame.start + 1..frame.start + HEADER_LEN);
            let len = len.map_or(0, |l| u32::from_be_bytes([l[0], l[1], l[2], l[3]]) as usize);
            let end = frame.start + 1 + len;
            match next_error(&self.outbuf, end) {
                _ if len > retry::MAX_HELD => p.retry.shown(),
                Next::Unknown => {
                    self.sframe.truncate(frame.start);
                    return Tracked::Wait;
                }
                Next::Error(e) if retry::drops_description(p, e, retry_safe) => {
                    splice(&mut self.outbuf, frame.start..end, &[]);
                    self.sframe.truncate(frame.start);
                    return Tracked::Removed;
                }
                // It reaches the client: the Describe may not go again.
                _ => p.retry.shown(),
            }
        }
        let e = answers::server_message(frame.tag, body, p, server, retry_safe);
        match e {
            ServerEdit::Keep => {}
            ServerEdit::Remove => {
                self.remove_server_message(frame);
                return Tracked::Removed;
            }
            ServerEdit::Retry(batch) => {
                self.remove_server_message(frame);
                // Nothing of what follows the batch was framed (`retry_safe`): the copy
                // goes first, and is framed and rewritten as if the client sent it again.
                splice(&mut self.inbuf, 0..0, &batch);
                return Tracked::Removed;
            }
            ServerEdit::Retried => {
                self.remove_server_message(frame);
                // The Sync of the batch sent again is counted when it is framed.
                self.exchange.pending = self.exchange.pending.saturating_sub(1);
                if self.exchange.pending == 0 && self.exchange.has(CARRYING) {
                    // Other clients' requests follow on this server (pool::pipeline): it
                    // goes to them, and the batch runs again on the client's next server.
                    self.exchange.set(ANSWERED, true);
                }
                return Tracked::Removed;
            }
            ServerEdit::Replace(with) => {
                let end = frame.body.as_ref().map_or(self.sframe.scanned(), |b| b.end);
                splice(&mut self.outbuf, frame.start..end, &with);
                self.sframe.rewritten(frame.start, with.len());
            }
        }
        Tracked::Pass
    }

    pub(super) fn remove_server_message(&mut self, frame: &Frame) {
        // ParseComplete, CloseComplete, ReadyForQuery and errors are framed whole.
        let end = frame.body.as_ref().map_or(self.sframe.scanned(), |b| b.end);
        splice(&mut self.outbuf, frame.start..end, &[]);
        self.sframe.truncate(frame.start);
    }

    /// Adds the replies Weir owes the client at the end of what is framed, when that is a
    /// message boundary.
    pub(super) fn emit_synths(&mut self) {
        let Some(p) = statements(&mut self.extras) else {
            return;
        };
        if !answers::synth_due(p) || !self.sframe.at_boundary() {
            return;
        }
        let mut out = BytesMut::new();
        let readies = answers::take_synths(p, self.exchange.status, &mut out);
        let at = self.sframe.scanned();
        splice(&mut self.outbuf, at..at, &out);
        self.sframe.rewritten(at, out.len());
        for _ in 0..readies {
            // The status is the one the client already had: a statement-mode violation
            // cannot begin here.
            let _ = self.ready(self.exchange.status);
        }
    }

    /// A change of max_prepared_statements (the console's SET, RELOAD) reaches a connected
    /// client between its transactions, as PgBouncer's reaches its clients. A client whose
    /// statements are tracked keeps tracking them though it is set to 0: the names on its
    /// servers are Weir's, and its own would no longer be found.
    pub(super) fn follow_prepared_cap(&mut self, cap: u16) {
        if cap == self.prepared_cap
            || cap == 0 && statements(&mut self.extras).is_some_and(|p| !p.names.is_empty())
        {
            return;
        }
        self.prepared_cap = cap;
    }

    /// Answers a request that needs no server (see `rewrite::answer_alone`), leaving the
    /// reply in the output buffer. False when it needs one.
    pub(super) fn answer_alone(&mut self) -> bool {
        if self.prepared_cap == 0 || self.inbuf.first() != Some(&b'P') {
            return false;
        }
        let extras = self.extras.get_or_insert_with(Box::default);
        let p = extras.prepared.get_or_insert_with(Box::default);
        if !p.replies.is_empty() {
            return false;
        }
        let mut out = BytesMut::new();
        let Some(n) = rewrite::answer_alone(&self.inbuf, p, &mut out) else {
            return false;
        };
        let _ = self.inbuf.split_to(n);
        self.cframe.reset();
        self.outbuf.extend_from_slice(&out);
        self.sframe.rewritten(0, self.outbuf.len());
        true
    }

    /// On the server just lent: prepares what the request framed while queueing assumed
    /// it held, unless it went ahead (then the releasing task found it all there).
    pub(super) fn settle_ahead(&mut self, server: &mut ServerStatements) {
        let Some(p) = statements(&mut self.extras) else {
            return;
        };
        if p.ahead.is_empty() {
            return;
        }
        let scanned = self.cframe.scanned();
        let request = &self.inbuf[..scanned];
        let inserts = rewrite::settle_ahead(p, server, self.prepared_cap as usize, request);
        if inserts.is_empty() {
            return;
        }
        let mut added = 0;
        for (at, bytes) in inserts.iter().rev() {
            splice(&mut self.inbuf, *at..*at, bytes);
            added += bytes.len();
        }
        self.cframe.rewritten(0, scanned + added);
    }

    /// A request framed while queueing names a statement the client described.
    pub(super) fn described_ahead(&mut self) -> bool {
        statements(&mut self.extras).is_some_and(|p| check::described_ahead(p))
    }

    /// Before `settle_ahead`: on the idle server a request framed while queueing got,
    /// before anything of it is written, the statements it names that the client
    /// described are looked at (prepared::check::to_settle); a use of one whose
    /// description is not the client's fails in its place (`check::raise_ahead`).
    pub(super) async fn settle_described(
        &mut self,
        server: &mut crate::server::ServerConn,
    ) -> Result<(), crate::server::ConnectError> {
        let Some(p) = statements(&mut self.extras) else {
            return Ok(());
        };
        let todo = check::to_settle(p, &mut server.statements);
        if todo.is_empty() {
            return Ok(());
        }
        for s in &todo {
            if let Some(hash) = described_on(server, &s.batch).await? {
                check::settled(p, &mut server.statements, s, hash);
            }
        }
        let scanned = self.cframe.scanned();
        let request = &self.inbuf[..scanned];
        let Ok(raises) = check::raise_ahead(p, &server.statements, request) else {
            return Err(crate::server::ConnectError::Protocol(
                "a request names a prepared statement as Weir names it on the server",
            ));
        };
        if raises.is_empty() {
            return Ok(());
        }
        let raise = check::raise_bytes();
        for &at in raises.iter().rev() {
            splice(&mut self.inbuf, at..at, &raise);
        }
        self.cframe
            .rewritten(0, scanned + raises.len() * raise.len());
        Ok(())
    }

    /// The ids of the statements a request framed while queueing needs on the server it
    /// goes ahead to.
    pub(super) fn ahead_needs(&mut self) -> Vec<(u64, Option<u64>)> {
        statements(&mut self.extras).map_or_else(Vec::new, |p| check::ahead_needs(p))
    }

    pub(super) fn flush_prepared_stats(&mut self) {
        flush_counts(&mut self.extras, &self.pool);
    }
}

/// Writes Weir's batch of `check::to_settle` and reads its answers: the description's
/// hash, or None for an error.
async fn described_on(
    server: &mut crate::server::ServerConn,
    batch: &[u8],
) -> Result<Option<u64>, crate::server::ConnectError> {
    use crate::server::ConnectError;
    use tokio::io::AsyncWriteExt;
    let work = async {
        server.stream.write_all(batch).await?;
        let mut buf = BytesMut::with_capacity(256);
        let mut describing = check::Describing::default();
        let mut got = None;
        loop {
            let msg = crate::protocol::reader::read_message(&mut server.stream, &mut buf, 1 << 30)
                .await?;
            match msg.tag {
                b't' => describing.parameters(&msg.body),
                b'T' => got = Some(describing.finish(Some(&msg.body)).hash),
                b'n' => got = Some(describing.finish(None).hash),
                b'E' => got = None,
                b'Z' if buf.is_empty() && msg.body.first() == Some(&b'I') => return Ok(got),
                b'Z' => {
                    return Err(ConnectError::Protocol(
                        "unexpected answer to Weir's Describe",
                    ))
                }
                _ => {}
            }
        }
    };
    match crate::timers::timeout(super::INTERNAL_QUERY_TIMEOUT, work).await {
        Ok(r) => r,
        Err(_) => Err(ConnectError::Timeout),
    }
}

/// What the relay does with a client message once statements are tracked.
pub(super) enum Tracking {
    /// Sent on (maybe rewritten), and counted.
    Go,
    /// Un-framed until it can be rewritten.
    Held,
    /// Removed: it gets no reply, and does not count as sent.
    Dropped,
}

/// What the relay does with a server message once statements are tracked.
pub(super) enum Tracked {
    Pass,
    /// Removed (a reply to Weir's own message), or un-framed so that replies Weir owes,
    /// due before it, go first: the relay frames what follows.
    Removed,
    /// Un-framed until more of what follows it arrives.
    Wait,
}

enum Next<'a> {
    /// Not here yet, or an error not here whole (nor, with it, what comes before it).
    Unknown,
    Error(&'a [u8]),
    Other,
}

/// The message at `at` in `buf`, as far as an error's body matters.
fn next_error(buf: &[u8], at: usize) -> Next<'_> {
    let Some(header) = buf.get(at..at + HEADER_LEN) else {
        return Next::Unknown;
    };
    if header[0] != b'E' {
        return Next::Other;
    }
    let len = u32::from_be_bytes([header[1], header[2], header[3], header[4]]) as usize;
    if len > retry::MAX_HELD {
        return Next::Other;
    }
    match buf.get(at + HEADER_LEN..at + 1 + len.max(4)) {
        Some(body) => Next::Error(body),
        None => Next::Unknown,
    }
}

/// The client's statements, if it has any (they live in the session's extras).
pub(super) fn statements(extras: &mut Option<Box<Extras>>) -> Option<&mut ClientStatements> {
    extras.as_deref_mut()?.prepared.as_deref_mut()
}

/// True when no reply is owed for anything the client sent. `unsent_retry`: a batch to
/// run again that has not been sent yet does not count (it will go to another server).
pub(super) fn replies_settled(extras: &Option<Box<Extras>>, unsent_retry: bool) -> bool {
    extras
        .as_deref()
        .and_then(|e| e.prepared.as_deref())
        .is_none_or(|p| p.replies.is_empty() && (unsent_retry || !p.retry.in_flight()))
}

/// True unless a statement the server is counted as holding may yet be undone
/// (`ClientStatements::preparing`).
pub(super) fn server_statements_settled(extras: &Option<Box<Extras>>) -> bool {
    extras
        .as_deref()
        .and_then(|e| e.prepared.as_deref())
        .is_none_or(|p| !p.preparing())
}

/// Adds a client's prepared-statement counters to its pool's stats.
pub(super) fn flush_counts(extras: &mut Option<Box<Extras>>, pool: &Pool) {
    if let Some(p) = statements(extras) {
        if !p.counts.is_empty() {
            pool.stats.add_prepared(&std::mem::take(&mut p.counts));
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn splices_in_place() {
        let mut b = BytesMut::from(&b"aaXXbb"[..]);
        splice(&mut b, 2..4, b"YYY");
        assert_eq!(&b[..], b"aaYYYbb");
        splice(&mut b, 2..5, b"");
        assert_eq!(&b[..], b"aabb");
        splice(&mut b, 4..4, b"cc");
        assert_eq!(&b[..], b"aabbcc");
    }
}

#[cfg(test)]
mod size {
    /// Every idle client holds its boxed session: it must stay within the allocator's
    /// 320-byte size class (statement tracking lives in the extras for that reason).
    #[test]
    fn a_session_fits_its_size_class() {
        assert!(
            std::mem::size_of::<super::Session>() <= 320,
            "{}",
            std::mem::size_of::<super::Session>()
        );
    }
}
