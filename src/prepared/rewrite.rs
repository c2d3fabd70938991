//! What becomes of each client message that names a statement, in pooled modes (the
//! server's answers are matched in `answers`). Pure functions of the client's and the
//! server's statement sets, so the relay only splices bytes.

use std::sync::atomic::Ordering;
use std::sync::Arc;

use bytes::BytesMut;

use super::defs::{intern, intern_sql, lookup, Def, SERVER_PREFIX};
use super::messages::*;
use super::queries::{query_kind, QueryKind};
use super::refusals::{missing, parse_taken, skip_to_sync, sql_prepare_taken};
use super::replies::{ClientStatements, Reply};
use super::server::ServerStatements;

pub enum Edit {
    /// Sent on as it is.
    Keep,
    /// It names a statement and there is no server to check it against yet: not framed
    /// until the client has one.
    Hold,
    /// Replaced by what was written to `out` (maybe nothing).
    Replace,
    /// Dropped, and owed nothing: PostgreSQL would have skipped it, after the error Weir
    /// answered in its place (`Reply::Refused`).
    Drop,
    /// What was written to `out` goes before it, and it waits (un-framed) for the answer
    /// (`check::before_use`).
    Before,
}

/// The bounds and state a rewrite needs besides the sets.
pub struct Context {
    /// The server's last transaction status: in a failed transaction, PostgreSQL refuses
    /// a Parse, so one the server already has is still sent (unnamed) to get that error.
    pub status: u8,
    /// max_prepared_statements.
    pub cap: usize,
    /// No server yet, but a Bind or Describe of a statement the client has may be
    /// rewritten as if the server held it (see `ClientStatements::ahead`).
    pub ahead: bool,
    /// Extended-protocol messages were sent since the last Sync.
    pub unsynced: bool,
    /// The whole message is framed (a query may be framed by a prefix, and any message
    /// before all of it has arrived): only a whole one can be dropped.
    pub whole: bool,
}

