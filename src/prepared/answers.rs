//! What the server answers, matched to the replies the client is owed: Weir's own are
//! removed, errors name statements as the client does, what an error made the server
//! skip is undone, and the replies Weir owes are made in their place.

use std::sync::atomic::Ordering;

use bytes::BytesMut;

use super::messages::*;
use super::replies::{ClientStatements, Reply};
use super::retry;
use super::server::ServerStatements;
use crate::protocol::PgError;
use crate::stats::error_response;

pub enum ServerEdit {
    Keep,
    /// A reply to Weir's own message: the client never sees it.
    Remove,
    Replace(BytesMut),
    /// PostgreSQL refused a statement's stale plan and the batch is to run again (see
    /// `retry`): the error is removed, and these client bytes go to the server first.
    Retry(Vec<u8>),
    /// The ReadyForQuery of a batch that runs again: removed, and no longer owed.
    Retried,
}

/// The CommandComplete of a DEALLOCATE ALL or a DISCARD ALL (`body`): every prepared
/// statement of the session is gone.
pub fn drops_all(body: &[u8]) -> bool {
    body.starts_with(b"DEALLOCATE ALL\0") || body.starts_with(b"DISCARD ALL\0")
}

/// Matches one server message against the replies owed; `body` is there for errors.
/// `retry_safe`: the server was idle when the batch in progress began, and nothing the
/// client sent after it has gone to the server (see `retry`).
pub fn server_message(
    tag: u8,
    body: Option<&[u8]>,
    p: &mut ClientStatements,
    server: &mut ServerStatements,
    retry_safe: bool,
) -> ServerEdit {
    p.retry.server_says(tag);
    let Some(front) = p.replies.front() else {
        return ServerEdit::Keep;
    };
    if tag == b'C' && body.is_some_and(drops_all) {
        if let Reply::Reset { .. } = front {
            // Done: PostgreSQL's statements are no part of its transactions, so an error
            // later in the same query must not put back what it dropped.
            p.pop();
            p.push_front(Reply::Sent(b'Q'));
        } else {
            // One Weir did not rewrite (sent with the extended protocol, or after another
            // statement in a query) has dropped every statement on the server, Weir's
            // included, and the client's: Weir prepares its own again where they are used.
            *server = ServerStatements::default();
            p.names = Default::default();
            p.described.clear();
            p.described_as.clear();
        }
    }
    let Some(front) = p.replies.front() else {
        return ServerEdit::Keep;
    };
    if let Reply::Tidy = front {
        if tag == b'Z' {
            p.pop();
        }
        return ServerEdit::Remove;
    }
    if let Reply::PreparedSql(def) = front {
        match tag {
            b'E' => server.remove(def.id),
            b'Z' => {
                def.valid.store(true, Ordering::Relaxed);
                p.pop();
            }
            _ => {}
        }
        return ServerEdit::Remove;
    }
    if let (Reply::PrepareThenRun(def), b'C') = (front, tag) {
        def.valid.store(true, Ordering::Relaxed);
        p.pop();
        p.push_front(Reply::Sent(b'Q'));
        return ServerEdit::Remove;
    }
    if let (Reply::Twice, b'C') = (front, tag) {
        if let Some(r) = p.replies.front_mut() {
            *r = Reply::Own(b'Q');
        }
        return ServerEdit::Remove;
    }
    match (front, tag) {
        (Reply::Check(_), b't') => {
            p.describing.parameters(body.unwrap_or_default());
            return ServerEdit::Remove;
        }
        (Reply::Check(def), b'T' | b'n') => {
            let id = def.id;
            let told = p.describing.finish(body.filter(|_| tag == b'T'));
            server.set_described(id, told.hash);
            p.checked = Some(id);
            p.pop();
            return ServerEdit::Remove;
        }
        (Reply::SentAs(b'D', ..), b't') => p.describing.parameters(body.unwrap_or_default()),
        (Reply::SentAs(b'D', id, name), b'T' | b'n') => {
            let (id, name) = (*id, name.clone());
            let told = p.describing.finish(body.filter(|_| tag == b'T'));
            server.set_described(id, told.hash);
            p.described_now(id, name.as_deref(), told);
        }
        _ => {}
    }
    let Some(front) = p.replies.front() else {
        return ServerEdit::Keep;
    };
    if let (Reply::Raise(_), b'1' | b'2' | b'3') = (front, tag) {
        return ServerEdit::Remove;
    }
    if tag == b'E' {
        let mut edit = ServerEdit::Keep;
        if let Reply::Raise(error) = front {
            let error = error();
            if body.is_some_and(|b| PgError::parse(b).code == error.code) {
                edit = ServerEdit::Replace(error_response(&error));
            }
        }
        let failed_again = p.retry.failed_again(front);
        let put_back = failed_again.is_some();
        if let Some(refusal) = failed_again {
            edit = ServerEdit::Replace(refusal);
        }
        let mut stale = None;
        if let (Reply::SentAs(tag, id, _), Some(body)) = (front, body) {
            if retire_if_stale(*id, body, &p.names) {
                stale = Some((*tag, *id, body));
            }
        }
        let as_is = matches!(front, Reply::Own(_) | Reply::Twice);
        if let (ServerEdit::Keep, Some(body), false) = (&edit, body, as_is) {
            let names = &p.names;
            let used = match front {
                Reply::SentAs(_, _, name) => name.as_ref(),
                _ => None,
            };
            let client_name = |id: u64| {
                let found = names.iter().find(|(_, d)| d.id == id);
                used.or(found.map(|(n, _)| n)).map(|n| n.to_vec())
            };
            if let Some(renamed) = rename_in_error(body, client_name) {
                edit = ServerEdit::Replace(renamed);
            }
        }
        if !front.is_extended() {
            // A simple query's error ends nothing; a failed DEALLOCATE dropped nothing.
            if matches!(
                front,
                Reply::Reset { .. }
                    | Reply::Dealloc { .. }
                    | Reply::PrepareSql { .. }
                    | Reply::PrepareThenRun(_)
            ) {
                let missing = body.is_some_and(|b| PgError::parse(b).code == "26000");
                if let Some(mut failed) = p.pop() {
                    if let Reply::Dealloc { held, .. } = &mut failed {
                        // The server says it has no such statement: nothing to put back.
                        *held &= !missing;
                    }
                    failed.undo(&mut p.names, server);
                }
                p.push_front(Reply::Sent(b'Q'));
            }
            return edit;
        }
        // The server skips everything up to the next Sync; what those messages changed is
        // undone last change first (an eviction of a statement prepared earlier in the
        // same batch must not put it back).
        let mut skipped = Vec::new();
        while p.replies.front().is_some_and(|r| !r.is_sync()) {
            skipped.extend(p.pop());
        }
        p.skipping = true;
        for r in skipped.into_iter().rev() {
            r.undo(&mut p.names, server);
        }
        if put_back {
            retry::put_back(p);
        }
        let again = stale
            .and_then(|(tag, id, refusal)| retry::retry_batch(p, tag, id, refusal, retry_safe));
        if let Some(batch) = again {
            return ServerEdit::Retry(batch);
        }
        return edit;
    }
    if tag == b'Z' {
        // Everything before a ReadyForQuery is answered, or was skipped: sent after an
        // error, once the relay had already dropped what was owed up to then.
        let mut skipped = Vec::new();
        let mut edit = ServerEdit::Keep;
        p.skipping = false;
        while let Some(r) = p.pop() {
            if r.ends_with(b'Z') {
                if matches!(r, Reply::SwallowReady) {
                    edit = ServerEdit::Remove;
                }
                break;
            }
            skipped.push(r);
        }
        for r in skipped.into_iter().rev() {
            r.undo(&mut p.names, server);
        }
        if p.retry.swallow_ready() {
            return ServerEdit::Retried;
        }
        return edit;
    }
    if !front.ends_with(tag) {
        return ServerEdit::Keep;
    }
    match p.pop() {
        Some(Reply::Prepared(def)) => {
            def.valid.store(true, Ordering::Relaxed);
            ServerEdit::Remove
        }
        Some(Reply::Parsed { def, .. }) => {
            def.valid.store(true, Ordering::Relaxed);
            ServerEdit::Keep
        }
        Some(Reply::Evicted(_)) | Some(Reply::Discarded) => ServerEdit::Remove,
        _ => ServerEdit::Keep,
    }
}

