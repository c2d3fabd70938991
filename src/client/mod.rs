//! One task per client: log it in, then lend it a server whenever it has something to run.

pub mod login;
mod relay;

use std::pin::Pin;
use std::sync::atomic::Ordering;
use std::sync::Arc;
use std::time::{Duration, Instant};

use bytes::BytesMut;
use tokio::io::{AsyncReadExt, AsyncWriteExt};
use tokio_util::sync::WaitForCancellationFutureOwned;
use weir_auth::scram::Credential;

use crate::app::App;
use crate::params::ParamSet;
use crate::pool::{Lease, Pool, PoolMode};
use crate::protocol::framer::Framer;
use crate::protocol::messages::{self, quote_literal};
use crate::protocol::PgError;
use crate::registry::clients::{CancelTarget, ClientHandle};
use crate::stats::Delta;
use crate::stream::Stream;
use login::{LoggedIn, Outcome};
use relay::{Event, Exchange};

/// Internal queries (parameter sync, reset) get this long before the server is dropped.
const INTERNAL_QUERY_TIMEOUT: Duration = Duration::from_secs(30);

/// Counts a client against max_client_conn for as long as it lives.
struct ClientCount(Arc<App>);

impl ClientCount {
    fn new(app: &Arc<App>) -> ClientCount {
        app.clients.fetch_add(1, Ordering::Relaxed);
        ClientCount(app.clone())
    }
}

impl Drop for ClientCount {
    fn drop(&mut self) {
        self.0.clients.fetch_sub(1, Ordering::Relaxed);
    }
}

pub struct Session {
    stream: Stream,
    /// Client bytes not yet forwarded; `cframe` frames them.
    inbuf: BytesMut,
    cframe: Framer,
    /// Server bytes not yet forwarded; `sframe` frames them.
    outbuf: BytesMut,
    sframe: Framer,
    mode: PoolMode,
    /// The session parameters the client believes it has; servers are made to agree.
    wanted: ParamSet,
    max_packet: usize,
    exchange: Exchange,
    shutting_down: bool,
    client: ClientHandle,
    pool: Arc<Pool>,
    /// Traffic counted since the last transaction ended, added to the pool's stats then.
    delta: Delta,
    query_started: Option<Instant>,
    xact_started: Option<Instant>,
    /// When the client last became idle with a server lent (for idle_transaction_timeout).
    idle_since: Instant,
    timeouts: Timeouts,
    /// One timer, re-armed as the deadline that matters changes.
    timer: Option<Pin<Box<tokio::time::Sleep>>>,
    armed: Option<Instant>,
    /// server_fast_close: in session mode, give up a server whose connection settings a
    /// reload changed as soon as its transaction ends.
    fast_close: bool,
}

/// The client-side timeouts of PgBouncer; None where disabled.
#[derive(Debug, Clone, Copy, Default)]
pub struct Timeouts {
    pub client_idle: Option<Duration>,
    pub idle_transaction: Option<Duration>,
    pub query: Option<Duration>,
    pub transaction: Option<Duration>,
    pub query_wait_notify: Option<Duration>,
}

impl Timeouts {
    fn from_config(g: &weir_config::General, user: Option<&weir_config::User>) -> Timeouts {
        let nonzero = |d: Duration| (!d.is_zero()).then_some(d);
        Timeouts {
            client_idle: nonzero(
                user.and_then(|u| u.client_idle_timeout)
                    .unwrap_or(g.client_idle_timeout),
            ),
            idle_transaction: nonzero(
                user.and_then(|u| u.idle_transaction_timeout)
                    .unwrap_or(g.idle_transaction_timeout),
            ),
            query: nonzero(
                user.and_then(|u| u.query_timeout)
                    .unwrap_or(g.query_timeout),
            ),
            transaction: nonzero(
                user.and_then(|u| u.transaction_timeout)
                    .unwrap_or(g.transaction_timeout),
            ),
            query_wait_notify: nonzero(g.query_wait_notify),
        }
    }

