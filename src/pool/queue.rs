//! Waiting for a server when the pool has none to lend: in FIFO order, up to
//! query_wait_timeout, and after reserve_pool_timeout with the right to a reserve slot.
//! What may be given up while waiting depends on whether a releaser has already put the
//! waiter's request on a server, so that no request runs twice.

use std::time::Instant;

use tokio::sync::oneshot;

use super::{lease, Pool, PoolSettings, Slot, Waiter};
use crate::protocol::PgError;
use crate::registry::clients::ClientInfo;
use crate::server::passenger::Grant;

impl Pool {
    /// Waits in the queue. Returns None at query_wait_timeout when `give_up` (clients'
    /// waits are timed by the janitor instead). At reserve_pool_timeout a waiter may take a
    /// reserve slot, keeping its place otherwise.
    ///
    /// A waiter whose request a releaser has written to a server (`client` handed: sent
    /// ahead, or pipelined behind another's) gives up nothing: its request runs there,
    /// and taking a reserve slot or leaving would send it to PostgreSQL a second time or
    /// tell the client it failed while it ran.
    pub(super) async fn wait(
        &self,
        waiting: &mut lease::Waiting,
        settings: &PoolSettings,
        started: Instant,
        give_up: bool,
        reserve: &mut bool,
        client: Option<&ClientInfo>,
    ) -> Option<Grant> {
        loop {
            let give_up = give_up.then(|| started + settings.query_wait_timeout);
            let try_reserve = (settings.reserve_pool_size > 0 && !*reserve)
                .then(|| started + settings.reserve_pool_timeout);
            let wake = match (give_up, try_reserve) {
                (Some(a), Some(b)) => Some(a.min(b)),
                (a, b) => a.or(b),
            };
            let got = match wake {
                None => waiting.rx().await.ok(),
                Some(at) => match crate::timers::timeout_at(at, waiting.rx()).await {
                    Ok(r) => r.ok(),
                    Err(_) => None,
                },
            };
            if got.is_some() {
                return got;
            }
            if try_reserve.is_some_and(|t| Instant::now() >= t) {
                *reserve = true;
                if let Some(g) = self.claim_reserve(waiting, settings, client) {
                    return Some(g);
                }
                continue;
            }
            if give_up.is_some_and(|t| Instant::now() >= t) {
                if client.is_some_and(|c| c.is_handed()) {
                    // Its grant (or news of the server's loss) is on its way.
                    return waiting.rx().await.ok();
                }
                return waiting.take_late_grant();
            }
            // The pool dropped our sender without a grant: should not happen, but waiting
            // again is always safe.
            let (tx, rx) = oneshot::channel();
            self.lock().waiters.push_front(Waiter {
                since: started,
                tx,
                ahead: None,
            });
            *waiting.rx() = rx;
        }
    }

    /// What a client that waited query_wait_timeout is told: why the last server login
    /// failed, if one did, else the timeout itself.
    pub fn wait_failure(&self) -> PgError {
        match self.lock().login.last() {
            Some((_, e)) => e.clone(),
            None => PgError::fatal("08P01", "query_wait_timeout"),
        }
    }

    /// Turns a waiter into the holder of a reserve slot, if one is free and its request is
    /// not on a server already. Under the lock, where releasers send requests ahead and
    /// pipeline them (`Ahead::send`, `board`), so that none can take it on meanwhile.
    fn claim_reserve(
        &self,
        waiting: &mut lease::Waiting,
        settings: &PoolSettings,
        client: Option<&ClientInfo>,
    ) -> Option<Grant> {
        let mut st = self.lock();
        if let Ok(g) = waiting.rx().try_recv() {
            return Some(g);
        }
        if client.is_some_and(|c| c.is_handed()) {
            return None;
        }
        if let Slot::Granted = self.take_slot(&mut st, settings, true) {
            // From here on no releaser may send its request: it runs on the new server.
            if let Some(c) = client {
                c.withdraw();
            }
            waiting.rx().close();
            crate::conn_log::reserve_taken(&self.database, &self.user);
            return Some(Grant::Connect);
        }
        None
    }
}
