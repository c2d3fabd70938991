//! The hot path: bytes between a client and the server lent to it.
//!
//! One poll loop drives both directions at once (so a client that pipelines while the
//! server streams results cannot deadlock the pair), forwards whole buffers as they arrive,
//! and frames by header only. It looks inside just ReadyForQuery (to know when the server
//! may go back to the pool) and ParameterStatus (to know the client's session parameters).

use std::future::Future;
use std::pin::Pin;
use std::sync::Arc;
use std::task::{Context, Poll};
use std::time::Instant;

use bytes::{Buf, Bytes};
use tokio::io::AsyncWrite;
use tokio_util::io::poll_read_buf;

use super::prepare::{Tracked, Tracking};
use super::Session;
use crate::pool::{Ahead, Lease, PoolMode};
use crate::protocol::framer::FrameError;
use crate::protocol::PgError;
use crate::server::ServerConn;

/// Stop reading a side while this much of what it sent still waits to be written.
const HIGH_WATER: usize = 256 * 1024;
/// PostgreSQL's own limit on a message (MaxAllocSize).
pub const MAX_MESSAGE: usize = 0x3fff_ffff;

#[derive(Debug)]
pub enum Event {
    /// The server is idle with nothing outstanding: it may go back to the pool.
    Idle,
    /// The client sent Terminate; everything before it was forwarded.
    ClientTerminated,
    ClientGone,
    ServerGone,
    /// The client broke the protocol; it is told this and disconnected.
    ClientProtocol(PgError),
    /// A transaction was opened in statement pooling mode.
    TransactionInStatementMode,
    /// query_timeout, idle_transaction_timeout or transaction_timeout expired.
    Timeout(PgError),
    /// The query that put the server into the client's state (on_the_way) failed.
    StateFailed(PgError),
    /// A cancel hit that query in its block: the request behind it was refused unrun.
    StateCancelled(PgError),
}

/// What the relay knows of the exchange with the current server.
#[derive(Debug, Default)]
pub struct Exchange {
    /// Queries and Syncs sent whose ReadyForQuery has not come back.
    pub pending: u32,
    /// The last transaction status: I (idle), T (in a transaction), E (failed transaction).
    pub status: u8,
    /// UNSYNCED, ANSWERED, TERMINATED, and for pipelining (pool::pipeline) PLAIN,
    /// UNNAMED_PLAIN, BOARDED, CARRYING, and TRAILING (on_the_way): one byte, as an idle client pays for the
    /// session's size.
    pub flags: u8,
    /// The request's fingerprint (sql::pipeline::fold), folded to 16 bits for the same
    /// reason: a collision only keeps a request from being pipelined.
    pub print: u16,
}

/// Extended-protocol messages sent since the last Sync.
pub const UNSYNCED: u8 = 16;
/// A ReadyForQuery answered everything sent since the server was lent.
pub const ANSWERED: u8 = 32;
/// The client sent Terminate.
pub const TERMINATED: u8 = 64;
/// The request sent since the server was last idle is one plain implicit transaction so
/// far (sql::pipeline): other clients' requests may go behind it.
pub const PLAIN: u8 = 1;
/// This request parsed the unnamed statement, plain.
pub const UNNAMED_PLAIN: u8 = 2;
/// Waiting clients were looked at to go behind this request.
pub const BOARDED: u8 = 4;
/// Other clients' requests were sent behind this one: nothing more of this client's goes
/// to the server, and what the server sends past its last ReadyForQuery is theirs.
pub const CARRYING: u8 = 8;
/// A read-back was written behind the client's request (on_the_way): its answer follows
/// the request's, and is removed (the OWED tie) once that is in.
pub const TRAILING: u8 = 128;

impl Exchange {
    pub fn has(&self, bit: u8) -> bool {
        self.flags & bit != 0
    }

    pub fn set(&mut self, bit: u8, on: bool) {
        if on {
            self.flags |= bit;
        } else {
            self.flags &= !bit;
        }
    }
}

impl Exchange {
    pub fn fresh() -> Exchange {
        Exchange {
            status: b'I',
            ..Exchange::default()
        }
    }
}

impl Session {
    /// True when the server can be handed to someone else without anything of this client
    /// in flight in either direction.
    pub fn server_is_clean(&self) -> bool {
        let x = &self.exchange;
        x.pending == 0
            && !self.owed()
            && !x.has(TRAILING)
            && !x.has(UNSYNCED)
            && x.status == b'I'
            && self.cframe.scanned() == 0
            && self.cframe.at_boundary()
            && self.sframe.at_boundary()
            && (x.has(CARRYING) || self.sframe.scanned() == self.outbuf.len())
            && super::prepare::replies_settled(&self.extras, x.has(CARRYING) && x.pending == 0)
    }

