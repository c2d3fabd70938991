//! Lending a server to a client: an idle one, a new one in a free slot, or the one the
//! queue brings. The quick path without an await (`try_checkout_idle`) lives beside the
//! full one so that both pick idle servers and judge their expiry the same way.

use std::collections::VecDeque;
use std::sync::atomic::Ordering;
use std::sync::Arc;
use std::time::Instant;

use tokio::sync::oneshot;

use super::{
    gates, janitor, lease, lost_request, Ahead, Conn, Lease, Pool, PoolSettings, PoolState, Slot,
    Waiter,
};
use crate::gucs::Gucs;
use crate::params::ParamSet;
use crate::protocol::PgError;
use crate::server::passenger::Grant;
use crate::server::{ScramCredential, ServerConn};

impl Pool {
    /// Lends a server: an idle one, a new one if the pool has room, or the next one released
    /// if the client waits its turn. When PostgreSQL refuses logins, waiters are told at
    /// once; a client still logging in (`for_login`) also when a setting is at fault
    /// (`retry::TellAtOnce`). An unreachable server is waited for, up to
    /// query_wait_timeout, by both.
    ///
    /// `ahead` is the client's request, for the task that releases a server to send it
    /// before handing the server over (see `ahead`).
    pub async fn checkout(
        self: &Arc<Self>,
        scram: Option<ScramCredential>,
        for_login: bool,
        mut ahead: Option<Ahead>,
    ) -> Result<Lease, PgError> {
        // PAUSE / SUSPEND from the admin console: wait for RESUME before taking anything.
        gates::wait_resumed(&self.database).await;
        let started = Instant::now();
        let mut reserve = false;
        // Whether the releaser of a server has taken on the request is the client's to
        // know: a waiter whose request is on a server already must wait for that server.
        let client = ahead.as_ref().map(|a| a.client.clone());
        loop {
            let settings = self.settings();
            let mut expired = Vec::new();
            let (step, limited) = {
                let mut st = self.lock();
                match self.take_idle(&mut st, &settings, &mut expired) {
                    Some(s) => (Ok(Grant::Server(s)), false),
                    None => match self.take_slot(&mut st, &settings, reserve) {
                        Slot::Granted => (Ok(Grant::Connect), false),
                        // Turned away, the client is told now: waiting would only bring
                        // it the same refusal at the next retry.
                        Slot::LoginBlocked(e, tell) if tell.waiters || for_login && tell.logins => {
                            return Err(e)
                        }
                        other => {
                            let (tx, rx) = oneshot::channel();
                            let may_board = ahead.is_some();
                            st.waiters.push_back(Waiter {
                                since: Instant::now(),
                                tx,
                                ahead: ahead.take(),
                            });
                            self.queued.store(true, Ordering::Relaxed);
                            (Err((rx, may_board)), matches!(other, Slot::Limited))
                        }
                    },
                }
            };
            for s in expired {
                crate::conn_log::server_closing(&s.info.0, janitor::expiry_reason(&s, &settings));
                self.closed_idle(*s);
            }
            let grant = match step {
                Ok(g) => g,
                Err((rx, may_board)) => {
                    if may_board {
                        self.boarding.wake();
                    }
                    let mut waiting = lease::Waiting::new(self.clone(), rx);
                    if limited && settings.limits.evict_idle(self) {
                        // Room was made: the eviction's release hands it to the first waiter.
                        tracing::debug!(db = %self.database, "closed an idle server of another pool to stay within a shared limit");
                    }
                    let give_up = for_login && !settings.query_wait_timeout.is_zero();
                    match self
                        .wait(
                            &mut waiting,
                            &settings,
                            started,
                            give_up,
                            &mut reserve,
                            client.as_deref(),
                        )
                        .await
                    {
                        Some(g) => g,
                        None => return Err(self.wait_failure()),
                    }
                }
            };
            match grant {
                // Just released by a client and already at work on our request.
                Grant::Server(s) if s.holds_ahead() => return Ok(Lease::new(s, self.clone())),
                Grant::Lost => return Err(lost_request()),
                Grant::Refused(e) => return Err(e),
                Grant::Server(s) => {
                    if let Some(lease) = self.vet(s, &settings).await {
                        return Ok(lease);
                    }
                }
                // Boxed: connecting is rare and its future large.
                Grant::Connect => match Box::pin(self.connect(&settings, scram.clone())).await {
                    Ok(lease) => return Ok(lease),
                    Err((e, tell)) if tell.waiters || for_login && tell.logins => return Err(e),
                    Err(_) => {
                        if !settings.query_wait_timeout.is_zero()
                            && started.elapsed() >= settings.query_wait_timeout
                        {
                            return Err(self.wait_failure());
                        }
                    }
                },
            }
            // Queued again with nothing of its request on a server (it went with the
            // first place in the queue): it is the client's own again.
            if let Some(c) = &client {
                c.reset_handoff();
            }
        }
    }

    /// The checkout of a client still logging in, when the pool has no server yet to
    /// take its parameters from (client::welcome): released, as the queue is, by a safe
    /// shutdown (`gates::unless_queue_released`), though an unreachable server would have
    /// it wait up to query_wait_timeout.
    pub async fn checkout_for_login(
        self: &Arc<Self>,
        scram: Option<ScramCredential>,
    ) -> Result<Lease, PgError> {
        gates::unless_queue_released(self.checkout(scram, true, None)).await
    }