    /// True when the relay has a deadline to watch at all.
    pub fn relay_has_any(&self) -> bool {
        self.idle_transaction.is_some() || self.query.is_some() || self.transaction.is_some()
    }
}

/// Counts a client in its pool's SHOW POOLS figures for as long as it lives.
struct PoolMember(Arc<Pool>);

impl Drop for PoolMember {
    fn drop(&mut self) {
        self.0.clients.fetch_sub(1, Ordering::Relaxed);
    }
}

pub async fn serve(app: Arc<App>, mut stream: Stream) {
    let _count = ClientCount::new(&app);
    let peer = stream.peer_label();
    let mut inbuf = BytesMut::with_capacity(1024);
    let login_timeout = app.snapshot.load().config.general.client_login_timeout;
    let attempt = login::login(&app, &mut stream, &mut inbuf, &peer);
    let outcome = if login_timeout.is_zero() {
        attempt.await
    } else {
        tokio::time::timeout(login_timeout, attempt)
            .await
            .unwrap_or_else(|_| Err(PgError::fatal("08P01", "client_login_timeout").into()))
    };
    let client = match outcome {
        Ok(Outcome::LoggedIn(c)) => c,
        Ok(Outcome::Admin(admin)) => {
            crate::admin::serve(app, stream, inbuf, admin).await;
            return;
        }
        Ok(Outcome::Cancel) | Ok(Outcome::Gone) => return,
        Err(refusal) => {
            let who = format!(
                "{}/{}@{peer}",
                refusal.database.as_deref().unwrap_or("(nodb)"),
                refusal.user.as_deref().unwrap_or("(nouser)")
            );
            if app.snapshot.load().config.general.log_pooler_errors {
                tracing::warn!("{who} login failed: {}", refusal.error);
            }
            refuse(&mut stream, &refusal.error).await;
            return;
        }
    };
    let handle = ClientHandle::register(
        &client.user,
        &client.database,
        &peer,
        &stream.local_label(),
        client.requested.get("application_name").unwrap_or(""),
    );
    client.pool.clients.fetch_add(1, Ordering::Relaxed);
    let _member = PoolMember(client.pool.clone());
    let who = format!("{}/{}@{peer}", client.database, client.user);
    let snap = app.snapshot.load_full();
    let mode = snap.pool_mode(
        &snap
            .resolve_database(&client.database)
            .map(|d| d.0)
            .unwrap_or_default(),
        &client.user,
    );
    let general = &snap.config.general;
    let mut session = Session {
        stream,
        inbuf,
        cframe: Framer::default(),
        outbuf: BytesMut::new(),
        sframe: Framer::default(),
        mode,
        wanted: ParamSet::default(),
        // PostgreSQL refuses anything over 1 GB anyway; refusing it here gives the client
        // a clear error instead of a server that hangs up.
        max_packet: (general.max_packet_size as usize).min(relay::MAX_MESSAGE),
        exchange: Exchange::fresh(),
        shutting_down: false,
        client: handle,
        pool: client.pool.clone(),
        delta: Delta::default(),
        query_started: None,
        xact_started: None,
        idle_since: Instant::now(),
        timeouts: Timeouts::from_config(general, snap.config.users.get(&client.user)),
        timer: None,
        armed: None,
        fast_close: general.server_fast_close,
    };
    let log_disconnections = general.log_disconnections;
    drop(snap);
    let info = session.client.0.clone();
    let reason = tokio::select! {
        r = session.run(&app, client) => r,
        // KILL / KILL_CLIENT from the admin console: whatever the session was doing
        // (a lent server is closed with it), it ends now.
        why = info.killed() => {
            refuse(&mut session.stream, &PgError::fatal("08P01", why)).await;
            why.to_owned()
        }
    };
    session.flush_stats();
    if log_disconnections {
        tracing::info!("{who} closing because: {reason}");
    }
}

