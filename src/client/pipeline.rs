//! The client's side of pipelined transaction pooling (pool::pipeline): which of its
//! requests may share a server with another client's, and the hand-over of what the
//! server sent past its own last ReadyForQuery.

use super::relay::{BOARDED, CARRYING, PLAIN, UNNAMED_PLAIN, UNSYNCED};
use std::task::Context;
use std::time::{Duration, Instant};

use bytes::{Buf, Bytes};

use super::Session;
use crate::pool::Lease;
use crate::protocol::framer::Frame;
use crate::sql::pipeline::{fold, plain_with, PRINT_SEED};

/// What becomes of a cancel that came while the client was queued, its request already
/// running on the server it now has, with other clients' requests written behind it.
#[derive(Debug, PartialEq, Eq)]
pub(super) enum CancelBehind {
    /// Sent: should the request end before PostgreSQL acts on it and the cancel hit the
    /// one behind, that one's client runs it again, seeing nothing (stray_cancel).
    Send,
    /// The request's answer has ended: there is nothing of the client's to cancel, as
    /// when a cancel comes after the query on a direct connection.
    Ended,
    /// A request behind could not be run again if the cancel hit it: not sent, since
    /// another client's request cancelled is worse than a cancel that came too late.
    Refused,
}

/// Looks at what the server has sent of the answer to the request it was handed over
/// with (the holder's carry, then what the socket holds unread) and at the requests
/// behind it, to decide a cancel that came while the request rode (`CancelBehind`).
pub(super) fn cancel_behind(held: &Lease) -> CancelBehind {
    const PEEK: usize = 64 * 1024;
    let mut seen = held.carry.to_vec();
    let mut more = vec![0; PEEK];
    let n = held.stream.peek_arrived(&mut more).unwrap_or(0);
    seen.extend_from_slice(&more[..n]);
    // Weir's own query in front of the request ends in a ReadyForQuery of its own
    // (BEGIN's, in a block, is not counted: its status is T); a plain request never
    // leaves a block open.
    if ready_for_query_out_of_block(&seen) > usize::from(held.owed_internal) {
        return CancelBehind::Ended;
    }
    if held.passengers.iter().all(|p| p.runs_again) {
        CancelBehind::Send
    } else {
        CancelBehind::Refused
    }
}

/// ReadyForQuery messages in `bytes` (whole messages from the first byte on, perhaps cut
/// at the end) whose status is not "in a block".
fn ready_for_query_out_of_block(mut bytes: &[u8]) -> usize {
    let mut n = 0;
    while let (Some(&tag), Some(len)) = (bytes.first(), bytes.get(1..5)) {
        let len = u32::from_be_bytes([len[0], len[1], len[2], len[3]]) as usize;
        if tag == b'Z' && bytes.get(5).is_some_and(|&s| s != b'T') {
            n += 1;
        }
        match bytes.get(1 + len..) {
            Some(rest) if len >= 4 => bytes = rest,
            _ => break,
        }
    }
    n
}

impl Session {
    /// Follows, message by message, whether the request being framed is one plain
    /// implicit transaction (sql::pipeline), and its fingerprint. Called before a message
    /// is rewritten (prepared statements); the rewrite says whether a named statement it
    /// binds is plain (`ClientStatements::opaque`).
    /// `effect_flags`: what `note_effects` found in the message (sql::effects).
    pub(super) fn note_plain(&mut self, frame: &Frame, effect_flags: u8) {
        let tied = self.pinned() || self.listening();
        let x = &mut self.exchange;
        if x.pending == 0 && !x.has(UNSYNCED) {
            x.flags &= !(UNNAMED_PLAIN | BOARDED);
            let plain = x.status == b'I' && !tied && !x.has(CARRYING);
            x.set(PLAIN, plain);
            x.print = PRINT_SEED;
        } else if x.pending > 0 {
            // Behind a whole request: more than one transaction.
            x.set(PLAIN, false);
        }
        if !x.has(PLAIN) {
            return;
        }
        let body = frame.body.as_ref().and_then(|r| self.inbuf.get(r.clone()));
        let ok = match (frame.tag, body) {
            (b'Q', Some(b)) => match b.strip_suffix(b"\0") {
                Some(text) => {
                    x.print = fold(x.print, text);
                    plain_with(text, effect_flags)
                }
                // Longer than the relay looks at.
                None => false,
            },
            (b'P', Some(b)) => {
                let mut parts = b.splitn(3, |&c| c == 0);
                let name = parts.next().unwrap_or_default();
                let text = parts.next().unwrap_or_default();
                x.print = fold(x.print, text);
                let ok = plain_with(text, effect_flags);
                if name.is_empty() {
                    x.set(UNNAMED_PLAIN, ok);
                }
                ok
            }
            (b'B', Some(b)) => {
                let mut parts = b.splitn(3, |&c| c == 0);
                let _portal = parts.next();
                let statement = parts.next().unwrap_or_default();
                x.print = fold(x.print, statement);
                if statement.is_empty() {
                    x.has(UNNAMED_PLAIN)
                } else {
                    // Tracked statements are known by their text; others are not.
                    self.prepared_cap != 0
                }
            }
            (b'E' | b'D' | b'H' | b'S', _) => true,
            _ => false,
        };
        if !ok {
            x.set(PLAIN, false);
        }
    }

    /// Whether the request framed while queueing may be sent behind another client's:
    /// one plain implicit transaction, whole, and nothing after it.
    pub(super) fn may_go_behind(&self) -> bool {
        let x = &self.exchange;
        x.has(PLAIN)
            && x.pending == 1
            && !x.has(UNSYNCED)
            && self.touched == 0
            && !self.pinned()
            && !self.listening()
            && self.cframe.at_boundary()
    }

