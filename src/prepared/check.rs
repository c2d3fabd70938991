//! Statements whose result description the client knows (it described them): prepared
//! afresh on a server that lacks them, PostgreSQL plans them against today's schema and
//! raises nothing, where on a direct connection it refuses the client's old statement
//! ("cached plan must not change result type", 0A000) once DDL changed what it returns.
//! Drivers bind without describing again and decode with the description they were
//! given, so rows of the new type would be misread without any error. Weir remembers
//! what the client was told (a hash of its ParameterDescription and RowDescription/NoData
//! and the parameter types) and, before the client's Bind of such a statement reaches a
//! server that must prepare it, prepares it there with the client's parameter types,
//! describes it and waits for the answer (one round trip, only when the statement is
//! first used on a server): the Bind goes on if the description is the client's, and
//! fails with PostgreSQL's error otherwise, so the request never runs.

use std::hash::{Hash, Hasher};
use std::sync::Arc;

use bytes::{BufMut, BytesMut};

use super::defs::Def;
use super::messages::{put_close, put_named_parse, put_target};
use super::refusals::{refuse, refuse_here};
use super::replies::{ClientStatements, Reply};
use super::rewrite::{evict, Context, Edit};
use super::server::ServerStatements;
use crate::protocol::messages::put_message;
use crate::protocol::PgError;

/// What a client was told of a statement.
#[derive(Clone, Debug, PartialEq, Eq)]
pub struct Described {
    /// Of the parameter types and the result columns' names, types and modifiers.
    pub hash: u64,
    /// The ParameterDescription's body (count and types, as a Parse carries them).
    pub params: Box<[u8]>,
}

/// A description as it arrives: the ParameterDescription, then the RowDescription or
/// NoData.
#[derive(Default)]
pub struct Describing {
    params: Option<Box<[u8]>>,
}

impl Describing {
    pub fn parameters(&mut self, body: &[u8]) {
        self.params = Some(body.into());
    }

    /// `rows`: the RowDescription's body, or None for NoData.
    pub fn finish(&mut self, rows: Option<&[u8]>) -> Described {
        let params = self
            .params
            .take()
            .unwrap_or_else(|| Box::from(&[0u8, 0][..]));
        let mut h = std::collections::hash_map::DefaultHasher::new();
        params.hash(&mut h);
        match rows {
            None => 0u8.hash(&mut h),
            Some(body) => hash_rows(body, &mut h),
        }
        Described {
            hash: h.finish(),
            params,
        }
    }
}

/// What PostgreSQL compares of a result (names, types, modifiers), not where the
/// columns come from: a table made anew gives the same statement another table OID.
fn hash_rows(body: &[u8], h: &mut impl Hasher) {
    let fields = || -> Option<Vec<(&[u8], &[u8])>> {
        let n = u16::from_be_bytes([*body.first()?, *body.get(1)?]) as usize;
        let mut at = 2;
        let mut out = Vec::with_capacity(n);
        for _ in 0..n {
            let name_end = at + body.get(at..)?.iter().position(|&c| c == 0)?;
            let name = &body[at..name_end];
            let f = body.get(name_end + 1..name_end + 19)?;
            // table OID (4), attnum (2), type OID (4), length (2), modifier (4), format (2)
            out.push((name, f.get(6..16)?));
            at = name_end + 19;
        }
        Some(out)
    };
    match fields() {
        Some(fields) => {
            1u8.hash(h);
            fields.hash(h);
        }
        None => body.hash(h),
    }
}

/// PostgreSQL's error for a statement whose result changed since the client prepared it.
pub fn changed() -> PgError {
    let mut e = PgError::error("0A000", "cached plan must not change result type");
    e.routine = Some("RevalidateCachedQuery");
    e
}

/// For a Bind or Describe of a statement the client described, on a server: None when it
/// goes on as usual (the server holds the statement with the client's description, or
/// this is no case to check), else the Edit that checks first or fails.
pub fn before_use(
    p: &mut ClientStatements,
    server: &mut ServerStatements,
    def: &Arc<Def>,
    name: &[u8],
    cx: &Context,
    out: &mut BytesMut,
) -> Option<Edit> {
    if def.sql {
        return None;
    }
    let told = p.told(def.id, Some(name))?;
    if cx.status == b'E' || p.skipping {
        // PostgreSQL refuses whatever comes now: the usual way gets its error.
        return None;
    }
    if p.checks > 0 {
        return Some(Edit::Hold);
    }
    let hash = told.hash;
    let fresh = p.checked.take() == Some(def.id);
    if server.touch(def.id) {
        match server.described(def.id) {
            Some(h) if h == hash => return None,
            Some(_) if fresh => return Some(refuse_changed(p, out, cx)),
            // The server's plan may be older than the client's (PostgreSQL refuses it
            // itself then, see `retry`) or newer: it is prepared again and looked at.
            _ => {
                server.remove(def.id);
                put_target(out, b'C', def.id);
                p.push(Reply::Evicted(def.clone()));
            }
        }
    }
    evict(p, server, cx.cap, out);
    p.counts.server_parses += 1;
    // Copied only here, off the path of a statement the server holds as the client knows it.
    let params = p.told(def.id, Some(name)).map(|t| t.params.clone());
    put_parse_described(out, def, params.as_deref().unwrap_or_default());
    server.insert(def);
    p.push(Reply::Prepared(def.clone()));
    put_message(out, b'H', |_| {});
    p.push(Reply::Check(def.clone()));
    Some(Edit::Before)
}

