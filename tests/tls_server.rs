//! TLS towards servers (issue 12): `server_tls_sslmode` and its files against a real
//! PostgreSQL that takes only TLS logins (pg_hba `hostssl` only), SCRAM-SHA-256-PLUS
//! towards it, client certificates, and the data path over TLS.

mod common;

use common::console;
use common::proto::RawConn;
use common::tls::Certs;
use common::*;

const PW: &str = "s3cret-tls";

/// A PostgreSQL with TLS on (the certificate `server_cert`/`server_key` of `certs`) that
/// lets TCP clients in only over TLS with SCRAM, and a SCRAM role `app_s`.
fn tls_pg(certs: &Certs, server_cert: &str) -> PgServer {
    let pg = PgServer::start();
    pg.enable_tls(
        &certs.path(&format!("{server_cert}.crt")),
        &certs.path(&format!("{server_cert}.key")),
        &certs.path("ca.crt"),
    );
    pg.create_user("app_s", PW, "scram-sha-256");
    pg.set_hba_only(&[
        "hostssl all all 127.0.0.1/32 scram-sha-256",
        "hostssl all all ::1/128 scram-sha-256",
    ]);
    pg
}

/// Weir in front of `pg` reached as `host`, logging in as app_s with its password.
fn weir_to(pg: &PgServer, host: &str, mode: &str) -> WeirBuilder {
    Weir::builder()
        .database(
            "postgres",
            &format!("host={host} port={} dbname=postgres", pg.port()),
        )
        .set("server_tls_sslmode", mode)
        .set("admin_users", "postgres")
        .set("verbose", 2)
        .userlist(&[("app_s", PW), ("postgres", "")])
}

fn query(weir: &Weir, sql: &str) -> Result<String, String> {
    psql_via(weir, "postgres", "app_s", sql)
}

/// Whether the session PostgreSQL sees through Weir is in TLS (pg_stat_ssl).
fn session_ssl(weir: &Weir) -> Result<String, String> {
    query(
        weir,
        "select ssl, coalesce(version, '') from pg_stat_ssl where pid = pg_backend_pid()",
    )
}

/// SHOW SERVERS' tls column for app_s's servers.
fn servers_tls(weir: &Weir) -> Vec<String> {
    let mut c = RawConn::startup(weir.port(), "postgres", "pgbouncer", &[])
        .unwrap_or_else(|e| panic!("console login failed: {e:?}"));
    let res = console::ok(&mut c, "show servers");
    let tls = res.col("tls");
    res.find("user", "app_s")
        .iter()
        .map(|r| r[tls].clone().unwrap_or_default())
        .collect()
}

fn login_error(weir: &Weir) -> common::proto::ErrorFields {
    match RawConn::startup(weir.port(), "app_s", "postgres", &[]) {
        Ok(_) => panic!("login through Weir succeeded: {}", weir.log_tail()),
        Err(e) => e,
    }
}

/// Every mode against a server that requires TLS: disable is refused by the server
/// (its pg_hba has no entry without encryption), the others log in over TLS, allow after
/// its plain attempt was refused.
#[test]
fn modes_against_a_server_that_requires_tls() {
    let certs = Certs::new();
    let pg = tls_pg(&certs, "server");
    for mode in ["allow", "prefer", "require", "verify-ca", "verify-full"] {
        let weir = weir_to(&pg, "127.0.0.1", mode)
            .set("server_tls_ca_file", certs.p("ca.crt"))
            .start();
        let ssl = session_ssl(&weir).unwrap_or_else(|e| panic!("{mode}: {e}"));
        assert!(ssl.starts_with("t|TLSv1."), "{mode}: {ssl}");
        let tls = servers_tls(&weir);
        assert_eq!(tls.len(), 1, "{mode}: {tls:?}");
        assert!(
            tls[0].starts_with("TLSv1.3/TLS_") && tls[0].contains("/ECDH="),
            "{mode}: {tls:?}"
        );
    }
    let weir = weir_to(&pg, "127.0.0.1", "disable").start();
    let e = login_error(&weir);
    assert_eq!(e.code, "28000", "{e:?}");
    assert!(e.message.contains("no encryption"), "{e:?}");
}