/// After DDL changed what a statement returns, PostgreSQL refuses its old plan ("cached
/// plan must not change result type"), as it would on a direct connection for a client
/// that prepared it before. A client that prepares the same text from now on must get a
/// fresh statement, not the stale one some server holds under Weir's name: the
/// statement is retired, and the next Parse of its text makes another (drivers re-prepare
/// after this error; without this they would get the stale plan again, forever). True for
/// that error.
fn retire_if_stale(id: u64, body: &[u8], names: &super::replies::Names) -> bool {
    if !retry::is_stale(body) {
        return false;
    }
    if let Some(def) = names.values().find(|d| d.id == id) {
        super::defs::retire(def);
    }
    true
}

/// Appends the replies Weir owes the client now (the front of the queue), if any.
/// `status` is the transaction status for a ReadyForQuery Weir makes; returns how many it
/// made.
pub fn take_synths(p: &mut ClientStatements, status: u8, out: &mut BytesMut) -> usize {
    let mut readies = 0;
    loop {
        let tag = match p.replies.front() {
            Some(Reply::Synth { tag, .. }) => *tag,
            Some(Reply::Refused { error, query }) => {
                out.extend_from_slice(&error_response(error));
                if *query {
                    crate::protocol::messages::ready_for_query(out, status);
                    readies += 1;
                }
                p.pop();
                continue;
            }
            _ => break,
        };
        let command = match tag {
            b'1' => {
                out.extend_from_slice(PARSE_COMPLETE);
                None
            }
            b'3' => {
                out.extend_from_slice(CLOSE_COMPLETE);
                None
            }
            b'P' => Some("PREPARE"),
            _ => Some("DEALLOCATE"),
        };
        if let Some(command) = command {
            crate::protocol::messages::put_message(out, b'C', |b| {
                b.extend_from_slice(command.as_bytes());
                b.extend_from_slice(b"\0");
            });
            crate::protocol::messages::ready_for_query(out, status);
            readies += 1;
        }
        p.pop();
    }
    readies
}

/// True when Weir owes the client a reply at the front of the queue.
pub fn synth_due(p: &ClientStatements) -> bool {
    !p.skipping
        && matches!(
            p.replies.front(),
            Some(Reply::Synth { .. } | Reply::Refused { .. })
        )
}