async fn refuse(stream: &mut Stream, error: &PgError) {
    let _ = tokio::time::timeout(Duration::from_secs(5), async {
        stream.write_all(&messages::error_response(error)).await?;
        stream.shutdown().await
    })
    .await;
}

enum Wake {
    Message,
    Terminated,
    Gone,
    Shutdown,
    IdleTimeout,
}

impl Session {
    /// Serves a logged-in client until it leaves; returns why it ended, for the log.
    async fn run(&mut self, app: &Arc<App>, client: LoggedIn) -> String {
        let LoggedIn {
            pool,
            requested,
            scram_keys,
            ..
        } = client;
        let shutdown = app.shutdown.clone().cancelled_owned();
        tokio::pin!(shutdown);
        let mut lease = match self.welcome(&pool, requested, scram_keys.clone()).await {
            Ok(l) => l,
            Err(e) => return self.refuse(e).await,
        };
        loop {
            let mut held = match lease.take() {
                Some(l) => l,
                None => {
                    if !self.flush_client().await {
                        return "client unexpected eof".into();
                    }
                    match self.await_message(&mut shutdown).await {
                        Wake::Message => {}
                        Wake::Terminated => return "client close request".into(),
                        Wake::Gone => return "client unexpected eof".into(),
                        Wake::Shutdown => return self.refuse(shutting_down()).await,
                        Wake::IdleTimeout => {
                            return self
                                .refuse(PgError::fatal("57P05", "client_idle_timeout"))
                                .await
                        }
                    }
                    match self.acquire(&pool, &scram_keys).await {
                        Ok(l) => l,
                        Err(Some(e)) if e.severity == "ERROR" => {
                            if let Err(reason) = self.fail_request(&e).await {
                                return reason;
                            }
                            continue;
                        }
                        Err(Some(e)) => return self.refuse(e).await,
                        Err(None) => return "client gone while waiting for a server".into(),
                    }
                }
            };
            if let Err(e) = self.sync_params(&mut held).await {
                held.close().await;
                return self.refuse(e).await;
            }
            self.exchange = Exchange::fresh();
            self.lend(&held);
            let event = self.relay(&mut held, &mut shutdown).await;
            self.client.0.set_idle();
            held.info.0.set_idle();
            match event {
                Event::Idle => {
                    let always = held.pool().settings().server_reset_query_always;
                    if self.mode == PoolMode::Session || always {
                        self.finish_server(held).await;
                    } else {
                        held.release();
                    }
                    if self.shutting_down {
                        self.flush_client().await;
                        return self.refuse(shutting_down()).await;
                    }
                }
                Event::ClientTerminated => {
                    self.finish_server(held).await;
                    return "client close request".into();
                }
                Event::ClientGone => {
                    self.finish_server(held).await;
                    return "client unexpected eof".into();
                }
                Event::ServerGone => {
                    tracing::warn!(server = ?*held, "server connection lost while lent to a client");
                    drop(held);
                    self.flush_client().await;
                    return self
                        .refuse(PgError::fatal("08006", "server conn crashed?"))
                        .await;
                }
                Event::ClientProtocol(e) => {
                    held.close().await;
                    return self.refuse(e).await;
                }
                Event::Timeout(e) => {
                    held.close().await;
                    self.flush_client().await;
                    return self.refuse(e).await;
                }
                Event::TransactionInStatementMode => {
                    held.close().await;
                    // The reply to the statement that opened the transaction is withheld:
                    // the client must see it fail, not succeed and then lose its connection.
                    self.outbuf.clear();
                    self.sframe.reset();
                    return self
                        .refuse(PgError::fatal(
                            "25000",
                            "transaction blocks not allowed in statement pooling mode",
                        ))
                        .await;
                }
            }
        }
    }

