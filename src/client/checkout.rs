//! Getting a server for the client's next request: from the pool or its queue (with
//! cancels, query_wait_timeout and query_wait_notify while waiting), the welcome that
//! ends a login, and putting the server into the client's session state.

use std::sync::Arc;
use std::time::{Duration, Instant};

use bytes::BytesMut;
use tokio::io::AsyncWriteExt;
use weir_auth::scram::Credential;

use super::pipeline::{cancel_behind, CancelBehind};
use super::{relay, route, Session, INTERNAL_QUERY_TIMEOUT};
use crate::pool::{Lease, Pool, PoolMode};
use crate::protocol::messages;
use crate::protocol::PgError;
use crate::registry::clients::{CancelTarget, CANCEL, STOP, WAIT_NOTIFY, WAIT_TIMEOUT};
use crate::server::welcome::Welcome;

/// What a client whose cancel could not be sent is told (see `CancelBehind::Refused`).
pub(super) const CANCEL_REFUSED: &str =
    "cancel request not forwarded: other clients' requests run next on the server, and the cancel could hit one of them";

impl Session {
    /// Checks out a server, noticing meanwhile if the client goes away. `Err(None)` means it
    /// did: there is no one left to tell.
    pub(super) async fn acquire(&mut self) -> Result<Lease, Option<PgError>> {
        if let Some(reader) = self.route_request() {
            let lease = match reader.try_checkout_idle((&self.wanted, self.gucs())) {
                Some(l) => l,
                None => {
                    let keys = self.scram_keys();
                    Box::pin(self.wait_for_server(&reader, &keys)).await?
                }
            };
            // A request already sent ahead to it stays there.
            if lease.holds_ahead() {
                return Ok(lease);
            }
            match self.standby_lease(&lease) {
                route::StandbyLease::Use => return Ok(lease),
                route::StandbyLease::Release => lease.release(),
                route::StandbyLease::Close => {
                    crate::conn_log::server_closing(&lease.info.0, "host no longer fit for reads");
                    lease.close().await;
                }
            }
            self.set_route(route::READ_ON_PRIMARY);
        }
        if let Some(lease) = self.pool.try_checkout_idle((&self.wanted, self.gucs())) {
            return Ok(lease);
        }
        let pool = self.pool.clone();
        let keys = self.scram_keys();
        Box::pin(self.wait_for_server(&pool, &keys)).await
    }

    /// Checks out the slow way: waiting in the queue, connecting, checking; boxed so that
    /// every client's task does not carry this rare state.
    pub(super) async fn wait_for_server(
        &mut self,
        pool: &Arc<Pool>,
        keys: &Option<Credential>,
    ) -> Result<Lease, Option<PgError>> {
        // query_wait_notify and query_wait_timeout are the janitor's (see
        // registry::clients::enforce_waits): a waiting client arms no timer of its own.
        let notify_after = self.timeouts.query_wait_notify();
        let give_up_after = Some(pool.settings().query_wait_timeout).filter(|d| !d.is_zero());
        self.client.0.set_waiting(notify_after, give_up_after);
        let started = Instant::now();
        let ahead = self.request_ahead();
        let me = self.client.0.clone();
        let checkout =
            crate::conn_log::waiting(me.clone(), pool.checkout(keys.clone(), false, ahead));
        tokio::pin!(checkout);
        let waited = |limit: Option<Duration>| limit.is_some_and(|d| started.elapsed() >= d);
        let cancelled = || PgError::error("57014", "canceling statement due to user request");
        // A cancel that came as the request was already being sent ahead: it is passed on
        // to the server, as for any running query.
        let mut cancel_late = false;
        // Meanwhile nothing more goes behind its request, which the cancel could hit.
        let mut hold_boarding = None;
        // A safe shutdown empties the queue, as PgBouncer's WAIT_FOR_SERVERS does (it
        // pauses the pools and closes their waiting clients, in every pool mode).
        let mut heed_stop = true;
        loop {
            tokio::select! {
                signals = me.wait_signals(heed_stop) => {
                    if signals & STOP != 0 && super::SHUTTING_DOWN.load(std::sync::atomic::Ordering::Relaxed) {
                        heed_stop = false;
                        if me.withdraw() {
                            me.set_idle();
                            return Err(Some(crate::pool::gates::queue_released()));
                        }
                    }
                    // Giving up is only possible while the request has not gone ahead to a
                    // server; once it has, the grant is on its way and is taken.
                    if signals & CANCEL != 0 {
                        if me.withdraw() {
                            me.set_idle();
                            return Err(Some(cancelled()));
                        }
                        cancel_late = true;
                        hold_boarding.get_or_insert_with(|| pool.hold_boarding());
                    }
                    if signals & WAIT_TIMEOUT != 0 && waited(give_up_after) && me.withdraw() {
                        me.set_idle();
                        return Err(Some(pool.wait_failure()));
                    }
                    if signals & WAIT_NOTIFY != 0 && waited(notify_after) {
                        let notice = messages::notice_response(&PgError::new(
                            "NOTICE",
                            "00000",
                            "No server connection available in postgres backend, client being queued",
                        ));
                        if self.stream.write_all(&notice).await.is_err() {
                            return Err(None);
                        }
                    }
                }
                r = &mut checkout => {
                    self.delta.wait_time_us += started.elapsed().as_micros() as u64;
                    self.client.0.set_idle();
                    let lease = r.map_err(Some)?;
                    // A cancel raised as the grant came: the wait may have ended on the
                    // grant before the signal was looked at.
                    cancel_late |= me.take_cancel();
                    if cancel_late {
                        return self.cancel_on_arrival(lease).await;
                    }
                    return Ok(lease);
                }
                r = self.read_more(), if self.inbuf.len() < 1 << 20 => match r {
                    Ok(0) | Err(_) => return Err(None),
                    Ok(_) => {}
                },
            }
        }
    }

