//! auth_type = hba (auth_hba_file in pg_hba.conf format), cert and peer authentication,
//! and auth_ident_file maps, with real clients (psql, libpq).

mod common;

use common::tls::Certs;
use common::*;

fn users(pg: &PgServer) {
    pg.create_user("alice", "apw", "md5");
    pg.create_user("bob", "bpw", "md5");
}

fn write(dir: &std::path::Path, name: &str, text: &str) -> String {
    let p = dir.join(name);
    std::fs::write(&p, text).expect("write");
    p.display().to_string()
}

fn hba_weir(pg: &PgServer, dir: &std::path::Path, hba: &str) -> WeirBuilder {
    Weir::for_pg(pg)
        .set("auth_type", "hba")
        .set("auth_hba_file", write(dir, "hba.conf", hba))
        .userlist(&[("alice", "apw"), ("bob", "bpw"), ("postgres", "")])
}

fn tcp(weir: &Weir, user: &str, pw: Option<&str>, conninfo: &str) -> Result<String, String> {
    psql_at(
        "127.0.0.1",
        weir.port(),
        &format!("dbname=postgres {conninfo}"),
        user,
        pw,
        "select current_user",
    )
}

#[test]
fn hba_rules_choose_the_method() {
    let pg = PgServer::start();
    users(&pg);
    let dir = tempfile::tempdir().expect("tmp");
    let weir = hba_weir(
        &pg,
        dir.path(),
        "local all all trust\n\
         host all bob 127.0.0.0/8 reject\n\
         host postgres all 127.0.0.1/32 md5\n",
    )
    .database("other", &format!("{} dbname=postgres", pg.connstr()))
    .start();
    // Unix socket: trust.
    let sock = weir.dir().display().to_string();
    assert_eq!(
        psql_at(
            &sock,
            weir.port(),
            "postgres",
            "alice",
            None,
            "select current_user"
        )
        .as_deref(),
        Ok("alice")
    );
    // TCP: md5 for alice, with her password only.
    assert_eq!(tcp(&weir, "alice", Some("apw"), "").as_deref(), Ok("alice"));
    let e = tcp(&weir, "alice", Some("nope"), "").expect_err("wrong password");
    assert!(
        e.contains("password authentication failed for user \"alice\""),
        "{e}"
    );
    // bob is rejected over TCP, whatever his password.
    let e = tcp(&weir, "bob", Some("bpw"), "").expect_err("bob accepted");
    assert!(
        e.contains("pg_hba.conf rejects connection for host \"127.0.0.1\", user \"bob\", database \"postgres\", no encryption"),
        "{e}"
    );
    // No rule for another database.
    let e = psql_at(
        "127.0.0.1",
        weir.port(),
        "other",
        "alice",
        Some("apw"),
        "select 1",
    )
    .expect_err("no rule");
    assert!(
        e.contains("no pg_hba.conf entry for host \"127.0.0.1\", user \"alice\""),
        "{e}"
    );
}

/// hostssl with cert: the client certificate's common name is the user (or maps to it
/// through auth_ident_file).
#[test]
fn certificates_log_users_in() {
    let pg = PgServer::start();
    users(&pg);
    let certs = Certs::new();
    certs.client("alice", "alice");
    certs.client("mapped", "Alice Cert");
    certs.client("carol", "carol");
    let dir = tempfile::tempdir().expect("tmp");
    let weir = hba_weir(
        &pg,
        dir.path(),
        "hostssl all alice 127.0.0.1/32 cert map=certs\n\
         hostssl all all 127.0.0.1/32 cert\n\
         hostnossl all all 127.0.0.1/32 reject\n",
    )
    .set(
        "auth_ident_file",
        write(
            dir.path(),
            "ident.conf",
            "certs alice alice\ncerts \"Alice Cert\" alice\n",
        ),
    )
    .set("client_tls_sslmode", "verify-ca")
    .set("client_tls_cert_file", certs.p("server.crt"))
    .set("client_tls_key_file", certs.p("server.key"))
    .set("client_tls_ca_file", certs.p("ca.crt"))
    .start();
    let with = |name: &str| {
        format!(
            "sslmode=require sslcert={} sslkey={}",
            certs.p(&format!("{name}.crt")),
            certs.p(&format!("{name}.key"))
        )
    };
    assert_eq!(
        tcp(&weir, "alice", None, &with("alice")).as_deref(),
        Ok("alice")
    );
    assert_eq!(
        tcp(&weir, "alice", None, &with("mapped")).as_deref(),
        Ok("alice")
    );
    let e = tcp(&weir, "bob", None, &with("alice")).expect_err("alice's cert as bob");
    assert!(
        e.contains("certificate authentication failed for user \"bob\""),
        "{e}"
    );
    // A certificate the map does not name for alice: refused, logged in PgBouncer's words.
    let e = tcp(&weir, "alice", None, &with("carol")).expect_err("carol's cert as alice");
    assert!(
        e.contains("certificate authentication failed for user \"alice\""),
        "{e}"
    );
    weir.wait_for_log("ident map: certs does not have a match");
    let e = tcp(&weir, "alice", None, "sslmode=disable").expect_err("plain");
    assert!(e.contains("SSL required") || e.contains("rejects"), "{e}");
}