    /// Answers the client's queued request with an error instead of running it: its
    /// messages up to the next Query or Sync are dropped, as PostgreSQL skips to Sync
    /// after an error. Errs with the reason when the client is gone.
    async fn fail_request(&mut self, error: &PgError) -> Result<(), String> {
        loop {
            let mut framer = Framer::default();
            let mut end = None;
            while let Ok(Some(f)) = framer.next(&self.inbuf, self.max_packet, |_| true) {
                if matches!(f.tag, b'Q' | b'S') {
                    end = Some(framer.scanned());
                    break;
                }
            }
            if let Some(end) = end {
                let _ = self.inbuf.split_to(end);
                break;
            }
            match self.read_more().await {
                Ok(0) | Err(_) => return Err("client unexpected eof".into()),
                Ok(_) => {}
            }
        }
        let mut out = messages::error_response(error);
        messages::ready_for_query(&mut out, b'I');
        self.stream
            .write_all(&out)
            .await
            .map_err(|_| "client unexpected eof".to_string())
    }

    /// Sends the client a fatal error and says why the session ended.
    async fn refuse(&mut self, error: PgError) -> String {
        refuse(&mut self.stream, &error).await;
        error.message
    }

    /// Returns a server the client is done with: reset and pooled when it is clean, closed
    /// when anything of the client's may linger in it (an open transaction, a half-sent
    /// message, an unanswered query).
    async fn finish_server(&self, mut held: Lease) {
        if !self.server_is_clean() {
            held.close().await;
            return;
        }
        let settings = held.pool().settings();
        let reset = self.mode == PoolMode::Session || settings.server_reset_query_always;
        if reset && !settings.server_reset_query.is_empty() {
            let query = settings.server_reset_query.clone();
            drop(settings);
            if let Err(e) = held.run_internal(&query, INTERNAL_QUERY_TIMEOUT).await {
                tracing::warn!(server = ?*held, "server_reset_query failed: {e}");
                held.close().await;
                return;
            }
        }
        held.release();
    }

    /// Writes what the server sent that the client has not been given yet.
    async fn flush_client(&mut self) -> bool {
        let ready = self.sframe.scanned().min(self.outbuf.len());
        let ok = ready == 0 || self.stream.write_all(&self.outbuf[..ready]).await.is_ok();
        self.outbuf.clear();
        self.sframe.reset();
        if self.outbuf.capacity() > 64 * 1024 {
            // An idle client keeps no large buffer.
            self.outbuf = BytesMut::new();
        }
        ok
    }

    /// Waits, without a server, until the client has sent the header of its next message.
    async fn await_message(
        &mut self,
        shutdown: &mut Pin<&mut WaitForCancellationFutureOwned>,
    ) -> Wake {
        loop {
            if self.inbuf.len() >= crate::protocol::HEADER_LEN {
                return if self.inbuf[0] == b'X' {
                    Wake::Terminated
                } else {
                    Wake::Message
                };
            }
            if self.shutting_down {
                return Wake::Shutdown;
            }
            let idle_limit = self.timeouts.client_idle;
            tokio::select! {
                _ = shutdown.as_mut() => self.shutting_down = true,
                r = self.read_more() => match r {
                    Ok(0) | Err(_) => return Wake::Gone,
                    Ok(_) => {}
                },
                _ = sleep_or_never(idle_limit) => return Wake::IdleTimeout,
            }
        }
    }

