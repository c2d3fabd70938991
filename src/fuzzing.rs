//! The parsers that read what peers and configuration files say, one entry point per fuzz
//! target (fuzz/fuzz_targets) and per replay test (tests/fuzz_corpus.rs). Each takes
//! arbitrary bytes and must return, whatever they are: an error is fine, a panic, an
//! unbounded allocation or a hang is a bug. Only this module is public, so the rest of
//! the crate stays private.

use std::future::Future;
use std::path::Path;
use std::pin::pin;
use std::sync::LazyLock;
use std::task::{Context, Poll, Waker};

use bytes::{Bytes, BytesMut};
use weir_auth::scram::{ClientSession, Credential, ServerSession};
use weir_auth::{ScramSecret, Secret};

use crate::gucs::Gucs;
use crate::params::ParamSet;
use crate::prepared::answers::{self, ServerEdit};
use crate::prepared::rewrite::{self, Context as RewriteContext, Edit};
use crate::prepared::{messages, queries, retry, ClientStatements, ServerStatements};
use crate::protocol::framer::Framer;
use crate::protocol::reader::{read_message, read_startup_packet};
use crate::protocol::startup::{self, StartupPacket};
use crate::protocol::{PgError, MAX_STARTUP_PACKET};
use crate::sql::effects::{self, Effects};

/// A fuzz target's entry point.
pub type Target = fn(&[u8]);

/// Every target by name, as fuzz/Cargo.toml names them.
pub const TARGETS: &[(&str, Target)] = &[
    ("startup_packet", startup_packet),
    ("frontend_messages", frontend_messages),
    ("backend_messages", backend_messages),
    ("config_ini", config_ini),
    ("auth_file", auth_file),
    ("hba", hba),
    ("scram", scram),
    ("connstr", connstr),
    ("split_verdict", split_verdict),
];

/// Largest message the fuzzed readers take, as the relay's client side bounds it.
const MAX_MESSAGE: usize = 1 << 20;

/// Runs a future that never waits: the readers here read from a byte slice.
fn now<F: Future>(f: F) -> Option<F::Output> {
    let mut f = pin!(f);
    match f.as_mut().poll(&mut Context::from_waker(Waker::noop())) {
        Poll::Ready(v) => Some(v),
        Poll::Pending => None,
    }
}

/// What a client sends before it is logged in: startup packets (SSLRequest and
/// GSSENCRequest may come first, as in `client::login`), the parameters and `options`.
pub fn startup_packet(data: &[u8]) {
    let mut r = data;
    let mut buf = BytesMut::new();
    while let Some(Ok(payload)) = now(read_startup_packet(&mut r, &mut buf, MAX_STARTUP_PACKET)) {
        match startup::parse(&payload) {
            Ok(StartupPacket::SslRequest | StartupPacket::GssEncRequest) => continue,
            Ok(StartupPacket::Startup { .. }) => {}
            Ok(StartupPacket::Cancel { .. }) | Err(_) => return,
        }
        let mut requested = ParamSet::default();
        let mut settings = Gucs::default();
        for (name, value) in startup::params(&payload) {
            match name {
                "options" => {
                    for (n, v) in crate::gucs::from_options(value).unwrap_or_default() {
                        crate::client::login::startup_setting(
                            &mut requested,
                            &mut settings,
                            &n,
                            &v,
                        );
                    }
                }
                n => crate::client::login::startup_setting(&mut requested, &mut settings, n, value),
            }
        }
        // The settings a client made are replayed on every server it is lent.
        let _ = crate::gucs::sync_sql(None, Some(&std::sync::Arc::new(settings)));
        return;
    }
}

