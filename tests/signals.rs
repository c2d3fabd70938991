//! Signals: SIGHUP reloads the config without dropping connections, SIGINT
//! waits for transactions to end and exits, SIGTERM waits for the clients to leave (or
//! exits at once, as configured). What a shutdown leaves open meanwhile (the Unix socket
//! for the console, no TCP) is in tests/graceful_shutdown.rs.

// Tests run on their own runtime, which has a time driver (clippy.toml is for Weir's
// workers).
#![allow(clippy::disallowed_methods)]

mod common;

use common::*;
use std::time::Duration;

/// After SIGHUP a larger default_pool_size and a new database take effect,
/// and a client connected before the reload keeps working.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn sighup_applies_new_pool_size_and_database_without_dropping_clients() {
    let pg = PgServer::start();
    pg.exec("create database second");
    let builder = Weir::for_pg(&pg)
        .set("pool_mode", "transaction")
        .set("default_pool_size", 1)
        .set("query_wait_timeout", 3);
    let mut weir = builder.clone().start();
    let old = connect(weir.port(), "postgres", "postgres").await.unwrap();
    assert_eq!(q1(&old, "select 1").await, "1");
    assert!(
        connect(weir.port(), "second", "postgres").await.is_err(),
        "db 'second' not configured yet"
    );

    weir.reload_with(builder.set("default_pool_size", 3).database(
        "second",
        &format!("host=127.0.0.1 port={} dbname=second", pg.port()),
    ));
    // The new database becomes reachable.
    let port = weir.port();
    let ok = eventually_async(TIMEOUT, move || async move {
        match connect(port, "second", "postgres").await {
            Ok(c) => {
                q(&c, "select current_database()").await.ok() == Some(vec![Some("second".into())])
            }
            Err(_) => false,
        }
    })
    .await;
    assert!(
        ok,
        "new database not usable after SIGHUP\n{}",
        weir.log_tail()
    );
    // The old connection survived the reload.
    assert_eq!(q1(&old, "select 'survived'").await, "survived");
    // Three clients can now each hold a server inside a transaction.
    let mut clients = Vec::new();
    let mut pids = Vec::new();
    for i in 0..3 {
        let c = connect(weir.port(), "postgres", "postgres").await.unwrap();
        q(&c, "begin").await.unwrap();
        let pid = q(&c, "select pg_backend_pid()").await.unwrap_or_else(|e| {
            panic!("client {i} got no server: pool size still 1 after reload? {e:?}")
        });
        pids.push(pid[0].clone().unwrap());
        clients.push(c);
    }
    pids.sort();
    pids.dedup();
    assert_eq!(
        pids.len(),
        3,
        "three open transactions must be on three servers"
    );
    assert!(weir.is_running());
}

/// SIGHUP with an invalid config keeps the old config and keeps serving.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn sighup_with_broken_config_keeps_running() {
    let pg = PgServer::start();
    let builder = Weir::for_pg(&pg).set("pool_mode", "transaction");
    let mut weir = builder.clone().start();
    let c = connect(weir.port(), "postgres", "postgres").await.unwrap();
    weir.reload_with(builder.set("no_such_option_anywhere", "1"));
    tokio::time::sleep(Duration::from_millis(500)).await;
    assert!(
        weir.is_running(),
        "weir exited on a bad reload\n{}",
        weir.log_tail()
    );
    assert_eq!(q1(&c, "select 'alive'").await, "alive");
    assert_serving(&weir, "postgres", "postgres").await;
}

/// SIGINT: a transaction in progress can finish (and commits); new clients
/// are refused; then weir exits.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn sigint_waits_for_transactions_then_exits() {
    let pg = PgServer::start();
    pg.exec("create table t (x int)");
    let mut weir = Weir::for_pg(&pg).set("pool_mode", "transaction").start();
    let a = connect(weir.port(), "postgres", "postgres").await.unwrap();
    q(&a, "begin").await.unwrap();
    q(&a, "insert into t values (1)").await.unwrap();
    weir.signal(libc::SIGINT);
    tokio::time::sleep(Duration::from_millis(300)).await;
    assert!(
        weir.is_running(),
        "weir exited on SIGINT with a transaction open"
    );
    // New clients are not accepted any more.
    match connect(weir.port(), "postgres", "postgres").await {
        Ok(c) => {
            let r = q(&c, "select 1").await;
            assert!(r.is_err(), "a new client was served after SIGINT");
        }
        Err(e) => {
            if let Some(f) = db_error(&e) {
                assert_eq!(f.code, "57P01", "{f:?}");
            }
        }
    }
    // The open transaction finishes normally.
    q(&a, "insert into t values (2)").await.unwrap();
    q(&a, "commit").await.unwrap();
    let st = weir.wait_exit(TIMEOUT);
    assert!(
        st.is_some(),
        "weir did not exit after the last transaction ended"
    );
    assert_eq!(
        pg.psql("select string_agg(x::text, ',' order by x) from t"),
        "1,2"
    );
}