    /// Checks out a server, noticing meanwhile if the client goes away. `Err(None)` means it
    /// did: there is no one left to tell.
    async fn acquire(
        &mut self,
        pool: &Arc<Pool>,
        keys: &Option<Credential>,
    ) -> Result<Lease, Option<PgError>> {
        self.client.0.set_waiting();
        let started = Instant::now();
        let checkout = pool.checkout(keys.clone(), false);
        tokio::pin!(checkout);
        let notify =
            tokio::time::sleep(self.timeouts.query_wait_notify.unwrap_or(Duration::MAX / 4));
        tokio::pin!(notify);
        let mut notified = self.timeouts.query_wait_notify.is_none();
        let me = self.client.0.clone();
        loop {
            tokio::select! {
                _ = me.cancel_wait.notified() => {
                    me.set_idle();
                    return Err(Some(PgError::error("57014", "canceling statement due to user request")));
                }
                _ = &mut notify, if !notified => {
                    notified = true;
                    let notice = messages::notice_response(&PgError {
                        severity: "NOTICE".into(),
                        code: "00000".into(),
                        message: "No server connection available in postgres backend, client being queued".into(),
                        detail: None,
                    });
                    if self.stream.write_all(&notice).await.is_err() {
                        return Err(None);
                    }
                }
                r = &mut checkout => {
                    self.delta.wait_time_us += started.elapsed().as_micros() as u64;
                    self.client.0.set_idle();
                    return r.map_err(Some);
                }
                r = self.read_more(), if self.inbuf.len() < 1 << 20 => match r {
                    Ok(0) | Err(_) => return Err(None),
                    Ok(_) => {}
                },
            }
        }
    }

    async fn read_more(&mut self) -> std::io::Result<usize> {
        if self.inbuf.capacity() - self.inbuf.len() < 1024 {
            self.inbuf.reserve(8192);
        }
        self.stream.read_buf(&mut self.inbuf).await
    }

    /// Sends the client the parameters and key that end its login. The parameters come
    /// from the pool's first server (one is opened now if there is none yet).
    async fn welcome(
        &mut self,
        pool: &Arc<Pool>,
        requested: ParamSet,
        scram_keys: Option<Credential>,
    ) -> Result<Option<Lease>, PgError> {
        let mut lease = None;
        let welcome = match pool.welcome() {
            Some(w) => w,
            None => {
                let l = pool.checkout(scram_keys, true).await?;
                let params = Arc::new(l.params.clone());
                lease = Some(l);
                params
            }
        };
        let mut view = (*welcome).clone();
        for (k, v) in requested.iter() {
            view.set(k, v);
        }
        let mut out = BytesMut::with_capacity(512);
        for (k, v) in view.iter() {
            messages::parameter_status(&mut out, k, v);
            if crate::params::tracked_name(k).is_some() {
                self.wanted.set(k, v);
            }
        }
        let key = self.client.0.key;
        messages::backend_key_data(&mut out, key.pid, key.secret);
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

    /// Marks the pair linked, for cancel requests and the admin console.
    fn lend(&mut self, held: &Lease) {
        self.client.0.set_active(CancelTarget {
            addr: held.addr.clone(),
            key: held.key,
            server_id: held.id,
        });
        held.info.0.set_active(self.client.0.key.pid);
        self.delta.server_assignments += 1;
    }

    /// Adds what this client did since the last flush to its pool's counters.
    fn flush_stats(&mut self) {
        if !self.delta.is_empty() {
            self.pool.stats.add(&self.delta);
            self.delta = Delta::default();
        }
    }

    /// Makes the server's session parameters match what the client believes it has.
    async fn sync_params(&self, lease: &mut Lease) -> Result<(), PgError> {
        let mut sql = String::new();
        for (name, value) in self.wanted.iter() {
            if lease.params.get(name) != Some(value) {
                sql.push_str(&format!("SET {name} = {};", quote_literal(value)));
            }
        }
        if sql.is_empty() {
            return Ok(());
        }
        lease
            .run_internal(&sql, INTERNAL_QUERY_TIMEOUT)
            .await
            .map_err(|e| e.to_client_error())
    }
}

/// Sleeps for `d`, or forever when there is no limit.
async fn sleep_or_never(d: Option<Duration>) {
    match d {
        Some(d) => tokio::time::sleep(d).await,
        None => std::future::pending().await,
    }
}

fn shutting_down() -> PgError {
    PgError::fatal("57P01", "pooler is shutting down")
}