/// A client's messages once logged in, framed as the relay frames them (the first byte
/// picks how: whole bodies, or only the prefixes the relay looks at), through every
/// parser that looks inside them and the prepared-statement rewriting.
pub fn frontend_messages(data: &[u8]) {
    let Some((&mode, stream)) = data.split_first() else {
        return;
    };
    let peek = mode & 1 != 0;
    let mut framer = Framer::default();
    let mut p = ClientStatements::default();
    let mut server = ServerStatements::default();
    let cx = RewriteContext {
        status: if mode & 2 != 0 { b'E' } else { b'I' },
        cap: usize::from(mode >> 4) + 1,
        ahead: mode & 4 != 0,
        unsynced: mode & 8 != 0,
        whole: true,
    };
    let mut out = BytesMut::new();
    let _ = rewrite::answer_alone(stream, &mut p, &mut out);
    if crate::client::may_listen(stream) {
        let _ = crate::client::listen_request(stream);
    }
    loop {
        let wants = |tag| {
            if peek {
                crate::client::client_wants(tag)
            } else {
                usize::MAX
            }
        };
        let frame = match framer.next_peek(stream, MAX_MESSAGE, wants) {
            Ok(Some(f)) => f,
            _ => return,
        };
        let Some(range) = frame.body.clone() else {
            continue;
        };
        let body = &stream[range];
        client_message(frame.tag, body);
        out.clear();
        let server = (mode & 4 == 0).then_some(&mut server);
        match rewrite::client_message(frame.tag, body, &mut p, server, &cx, &mut out) {
            Edit::Keep | Edit::Replace | Edit::Hold | Edit::Drop | Edit::Before => {}
        }
    }
}

/// The stateless readers of one client message.
fn client_message(tag: u8, body: &[u8]) {
    match tag {
        b'P' => {
            if let Some((_, rest)) = messages::parse_parts(body) {
                let sql = rest.split(|&b| b == 0).next().unwrap_or_default();
                let _ = effects::effects(sql, true);
            }
        }
        b'B' => {
            if let Some((_, _, rest)) = messages::bind_parts(body) {
                let stmt = effects::effects(b"select set_config($1, $2, $3)", true);
                Effects::default().bind(&stmt, rest);
            }
        }
        b'D' | b'C' => {
            let _ = messages::target_parts(body);
        }
        b'Q' => {
            let sql = body.strip_suffix(&[0]).unwrap_or(body);
            let _ = queries::query_kind(body);
            let _ = effects::effects(sql, true);
            let _ = effects::effects(sql, false);
            if let Ok(text) = std::str::from_utf8(sql) {
                let _ = crate::sql::listen_only(text);
                let _ = crate::sql::unlistens(text);
            }
        }
        b'p' => {
            // As a SASLInitialResponse, when SCRAM-SHA-256-PLUS was offered.
            if let Ok(first) = crate::client::login::sasl_initial_response(body, true) {
                let mut session = ServerSession::with_nonce(rfc_secret().clone(), "n");
                let _ = session.client_first(first);
            }
        }
        _ => {}
    }
}

/// What a server sends: its login (authentication requests, ParameterStatus,
/// BackendKeyData, errors) as `server::Login` reads it, then the replies to a client's
/// extended-protocol batch, matched against what the client is owed.
pub fn backend_messages(data: &[u8]) {
    let mut r = data;
    let mut buf = BytesMut::new();
    let md5 = Secret::parse("md5a1b2c3d4e5f60718293a4b5c6d7e8f9");
    let keys = Credential::Keys {
        client_key: [1; 32],
        server_key: [2; 32],
    };
    // As over TLS: a server offering SCRAM-SHA-256-PLUS is taken up on it.
    let binding = weir_auth::scram::Binding::EndPoint(vec![7; 32]);
    let mut login = crate::server::Login::new("user", Some(&md5), Some(keys), binding);
    let mut out = BytesMut::new();
    loop {
        let Some(Ok(msg)) = now(read_message(&mut r, &mut buf, MAX_MESSAGE)) else {
            return;
        };
        out.clear();
        match login.step(msg.tag, msg.body, &mut out) {
            Ok(true) => break,
            Ok(false) => {}
            Err(_) => break,
        }
    }
    // The client prepared, bound, described and ran a statement, then synced.
    let mut p = ClientStatements::default();
    let mut server = ServerStatements::default();
    let cx = RewriteContext {
        status: b'I',
        cap: 4,
        ahead: false,
        unsynced: false,
        whole: true,
    };
    for (tag, body) in [
        (b'P', &b"s1\0select $1\0\0\0"[..]),
        (b'B', b"\0s1\0\0\0\0\x01\0\0\0\x011\0\0"),
        (b'D', b"Ss1\0"),
        (b'E', b"\0\0\0\0\0"),
        (b'C', b"Ss1\0"),
        (b'S', b""),
    ] {
        out.clear();
        p.retry.batch_starts(tag, body, true);
        let _ = rewrite::client_message(tag, body, &mut p, Some(&mut server), &cx, &mut out);
    }
    loop {
        let Some(Ok(msg)) = now(read_message(&mut r, &mut buf, MAX_MESSAGE)) else {
            return;
        };
        server_message(msg.tag, &msg.body);
        if answers::synth_due(&p) {
            out.clear();
            let _ = answers::take_synths(&mut p, b'I', &mut out);
        }
        match answers::server_message(msg.tag, Some(&msg.body), &mut p, &mut server, true) {
            ServerEdit::Keep
            | ServerEdit::Remove
            | ServerEdit::Replace(_)
            | ServerEdit::Retry(_)
            | ServerEdit::Retried => {}
        }
    }
}

