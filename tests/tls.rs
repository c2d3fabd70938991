//! TLS towards clients (issue 12): `client_tls_sslmode` with real libpq clients (psql).

mod common;

use common::tls::Certs;
use common::*;

fn with_tls(pg: &PgServer, certs: &Certs, mode: &str) -> WeirBuilder {
    Weir::for_pg(pg)
        .set("client_tls_sslmode", mode)
        .set("client_tls_cert_file", certs.p("server.crt"))
        .set("client_tls_key_file", certs.p("server.key"))
}

#[test]
fn require_takes_tls_clients_and_refuses_plain_ones() {
    let pg = PgServer::start();
    let certs = Certs::new();
    let weir = with_tls(&pg, &certs, "require").start();
    assert_eq!(
        psql_conninfo(&weir, "sslmode=require", "select 1").as_deref(),
        Ok("1")
    );
    let e = psql_conninfo(&weir, "sslmode=disable", "select 1").expect_err("plain client accepted");
    assert!(e.contains("SSL required"), "{e}");
    // The Unix socket needs no TLS, as with PgBouncer.
    let sock = weir.dir().display().to_string();
    assert_eq!(
        psql_at(&sock, weir.port(), "postgres", "postgres", None, "select 2").as_deref(),
        Ok("2")
    );
    // libpq checks the certificate against the CA and the host name.
    let full = format!(
        "sslmode=verify-full sslrootcert={} host=localhost",
        certs.p("ca.crt")
    );
    assert_eq!(psql_conninfo(&weir, &full, "select 3").as_deref(), Ok("3"));
}

/// A TLS client that closes its socket without a close_notify (what many clients do:
/// Python's ssl, a killed process) logs only the disconnection, as any other client's,
/// and no warning (PgBouncer's test_no_unexpected_eof_warning). ~1 s.
#[test]
fn a_tls_client_closing_without_close_notify_logs_no_warning() {
    let pg = PgServer::start();
    let certs = Certs::new();
    let weir = with_tls(&pg, &certs, "require").start();
    // SSLRequest, the handshake, a startup packet, its answers up to ReadyForQuery; then
    // the socket closed under the TLS session (SSLSocket.close sends no close_notify).
    let script = format!(
        r#"
import socket, ssl, struct
s = socket.create_connection(("127.0.0.1", {port}))
s.sendall(struct.pack("!ii", 8, 80877103))
assert s.recv(1) == b"S"
ctx = ssl.SSLContext(ssl.PROTOCOL_TLS_CLIENT)
ctx.check_hostname = False
ctx.verify_mode = ssl.CERT_NONE
t = ctx.wrap_socket(s)
body = struct.pack("!i", 196608) + b"user\0postgres\0database\0postgres\0application_name\0noclose\0\0"
t.sendall(struct.pack("!i", len(body) + 4) + body)
seen = b""
while b"Z\0\0\0\5I" not in seen:
    chunk = t.recv(65536)
    assert chunk, seen
    seen += chunk
t.close()
print("closed")
"#,
        port = weir.port()
    );
    let out = std::process::Command::new("python3")
        .args(["-c", &script])
        .output()
        .expect("python3");
    assert_eq!(
        String::from_utf8_lossy(&out.stdout).trim(),
        "closed",
        "{}",
        String::from_utf8_lossy(&out.stderr)
    );
    assert!(
        eventually(TIMEOUT, || weir.logfile().contains("client unexpected eof")),
        "{}",
        weir.log_tail()
    );
    let log = weir.logfile();
    let warnings: Vec<&str> = log
        .lines()
        .filter(|l| l.contains("WARNING") || l.contains(" ERROR "))
        // Weir's own at startup, when tests run as root.
        .filter(|l| !l.contains("running as root"))
        .collect();
    assert!(warnings.is_empty(), "{warnings:#?}");
}

/// Large results and COPY both ways through TLS: records that do not fit the socket at
/// once are pushed out as it drains.
#[test]
fn large_results_and_copy_over_tls() {
    let pg = PgServer::start();
    pg.exec("create table big (id int, v text)");
    let certs = Certs::new();
    let weir = with_tls(&pg, &certs, "require")
        .set("pool_mode", "transaction")
        .start();
    let sum = psql_conninfo(
        &weir,
        "sslmode=require",
        "select sum(length(repeat('x', g))) from generate_series(1, 3000) g",
    );
    assert_eq!(sum.as_deref(), Ok("4501500"));
    let rows = psql_conninfo(
        &weir,
        "sslmode=require",
        "select count(*) from (select repeat('y', 1000) from generate_series(1, 20000)) s",
    );
    assert_eq!(rows.as_deref(), Ok("20000"));
    let data: String = (0..20000)
        .map(|i| format!("{i}\t{}\n", "z".repeat(100)))
        .collect();
    let copied = psql_full(
        "127.0.0.1",
        weir.port(),
        "dbname=postgres sslmode=require",
        "postgres",
        None,
        "copy big from stdin",
        Some(data.as_bytes()),
    );
    assert!(copied.is_ok(), "{copied:?}");
    assert_eq!(
        psql_conninfo(&weir, "sslmode=require", "select count(*) from big").as_deref(),
        Ok("20000")
    );
    let out = psql_conninfo(&weir, "sslmode=require", "copy big to stdout").expect("copy out");
    assert_eq!(out.lines().count(), 20000);
}

