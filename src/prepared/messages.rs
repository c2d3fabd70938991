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

/// The client's Parse as an unnamed one (see `Session::client_parse`).
pub fn put_unnamed_parse(out: &mut BytesMut, def: &Def) {
    put_message(out, b'P', |b| {
        b.put_u8(0);
        b.put_slice(&def.body);
    });
}

pub fn put_failing_parse(out: &mut BytesMut) {
    put_message(out, b'P', |b| b.put_slice(FAILING_PARSE));
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

/// True when a simple query's first bytes are a statement that drops every prepared
/// statement of the session: DEALLOCATE [PREPARE] ALL or DISCARD ALL (Prisma sends the
/// first, poolers and frameworks the second). Leading blanks and semicolons are skipped.
pub fn drops_all_statements(prefix: &[u8]) -> bool {
    let mut words = prefix
        .split(|&c| c.is_ascii_whitespace() || c == b';' || c == 0)
        .filter(|w| !w.is_empty());
    let mut next = || words.next().map(|w| w.to_ascii_lowercase());
    match next().as_deref() {
        Some(b"deallocate") => match next().as_deref() {
            Some(b"all") => true,
            Some(b"prepare") => next().as_deref() == Some(b"all"),
            _ => false,
        },
        Some(b"discard") => next().as_deref() == Some(b"all"),
        _ => false,
    }
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
    fn recognises_statements_that_drop_everything() {
        for yes in [
            "DEALLOCATE ALL",
            "  deallocate prepare all;",
            "discard ALL",
            ";DISCARD\tall",
        ] {
            assert!(drops_all_statements(yes.as_bytes()), "{yes}");
        }
        for no in [
            "DEALLOCATE s1",
            "discard plans",
            "select 'discard all'",
            "deallocate",
        ] {
            assert!(!drops_all_statements(no.as_bytes()), "{no}");
        }
    }
}
