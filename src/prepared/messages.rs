//! The parts of Parse, Bind, Describe and Close that name a statement, and the messages
//! Weir writes in their place.

use bytes::{BufMut, BytesMut};

use super::defs::{Def, SERVER_PREFIX};
use crate::protocol::messages::put_message;

pub const PARSE_COMPLETE: &[u8] = b"1\0\0\0\x04";
pub const CLOSE_COMPLETE: &[u8] = b"3\0\0\0\x04";

/// A Parse that fails at analysis (after PostgreSQL's own checks for an aborted
/// transaction) with 42883, so that the server skips to Sync as it would after the error
/// Weir reports in its place. Named, so that the client's unnamed statement survives.
const FAILING_PARSE: &[u8] = b"weir_fail\0SELECT pg_catalog.weir_statement_check()\0\0\0";
pub const FAILING_CODE: &str = "42883";

/// Splits a NUL-terminated string off the front: (the string, what follows its NUL).
fn cstr(b: &[u8]) -> Option<(&[u8], &[u8])> {
    let end = b.iter().position(|&c| c == 0)?;
    Some((&b[..end], &b[end + 1..]))
}

/// Parse: (statement name, the rest: text, NUL, parameter types).
pub fn parse_parts(body: &[u8]) -> Option<(&[u8], &[u8])> {
    let (name, rest) = cstr(body)?;
    cstr(rest)?;
    Some((name, rest))
}

/// Bind: (portal, statement name, the rest).
pub fn bind_parts(body: &[u8]) -> Option<(&[u8], &[u8], &[u8])> {
    let (portal, rest) = cstr(body)?;
    let (stmt, rest) = cstr(rest)?;
    Some((portal, stmt, rest))
}

/// Describe and Close: (b'S' or b'P', name).
pub fn target_parts(body: &[u8]) -> Option<(u8, &[u8])> {
    let (&kind, rest) = body.split_first()?;
    let (name, _) = cstr(rest)?;
    Some((kind, name))
}

/// True for names a client could only have copied from Weir's own.
pub fn is_weir_name(name: &[u8]) -> bool {
    name.starts_with(SERVER_PREFIX)
}

pub fn put_parse(out: &mut BytesMut, def: &Def) {
    put_message(out, b'P', |b| {
        def.put_server_name(b);
        b.put_slice(&def.body);
    });
}

/// A Parse of the unnamed statement with this body (text, types).
pub fn put_unnamed_parse(out: &mut BytesMut, body: &[u8]) {
    put_message(out, b'P', |b| {
        b.put_u8(0);
        b.put_slice(body);
    });
}

/// An ErrorResponse body with the statement names the server used (`"weir_<id>"`) put
/// back as the client knows them; None when it names none of them.
pub fn rename_in_error(
    body: &[u8],
    client_name: impl Fn(u64) -> Option<Vec<u8>>,
) -> Option<BytesMut> {
    const NEEDLE: &[u8] = b"\"weir_";
    body.windows(NEEDLE.len()).position(|w| w == NEEDLE)?;
    let mut out = BytesMut::with_capacity(body.len() + 5);
    put_message(&mut out, b'E', |b| {
        for field in body.split(|&c| c == 0).filter(|f| !f.is_empty()) {
            let mut rest = field;
            while let Some(at) = rest.windows(NEEDLE.len()).position(|w| w == NEEDLE) {
                b.put_slice(&rest[..at + 1]);
                rest = &rest[at + 1..];
                let digits = rest[5..].iter().take_while(|c| c.is_ascii_digit()).count();
                let id = std::str::from_utf8(&rest[5..5 + digits])
                    .ok()
                    .and_then(|d| d.parse().ok());
                match id.and_then(&client_name) {
                    Some(name) if rest.get(5 + digits) == Some(&b'"') => {
                        b.put_slice(&name);
                        rest = &rest[5 + digits..];
                    }
                    _ => {
                        b.put_slice(&rest[..5]);
                        rest = &rest[5..];
                    }
                }
            }
            b.put_slice(rest);
            b.put_u8(0);
        }
        b.put_u8(0);
    });
    Some(out)
}

pub fn put_failing_parse(out: &mut BytesMut) {
    put_message(out, b'P', |b| b.put_slice(FAILING_PARSE));
}

/// The simple-query form of `put_failing_parse`.
pub fn put_failing_query(out: &mut BytesMut) {
    put_query(out, FAILING_QUERY);
}

const FAILING_QUERY: &[u8] = b"SELECT pg_catalog.weir_statement_check()";

pub fn put_query(out: &mut BytesMut, sql: &[u8]) {
    put_message(out, b'Q', |b| {
        b.put_slice(sql);
        b.put_u8(0);
    });
}

