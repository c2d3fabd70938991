//! One task per client: log it in, then lend it a server whenever it has something to run.

mod auth_method;
mod checkout;
mod failure;
mod listen;
pub(crate) use listen::{listen_request, may_listen};
pub mod login;
pub mod moved;
mod on_the_way;
pub mod park;
mod pipeline;
mod prepare;
pub(crate) use prepare::client_wants;
mod relay;
mod replication;
mod route;
mod start;
mod state;
mod stray_cancel;
mod timeouts;

use relay::UNSYNCED;
use std::pin::Pin;
use std::sync::atomic::{AtomicBool, Ordering};
use std::sync::Arc;
use std::time::{Duration, Instant};

use bytes::BytesMut;
use tokio::io::AsyncWriteExt;
use weir_auth::scram::Credential;

use crate::app::App;
use crate::params::ParamSet;
use crate::pool::{Lease, Pool, PoolMode};
use crate::protocol::framer::Framer;
use crate::protocol::PgError;
use crate::registry::clients::{CancelTarget, ClientHandle, PARK};
use crate::stats::Traffic;
use crate::stream::{Endpoint, Stream};
use relay::{Event, Exchange};
use timeouts::Timeouts;

/// Set once by a safe shutdown (SIGINT, SHUTDOWN WAIT_FOR_SERVERS). Sessions read it at
/// their own pace; each is woken through its own `stop` notify, so no client polls a
/// shared cancellation token (a global mutex) on its hot path.
static SHUTTING_DOWN: AtomicBool = AtomicBool::new(false);

/// Starts a safe shutdown: idle clients leave at once, the others when their transaction
/// (in session mode, their session's current transaction) ends.
pub fn begin_shutdown() {
    SHUTTING_DOWN.store(true, Ordering::SeqCst);
    for client in crate::registry::clients::CLIENTS.snapshot() {
        client.stop();
    }
}

const PINNED: u8 = 1;
const LISTENING: u8 = 2;
/// The server of the client's open transaction went away while the client was idle in
/// it: the client's next request is answered with the error (see `lost_transaction`).
const LOST: u8 = 4;
/// The answer to Weir's own query is due from the server before the client's (the one
/// that puts the server into the client's state, or the read-back after a request of
/// SETs, see on_the_way): it is removed from what the server sends. A tie of a kind: the
/// server cannot go while it is owed.
const OWED: u8 = 8;

/// What a client whose transaction died with its server is told, instead of losing its
/// connection: in transaction mode its next transaction can run on another server (after
/// a failover, on the new primary).
fn lost_transaction() -> PgError {
    PgError::error(
        "08006",
        "server connection lost; the transaction was rolled back",
    )
}

impl Session {
    fn pinned(&self) -> bool {
        self.ties & PINNED != 0
    }

    fn listening(&self) -> bool {
        self.ties & LISTENING != 0
    }

    fn owed(&self) -> bool {
        self.ties & OWED != 0
    }

    fn set_tie(&mut self, tie: u8, on: bool) {
        if on {
            self.ties |= tie;
        } else {
            self.ties &= !tie;
        }
    }
}

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
    /// Shared with the other clients that have the same (copied on change).
    wanted: Arc<ParamSet>,
    max_packet: u32,
    /// max_prepared_statements in pooled modes; 0 where statements are not tracked
    /// (session mode, or turned off).
    prepared_cap: u16,
    exchange: Exchange,
    shutting_down: bool,
    /// The client's next message waits for a server (it names a prepared statement).
    held_back: bool,
    /// What the queries since the session was last read back may have changed
    /// (sql::effects flags; see state).
    touched: u8,
    /// PINNED: something keeps the client on its server (see state), it is not given back
    /// between transactions. LISTENING: it listens through its pool's hub (see listen),
    /// notifications are passed on. LOST and OWED (see their definitions). One byte for
    /// all: an idle client pays for the session's size.
    /// Its two high bits: read_write_split's route of the lent server (see route).
    ties: u8,
    client: ClientHandle,
    /// Counted in the pool's clients for as long as the session lives.
    pool: PoolMember,
    /// Traffic counted since the last transaction ended, added to the pool's stats then.
    delta: Traffic,
    query_started: Option<Instant>,
    xact_started: Option<Instant>,
    /// When the client last became idle with a server lent (for idle_transaction_timeout).
    idle_since: Instant,
    timeouts: Timeouts,
    /// server_fast_close: in session mode, a server whose connection settings a reload
    /// changed, or that RECONNECT marked, is closed as soon as its transaction ends, and
    /// the client with it (see `fast_closed`).
    fast_close: bool,
    /// Held for its Drop: the client's place in the global client count.
    _count: ClientCount,
    /// What few sessions keep for long; None for most once they are welcomed.
    extras: Option<Box<Extras>>,
}

