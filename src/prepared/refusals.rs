//! The errors PostgreSQL would give for the client's statement names that Weir must
//! give in its place (a name taken, one like Weir's own), and the rest of the batch after
//! them. PostgreSQL logs every error it raises: Weir answers itself where the server's
//! state is what the error would leave it in anyway, and otherwise has PostgreSQL refuse
//! the client's own message in the client's words (an error is the only way to fail its
//! transaction as the client's would), so that its log holds only what a direct
//! connection would put there.

use std::sync::atomic::Ordering;

use bytes::BytesMut;

use super::defs::lookup;
use super::messages::*;
use super::replies::{ClientStatements, Reply};
use super::rewrite::{Context, Edit};
use super::server::ServerStatements;
use crate::protocol::PgError;

fn lossy(name: &[u8]) -> String {
    String::from_utf8_lossy(name).into_owned()
}

/// A message of a batch Weir has refused (`Reply::Refused`), before its Sync: PostgreSQL
/// would skip it, so it is dropped. A query or function call not framed whole cannot be
/// dropped: it goes on and is answered (a client sending one unsynced in the middle of
/// an extended batch is not known); another message is framed again once it has all
/// arrived.
pub(super) fn skip_to_sync(tag: u8, p: &mut ClientStatements, cx: &Context) -> Edit {
    match tag {
        _ if cx.whole => Edit::Drop,
        b'Q' | b'F' => {
            p.push(Reply::Sent(tag));
            Edit::Keep
        }
        _ => Edit::Hold,
    }
}

/// The client's Parse of a name it has already prepared: PostgreSQL's 42P05, after
/// whatever PostgreSQL would find first (it parses and analyses the text before it looks
/// at the name: a syntax error or a failed transaction is what the client hears of).
/// PostgreSQL logs every error, so where PostgreSQL need not be involved Weir answers
/// itself; where the error must roll back the server's transaction (an open block, or
/// Executes of the same batch before it), PostgreSQL is made to refuse the client's own
/// name, so that its log shows the line a direct connection would.
pub(super) fn parse_taken(
    p: &mut ClientStatements,
    server: &mut ServerStatements,
    name: &[u8],
    rest: &[u8],
    cx: &Context,
    out: &mut BytesMut,
) -> Edit {
    let error = already_exists(p, name);
    if refuse_here(p, cx, false) {
        // A text some server has prepared without error parses (the same trust as
        // `answer_alone`); any other is parsed unnamed for its own errors first.
        if !lookup(rest).is_some_and(|d| d.valid.load(Ordering::Relaxed)) {
            put_unnamed_parse(out, rest);
            p.push(Reply::Discarded);
        }
        return refuse(p, error, false);
    }
    if held_as_weirs(server, name) {
        // The server has the name already (as Weir's): refused as it comes.
        put_named_parse(out, name, rest);
    } else {
        // The first Parse makes the name (or fails as the client's would), the second is
        // refused in the client's words; the server skips to Sync, and the name is
        // closed after it.
        for _ in 0..2 {
            put_named_parse(out, name, rest);
        }
        p.push(Reply::Discarded);
        if p.close_after_sync.is_none() {
            p.close_after_sync = Some(name.into());
        }
    }
    p.push(Reply::Own(b'P'));
    // Weir's Close and Sync follow the client's: nothing may be sent behind them.
    p.opaque = true;
    Edit::Replace
}

/// The client's SQL PREPARE of a name it has (`query`: the whole query, NUL included), as
/// `parse_taken`: in a block PostgreSQL refuses the client's own query, which goes twice
/// in one query where the server lacks the name (the first PREPARE makes it, or fails as
/// the client's would and the second never runs; a failure in separate queries would
/// put a 25P02 of Weir's making in the log); the name is closed after it.
pub(super) fn sql_prepare_taken(
    p: &mut ClientStatements,
    server: &mut ServerStatements,
    (name, query): (&[u8], &[u8]),
    cx: &Context,
    out: &mut BytesMut,
) -> Edit {
    let error = already_exists(p, name);
    if refuse_here(p, cx, true) {
        return refuse(p, error, true);
    }
    p.opaque = true;
    // In a failed transaction PostgreSQL refuses the query before it looks at the name.
    if cx.status == b'E' || held_as_weirs(server, name) {
        p.push(Reply::Own(b'Q'));
        return Edit::Keep;
    }
    let text = query.strip_suffix(b"\0").unwrap_or(query);
    // A newline ends a comment the text may end with.
    put_query(out, &[text, b"\n;", text].concat());
    p.push(Reply::Twice);
    put_close(out, name);
    put_sync(out);
    p.push(Reply::Tidy);
    Edit::Replace
}

/// True when the client's name is the server name of a statement Weir has on this server.
fn held_as_weirs(server: &mut ServerStatements, name: &[u8]) -> bool {
    server_id(name).is_some_and(|id| server.touch(id))
}

/// True when Weir may answer an error itself, the server's state being what the error
/// leaves it in anyway: no transaction block, and (for an extended-protocol message)
/// nothing run since the last Sync that the error would roll back.
pub(super) fn refuse_here(p: &ClientStatements, cx: &Context, query: bool) -> bool {
    cx.status == b'I' && (query || !p.ran)
}