    /// Frames what the client has sent of its next request while it queues for a server,
    /// and copies it for the task that releases a server to send ahead (pool::ahead).
    /// None when there is nothing whole to send yet or the client sent something wrong
    /// (the relay reports that).
    pub fn request_ahead(&mut self) -> Option<Ahead> {
        self.scan_client(None).ok()?;
        let ready = self.cframe.scanned();
        if ready == 0 || !self.cframe.at_boundary() || self.held_back {
            return None;
        }
        Some(Ahead {
            bytes: Bytes::copy_from_slice(&self.inbuf[..ready]),
            wanted: self.wanted.clone(),
            gucs: self.gucs().cloned(),
            client: self.client.0.clone(),
            statements: self.ahead_needs(),
            plain: self.may_go_behind(),
        })
    }

    /// The request starts on the server it was lent: the first `sent_ahead` bytes were
    /// already written there by the task that released it, so they count as forwarded;
    /// and a request framed while queueing has its clocks started now, not when it was
    /// framed (the wait is counted apart, as wait time).
    pub fn start_on_server(&mut self, sent_ahead: usize) {
        if sent_ahead > 0 {
            self.keep_for_replay(sent_ahead);
            self.inbuf.advance(sent_ahead);
            self.cframe.consumed(sent_ahead);
            self.delta.received += sent_ahead as u64;
        }
        if self.query_started.is_none() && self.xact_started.is_none() {
            return;
        }
        let now = Instant::now();
        if self.query_started.is_some() {
            self.query_started = Some(now);
        }
        if self.xact_started.is_some() {
            self.xact_started = Some(now);
        }
    }

    pub async fn relay(&mut self, server: &mut Lease) -> Event {
        self.exchange.set(ANSWERED, false);
        // A safe shutdown wakes the task through the client's signals (registered by
        // `Session::main` at every poll); the relay only reads the flag.
        std::future::poll_fn(|cx| {
            // In session mode a safe shutdown lets the session go on until the client
            // leaves, as PgBouncer's WAIT_FOR_SERVERS waits for its server.
            if !self.shutting_down
                && ((self.mode != PoolMode::Session
                    && super::SHUTTING_DOWN.load(std::sync::atomic::Ordering::Relaxed))
                    || self.pool.is_removed())
            {
                self.shutting_down = true;
            }
            self.poll_relay(server, cx)
        })
        .await
    }