#[test]
fn prefer_takes_both() {
    let pg = PgServer::start();
    let certs = Certs::new();
    let weir = with_tls(&pg, &certs, "prefer").start();
    assert_eq!(
        psql_conninfo(&weir, "sslmode=require", "select 1").as_deref(),
        Ok("1")
    );
    assert_eq!(
        psql_conninfo(&weir, "sslmode=disable", "select 1").as_deref(),
        Ok("1")
    );
}

/// verify-ca: the client must show a certificate the CA signed.
#[test]
fn verify_ca_needs_a_client_certificate() {
    let pg = PgServer::start();
    let certs = Certs::new();
    certs.client("client", "postgres");
    let weir = with_tls(&pg, &certs, "verify-ca")
        .set("client_tls_ca_file", certs.p("ca.crt"))
        .start();
    let e =
        psql_conninfo(&weir, "sslmode=require", "select 1").expect_err("no certificate accepted");
    assert!(!e.is_empty());
    let with_cert = format!(
        "sslmode=require sslcert={} sslkey={}",
        certs.p("client.crt"),
        certs.p("client.key")
    );
    assert_eq!(
        psql_conninfo(&weir, &with_cert, "select 1").as_deref(),
        Ok("1")
    );
    assert!(
        weir.log().contains("TLS handshake failed"),
        "{}",
        weir.log_tail()
    );
}

/// A key file that cannot be used stops Weir at startup with a message naming it.
#[test]
fn a_bad_key_file_is_a_startup_error() {
    let pg = PgServer::start();
    let certs = Certs::new();
    std::fs::write(certs.path("bad.key"), "not a key\n").expect("write");
    let mut weir = with_tls(&pg, &certs, "require")
        .set("client_tls_key_file", certs.p("bad.key"))
        .spawn();
    let status = weir.wait_exit(std::time::Duration::from_secs(10));
    assert!(status.is_some_and(|s| !s.success()), "weir kept running");
    let err = weir.stderr();
    assert!(err.contains("bad.key"), "{err}");
    // PgBouncer's words.
    assert!(err.contains("TLS setup failed: client TLS: "), "{err}");
    let mut weir = with_tls(&pg, &certs, "require")
        .set("client_tls_ciphers", "ECDHE-RSA-AES128-GCM-SHA257")
        .spawn();
    assert!(weir
        .wait_exit(std::time::Duration::from_secs(10))
        .is_some_and(|s| !s.success()));
    assert!(weir
        .stderr()
        .contains("unknown TLS cipher: ECDHE-RSA-AES128-GCM-SHA257"));
}

/// SCRAM over TLS: SCRAM-SHA-256-PLUS is offered and libpq binds to Weir's certificate
/// (channel_binding=require fails unless the binding is checked and correct); without TLS
/// a client that requires binding is refused.
#[test]
fn scram_with_channel_binding() {
    let pg = PgServer::start();
    pg.create_user("bound", "b0und!", "scram-sha-256");
    let verifier = pg.stored_password("bound");
    let certs = Certs::new();
    let weir = with_tls(&pg, &certs, "prefer")
        .set("auth_type", "scram-sha-256")
        .userlist(&[("bound", &verifier)])
        .start();
    let run = |conninfo: &str, pw: &str| {
        psql_at(
            "127.0.0.1",
            weir.port(),
            &format!("dbname=postgres {conninfo}"),
            "bound",
            Some(pw),
            "select current_user",
        )
    };
    assert_eq!(
        run("sslmode=require channel_binding=require", "b0und!").as_deref(),
        Ok("bound")
    );
    let e = run("sslmode=require channel_binding=require", "wrong").expect_err("wrong password");
    assert!(e.contains("SASL authentication failed"), "{e}");
    assert_eq!(
        run("sslmode=require channel_binding=disable", "b0und!").as_deref(),
        Ok("bound")
    );
    let e = run("sslmode=disable channel_binding=require", "b0und!").expect_err("no TLS");
    assert!(e.contains("channel binding"), "{e}");
}