/// Against a server without TLS: prefer and allow go on in the clear (SHOW SERVERS tls
/// empty); require refuses, the waiting client gets 08006 at once rather than hanging,
/// and the log says why once, not for every client while the retry delay runs.
#[test]
fn modes_against_a_plain_server() {
    let pg = PgServer::start();
    pg.create_user("app_s", PW, "scram-sha-256");
    for mode in ["allow", "prefer"] {
        let weir = weir_to(&pg, "127.0.0.1", mode).start();
        assert_eq!(
            session_ssl(&weir).as_deref(),
            Ok("f|"),
            "{mode}: {}",
            weir.log_tail()
        );
        assert_eq!(servers_tls(&weir), vec![String::new()], "{mode}");
    }
    // allow tries TLS after a refused plain login; with no TLS there either, the client
    // hears of the refusal, not of the missing TLS.
    pg.set_hba(&["host all app_s 127.0.0.1/32 scram-sha-256"]);
    let weir = weir_to(&pg, "127.0.0.1", "allow")
        .userlist(&[("app_s", "wrong"), ("postgres", "")])
        .start();
    let e = login_error(&weir);
    assert_eq!(e.code, "28P01", "{e:?}");
    let weir = weir_to(&pg, "127.0.0.1", "require").start();
    let started = std::time::Instant::now();
    let e = login_error(&weir);
    assert!(started.elapsed() < std::time::Duration::from_secs(5));
    assert_eq!(e.code, "08006", "{e:?}");
    assert!(
        e.message
            .contains("server does not support TLS, and server_tls_sslmode is require"),
        "{e:?}"
    );
    let again = login_error(&weir);
    assert_eq!(again.code, "08006");
    let log = weir.logfile();
    assert_eq!(
        log.matches("WARNING server login failed: server does not support TLS")
            .count(),
        1,
        "{log}"
    );
    assert_eq!(pg.count_backends("app_s"), 0);
}

/// verify-ca refuses a certificate from another CA; verify-full refuses one for another
/// name (and verify-ca takes it), and takes the right one by DNS name and by IP address.
#[test]
fn certificate_checks() {
    let certs = Certs::new();
    certs.server("elsewhere", "elsewhere.test");
    let other_ca = Certs::new();
    let pg = tls_pg(&certs, "elsewhere");
    let weir = weir_to(&pg, "127.0.0.1", "verify-ca")
        .set("server_tls_ca_file", other_ca.p("ca.crt"))
        .start();
    let e = login_error(&weir);
    assert_eq!(e.code, "08006", "{e:?}");
    assert!(e.message.contains("TLS handshake"), "{e:?}");
    // The other CA has the same name: its signature is what fails.
    assert!(e.message.contains("invalid peer certificate"), "{e:?}");
    let weir = weir_to(&pg, "127.0.0.1", "verify-full")
        .set("server_tls_ca_file", certs.p("ca.crt"))
        .start();
    let e = login_error(&weir);
    assert!(e.message.contains("not valid for name"), "{e:?}");
    let weir = weir_to(&pg, "127.0.0.1", "verify-ca")
        .set("server_tls_ca_file", certs.p("ca.crt"))
        .start();
    assert!(session_ssl(&weir).is_ok_and(|s| s.starts_with('t')));
    // The certificate for localhost and 127.0.0.1.
    pg.enable_tls(
        &certs.path("server.crt"),
        &certs.path("server.key"),
        &certs.path("ca.crt"),
    );
    for host in ["localhost", "127.0.0.1"] {
        let weir = weir_to(&pg, host, "verify-full")
            .set("server_tls_ca_file", certs.p("ca.crt"))
            .start();
        let ssl = session_ssl(&weir);
        assert!(
            ssl.as_ref().is_ok_and(|s| s.starts_with('t')),
            "{host}: {ssl:?}"
        );
    }
}

/// A bad CA file, a bad key file, or a key without its certificate stops Weir at
/// startup, naming them (only the console may give the pair one at a time).
#[test]
fn bad_files_are_startup_errors() {
    let certs = Certs::new();
    std::fs::write(certs.path("bad.crt"), "no certificate here\n").expect("write");
    let pg = PgServer::start();
    let mut weir = weir_to(&pg, "127.0.0.1", "verify-full")
        .set("server_tls_ca_file", certs.p("bad.crt"))
        .spawn();
    let st = weir.wait_exit(std::time::Duration::from_secs(10));
    assert!(st.is_some_and(|s| !s.success()), "weir kept running");
    assert!(weir.stderr().contains("bad.crt"), "{}", weir.stderr());
    let mut weir = weir_to(&pg, "127.0.0.1", "require")
        .set("server_tls_cert_file", certs.p("server.crt"))
        .set("server_tls_key_file", certs.p("bad.crt"))
        .spawn();
    assert!(weir
        .wait_exit(std::time::Duration::from_secs(10))
        .is_some_and(|s| !s.success()));
    assert!(weir.stderr().contains("bad.crt"), "{}", weir.stderr());
    let mut weir = weir_to(&pg, "127.0.0.1", "require")
        .set("server_tls_key_file", certs.p("server.key"))
        .spawn();
    assert!(weir
        .wait_exit(std::time::Duration::from_secs(10))
        .is_some_and(|s| !s.success()));
    assert!(weir.stderr().contains("go together"), "{}", weir.stderr());
}

