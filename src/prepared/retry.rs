//! Re-preparing a statement after DDL changed what it returns (issue 11).
//!
//! PostgreSQL refuses a statement's old plan at Bind once its result type changed ("cached
//! plan must not change result type"). Where that refusal is the first thing the client
//! would hear of a batch that began with the server idle, the batch is an implicit
//! transaction the error rolled back whole, and nothing of it reached the client: Weir
//! swallows the error and its ReadyForQuery, prepares the statement afresh under a new
//! name, and sends the batch again, once. Anywhere else (an explicit transaction block,
//! replies already passed on, a batch that was not kept) the error goes through.
//!
//! To send the batch again Weir needs the client's bytes of it, which are gone once
//! written to the server. They are kept only when that is cheap: the batch is what libpq
//! (pgbench -M prepared, psycopg), pgx and others send to run a prepared statement, Bind,
//! Describe of its portal, Execute, Sync; it is already whole in the input buffer when the
//! Bind is framed (drivers write such a batch at once), and small. The copy goes to a
//! buffer the client reuses.

use std::sync::Arc;

use super::defs::{intern, Def};
use super::messages::{bind_parts, target_parts};
use super::replies::ClientStatements;
use crate::protocol::PgError;

/// The largest batch kept for a retry: pgbench's and most drivers' are under 200 bytes;
/// one with large parameters is not worth copying on every execution.
const MAX_KEPT: usize = 1024;

#[derive(Default)]
pub struct Retry {
    /// The client's bytes of its last batch, from its Bind to its Sync, when it was kept;
    /// empty otherwise.
    batch: Vec<u8>,
    state: State,
    /// The server sent a notice since its last ReadyForQuery: a batch that raised one
    /// before its error is not run twice (the client would get the notice twice).
    noticed: bool,
}

#[derive(Default, Clone, Copy, PartialEq, Eq)]
enum State {
    #[default]
    Idle,
    /// The batch went again: the ReadyForQuery of the failed one is swallowed.
    Swallow,
    /// The ReadyForQuery of the batch sent again is still to come: a second refusal goes
    /// to the client.
    Sent,
}

impl Retry {
    /// Sees the first message of each batch the client sends (`from`: the buffer from
    /// its header on): keeps the batch when it may be retried, forgets the last one
    /// otherwise. `maybe_idle`: the server is idle, or its status at this batch's start
    /// is not known yet.
    pub fn batch_starts(&mut self, tag: u8, from: &[u8], maybe_idle: bool) {
        self.batch.clear();
        if tag != b'B' || !maybe_idle {
            return;
        }
        if let Some(n) = execute_batch(from) {
            self.batch.extend_from_slice(&from[..n]);
        }
    }

    /// Sees every server message: a notice, and the end of a batch.
    pub fn server_says(&mut self, tag: u8) {
        match tag {
            b'N' => self.noticed = true,
            b'Z' => self.noticed = false,
            _ => {}
        }
    }

    /// A ReadyForQuery ends a batch: true when it is the one of the failed batch that was
    /// sent again (the client gets the one of the retry instead).
    pub fn swallow_ready(&mut self) -> bool {
        let swallow = self.state == State::Swallow;
        self.state = match self.state {
            State::Swallow => State::Sent,
            State::Sent | State::Idle => State::Idle,
        };
        swallow
    }

    /// A batch runs again and its ReadyForQuery is still to come: the server is not
    /// done (even while the copy waits to be framed, with nothing owed yet).
    pub fn in_flight(&self) -> bool {
        self.state != State::Idle
    }

    /// The server's connection is gone or its replies were dropped.
    pub fn reset(&mut self) {
        self.state = State::Idle;
        self.noticed = false;
    }
}

/// The length of a batch of one Bind (of a named statement), a Describe of its portal, an Execute and a Sync
/// (Flushes aside), all of it in `buf` and at most `MAX_KEPT` bytes; None for any other.
/// Without the Describe the client would get rows of the new shape against the
/// description it has of the old one (tokio-postgres refuses them): its batch is not
/// run again, and the refusal reaches it as it would directly.
fn execute_batch(buf: &[u8]) -> Option<usize> {
    const ORDER: &[u8] = b"BDES";
    let (mut at, mut step) = (0, 0);
    let mut portal: &[u8] = b"";
    loop {
        let header = buf.get(at..at + 5)?;
        let len = u32::from_be_bytes([header[1], header[2], header[3], header[4]]) as usize;
        let end = at + 1 + len;
        if len < 4 || end > MAX_KEPT {
            return None;
        }
        let body = buf.get(at + 5..end)?;
        at = end;
        let tag = header[0];
        if tag == b'H' && step > 0 {
            continue;
        }
        if ORDER.get(step) != Some(&tag) {
            return None;
        }
        step += 1;
        match tag {
            b'B' => {
                let (named, stmt, _) = bind_parts(body)?;
                if stmt.is_empty() {
                    return None;
                }
                portal = named;
            }
            b'D' if target_parts(body) != Some((b'P', portal)) => return None,
            b'S' => return Some(at),
            _ => {}
        }
    }
}