    fn poll_relay(&mut self, server: &mut Lease, cx: &mut Context<'_>) -> Poll<Event> {
        // server_fast_close: an idle session goes too, not only one that just had an answer.
        let fast_closed = self.fast_closed(server);
        let release_on_idle = self.mode != PoolMode::Session
            || self.shutting_down
            || fast_closed
            || (crate::registry::handover::moving()
                && !self.stream.is_tls()
                && !server.stream.is_tls());
        loop {
            let mut progress = false;
            // With other clients' requests behind its own, the client's next one waits
            // for its next server: it is not read now.
            let carrying = !server.passengers.is_empty();
            self.exchange.set(CARRYING, carrying);

            // Past the high-water mark only to complete a message that must be seen whole.
            let unframed = self.cframe.scanned() == 0 && !self.held_back;
            if !carrying
                && !self.exchange.has(TERMINATED)
                && (self.inbuf.len() < HIGH_WATER || unframed)
            {
                crate::bufpool::ensure(&mut self.inbuf);
                match poll_read_buf(Pin::new(&mut self.stream), cx, &mut self.inbuf) {
                    Poll::Ready(Ok(0)) | Poll::Ready(Err(_)) => {
                        return Poll::Ready(Event::ClientGone)
                    }
                    Poll::Ready(Ok(_)) => progress = true,
                    Poll::Pending => {}
                }
            }
            // Nothing more is framed, and so written, behind a request whose server is
            // still being put into the client's state (see on_the_way).
            if !carrying && !self.owed() && !self.exchange.has(TRAILING) {
                if let Err(e) = self.scan_client(Some(&mut server.statements)) {
                    return Poll::Ready(Event::ClientProtocol(e));
                }
            }

            let ready = self.cframe.scanned();
            if ready > 0 {
                match Pin::new(&mut server.stream).poll_write(cx, &self.inbuf[..ready]) {
                    Poll::Ready(Ok(n)) => {
                        self.inbuf.advance(n);
                        self.cframe.consumed(n);
                        self.delta.received += n as u64;
                        progress = true;
                    }
                    Poll::Ready(Err(_)) => return Poll::Ready(Event::ServerGone),
                    Poll::Pending => {}
                }
            }
            if self.exchange.flags & (BOARDED | PLAIN) == PLAIN {
                self.board(server);
            }

            // Past the high-water mark while Weir's own answers are owed: each is framed
            // whole before it is removed (a state query's set_config() row holds the
            // whole value, which may be larger), and the client gets nothing meanwhile.
            if self.outbuf.len() < HIGH_WATER || self.owed() {
                crate::bufpool::ensure(&mut self.outbuf);
                match poll_read_buf(Pin::new(&mut server.stream), cx, &mut self.outbuf) {
                    Poll::Ready(Ok(0)) | Poll::Ready(Err(_)) => {
                        return Poll::Ready(Event::ServerGone)
                    }
                    Poll::Ready(Ok(_)) => progress = true,
                    Poll::Pending => {}
                }
            }
            let unread = self.inbuf.len();
            match self.scan_server(server) {
                Ok(()) => {}
                Err(ev) => return Poll::Ready(ev),
            }
            if self.inbuf.len() != unread {
                // A batch to run again was put back in front of the client's bytes
                // (prepared::retry), maybe from bytes read before (a pipelined answer
                // carried over): it is framed in the next round, not left waiting.
                progress = true;
            }

            if self.listening() {
                self.add_notifications();
            }
            let ready = self.sframe.scanned();
            if ready > 0 {
                match Pin::new(&mut self.stream).poll_write(cx, &self.outbuf[..ready]) {
                    Poll::Ready(Ok(n)) => {
                        self.outbuf.advance(n);
                        self.sframe.consumed(n);
                        self.delta.sent += n as u64;
                        progress = true;
                    }
                    Poll::Ready(Err(_)) => return Poll::Ready(Event::ClientGone),
                    Poll::Pending => {}
                }
            }

            if self.stream.is_tls() {
                let _ = self.stream.poll_flush_tls(cx);
            }
            if server.stream.is_tls() {
                let _ = server.stream.poll_flush_tls(cx);
            }
            if self.exchange.has(TERMINATED) && self.cframe.scanned() == 0 {
                return Poll::Ready(Event::ClientTerminated);
            }
            if release_on_idle
                && (self.exchange.has(ANSWERED) || self.shutting_down || fast_closed)
                && self.server_is_clean()
            {
                return Poll::Ready(Event::Idle);
            }
            if !progress {
                if self.exchange.flags & (BOARDED | PLAIN) == BOARDED | PLAIN
                    && self.board_late(server, cx)
                {
                    continue;
                }
                if self.timeouts.relay_has_any() {
                    if let Some(e) = self.poll_deadline(cx) {
                        return Poll::Ready(Event::Timeout(e));
                    }
                }
                return Poll::Pending;
            }
        }
    }

    /// The deadline that applies now: a running query, an idle open transaction, the
    /// transaction as a whole.
    fn deadline(&self) -> Option<(Instant, PgError)> {
        let x = &self.exchange;
        let t = &self.timeouts;
        let mut best: Option<(Instant, PgError)> = None;
        // PgBouncer's texts and SQLSTATE: the connection is closed, and 08P01 is what
        // drivers map to a connection error (25P03/57014 would read as a statement's).
        let mut consider = |at: Instant, what: &str| {
            if best.as_ref().is_none_or(|(b, _)| at < *b) {
                best = Some((at, PgError::fatal("08P01", what)));
            }
        };
        if x.pending > 0 {
            if let (Some(q), Some(start)) = (t.query(), self.query_started) {
                consider(start + q, "query timeout");
            }
        } else if x.status != b'I' {
            if let Some(it) = t.idle_transaction() {
                consider(self.idle_since + it, "idle transaction timeout");
            }
        }
        if let (Some(tt), Some(start)) = (t.transaction(), self.xact_started) {
            consider(start + tt, "transaction timeout");
        }
        best
    }

    /// Arms the timer for the current deadline; returns the error when it has passed.
    fn poll_deadline(&mut self, cx: &mut Context<'_>) -> Option<PgError> {
        let (at, err) = self.deadline()?;
        let timer = self
            .extras
            .get_or_insert_with(Box::default)
            .timer
            .get_or_insert_with(|| Box::pin(crate::timers::sleep_until(at)));
        let at = tokio::time::Instant::from_std(at);
        if timer.deadline() != at {
            timer.as_mut().reset(at);
        }
        timer.as_mut().poll(cx).is_ready().then_some(err)
    }