/// SIGINT with no transaction in progress: exits promptly with status 0.
#[test]
fn sigint_when_idle_exits_cleanly() {
    let pg = PgServer::start();
    let mut weir = Weir::for_pg(&pg).set("pool_mode", "transaction").start();
    let mut c = RawConn::startup(weir.port(), "postgres", "postgres", &[]).unwrap();
    c.query_one("select 1");
    weir.signal(libc::SIGINT);
    let st = weir
        .wait_exit(TIMEOUT)
        .expect("weir did not exit on SIGINT while idle");
    assert!(st.success(), "exit status {st}");
}

/// SIGTERM with `shutdown_on_sigterm = immediate` (PgBouncer up to 1.22): exits at once
/// even with a transaction open; that transaction is not committed.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn sigterm_immediate_exits_at_once() {
    let pg = PgServer::start();
    pg.exec("create table t (x int)");
    let mut weir = Weir::for_pg(&pg)
        .set("pool_mode", "transaction")
        .set("shutdown_on_sigterm", "immediate")
        .start();
    let a = connect(weir.port(), "postgres", "postgres").await.unwrap();
    q(&a, "begin").await.unwrap();
    q(&a, "insert into t values (1)").await.unwrap();
    weir.signal(libc::SIGTERM);
    let st = weir.wait_exit(TIMEOUT);
    assert!(
        st.is_some(),
        "weir did not exit on SIGTERM with a transaction open"
    );
    assert!(
        q(&a, "commit").await.is_err(),
        "the client's connection survived SIGTERM"
    );
    assert!(
        eventually(TIMEOUT, || pg.count_backends("postgres") == 0),
        "weir's server connections outlived it"
    );
    assert_eq!(pg.psql("select count(*) from t"), "0");
}

/// SIGUSR1 and SIGUSR2 are PgBouncer's PAUSE and RESUME (its test_misc.py:
/// test_sigusr2_during_shutdown): a query sent while paused waits and runs on SIGUSR2,
/// and during a shutdown SIGUSR2 is ignored, with PgBouncer's log lines. Unhandled,
/// either signal would end the process (the default action). About 1 s.
#[test]
fn sigusr1_pauses_and_sigusr2_resumes() {
    use common::console::ok;
    let pg = PgServer::start();
    let mut weir = Weir::for_pg(&pg)
        .set("pool_mode", "transaction")
        .set("admin_users", "postgres")
        .start();
    let mut c = RawConn::startup(weir.port(), "postgres", "postgres", &[]).unwrap();
    assert_eq!(c.query_one("select 1"), "1");
    let mut a = RawConn::startup(weir.port(), "postgres", "pgbouncer", &[]).unwrap();

    weir.signal(libc::SIGUSR1);
    weir.wait_for_log("got SIGUSR1, pausing all activity");
    assert_eq!(
        ok(&mut a, "SHOW STATE").get("key", "paused", "value"),
        "yes"
    );
    c.set_read_timeout(Duration::from_millis(300));
    c.send(&proto::query("select 'held'"));
    assert!(
        c.read_message().is_err(),
        "a query ran while paused\n{}",
        weir.log_tail()
    );
    weir.signal(libc::SIGUSR1);
    weir.wait_for_log("got SIGUSR1, but already paused/suspended");

    weir.signal(libc::SIGUSR2);
    c.set_read_timeout(TIMEOUT);
    let rows: Vec<_> = c
        .read_until_ready()
        .into_iter()
        .filter(|m| m.tag == b'D')
        .map(|m| proto::data_row(&m.body))
        .collect();
    assert_eq!(rows, vec![vec![Some("held".to_owned())]]);
    weir.wait_for_log("got SIGUSR2, continuing from PAUSE");
    weir.signal(libc::SIGUSR2);
    weir.wait_for_log("got SIGUSR2, but not paused/suspended");

    assert_eq!(
        ok(&mut a, "SHUTDOWN WAIT_FOR_CLIENTS").tags,
        vec!["SHUTDOWN"]
    );
    weir.signal(libc::SIGUSR2);
    weir.wait_for_log("got SIGUSR2 while shutting down, ignoring");
    assert_eq!(c.query_one("select 'still served'"), "still served");
    c.send(&proto::terminate());
    assert!(
        weir.wait_exit(TIMEOUT).is_some(),
        "no exit once the client left\n{}",
        weir.log_tail()
    );
}
