//! The parts of Parse, Bind, Describe and Close that name a statement, and the messages
//! Weir writes in their place.

use bytes::{BufMut, BytesMut};

use super::defs::{Def, SERVER_PREFIX};
use crate::protocol::messages::put_message;

pub const PARSE_COMPLETE: &[u8] = b"1\0\0\0\x04";
pub const CLOSE_COMPLETE: &[u8] = b"3\0\0\0\x04";

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

/// The statement id a name is Weir's server name of (`weir_<id>`, spelt as Weir spells
/// it), if it is one: a client's name that some server may hold as Weir's.
pub fn server_id(name: &[u8]) -> Option<u64> {
    let digits = name.strip_prefix(SERVER_PREFIX)?;
    let id: u64 = std::str::from_utf8(digits).ok()?.parse().ok()?;
    (id.to_string().as_bytes() == digits).then_some(id)
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

/// A client message as it came (tag and body), for one Weir puts something in front of.
pub fn put_as_is(out: &mut BytesMut, tag: u8, body: &[u8]) {
    put_message(out, tag, |b| b.put_slice(body));
}

/// A Parse of `body` (text, types) under the client's own name.
pub fn put_named_parse(out: &mut BytesMut, name: &[u8], body: &[u8]) {
    put_message(out, b'P', |b| {
        b.put_slice(name);
        b.put_u8(0);
        b.put_slice(body);
    });
}

/// A Close of the statement the server holds under the client's own name.
pub fn put_close(out: &mut BytesMut, name: &[u8]) {
    put_message(out, b'C', |b| {
        b.put_u8(b'S');
        b.put_slice(name);
        b.put_u8(0);
    });
}

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
    fn only_weirs_own_spelling_is_a_server_name() {
        assert_eq!(server_id(b"weir_7"), Some(7));
        assert_eq!(server_id(b"weir_12345"), Some(12345));
        for no in [
            &b"weir_"[..],
            b"weir_07",
            b"weir_7a",
            b"weir_+7",
            b"x_7",
            b"weir_ 7",
        ] {
            assert_eq!(server_id(no), None, "{}", String::from_utf8_lossy(no));
        }
    }
}
