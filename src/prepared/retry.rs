//! Re-preparing a statement after DDL changed what it returns (issue 11).
//!
//! PostgreSQL refuses a statement's old plan at Bind (or Describe) once its result type
//! changed ("cached plan must not change result type"). Where that refusal is the first
//! thing the client would hear of a batch that began with the server idle, the batch is
//! an implicit transaction the error rolled back whole, and nothing of it reached the
//! client: Weir swallows the error and its ReadyForQuery, points the client's name at a
//! fresh statement (prepared under a new name), and sends the batch again, once.
//! Anywhere else (an explicit transaction block, replies already passed on, more sent
//! behind the batch, a batch that was not kept) the error goes through; a statement the
//! client prepared in that very batch is then a fresh one from the next batch on, as it
//! would be on a direct connection.
//!
//! To send the batch again Weir needs the client's bytes of it, which are gone once
//! written to the server. They are kept only when that is cheap: the batch is already
//! whole in the input buffer when its first message is framed (drivers write a batch at
//! once), it is small, and of one of two kinds (see `kept_batch`): libpq's to run a
//! statement (pgbench -M prepared, psycopg, pgx), and the Parse and Describe drivers send
//! to prepare one (tokio-postgres, pgx). The copy goes to a buffer the client reuses.

use std::sync::Arc;

use bytes::BytesMut;

use super::defs::{intern, Def};
use super::messages::{bind_parts, parse_parts, target_parts};
use super::replies::{ClientStatements, Reply};
use crate::protocol::messages::put_message;
use crate::protocol::PgError;

/// The largest batch kept for a retry: pgbench's and most drivers' are under 200 bytes;
/// one with large parameters is not worth copying on every execution.
const MAX_KEPT: usize = 1024;

/// The largest ParameterDescription, and error after it, the relay holds back to see
/// whether a Describe goes again (`drops_description`): the relay reads no more from a
/// server while a quarter megabyte waits in its buffer.
pub const MAX_HELD: usize = 16 * 1024;

#[derive(Default)]
pub struct Retry {
    /// The client's bytes of its last batch, from the message the refusal may come at to
    /// the Sync, when it was kept; empty otherwise.
    batch: Vec<u8>,
    state: State,
    /// The server sent a notice since its last ReadyForQuery: a batch that raised one
    /// before its error is not run twice (the client would get the notice twice).
    noticed: bool,
    /// A reply to the part kept reached the client: it may not go again.
    shown: bool,
    /// While a batch runs again: how to make as if it never had, should it fail.
    again: Option<Box<Again>>,
}

/// A batch that runs again. Should the message sent again fail, the client gets the
/// refusal in place of its error, and its name is put back: as if there had been no
/// retry, which a client reacting to the refusal relies on (pgx drops its statement).
/// The retry may fail in ways the client has no remedy for, e.g. per-column result
/// formats that no longer fit the new columns.
struct Again {
    /// The message sent again, and the statement it names now.
    tag: u8,
    fresh: u64,
    /// PostgreSQL's refusal: an ErrorResponse body.
    refusal: Vec<u8>,
    /// The client's name that went from the stale statement to the fresh one.
    name: Box<[u8]>,
    stale: Arc<Def>,
}

#[derive(Default, Clone, Copy, PartialEq, Eq)]
enum State {
    #[default]
    Idle,
    /// The batch went again: the ReadyForQuery of the failed one is swallowed.
    Swallow,
    /// The ReadyForQuery of the batch sent again is still to come: it does not go again,
    /// and an error of the message sent again gives the client the refusal (`Again`).
    Sent,
}

impl Retry {
    /// Sees the first message of each batch the client sends (`from`: the buffer from
    /// its header on): keeps the batch when it may be retried, forgets the last one
    /// otherwise. `maybe_idle`: the server is idle, or its status at this batch's start
    /// is not known yet.
    pub fn batch_starts(&mut self, tag: u8, from: &[u8], maybe_idle: bool) {
        self.batch.clear();
        self.shown = false;
        // A statement prepared in the batch is made fresh even where its Describe may not
        // go again (see `retry_batch`): that batch is kept in a transaction block too.
        if !(tag == b'P' || (tag == b'B' && maybe_idle)) {
            return;
        }
        if let Some((start, end)) = kept_batch(from) {
            self.batch.extend_from_slice(&from[start..end]);
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
            State::Sent | State::Idle => {
                self.again = None;
                State::Idle
            }
        };
        swallow
    }

    /// In place of the server's error at `front`, the refusal the client would have got
    /// without the retry, when `front` is the message sent again (see `Again`; the
    /// caller puts the client's name back with `put_back`).
    pub fn failed_again(&self, front: &Reply) -> Option<BytesMut> {
        let (&Reply::SentAs(tag, id, _), Some(a)) = (front, &self.again) else {
            return None;
        };
        if self.state != State::Sent || (tag, id) != (a.tag, a.fresh) {
            return None;
        }
        let mut out = BytesMut::new();
        put_message(&mut out, b'E', |b| b.extend_from_slice(&a.refusal));
        Some(out)
    }