impl Drop for Session {
    // The buffers go back to the worker's pool: a client that connects for one transaction
    // would otherwise take one from the pool at every login and never give it back, and
    // every login would allocate (and touch) a fresh one.
    fn drop(&mut self) {
        if self.pinned() {
            self.pool.pinned.fetch_sub(1, Ordering::Relaxed);
        }
        if self.listening() {
            crate::listen::unlisten(&self.pool, self.client.0.key.pid, None);
        }
        for buf in [&mut self.inbuf, &mut self.outbuf] {
            buf.clear();
            crate::bufpool::park(buf);
        }
    }
}

/// What only some sessions need, or need only at first: boxed together, so that the
/// others carry one pointer for all of it (an idle client is counted in bytes, see
/// `park`).
#[derive(Default)]
struct Extras {
    /// What the client asked for at startup, until the welcome has used it.
    requested: Option<ParamSet>,
    /// Only for SCRAM logins.
    scram_keys: Option<Credential>,
    /// One timer for the relay's timeouts, re-armed as the deadline that matters changes.
    timer: Option<Pin<Box<crate::timers::Sleep>>>,
    /// The client's named statements and the replies owed for what was sent, once it
    /// uses the extended protocol in a pooled mode (see prepared).
    prepared: Option<Box<crate::prepared::ClientStatements>>,
    /// The settings the client made that servers do not report, as last read back.
    gucs: Option<Arc<crate::gucs::Gucs>>,
    /// The settings it gave at startup, which RESET ALL goes back to.
    startup_gucs: Option<Arc<crate::gucs::Gucs>>,
    /// Settings named by queries since the last read-back (see state).
    touched_names: Vec<String>,
    /// The bind parameters of the unnamed statement that name settings (see state).
    unnamed_params: Vec<u16>,
    /// read_write_split: the client committed a write the standbys may not have yet.
    pending_write: Option<crate::split::lsn::Pending>,
    /// Session mode, during an online restart: the server that moves with the client
    /// (see moved). Taken up again if the move cannot be made.
    handoff: Option<Lease>,
    /// The rows of a read-back written behind the client's request (on_the_way), as
    /// they come.
    read_back: Option<Box<on_the_way::ReadBackRows>>,
    /// A cancel hit Weir's state query in front of the client's request (on_the_way).
    state_cut: Option<on_the_way::StateCut>,
    /// A request sent before the client had its server, kept for the length of its
    /// transaction should another's cancel hit it (see stray_cancel).
    replay: Option<Box<stray_cancel::Replay>>,
}

impl Extras {
    fn is_empty(&self) -> bool {
        self.state_is_empty()
            && self.prepared.is_none()
            && self.requested.is_none()
            && self.scram_keys.is_none()
            && self.timer.is_none()
            && self.pending_write.is_none()
            && self.handoff.is_none()
            && self.replay.is_none()
            && self.read_back.is_none()
            && self.state_cut.is_none()
    }
}