    pub(super) fn scan_client(
        &mut self,
        mut server: Option<&mut crate::prepared::ServerStatements>,
    ) -> Result<(), PgError> {
        self.held_back = false;
        if self.exchange.has(TERMINATED) {
            return Ok(());
        }
        let tracking = self.prepared_cap != 0;
        let pooled = self.mode != PoolMode::Session;
        loop {
            let wants = |t| {
                if pooled {
                    super::state::wants(t, tracking)
                } else {
                    0
                }
            };
            let frame = match self
                .cframe
                .next_peek(&self.inbuf, self.max_packet as usize, wants)
            {
                Ok(Some(f)) => f,
                Ok(None) => return Ok(()),
                Err(FrameError::TooLarge(_)) => {
                    return Err(PgError::fatal("08P01", "packet too large"))
                }
                Err(FrameError::BadLength) => {
                    return Err(PgError::fatal("08P01", "bad packet header"))
                }
            };
            if self.route() >= super::route::READ_ON_PRIMARY && self.hold_for_primary(&frame) {
                self.cframe.truncate(frame.start);
                self.held_back = true;
                return Ok(());
            }
            if pooled {
                let flags = match frame.tag {
                    b'Q' | b'P' | b'B' => self.note_effects(&frame),
                    _ => 0,
                };
                self.note_plain(&frame, flags);
            }
            if tracking {
                match self.track_client(&frame, server.as_deref_mut()) {
                    Tracking::Go => {}
                    Tracking::Held => return Ok(()),
                    Tracking::Dropped => continue,
                }
                if let Some(p) = super::prepare::statements(&mut self.extras) {
                    if p.opaque {
                        p.opaque = false;
                        self.exchange.set(PLAIN, false);
                    }
                    if p.effects.flags != 0 {
                        let e = std::mem::take(&mut p.effects);
                        self.add_effects(e);
                    }
                }
            }
            // A Query after extended-protocol messages with no Sync is of their request,
            // which may have opened a block: no read-back goes behind it.
            let after_extended = self.exchange.has(UNSYNCED);
            let x = &mut self.exchange;
            match frame.tag {
                b'X' => {
                    // Terminate ends the client, not the server: it is never forwarded.
                    self.inbuf.truncate(frame.start);
                    self.cframe.truncate(frame.start);
                    x.set(TERMINATED, true);
                    return Ok(());
                }
                b'Q' | b'F' | b'S' => {
                    if x.pending == 0 {
                        let now = Instant::now();
                        self.query_started = Some(now);
                        if x.status == b'I' && self.xact_started.is_none() {
                            self.xact_started = Some(now);
                        }
                    }
                    x.pending += 1;
                    x.set(UNSYNCED, false);
                    x.set(ANSWERED, false);
                }
                // COPY data and Flush do not change what the server owes the client.
                b'd' | b'c' | b'f' | b'H' => {}
                _ => {
                    x.set(UNSYNCED, true);
                    x.set(ANSWERED, false);
                }
            }
            if tracking && server.is_some() {
                self.emit_synths();
            }
            // Only on a server: a request framed while queueing may yet be refused there
            // (fail_request), and what was written behind it would be taken for the
            // client's next.
            if frame.tag == b'Q'
                && !after_extended
                && pooled
                && server.is_some()
                && self.read_back_on_the_way(&frame)
            {
                // Nothing more is framed until the read-back's answer is in.
                return Ok(());
            }
        }
    }

