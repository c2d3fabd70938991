//! auth_user (and auth_dbname) set on a `[databases]` entry rather than in `[pgbouncer]`:
//! a user missing from the auth_file is looked up in PostgreSQL with PgBouncer's default
//! auth_query, and a failed lookup or a wrong password is the same 28P01 error.

mod common;

use common::*;

/// A PostgreSQL with role bob (md5 password) and a database `authdb` for lookups.
fn pg_with_bob() -> PgServer {
    let pg = PgServer::start();
    pg.create_user("bob", "bobpw", "md5");
    pg.exec("create database authdb");
    pg
}

/// Weir with md5 client authentication, an auth_file knowing only postgres, and the
/// given `[databases]` entries.
fn weir_md5(pg: &PgServer, entries: &[(&str, &str)]) -> Weir {
    let mut b = Weir::builder()
        .set("auth_type", "md5")
        .userlist(&[("postgres", "")]);
    for (name, opts) in entries {
        b = b.database(name, &format!("{} {opts}", pg.connstr()));
    }
    b.start()
}

fn assert_password_failed(r: Result<tokio_postgres::Client, tokio_postgres::Error>, user: &str) {
    let Err(err) = r else {
        panic!("{user} logged in");
    };
    let e = expect_db_error(&err);
    assert_eq!(e.severity, "FATAL");
    assert_eq!(e.code, "28P01", "{e:?}");
    assert_eq!(
        e.message,
        format!("password authentication failed for user \"{user}\"")
    );
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn database_auth_user_looks_up_users_missing_from_auth_file() {
    let pg = pg_with_bob();
    let weir = weir_md5(&pg, &[("db", "dbname=postgres auth_user=postgres")]);
    let c = connect_pw(weir.port(), "db", "bob", "bobpw")
        .await
        .expect("bob, found by auth_query, logs in");
    assert_eq!(q1(&c, "select current_user").await, "bob");
    assert_password_failed(connect_pw(weir.port(), "db", "bob", "wrong").await, "bob");
    assert_password_failed(
        connect_pw(weir.port(), "db", "ghost", "whatever").await,
        "ghost",
    );
}

/// auth_dbname on the entry names the `[databases]` entry the lookup runs in.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn database_auth_dbname_runs_the_lookup_elsewhere() {
    let pg = pg_with_bob();
    let weir = weir_md5(
        &pg,
        &[
            ("authdb", "dbname=authdb"),
            (
                "db",
                "dbname=postgres auth_user=postgres auth_dbname=authdb",
            ),
        ],
    );
    let c = connect_pw(weir.port(), "db", "bob", "bobpw")
        .await
        .expect("bob, found by auth_query in authdb, logs in");
    assert_eq!(q1(&c, "select current_database()").await, "postgres");
    assert_eq!(
        pg.count_backends_where("usename = 'postgres' and datname = 'authdb'"),
        1,
        "the lookup ran through a connection to authdb"
    );
    assert_password_failed(connect_pw(weir.port(), "db", "bob", "nope").await, "bob");
    assert_password_failed(connect_pw(weir.port(), "db", "ghost", "x").await, "ghost");
}

/// With a forced user, the lookup still authenticates the client, and the pool logs in as
/// the forced user.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn database_auth_user_with_a_forced_user() {
    let pg = pg_with_bob();
    pg.create_user("srv", "srvpw", "md5");
    let weir = weir_md5(&pg, &[("db", "user=srv auth_user=postgres")]);
    let c = connect_pw(weir.port(), "db", "bob", "bobpw")
        .await
        .expect("bob logs in");
    assert_eq!(q1(&c, "select current_user").await, "srv");
    assert_password_failed(connect_pw(weir.port(), "db", "bob", "bad").await, "bob");
}

/// auth_type = trust: a user the lookup finds is let in, as PgBouncer does.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn database_auth_user_under_trust() {
    let pg = pg_with_bob();
    let weir = Weir::builder()
        .userlist(&[("postgres", "")])
        .database("db", &format!("{} auth_user=postgres", pg.connstr()))
        .start();
    let c = connect(weir.port(), "db", "bob")
        .await
        .expect("bob logs in");
    assert_eq!(q1(&c, "select current_user").await, "bob");
}