/// Counts a client in its pool's SHOW POOLS figures for as long as it lives.
struct PoolMember(Arc<Pool>);

impl std::ops::Deref for PoolMember {
    type Target = Arc<Pool>;
    fn deref(&self) -> &Arc<Pool> {
        &self.0
    }
}

impl Drop for PoolMember {
    fn drop(&mut self) {
        self.0.clients.fetch_sub(1, Ordering::Relaxed);
    }
}

/// Serves an admin console session to its end. The console sits above the client
/// session, so the process passes it in (`admin::console`, through listener::run).
pub type Console = fn(
    Arc<App>,
    Stream,
    BytesMut,
    login::AdminLogin,
    (Endpoint, Endpoint),
) -> Pin<Box<dyn std::future::Future<Output = ()> + Send>>;

pub async fn serve(
    app: Arc<App>,
    console: Console,
    stream: Stream,
    peer: Endpoint,
    local: Endpoint,
) {
    // Boxed: logging in is large and short-lived; it must not size every client's task.
    let Some(session) = Box::pin(start::start(&app, console, stream, peer, local)).await else {
        return;
    };
    // The session is boxed from the start, so that parking it moves a pointer.
    run_session(Box::new(session), false).await;
}

/// Runs a session until it ends or is parked (a resumed one has had its welcome).
async fn run_session(mut session: Box<Session>, mut resumed: bool) {
    while session.main(resumed).await {
        if crate::registry::handover::moving() {
            match moved::hand(session) {
                Ok(()) => return,
                Err(s) => session = s,
            }
        }
        match park::park(session) {
            Ok(()) => return,
            Err(s) => {
                session = s;
                resumed = true;
            }
        }
    }
}

impl Session {
    /// Runs the session to its end, and a KILL from the admin console ends it whatever it
    /// was doing (a lent server is closed with it). True when it stopped to be parked.
    async fn main(&mut self, resumed: bool) -> bool {
        let info = self.client.0.clone();
        // Biased: a random start costs a random number on every poll of every client, and
        // the kill check (one atomic) goes first so that a busy session still sees it.
        let reason = tokio::select! {
            biased;
            (code, why) = info.killed() => {
                crate::conn_log::pooler_error(&info, why);
                refuse(&mut self.stream, &PgError::fatal(code, why)).await;
                why.to_owned()
            }
            r = self.run(resumed) => match r {
                Some(r) => r,
                None => return true,
            },
        };
        self.flush_stats();
        crate::conn_log::client_closing(&self.client.0, &reason);
        false
    }
}

async fn refuse(stream: &mut Stream, error: &PgError) {
    let _ = crate::timers::timeout(Duration::from_secs(5), async {
        stream
            .write_all(&crate::stats::error_response(error))
            .await?;
        stream.shutdown().await
    })
    .await;
}

enum Wake {
    Message,
    /// Idle long enough to give up the task (see `park`).
    Park,
    Terminated,
    Gone,
    Shutdown,
    IdleTimeout,
}

impl Session {
    /// Serves a logged-in client until it leaves, returning why it ended, for the log, or
    /// until it is to be parked (None). The rare steps (welcome, errors, closing) live in
    /// boxed futures: this one is part of every client's task, and only the common steps
    /// should size it.
    async fn run(&mut self, resumed: bool) -> Option<String> {
        let mut lease = if resumed {
            self.extras.as_mut().and_then(|x| x.handoff.take())
        } else {
            match Box::pin(self.welcome()).await {
                Ok(l) => l,
                Err(e) => return Some(Box::pin(self.refuse(e)).await),
            }
        };
        if lease.is_some() && self.pool.settings().split.is_some() {
            self.set_route(route::READ_ON_PRIMARY);
        }
        loop {
            let held = match lease.take() {
                Some(l) => l,
                None => match self.next_server().await {
                    Ok(Some(l)) => l,
                    Ok(None) => continue,
                    Err(end) => return end,
                },
            };
            if let Some(reason) = self.transaction(held).await {
                return Some(reason);
            }
            if self.extras.as_ref().is_some_and(|x| x.handoff.is_some()) {
                return None;
            }
        }
    }