/// Weir's own error in place of PostgreSQL's (see `Reply::Refused`).
pub(super) fn refuse(p: &mut ClientStatements, error: PgError, query: bool) -> Edit {
    p.push(Reply::Refused { error, query });
    if !query {
        p.refusing = true;
    }
    // No other client's request goes behind a batch that ends in an error.
    p.opaque = true;
    Edit::Replace
}

/// A statement name the client never prepared (in a Bind, Describe, EXECUTE or
/// DEALLOCATE: `tag` and `body`, whole): PostgreSQL's own error says so. None for most
/// names: the message goes on as it is. A name like Weir's own may be one the server
/// holds as Weir's: Weir answers out of a block; in one (where the error must fail the
/// transaction) that statement is closed first, so that PostgreSQL refuses the client's
/// message as it came, and logs what a direct connection would.
pub(super) fn missing(
    p: &mut ClientStatements,
    server: &mut ServerStatements,
    (tag, body): (u8, &[u8]),
    name: &[u8],
    cx: &Context,
    out: &mut BytesMut,
) -> Option<Edit> {
    if !is_weir_name(name) {
        return None;
    }
    let query = tag == b'Q';
    if refuse_here(p, cx, query) {
        let msg = format!("prepared statement \"{}\" does not exist", lossy(name));
        return Some(refuse(p, PgError::error("26000", msg), query));
    }
    // In a failed transaction PostgreSQL refuses a query before it looks at the name.
    let looked_up = !(query && cx.status == b'E');
    if let Some(def) = server_id(name)
        .filter(|_| looked_up)
        .and_then(|id| server.take(id))
    {
        put_target(out, b'C', def.id);
        p.push(Reply::Evicted(def));
        if query {
            put_sync(out);
            p.push(Reply::SwallowReady);
        }
    }
    put_as_is(out, tag, body);
    p.push(Reply::Own(tag));
    p.opaque = true;
    Some(Edit::Replace)
}

/// PostgreSQL's error for a name the client has prepared already (the client stays, as
/// it would with PostgreSQL, where PgBouncer closes it).
pub(super) fn already_exists(p: &mut ClientStatements, name: &[u8]) -> PgError {
    p.reused = Some(name.into());
    let msg = format!("prepared statement \"{}\" already exists", lossy(name));
    PgError::error("42P05", msg)
}

#[cfg(test)]
mod tests {
    use super::super::rewrite::client_message;
    use super::*;

    fn cx(status: u8, whole: bool) -> Context {
        Context {
            status,
            cap: 10,
            ahead: false,
            unsynced: false,
            whole,
        }
    }

    /// The tags of the messages in `out`.
    fn tags(out: &[u8]) -> Vec<char> {
        let mut at = 0;
        let mut tags = Vec::new();
        while let Some(h) = out.get(at..at + 5) {
            tags.push(h[0] as char);
            at += 1 + u32::from_be_bytes([h[1], h[2], h[3], h[4]]) as usize;
        }
        tags
    }

    /// Prepares `name` for a client whose server holds it, then parses it again.
    fn reparse(status: u8, before: &[u8]) -> (ClientStatements, ServerStatements, BytesMut) {
        let (mut p, mut server, mut out) = Default::default();
        let body = b"taken\0select 'refusals'\0\0\0";
        let idle = cx(b'I', true);
        client_message(b'P', body, &mut p, Some(&mut server), &idle, &mut out);
        client_message(b'S', b"", &mut p, Some(&mut server), &idle, &mut out);
        p.clear_replies();
        for &tag in before {
            client_message(
                tag,
                b"\0\0\0\0\0",
                &mut p,
                Some(&mut server),
                &idle,
                &mut out,
            );
        }
        out.clear();
        let again = cx(status, true);
        client_message(b'P', body, &mut p, Some(&mut server), &again, &mut out);
        (p, server, out)
    }

    #[test]
    fn out_of_a_block_nothing_fails_on_the_server() {
        let (mut p, mut server, out) = reparse(b'I', b"");
        // The text is not known valid (no server answered its Parse here): parsed unnamed.
        assert_eq!(tags(&out), ['P']);
        assert!(p.refusing);
        let mut out = BytesMut::new();
        let (whole, partial) = (cx(b'I', true), cx(b'I', false));
        let bind = b"\0taken\0\0\0\0\0\0\0";
        let e = client_message(b'B', bind, &mut p, Some(&mut server), &whole, &mut out);
        assert!(matches!(e, Edit::Drop));
        let e = client_message(b'E', b"", &mut p, Some(&mut server), &partial, &mut out);
        assert!(matches!(e, Edit::Hold));
        let e = client_message(b'S', b"", &mut p, Some(&mut server), &whole, &mut out);
        assert!(matches!(e, Edit::Keep));
        assert!(!p.refusing && out.is_empty());
    }

    #[test]
    fn where_a_transaction_must_fail_postgresql_refuses_the_clients_name() {
        for (status, before) in [(b'T', &b""[..]), (b'I', b"E")] {
            let (mut p, mut server, out) = reparse(status, before);
            assert_eq!(tags(&out), ['P', 'P'], "{}", status as char);
            assert!(out.windows(6).any(|w| w == b"taken\0"));
            assert!(!p.refusing);
            let mut out = BytesMut::new();
            let c = cx(status, true);
            client_message(b'S', b"", &mut p, Some(&mut server), &c, &mut out);
            assert_eq!(tags(&out), ['S', 'C', 'S']);
            assert!(matches!(p.replies.back(), Some(Reply::Tidy)));
        }
    }
}