/// auth_type = scram-sha-256 against a SCRAM verifier found by the lookup.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn database_auth_user_with_scram() {
    let pg = pg_with_bob();
    pg.create_user("carol", "carolpw", "scram-sha-256");
    let weir = Weir::builder()
        .set("auth_type", "scram-sha-256")
        .userlist(&[("postgres", "")])
        .database("db", &format!("{} auth_user=postgres", pg.connstr()))
        .start();
    let c = connect_pw(weir.port(), "db", "carol", "carolpw")
        .await
        .expect("carol logs in");
    assert_eq!(q1(&c, "select current_user").await, "carol");
    let Err(err) = connect_pw(weir.port(), "db", "carol", "wrong").await else {
        panic!("carol logged in with a wrong password");
    };
    let e = expect_db_error(&err);
    // PgBouncer's wording for a failed SCRAM exchange, PostgreSQL's SQLSTATE.
    assert_eq!(
        (e.code.as_str(), e.message.as_str()),
        ("28P01", "SASL authentication failed")
    );
}

/// A lookup that fails in PostgreSQL (here an auth_user without rights on pg_authid)
/// tells the client no more than a wrong password would, and Weir keeps serving.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn failed_lookup_is_a_password_failure() {
    let pg = pg_with_bob();
    pg.create_user("lookup", "lookuppw", "md5");
    let weir = weir_md5(&pg, &[("db", "auth_user=lookup")]);
    assert_password_failed(connect_pw(weir.port(), "db", "bob", "bobpw").await, "bob");
    assert_password_failed(connect_pw(weir.port(), "db", "ghost", "x").await, "ghost");
    assert_password_failed(connect_pw(weir.port(), "db", "bob", "bobpw").await, "bob");
}

/// auth_query's row with a NULL password (the default query gives one for an expired
/// password too): the user exists, so trust lets it in, as PgBouncer does; no password
/// proves it under md5.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_null_password_lets_a_user_in_under_trust_only() {
    let pg = pg_with_bob();
    pg.exec("create role nopw login");
    let trusting = Weir::builder()
        .userlist(&[("postgres", "")])
        .database("db", &format!("{} auth_user=postgres", pg.connstr()))
        .start();
    let c = connect(trusting.port(), "db", "nopw")
        .await
        .expect("nopw, found with a NULL password, logs in under trust");
    assert_eq!(q1(&c, "select current_user").await, "nopw");
    let md5 = weir_md5(&pg, &[("db", "dbname=postgres auth_user=postgres")]);
    assert_password_failed(connect_pw(md5.port(), "db", "nopw", "").await, "nopw");
    assert_password_failed(connect_pw(md5.port(), "db", "nopw", "x").await, "nopw");
}

/// Weir with plain client authentication (the raw client answers only that), the global
/// auth_user and auth_dbname, bob in stats_users, admin in admin_users.
fn weir_plain_global_lookup(pg: &PgServer) -> Weir {
    Weir::builder()
        .set("auth_type", "plain")
        .set("auth_user", "postgres")
        .set("auth_dbname", "authdb")
        .set("stats_users", "bob")
        .set("admin_users", "admin")
        .userlist(&[("postgres", ""), ("admin", "adminpw")])
        .database("authdb", &format!("{} dbname=authdb", pg.connstr()))
        .database("db", &format!("{} dbname=postgres", pg.connstr()))
        .start()
}