pub fn put_sync(out: &mut BytesMut) {
    put_message(out, b'S', |_| {});
}

/// SQL PREPARE of a statement under Weir's name.
pub fn put_sql_prepare(out: &mut BytesMut, def: &Def) {
    let mut sql = format!("PREPARE weir_{} ", def.id).into_bytes();
    sql.extend_from_slice(&def.body);
    put_query(out, &sql);
}

/// SQL EXECUTE of a statement by Weir's name, with the client's parameters.
pub fn put_sql_execute(out: &mut BytesMut, def_id: u64, params: &[u8]) {
    let mut sql = format!("EXECUTE weir_{def_id}").into_bytes();
    sql.extend_from_slice(params);
    put_query(out, &sql);
}

/// DEALLOCATE of a statement by Weir's name.
pub fn put_deallocate(out: &mut BytesMut, def_id: u64) {
    let sql = format!("DEALLOCATE weir_{def_id}");
    put_query(out, sql.as_bytes());
}

pub fn put_bind(out: &mut BytesMut, portal: &[u8], def: &Def, rest: &[u8]) {
    put_message(out, b'B', |b| {
        b.put_slice(portal);
        b.put_u8(0);
        def.put_server_name(b);
        b.put_slice(rest);
    });
}

/// Describe or Close of a statement, by Weir's name.
pub fn put_target(out: &mut BytesMut, tag: u8, def_id: u64) {
    put_message(out, tag, |b| {
        b.put_u8(b'S');
        b.put_slice(SERVER_PREFIX);
        b.put_slice(def_id.to_string().as_bytes());
        b.put_u8(0);
    });
}

/// What a simple query does to prepared statements, when that is all it does.
#[derive(Debug, PartialEq, Eq)]
pub enum QueryKind {
    /// DEALLOCATE [PREPARE] ALL or DISCARD ALL (Prisma sends the first, frameworks and
    /// poolers the second); recognised from the first words, whatever follows.
    DropAll,
    /// DEALLOCATE [PREPARE] name, alone in the query (Rails sends it when its statement
    /// cache evicts one it prepared with the protocol); the name as PostgreSQL folds it.
    Deallocate(Vec<u8>),
    /// PREPARE name ..., alone in the query: the name, and what follows it.
    Prepare(Vec<u8>, Vec<u8>),
    /// EXECUTE name [(parameters)], alone in the query: the name, and what follows it.
    Execute(Vec<u8>, Vec<u8>),
}

/// Classifies a simple query from its first bytes (`body`, a prefix of the query unless it
/// ends with the query's NUL). Leading blanks and semicolons are skipped.
pub fn query_kind(body: &[u8]) -> Option<QueryKind> {
    let mut rest = body;
    let mut word = || -> Option<Vec<u8>> {
        let start = rest
            .iter()
            .position(|&c| !(c.is_ascii_whitespace() || c == b';'))?;
        rest = &rest[start..];
        let len = rest
            .iter()
            .position(|&c| !(c.is_ascii_alphanumeric() || c == b'_' || c == b'$'))
            .unwrap_or(rest.len());
        let w = rest[..len].to_ascii_lowercase();
        rest = &rest[len..];
        (!w.is_empty()).then_some(w)
    };
    match word()?.as_slice() {
        b"discard" => (word()?.as_slice() == b"all").then_some(QueryKind::DropAll),
        w @ (b"prepare" | b"execute") if body.ends_with(b"\0") => {
            let prepare = w == b"prepare";
            let (name, after) = name_token(rest)?;
            let after = &after[..after.len() - 1];
            // One statement only: a semicolon that is not the last thing may end it (or sit
            // in a literal; either way the query goes to the server as it is).
            let trimmed = after.trim_ascii_end();
            let trimmed = trimmed.strip_suffix(b";").unwrap_or(trimmed);
            if trimmed.contains(&b';') || (prepare && trimmed.trim_ascii().is_empty()) {
                return None;
            }
            let after = trimmed.to_vec();
            Some(if prepare {
                QueryKind::Prepare(name, after)
            } else {
                QueryKind::Execute(name, after)
            })
        }
        b"deallocate" => {
            let mut w = word();
            if w.as_deref() == Some(b"prepare") {
                w = word();
            }
            match w {
                Some(w) if w == b"all" => Some(QueryKind::DropAll),
                Some(name) if body.ends_with(b"\0") && only_ends(rest) => {
                    Some(QueryKind::Deallocate(name))
                }
                // A quoted name keeps its case.
                None if body.ends_with(b"\0") => quoted(rest).map(QueryKind::Deallocate),
                _ => None,
            }
        }
        _ => None,
    }
}