    /// The client sent a cancel while it waited, and now has a server: its request may
    /// already run there (sent ahead or pipelined, pool::ahead), perhaps with other
    /// clients' requests written behind it.
    async fn cancel_on_arrival(&mut self, lease: Lease) -> Result<Lease, Option<PgError>> {
        let cancelled = || PgError::error("57014", "canceling statement due to user request");
        if lease.owed_internal > 0 && lease.sent_ahead == 0 {
            // Only the query that puts the server into the client's state went: its
            // answer is owed to nobody now.
            lease.close().await;
            return Err(Some(cancelled()));
        }
        if lease.sent_ahead == 0 {
            lease.release();
            return Err(Some(cancelled()));
        }
        let verdict = match lease.passengers.is_empty() {
            true => CancelBehind::Send,
            false => cancel_behind(&lease),
        };
        let pid = self.client.0.key.pid;
        match verdict {
            CancelBehind::Send => {
                tracing::debug!(
                    pid,
                    aboard = lease.passengers.len(),
                    "cancel request sent as the server came"
                );
                tokio::spawn(crate::cancel::send(CancelTarget {
                    addr: lease.addr.clone(),
                    key: lease.key.clone(),
                    server_id: lease.id,
                }));
                // Nothing goes behind a request being cancelled, not even once the
                // cancel connection is done (being_canceled): PostgreSQL's second
                // signal, or the cancel itself if it came late, would hit the request
                // behind.
                self.exchange.set(relay::PLAIN, false);
            }
            CancelBehind::Ended => {
                tracing::debug!(
                    pid,
                    "cancel request after the query ended: nothing to cancel"
                );
            }
            CancelBehind::Refused => {
                tracing::info!(
                    pid,
                    aboard = lease.passengers.len(),
                    "cancel request not forwarded: other clients' requests are queued behind the query on its server"
                );
                let notice =
                    messages::notice_response(&PgError::new("WARNING", "01000", CANCEL_REFUSED));
                // A client gone meanwhile is seen by the relay, which leaves the server
                // to the requests behind.
                let _ = self.stream.write_all(&notice).await;
            }
        }
        Ok(lease)
    }

    /// Sends the client the parameters and key that end its login. The parameters come
    /// from the pool's first server (one is opened now if there is none yet).
    pub(super) async fn welcome(&mut self) -> Result<Option<Lease>, PgError> {
        let requested = self
            .extras
            .as_mut()
            .and_then(|e| e.requested.take())
            .unwrap_or_default();
        self.trim_extras();
        let pool = self.pool.clone();
        let scram_keys = self.scram_keys();
        let mut lease = None;
        if let Some(e) = pool.turned_away() {
            return Err(e);
        }
        let welcome = match pool.welcome() {
            Some(w) => w,
            None => {
                let l = Box::pin(pool.checkout_for_login(scram_keys)).await?;
                // The pool's own, made as the server connected: its clients then share
                // their parameter sets with this one (what pool::ahead compares first).
                let welcome = pool
                    .welcome()
                    .unwrap_or_else(|| Arc::new(Welcome::new(l.params.clone())));
                lease = Some(l);
                welcome
            }
        };
        // AuthenticationOk, then the server's parameters with the client's own values where
        // it asked for some, the key and ReadyForQuery: one write.
        let mut out = BytesMut::with_capacity(512);
        messages::auth_request(&mut out, messages::AUTH_OK, &[]);
        self.wanted = welcome.write(&requested, &mut out);
        self.client.0.set_startup(self.wanted.clone());
        messages::backend_key_data(&mut out, &self.client.0.key);
        crate::login_notice::append(&mut out);
        messages::ready_for_query(&mut out, b'I');
        self.stream
            .write_all(&out)
            .await
            .map_err(|_| PgError::fatal("08006", "client gone"))?;
        if self.mode != PoolMode::Session {
            if let Some(l) = lease.take() {
                l.release();
            }
        }
        Ok(lease)
    }

    pub(super) fn scram_keys(&self) -> Option<Credential> {
        self.extras.as_ref().and_then(|e| e.scram_keys.clone())
    }

    /// Makes the server's session parameters match what the client believes it has.
    /// Also puts the settings the client made (see state) on it, and takes off the ones
    /// another client left there.
    pub(super) async fn sync_params(&self, lease: &mut Lease) -> Result<(), PgError> {
        let sql = self.state_sql(lease);
        if sql.is_empty() {
            return Ok(());
        }
        lease
            .run_internal_boxed(&sql, INTERNAL_QUERY_TIMEOUT)
            .await
            .map_err(|e| e.to_client_error())
    }

    /// Whether the server was last found to hold the client's parameter set (the very one:
    /// clients share sets).
    pub(super) fn params_synced(&self, lease: &Lease) -> bool {
        lease
            .synced_to
            .as_ref()
            .is_some_and(|s| Arc::ptr_eq(s, &self.wanted))
    }

    /// The SQL that puts the server into the client's state (gucs::state_sql), which the
    /// server is taken to hold from now on; empty when it does already.
    pub(super) fn state_sql(&self, lease: &mut Lease) -> String {
        let params_synced = self.params_synced(lease);
        if params_synced && crate::gucs::same(lease.gucs.as_ref(), self.gucs()) {
            return String::new();
        }
        let sql = crate::gucs::state_sql(
            &lease.params,
            params_synced,
            &self.wanted,
            lease.gucs.as_ref(),
            self.gucs(),
        );
        lease.gucs = self.gucs().cloned();
        if sql.is_empty() {
            lease.synced_to = Some(self.wanted.clone());
        }
        sql
    }
}
