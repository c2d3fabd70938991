//! PostgreSQL refusing the server login of a pool that exists (issue 24): the clients
//! waiting for a server of that pool get PostgreSQL's own error at once, as with
//! PgBouncer, not after query_wait_timeout while Weir retries every server_login_retry.
//! An unreachable PostgreSQL is waited for instead (tests/recovery.rs).

mod common;

use common::console::ok;
use common::*;
use std::time::{Duration, Instant};

/// Far shorter than query_wait_timeout and server_login_retry below, far longer than
/// telling a client takes: a client answered within it was not kept waiting for a
/// retry or a timeout.
const PROMPT: Duration = Duration::from_secs(10);
const SERVER_LOGIN_RETRY: Duration = Duration::from_secs(20);

fn login(weir: &Weir) -> Result<RawConn, ErrorFields> {
    RawConn::startup(weir.port(), "app", "postgres", &[])
}

fn waiting(console: &mut RawConn) -> i64 {
    ok(console, "SHOW POOLS").num("user", "app", "cl_waiting")
}

fn assert_refusal(f: &ErrorFields, code: &str, message: &str, who: &str, since: Instant) {
    assert_eq!(
        (f.severity.as_str(), f.code.as_str(), f.message.as_str()),
        ("FATAL", code, message),
        "{who}"
    );
    assert!(
        since.elapsed() < PROMPT,
        "{who} was told only after {:?}",
        since.elapsed()
    );
}

/// Pool size 1 in transaction mode: app's only server is held in a transaction while two
/// clients queue for it; `refuse` makes PostgreSQL turn app's logins away, and the server
/// is terminated. The first waiter's login is refused and both waiters are told; so are
/// a new client logging in and a logged-in client's next request. Once `restore` lets
/// app log in again, a new client is served (after server_login_retry).
fn refused_login_reaches_waiting_clients(refuse: &str, restore: &str, code: &str, message: &str) {
    let pg = PgServer::start();
    pg.create_user("app", "apppw", "scram-sha-256");
    // Weir's logins as app need the auth_file's password, which `refuse` may change.
    pg.set_hba(&["host all app 127.0.0.1/32 scram-sha-256"]);
    let weir = Weir::for_pg(&pg)
        .set("pool_mode", "transaction")
        .set("default_pool_size", 1)
        .set("server_login_retry", SERVER_LOGIN_RETRY.as_secs())
        .set("query_wait_timeout", 60)
        .set("admin_users", "postgres")
        .userlist(&[("postgres", ""), ("app", "apppw")])
        .start();
    let mut holder = login(&weir).expect("login of app");
    holder.simple_query("begin").expect("begin");
    assert_eq!(holder.query_one("select 1"), "1");
    let mut waiters: Vec<RawConn> = (0..2).map(|_| login(&weir).expect("login")).collect();
    let mut idle = login(&weir).expect("login");
    pg.exec(refuse);

    for (i, w) in waiters.iter_mut().enumerate() {
        w.send(&proto::query(&format!("select {i}")));
    }
    let mut console = RawConn::startup(weir.port(), "postgres", "pgbouncer", &[]).unwrap();
    assert!(
        eventually(TIMEOUT, || waiting(&mut console) == 2),
        "the clients did not queue"
    );
    pg.exec("select pg_terminate_backend(pid) from pg_stat_activity where usename = 'app'");
    assert!(eventually(TIMEOUT, || pg.count_backends("app") == 0));
    let since = Instant::now();
    // Whatever the holder is told, its server is gone and the slot is free.
    holder.send(&proto::query("select 'gone'"));
    let _ = holder.error_or_eof();

    for (i, w) in waiters.iter_mut().enumerate() {
        let f = w.expect_error();
        assert_refusal(&f, code, message, &format!("waiting client {i}"), since);
    }
    let since = Instant::now();
    let f = login(&weir)
        .err()
        .expect("a new client logged in while PostgreSQL refuses app's logins");
    assert_refusal(&f, code, message, "a client logging in", since);
    let since = Instant::now();
    idle.send(&proto::query("select 'next'"));
    let f = idle.expect_error();
    assert_refusal(&f, code, message, "a logged-in client's request", since);

    pg.exec(restore);
    let deadline = Instant::now() + SERVER_LOGIN_RETRY + TIMEOUT;
    let served = loop {
        match login(&weir).map(|mut c| c.simple_query("select 'back'")) {
            Ok(Ok(rows)) => break rows,
            _ if Instant::now() < deadline => std::thread::sleep(Duration::from_millis(250)),
            other => panic!("app not served once it may log in again: {other:?}"),
        }
    };
    assert_eq!(served[0][0].as_deref(), Some("back"));
}

#[test]
fn role_that_may_not_log_in_is_reported_to_waiting_clients() {
    refused_login_reaches_waiting_clients(
        "alter role app nologin",
        "alter role app login",
        "28000",
        "role \"app\" is not permitted to log in",
    );
}

#[test]
fn changed_password_is_reported_to_waiting_clients() {
    refused_login_reaches_waiting_clients(
        "alter role app password 'other'",
        "alter role app password 'apppw'",
        "28P01",
        "password authentication failed for user \"app\"",
    );
}