    /// Waits for the client's next request and a server to run it on. Ok(None): the
    /// request was answered without one (cancelled while queued). Err(None): the client is
    /// to be parked; Err(Some(reason)): the session ended.
    async fn next_server(&mut self) -> Result<Option<Lease>, Option<String>> {
        // Fresh here rather than at the lend: a client that queues frames its request
        // before it has a server (see `ahead`).
        self.exchange = Exchange::fresh();
        if !self.flush_client().await {
            return Err(Some("client unexpected eof".into()));
        }
        let error = match self.await_message().await {
            Wake::Message
                if self.answer_alone()
                    || (self.may_listen() && Box::pin(self.answer_listen()).await) =>
            {
                return match self.flush_client().await {
                    true => Ok(None),
                    false => Err(Some("client unexpected eof".into())),
                }
            }
            Wake::Message if self.ties & LOST != 0 => {
                self.set_tie(LOST, false);
                return Box::pin(self.fail_request(&lost_transaction()))
                    .await
                    .map(|()| None)
                    .map_err(Some);
            }
            Wake::Message => match self.acquire().await {
                Ok(l) => return Ok(Some(l)),
                Err(Some(e)) if e.severity == "ERROR" => {
                    return Box::pin(self.fail_request(&e))
                        .await
                        .map(|()| None)
                        .map_err(Some);
                }
                Err(Some(e)) => e,
                Err(None) => return Err(Some("client gone while waiting for a server".into())),
            },
            Wake::Park => return Err(None),
            Wake::Terminated => return Err(Some("client close request".into())),
            Wake::Gone => return Err(Some("client unexpected eof".into())),
            Wake::Shutdown => self.leaving(),
            Wake::IdleTimeout => PgError::fatal("57P05", "client_idle_timeout"),
        };
        Err(Some(Box::pin(self.refuse(error)).await))
    }