/// A PostgreSQL that lets certuser in by its certificate only (pg_hba `cert`), and Weir
/// in front of it under verify-full, without a certificate yet.
fn cert_login(certs: &Certs) -> (PgServer, WeirBuilder) {
    let pg = tls_pg(certs, "server");
    pg.exec("create role certuser login");
    pg.set_hba_only(&["hostssl all certuser 127.0.0.1/32 cert"]);
    let builder = Weir::builder()
        .database("postgres", &pg.connstr())
        .set("server_tls_sslmode", "verify-full")
        .set("server_tls_ca_file", certs.p("ca.crt"))
        .userlist(&[("certuser", "")]);
    (pg, builder)
}

/// pg_hba `cert`: Weir logs in with server_tls_cert_file/server_tls_key_file and no
/// password; without them the server refuses.
#[test]
fn client_certificate_login() {
    let certs = Certs::new();
    certs.client("weir-client", "certuser");
    let (_pg, builder) = cert_login(&certs);
    let weir = builder
        .clone()
        .set("server_tls_cert_file", certs.p("weir-client.crt"))
        .set("server_tls_key_file", certs.p("weir-client.key"))
        .start();
    assert_eq!(
        psql_via(&weir, "postgres", "certuser", "select current_user").as_deref(),
        Ok("certuser")
    );
    let weir = builder.set("admin_users", "certuser").start();
    let e = psql_via(&weir, "postgres", "certuser", "select 1").expect_err("no certificate");
    assert!(e.contains("certificate"), "{e}");
    // The console sets the pair one at a time, as PgBouncer's suite does
    // (test_server_ssl_auth): the key alone offers nothing yet, the pair is used.
    let mut console = RawConn::startup(weir.port(), "certuser", "pgbouncer", &[])
        .unwrap_or_else(|e| panic!("console login failed: {e:?}"));
    let key = certs.p("weir-client.key");
    console::ok(&mut console, &format!("SET server_tls_key_file = '{key}'"));
    let e = psql_via(&weir, "postgres", "certuser", "select 1").expect_err("half a pair");
    assert!(e.contains("certificate"), "{e}");
    let cert = certs.p("weir-client.crt");
    console::ok(
        &mut console,
        &format!("SET server_tls_cert_file = '{cert}'"),
    );
    assert_eq!(
        psql_via(&weir, "postgres", "certuser", "select current_user").as_deref(),
        Ok("certuser")
    );
}

/// Towards a TLS server offering SCRAM-SHA-256-PLUS Weir binds to its certificate; the
/// login succeeds (PostgreSQL checks the binding data against its own certificate).
#[test]
fn scram_plus_towards_the_server() {
    let certs = Certs::new();
    let pg = tls_pg(&certs, "server");
    let weir = weir_to(&pg, "127.0.0.1", "require").start();
    assert_eq!(query(&weir, "select current_user").as_deref(), Ok("app_s"));
    let log = weir.logfile();
    assert!(log.contains("SCRAM login as SCRAM-SHA-256-PLUS"), "{log}");
    // A certificate signed with SHA-384: the binding data is its SHA-384 hash (RFC 5929),
    // which PostgreSQL checks.
    certs.server_sha384("server384");
    pg.enable_tls(
        &certs.path("server384.crt"),
        &certs.path("server384.key"),
        &certs.path("ca.crt"),
    );
    let weir = weir_to(&pg, "127.0.0.1", "verify-full")
        .set("server_tls_ca_file", certs.p("ca.crt"))
        .start();
    assert_eq!(
        query(&weir, "select current_user").as_deref(),
        Ok("app_s"),
        "{}",
        weir.log_tail()
    );
    assert!(weir.logfile().contains("SCRAM login as SCRAM-SHA-256-PLUS"));
    // In the clear PostgreSQL offers no PLUS: plain SCRAM.
    let plain = PgServer::start();
    plain.create_user("app_s", PW, "scram-sha-256");
    plain.set_hba(&["host all app_s 127.0.0.1/32 scram-sha-256"]);
    let weir = weir_to(&plain, "127.0.0.1", "prefer").start();
    assert_eq!(query(&weir, "select current_user").as_deref(), Ok("app_s"));
    let log = weir.logfile();
    assert!(log.contains("SCRAM login as SCRAM-SHA-256"), "{log}");
    assert!(!log.contains("SCRAM-SHA-256-PLUS"), "{log}");
}

