//! Guards that keep the pool's count of slots right whatever happens to the task holding
//! one: a lent server (`Lease`), a slot being connected (`Slot`), a place in the queue
//! (`Waiting`).

use std::ops::{Deref, DerefMut};
use std::sync::Arc;

use tokio::sync::oneshot;

use super::Conn;
use super::{Grant, Pool};
use crate::server::ServerConn;

/// A server lent to one client. Dropping it closes the server and frees its slot;
/// `release` returns it to the pool for the next client.
pub struct Lease {
    conn: Option<Conn>,
    pool: Arc<Pool>,
}

impl Lease {
    pub(super) fn new(conn: Conn, pool: Arc<Pool>) -> Lease {
        Lease {
            conn: Some(conn),
            pool,
        }
    }

    pub fn pool(&self) -> &Arc<Pool> {
        &self.pool
    }

    /// Registers the server with the current worker's runtime if it lives on another, so
    /// its readiness events wake this client without crossing threads.
    pub fn adopt(&mut self) -> std::io::Result<()> {
        if !self.conn.as_ref().is_some_and(|c| c.is_foreign()) {
            return Ok(());
        }
        let Some(conn) = self.conn.take() else {
            return Ok(());
        };
        match (*conn).adopted() {
            Ok(c) => {
                self.conn = Some(Box::new(c));
                Ok(())
            }
            Err(e) => {
                self.pool.forget();
                Err(e)
            }
        }
    }

    /// Sends waiting clients' requests behind the holder's (see pipeline); how many went.
    pub fn board(&mut self, print: u16, age: std::time::Duration) -> usize {
        match self.conn.as_deref_mut() {
            Some(conn) => self.pool.board(conn, print, age),
            None => 0,
        }
    }

    /// Returns a clean, idle server to the pool; one with a cancel request on its way
    /// (cancel::send) once PostgreSQL is done with that, unless clients' requests are
    /// already pipelined behind (they run whatever happens).
    pub fn release(mut self) {
        let Some(conn) = self.conn.take() else {
            return;
        };
        if conn.passengers.is_empty() && conn.info.0.being_canceled() {
            let held = Lease::new(conn, self.pool.clone());
            tokio::spawn(held.release_after_cancels());
            return;
        }
        self.pool.checkin(conn);
    }

    async fn release_after_cancels(mut self) {
        use std::sync::atomic::Ordering;
        self.pool.being_canceled.fetch_add(1, Ordering::Relaxed);
        // cancel::send gives up within its own timeout, so this ends.
        while self.info.0.being_canceled() {
            crate::timers::sleep(std::time::Duration::from_millis(1)).await;
        }
        self.pool.being_canceled.fetch_sub(1, Ordering::Relaxed);
        if let Some(conn) = self.conn.take() {
            self.pool.checkin(conn);
        }
    }

    /// Gives the server up without closing it (an online restart moves it to the new
    /// process): its slot is freed here.
    pub fn hand_off(mut self) -> Option<Box<ServerConn>> {
        let conn = self.conn.take()?;
        self.pool.forget();
        Some(conn)
    }

    /// Closes the server politely and frees its slot.
    pub async fn close(mut self) {
        if let Some(conn) = self.conn.take() {
            self.pool.forget();
            conn.terminate().await;
        }
    }
}

impl Deref for Lease {
    type Target = ServerConn;
    fn deref(&self) -> &ServerConn {
        // Only `release`/`close`/drop take the connection, and they consume the lease.
        self.conn
            .as_ref()
            .expect("lease holds a connection until consumed")
    }
}

impl DerefMut for Lease {
    fn deref_mut(&mut self) -> &mut ServerConn {
        self.conn
            .as_mut()
            .expect("lease holds a connection until consumed")
    }
}

impl Drop for Lease {
    fn drop(&mut self) {
        if self.conn.take().is_some() {
            self.pool.forget();
        }
    }
}

/// A slot granted for a new connection, given back if the connect fails or is abandoned.
pub(super) struct Slot {
    pool: Option<Arc<Pool>>,
}

impl Slot {
    pub(super) fn new(pool: Arc<Pool>) -> Slot {
        Slot { pool: Some(pool) }
    }

    /// The connection is made: the slot now counts as a lent server.
    pub(super) fn fill(mut self, conn: ServerConn) -> Lease {
        let pool = self.pool.take().expect("slot filled once");
        pool.lock().connecting -= 1;
        Lease::new(Box::new(conn), pool)
    }
}

impl Drop for Slot {
    fn drop(&mut self) {
        if let Some(pool) = self.pool.take() {
            pool.abandon_slot();
        }
    }
}

/// A place in the pool's queue. A grant that arrives as the waiter gives up (timeout, client
/// gone) is handed back rather than lost with the receiver.
pub(super) struct Waiting {
    pool: Arc<Pool>,
    rx: oneshot::Receiver<Grant>,
}

impl Waiting {
    pub(super) fn new(pool: Arc<Pool>, rx: oneshot::Receiver<Grant>) -> Waiting {
        Waiting { pool, rx }
    }

    pub(super) fn rx(&mut self) -> &mut oneshot::Receiver<Grant> {
        &mut self.rx
    }

    pub(super) fn take_late_grant(&mut self) -> Option<Grant> {
        self.rx.close();
        self.rx.try_recv().ok()
    }
}

impl Drop for Waiting {
    fn drop(&mut self) {
        match self.take_late_grant() {
            // The server holds a request of a waiter that has gone: not reusable.
            Some(Grant::Server(conn)) if conn.holds_ahead() => self.pool.close_lent(*conn),
            Some(Grant::Server(conn)) => self.pool.checkin(conn),
            Some(Grant::Connect) => self.pool.abandon_slot(),
            Some(Grant::Lost | Grant::Refused(_)) | None => {}
        }
    }
}