/// Weir's Parse of `def` with the parameter types the client was told (`params`, as a
/// ParameterDescription carries them), and a Describe of it.
fn put_parse_described(out: &mut BytesMut, def: &Def, params: &[u8]) {
    put_message(out, b'P', |b| {
        def.put_server_name(b);
        let text_end = def.body.iter().position(|&c| c == 0).unwrap_or(0);
        b.put_slice(&def.body[..=text_end]);
        b.put_slice(params);
    });
    put_target(out, b'D', def.id);
}

/// A statement to settle before a request framed while queueing (see
/// `client::prepare::settle_described`, which writes `batch` to the server and reads its
/// answers): it is prepared and described in a batch of Weir's own.
pub struct Settle {
    def: Arc<Def>,
    pub batch: BytesMut,
}

/// The request framed while queueing uses a statement the client described.
pub fn described_ahead(p: &ClientStatements) -> bool {
    uses_ahead(p).any(|(_, told)| told.is_some())
}

/// The statements the request framed while queueing needs on the server it goes ahead
/// to, with what the client was told of each use (pool::ahead compares).
pub fn ahead_needs(p: &ClientStatements) -> Vec<(u64, Option<u64>)> {
    let mut needs: Vec<_> = p.ahead.iter().map(|d| (d.id, None)).collect();
    needs.extend(uses_ahead(p).filter_map(|(id, t)| Some((id, Some(t?.hash)))));
    needs
}

/// Each Bind and Describe of a statement in the request framed while queueing: its
/// statement, and what the client was told of it by the name it used.
fn uses_ahead(p: &ClientStatements) -> impl Iterator<Item = (u64, Option<&Described>)> {
    p.replies.iter().filter_map(|r| match r {
        Reply::SentAs(b'B' | b'D', id, name) => Some((*id, p.told(*id, name.as_deref()))),
        _ => None,
    })
}

/// For a request framed while queueing, which is rewritten already and has not gone
/// ahead: each statement it uses by a name the client described that the server lacks
/// (or holds with a description other than one the client was told; Weir's Close of it
/// comes first).
pub fn to_settle(p: &ClientStatements, server: &mut ServerStatements) -> Vec<Settle> {
    let mut todo: Vec<Settle> = Vec::new();
    let mut seen = std::collections::HashSet::new();
    for (id, told) in uses_ahead(p) {
        let Some(told) = told else {
            continue;
        };
        if !seen.insert(id) {
            continue;
        }
        let Some(def) = p.ahead.iter().find(|d| d.id == id && !d.sql) else {
            continue;
        };
        let held = server.touch(id);
        let all_told = uses_ahead(p)
            .filter(|u| u.0 == id)
            .all(|(_, t)| t.is_none_or(|t| server.described(id) == Some(t.hash)));
        if held && all_told {
            continue;
        }
        let mut batch = BytesMut::new();
        if held {
            put_target(&mut batch, b'C', id);
            server.remove(id);
        }
        put_parse_described(&mut batch, def, &told.params);
        put_message(&mut batch, b'S', |_| {});
        todo.push(Settle {
            def: def.clone(),
            batch,
        });
    }
    todo
}

/// The server prepared a statement of `to_settle` and described it (`hash`). A
/// statement PostgreSQL refused to prepare is left to the usual Parse at the start of
/// the first batch that uses it (`rewrite::settle_ahead`), whose error the client gets.
pub fn settled(p: &mut ClientStatements, server: &mut ServerStatements, s: &Settle, hash: u64) {
    p.counts.server_parses += 1;
    server.insert(&s.def);
    server.set_described(s.def.id, hash);
}