/// Large results and COPY both ways over server TLS (transaction pooling, so servers are
/// handed between clients with their TLS sessions).
#[test]
fn large_results_and_copy_over_server_tls() {
    let certs = Certs::new();
    let pg = tls_pg(&certs, "server");
    pg.exec("create table big (id int, v text); grant all on big to app_s");
    let weir = weir_to(&pg, "127.0.0.1", "require")
        .set("pool_mode", "transaction")
        .start();
    assert_eq!(
        query(
            &weir,
            "select sum(length(repeat('x', g))) from generate_series(1, 3000) g"
        )
        .as_deref(),
        Ok("4501500")
    );
    let big = query(
        &weir,
        "select string_agg(repeat('y', 1000), '') from generate_series(1, 20000)",
    )
    .expect("20 MB value");
    assert_eq!(big.len(), 20_000_000);
    let data: String = (0..20000)
        .map(|i| format!("{i}\t{}\n", "z".repeat(100)))
        .collect();
    let copied = psql_full(
        "127.0.0.1",
        weir.port(),
        "postgres",
        "app_s",
        None,
        "copy big from stdin",
        Some(data.as_bytes()),
    );
    assert!(copied.is_ok(), "{copied:?}");
    assert_eq!(
        query(&weir, "select count(*) from big").as_deref(),
        Ok("20000")
    );
    let out = query(&weir, "copy big to stdout").expect("copy out");
    assert_eq!(out.lines().count(), 20000);
    assert!(servers_tls(&weir).iter().all(|t| t.starts_with("TLSv1.3")));
}

/// A server that goes away while idle in the pool (its backend terminated) is noticed
/// at the next checkout and replaced, over TLS as in the clear.
#[test]
fn a_server_that_dies_while_idle_is_replaced() {
    let certs = Certs::new();
    let pg = tls_pg(&certs, "server");
    let weir = weir_to(&pg, "127.0.0.1", "require")
        .set("pool_mode", "transaction")
        .start();
    let first = query(&weir, "select pg_backend_pid()").expect("first");
    // An idle TLS server is seen as healthy (nothing left unread on its socket) and
    // lent again.
    assert_eq!(
        query(&weir, "select pg_backend_pid()").as_deref(),
        Ok(first.as_str())
    );
    pg.exec("select pg_terminate_backend(pid) from pg_stat_activity where usename = 'app_s'");
    assert!(eventually(TIMEOUT, || pg.count_backends("app_s") == 0));
    let second = query(&weir, "select pg_backend_pid()").expect("after the backend died");
    assert_ne!(first, second);
    assert_eq!(session_ssl(&weir).map(|s| s.starts_with('t')), Ok(true));
}

/// The whole way in TLS with SCRAM and no password in any file: psql with
/// sslmode=verify-full and channel_binding=require to Weir (client_tls, certificate for
/// localhost, a SCRAM verifier in the auth_file), Weir to a PostgreSQL that requires TLS
/// with verify-full, logging in with the keys from psql's proof, bound to PostgreSQL's
/// certificate.
#[test]
fn psql_verify_full_channel_binding_end_to_end() {
    let certs = Certs::new();
    let pg = tls_pg(&certs, "server");
    let verifier = pg.stored_password("app_s");
    assert!(verifier.starts_with("SCRAM-SHA-256$"), "{verifier}");
    let weir = Weir::builder()
        .database(
            "postgres",
            &format!("host=localhost port={} dbname=postgres", pg.port()),
        )
        .set("auth_type", "scram-sha-256")
        .set("client_tls_sslmode", "require")
        .set("client_tls_cert_file", certs.p("server.crt"))
        .set("client_tls_key_file", certs.p("server.key"))
        .set("server_tls_sslmode", "verify-full")
        .set("server_tls_ca_file", certs.p("ca.crt"))
        .set("verbose", 2)
        .userlist(&[("app_s", &verifier)])
        .start();
    let files = std::fs::read_to_string(weir.dir().join("pgbouncer.ini")).expect("ini")
        + &std::fs::read_to_string(weir.dir().join("userlist.txt")).expect("userlist");
    assert!(!files.contains(PW));
    let conninfo = format!(
        "dbname=postgres sslmode=verify-full sslrootcert={} channel_binding=require",
        certs.p("ca.crt")
    );
    let out = psql_at(
        "localhost",
        weir.port(),
        &conninfo,
        "app_s",
        Some(PW),
        "select current_user, ssl from pg_stat_ssl where pid = pg_backend_pid()",
    );
    assert_eq!(out.as_deref(), Ok("app_s|t"), "{}", weir.log_tail());
    let log = weir.logfile();
    assert!(log.contains("SCRAM login as SCRAM-SHA-256-PLUS"), "{log}");
    let e = psql_at(
        "localhost",
        weir.port(),
        &conninfo,
        "app_s",
        Some("wrong"),
        "select 1",
    )
    .expect_err("wrong password");
    assert!(e.contains("SASL authentication failed"), "{e}");
}

