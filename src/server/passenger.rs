//! What a pool tells a client waiting for a server (`Grant`), and a waiting client whose
//! request was sent to a busy server behind another's (`Passenger`, pool::pipeline): kept
//! here because a server carries its passengers, whose grant comes with it.

use std::sync::atomic::{AtomicUsize, Ordering};
use std::sync::Arc;

use tokio::sync::oneshot;

use super::ServerConn;
use crate::protocol::PgError;

pub enum Grant {
    /// A server; its `sent_ahead` says how much of the waiter's request went to it.
    Server(Box<ServerConn>),
    /// A slot is yours: open a new connection in it.
    Connect,
    /// Your request was sent to a server behind another's (pipeline), and the server was
    /// lost before it reached you.
    Lost,
    /// PostgreSQL turned the pool's login away (retry::turns_away): the logins a longer
    /// wait would bring are refused as well.
    Refused(PgError),
}

/// A waiting client whose request went to a server behind another's.
pub struct Passenger {
    tx: Option<oneshot::Sender<Grant>>,
    /// Bytes of its request written.
    pub(crate) sent: usize,
    /// All of them: another request may go behind it.
    pub(crate) whole: bool,
    /// As the server's fields of the same names, for when it is handed over: Weir's
    /// query written in front of the request, owed first, and what of it is unwritten.
    pub(crate) owed_internal: u8,
    pub(crate) prefix_rest: bytes::Bytes,
    /// Should a cancel meant for the request ahead of it hit it, its client would run it
    /// again without showing anything (`runs_again`; client::stray_cancel): a cancel
    /// for the request ahead may then be sent while it rides.
    pub(crate) runs_again: bool,
    /// The pool's count of passengers, this one in it until dropped.
    aboard: Arc<AtomicUsize>,
}

impl Passenger {
    /// Aboard: counted in `aboard` until dropped.
    pub(crate) fn new(
        tx: oneshot::Sender<Grant>,
        sent: usize,
        whole: bool,
        aboard: Arc<AtomicUsize>,
    ) -> Passenger {
        aboard.fetch_add(1, Ordering::Relaxed);
        Passenger {
            tx: Some(tx),
            sent,
            whole,
            owed_internal: 0,
            prefix_rest: bytes::Bytes::new(),
            runs_again: false,
            aboard,
        }
    }

    /// Hands `conn` over; gives it back if the client has gone.
    pub(crate) fn hand(mut self, conn: Box<ServerConn>) -> Result<(), Box<ServerConn>> {
        let Some(tx) = self.tx.take() else {
            return Err(conn);
        };
        match tx.send(Grant::Server(conn)) {
            Ok(()) => Ok(()),
            Err(Grant::Server(c)) => Err(c),
            // Only a server is sent here.
            Err(_) => Ok(()),
        }
    }
}

/// The largest request kept to run again: a copy for every pipelined request is cheap
/// only while it is small.
pub const MAX_KEPT: usize = 1024;

/// Whether a whole plain request (sql::pipeline), as the client sent it, can be run
/// again when a cancel it did not send rolled it back (client::stray_cancel): a simple
/// Query, or an extended batch naming no statement, of at most `MAX_KEPT` bytes.
pub fn runs_again(request: &[u8]) -> bool {
    request.len() <= MAX_KEPT && (request.first() == Some(&b'Q') || unnamed_batch(request))
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

impl Drop for Passenger {
    fn drop(&mut self) {
        self.aboard.fetch_sub(1, Ordering::Relaxed);
        if let Some(tx) = self.tx.take() {
            let _ = tx.send(Grant::Lost);
        }
    }
}

#[cfg(test)]
mod tests {
    use super::{runs_again, unnamed_batch, MAX_KEPT};
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

    #[test]
    fn small_queries_and_unnamed_batches_run_again() {
        assert!(runs_again(&batch(&[(b'Q', b"select 1\0")])));
        let long = vec![b'x'; MAX_KEPT];
        assert!(!runs_again(&batch(&[(b'Q', &long)])));
        assert!(!runs_again(&batch(&[
            (b'B', b"\0s1\0\0\0\0\0\0\0"),
            (b'S', b"")
        ])));
    }
}