    /// Lends `held` to the client for one transaction (for the whole session in session
    /// mode) and gives it back. Some(reason) when the session ends.
    async fn transaction(&mut self, mut held: Lease) -> Option<String> {
        if held.adopt().is_err() {
            let e = PgError::fatal("08006", "server conn crashed?");
            return Some(Box::pin(self.refuse(e)).await);
        }
        // A request already on the server (sent ahead, or pipelined behind another's) was
        // let go there only if the server held its settings, or with the query that puts
        // them there in front of it (pool::ahead). Should the request before it
        // have changed one since (a function's set_config, reported by ParameterStatus),
        // a SET now would run after it and its answer be taken for the request's: the
        // server is put right for the next client it is lent to (synced_to is unset).
        let ahead = held.holds_ahead();
        self.start_on_server(std::mem::take(&mut held.sent_ahead));
        self.take_carry(&mut held);
        if !ahead && self.described_ahead() {
            // The statements' check parses them as the client's Parse would: in its state
            // (search_path), which the server is put into first, apart.
            let sql = self.state_sql(&mut held);
            let mut r = Ok(());
            if !sql.is_empty() {
                r = held.run_internal_boxed(&sql, INTERNAL_QUERY_TIMEOUT).await;
            }
            if r.is_ok() {
                r = Box::pin(self.settle_described(&mut held)).await;
            }
            if let Err(e) = r {
                let e = e.to_client_error();
                return Some(Box::pin(self.close_and_refuse(held, e, false)).await);
            }
        }
        self.settle_ahead(&mut held.statements);
        // In front of all of it: the server is put into the client's state first.
        self.take_owed_state(&mut held);
        if !ahead {
            if let Err(e) = Box::pin(self.put_state(&mut held)).await {
                return Some(Box::pin(self.close_and_refuse(held, e, false)).await);
            }
        }
        self.lend(&held);
        let event = loop {
            let event = self.relay(&mut held).await;
            if matches!(event, Event::Idle) && self.moves_with_server(&held) {
                if self.movable_with(&held) {
                    self.extras.get_or_insert_with(Box::default).handoff = Some(held);
                    self.client.0.set_idle();
                    return None;
                }
                // Not now (the client has already sent more): at a later transaction's end.
                continue;
            }
            if !matches!(event, Event::Idle) || (self.touched == 0 && !self.pinned()) {
                break event;
            }
            // Only Weir's own queries run on the server now (the client has its answer):
            // a cancel the client sends meanwhile, for a request not on the server yet,
            // must not cut them, as it would reach nothing on a direct connection.
            self.client.0.unlink();
            if self.touched != 0 {
                if let Err(e) = Box::pin(self.read_back(&mut held)).await {
                    return Some(Box::pin(self.close_and_refuse(held, e, true)).await);
                }
            }
            if !self.pinned() || self.shutting_down {
                break event;
            }
            // Pinned: the server stays lent for the next transaction, and must hold what
            // the client holds (after RESET ALL, its own startup parameters back); a
            // no-op without a round trip when it already does.
            if let Err(e) = self.sync_params(&mut held).await {
                return Some(Box::pin(self.close_and_refuse(held, e, true)).await);
            }
            if !self.flush_client().await {
                Box::pin(self.finish_server(held)).await;
                return Some("client unexpected eof".into());
            }
            self.link(&held);
        };
        self.note_write();
        if let Some(x) = self.extras.as_mut() {
            x.replay = None;
        }
        self.client.0.set_idle();
        held.info.0.set_idle();
        if self.prepared_cap != 0 {
            held.info.0.set_prepared(held.statements.len());
            let names = prepare::statements(&mut self.extras).map_or(0, |p| p.names.len());
            self.client.0.set_prepared(names);
        }
        match event {
            Event::Idle => {
                let settings = held.pool().settings();
                let always = settings.server_reset_query_always;
                if self.mode != PoolMode::Session {
                    self.follow_prepared_cap(settings.prepared_cap);
                }
                drop(settings);
                if self.fast_closed(&held) {
                    return Some(Box::pin(self.end_fast_closed(held)).await);
                }
                if !held.passengers.is_empty() {
                    // Straight to the client whose request runs next on it (the server
                    // holds its settings, so nothing is reset).
                    self.hand_carry(&mut held);
                    held.release();
                } else if self.mode == PoolMode::Session || always || self.pinned() {
                    Box::pin(self.finish_server(held)).await;
                } else if Box::pin(state::before_pooling(&mut held)).await {
                    held.release();
                } else {
                    crate::conn_log::server_closing(&held.info.0, "could not reset server");
                    held.close().await;
                }
                if !self.shutting_down {
                    return None;
                }
                self.flush_client().await;
                let e = self.leaving();
                Some(Box::pin(self.refuse(e)).await)
            }
            Event::ClientTerminated => {
                Box::pin(self.finish_server(held)).await;
                Some("client close request".into())
            }
            Event::ClientGone => {
                Box::pin(self.finish_server(held)).await;
                Some("client unexpected eof".into())
            }
            // Part of a message (a row of a large result) already went to the client:
            // nothing can follow it that the client would read as a message, so it is
            // closed, as a direct connection is when its server dies mid-row.
            Event::ServerGone if !self.sframe.at_boundary() => {
                crate::conn_log::server_closing(&held.info.0, "server conn crashed?");
                drop(held);
                Some("server conn crashed in the middle of a message".into())
            }
            // Not when extended-protocol messages (or bytes that are no message at all)
            // were left without their Sync: the client may never send one, and a server
            // that died of what it was sent is the client's doing.
            // Nor while the read-back of a SET the client was told succeeded was owed:
            // the next server would be given the settings from before it.
            Event::ServerGone
                if self.mode != PoolMode::Session
                    && !self.pinned()
                    && !self.exchange.has(UNSYNCED)
                    && !self.reading_back() =>
            {
                crate::conn_log::server_closing(&held.info.0, "server conn crashed?");
                drop(held);
                Box::pin(self.survive_lost_server()).await
            }
            Event::ServerGone => {
                crate::conn_log::server_closing(&held.info.0, "server conn crashed?");
                drop(held);
                self.flush_client().await;
                let e = PgError::fatal("08006", "server conn crashed?");
                Some(Box::pin(self.refuse(e)).await)
            }
            Event::ClientProtocol(e) => Some(Box::pin(self.close_and_refuse(held, e, false)).await),
            // Weir's query that put the server into the client's state failed: the
            // request written behind it was refused, as before it ran apart.
            Event::StateFailed(e) => Some(Box::pin(self.close_and_refuse(held, e, false)).await),
            // Nothing of the request ran: the client is told as a direct connection tells
            // a cancelled request, and the server, left in an aborted block with the
            // request's refusals (and any boarded behind it) still to come, is closed.
            // The client's state goes in front of its next request, on its next server.
            Event::StateCancelled(e) => {
                crate::conn_log::server_closing(&held.info.0, &e.message);
                held.close().await;
                Box::pin(self.answer_unrun(e)).await
            }
            Event::Timeout(e) => Some(Box::pin(self.close_and_refuse(held, e, true)).await),
            Event::TransactionInStatementMode => {
                // The reply to the statement that opened the transaction is withheld:
                // the client must see it fail, not succeed and then lose its connection.
                self.outbuf.clear();
                self.sframe.reset();
                let e = PgError::fatal(
                    "25000",
                    "transaction blocks not allowed in statement pooling mode",
                );
                Some(Box::pin(self.close_and_refuse(held, e, false)).await)
            }
        }
    }