    /// Whether the client's request is all written and it owes only its answer: others
    /// may be sent behind it. Not while a statement it prepares is unanswered: a request
    /// boarding is checked against the statements the server is counted as holding, and
    /// one the request's failure undoes would be missing (the request behind got 26000,
    /// and a Parse Weir then added for it took its first ParseComplete).
    fn may_board(&self) -> bool {
        let x = &self.exchange;
        x.pending == 1
            && !x.has(UNSYNCED)
            && self.touched == 0
            && !self.held_back
            && self.cframe.scanned() == 0
            && self.cframe.at_boundary()
            && super::prepare::server_statements_settled(&self.extras)
    }

    /// Once the client's plain request is all written and owes only its answer, lets
    /// clients waiting for a server send theirs behind it (pool::pipeline).
    pub(super) fn board(&mut self, server: &mut Lease) {
        if !self.may_board() {
            return;
        }
        self.exchange.set(BOARDED, true);
        self.board_waiters(server);
    }

    /// While its request runs (after `board`), the relay is woken when a client queues
    /// (`Pool::boarding`): that client's request may still go behind. True if it went.
    pub(super) fn board_late(&mut self, server: &mut Lease, cx: &mut Context<'_>) -> bool {
        if !self.may_board() {
            return false;
        }
        if self.board_waiters(server) {
            return true;
        }
        // A full queue whose head cannot go is no reason to wake; nor a full pipeline.
        if self.pool.may_have_waiters()
            || server.passengers.len() >= self.pool.settings().pipeline.depth
        {
            return false;
        }
        // Registered before looking again, so that a client queueing meanwhile wakes us.
        self.pool.boarding.register(cx.waker());
        self.board_waiters(server)
    }

    fn board_waiters(&mut self, server: &mut Lease) -> bool {
        let age = self.query_started.map_or(Duration::ZERO, |t| t.elapsed());
        let went = server.board(self.exchange.print, age) > 0;
        if went {
            self.exchange.set(CARRYING, true);
        }
        went
    }

    /// The client has gone with requests of others behind its own on the server: reads
    /// its answer to the end, for nobody. False if the server failed or took too long.
    pub(super) async fn drain_own_answer(&mut self, held: &mut Lease) -> bool {
        use tokio::io::AsyncReadExt;
        let limit = Instant::now() + super::INTERNAL_QUERY_TIMEOUT;
        while self.exchange.pending > 0 {
            let done = self.sframe.scanned();
            self.outbuf.advance(done);
            self.sframe.consumed(done);
            crate::bufpool::ensure(&mut self.outbuf);
            match crate::timers::timeout_at(limit, held.stream.read_buf(&mut self.outbuf)).await {
                Ok(Ok(n)) if n > 0 => {}
                _ => return false,
            }
            if self.scan_server(held).is_err() {
                return false;
            }
        }
        let done = self.sframe.scanned();
        self.outbuf.advance(done);
        self.sframe.consumed(done);
        true
    }

    /// A plain request ran `us` microseconds: past pipeline_slow_query, the pool sends
    /// nothing behind its like for a while (pool::pipeline).
    pub(super) fn note_run_time(&self, us: u64) {
        let slow = self.pool.settings().pipeline.slow;
        self.pool
            .note_run(self.exchange.print, us >= slow.as_micros() as u64);
    }

    /// At the client's last ReadyForQuery with requests behind it: what was read past it
    /// goes with the server to the next of them.
    pub(super) fn hand_carry(&mut self, held: &mut Lease) {
        let end = self.sframe.scanned();
        if self.outbuf.len() > end {
            held.carry = Bytes::copy_from_slice(&self.outbuf[end..]);
            self.outbuf.truncate(end);
        }
        self.exchange.set(CARRYING, false);
    }

    /// The server came with the start of the answer to this client's request, read by
    /// the client it ran behind: it is relayed first.
    pub(super) fn take_carry(&mut self, held: &mut Lease) {
        if held.carry.is_empty() {
            return;
        }
        let carry = std::mem::take(&mut held.carry);
        crate::bufpool::ensure(&mut self.outbuf);
        self.outbuf.extend_from_slice(&carry);
    }
}

#[cfg(test)]
mod tests {
    use super::ready_for_query_out_of_block;
    use crate::protocol::messages::put_message;
    use bytes::BytesMut;

    #[test]
    fn counts_ready_for_query_outside_blocks() {
        let mut b = BytesMut::new();
        put_message(&mut b, b'Z', |m| m.extend_from_slice(b"T"));
        put_message(&mut b, b'C', |m| m.extend_from_slice(b"SELECT 1\0"));
        put_message(&mut b, b'Z', |m| m.extend_from_slice(b"I"));
        assert_eq!(ready_for_query_out_of_block(&b), 1);
        put_message(&mut b, b'Z', |m| m.extend_from_slice(b"E"));
        assert_eq!(ready_for_query_out_of_block(&b), 2);
        // Cut inside its status byte: not counted.
        let cut = &b[..b.len() - 1];
        assert_eq!(ready_for_query_out_of_block(cut), 1);
        // A cut row whose bytes look like a ReadyForQuery is skipped whole.
        let mut r = BytesMut::new();
        put_message(&mut r, b'D', |m| m.extend_from_slice(b"Z\0\0\0\x05I"));
        assert_eq!(ready_for_query_out_of_block(&r[..8]), 0);
    }
}