/// SIGHUP re-reads the certificate and key: new clients get the new certificate, and a
/// client connected over TLS before keeps its session.
#[test]
fn reload_takes_new_certificates_without_dropping_clients() {
    use std::io::{BufRead, BufReader, Write};
    let pg = PgServer::start();
    let old = Certs::new();
    let new = Certs::new();
    let live = std::env::temp_dir().join(format!("weir-live-certs-{}", std::process::id()));
    std::fs::create_dir_all(&live).expect("dir");
    let install = |c: &Certs| {
        for f in ["server.crt", "server.key"] {
            std::fs::copy(c.path(f), live.join(f)).expect("copy");
        }
    };
    install(&old);
    let builder = Weir::for_pg(&pg)
        .set("client_tls_sslmode", "require")
        .set("client_tls_cert_file", live.join("server.crt").display())
        .set("client_tls_key_file", live.join("server.key").display());
    let mut weir = builder.clone().start();
    let verify = |c: &Certs| {
        format!(
            "sslmode=verify-full host=localhost sslrootcert={}",
            c.p("ca.crt")
        )
    };
    assert_eq!(
        psql_conninfo(&weir, &verify(&old), "select 1").as_deref(),
        Ok("1")
    );
    // A long-lived TLS client: psql reading its queries from a pipe.
    let mut held = clean_command("psql")
        .args(["-X", "-A", "-t", "-q", "-h", "127.0.0.1", "-p"])
        .arg(weir.port().to_string())
        .args(["-U", "postgres", "-d"])
        .arg(format!("dbname=postgres {}", verify(&old)))
        .stdin(std::process::Stdio::piped())
        .stdout(std::process::Stdio::piped())
        .spawn()
        .expect("psql");
    let mut to = held.stdin.take().expect("stdin");
    let mut from = BufReader::new(held.stdout.take().expect("stdout"));
    let mut ask = |sql: &str| {
        writeln!(to, "{sql}").expect("write");
        to.flush().expect("flush");
        let mut line = String::new();
        from.read_line(&mut line).expect("read");
        line.trim().to_string()
    };
    assert_eq!(ask("select 'before';"), "before");
    install(&new);
    weir.reload_with(builder);
    assert!(
        eventually(std::time::Duration::from_secs(10), || psql_conninfo(
            &weir,
            &verify(&new),
            "select 1"
        )
        .is_ok()),
        "the new certificate is not served: {}",
        weir.log_tail()
    );
    let e = psql_conninfo(&weir, &verify(&old), "select 1").expect_err("old CA still accepted");
    assert!(e.contains("certificate verify failed"), "{e}");
    assert_eq!(ask("select 'after';"), "after");
    drop(to);
    let _ = held.wait();
    let _ = std::fs::remove_dir_all(&live);
}

/// X.509 v1 certificates towards clients (issue 26). Weir's own certificate may be v1:
/// rustls refused to load it (its key check parses it with webpki), but it is libpq
/// (OpenSSL) that verifies it, and verify-full takes it (by its common name, as it has
/// no subjectAltName).
#[test]
fn a_v1_certificate_of_weir_is_shown_to_clients() {
    let pg = PgServer::start();
    let certs = Certs::new();
    certs.v1_signed("weir-v1", "localhost");
    assert!(certs.is_v1("weir-v1.crt"));
    let weir = Weir::for_pg(&pg)
        .set("client_tls_sslmode", "require")
        .set("client_tls_cert_file", certs.p("weir-v1.crt"))
        .set("client_tls_key_file", certs.p("weir-v1.key"))
        .start();
    let full = format!(
        "sslmode=verify-full sslrootcert={} host=localhost",
        certs.p("ca.crt")
    );
    assert_eq!(psql_conninfo(&weir, &full, "select 1").as_deref(), Ok("1"));
    let e = psql_conninfo(&weir, "sslmode=disable", "select 1").expect_err("plain client");
    assert!(e.contains("SSL required"), "{e}");
}

/// A v1 CA: libpq verifies Weir's v3 certificate it signed, and as client_tls_ca_file
/// it is a trust anchor for clients' v3 certificates under verify-ca. A client's own v1
/// certificate cannot be verified by rustls: the login is refused, and the log says why
/// and how to reissue it rather than "UnsupportedCertVersion".
#[test]
fn v1_ca_and_v1_client_certificates() {
    let pg = PgServer::start();
    let certs = Certs::with_v1_ca();
    assert!(certs.is_v1("ca.crt"));
    certs.client("client", "postgres");
    certs.v1_signed("client-v1", "postgres");
    assert!(certs.is_v1("client-v1.crt"));
    let weir = with_tls(&pg, &certs, "verify-ca")
        .set("client_tls_ca_file", certs.p("ca.crt"))
        .start();
    let conninfo = |cert: &str| {
        format!(
            "sslmode=verify-full sslrootcert={} host=localhost sslcert={} sslkey={}",
            certs.p("ca.crt"),
            certs.p(&format!("{cert}.crt")),
            certs.p(&format!("{cert}.key"))
        )
    };
    assert_eq!(
        psql_conninfo(&weir, &conninfo("client"), "select 1").as_deref(),
        Ok("1")
    );
    let e = psql_conninfo(&weir, &conninfo("client-v1"), "select 1")
        .expect_err("a v1 client certificate accepted unverified");
    assert!(!e.is_empty());
    assert!(
        weir.log().contains(
            "the client's certificate is X.509 v1, which rustls cannot verify; reissue it as X.509 v3"
        ),
        "{}",
        weir.log_tail()
    );
}