/// server_tls_protocols, server_tls_ciphers and server_tls13_ciphers decide what is
/// negotiated, as SHOW SERVERS shows in OpenSSL's names.
#[test]
fn protocols_and_ciphers() {
    let certs = Certs::new();
    let pg = tls_pg(&certs, "server");
    let cases = [
        (
            "tlsv1.2",
            "ECDHE-RSA-CHACHA20-POLY1305",
            None,
            "TLSv1.2/ECDHE-RSA-CHACHA20-POLY1305/ECDH=",
        ),
        (
            "tlsv1.2",
            "ECDHE-RSA-AES128-GCM-SHA256",
            None,
            "TLSv1.2/ECDHE-RSA-AES128-GCM-SHA256/ECDH=",
        ),
        (
            "secure",
            "default",
            Some("TLS_CHACHA20_POLY1305_SHA256"),
            "TLSv1.3/TLS_CHACHA20_POLY1305_SHA256/ECDH=",
        ),
        // An old pgbouncer.ini: rustls has no TLS 1.0, and 1.2 is the nearest.
        ("tlsv1.0", "default", None, "TLSv1.2/"),
    ];
    for (protocols, ciphers, tls13, want) in cases {
        let mut b = weir_to(&pg, "127.0.0.1", "require")
            .set("server_tls_protocols", protocols)
            .set("server_tls_ciphers", ciphers);
        if let Some(c) = tls13 {
            b = b.set("server_tls13_ciphers", c);
        }
        let weir = b.start();
        let ssl = session_ssl(&weir);
        assert!(ssl.as_ref().is_ok_and(|s| s.starts_with('t')), "{ssl:?}");
        let tls = servers_tls(&weir);
        assert!(
            tls.len() == 1 && tls[0].starts_with(want),
            "{want}: {tls:?}"
        );
        if protocols == "tlsv1.0" {
            assert!(
                weir.log().contains("server_tls_protocols: tlsv1.0 not supported (rustls speaks TLS 1.2 and 1.3 only); TLS 1.2 is used instead"),
                "{}",
                weir.log_tail()
            );
        }
    }
    let mut weir = weir_to(&pg, "127.0.0.1", "require")
        .set("server_tls_ciphers", "ECDHE-RSA-AES128-GCM-SHA257")
        .spawn();
    assert!(weir
        .wait_exit(std::time::Duration::from_secs(10))
        .is_some_and(|s| !s.success()));
    assert!(
        weir.stderr().contains("server TLS: unknown TLS cipher"),
        "{}",
        weir.stderr()
    );
}

/// RELOAD: raising server_tls_sslmode takes effect for new servers; a reload naming a
/// bad CA file is refused and the old settings stay.
#[test]
fn reload_changes_the_mode() {
    let certs = Certs::new();
    let pg = tls_pg(&certs, "server");
    let mut weir = weir_to(&pg, "127.0.0.1", "disable")
        .set("server_login_retry", 1)
        .start();
    assert!(query(&weir, "select 1").is_err());
    let verify = weir_to(&pg, "127.0.0.1", "verify-full")
        .set("server_login_retry", 1)
        .set("server_tls_ca_file", certs.p("ca.crt"));
    weir.reload_with(verify);
    // Once the failed login's retry delay has passed.
    assert!(
        eventually(std::time::Duration::from_secs(10), || query(
            &weir, "select 1"
        )
        .is_ok()),
        "{}",
        weir.log_tail()
    );
    std::fs::write(certs.path("bad.crt"), "nothing\n").expect("write");
    weir.reload_with(
        weir_to(&pg, "127.0.0.1", "verify-full").set("server_tls_ca_file", certs.p("bad.crt")),
    );
    assert!(eventually(TIMEOUT, || weir.logfile().contains("bad.crt")));
    // Nor does the console's SET take it.
    let mut c = RawConn::startup(weir.port(), "postgres", "pgbouncer", &[])
        .unwrap_or_else(|e| panic!("console login failed: {e:?}"));
    let set = format!("set server_tls_ca_file = '{}'", certs.p("bad.crt"));
    assert!(console::run(&mut c, &set).is_err());
    pg.exec("select pg_terminate_backend(pid) from pg_stat_activity where usename = 'app_s'");
    assert!(eventually(TIMEOUT, || pg.count_backends("app_s") == 0));
    assert_eq!(session_ssl(&weir).map(|s| s.starts_with('t')), Ok(true));
}