/// auth_type = cert everywhere.
#[test]
fn auth_type_cert() {
    let pg = PgServer::start();
    users(&pg);
    let certs = Certs::new();
    certs.client("bob", "bob");
    let weir = Weir::for_pg(&pg)
        .set("auth_type", "cert")
        .set("client_tls_sslmode", "verify-full")
        .set("client_tls_cert_file", certs.p("server.crt"))
        .set("client_tls_key_file", certs.p("server.key"))
        .set("client_tls_ca_file", certs.p("ca.crt"))
        .start();
    let bob = format!(
        "sslmode=require sslcert={} sslkey={}",
        certs.p("bob.crt"),
        certs.p("bob.key")
    );
    assert_eq!(tcp(&weir, "bob", None, &bob).as_deref(), Ok("bob"));
    let e = tcp(&weir, "alice", None, &bob).expect_err("bob's cert as alice");
    assert!(
        e.contains("certificate authentication failed for user \"alice\""),
        "{e}"
    );
}

/// peer on the Unix socket: the OS user (root, running the tests) maps to a user.
#[test]
fn peer_with_a_map() {
    let pg = PgServer::start();
    users(&pg);
    let dir = tempfile::tempdir().expect("tmp");
    let os_user = String::from_utf8(
        std::process::Command::new("id")
            .arg("-un")
            .output()
            .expect("id")
            .stdout,
    )
    .expect("utf8")
    .trim()
    .to_string();
    let weir = hba_weir(&pg, dir.path(), "local all all peer map=os\n")
        .set(
            "auth_ident_file",
            write(dir.path(), "ident.conf", &format!("os {os_user} alice\n")),
        )
        .start();
    let sock = weir.dir().display().to_string();
    let q = |user: &str| {
        psql_at(
            &sock,
            weir.port(),
            "postgres",
            user,
            None,
            "select current_user",
        )
    };
    assert_eq!(q("alice").as_deref(), Ok("alice"));
    let e = q("bob").expect_err("bob via peer");
    assert!(
        e.contains("Peer authentication failed for user \"bob\""),
        "{e}"
    );
    weir.wait_for_log("ident map os cannot be matched");
}

/// A broken hba file stops Weir at startup, naming the file and line.
#[test]
fn a_bad_hba_file_is_a_startup_error() {
    let pg = PgServer::start();
    let dir = tempfile::tempdir().expect("tmp");
    let mut weir = hba_weir(
        &pg,
        dir.path(),
        "local all all trust\nhost all all nowhere md5\n",
    )
    .spawn();
    assert!(weir
        .wait_exit(std::time::Duration::from_secs(10))
        .is_some_and(|s| !s.success()));
    let err = weir.stderr();
    assert!(
        err.contains("hba.conf:2: invalid address \"nowhere\""),
        "{err}"
    );
}

/// A user list with blanks around its commas, `alice,bob , carol`, is one list, as
/// PgBouncer reads it: the three get the rule's md5, and anyone else the next rule's
/// reject.
#[test]
fn user_lists_with_blanks_around_commas() {
    let pg = PgServer::start();
    users(&pg);
    pg.create_user("carol", "cpw", "md5");
    pg.create_user("dave", "dpw", "md5");
    let dir = tempfile::tempdir().expect("tmp");
    let weir = hba_weir(
        &pg,
        dir.path(),
        "host all alice,bob , carol 127.0.0.1/32 md5\n\
         host all all 127.0.0.1/32 reject\n",
    )
    .userlist(&[
        ("alice", "apw"),
        ("bob", "bpw"),
        ("carol", "cpw"),
        ("dave", "dpw"),
    ])
    .start();
    for (user, pw) in [("alice", "apw"), ("bob", "bpw"), ("carol", "cpw")] {
        assert_eq!(tcp(&weir, user, Some(pw), "").as_deref(), Ok(user));
        let e = tcp(&weir, user, Some("nope"), "").expect_err("wrong password");
        assert!(
            e.contains(&format!(
                "password authentication failed for user \"{user}\""
            )),
            "{e}"
        );
    }
    let e = tcp(&weir, "dave", Some("dpw"), "").expect_err("dave accepted");
    assert!(
        e.contains("pg_hba.conf rejects connection for host \"127.0.0.1\", user \"dave\""),
        "{e}"
    );
}