/// After `to_settle`: where, in the request framed while queueing (`request`, its bytes
/// as rewritten), PostgreSQL must refuse a use of a statement whose result is not the
/// one the client was told, as it refuses the client's stale statement on a direct
/// connection. PostgreSQL skips to the Sync after an error, so the first such use of
/// each batch gets the error raised in front of it (`put_raise`), and everything before
/// it in the batch runs as it would have. Each raise's entry goes in front of the
/// use's in the replies. Returns the offsets to put a raise at (in increasing order),
/// or Err when the request's messages and the replies do not agree (a client naming a
/// statement as Weir names it on the server): the request must not run then.
pub fn raise_ahead(
    p: &mut ClientStatements,
    server: &ServerStatements,
    request: &[u8],
) -> Result<Vec<usize>, ()> {
    let mut raises: Vec<(usize, usize)> = Vec::new();
    let mut raised_in = None;
    for u in super::queued::uses(p, request)? {
        let told = p.told(u.id, u.name.as_deref());
        let stale = told.is_some_and(|t| server.described(u.id).is_some_and(|h| h != t.hash));
        if stale && raised_in != Some(u.batch_at) {
            raises.push((u.at, u.reply));
            raised_in = Some(u.batch_at);
        }
    }
    for &(_, reply) in raises.iter().rev() {
        p.insert_raise(reply);
    }
    if !raises.is_empty() {
        // No other client's request goes behind a batch that ends in an error.
        p.opaque = true;
    }
    Ok(raises.into_iter().map(|(at, _)| at).collect())
}

/// The bytes of one `put_raise`.
pub fn raise_bytes() -> BytesMut {
    let mut out = BytesMut::new();
    put_raise(&mut out, RAISE_CHANGED);
    out
}

/// The client's Bind or Describe of a statement whose result changed: Weir's own 0A000
/// where nothing is to roll back, else PostgreSQL's (`put_raise`).
fn refuse_changed(p: &mut ClientStatements, out: &mut BytesMut, cx: &Context) -> Edit {
    if refuse_here(p, cx, false) {
        return refuse(p, changed(), false);
    }
    raise(p, out, RAISE_CHANGED, changed)
}

/// PostgreSQL raising `error` by the DO block `statement` (see `put_raise`).
pub(super) fn raise(
    p: &mut ClientStatements,
    out: &mut BytesMut,
    statement: &[u8],
    error: fn() -> PgError,
) -> Edit {
    put_raise(out, statement);
    p.push(Reply::Raise(error));
    // No other client's request goes behind a batch that ends in an error (as `refuse`).
    p.opaque = true;
    Edit::Replace
}

/// PostgreSQL raising the 0A000 it gives a direct connection for a statement whose result
/// changed, for an error that must fail the server's transaction (a block open, or an
/// Execute of the batch before it) as the client's would. PostgreSQL logs every error it
/// raises: raised by a DO block, its log line is the one of a direct connection
/// (`cached plan must not change result type`, 0A000), where a message made to fail
/// would log an error of Weir's making. The DO block is a statement of Weir's own name
/// (closed first, as it may be there from an earlier raise): the client's unnamed
/// statement outlives the batch on a direct connection, and a later batch may bind it.
/// The unnamed portal is taken, which the failed transaction drops anyway.
fn put_raise(out: &mut BytesMut, statement: &[u8]) {
    put_close(out, RAISE_NAME);
    put_named_parse(out, RAISE_NAME, statement);
    put_message(out, b'B', |b| {
        b.put_u8(0);
        b.put_slice(RAISE_NAME);
        b.put_slice(&[0, 0, 0, 0, 0, 0, 0]);
    });
    put_message(out, b'E', |b| b.put_slice(&[0, 0, 0, 0, 0]));
}

/// `put_raise`'s statement: a name no client statement is sent under (Weir's are
/// `weir_<id>`), and its text (no parameter types).
const RAISE_NAME: &[u8] = b"weir_raise";
const RAISE_CHANGED: &[u8] = b"DO $weir$BEGIN RAISE EXCEPTION USING ERRCODE = '0A000', \
MESSAGE = 'cached plan must not change result type'; END$weir$\0\0\0";

#[cfg(test)]
mod tests {
    use super::*;

    fn row(name: &str, table: u32, ty: u32) -> Vec<u8> {
        let mut b = vec![0, 1];
        b.extend_from_slice(name.as_bytes());
        b.push(0);
        b.extend_from_slice(&table.to_be_bytes());
        b.extend_from_slice(&2u16.to_be_bytes());
        b.extend_from_slice(&ty.to_be_bytes());
        b.extend_from_slice(&4u16.to_be_bytes());
        b.extend_from_slice(&(-1i32).to_be_bytes());
        b.extend_from_slice(&0u16.to_be_bytes());
        b
    }

    #[test]
    fn the_hash_is_of_types_not_tables() {
        let mut d = Describing::default();
        let int4 = d.finish(Some(&row("v", 1, 23)));
        assert_eq!(int4, d.finish(Some(&row("v", 2, 23))));
        assert_ne!(int4, d.finish(Some(&row("v", 1, 25))));
        assert_ne!(int4, d.finish(Some(&row("w", 1, 23))));
        assert_ne!(int4.hash, d.finish(None).hash);
        d.parameters(&[0, 1, 0, 0, 0, 23]);
        let with_param = d.finish(Some(&row("v", 1, 23)));
        assert_ne!(int4.hash, with_param.hash);
        assert_eq!(&with_param.params[..], &[0, 1, 0, 0, 0, 23]);
    }
}
