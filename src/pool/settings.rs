//! How a pool behaves, and how that changes under it: a reload replaces the settings
//! whole while clients hold servers opened under the old ones, so the servers that no
//! longer fit are closed as they come back, and a secret learnt at a client's login
//! (auth_query) joins the settings without a reload.

use std::collections::VecDeque;
use std::sync::Arc;
use std::time::Duration;

use super::{Conn, Limits, PipelineSettings, Pool};
use crate::server::ServerTarget;

/// How a pool behaves; replaced whole on reload.
#[derive(Debug, Clone)]
pub struct PoolSettings {
    pub pool_size: usize,
    pub reserve_pool_size: usize,
    pub reserve_pool_timeout: Duration,
    pub min_pool_size: usize,
    pub target: ServerTarget,
    pub query_wait_timeout: Duration,
    pub server_lifetime: Duration,
    pub server_idle_timeout: Duration,
    pub server_login_retry: Duration,
    pub server_reset_query: String,
    pub server_reset_query_always: bool,
    /// Run on a server idle for longer than `server_check_delay` before lending it; None
    /// disables the check, an empty query is PgBouncer's `<empty>`.
    pub server_check_query: Option<String>,
    pub server_check_delay: Duration,
    pub round_robin: bool,
    pub limits: Limits,
    /// read_write_split: what the database entry's routing knows (see split); None when
    /// the entry does not split, or the pool mode keeps a server for the whole session.
    pub split: Option<Arc<crate::split::Entry>>,
    /// Pipelined transaction pooling (see pipeline); depth 0 in session mode.
    pub pipeline: PipelineSettings,
    /// max_prepared_statements for the pool's clients; 0 in session mode, where a client
    /// keeps its server and its statements need no tracking.
    pub prepared_cap: u16,
    /// The secret was learnt at a client's login (auth_query), not configured: a reload,
    /// which knows none, keeps it rather than retire every server.
    pub secret_learnt: bool,
    /// server_fast_close applies: session mode with the option on.
    pub fast_close: bool,
}

impl Pool {
    pub fn settings(&self) -> arc_swap::Guard<Arc<PoolSettings>> {
        self.settings.load()
    }

    /// Applies reloaded settings: new connections use them (a failed login is forgotten if
    /// the way in changed), idle servers opened under a
    /// different target are closed, so are idle ones over a smaller size (the lent ones
    /// as they come back, see `checkin`), and waiters get slots at once if the pool grew.
    pub fn update_settings(&self, settings: PoolSettings) {
        let generation = settings.target.generation;
        let retarget = self.settings().target.generation != generation;
        let wake = retarget && settings.fast_close;
        let cap = settings.pool_size + settings.reserve_pool_size;
        self.settings.store(Arc::new(settings));
        let (stale, extra): (Vec<Conn>, Vec<Conn>) = {
            let mut st = self.lock();
            // A login that failed under the old way in says nothing of the new one
            // (a password, a certificate, TLS just set): no waiting out its retry delay.
            if retarget {
                st.login.forget();
            }
            let (keep, stale): (VecDeque<_>, VecDeque<_>) =
                st.idle.drain(..).partition(|s| s.generation == generation);
            st.idle = keep;
            st.total -= stale.len();
            let mut extra = Vec::new();
            while st.total > cap {
                // Longest idle first, as PgBouncer's janitor does.
                let Some(c) = st.idle.pop_front() else { break };
                st.total -= 1;
                extra.push(c);
            }
            (stale.into(), extra)
        };
        for s in stale {
            crate::conn_log::server_closing(&s.info.0, "database configuration changed");
            self.closed_idle(*s);
        }
        if wake {
            // Session-mode clients idle on a server under the old settings are woken to
            // see that it must go now (server_fast_close; client::failure).
            let clients = &crate::registry::clients::CLIENTS;
            clients.for_each(|c| {
                if *c.database == *self.database {
                    c.raise(crate::registry::clients::PARK);
                }
            });
        }
        for s in extra {
            crate::conn_log::server_closing(&s.info.0, "too many servers in the pool");
            self.closed_idle(*s);
        }
        self.grant_free_slots();
    }

    /// Sets the secret new server connections log in with, when it was learnt at a client's
    /// login (auth_query) rather than from the configuration.
    pub fn learn_secret(&self, secret: &weir_auth::Secret) {
        let current = self.settings();
        if current.target.secret.as_ref() == Some(secret) {
            return;
        }
        let mut next = (**current).clone();
        next.target.secret = Some(secret.clone());
        next.secret_learnt = true;
        self.settings.store(Arc::new(next));
    }
}
