//! Client accounting as PgBouncer does it: SHOW USERS and SHOW DATABASES
//! `current_client_connections` count every logged-in client, console sessions and
//! users known only through auth_query included, and max_user_client_connections /
//! max_db_client_connections (global, per user, per database, and SET at runtime) are
//! enforced on exactly those counts, which a client gives back when it leaves or fails
//! to log in. Real clients (the raw protocol client and tokio-postgres) against a real
//! PostgreSQL.

mod common;

use common::console::*;
use common::*;

fn admin(weir: &Weir, user: &str) -> Result<RawConn, ErrorFields> {
    RawConn::startup(weir.port(), user, "pgbouncer", &[])
}

fn login(weir: &Weir, db: &str, user: &str) -> Result<RawConn, ErrorFields> {
    RawConn::startup(weir.port(), user, db, &[])
}

fn user_clients(console: &mut RawConn, user: &str) -> i64 {
    ok(console, "SHOW USERS").num("name", user, "current_client_connections")
}

fn db_clients(console: &mut RawConn, db: &str) -> i64 {
    ok(console, "SHOW DATABASES").num("name", db, "current_client_connections")
}

/// SHOW USERS current_client_connections of `user`, over a tokio-postgres console.
async fn user_clients_pg(console: &tokio_postgres::Client, user: &str) -> String {
    let rows = console.simple_query("SHOW USERS").await.unwrap();
    rows.into_iter()
        .find_map(|m| match m {
            tokio_postgres::SimpleQueryMessage::Row(r) if r.get("name") == Some(user) => {
                r.get("current_client_connections").map(str::to_owned)
            }
            _ => None,
        })
        .unwrap_or_default()
}

/// The refusal PgBouncer sends when `setting` is full.
fn assert_exceeded(r: Result<RawConn, ErrorFields>, setting: &str) {
    let e = r
        .err()
        .unwrap_or_else(|| panic!("a client was let in past {setting}"));
    assert_eq!(
        (e.severity.as_str(), e.code.as_str(), e.message.as_str()),
        (
            "FATAL",
            "08P01",
            format!("client connections exceeded ({setting})").as_str()
        )
    );
}

fn start(pg: &PgServer) -> Weir {
    Weir::for_pg(pg)
        .set("pool_mode", "transaction")
        .set("admin_users", "postgres")
        .set("stats_users", "stats")
        .userlist(&[("postgres", ""), ("stats", ""), ("app", ""), ("app2", "")])
        .user_setting("app2", "max_user_client_connections=3")
        .database(
            "limited",
            &format!("{} max_db_client_connections=1", pg.connstr()),
        )
        .start()
}

fn pg_with_apps() -> PgServer {
    let pg = PgServer::start();
    pg.create_user("app", "x", "md5");
    pg.create_user("app2", "x", "md5");
    pg
}

/// Console sessions are clients of their user and of database `pgbouncer`: counted in
/// SHOW USERS and SHOW DATABASES, and held to the limits, except that an admin_users
/// member always gets into the console (PgBouncer's exemption).
#[test]
fn console_sessions_are_counted_and_limited() {
    let pg = PgServer::start();
    let weir = start(&pg);
    let mut a = admin(&weir, "postgres").unwrap();
    assert_eq!(user_clients(&mut a, "postgres"), 1);
    assert_eq!(db_clients(&mut a, "pgbouncer"), 1);
    ok(&mut a, "SET max_user_client_connections = 2");

    let s1 = admin(&weir, "stats").unwrap();
    let _s2 = admin(&weir, "stats").unwrap();
    assert_exceeded(admin(&weir, "stats"), "max_user_client_connections");
    let users = ok(&mut a, "SHOW USERS");
    assert_eq!(users.num("name", "stats", "current_client_connections"), 2);
    assert_eq!(users.num("name", "stats", "max_user_client_connections"), 2);

    // The admin is over its limit of 2 with its third session, and still gets in.
    let _a2 = admin(&weir, "postgres").unwrap();
    let _a3 = admin(&weir, "postgres").unwrap();
    assert_eq!(user_clients(&mut a, "postgres"), 3);
    assert_eq!(db_clients(&mut a, "pgbouncer"), 5);

    // A session that leaves gives its place back.
    drop(s1);
    assert!(
        eventually(TIMEOUT, || user_clients(&mut a, "stats") == 1),
        "a closed console session is still counted"
    );
    let s3 = admin(&weir, "stats").unwrap();

    // The database limit on the console, set at runtime: stats is refused, the admin not.
    ok(&mut a, "SET max_user_client_connections = 0");
    ok(&mut a, "SET max_db_client_connections = 5");
    let dbs = ok(&mut a, "SHOW DATABASES");
    assert_eq!(dbs.num("name", "pgbouncer", "max_client_connections"), 5);
    assert_eq!(
        dbs.num("name", "pgbouncer", "current_client_connections"),
        5
    );
    assert_exceeded(admin(&weir, "stats"), "max_db_client_connections");
    let _a4 = admin(&weir, "postgres").unwrap();
    assert_eq!(db_clients(&mut a, "pgbouncer"), 6);
    // A refused login was never counted.
    assert_eq!(user_clients(&mut a, "stats"), 2);
    drop(s3);
}