/// A change of a server TLS option (the console's SET, as a reload) closes the servers
/// logged in under the old settings, each logged `database configuration changed`, and
/// the next client gets a new one (PgBouncer's test_servers_disconnect_when_changing_tls_config,
/// in test_tls.py for the mode and in test_ssl.py for server_tls_protocols). ~2 s.
#[test]
fn a_server_tls_change_closes_the_servers_made_before() {
    let certs = Certs::new();
    let pg = tls_pg(&certs, "server");
    let weir = weir_to(&pg, "127.0.0.1", "require")
        .set("server_tls_ca_file", certs.p("ca.crt"))
        .start();
    let mut console = RawConn::startup(weir.port(), "postgres", "pgbouncer", &[])
        .unwrap_or_else(|e| panic!("console login failed: {e:?}"));
    let pid = || query(&weir, "select pg_backend_pid()").unwrap_or_else(|e| panic!("{e}"));
    let mut before = pid();
    for (n, set) in [
        "set server_tls_sslmode = 'verify-ca'",
        "set server_tls_protocols = 'tlsv1.3'",
    ]
    .iter()
    .enumerate()
    {
        console::ok(&mut console, set);
        assert!(
            eventually(TIMEOUT, || pg.count_backends("app_s") == 0),
            "{set} left the server open\n{}",
            weir.log_tail()
        );
        let closed = weir
            .logfile()
            .matches("database configuration changed")
            .count();
        assert_eq!(closed, n + 1, "{set}\n{}", weir.log_tail());
        let after = pid();
        assert_ne!(after, before, "{set}: the old server was lent");
        before = after;
    }
    let ssl = session_ssl(&weir).unwrap_or_else(|e| panic!("{e}"));
    assert!(ssl.starts_with('t') && ssl.contains("TLSv1.3"), "{ssl}");
}

/// The CA file in force is overwritten on disk by one that cannot be read: a SET of
/// another option neither reads it again (it used to be refused for it) nor lowers the
/// checks; a SET of a server TLS option, which would, is refused.
#[test]
fn a_bad_ca_file_on_disk_keeps_server_tls_in_force() {
    let certs = Certs::new();
    let pg = tls_pg(&certs, "server");
    let live = tempfile::Builder::new()
        .prefix("weir-live-ca-")
        .tempdir()
        .expect("tempdir");
    let ca = live.path().join("ca.crt");
    std::fs::copy(certs.path("ca.crt"), &ca).expect("copy");
    let weir = weir_to(&pg, "127.0.0.1", "verify-full")
        .set("server_tls_ca_file", ca.display())
        .start();
    assert_eq!(session_ssl(&weir).map(|s| s.starts_with('t')), Ok(true));
    std::fs::write(&ca, "nothing\n").expect("write");
    let mut c = RawConn::startup(weir.port(), "postgres", "pgbouncer", &[])
        .unwrap_or_else(|e| panic!("console login failed: {e:?}"));
    console::ok(&mut c, "SET default_pool_size = 7");
    let e = console::run(&mut c, "SET server_tls_sslmode = require").expect_err("bad CA read");
    assert_eq!(e.code, "F0000", "{e:?}");
    let cfg = console::ok(&mut c, "SHOW CONFIG");
    assert_eq!(cfg.get("key", "server_tls_sslmode", "value"), "verify-full");
    assert_eq!(cfg.get("key", "default_pool_size", "value"), "7");
    pg.exec("select pg_terminate_backend(pid) from pg_stat_activity where usename = 'app_s'");
    assert!(eventually(TIMEOUT, || pg.count_backends("app_s") == 0));
    assert_eq!(session_ssl(&weir).map(|s| s.starts_with('t')), Ok(true));
}

