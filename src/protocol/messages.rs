//! Builders for the messages Weir originates, on either side.

use bytes::{BufMut, BytesMut};

use super::PgError;

/// Writes a message with a type byte; `body` fills in everything after the length.
pub fn put_message(buf: &mut BytesMut, tag: u8, body: impl FnOnce(&mut BytesMut)) {
    buf.put_u8(tag);
    let len_at = buf.len();
    buf.put_u32(0);
    body(buf);
    let len = (buf.len() - len_at) as u32;
    buf[len_at..len_at + 4].copy_from_slice(&len.to_be_bytes());
}

fn put_cstr(buf: &mut BytesMut, s: &str) {
    buf.put_slice(s.as_bytes());
    buf.put_u8(0);
}

fn with_message(tag: u8, body: impl FnOnce(&mut BytesMut)) -> BytesMut {
    let mut buf = BytesMut::with_capacity(64);
    put_message(&mut buf, tag, body);
    buf
}

/// An ErrorResponse. What Weir itself tells a client goes through
/// `stats::error_response`, which counts it too.
pub fn error_response(err: &PgError) -> BytesMut {
    error_or_notice(b'E', err)
}

pub fn notice_response(err: &PgError) -> BytesMut {
    error_or_notice(b'N', err)
}

fn error_or_notice(tag: u8, err: &PgError) -> BytesMut {
    with_message(tag, |b| {
        b.put_u8(b'S');
        put_cstr(b, &err.severity);
        // 'V' is the non-localized severity that newer clients prefer.
        b.put_u8(b'V');
        put_cstr(b, &err.severity);
        b.put_u8(b'C');
        put_cstr(b, &err.code);
        b.put_u8(b'M');
        put_cstr(b, &err.message);
        if let Some(detail) = &err.detail {
            b.put_u8(b'D');
            put_cstr(b, detail);
        }
        if let Some(routine) = err.routine {
            b.put_u8(b'R');
            put_cstr(b, routine);
        }
        b.put_u8(0);
    })
}

pub fn auth_request(buf: &mut BytesMut, code: u32, data: &[u8]) {
    put_message(buf, b'R', |b| {
        b.put_u32(code);
        b.put_slice(data);
    });
}

pub const AUTH_OK: u32 = 0;
pub const AUTH_CLEARTEXT: u32 = 3;
pub const AUTH_MD5: u32 = 5;
pub const AUTH_SASL: u32 = 10;
pub const AUTH_SASL_CONTINUE: u32 = 11;
pub const AUTH_SASL_FINAL: u32 = 12;

pub fn auth_sasl_mechanisms(buf: &mut BytesMut, mechanisms: &[&str]) {
    put_message(buf, b'R', |b| {
        b.put_u32(AUTH_SASL);
        for m in mechanisms {
            put_cstr(b, m);
        }
        b.put_u8(0);
    });
}

pub fn parameter_status(buf: &mut BytesMut, name: &str, value: &str) {
    put_message(buf, b'S', |b| {
        put_cstr(b, name);
        put_cstr(b, value);
    });
}

pub fn backend_key_data(buf: &mut BytesMut, key: &super::BackendKey) {
    put_message(buf, b'K', |b| {
        b.put_u32(key.pid);
        b.put_u32(key.secret);
        b.put_slice(key.tail());
    });
}

pub fn ready_for_query(buf: &mut BytesMut, status: u8) {
    put_message(buf, b'Z', |b| b.put_u8(status));
}

/// NegotiateProtocolVersion: the newest version we speak and the options we ignored.
/// `version` is the whole protocol number (`PROTOCOL_3_0`), as PostgreSQL sends it. The
/// protocol documentation's "newest minor version" reads as if the minor alone went there,
/// but libpq 18 reads a bare 0 as protocol 0.0 and refuses that "downgrade".
pub fn negotiate_protocol_version(buf: &mut BytesMut, version: u32, unsupported: &[String]) {
    put_message(buf, b'v', |b| {
        b.put_u32(version);
        b.put_u32(unsupported.len() as u32);
        for name in unsupported {
            put_cstr(b, name);
        }
    });
}

// ---- frontend messages, sent by Weir to servers ----

pub const PROTOCOL_3_0: u32 = 196_608;
/// PostgreSQL 18's: cancel keys of up to 256 bytes, its only change from 3.0.
pub const PROTOCOL_3_2: u32 = 196_610;
pub const CANCEL_REQUEST_CODE: u32 = 80_877_102;
pub const SSL_REQUEST_CODE: u32 = 80_877_103;
pub const GSSENC_REQUEST_CODE: u32 = 80_877_104;