/// A console user missing from auth_file is looked up with the global auth_user in the
/// global auth_dbname, as in PgBouncer 1.25.
#[test]
fn the_console_looks_up_users_missing_from_auth_file() {
    let pg = pg_with_bob();
    let weir = weir_plain_global_lookup(&pg);
    let mut c = RawConn::startup_pw(weir.port(), "bob", "pgbouncer", &[], Some("bobpw"))
        .expect("bob, found by auth_query, logs in to the console");
    let v = console::ok(&mut c, "SHOW VERSION");
    assert_eq!(v.rows.len(), 1, "{v:?}");
    let Err(e) = RawConn::startup_pw(weir.port(), "bob", "pgbouncer", &[], Some("bad")) else {
        panic!("bob logged in to the console with a wrong password");
    };
    assert_eq!(e.code, "28P01", "{e:?}");
}

/// A DISABLEd auth_dbname takes no lookups, as in PgBouncer (its suite's
/// test_auth_dbname_disabled).
#[test]
fn a_disabled_auth_dbname_runs_no_lookup() {
    let pg = pg_with_bob();
    let weir = weir_plain_global_lookup(&pg);
    RawConn::startup_pw(weir.port(), "bob", "db", &[], Some("bobpw")).expect("bob logs in");
    let mut admin = RawConn::startup_pw(weir.port(), "admin", "pgbouncer", &[], Some("adminpw"))
        .expect("admin logs in to the console");
    console::ok(&mut admin, "DISABLE authdb");
    let Err(e) = RawConn::startup_pw(weir.port(), "bob", "db", &[], Some("bobpw")) else {
        panic!("bob was looked up in a disabled auth_dbname");
    };
    assert_eq!(
        (e.code.as_str(), e.message.as_str()),
        ("08P01", "authentication database \"authdb\" is disabled"),
        "{e:?}"
    );
    console::ok(&mut admin, "ENABLE authdb");
    RawConn::startup_pw(weir.port(), "bob", "db", &[], Some("bobpw")).expect("bob logs in again");
}

/// The console's database cannot be where auth_query runs: refused where it is given,
/// in [pgbouncer], on a database entry, and by the console's SET.
#[test]
fn pgbouncer_is_refused_as_auth_dbname() {
    let pg = PgServer::start();
    for (global, entry) in [("pgbouncer", ""), ("", " auth_dbname=pgbouncer")] {
        let mut b = Weir::for_pg(&pg).database("db", &format!("{}{entry}", pg.connstr()));
        if !global.is_empty() {
            b = b.set("auth_dbname", global);
        }
        let mut weir = b.spawn();
        assert!(
            weir.wait_exit(TIMEOUT).is_some(),
            "weir started with auth_dbname=pgbouncer"
        );
        let err = weir.stderr();
        assert!(
            err.contains("cannot use the reserved \"pgbouncer\" database as an auth_dbname"),
            "{err}"
        );
    }
    let weir = Weir::for_pg(&pg).set("admin_users", "postgres").start();
    let mut c = RawConn::startup(weir.port(), "postgres", "pgbouncer", &[]).expect("console");
    let Err(e) = console::run(&mut c, "SET auth_dbname = 'pgbouncer'") else {
        panic!("the console took auth_dbname = pgbouncer");
    };
    assert_eq!(e.message, "SET failed", "{e:?}");
    let config = console::ok(&mut c, "SHOW CONFIG");
    assert_eq!(config.get("key", "auth_dbname", "value"), "");
}

/// auth_dbname naming a database `[databases]` does not have is the operator's mistake:
/// the client gets PgBouncer's `bouncer config error` (08P01), the log names the database.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn database_auth_dbname_not_configured_is_a_config_error() {
    let pg = pg_with_bob();
    let weir = weir_md5(
        &pg,
        &[(
            "db",
            "dbname=postgres auth_user=postgres auth_dbname=nowhere",
        )],
    );
    let Err(err) = connect_pw(weir.port(), "db", "bob", "bobpw").await else {
        panic!("bob logged in without his lookup");
    };
    let e = expect_db_error(&err);
    assert_eq!(
        (e.severity.as_str(), e.code.as_str(), e.message.as_str()),
        ("FATAL", "08P01", "bouncer config error"),
        "{e:?}"
    );
    let log = weir.logfile();
    assert!(
        log.contains("authentication database \"nowhere\" is not configured."),
        "{log}"
    );
}