    /// Returns a server the client is done with: reset and pooled when it is clean, closed
    /// when anything of the client's may linger in it (an open transaction, a half-sent
    /// message, an unanswered query).
    async fn finish_server(&mut self, mut held: Lease) {
        if !held.passengers.is_empty() {
            // Other clients' requests run behind this one's on it: once its own answer
            // is in (read and dropped), the server is theirs.
            if Box::pin(self.drain_own_answer(&mut held)).await && self.server_is_clean() {
                self.hand_carry(&mut held);
                held.release();
            } else {
                crate::conn_log::server_closing(&held.info.0, "client gone before its answer");
                held.close().await;
            }
            return;
        }
        if !self.server_is_clean() || !self.clean_for_next(&mut held).await {
            crate::conn_log::server_closing(
                &held.info.0,
                "client disconnect while server was not ready",
            );
            held.close().await;
            return;
        }
        let settings = held.pool().settings();
        let reset = self.mode == PoolMode::Session || settings.server_reset_query_always;
        if reset && !settings.server_reset_query.is_empty() {
            let query = settings.server_reset_query.clone();
            drop(settings);
            if let Err(e) = held
                .run_internal_boxed(&query, INTERNAL_QUERY_TIMEOUT)
                .await
            {
                tracing::warn!(server = ?*held, "server_reset_query failed: {e}");
                crate::conn_log::server_closing(&held.info.0, "server_reset_query failed");
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
        crate::bufpool::park(&mut self.outbuf);
        ok
    }

    /// Waits, without a server, until the client has sent the header of its next message.
    async fn await_message(&mut self) -> Wake {
        let info = self.client.0.clone();
        loop {
            if self.inbuf.len() >= crate::protocol::HEADER_LEN {
                return if self.inbuf[0] == b'X' {
                    Wake::Terminated
                } else {
                    Wake::Message
                };
            }
            if self.shutting_down || SHUTTING_DOWN.load(Ordering::Relaxed) || self.pool.is_removed()
            {
                self.shutting_down = true;
                return Wake::Shutdown;
            }
            // An online restart: the client goes to the new process as soon as it is idle
            // with nothing half-done (run_session hands it over).
            if crate::registry::handover::moving() && self.movable() {
                return Wake::Park;
            }
            // The idle timer is boxed and only made when configured: an idle client's task
            // should not carry one it does not need. It counts from the end of the last
            // transaction, so that a parked and resumed client is not given more time.
            let idle_limit = self
                .timeouts
                .client_idle()
                .map(|d| Box::pin(crate::timers::sleep_until(self.idle_since + d)));
            // Biased, reading first: a client that sent something is not parked for it.
            tokio::select! {
                biased;
                r = self.read_more() => match r {
                    Ok(0) | Err(_) => return Wake::Gone,
                    Ok(_) => {}
                },
                signals = info.stopped_parking_or_notified() => {
                    if signals & PARK != 0 {
                        info.take_park();
                        // A listener keeps its task: notifications come to it. So does a
                        // TLS client (park::park).
                        // A client of a removed database is woken this way to leave.
                        if self.inbuf.is_empty()
                            && self.ties & (LISTENING | LOST) == 0
                            && !self.stream.is_tls()
                            && !self.pool.is_removed()
                        {
                            return Wake::Park;
                        }
                    }
                    if !self.send_notifications().await {
                        return Wake::Gone;
                    }
                }
                _ = async { match idle_limit { Some(t) => t.await, None => std::future::pending().await } } => {
                    return Wake::IdleTimeout;
                }
            }
        }
    }

    /// Reads what the client sent; waits for it without holding a buffer when there is
    /// nothing buffered yet.
    async fn read_more(&mut self) -> std::io::Result<usize> {
        std::future::poll_fn(|cx| {
            if self.inbuf.is_empty() {
                crate::bufpool::park(&mut self.inbuf);
                std::task::ready!(self.stream.poll_read_ready(cx))?;
            }
            crate::bufpool::ensure(&mut self.inbuf);
            let read =
                tokio_util::io::poll_read_buf(Pin::new(&mut self.stream), cx, &mut self.inbuf);
            // Over TLS readiness cannot be known without reading (the session may hold
            // plaintext already), and a TCP socket's readiness may be stale: an idle
            // client must not wait holding a buffer (16 kB each).
            if read.is_pending() {
                crate::bufpool::park(&mut self.inbuf);
            }
            read
        })
        .await
    }

    /// Drops the extras once nothing is left in them.
    fn trim_extras(&mut self) {
        if self.extras.as_ref().is_some_and(|e| e.is_empty()) {
            self.extras = None;
        }
    }

    /// Marks the pair linked, for cancel requests and the admin console.
    fn lend(&mut self, held: &Lease) {
        self.link(held);
        held.info.0.set_active(self.client.0.key.pid);
        self.delta.server_assignments += 1;
    }

    /// Points the client's cancel requests at `held`.
    fn link(&self, held: &Lease) {
        self.client.0.set_active(CancelTarget {
            addr: held.addr.clone(),
            key: held.key.clone(),
            server_id: held.id,
        });
    }

    /// Adds what this client did since the last flush to its pool's counters.
    fn flush_stats(&mut self) {
        self.flush_prepared_stats();
        if !self.delta.is_empty() {
            self.pool.stats.add_traffic(&self.delta);
            self.delta = Traffic::default();
        }
    }
}

impl Session {
    /// What a client told to leave at the end of its transaction hears.
    fn leaving(&self) -> PgError {
        if self.pool.is_removed() && !SHUTTING_DOWN.load(Ordering::Relaxed) {
            PgError::fatal("08P01", "database removed")
        } else {
            shutting_down()
        }
    }
}

fn shutting_down() -> PgError {
    PgError::fatal("57P01", "pooler is shutting down")
}