/// A statement name at the start of `rest` (after blanks): unquoted and folded to lower
/// case as PostgreSQL folds it, or double-quoted; and what follows it.
fn name_token(rest: &[u8]) -> Option<(Vec<u8>, &[u8])> {
    let start = rest.iter().position(|&c| !c.is_ascii_whitespace())?;
    let rest = &rest[start..];
    if rest.first() == Some(&b'"') {
        let mut name = Vec::new();
        let mut i = 1;
        loop {
            match (rest.get(i)?, rest.get(i + 1)) {
                (b'"', Some(b'"')) => {
                    name.push(b'"');
                    i += 2;
                }
                (b'"', _) => return (!name.is_empty()).then_some((name, &rest[i + 1..])),
                (&c, _) => {
                    name.push(c);
                    i += 1;
                }
            }
        }
    }
    let len = rest
        .iter()
        .position(|&c| !(c.is_ascii_alphanumeric() || c == b'_' || c == b'$' || c >= 0x80))
        .unwrap_or(rest.len());
    (len > 0).then(|| (rest[..len].to_ascii_lowercase(), &rest[len..]))
}

/// True when nothing but blanks, semicolons and the NUL follows.
fn only_ends(rest: &[u8]) -> bool {
    rest.iter()
        .all(|&c| c.is_ascii_whitespace() || c == b';' || c == 0)
}

/// A double-quoted identifier at the start of `rest` (after blanks), alone.
fn quoted(rest: &[u8]) -> Option<Vec<u8>> {
    let start = rest.iter().position(|&c| !c.is_ascii_whitespace())?;
    let mut it = rest[start..].strip_prefix(b"\"")?.iter().enumerate();
    let mut name = Vec::new();
    while let Some((i, &c)) = it.next() {
        if c != b'"' {
            name.push(c);
            continue;
        }
        if rest[start + 1..].get(i + 1) == Some(&b'"') {
            name.push(b'"');
            it.next();
            continue;
        }
        return (only_ends(&rest[start + 2 + i..]) && !name.is_empty()).then_some(name);
    }
    None
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn splits_the_named_parts() {
        assert_eq!(
            parse_parts(b"s1\0select $1\0\0\x01\0\0\0\x17"),
            Some((&b"s1"[..], &b"select $1\0\0\x01\0\0\0\x17"[..]))
        );
        assert_eq!(parse_parts(b"s1\0no end"), None);
        assert_eq!(
            bind_parts(b"\0s1\0\0\0"),
            Some((&b""[..], &b"s1"[..], &b"\0\0"[..]))
        );
        assert_eq!(target_parts(b"Ss1\0"), Some((b'S', &b"s1"[..])));
        assert_eq!(target_parts(b""), None);
    }

    #[test]
    fn recognises_what_queries_do_to_statements() {
        for all in [
            "DEALLOCATE ALL",
            "  deallocate prepare all;",
            "discard ALL",
            ";DISCARD\tall",
            "discard all; select 1",
        ] {
            assert_eq!(
                query_kind(all.as_bytes()),
                Some(QueryKind::DropAll),
                "{all}"
            );
        }
        let name = |q: &str| query_kind(format!("{q}\0").as_bytes());
        let dealloc = |n: &str| Some(QueryKind::Deallocate(n.as_bytes().to_vec()));
        assert_eq!(name("DEALLOCATE a1"), dealloc("a1"));
        assert_eq!(name(" deallocate PREPARE My_Stmt ;"), dealloc("my_stmt"));
        assert_eq!(
            name("DEALLOCATE \"Odd \"\"Name\"\"\""),
            dealloc("Odd \"Name\"")
        );
        for no in [
            "DEALLOCATE a1; select 1",
            "deallocate",
            "discard plans",
            "select 'discard all'",
            "DEALLOCATE \"unterminated",
        ] {
            assert_eq!(name(no), None, "{no}");
        }
        assert_eq!(
            name("PREPARE q1 (int) AS select $1;"),
            Some(QueryKind::Prepare(
                b"q1".to_vec(),
                b" (int) AS select $1".to_vec()
            ))
        );
        assert_eq!(
            name("execute \"Q\"(1, 'a')"),
            Some(QueryKind::Execute(b"Q".to_vec(), b"(1, 'a')".to_vec()))
        );
        assert_eq!(name("PREPARE q1 AS select 1; select 2"), None);
        assert_eq!(name("PREPARE q1"), None);
        // A prefix of a longer query: the name may go on.
        assert_eq!(query_kind(b"DEALLOCATE a1"), None);
    }
}