/// SHOW CLIENTS tls and the login log line name a TLS client's session, as PgBouncer's do;
/// /metrics counts TLS connections on both sides.
#[test]
fn show_clients_tls() {
    use std::io::{BufRead, BufReader, Write};
    let certs = Certs::new();
    let pg = tls_pg(&certs, "server");
    let http = free_port();
    let weir = weir_to(&pg, "127.0.0.1", "require")
        .set("http_listen", format!("127.0.0.1:{http}"))
        .set("client_tls_sslmode", "prefer")
        .set("client_tls_cert_file", certs.p("server.crt"))
        .set("client_tls_key_file", certs.p("server.key"))
        .start();
    let mut held = clean_command("psql")
        .args(["-X", "-A", "-t", "-q", "-h", "127.0.0.1", "-p"])
        .arg(weir.port().to_string())
        .args(["-U", "app_s", "-d", "dbname=postgres sslmode=require"])
        .stdin(std::process::Stdio::piped())
        .stdout(std::process::Stdio::piped())
        .spawn()
        .expect("psql");
    let mut to = held.stdin.take().expect("stdin");
    let mut from = BufReader::new(held.stdout.take().expect("stdout"));
    writeln!(to, "select 'in';").expect("write");
    to.flush().expect("flush");
    let mut line = String::new();
    from.read_line(&mut line).expect("read");
    assert_eq!(line.trim(), "in");
    let mut c = RawConn::startup(weir.port(), "postgres", "pgbouncer", &[])
        .unwrap_or_else(|e| panic!("console login failed: {e:?}"));
    let res = console::ok(&mut c, "show clients");
    let tls = res.get("user", "app_s", "tls");
    assert!(
        tls.starts_with("TLSv1.3/TLS_") && tls.contains("/ECDH="),
        "{tls}"
    );
    // The console client came in the clear.
    assert_eq!(res.get("user", "postgres", "tls"), "");
    assert!(
        weir.logfile().contains(&format!("user=app_s tls={tls}")),
        "{}",
        weir.logfile()
    );
    let metrics = common::http::http_get(http, "/metrics")
        .expect("/metrics")
        .body;
    let tls_connections = |side: &str| -> f64 {
        let prefix = format!("weir_tls_connections{{side=\"{side}\"}} ");
        metrics
            .lines()
            .find_map(|l| l.strip_prefix(&prefix)?.parse().ok())
            .unwrap_or_else(|| panic!("no {prefix}in\n{metrics}"))
    };
    // psql over TLS (the console client is plain); its server, over TLS too.
    assert_eq!(tls_connections("client"), 1.0);
    assert!(tls_connections("server") >= 1.0);
    drop(to);
    let _ = held.wait();
}

/// A cancel request reaches a server Weir talks to in TLS (PostgreSQL takes the request
/// in the clear on a new connection, whatever its pg_hba says).
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn cancel_reaches_a_tls_server() {
    let certs = Certs::new();
    let pg = tls_pg(&certs, "server");
    let weir = weir_to(&pg, "127.0.0.1", "require").start();
    let client = connect(weir.port(), "postgres", "app_s")
        .await
        .expect("connect");
    let token = client.cancel_token();
    let started = std::time::Instant::now();
    let sleeper = tokio::spawn(async move { client.simple_query("select pg_sleep(30)").await });
    assert!(eventually(TIMEOUT, || pg.count_backends_where(
        "query = 'select pg_sleep(30)' and state = 'active'"
    ) == 1));
    token
        .cancel_query(tokio_postgres::NoTls)
        .await
        .expect("cancel sent");
    let r = sleeper.await.expect("join");
    let e = r.expect_err("pg_sleep was not cancelled");
    assert_eq!(expect_db_error(&e).code, "57014", "{e:?}");
    assert!(started.elapsed() < std::time::Duration::from_secs(20));
}

/// LISTEN in transaction mode: the pool's listening server (crate::listen) reads its
/// notifications over TLS too.
#[test]
fn notifications_over_server_tls() {
    let certs = Certs::new();
    let pg = tls_pg(&certs, "server");
    let weir = weir_to(&pg, "127.0.0.1", "require")
        .set("pool_mode", "transaction")
        .start();
    let login = || {
        RawConn::startup(weir.port(), "app_s", "postgres", &[])
            .unwrap_or_else(|e| panic!("login: {e:?}"))
    };
    let mut listener = login();
    let mut notifier = login();
    listener.simple_query("LISTEN jobs").expect("listen");
    for payload in ["one", "two"] {
        notifier
            .simple_query(&format!("NOTIFY jobs, '{payload}'"))
            .expect("notify");
        listener.set_read_timeout(std::time::Duration::from_secs(10));
        let m = listener.read_message_or_panic("a notification");
        assert_eq!(m.tag, b'A', "{:?}", m.tag_char());
        assert!(m.body.ends_with(format!("jobs\0{payload}\0").as_bytes()));
    }
    assert!(servers_tls(&weir).iter().all(|t| t.starts_with("TLSv1.3")));
}