    /// A batch runs again and its ReadyForQuery is still to come: the server is not
    /// done (even while the copy waits to be framed, with nothing owed yet).
    pub fn in_flight(&self) -> bool {
        self.state != State::Idle
    }

    /// The part kept is a Describe of a statement: its ParameterDescription waits for
    /// the message after it (`drops_description`).
    pub fn describing(&self) -> bool {
        self.state == State::Idle && !self.shown && self.batch.first() == Some(&b'D')
    }

    /// A reply to the part kept reached the client.
    pub fn shown(&mut self) {
        self.shown = true;
    }

    /// Frees the copy's buffer, for a client that waits idle (everything it sent was
    /// answered): it holds nothing for the batches it may never send.
    pub fn release(&mut self) {
        self.batch = Vec::new();
    }

    /// The server's connection is gone or its replies were dropped.
    pub fn reset(&mut self) {
        self.state = State::Idle;
        self.noticed = false;
        self.again = None;
    }
}

/// The part of a batch to keep for a retry, as (start, end) in `buf`, when all of the
/// batch is there and it is small; None for any other batch. Two kinds are kept:
/// - running a statement: Bind (of a named statement), Describe of its portal, Execute,
///   Sync. Without the Describe the client would get rows of the new shape against the
///   description it has of the old one (tokio-postgres refuses them): such a batch is not
///   run again, and the refusal reaches the client as it would directly.
/// - preparing one: Parses (named), then Describe of the last one and Sync (what
///   tokio-postgres and pgx send). A Parse Weir answered itself, the server holding the
///   text already, gets the refusal at the Describe, where PostgreSQL would have made a
///   fresh statement: the Describe and Sync go again, the ParseCompletes the client got
///   stand.
///
/// Flushes may come anywhere after the first message.
fn kept_batch(buf: &[u8]) -> Option<(usize, usize)> {
    let mut at = 0;
    // Where the part to send again starts, and the tags still due in it.
    let mut from = None;
    let mut due: &[u8] = b"";
    // The Bind's portal, or the last Parse's statement: what the Describe must name.
    let mut target: (u8, &[u8]) = (0, b"");
    loop {
        let header = buf.get(at..at + 5)?;
        let len = u32::from_be_bytes([header[1], header[2], header[3], header[4]]) as usize;
        let end = at + 1 + len;
        if len < 4 {
            return None;
        }
        let body = buf.get(at + 5..end)?;
        let tag = header[0];
        match (from, tag) {
            (_, b'H') if at > 0 => {}
            (None, b'P') => target = (b'S', parse_parts(body).filter(|p| !p.0.is_empty())?.0),
            (None, b'B') if at == 0 => {
                let (portal, stmt, _) = bind_parts(body)?;
                if stmt.is_empty() {
                    return None;
                }
                (from, due, target) = (Some(at), b"DES", (b'P', portal));
            }
            (None, b'D') if at > 0 && target_parts(body) == Some(target) => {
                (from, due) = (Some(at), b"S");
            }
            (Some(start), t) if due.first() == Some(&t) => {
                due = &due[1..];
                if t == b'D' && target_parts(body) != Some(target) {
                    return None;
                }
                if t == b'S' {
                    return (end - start <= MAX_KEPT).then_some((start, end));
                }
            }
            _ => return None,
        }
        at = end;
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

/// The client's name and statement that PostgreSQL refused at the Bind or Describe
/// (`tag`, `id` the statement) that starts the part of the batch kept.
fn kept_target(p: &ClientStatements, tag: u8, id: u64) -> Option<(Box<[u8]>, Arc<Def>)> {
    let body = p.retry.batch.get(5..).filter(|_| p.retry.batch[0] == tag)?;
    let name = match tag {
        b'B' => bind_parts(body)?.1,
        _ => target_parts(body).filter(|t| t.0 == b'S')?.1,
    };
    let def = p.names.get(name).filter(|d| d.id == id && !d.sql)?;
    Some((name.into(), def.clone()))
}

/// True when the part kept may go again. `owed`: how many replies are owed up to the
/// batch's Sync at this point (only the Sync, once the server's skip to it was matched):
/// nothing the client sent after the batch went to the server. `safe`: besides, the
/// server was idle when the batch began and the relay has framed nothing after it.
fn may_go_again(p: &ClientStatements, safe: bool, owed: usize) -> bool {
    let r = &p.retry;
    let last = p.replies.len() == owed && p.replies.back().is_some_and(|r| r.is_sync());
    safe && last && r.state == State::Idle && !r.noticed && !r.shown
}

/// On PostgreSQL's refusal (a stale plan, `refusal` the error's body) of statement `id`
/// at the Bind or Describe (`tag`) that starts the part of the batch kept, once the
/// replies the server skips are dropped: when it may go again, points the client's name
/// at a fresh statement (the server will prepare it under a new name) and returns the
/// bytes to send again.
pub fn retry_batch(
    p: &mut ClientStatements,
    tag: u8,
    id: u64,
    refusal: &[u8],
    safe: bool,
) -> Option<Vec<u8>> {
    let (name, stale) = kept_target(p, tag, id)?;
    // Retired already (`answers::retire_if_stale`): this is another statement.
    let fresh = intern(&stale.body);
    if !may_go_again(p, safe, 1) {
        if tag == b'D' && p.retry.state == State::Idle {
            // Prepared in this very batch, after the DDL: on a direct connection the
            // statement would be fresh. The client has the refusal (in a transaction
            // block, or after the description reached it), and a fresh statement by
            // its name from now on.
            repoint(p, &name, &fresh);
        }
        return None;
    }
    repoint(p, &name, &fresh);
    let r = &mut p.retry;
    r.state = State::Swallow;
    r.again = Some(Box::new(Again {
        tag,
        fresh: fresh.id,
        refusal: refusal.to_vec(),
        stale,
        name,
    }));
    Some(std::mem::take(&mut r.batch))
}

/// PostgreSQL describes a statement's parameters before it revalidates its plan: at a
/// ParameterDescription answering the Describe kept for a retry, followed by `next`, an
/// error, true when that error is a refusal that makes the Describe go again. The client
/// is then to get the fresh statement's description (its parameter types may differ),
/// not this one.
pub fn drops_description(p: &ClientStatements, next: &[u8], safe: bool) -> bool {
    let Some(&Reply::SentAs(b'D', id, _)) = p.replies.front() else {
        return false;
    };
    is_stale(next) && may_go_again(p, safe, 2) && kept_target(p, b'D', id).is_some()
}

/// The batch sent again failed (`Retry::failed_again`): the client's name is the stale
/// statement's again.
pub fn put_back(p: &mut ClientStatements) {
    let Some(a) = p.retry.again.take() else {
        return;
    };
    repoint(p, &a.name, &a.stale);
}

/// The client's `name` now means `def`.
fn repoint(p: &mut ClientStatements, name: &[u8], def: &Arc<Def>) {
    if p.names.contains_key(name) {
        p.names.insert(name.into(), def.clone());
    }
    if p.names.count(def.id) > 1 {
        p.alias(def.id, name);
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
    fn keeps_whole_small_batches_that_run_or_prepare_a_statement() {
        let bind = msg(b'B', b"\0s1\0\0\0\0\0\0\0");
        let describe = msg(b'D', b"P\0");
        let execute = msg(b'E', b"\0\0\0\0\0");
        let (sync, flush) = (msg(b'S', b""), msg(b'H', b""));
        let batch = [&bind[..], &describe, &flush, &execute, &sync].concat();
        let mut next = batch.clone();
        next.extend_from_slice(&bind);
        assert_eq!(kept_batch(&next), Some((0, batch.len())));
        assert_eq!(kept_batch(&batch[..batch.len() - 1]), None);
        let undescribed = [&bind[..], &execute, &sync].concat();
        assert_eq!(kept_batch(&undescribed), None);
        let other_portal = [&bind[..], &msg(b'D', b"Pp\0"), &execute, &sync].concat();
        assert_eq!(kept_batch(&other_portal), None);
        let two_binds = [&batch[..batch.len() - 5], &bind, &describe, &execute, &sync].concat();
        assert_eq!(kept_batch(&two_binds), None);
        let big = [&msg(b'B', &[0; MAX_KEPT])[..], &describe, &execute, &sync].concat();
        assert_eq!(kept_batch(&big), None);
        assert_eq!(kept_batch(&[b'B', 0, 0, 0, 1]), None);

        // Parses, then a Describe of the last one: the Describe and Sync are kept.
        let parse = |name: &str| msg(b'P', format!("{name}\0select 1\0\0\0").as_bytes());
        let describe_s1 = msg(b'D', b"Ss1\0");
        let prepare = [&parse("s0")[..], &parse("s1"), &describe_s1, &sync].concat();
        let kept = prepare.len() - describe_s1.len() - sync.len();
        assert_eq!(kept_batch(&prepare), Some((kept, prepare.len())));
        let other = [&parse("s1")[..], &parse("s0"), &describe_s1, &sync].concat();
        assert_eq!(kept_batch(&other), None, "not the statement just prepared");
        let unnamed = [&msg(b'P', b"\0select 1\0\0\0")[..], &describe_s1, &sync].concat();
        assert_eq!(kept_batch(&unnamed), None);
        assert_eq!(kept_batch(&[&describe_s1[..], &sync].concat()), None);

        let mut r = Retry::default();
        r.batch_starts(b'B', &next, true);
        assert_eq!(r.batch, batch);
        r.batch_starts(b'P', &prepare, true);
        assert_eq!(r.batch, [&describe_s1[..], &sync].concat());
        r.batch_starts(b'B', &next, false);
        assert!(r.batch.is_empty(), "in a transaction block nothing is kept");
    }
}
