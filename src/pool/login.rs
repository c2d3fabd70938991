//! Logging servers in: opening one in a granted slot, the keys it logs in with when no
//! client is at hand, and what a refused login tells the clients waiting and those still
//! logging in, so that none waits out query_wait_timeout for a refusal already known.

use std::collections::VecDeque;
use std::sync::atomic::Ordering;
use std::sync::Arc;
use std::time::Instant;

use super::{lease, Lease, Pool, PoolSettings, PoolState};
use crate::protocol::PgError;
use crate::server::passenger::Grant;
use crate::server::welcome::Welcome;
use crate::server::{self, ScramCredential, ServerTarget};

impl Pool {
    /// The SCRAM keys learnt from a client, for logins beside the pool's (host checks).
    pub fn scram_keys(&self) -> Option<ScramCredential> {
        self.lock().scram.clone()
    }

    /// Keeps the SCRAM keys of a client that logged in, for connections opened with no
    /// client at hand (min_pool_size).
    pub fn remember_scram(&self, keys: &ScramCredential) {
        self.lock().scram = Some(keys.clone());
    }

    /// Opens a server in a granted slot. The error says whom it goes to at once; when that
    /// is the waiters, they were told too.
    pub(super) async fn connect(
        self: &Arc<Self>,
        settings: &PoolSettings,
        scram: Option<ScramCredential>,
    ) -> Result<Lease, (PgError, super::retry::TellAtOnce)> {
        let slot = lease::Slot::new(self.clone());
        let result = server::connect(&settings.target, scram).await;
        let mut st = self.lock();
        match result {
            Ok(conn) => {
                st.login.succeeded();
                if st.welcome.is_none() {
                    st.welcome = Some(Arc::new(Welcome::new(conn.params.clone())));
                }
                drop(st);
                tracing::debug!(server = ?conn, db = %self.database, user = %self.user, "new server connection");
                Ok(slot.fill(conn))
            }
            Err(e) => {
                tracing::warn!(db = %self.database, user = %self.user, addr = %settings.target.addr, "server login failed: {e}");
                let (err, retry) = st.login.failed(&e, settings.server_login_retry);
                let tell = st.login.tell_at_once();
                if tell.waiters {
                    self.turn_away(&mut st, &err);
                }
                drop(st);
                // Waiters get their turn again once the retry delay has passed.
                let me = self.clone();
                tokio::spawn(async move {
                    crate::timers::sleep(retry).await;
                    me.grant_free_slots();
                });
                Err((err, tell))
            }
        }
    }

    /// Tells every waiter that PostgreSQL turned the pool's login away, rather than keep
    /// it until query_wait_timeout while logins are retried and refused. Only waiters that
    /// still hold their own request are in the queue: one whose request a releaser wrote
    /// to a server (`Ahead::send`, `board`) left it in that step and gets that server.
    fn turn_away(&self, st: &mut PoolState, err: &PgError) {
        let mut kept = VecDeque::new();
        for w in st.waiters.drain(..) {
            if w.tx.is_closed() {
                continue;
            }
            // Withdrawn here, the request can no longer go ahead; a claimed one (which
            // the lock rules out) would be owed its server, so it keeps its place.
            if w.ahead.as_ref().is_some_and(|a| !a.client.withdraw()) {
                kept.push_back(w);
                continue;
            }
            let _ = w.tx.send(Grant::Refused(err.clone()));
        }
        if kept.is_empty() {
            self.queued.store(false, Ordering::Relaxed);
        }
        st.waiters = kept;
    }

    /// What a client logging in is told while it could only be served by a new server and
    /// PostgreSQL turned the pool's last login away (until the retry delay passes): with
    /// the welcome known it would otherwise log in, only for its first request to get the
    /// refusal.
    pub fn turned_away(&self) -> Option<PgError> {
        let pool_size = self.settings().pool_size;
        let st = self.lock();
        let err = st.login.turned_away()?;
        (st.idle.is_empty() && st.total < pool_size).then(|| err.clone())
    }

    /// The last server login that failed, until one succeeds (for the dashboard).
    pub fn last_login_failure(&self) -> Option<(Instant, PgError)> {
        self.lock().login.last().cloned()
    }
}

impl crate::split::Upstream for Pool {
    fn login(&self) -> (ServerTarget, Option<ScramCredential>) {
        (self.settings().target.clone(), self.scram_keys())
    }
}
