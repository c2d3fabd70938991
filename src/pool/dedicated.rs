//! A server of a replication client's own: opened with the client's `replication` startup
//! parameter, in a slot of the client's pool so that pool_size and the shared limits count
//! it (as PgBouncer's do), never lent to anyone else and closed when its client goes.
//! PostgreSQL makes a replication backend a walsender for its whole life, so there is
//! nothing to pool.

use std::sync::Arc;
use std::time::Instant;

use tokio::sync::oneshot;

use super::{gates, lease, Lease, Pool, Slot, Waiter};
use crate::protocol::startup::Replication;
use crate::protocol::PgError;
use crate::server::passenger::Grant;
use crate::server::{self, ScramCredential, ServerConn};

/// What is given up to make room: the pool's idle server, whose slot the new one takes.
const EVICTED: &str = "evicted for pool_size";

impl Pool {
    /// Opens the replication server, with `params` (the client's startup parameters) in
    /// its startup packet beside `replication`. When the pool is full its oldest idle
    /// server is closed to make room; without one the client waits its turn like any
    /// other, up to query_wait_timeout, or until a safe shutdown empties the queue.
    pub async fn dedicated(
        self: &Arc<Self>,
        kind: Replication,
        params: &[(String, String)],
        scram: Option<ScramCredential>,
    ) -> Result<Lease, PgError> {
        gates::unless_queue_released(self.open_dedicated(kind, params, scram)).await
    }

    async fn open_dedicated(
        self: &Arc<Self>,
        kind: Replication,
        params: &[(String, String)],
        scram: Option<ScramCredential>,
    ) -> Result<Lease, PgError> {
        // The client's settings go into the server's startup packet, after the pool's
        // user and database, where PostgreSQL takes the last of a name: one naming those
        // would log in elsewhere than the pool does. PostgreSQL refuses such a `-c` alike.
        if let Some((name, _)) = params.iter().find(|(n, _)| {
            ["user", "database", "replication", "options"]
                .iter()
                .any(|k| n.eq_ignore_ascii_case(k))
        }) {
            return Err(PgError::fatal(
                "42704",
                format!("unrecognized configuration parameter \"{name}\""),
            ));
        }
        gates::wait_resumed(&self.database).await;
        let settings = self.settings();
        let slot = self.room(&settings).await?;
        let mut target = settings.target.clone();
        // SQL on a physical walsender fails; the connect_query is for pooled servers.
        target.connect_query = None;
        let value = kind.startup_value().unwrap_or("true");
        for (name, v) in params
            .iter()
            .map(|(n, v)| (n.as_str(), v.as_str()))
            .chain([("replication", value)])
        {
            target
                .startup_params
                .retain(|(n, _)| !n.eq_ignore_ascii_case(name));
            target.startup_params.push((name.to_owned(), v.to_owned()));
        }
        // The pool's login backoff is left alone: a refusal here (a role without
        // REPLICATION, no pg_hba line for replication) says nothing of its other logins.
        match server::connect(&target, scram).await {
            Ok(conn) => {
                conn.info.0.set_replication(kind);
                Ok(slot.fill(conn))
            }
            Err(e) => {
                tracing::warn!(db = %self.database, user = %self.user, "replication server login failed: {e}");
                Err(e.to_client_error())
            }
        }
    }

    /// A slot for the new server: a free one, an idle server's, or one the queue brings.
    async fn room(
        self: &Arc<Self>,
        settings: &super::PoolSettings,
    ) -> Result<lease::Slot, PgError> {
        let started = Instant::now();
        // An idle server to close for its slot, or a place in the queue.
        let mut over = Vec::new();
        let room = {
            let mut st = self.lock();
            match self.take_slot(&mut st, settings, false) {
                Slot::Granted => return Ok(lease::Slot::new(self.clone())),
                Slot::LoginBlocked(e, _) => return Err(e),
                full @ (Slot::Full | Slot::Limited) => match st.idle.pop_front() {
                    // Its slot and its units of the shared limits pass to the new server.
                    Some(conn) => {
                        st.connecting += 1;
                        // A pool over pool_size by the reserve gets back under it, as
                        // PgBouncer's does, rather than keep a server more.
                        while st.total > settings.pool_size {
                            let Some(extra) = st.idle.pop_front() else {
                                break;
                            };
                            st.total -= 1;
                            over.push(extra);
                        }
                        Ok(conn)
                    }
                    None => {
                        let (tx, rx) = oneshot::channel();
                        st.waiters.push_back(Waiter {
                            since: started,
                            tx,
                            ahead: None,
                        });
                        self.queued
                            .store(true, std::sync::atomic::Ordering::Relaxed);
                        Err((rx, matches!(full, Slot::Limited)))
                    }
                },
            }
        };
        let (rx, limited) = match room {
            Ok(conn) => {
                let slot = lease::Slot::new(self.clone());
                for extra in over {
                    crate::conn_log::server_closing(&extra.info.0, EVICTED);
                    self.closed_idle(*extra);
                }
                close_for_room(*conn).await;
                return Ok(slot);
            }
            Err(queued) => queued,
        };
        let mut waiting = lease::Waiting::new(self.clone(), rx);
        // As for any waiter held up by a shared limit: another pool's idle server goes,
        // and its release hands the room to the first waiter.
        if limited {
            settings.limits.evict_idle(self);
        }
        let give_up = !settings.query_wait_timeout.is_zero();
        let mut reserve = false;
        let grant = self
            .wait(&mut waiting, settings, started, give_up, &mut reserve, None)
            .await;
        match grant {
            Some(Grant::Connect) => Ok(lease::Slot::new(self.clone())),
            Some(Grant::Server(conn)) => {
                // A pooled server released to us: closed, its slot is ours.
                self.lock().connecting += 1;
                let slot = lease::Slot::new(self.clone());
                close_for_room(*conn).await;
                Ok(slot)
            }
            Some(Grant::Refused(e)) => Err(e),
            Some(Grant::Lost) | None => Err(self.wait_failure()),
        }
    }
}

/// Waits until PostgreSQL has let the backend go, so that the new one does not find it
/// still counted against a role's or database's connection limit.
async fn close_for_room(conn: ServerConn) {
    crate::conn_log::server_closing(&conn.info.0, EVICTED);
    conn.terminate_and_wait().await;
}
