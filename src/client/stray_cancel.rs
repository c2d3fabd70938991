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
use crate::server::passenger::runs_again;

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

impl Session {
    /// The client's request (its first `sent` bytes, about to be dropped) went to the
    /// server before the client had it: kept if a stray cancel could be undone for it.
    pub(super) fn keep_for_replay(&mut self, sent: usize) {
        let whole = self.cframe.scanned() == sent && self.exchange.pending == 1;
        let request = &self.inbuf[..sent];
        if !whole || !self.exchange.has(PLAIN) || !runs_again(request) {
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