    /// Counts a server that arrived already lent to its client (moved here by an online
    /// restart), over the pool's size if need be: the client had it before.
    pub fn adopt_lent(self: &Arc<Self>, conn: ServerConn) -> Lease {
        self.lock().total += 1;
        self.settings().limits.acquire_anyway();
        Lease::new(Box::new(conn), self.clone())
    }

    /// The common case, without awaiting: an idle server that needs no check, while
    /// nothing is paused. Anything else (waiting, connecting, checking) is for `checkout`.
    /// `state`: the client's session parameters and settings; an idle server that holds
    /// them already is preferred (it needs no sync).
    pub fn try_checkout_idle(
        self: &Arc<Self>,
        state: (&Arc<ParamSet>, Option<&Arc<Gucs>>),
    ) -> Option<Lease> {
        if gates::gates_closed() {
            return None;
        }
        let settings = self.settings();
        let conn = {
            let mut st = self.lock();
            let i = pick_idle(&st.idle, &settings, Some(state))?;
            let s = &st.idle[i];
            let now = Instant::now();
            let check_due = settings.server_check_query.is_some()
                && now.saturating_duration_since(s.idle_since) >= settings.server_check_delay;
            if check_due || self.expired(s, &settings, now) {
                return None;
            }
            st.idle.remove(i)?
        };
        let lease = Lease::new(conn, self.clone());
        if !lease.is_healthy() {
            crate::conn_log::server_closing(&lease.info.0, "server conn crashed?");
            return None;
        }
        Some(lease)
    }

    /// Checks a server that sat idle before lending it: it must not have been closed, and
    /// after server_check_delay it must answer server_check_query.
    async fn vet(self: &Arc<Self>, s: Conn, settings: &PoolSettings) -> Option<Lease> {
        let mut lease = Lease::new(s, self.clone());
        if !lease.is_healthy() {
            crate::conn_log::server_closing(&lease.info.0, "server conn crashed?");
            return None;
        }
        if let Some(q) = &settings.server_check_query {
            if lease.idle_since.elapsed() >= settings.server_check_delay {
                if let Err(e) = lease
                    .run_internal_boxed(q, settings.target.connect_timeout)
                    .await
                {
                    crate::conn_log::server_closing(
                        &lease.info.0,
                        &format!("server check query failed: {e}"),
                    );
                    return None;
                }
            }
        }
        Some(lease)
    }

    /// Pops the next idle server; expired ones met on the way are put in `expired` for the
    /// caller to close once the lock is released.
    fn take_idle(
        &self,
        st: &mut PoolState,
        settings: &PoolSettings,
        expired: &mut Vec<Conn>,
    ) -> Option<Conn> {
        loop {
            let i = pick_idle(&st.idle, settings, None)?;
            let s = st.idle.remove(i)?;
            if self.expired(&s, settings, Instant::now()) {
                st.total -= 1;
                expired.push(s);
                continue;
            }
            return Some(s);
        }
    }

    /// Reserves a slot for a new connection if pool size, shared limits and the login retry
    /// delay allow.
    pub(super) fn take_slot(
        &self,
        st: &mut PoolState,
        settings: &PoolSettings,
        reserve: bool,
    ) -> Slot {
        let cap = settings.pool_size
            + if reserve {
                settings.reserve_pool_size
            } else {
                0
            };
        if st.total >= cap {
            return Slot::Full;
        }
        if let Some(err) = st.login.blocked() {
            return Slot::LoginBlocked(err.clone(), st.login.tell_at_once());
        }
        if !settings.limits.try_acquire() {
            return Slot::Limited;
        }
        st.total += 1;
        st.connecting += 1;
        Slot::Granted
    }

    fn expired(&self, s: &ServerConn, settings: &PoolSettings, now: Instant) -> bool {
        s.generation != settings.target.generation
            || (!settings.server_lifetime.is_zero()
                && now.saturating_duration_since(s.created) >= settings.server_lifetime)
            || (!settings.server_idle_timeout.is_zero()
                && now.saturating_duration_since(s.idle_since) >= settings.server_idle_timeout)
    }
}

/// Which idle server to lend: the oldest in round-robin mode, else the most recently used
/// (LIFO, PgBouncer's default) among those registered with this worker's runtime, looking
/// a few places back before settling for one registered elsewhere.
fn pick_idle(
    idle: &VecDeque<Conn>,
    settings: &PoolSettings,
    state: Option<(&Arc<ParamSet>, Option<&Arc<Gucs>>)>,
) -> Option<usize> {
    let n = idle.len();
    if n == 0 {
        return None;
    }
    if settings.round_robin {
        return Some(0);
    }
    let here = crate::workers::current();
    let recent = n.saturating_sub(8)..n;
    // Among the most recently used: one in the client's state (`state`: its parameters and
    // settings) on this worker, else one in its state (a sync saved is worth more than the
    // worker), else one on this worker.
    let in_state = |c: &Conn| {
        let Some((wanted, gucs)) = state else {
            return false;
        };
        c.synced_to.as_ref().is_some_and(|s| Arc::ptr_eq(s, wanted))
            && crate::gucs::same(c.gucs.as_ref(), gucs)
    };
    let fit = recent
        .clone()
        .rev()
        .find(|&i| idle[i].home == here && in_state(&idle[i]))
        .or_else(|| recent.clone().rev().find(|&i| in_state(&idle[i])));
    fit.or_else(|| recent.rev().find(|&i| idle[i].home == here))
        .or(Some(n - 1))
}