/// The stateless readers of one server message.
fn server_message(tag: u8, body: &Bytes) {
    match tag {
        b'E' | b'N' => {
            let _ = PgError::parse(body);
            let _ = retry::is_stale(body);
        }
        b'S' => {
            let _ = ParamSet::default().apply_status(body);
        }
        b'D' => {
            // As a row of the settings read back after a transaction (client::state).
            if let Some(row) = crate::server::data_row(body) {
                let mut cols = row.into_iter();
                if let (Some(Some(name)), Some(value)) = (cols.next(), cols.next()) {
                    let _ = crate::gucs::pin_bits(value.as_deref().unwrap_or_default());
                    let mut gucs = Gucs::default();
                    gucs.put(&name, value.as_deref());
                    let _ = crate::gucs::sync_sql(None, Some(&std::sync::Arc::new(gucs)));
                }
            }
            let _ = crate::auth_query::parse_row(body.clone());
        }
        _ => {}
    }
}

/// pgbouncer.ini text (`%include` is refused: no file is opened).
pub fn config_ini(data: &[u8]) {
    if let Ok(text) = std::str::from_utf8(data) {
        let _ = weir_config::load_str(text, Path::new("fuzz.ini"));
    }
}

/// userlist.txt text, and each secret in it as a login would read it.
pub fn auth_file(data: &[u8]) {
    let Ok(text) = std::str::from_utf8(data) else {
        return;
    };
    let loaded = weir_config::parse_auth_file(text, Path::new("userlist.txt"));
    // SCRAM verification runs PBKDF2 (thousands of hashes): a few users, cheap counts.
    for (user, secret) in loaded.users.iter().take(4) {
        let secret = Secret::parse(secret);
        if !matches!(&secret, Secret::Scram(s) if s.iterations > 4096) {
            let _ = weir_auth::plain_verify(user, &secret, b"password");
        }
        let _ = weir_auth::md5_verify(user, &secret, [1, 2, 3, 4], b"md5abc");
        if let Secret::Scram(s) = secret {
            let _ = ServerSession::from_scram(s).client_first(b"n,,n=,r=abc");
        }
    }
}

/// pg_hba.conf text, then pg_ident.conf text after a 0xff byte. `@file` names open
/// files: inputs with any are left out.
pub fn hba(data: &[u8]) {
    if data.contains(&b'@') {
        return;
    }
    let mut parts = data.splitn(2, |&b| b == 0xff);
    let hba = parts.next().and_then(|t| std::str::from_utf8(t).ok());
    let ident = parts.next().and_then(|t| std::str::from_utf8(t).ok());
    if let Some(Ok(hba)) = hba.map(|t| weir_config::hba::Hba::parse(t, Path::new("/nonexistent"))) {
        for addr in [
            None,
            Some([127, 0, 0, 1].into()),
            Some([0u16, 0, 0, 0, 0, 0, 0, 1].into()),
        ] {
            let _ = hba.find(&weir_config::hba::Conn {
                addr,
                tls: addr.is_some(),
                database: "db",
                user: "user",
                physical_replication: addr.is_none(),
            });
        }
    }
    if let Some(Ok(ident)) = ident.map(weir_config::hba::Ident::parse) {
        let _ = ident.allows("map", "root", "user");
    }
}

