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

impl Drop for Passenger {
    fn drop(&mut self) {
        self.aboard.fetch_sub(1, Ordering::Relaxed);
        if let Some(tx) = self.tx.take() {
            let _ = tx.send(Grant::Lost);
        }
    }
}
