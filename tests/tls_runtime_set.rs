//! TLS towards clients changed at runtime (issue 24): the console's SET and RELOAD/SIGHUP
//! must never leave Weir admitting plaintext clients under `client_tls_sslmode = require`
//! because a certificate or key could not be used, nor show in SHOW CONFIG settings
//! that are not in force.

mod common;

use common::console::*;
use common::tls::Certs;
use common::*;

/// The console over the Unix socket, which needs no TLS whatever the mode.
fn console_unix(weir: &Weir, sql: &str) -> Result<String, String> {
    let sock = weir.dir().display().to_string();
    psql_at(&sock, weir.port(), "pgbouncer", "postgres", None, sql)
}

fn console(weir: &Weir) -> RawConn {
    RawConn::startup(weir.port(), "postgres", "pgbouncer", &[])
        .unwrap_or_else(|e| panic!("console login failed: {e:?}"))
}

fn config_value(c: &mut RawConn, key: &str) -> String {
    ok(c, "SHOW CONFIG").get("key", key, "value")
}

fn verify_full(certs: &Certs) -> String {
    format!(
        "sslmode=verify-full host=localhost sslrootcert={}",
        certs.p("ca.crt")
    )
}

fn assert_plain_refused(weir: &Weir) {
    let e =
        psql_conninfo(weir, "sslmode=disable", "select 1").expect_err("plaintext client admitted");
    assert!(e.contains("SSL required"), "{e}");
}

/// Asserts that SET `sql` is refused as TLS settings that cannot be used.
fn assert_tls_set_refused(c: &mut RawConn, sql: &str) {
    let e = run(c, sql).expect_err("SET of unusable TLS settings accepted");
    assert_eq!(e.code, "F0000", "{e:?}");
    assert!(
        e.message
            .starts_with("SET failed: TLS settings could not be applied"),
        "{e:?}"
    );
}

/// Files that cannot be used (a file with no certificate in it; a file that does not
/// exist; a key that is not the certificate's) may be named while the mode is disable,
/// as PgBouncer reads them only when TLS is in use; then SET client_tls_sslmode = require
/// is refused, SHOW CONFIG still says disable, and clients are taken as under disable.
#[test]
fn require_is_refused_when_the_files_cannot_be_used() {
    let pg = PgServer::start();
    let certs = Certs::new();
    certs.v1("v1");
    certs.server("other", "localhost");
    let weir = Weir::for_pg(&pg).set("admin_users", "postgres").start();
    let mut c = console(&weir);
    let bad = [
        ("server.key", "server.key"),
        ("v1.crt", "server.key"),
        ("missing.crt", "server.key"),
        ("server.crt", "other.key"),
    ];
    for (cert, key) in bad {
        let r = ok(
            &mut c,
            &format!("SET client_tls_cert_file = '{}'", certs.p(cert)),
        );
        assert_eq!(r.tags.len(), 1);
        ok(
            &mut c,
            &format!("SET client_tls_key_file = '{}'", certs.p(key)),
        );
        assert_tls_set_refused(&mut c, "SET client_tls_sslmode = require");
        assert_eq!(config_value(&mut c, "client_tls_sslmode"), "disable");
        assert_eq!(
            psql_conninfo(&weir, "sslmode=disable", "select 1").as_deref(),
            Ok("1"),
            "{cert}/{key}"
        );
        let e = psql_conninfo(&weir, "sslmode=require", "select 1")
            .expect_err("TLS without a certificate");
        assert!(e.contains("does not support SSL"), "{e}");
    }
}

