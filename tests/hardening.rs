//! Hostile and careless clients (issue 12): oversized length prefixes before
//! authentication, clients that stall in a TLS handshake, and secrets that must never
//! reach the log.

mod common;

use common::tls::Certs;
use common::*;
use std::io::Write;

/// Others still get in and run a query.
fn still_serving(weir: &Weir, password: Option<&str>) {
    assert_eq!(
        psql_at(
            "127.0.0.1",
            weir.port(),
            "postgres",
            "postgres",
            password,
            "select 42"
        )
        .as_deref(),
        Ok("42")
    );
}

/// A 2 GB length prefix, in the startup packet or in the password message, is refused
/// at once (nothing that size is allocated, nothing is waited for).
#[test]
fn huge_length_prefixes_before_authentication() {
    let pg = PgServer::start();
    let weir = Weir::for_pg(&pg)
        .set("auth_type", "md5")
        .userlist(&[("postgres", "pw")])
        .start();
    let mut c = RawConn::connect(weir.port());
    c.send(&[0x7f, 0xff, 0xff, 0xff, 0, 3, 0, 0]);
    let e = c.expect_error();
    assert_eq!(
        (e.severity.as_str(), e.code.as_str()),
        ("FATAL", "08P01"),
        "{e:?}"
    );
    assert!(c.closes());

    let mut c = RawConn::connect(weir.port());
    c.send(&proto::startup_message(&[
        ("user", "postgres"),
        ("database", "postgres"),
    ]));
    assert_eq!(c.read_message_or_panic("the md5 request").tag, b'R');
    c.send(&[b'p', 0x7f, 0xff, 0xff, 0xff, 0, 0]);
    let e = c.expect_error();
    assert_eq!(
        (e.severity.as_str(), e.code.as_str()),
        ("FATAL", "08P01"),
        "{e:?}"
    );
    assert!(c.closes());
    still_serving(&weir, Some("pw"));
}

/// A client that asks for TLS and then says nothing is dropped after
/// client_login_timeout, like one that stalls anywhere else in its login.
#[test]
fn a_stalled_tls_handshake_times_out() {
    let pg = PgServer::start();
    let certs = Certs::new();
    let weir = Weir::for_pg(&pg)
        .set("client_tls_sslmode", "require")
        .set("client_tls_cert_file", certs.p("server.crt"))
        .set("client_tls_key_file", certs.p("server.key"))
        .set("client_login_timeout", 1)
        .start();
    let mut s = std::net::TcpStream::connect(("127.0.0.1", weir.port())).expect("connect");
    s.set_read_timeout(Some(std::time::Duration::from_secs(10)))
        .expect("timeout");
    s.write_all(&[0, 0, 0, 8, 4, 0xd2, 0x16, 0x2f])
        .expect("SSLRequest");
    let mut b = [0u8; 1];
    use std::io::Read;
    s.read_exact(&mut b).expect("answer");
    assert_eq!(b[0], b'S');
    // No ClientHello: Weir gives up (EOF, or a reset), well before the read timeout.
    let mut rest = Vec::new();
    let r = s.read_to_end(&mut rest);
    let timed_out = r.as_ref().is_err_and(|e| {
        matches!(
            e.kind(),
            std::io::ErrorKind::WouldBlock | std::io::ErrorKind::TimedOut
        )
    });
    assert!(!timed_out, "still open after 10 s: {r:?}");
    assert!(rest.len() < 64, "{rest:?}");
    still_serving(&weir, None);
}

/// Passwords and verifiers never reach the log, whatever the method and outcome.
#[test]
fn secrets_never_reach_the_log() {
    let pg = PgServer::start();
    pg.create_user("scrammy", "Scr4mSecret!", "scram-sha-256");
    let verifier = pg.stored_password("scrammy");
    let weir = Weir::for_pg(&pg)
        .set("auth_type", "scram-sha-256")
        .set("log_connections", 1)
        .set("log_disconnections", 1)
        .set("verbose", 2)
        .userlist(&[("postgres", "Pl4inSecret!"), ("scrammy", &verifier)])
        .start();
    for (user, pw) in [
        ("postgres", "Pl4inSecret!"),
        ("postgres", "Wr0ngSecret!"),
        ("scrammy", "Scr4mSecret!"),
        ("scrammy", "Wr0ngSecret2!"),
        ("nobody", "N0bodySecret!"),
    ] {
        let _ = psql_at(
            "127.0.0.1",
            weir.port(),
            "postgres",
            user,
            Some(pw),
            "select 1",
        );
    }
    let log = format!("{}\n{}", weir.log(), weir.stderr());
    assert!(log.contains("login attempt"), "logging is on: {log}");
    let salted = verifier.split('$').nth(2).unwrap_or("none").to_string();
    for secret in [
        "Pl4inSecret!",
        "Wr0ngSecret!",
        "Scr4mSecret!",
        "Wr0ngSecret2!",
        "N0bodySecret!",
        verifier.as_str(),
        salted.as_str(),
    ] {
        assert!(!log.contains(secret), "{secret} is in the log:\n{log}");
    }
}
