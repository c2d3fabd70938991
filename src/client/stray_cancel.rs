//! A cancel that was another client's, hitting this client's request.
//!
//! A request sent to a server before its client had it (pool::ahead, pool::pipeline)
//! runs right after the previous client's. A cancel that client sent for its own
//! request can reach PostgreSQL just after that request ended, and cancel this one. When
//! the request is one plain implicit transaction (sql::pipeline: a simple Query of one
//! statement, or an extended batch to its Sync), a 57014 means it was rolled back whole
//! and left no effect: if this client sent no cancel and has been given nothing of the
//! answer, the error and its ReadyForQuery are swallowed and the request goes again, as
//! if the client had sent it a second time: on the same server, or, with other clients'
//! requests behind it there, on the client's next one once the server has gone to them.
//! The client never sees the other's cancel.

use bytes::Bytes;

use super::relay::{ANSWERED, CARRYING, PLAIN};
use super::Session;
use crate::protocol::framer::Frame;

/// The largest request kept for a run again: a copy for every pipelined request is
/// cheap only while it is small.
const MAX_KEPT: usize = 1024;
/// Runs again at most: PostgreSQL may signal a backend twice for one cancel request.
const RUNS_AGAIN: u8 = 2;

/// A request kept to run again.
pub(super) struct Replay {
    bytes: Bytes,
    /// The client's cancel count when its request went (ClientInfo::cancels).
    cancels: u32,
    /// What the client had been sent of answers when its request went.
    shown: u64,
    left: u8,
    /// The error was swallowed; its ReadyForQuery is next.
    swallowing: bool,
}

/// An extended-protocol batch that names no statement: the bytes the client sent are
/// those the server got (pool::ahead sends named ones rewritten to Weir's names, which
/// would be rewritten again if framed a second time).
fn unnamed_batch(mut bytes: &[u8]) -> bool {
    while let Some(&tag) = bytes.first() {
        let Some(len) = bytes.get(1..5) else {
            return false;
        };
        let len = u32::from_be_bytes([len[0], len[1], len[2], len[3]]) as usize;
        let Some(body) = bytes.get(5..1 + len) else {
            return false;
        };
        let mut names = body.split(|&b| b == 0);
        let unnamed = match tag {
            b'P' => names.next() == Some(b"".as_slice()),
            b'B' => names.nth(1) == Some(b"".as_slice()),
            b'D' => body.first() == Some(&b'P') || body.get(..2) == Some(b"S\0".as_slice()),
            b'E' | b'S' | b'H' => true,
            _ => false,
        };
        if !unnamed {
            return false;
        }
        bytes = &bytes[1 + len..];
    }
    true
}

impl Session {
    /// The client's request (its first `sent` bytes, about to be dropped) went to the
    /// server before the client had it: kept if a stray cancel could be undone for it.
    pub(super) fn keep_for_replay(&mut self, sent: usize) {
        let whole = self.cframe.scanned() == sent && self.exchange.pending == 1;
        let request = &self.inbuf[..sent];
        if !whole
            || !self.exchange.has(PLAIN)
            || request.len() > MAX_KEPT
            || !(request.first() == Some(&b'Q') || unnamed_batch(request))
        {
            return;
        }
        let replay = Replay {
            bytes: Bytes::copy_from_slice(request),
            cancels: self.client.0.cancels(),
            shown: self.delta.sent,
            left: RUNS_AGAIN,
            swallowing: false,
        };
        self.extras.get_or_insert_with(Box::default).replay = Some(Box::new(replay));
    }

    /// An ErrorResponse for the request: true when it was a stray cancel's, now removed
    /// with what came before it of the answer (nothing of which reached the client).
    pub(super) fn stray_cancel(&mut self, frame: &Frame) -> bool {
        let (pending, sent, cancels) = (
            self.exchange.pending,
            self.delta.sent,
            self.client.0.cancels(),
        );
        let Some(r) = self.extras.as_mut().and_then(|x| x.replay.as_mut()) else {
            return false;
        };
        let end = self.sframe.scanned();
        let fields = self.outbuf.get(frame.start + 5..end).unwrap_or_default();
        if r.swallowing
            || r.left == 0
            || pending != 1
            || sent != r.shown
            || cancels != r.cancels
            || crate::protocol::error_code(fields) != Some(b"57014".as_slice())
        {
            return false;
        }
        r.left -= 1;
        r.swallowing = true;
        let _ = self.outbuf.split_to(end);
        self.sframe.reset();
        tracing::debug!(client = ?self.client.0.key.pid, "a cancel the client did not send hit its request: it runs again");
        true
    }

    /// A ReadyForQuery: true when it ends a request cancelled by another's cancel, now
    /// removed, and the request is put back in front of what the client sent since.
    pub(super) fn run_again(&mut self, frame: &Frame) -> bool {
        let Some(r) = self.extras.as_mut().and_then(|x| x.replay.as_mut()) else {
            return false;
        };
        if !r.swallowing {
            return false;
        }
        r.swallowing = false;
        let bytes = r.bytes.clone();
        self.remove_server_message(frame);
        // Counted again as it is framed again.
        self.exchange.pending = self.exchange.pending.saturating_sub(1);
        if self.exchange.pending == 0 && self.exchange.has(CARRYING) {
            // Other clients' requests follow on this server (pool::pipeline): it goes to
            // them, and the request runs again on the client's next server.
            self.exchange.set(ANSWERED, true);
        }
        super::prepare::splice(&mut self.inbuf, 0..0, &bytes);
        true
    }
}

#[cfg(test)]
mod tests {
    use super::unnamed_batch;
    use crate::protocol::messages::put_message;
    use bytes::BytesMut;

    fn batch(parts: &[(u8, &[u8])]) -> BytesMut {
        let mut out = BytesMut::new();
        for (tag, body) in parts {
            put_message(&mut out, *tag, |b| b.extend_from_slice(body));
        }
        out
    }

    #[test]
    fn only_batches_without_names_run_again() {
        let unnamed = batch(&[
            (b'P', b"\0select 1\0\0\0"),
            (b'B', b"\0\0\0\0\0\0\0\0"),
            (b'D', b"P\0"),
            (b'E', b"\0\0\0\0\0"),
            (b'S', b""),
        ]);
        assert!(unnamed_batch(&unnamed));
        let named_bind = batch(&[(b'B', b"\0s1\0\0\0\0\0\0\0"), (b'S', b"")]);
        assert!(!unnamed_batch(&named_bind));
        let named_parse = batch(&[(b'P', b"s1\0select 1\0\0\0"), (b'S', b"")]);
        assert!(!unnamed_batch(&named_parse));
        let describe_named = batch(&[(b'D', b"Ss1\0"), (b'S', b"")]);
        assert!(!unnamed_batch(&describe_named));
        assert!(!unnamed_batch(&unnamed[..unnamed.len() - 1]));
    }
}