/// A limit set with SET applies to the clients already logged in (they were counted
/// while no limit was set); the per-user value in [users] and the per-database one in
/// [databases] override the global ones.
#[test]
fn limits_set_at_runtime_count_the_clients_already_in() {
    let pg = pg_with_apps();
    let weir = start(&pg);
    let mut a = admin(&weir, "postgres").unwrap();
    let mut held: Vec<RawConn> = (0..2)
        .map(|_| login(&weir, "postgres", "app").unwrap())
        .collect();
    assert_eq!(user_clients(&mut a, "app"), 2);
    assert_eq!(db_clients(&mut a, "postgres"), 2);

    ok(&mut a, "SET max_user_client_connections = 2");
    assert_exceeded(
        login(&weir, "postgres", "app"),
        "max_user_client_connections",
    );
    // app2's own limit of 3 wins over the global 2.
    let app2: Vec<RawConn> = (0..3)
        .map(|_| login(&weir, "postgres", "app2").unwrap())
        .collect();
    assert_exceeded(
        login(&weir, "postgres", "app2"),
        "max_user_client_connections",
    );
    let users = ok(&mut a, "SHOW USERS");
    assert_eq!(users.num("name", "app2", "max_user_client_connections"), 3);
    assert_eq!(users.num("name", "app2", "current_client_connections"), 3);
    drop(app2);

    ok(&mut a, "SET max_user_client_connections = 0");
    held.push(login(&weir, "postgres", "app").unwrap());
    for c in &mut held {
        assert_eq!(c.query_one("select 1"), "1");
    }

    // `limited` allows 1 although the global value is higher.
    ok(&mut a, "SET max_db_client_connections = 10");
    let mut l = login(&weir, "limited", "app").unwrap();
    assert_exceeded(login(&weir, "limited", "app2"), "max_db_client_connections");
    let dbs = ok(&mut a, "SHOW DATABASES");
    assert_eq!(dbs.num("name", "limited", "max_client_connections"), 1);
    assert_eq!(dbs.num("name", "limited", "current_client_connections"), 1);
    assert_eq!(dbs.num("name", "postgres", "max_client_connections"), 10);
    assert_eq!(dbs.num("name", "postgres", "current_client_connections"), 3);
    assert_eq!(l.query_one("select current_user"), "app");
    drop(l);
    assert!(
        eventually(TIMEOUT, || login(&weir, "limited", "app2").is_ok()),
        "no client let into `limited` after the one in left"
    );
}

/// Failed logins (a wrong password, a refused limit) leave no count behind, and neither
/// do clients that leave.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn failed_and_finished_logins_give_their_place_back() {
    let pg = pg_with_apps();
    let weir = Weir::for_pg(&pg)
        .set("auth_type", "md5")
        .set("admin_users", "postgres")
        .set("max_user_client_connections", 1)
        .userlist(&[("postgres", "pw"), ("app", "x")])
        .start();
    let port = weir.port();
    for _ in 0..3 {
        let e = connect_pw(port, "postgres", "app", "wrong")
            .await
            .expect_err("a wrong password was accepted");
        assert_eq!(expect_db_error(&e).code, "28P01");
    }
    let c = connect_pw(port, "postgres", "app", "x")
        .await
        .unwrap_or_else(|e| panic!("app refused after failed logins: {e:?}"));
    let e = connect_pw(port, "postgres", "app", "x")
        .await
        .expect_err("a second client of app got in with max_user_client_connections=1");
    let f = expect_db_error(&e);
    assert_eq!(
        (f.code.as_str(), f.message.as_str()),
        (
            "08P01",
            "client connections exceeded (max_user_client_connections)"
        )
    );
    let console = connect_pw(port, "pgbouncer", "postgres", "pw")
        .await
        .unwrap();
    assert_eq!(user_clients_pg(&console, "app").await, "1");
    drop(c);
    assert!(
        eventually_async(TIMEOUT, || async {
            user_clients_pg(&console, "app").await == "0"
        })
        .await,
        "a client that left is still counted"
    );
    let c = connect_pw(port, "postgres", "app", "x").await.unwrap();
    assert_eq!(q1(&c, "select current_user").await, "app");
}

/// A user known only through auth_query is counted and limited like any other.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn auth_query_users_are_counted_and_limited() {
    let pg = PgServer::start();
    pg.create_user("carol", "pw1", "md5");
    pg.create_user_lookup();
    let weir = Weir::for_pg(&pg)
        .set("pool_mode", "transaction")
        .auth_query_lookup()
        .set("admin_users", "postgres")
        .set("max_user_client_connections", 2)
        .userlist(&[("lookup", ""), ("postgres", "pw")])
        .start();
    let port = weir.port();
    let c1 = connect_pw(port, "postgres", "carol", "pw1").await.unwrap();
    let c2 = connect_pw(port, "postgres", "carol", "pw1").await.unwrap();
    let e = connect_pw(port, "postgres", "carol", "pw1")
        .await
        .expect_err("a third carol got in with max_user_client_connections=2");
    assert_eq!(
        expect_db_error(&e).message,
        "client connections exceeded (max_user_client_connections)"
    );
    let console = connect_pw(port, "pgbouncer", "postgres", "pw")
        .await
        .unwrap();
    assert_eq!(user_clients_pg(&console, "carol").await, "2");
    drop(c1);
    assert_eq!(q1(&c2, "select current_user").await, "carol");
    assert!(
        eventually_async(TIMEOUT, || async {
            user_clients_pg(&console, "carol").await == "1"
        })
        .await,
        "a carol that left is still counted"
    );
    let c3 = connect_pw(port, "postgres", "carol", "pw1").await.unwrap();
    assert_eq!(q1(&c3, "select 1").await, "1");
}