/// verify-full without server_tls_ca_file checks against the system's CA bundle, as
/// PgBouncer does: the test CA is not in it, so the server is refused.
#[test]
fn verify_without_a_ca_file_uses_the_system_bundle() {
    if !std::path::Path::new("/etc/ssl/certs/ca-certificates.crt").is_file() {
        eprintln!("skipped: no system CA bundle at the Debian path");
        return;
    }
    let certs = Certs::new();
    let pg = tls_pg(&certs, "server");
    let weir = weir_to(&pg, "127.0.0.1", "verify-full").start();
    let e = login_error(&weir);
    assert_eq!(e.code, "08006", "{e:?}");
    assert!(e.message.contains("UnknownIssuer"), "{e:?}");
}

/// X.509 v1 certificates towards servers (issue 26). A v1 CA in server_tls_ca_file is a
/// trust anchor like any other: verify-full takes the v3 server certificate it signed.
/// A v1 server certificate cannot be verified by rustls: verify-ca and verify-full
/// refuse it (never connecting unverified) with 08006 and a message, in the log too,
/// that names the cause and how to reissue it; require, which checks no certificate,
/// takes it as libpq does (it failed too).
#[test]
fn v1_certificates_of_servers() {
    let certs = Certs::with_v1_ca();
    assert!(certs.is_v1("ca.crt"));
    assert!(!certs.is_v1("server.crt"));
    let pg = tls_pg(&certs, "server");
    let weir = weir_to(&pg, "localhost", "verify-full")
        .set("server_tls_ca_file", certs.p("ca.crt"))
        .start();
    let ssl = session_ssl(&weir);
    assert!(ssl.as_ref().is_ok_and(|s| s.starts_with('t')), "{ssl:?}");

    certs.v1_signed("server-v1", "localhost");
    assert!(certs.is_v1("server-v1.crt"));
    pg.enable_tls(
        &certs.path("server-v1.crt"),
        &certs.path("server-v1.key"),
        &certs.path("ca.crt"),
    );
    for mode in ["verify-full", "verify-ca"] {
        let weir = weir_to(&pg, "localhost", mode)
            .set("server_tls_ca_file", certs.p("ca.crt"))
            .start();
        let e = login_error(&weir);
        assert_eq!(e.code, "08006", "{mode}: {e:?}");
        assert!(
            e.message
                .contains("the server's certificate is X.509 v1, which rustls cannot verify; reissue it as X.509 v3"),
            "{mode}: {e:?}"
        );
        assert!(
            weir.log().contains("the server's certificate is X.509 v1"),
            "{mode}: {}",
            weir.log_tail()
        );
    }
    // The handshake's signature is still checked with the certificate's key, in TLS 1.2
    // and 1.3 (rustls' own check parses the certificate with webpki and failed here).
    for (protocols, version) in [("tlsv1.3", "TLSv1.3"), ("tlsv1.2", "TLSv1.2")] {
        let weir = weir_to(&pg, "localhost", "require")
            .set("server_tls_protocols", protocols)
            .start();
        let ssl = session_ssl(&weir);
        assert_eq!(
            ssl.as_deref(),
            Ok(format!("t|{version}").as_str()),
            "{}",
            weir.log_tail()
        );
    }
}

/// A v1 certificate as Weir's own towards PostgreSQL (server_tls_cert_file, pg_hba
/// `cert`): rustls refused to load it (its key check parses it with webpki); PostgreSQL
/// (OpenSSL) verifies it, so Weir now offers it and the login succeeds. A key that is not
/// the certificate's is still refused at startup.
#[test]
fn v1_client_certificate_towards_servers() {
    let certs = Certs::new();
    certs.v1_signed("weir-client", "certuser");
    assert!(certs.is_v1("weir-client.crt"));
    let (_pg, builder) = cert_login(&certs);
    let builder = builder.set("server_tls_cert_file", certs.p("weir-client.crt"));
    let weir = builder
        .clone()
        .set("server_tls_key_file", certs.p("weir-client.key"))
        .start();
    assert_eq!(
        psql_via(&weir, "postgres", "certuser", "select current_user").as_deref(),
        Ok("certuser")
    );
    let mut weir = builder
        .set("server_tls_key_file", certs.p("server.key"))
        .spawn();
    assert!(weir
        .wait_exit(std::time::Duration::from_secs(10))
        .is_some_and(|s| !s.success()));
    assert!(
        weir.stderr()
            .contains("the private key is not the certificate's"),
        "{}",
        weir.stderr()
    );
}