/// True for PostgreSQL's refusal of a statement's plan after DDL changed its result.
/// (By the message, which only an English lc_messages gives: the SQLSTATE, 0A000, is
/// shared with other refusals.)
pub fn is_stale(body: &[u8]) -> bool {
    let e = PgError::parse(body);
    e.code == "0A000"
        && e.message
            .starts_with("cached plan must not change result type")
}

/// On PostgreSQL's refusal of statement `id` at the Bind that starts the client's kept
/// batch, once the replies the server skips are dropped: when the batch may run again,
/// points the client's names for the statement at a fresh one (the server will prepare
/// it under a new name) and returns the batch to send again. `safe`: the server was idle
/// when the batch began and nothing the client sent after it has gone to the server.
pub fn retry_batch(p: &mut ClientStatements, id: u64, safe: bool) -> Option<Vec<u8>> {
    let r = &mut p.retry;
    // Only the batch's Sync is still owed: nothing after it was sent.
    let last = p.replies.len() == 1 && p.replies.front().is_some_and(|r| r.is_sync());
    if !safe || !last || r.state != State::Idle || r.noticed || r.batch.is_empty() {
        return None;
    }
    let (_, stmt, _) = bind_parts(r.batch.get(5..)?)?;
    let stale = p.names.get(stmt).filter(|d| d.id == id && !d.sql)?.clone();
    // Retired already (`answers::retire_if_stale`): this is another statement, unless
    // the text was retired before and the stale one interned by none but this client.
    let fresh = intern(&stale.body);
    if fresh.id == id {
        return None;
    }
    repoint(p, &stale, &fresh);
    p.retry.state = State::Swallow;
    Some(std::mem::take(&mut p.retry.batch))
}

/// Every name the client has for `stale` now means `fresh`.
fn repoint(p: &mut ClientStatements, stale: &Def, fresh: &Arc<Def>) {
    for def in p.names.values_mut().filter(|d| d.id == stale.id) {
        *def = fresh.clone();
    }
    if p.aliased.remove(&stale.id) {
        p.aliased.insert(fresh.id);
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    fn msg(tag: u8, body: &[u8]) -> Vec<u8> {
        let mut m = bytes::BytesMut::new();
        crate::protocol::messages::put_message(&mut m, tag, |b| b.extend_from_slice(body));
        m.to_vec()
    }

    #[test]
    fn keeps_only_whole_small_execute_batches() {
        let bind = msg(b'B', b"\0s1\0\0\0\0\0\0\0");
        let describe = msg(b'D', b"P\0");
        let execute = msg(b'E', b"\0\0\0\0\0");
        let (sync, flush) = (msg(b'S', b""), msg(b'H', b""));
        let batch = [&bind[..], &describe, &flush, &execute, &sync].concat();
        let mut next = batch.clone();
        next.extend_from_slice(&bind);
        assert_eq!(execute_batch(&next), Some(batch.len()));
        assert_eq!(execute_batch(&batch[..batch.len() - 1]), None);
        let undescribed = [&bind[..], &execute, &sync].concat();
        assert_eq!(execute_batch(&undescribed), None);
        let other_portal = [&bind[..], &msg(b'D', b"Pp\0"), &execute, &sync].concat();
        assert_eq!(execute_batch(&other_portal), None);
        let two_binds = [&batch[..batch.len() - 5], &bind, &describe, &execute, &sync].concat();
        assert_eq!(execute_batch(&two_binds), None);
        let big = [&msg(b'B', &[0; MAX_KEPT])[..], &describe, &execute, &sync].concat();
        assert_eq!(execute_batch(&big), None);
        assert_eq!(execute_batch(&[b'B', 0, 0, 0, 1]), None);

        let mut r = Retry::default();
        r.batch_starts(b'B', &next, true);
        assert_eq!(r.batch, batch);
        r.batch_starts(b'B', &next, false);
        assert!(r.batch.is_empty(), "in a transaction block nothing is kept");
    }
}
