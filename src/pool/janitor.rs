//! Housekeeping every pool needs when no client is looking: closing servers that outlived
//! server_lifetime or sat idle past server_idle_timeout, and keeping min_pool_size open.

use std::sync::{Arc, Weak};
use std::time::Duration;

use super::{Pool, Slot};
use crate::server;

const PERIOD: Duration = Duration::from_secs(1);

pub(super) fn spawn(pool: &Arc<Pool>) {
    let weak = Arc::downgrade(pool);
    crate::workers::spawn_background(async move {
        let mut tick = crate::timers::interval(PERIOD, crate::timers::MissedTickBehavior::Delay);
        loop {
            tick.tick().await;
            let Some(pool) = Weak::upgrade(&weak) else {
                return;
            };
            pool.expire_idle();
            pool.fill_to_minimum().await;
        }
    });
}

impl Pool {
    /// Closes idle servers past their lifetime or idle timeout; the idle timeout spares
    /// the ones min_pool_size keeps.
    fn expire_idle(&self) {
        let settings = self.settings();
        // After an online restart the new process serves: the clients still here only
        // finish, and the servers they leave idle would count against max_connections
        // beside the new process's.
        let handed_over = crate::registry::handover::handed_over();
        let mut closing = Vec::new();
        {
            let mut st = self.lock();
            let mut i = 0;
            while i < st.idle.len() {
                let s = &st.idle[i];
                let too_old = !settings.server_lifetime.is_zero()
                    && s.created.elapsed() >= settings.server_lifetime;
                let too_idle = !settings.server_idle_timeout.is_zero()
                    && s.idle_since.elapsed() >= settings.server_idle_timeout
                    && st.total > settings.min_pool_size;
                let stale = s.generation != settings.target.generation;
                if too_old || too_idle || stale || handed_over {
                    if let Some(s) = st.idle.remove(i) {
                        st.total -= 1;
                        closing.push(s);
                    }
                } else {
                    i += 1;
                }
            }
        }
        for s in closing {
            crate::conn_log::server_closing(&s.info.0, expiry_reason(&s, &settings));
            self.closed_idle(*s);
        }
    }

    /// Opens servers until min_pool_size (capped by pool_size, and by max_db_connections
    /// and max_user_connections through the slot) are open, one at a time; not while
    /// paused or suspended, as PgBouncer.
    async fn fill_to_minimum(self: &Arc<Self>) {
        if super::gates::gates_closed() || crate::registry::handover::handed_over() {
            return;
        }
        let settings = self.settings();
        let want = settings.min_pool_size.min(settings.pool_size);
        loop {
            let scram = {
                let mut st = self.lock();
                if st.total >= want || !st.waiters.is_empty() {
                    return;
                }
                if !matches!(self.take_slot(&mut st, &settings, false), Slot::Granted) {
                    return;
                }
                st.scram.clone()
            };
            let slot = super::lease::Slot::new(self.clone());
            match server::connect(&settings.target, scram).await {
                Ok(conn) => {
                    {
                        let mut st = self.lock();
                        st.login.succeeded();
                        if st.welcome.is_none() {
                            st.welcome = Some(Arc::new(crate::server::welcome::Welcome::new(
                                conn.params.clone(),
                            )));
                        }
                    }
                    slot.fill(conn).release();
                }
                Err(e) => {
                    tracing::warn!(db = %self.database, user = %self.user, "min_pool_size: server login failed: {e}");
                    self.lock().login.failed(&e, settings.server_login_retry);
                    return;
                }
            }
        }
    }
}

/// Why an idle server is closed for its age, its idleness or a configuration change
/// (checked in that order of precedence, as the caller found at least one).
pub(super) fn expiry_reason(
    s: &crate::server::ServerConn,
    settings: &super::PoolSettings,
) -> &'static str {
    if crate::registry::handover::handed_over() {
        "taken over by a new process"
    } else if s.generation != settings.target.generation {
        "database configuration changed"
    } else if !settings.server_lifetime.is_zero() && s.created.elapsed() >= settings.server_lifetime
    {
        "server lifetime over"
    } else {
        "server idle timeout"
    }
}