pub fn startup_message(version: u32, params: &[(&str, &str)]) -> BytesMut {
    let mut buf = BytesMut::with_capacity(128);
    buf.put_u32(0);
    buf.put_u32(version);
    for (k, v) in params {
        put_cstr(&mut buf, k);
        put_cstr(&mut buf, v);
    }
    buf.put_u8(0);
    let len = buf.len() as u32;
    buf[0..4].copy_from_slice(&len.to_be_bytes());
    buf
}

/// The whole key goes, however long: PostgreSQL 18 compares all of it.
pub fn cancel_request(key: &super::BackendKey) -> BytesMut {
    let len = 12 + key.secret_len();
    let mut buf = BytesMut::with_capacity(len);
    buf.put_u32(len as u32);
    buf.put_u32(CANCEL_REQUEST_CODE);
    buf.put_u32(key.pid);
    buf.put_u32(key.secret);
    buf.put_slice(key.tail());
    buf
}

pub fn query(buf: &mut BytesMut, sql: &str) {
    put_message(buf, b'Q', |b| put_cstr(b, sql));
}

pub fn password_message(buf: &mut BytesMut, data: &[u8]) {
    put_message(buf, b'p', |b| b.put_slice(data));
}

/// The first SASL message names the mechanism and carries a length-prefixed payload.
pub fn sasl_initial_response(buf: &mut BytesMut, mechanism: &str, data: &[u8]) {
    put_message(buf, b'p', |b| {
        put_cstr(b, mechanism);
        b.put_i32(data.len() as i32);
        b.put_slice(data);
    });
}

/// Quotes a string literal for SQL, doubling single quotes (and using E'' for backslashes
/// so it is right whatever standard_conforming_strings says).
pub fn quote_literal(value: &str) -> String {
    let mut out = String::with_capacity(value.len() + 3);
    if value.contains('\\') {
        out.push('E');
    }
    out.push('\'');
    for c in value.chars() {
        match c {
            '\'' => out.push_str("''"),
            '\\' => out.push_str("\\\\"),
            c => out.push(c),
        }
    }
    out.push('\'');
    out
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn message_length_counts_itself() {
        let mut b = BytesMut::new();
        ready_for_query(&mut b, b'I');
        assert_eq!(&b[..], &[b'Z', 0, 0, 0, 5, b'I']);
    }

    #[test]
    fn startup_message_is_length_prefixed() {
        let b = startup_message(PROTOCOL_3_2, &[("user", "u")]);
        assert_eq!(
            u32::from_be_bytes([b[0], b[1], b[2], b[3]]) as usize,
            b.len()
        );
        assert_eq!(&b[4..8], &[0, 3, 0, 2]);
        assert_eq!(&b[8..], b"user\0u\0\0");
    }

    #[test]
    fn cancel_request_carries_the_whole_key() {
        let mut secret = 9u32.to_be_bytes().to_vec();
        secret.extend_from_slice(&[5; 28]);
        let key = super::super::BackendKey::from_wire(7, &secret).unwrap();
        let b = cancel_request(&key);
        assert_eq!(b.len(), 44);
        assert_eq!(&b[..4], &44u32.to_be_bytes());
        assert_eq!(&b[12..], &secret[..]);
        let mut k = BytesMut::new();
        backend_key_data(&mut k, &key);
        assert_eq!(&k[1..5], &40u32.to_be_bytes());
        assert_eq!(&k[9..], &secret[..]);
    }

    #[test]
    fn negotiate_protocol_version_names_the_whole_version() {
        let mut b = BytesMut::new();
        let options = ["_pq_.a".to_owned(), "_pq_.bc".to_owned()];
        negotiate_protocol_version(&mut b, PROTOCOL_3_0, &options);
        let mut want = vec![b'v', 0, 0, 0, 27, 0, 3, 0, 0, 0, 0, 0, 2];
        want.extend_from_slice(b"_pq_.a\0_pq_.bc\0");
        assert_eq!(&b[..], &want[..]);
    }

    #[test]
    fn quote_literal_escapes() {
        assert_eq!(quote_literal("it's"), "'it''s'");
        assert_eq!(quote_literal("a\\b"), "E'a\\\\b'");
    }
}