/// Decides what to send in place of one client message (P, B, D, C, E, S, Q or F, its
/// body whole except for Q, of which a prefix) and records the replies it will get.
pub fn client_message(
    tag: u8,
    body: &[u8],
    p: &mut ClientStatements,
    server: Option<&mut ServerStatements>,
    cx: &Context,
    out: &mut BytesMut,
) -> Edit {
    let named = match tag {
        b'P' => parse_parts(body).is_some_and(|(n, _)| !n.is_empty()),
        b'B' => bind_parts(body).is_some_and(|(_, s, _)| !s.is_empty()),
        b'D' | b'C' => target_parts(body).is_some_and(|(k, n)| k == b'S' && !n.is_empty()),
        b'Q' => query_kind(body).is_some(),
        _ => false,
    };
    if p.refusing {
        if tag != b'S' {
            return skip_to_sync(tag, p, cx);
        }
        p.refusing = false;
    }
    match tag {
        b'E' => p.ran = true,
        b'S' | b'Q' | b'F' => p.ran = false,
        _ => {}
    }
    if tag == b'P' && sql_statement_via_extended(body) {
        if super::refusals::refuse_here(p, cx, false) {
            return super::refusals::refuse(p, sql_via_extended(), false);
        }
        if server.is_none() {
            return Edit::Hold;
        }
        return super::check::raise(p, out, RAISE_SQL_VIA_EXTENDED, sql_via_extended);
    }
    let assumed = server.is_none() && cx.ahead && matches!(tag, b'B' | b'D');
    let by_status =
        p.status_pending() && (matches!(tag, b'P' | b'Q') || lacks_weirs_name(tag, body, p));
    if named && (p.must_wait() || by_status || (server.is_none() && !assumed)) {
        return Edit::Hold;
    }
    let keep = |p: &mut ClientStatements| {
        p.push(Reply::Sent(tag));
        Edit::Keep
    };
    match tag {
        b'P' => {
            let Some((name, rest)) = parse_parts(body).filter(|(n, _)| !n.is_empty()) else {
                return keep(p);
            };
            let Some(server) = server else {
                return Edit::Hold;
            };
            p.counts.client_parses += 1;
            if p.names.contains_key(name) {
                return parse_taken(p, server, name, rest, cx, out);
            }
            let def = intern(rest);
            // Also marks the statement aliased when the client gives it a second name.
            p.rename_described(def.id, name);
            let name: Box<[u8]> = name.into();
            p.names.insert(name.clone(), def.clone());
            if server.touch(def.id) {
                p.counts.hits += 1;
                if cx.status != b'E' {
                    p.push(Reply::Synth {
                        tag: b'1',
                        undo: Some((name, None)),
                    });
                } else {
                    put_unnamed_parse(out, &def.body);
                    p.push(Reply::Parsed {
                        name,
                        def,
                        unmark: false,
                    });
                }
                return Edit::Replace;
            }
            evict(p, server, cx.cap, out);
            p.counts.server_parses += 1;
            put_parse(out, &def);
            server.insert(&def);
            p.push(Reply::Parsed {
                name,
                def,
                unmark: true,
            });
            Edit::Replace
        }
        b'B' => {
            let Some((portal, stmt, rest)) = bind_parts(body).filter(|b| !b.1.is_empty()) else {
                return keep(p);
            };
            let Some(def) = p.names.get(stmt).cloned() else {
                return match server {
                    Some(server) => {
                        missing(p, server, (tag, body), stmt, cx, out).unwrap_or_else(|| keep(p))
                    }
                    None => Edit::Hold,
                };
            };
            match server {
                // Whether SQL PREPARE can go before it depends on the status.
                Some(server) if def.sql && p.status_pending() && !server.holds(def.id) => {
                    return Edit::Hold;
                }
                Some(server) => {
                    if let Some(e) = super::check::before_use(p, server, &def, stmt, cx, out) {
                        return e;
                    }
                    if !ensure_any(p, server, &def, cx, out) {
                        if cx.status != b'E' {
                            return keep(p);
                        }
                        // PostgreSQL would find the statement, then refuse the Bind as
                        // it refuses any message in a failed transaction: a Parse that
                        // is never stored gets that error (the client's name would not
                        // be found on this server).
                        put_named_parse(out, SERVER_PREFIX, b"SELECT\0\0\0");
                        p.push(Reply::Discarded);
                        return Edit::Replace;
                    }
                }
                None if def.sql => return Edit::Hold,
                None => p.ahead.push(def.clone()),
            }
            p.counts.binds += 1;
            if def.effects.flags != 0 {
                p.effects.bind(&def.effects, rest);
            }
            p.opaque |= !def.plain;
            put_bind(out, portal, &def, rest);
            sent_named(p, tag, stmt, &def);
            Edit::Replace
        }
        b'D' | b'C' => {
            let Some((b'S', name)) = target_parts(body).filter(|t| !t.1.is_empty()) else {
                return keep(p);
            };
            let Some(server) = server else {
                let Some(def) = p.names.get(name).filter(|d| !d.sql && tag == b'D').cloned() else {
                    return Edit::Hold;
                };
                p.ahead.push(def.clone());
                put_target(out, b'D', def.id);
                sent_named(p, tag, name, &def);
                return Edit::Replace;
            };
            if tag == b'C' {
                // The server keeps it cached for whoever prepares the same text next;
                // closing a name that does not exist is no error in PostgreSQL either.
                let before = p.names.remove_entry(name);
                if let Some((_, def)) = &before {
                    p.forget_described(def.id, name);
                }
                p.push(Reply::Synth {
                    tag: b'3',
                    undo: before.map(|(n, d)| (n, Some(d))),
                });
                return Edit::Replace;
            }
            let Some(def) = p.names.get(name).cloned() else {
                return missing(p, server, (tag, body), name, cx, out).unwrap_or_else(|| keep(p));
            };
            if let Some(e) = super::check::before_use(p, server, &def, name, cx, out) {
                return e;
            }
            if !ensure_any(p, server, &def, cx, out) {
                return keep(p);
            }
            put_target(out, b'D', def.id);
            sent_named(p, tag, name, &def);
            Edit::Replace
        }
        b'Q' if query_kind(body) != Some(QueryKind::DropAll) => {
            let (Some(kind), Some(server)) = (query_kind(body), server) else {
                return keep(p);
            };
            match kind {
                QueryKind::Deallocate(name) => deallocate(p, server, &name, body, cx, out),
                QueryKind::Prepare(name, rest) => {
                    Some(sql_prepare(p, server, name, (&rest, body), cx, out))
                }
                QueryKind::Execute(name, params) => {
                    sql_execute(p, server, (&name, &params), body, cx, out)
                }
                QueryKind::DropAll => None,
            }
            .unwrap_or_else(|| keep(p))
        }
        b'Q' => {
            let Some(server) = server else {
                return Edit::Hold;
            };
            p.described.clear();
            p.described_as.clear();
            let reset = Reply::Reset {
                names: std::mem::take(&mut p.names),
                server: std::mem::take(server),
            };
            p.push(reset);
            Edit::Keep
        }
        b'S' => {
            let Some(name) = p.close_after_sync.take() else {
                return keep(p);
            };
            p.push(Reply::Sent(b'S'));
            put_sync(out);
            put_close(out, &name);
            put_sync(out);
            p.push(Reply::Tidy);
            Edit::Replace
        }
        _ => keep(p),
    }
}