    pub(super) fn scan_server(&mut self, server: &mut ServerConn) -> Result<(), Event> {
        let tracking = super::prepare::statements(&mut self.extras).is_some();
        // A client that never named a statement can still drop those of others the
        // server holds (`select 1; deallocate all`): their CommandComplete is looked at.
        let watch_drops = !tracking && server.statements.len() > 0;
        loop {
            if self.owed() {
                match self.swallow_internal(server) {
                    Ok(true) => continue,
                    Ok(false) => return Ok(()),
                    Err(ev) => return Err(ev),
                }
            }
            if self.exchange.has(CARRYING) && self.exchange.pending == 0 {
                // The rest is the answer to the request behind this client's.
                return Ok(());
            }
            let frame = match self.sframe.next(&self.outbuf, MAX_MESSAGE, |t| {
                // Errors whole: one that answers nothing is held back (below).
                // Descriptions whole too, for prepared::check to keep.
                // And CommandCompletes, for a DEALLOCATE ALL or DISCARD ALL that
                // prepared::answers did not see coming.
                t == b'Z'
                    || t == b'S'
                    || t == b'E'
                    || (tracking && (t == b'T' || t == b't' || t == b'C'))
                    || (watch_drops && t == b'C')
            }) {
                Ok(Some(f)) => f,
                Ok(None) => {
                    if tracking {
                        self.emit_synths();
                    }
                    return Ok(());
                }
                Err(_) => return Err(Event::ServerGone),
            };
            if tracking {
                match self.track_server(&frame, &mut server.statements) {
                    Tracked::Pass => {}
                    Tracked::Removed => continue,
                    Tracked::Wait => return Ok(()),
                }
            }
            if watch_drops && frame.tag == b'C' {
                let body = frame.body.clone().and_then(|b| self.outbuf.get(b));
                if body.is_some_and(crate::prepared::answers::drops_all) {
                    server.statements = Default::default();
                }
            }
            if frame.tag == b'E' && self.stray_cancel(&frame) {
                continue;
            }
            if frame.tag == b'E' {
                let fields = self.outbuf.get(frame.start + 5..self.sframe.scanned());
                crate::stats::server_error(fields.unwrap_or_default(), &self.pool.database);
                if self.exchange.pending == 0
                    && !self.exchange.has(UNSYNCED)
                    && self.mode != PoolMode::Session
                    && !self.pinned()
                {
                    // The client owes nothing: this is the server going away (a FATAL
                    // such as 57P01 at shutdown). It is not passed on now, as drivers
                    // take an answer to nothing for a broken connection; the client is
                    // told at its next request (see `survive_lost_server`).
                    self.remove_server_message(&frame);
                    continue;
                }
            }
            let Some(body) = frame.body.clone() else {
                continue;
            };
            match frame.tag {
                b'Z' if self.run_again(&frame) => {}
                b'Z' => {
                    let status = self.outbuf.get(body.start).copied().unwrap_or(b'I');
                    self.ready(status)?;
                    if self.exchange.has(TRAILING) && self.exchange.pending == 0 {
                        // What follows is the read-back written behind the request.
                        self.exchange.set(TRAILING, false);
                        self.set_tie(super::OWED, true);
                    }
                }
                b'S' => {
                    server.synced_to = None;
                    if let Some(name) = server.params.apply_status(&self.outbuf[body]) {
                        if let Some(value) = server.params.get(name) {
                            if self.wanted.get(name) != Some(value) {
                                Arc::make_mut(&mut self.wanted).set(name, value);
                            }
                        }
                        if self.exchange.has(CARRYING) {
                            // A passenger's state was taken to be the server's when it
                            // boarded (pool::ahead), and runs after this: the value is
                            // not known, so the next to board sets it whatever it wants.
                            server.params.forget(name);
                        }
                    }
                }
                _ => {}
            }
        }
    }
    /// A ReadyForQuery reached the client (from the server, or made by Weir for a query it
    /// answered itself): the query is over, and the transaction if `status` is idle.
    pub(super) fn ready(&mut self, status: u8) -> Result<(), Event> {
        let x = &mut self.exchange;
        x.status = status;
        x.pending = x.pending.saturating_sub(1);
        self.delta.queries += 1;
        if x.pending == 0 {
            x.set(ANSWERED, true);
            let now = Instant::now();
            self.idle_since = now;
            if let Some(t) = self.query_started.take() {
                let us = now.saturating_duration_since(t).as_micros() as u64;
                self.delta.query_time_us += us;
                self.pool.stats.query_latency.observe(us);
                if x.has(PLAIN) {
                    self.note_run_time(us);
                }
            }
            let x = &mut self.exchange;
            if x.status == b'I' {
                if let Some(t) = self.xact_started.take() {
                    let us = now.saturating_duration_since(t).as_micros() as u64;
                    self.delta.xact_time_us += us;
                    self.delta.xacts += 1;
                    self.pool.stats.xact_latency.observe(us);
                }
                self.pool.stats.add_traffic(&self.delta);
                self.delta = crate::stats::Traffic::default();
                super::prepare::flush_counts(&mut self.extras, &self.pool);
            }
            if self.mode == PoolMode::Statement && x.status != b'I' {
                return Err(Event::TransactionInStatementMode);
            }
        }
        Ok(())
    }
}