/// The RFC 7677 verifier ("pencil"), made once: PBKDF2 is the slow part of SCRAM.
fn rfc_secret() -> &'static ScramSecret {
    static SECRET: LazyLock<ScramSecret> = LazyLock::new(|| {
        let salt = [
            91, 109, 153, 104, 157, 18, 53, 142, 236, 160, 75, 20, 18, 54, 250, 129,
        ];
        weir_auth::scram_secret("pencil", &salt, 4096)
    });
    &SECRET
}

/// The RFC 7677 keys for "pencil", as `Credential::Keys`: no PBKDF2 on the client side.
const RFC_CLIENT_KEY: [u8; 32] = [
    166, 15, 201, 35, 214, 126, 134, 68, 169, 45, 22, 185, 110, 218, 94, 244, 101, 107, 12, 114,
    92, 72, 67, 116, 190, 37, 83, 85, 118, 153, 110, 139,
];
const RFC_SERVER_KEY: [u8; 32] = [
    193, 243, 203, 193, 193, 58, 157, 53, 161, 76, 9, 144, 238, 217, 118, 41, 234, 34, 88, 99, 229,
    102, 164, 49, 74, 185, 159, 63, 0, 229, 217, 213,
];

/// A SCRAM exchange with the RFC 7677 nonces, its four messages separated by 0xff bytes:
/// client-first and client-final to Weir as the server (with and without channel
/// binding), server-first and server-final to Weir as the client.
pub fn scram(data: &[u8]) {
    let mut parts = data.split(|&b| b == 0xff);
    let client_first = parts.next().unwrap_or_default();
    let client_final = parts.next().unwrap_or_default();
    let server_first = parts.next().unwrap_or_default();
    let server_final = parts.next().unwrap_or_default();
    let server_nonce = "%hvYDpWUa2RaTCAfuxFIlj)hNlF$k0";
    for binding in [None, Some(b"end-point".to_vec())] {
        let mut server = ServerSession::with_nonce(rfc_secret().clone(), server_nonce);
        if let Some(b) = binding {
            server = server.with_channel_binding(b);
        }
        if server.client_first(client_first).is_ok() {
            let _ = server.client_final(client_final);
        }
    }
    let keys = Credential::Keys {
        client_key: RFC_CLIENT_KEY,
        server_key: RFC_SERVER_KEY,
    };
    let mut client = ClientSession::with_nonce(keys, "user", "rOprNGfwEbeRWgbNEkqO".into());
    let _ = client.client_first();
    if client.server_first(server_first).is_ok() {
        let _ = client.server_final(server_final);
    }
    if let Ok(text) = std::str::from_utf8(client_first) {
        let _ = ScramSecret::parse(text);
    }
}

/// A `[databases]` connection string, split as a key=value list and read as an entry.
pub fn connstr(data: &[u8]) {
    let Ok(text) = std::str::from_utf8(data) else {
        return;
    };
    let _ = weir_config::split_connstr(text);
    if !text.contains('\n') {
        let ini = format!("[pgbouncer]\n[databases]\ndb = {text}\n");
        let _ = weir_config::load_str(&ini, Path::new("fuzz.ini"));
    }
}

/// read_write_split's view of a query text from a client: the cache key, the first-word
/// shortcut and PostgreSQL's parser (libpg_query) on arbitrary bytes. Also checks what
/// routing relies on: a text the parser reads as a write is never given a cached verdict
/// of read (say by sharing a key with a read). A text the parser rejects may get any
/// verdict: the server rejects it wherever it goes.
pub fn split_verdict(data: &[u8]) {
    use crate::split::Class;
    let v = crate::split::verdicts::verdict(data);
    let _ = crate::split::verdicts::normalize(data, &mut Vec::new());
    let Ok(text) = std::str::from_utf8(data) else {
        return;
    };
    if data.len() > crate::split::verdicts::MAX_PARSED || pg_query::parse(text, 0).is_err() {
        return;
    }
    let direct = crate::split::classify::classify(text);
    assert!(
        direct.class != Class::Write || v.class == Class::Write,
        "cached verdict {v:?} for a text the parser reads as a write"
    );
    assert!(
        v.class != Class::Read || direct.class != Class::Read || v.calls == direct.calls,
        "cached verdict {v:?} calls other functions than the parser's {direct:?}"
    );
}