/// A Parse of SQL PREPARE, EXECUTE or DEALLOCATE of a name. What the statement does
/// happens at its Execute (once per Bind: a second is PostgreSQL's 42P05), not at the
/// Parse, so Weir could not rename it as it renames the simple query's; passed on, it
/// would leave a statement under the client's own name on a shared server, where
/// another client's EXECUTE of that name would run it. DEALLOCATE ALL and DISCARD ALL
/// go on: they drop nothing another client could find (Weir prepares its statements
/// again where the server lacks them).
fn sql_statement_via_extended(body: &[u8]) -> bool {
    let Some((_, rest)) = parse_parts(body) else {
        return false;
    };
    let Some(end) = rest.iter().position(|&b| b == 0) else {
        return false;
    };
    matches!(
        query_kind(&rest[..=end]),
        Some(QueryKind::Prepare(..) | QueryKind::Execute(..) | QueryKind::Deallocate(_))
    )
}

/// What a client gets for `sql_statement_via_extended`.
fn sql_via_extended() -> crate::protocol::PgError {
    crate::protocol::PgError::error(
        "0A000",
        "SQL PREPARE, EXECUTE and DEALLOCATE of a name are not supported through the \
         extended query protocol by a pooler in transaction or statement mode: send them \
         as simple queries, or use protocol-level prepared statements",
    )
}

/// PostgreSQL raising `sql_via_extended` where the client's transaction must fail with it.
const RAISE_SQL_VIA_EXTENDED: &[u8] = b"DO $weir$BEGIN RAISE EXCEPTION USING ERRCODE = '0A000', \
MESSAGE = 'SQL PREPARE, EXECUTE and DEALLOCATE of a name are not supported through the \
extended query protocol by a pooler in transaction or statement mode: send them as simple \
queries, or use protocol-level prepared statements'; END$weir$\0\0\0";

/// A Bind or Describe of a name like Weir's own that the client does not have: what it
/// becomes depends on the transaction status (see `refusals::missing`).
fn lacks_weirs_name(tag: u8, body: &[u8], p: &ClientStatements) -> bool {
    let name = match tag {
        b'B' => bind_parts(body).map(|(_, s, _)| s),
        b'D' => target_parts(body).and_then(|(k, n)| (k == b'S').then_some(n)),
        _ => None,
    };
    name.is_some_and(|n| is_weir_name(n) && !p.names.contains_key(n))
}

/// Records a renamed Bind or Describe, with the client's name where its statement has
/// several.
fn sent_named(p: &mut ClientStatements, tag: u8, name: &[u8], def: &Def) {
    let alias = p.aliased.contains(&def.id).then(|| name.into());
    p.push(Reply::SentAs(tag, def.id, alias));
}

/// Prepares, ahead of a request rewritten while queueing, the statements it names that
/// the server it got lacks (the request has not gone ahead: the front of what the client
/// sends is the request's start, `request`). Each Parse goes at the start of the first
/// batch that uses its statement (should it fail, as after DDL that dropped its table,
/// PostgreSQL fails that batch, not the ones before it), evictions in front of all.
/// Returns the bytes to put at each offset of the request, in increasing order.
pub fn settle_ahead(
    p: &mut ClientStatements,
    server: &mut ServerStatements,
    cap: usize,
    request: &[u8],
) -> Vec<(usize, BytesMut)> {
    let needs = std::mem::take(&mut p.ahead);
    let keep: Vec<u64> = needs.iter().map(|d| d.id).collect();
    let (held, missing): (Vec<_>, Vec<_>) = needs.into_iter().partition(|d| server.touch(d.id));
    p.counts.hits += held.len() as u64;
    if missing.is_empty() {
        return Vec::new();
    }
    // Where each statement is first used; in front of all if that cannot be told.
    let uses = super::queued::uses(p, request).unwrap_or_default();
    let first_use = |id: u64| {
        uses.iter()
            .find(|u| u.id == id)
            .map_or((0, 0), |u| (u.batch_at, u.batch_reply))
    };
    let mut front = BytesMut::new();
    let mut front_replies = Vec::new();
    // (offset, entry index, bytes, entries), one per batch start.
    let mut parses: Vec<(usize, usize, BytesMut, Vec<Reply>)> = Vec::new();
    for def in missing {
        if server.touch(def.id) {
            continue;
        }
        // The whole request is prepared for before it runs: none of its own statements
        // may be evicted for another (the cache may then hold more than the bound until
        // the request's statements give way to others).
        while let Some(victim) = server.evict_except(cap, &keep) {
            p.counts.evictions += 1;
            put_target(&mut front, b'C', victim.id);
            front_replies.push(Reply::Evicted(victim));
        }
        p.counts.server_parses += 1;
        server.insert(&def);
        let (at, reply) = first_use(def.id);
        let i = match parses.iter().position(|x| x.0 == at) {
            Some(i) => i,
            None => {
                parses.push((at, reply, BytesMut::new(), Vec::new()));
                parses.len() - 1
            }
        };
        put_parse(&mut parses[i].2, &def);
        parses[i].3.push(Reply::Prepared(def));
    }
    parses.sort_by_key(|x| x.0);
    for (_, reply, _, entries) in parses.iter_mut().rev() {
        for r in entries.drain(..).rev() {
            p.insert_reply(*reply, r);
        }
    }
    for r in front_replies.into_iter().rev() {
        p.push_front(r);
    }
    let mut out: Vec<(usize, BytesMut)> = parses.into_iter().map(|x| (x.0, x.2)).collect();
    match out.first_mut() {
        Some((0, bytes)) => {
            front.extend_from_slice(bytes);
            *bytes = front;
        }
        _ if !front.is_empty() => out.insert(0, (0, front)),
        _ => {}
    }
    out
}