/// With a usable certificate the same steps turn plaintext away. Then, under require, a
/// certificate or key that cannot be used is refused and the one in force kept; a key
/// and its certificate SET in one query are taken together; and a query's SETs are
/// applied all or none.
#[test]
fn under_require_a_set_that_cannot_be_used_keeps_the_certificate_in_force() {
    let pg = PgServer::start();
    let certs = Certs::new();
    certs.v1("v1");
    certs.server("other", "localhost");
    let next = Certs::new();
    let weir = Weir::for_pg(&pg).set("admin_users", "postgres").start();
    let mut c = console(&weir);
    ok(
        &mut c,
        &format!("SET client_tls_cert_file = '{}'", certs.p("server.crt")),
    );
    ok(
        &mut c,
        &format!("SET client_tls_key_file = '{}'", certs.p("server.key")),
    );
    let r = ok(&mut c, "SET client_tls_sslmode = require");
    assert_eq!(r.tags, vec!["SET client_tls_sslmode=require"]);
    assert_eq!(config_value(&mut c, "client_tls_sslmode"), "require");
    assert_plain_refused(&weir);
    assert_eq!(
        psql_conninfo(&weir, &verify_full(&certs), "select 1").as_deref(),
        Ok("1")
    );

    for sql in [
        format!("SET client_tls_cert_file = '{}'", certs.p("v1.crt")),
        format!("SET client_tls_cert_file = '{}'", certs.p("missing.crt")),
        // The new key before its certificate: refused alone (see below for together).
        format!("SET client_tls_key_file = '{}'", certs.p("other.key")),
        format!("SET client_tls_key_file = '{}'", next.p("server.key")),
    ] {
        assert_tls_set_refused(&mut c, &sql);
        assert_eq!(
            config_value(&mut c, "client_tls_cert_file"),
            certs.p("server.crt")
        );
        assert_eq!(
            config_value(&mut c, "client_tls_key_file"),
            certs.p("server.key")
        );
        assert_plain_refused(&weir);
        assert_eq!(
            psql_conninfo(&weir, &verify_full(&certs), "select 1").as_deref(),
            Ok("1"),
            "{sql}"
        );
    }

    // All or none: the good SET before the bad one is not applied either.
    let pool_size = config_value(&mut c, "default_pool_size");
    assert_tls_set_refused(
        &mut c,
        &format!(
            "SET default_pool_size = 9; SET client_tls_cert_file = '{}'",
            certs.p("v1.crt")
        ),
    );
    assert_eq!(config_value(&mut c, "default_pool_size"), pool_size);

    // A new key and certificate in one query.
    let r = ok(
        &mut c,
        &format!(
            "SET client_tls_key_file = '{}'; SET client_tls_cert_file = '{}'",
            next.p("server.key"),
            next.p("server.crt")
        ),
    );
    assert_eq!(r.tags.len(), 2, "{r:?}");
    assert_eq!(
        config_value(&mut c, "client_tls_cert_file"),
        next.p("server.crt")
    );
    assert_eq!(
        psql_conninfo(&weir, &verify_full(&next), "select 1").as_deref(),
        Ok("1")
    );
    assert!(psql_conninfo(&weir, &verify_full(&certs), "select 1").is_err());
    assert_plain_refused(&weir);
}

/// The certificate in force is overwritten on disk by one that cannot be used (a botched
/// rotation): SIGHUP and RELOAD are refused and keep the TLS in force, and a later SET
/// of something else does not read the files again (it used to turn TLS off).
#[test]
fn a_bad_file_on_disk_under_require_neither_reload_nor_set_turns_tls_off() {
    let pg = PgServer::start();
    let certs = Certs::new();
    certs.v1("v1");
    let live = tempfile::Builder::new()
        .prefix("weir-live-certs-")
        .tempdir()
        .expect("tempdir");
    for f in ["server.crt", "server.key"] {
        std::fs::copy(certs.path(f), live.path().join(f)).expect("copy");
    }
    let weir = Weir::for_pg(&pg)
        .set("admin_users", "postgres")
        .set("client_tls_sslmode", "require")
        .set(
            "client_tls_cert_file",
            live.path().join("server.crt").display(),
        )
        .set(
            "client_tls_key_file",
            live.path().join("server.key").display(),
        )
        .start();
    assert_plain_refused(&weir);
    assert_eq!(
        psql_conninfo(&weir, &verify_full(&certs), "select 1").as_deref(),
        Ok("1")
    );
    std::fs::copy(certs.path("v1.crt"), live.path().join("server.crt")).expect("copy");

    weir.signal(libc::SIGHUP);
    assert!(
        eventually(std::time::Duration::from_secs(10), || weir
            .log()
            .contains("reload failed")),
        "{}",
        weir.log_tail()
    );
    let e =
        console_unix(&weir, "RELOAD").expect_err("RELOAD with a certificate that is not the key's");
    assert!(e.contains("RELOAD failed"), "{e}");
    assert_plain_refused(&weir);
    assert_eq!(
        psql_conninfo(&weir, &verify_full(&certs), "select 1").as_deref(),
        Ok("1")
    );

    console_unix(&weir, "SET default_pool_size = 30").expect("SET of another option");
    let cfg = console_unix(&weir, "SHOW CONFIG").expect("SHOW CONFIG");
    assert!(cfg.contains("default_pool_size|30|"), "{cfg}");
    assert!(cfg.contains("client_tls_sslmode|require|"), "{cfg}");
    assert_plain_refused(&weir);
    assert_eq!(
        psql_conninfo(&weir, &verify_full(&certs), "select 1").as_deref(),
        Ok("1")
    );
}

/// The same order towards servers: a CA file that cannot be read may be named under
/// server_tls_sslmode = disable, and a mode that would use it is then refused, the old
/// one staying in force.
#[test]
fn server_side_require_with_a_bad_ca_file_is_refused() {
    let pg = PgServer::start();
    let weir = Weir::for_pg(&pg)
        .set("admin_users", "postgres")
        .set("server_tls_sslmode", "disable")
        .start();
    let mut c = console(&weir);
    ok(&mut c, "SET server_tls_ca_file = '/nonexistent/ca.crt'");
    for mode in ["require", "verify-ca", "verify-full"] {
        assert_tls_set_refused(&mut c, &format!("SET server_tls_sslmode = '{mode}'"));
        assert_eq!(config_value(&mut c, "server_tls_sslmode"), "disable");
    }
    assert_eq!(
        psql_conninfo(&weir, "sslmode=disable", "select 1").as_deref(),
        Ok("1")
    );
}