/// SQL PREPARE (`rest`: what follows the name; `query`: the whole query): under Weir's
/// name, unless the server has the statement already (then Weir answers); in a failed
/// transaction it goes to the server for PostgreSQL's error.
fn sql_prepare(
    p: &mut ClientStatements,
    server: &mut ServerStatements,
    name: Vec<u8>,
    (rest, query): (&[u8], &[u8]),
    cx: &Context,
    out: &mut BytesMut,
) -> Edit {
    p.counts.client_parses += 1;
    if p.names.contains_key(&name[..]) {
        return sql_prepare_taken(p, server, (&name, query), cx, out);
    }
    let def = intern_sql(rest);
    let name: Box<[u8]> = name.into();
    p.names.insert(name.clone(), def.clone());
    let held = server.touch(def.id);
    if held && cx.status != b'E' {
        p.counts.hits += 1;
        p.push(Reply::Synth {
            tag: b'P',
            undo: Some((name, None)),
        });
        return Edit::Replace;
    }
    if !held {
        evict(p, server, cx.cap, out);
        p.counts.server_parses += 1;
        server.insert(&def);
    }
    put_sql_prepare(out, &def);
    p.push(Reply::PrepareSql {
        name,
        def,
        unmark: !held,
    });
    Edit::Replace
}

/// SQL EXECUTE of one of the client's statements, prepared first on a server that lacks
/// it. None for a name the client does not have (the server's error names it).
fn sql_execute(
    p: &mut ClientStatements,
    server: &mut ServerStatements,
    (name, params): (&[u8], &[u8]),
    query: &[u8],
    cx: &Context,
    out: &mut BytesMut,
) -> Option<Edit> {
    let Some(def) = p.names.get(name).cloned() else {
        return missing(p, server, (b'Q', query), name, cx, out);
    };
    p.counts.binds += 1;
    if def.effects.flags != 0 {
        p.effects.merge(&def.effects);
    }
    if server.touch(def.id) {
        p.counts.hits += 1;
    } else if cx.status != b'E' {
        evict(p, server, cx.cap, out);
        p.counts.server_parses += 1;
        server.insert(&def);
        if def.sql {
            let mut sql = format!("PREPARE weir_{} ", def.id).into_bytes();
            sql.extend_from_slice(&def.body);
            // A newline ends a comment the text may end with.
            sql.extend_from_slice(format!("\n;EXECUTE weir_{}", def.id).as_bytes());
            sql.extend_from_slice(params);
            put_query(out, &sql);
            p.push(Reply::PrepareThenRun(def));
            return Some(Edit::Replace);
        } else {
            put_parse(out, &def);
            put_sync(out);
            p.push(Reply::Prepared(def.clone()));
            p.push(Reply::SwallowReady);
        }
    }
    put_sql_execute(out, def.id, params);
    p.push(Reply::Sent(b'Q'));
    Some(Edit::Replace)
}

/// DEALLOCATE of one of the client's statements: it goes to the server as a DEALLOCATE of
/// Weir's name where the server holds it, so that the client gets PostgreSQL's own reply
/// (or error, in a failed transaction). Where it lacks it, a DEALLOCATE can fail only in
/// a failed transaction (then it goes for PostgreSQL's 25P02): Weir answers, as preparing
/// the statement first to drop it could fail where the client's would not (its text no
/// longer valid after DDL). None for a name the client does not have: the server's error
/// names it as the client did.
fn deallocate(
    p: &mut ClientStatements,
    server: &mut ServerStatements,
    name: &[u8],
    query: &[u8],
    cx: &Context,
    out: &mut BytesMut,
) -> Option<Edit> {
    let Some((name, def)) = p.names.remove_entry(name) else {
        return missing(p, server, (b'Q', query), name, cx, out);
    };
    let held = server.touch(def.id);
    if !held && cx.status != b'E' {
        p.push(Reply::Synth {
            tag: b'D',
            undo: Some((name, Some(def))),
        });
        return Some(Edit::Replace);
    }
    server.remove(def.id);
    put_deallocate(out, def.id);
    p.push(Reply::Dealloc { name, def, held });
    Some(Edit::Replace)
}

/// `ensure`, for a statement of either kind. One of SQL PREPARE is prepared with a query,
/// which can go only between batches: in the middle of one (or in a failed transaction)
/// this gives up, and the message goes on under the client's name for the server's
/// error (a known limit: PostgreSQL would find the statement).
fn ensure_any(
    p: &mut ClientStatements,
    server: &mut ServerStatements,
    def: &Arc<Def>,
    cx: &Context,
    out: &mut BytesMut,
) -> bool {
    if !def.sql {
        ensure(p, server, def, cx.cap, out);
        return true;
    }
    if server.touch(def.id) {
        p.counts.hits += 1;
        return true;
    }
    if cx.unsynced || cx.status == b'E' {
        return false;
    }
    evict(p, server, cx.cap, out);
    p.counts.server_parses += 1;
    put_sql_prepare(out, def);
    server.insert(def);
    p.push(Reply::PreparedSql(def.clone()));
    true
}

/// Prepares `def` on the server ahead of the message that uses it, if it lacks it.
fn ensure(
    p: &mut ClientStatements,
    server: &mut ServerStatements,
    def: &Arc<Def>,
    cap: usize,
    out: &mut BytesMut,
) {
    if server.touch(def.id) {
        p.counts.hits += 1;
        return;
    }
    evict(p, server, cap, out);
    p.counts.server_parses += 1;
    put_parse(out, def);
    server.insert(def);
    p.push(Reply::Prepared(def.clone()));
}

/// Closes what must go for one more statement to fit in the server's cache.
pub(super) fn evict(
    p: &mut ClientStatements,
    server: &mut ServerStatements,
    cap: usize,
    out: &mut BytesMut,
) {
    while let Some(victim) = server.evict(cap) {
        p.counts.evictions += 1;
        put_target(out, b'C', victim.id);
        p.push(Reply::Evicted(victim));
    }
}

/// Answers, without a server, a request of only named Parses and a Sync (what libpq's
/// PQprepare sends) when every statement is one a server has already prepared without
/// error: the client registers its names and gets ParseComplete for each and
/// ReadyForQuery, as from PostgreSQL, and will prepare them on a server when it binds.
/// Besides a round trip, this spares a server to a client that only prepares: pgbench
/// prepares synchronously while its other clients hold servers in open transactions, and
/// would otherwise wait on itself. Returns the bytes of the request it answered.
pub fn answer_alone(request: &[u8], p: &mut ClientStatements, out: &mut BytesMut) -> Option<usize> {
    let mut at = 0;
    let mut found = Vec::new();
    loop {
        let header = request.get(at..at + 5)?;
        let len = u32::from_be_bytes([header[1], header[2], header[3], header[4]]) as usize;
        let body = request.get(at + 5..at + 1 + len.max(4))?;
        at += 1 + len.max(4);
        match header[0] {
            b'P' => {
                let (name, rest) = parse_parts(body)?;
                let def = lookup(rest).filter(|d| d.valid.load(Ordering::Relaxed))?;
                if name.is_empty()
                    || p.names.contains_key(name)
                    || found.iter().any(|(n, _)| *n == name)
                {
                    return None;
                }
                found.push((name, def));
            }
            b'S' if !found.is_empty() => break,
            _ => return None,
        }
    }
    for (name, def) in found {
        p.counts.client_parses += 1;
        p.counts.hits += 1;
        p.names.insert(name.into(), def);
        out.extend_from_slice(PARSE_COMPLETE);
    }
    crate::protocol::messages::ready_for_query(out, b'I');
    Some(at)
}
