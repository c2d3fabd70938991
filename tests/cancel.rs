//! Cancel requests: they reach the server running that client's query, and
//! they never wait for a pool slot.

// Tests run on their own runtime, which has a time driver (clippy.toml is for Weir's
// workers).
#![allow(clippy::disallowed_methods)]

mod common;

use common::*;
use std::time::Duration;
use tokio_postgres::NoTls;

fn weir(pg: &PgServer, mode: &str, pool_size: u32) -> Weir {
    Weir::for_pg(pg)
        .set("pool_mode", mode)
        .set("default_pool_size", pool_size)
        .set("query_wait_timeout", 60)
        .start()
}

/// Two clients run long queries on two servers; cancelling one cancels that
/// one only.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn cancel_reaches_the_right_server() {
    let pg = PgServer::start();
    let weir = weir(&pg, "transaction", 2);
    let a = connect(weir.port(), "postgres", "postgres").await.unwrap();
    let b = connect(weir.port(), "postgres", "postgres").await.unwrap();
    let token_a = a.cancel_token();
    let a_task =
        tokio::spawn(async move { a.simple_query("select pg_sleep(60)").await.map(|_| ()) });
    let b_task = tokio::spawn(async move {
        b.simple_query("select pg_sleep(3), 'b done'")
            .await
            .map(|_| ())
    });
    // Wait until both sleeps run on the server.
    let ok = eventually(TIMEOUT, || {
        pg.count_backends_where("query like 'select pg_sleep(%' and state = 'active'") == 2
    });
    assert!(ok, "the two queries never ran at the same time");
    token_a
        .cancel_query(NoTls)
        .await
        .unwrap_or_else(|e| panic!("sending the cancel request to weir failed: {e:?}"));
    let a_res = tokio::time::timeout(TIMEOUT, a_task)
        .await
        .expect("cancelled query did not end: the cancel did not reach its server")
        .unwrap();
    let e = a_res.expect_err("A's query was not cancelled");
    assert_eq!(expect_db_error(&e).code, "57014", "{e:?}");
    let b_res = tokio::time::timeout(TIMEOUT, b_task)
        .await
        .expect("B hung")
        .unwrap();
    assert!(
        b_res.is_ok(),
        "B's query was cancelled instead of A's: {b_res:?}"
    );
}

/// Same in session mode.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn cancel_in_session_mode() {
    let pg = PgServer::start();
    let weir = weir(&pg, "session", 2);
    let a = connect(weir.port(), "postgres", "postgres").await.unwrap();
    let token = a.cancel_token();
    let task = tokio::spawn(async move {
        let r = a.simple_query("select pg_sleep(60)").await.map(|_| ());
        (a, r)
    });
    assert!(eventually(TIMEOUT, || pg.count_backends_where(
        "query = 'select pg_sleep(60)' and state = 'active'"
    ) == 1));
    token.cancel_query(NoTls).await.unwrap();
    let (a, r) = tokio::time::timeout(TIMEOUT, task)
        .await
        .expect("cancel did not work")
        .unwrap();
    assert_eq!(expect_db_error(&r.unwrap_err()).code, "57014");
    // The session goes on.
    assert_eq!(q1(&a, "select 'still here'").await, "still here");
}

/// With the pool exhausted (one server, busy, and another client queued for
/// it) a cancel request still gets through at once.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn cancel_does_not_wait_for_a_pool_slot() {
    let pg = PgServer::start();
    let weir = weir(&pg, "transaction", 1);
    let a = connect(weir.port(), "postgres", "postgres").await.unwrap();
    let c = connect(weir.port(), "postgres", "postgres").await.unwrap();
    let token = a.cancel_token();
    let a_task =
        tokio::spawn(async move { a.simple_query("select pg_sleep(60)").await.map(|_| ()) });
    assert!(eventually(TIMEOUT, || pg.count_backends_where(
        "query = 'select pg_sleep(60)' and state = 'active'"
    ) == 1));
    // C queues for the only server.
    let c_task = tokio::spawn(async move { q(&c, "select 'c served'").await });
    tokio::time::sleep(Duration::from_millis(300)).await;
    token.cancel_query(NoTls).await.unwrap();
    let r = tokio::time::timeout(TIMEOUT, a_task)
        .await
        .expect("the cancel waited behind the pool (A's 60 s query was not cancelled)")
        .unwrap();
    assert_eq!(expect_db_error(&r.unwrap_err()).code, "57014");
    let rows = tokio::time::timeout(TIMEOUT, c_task)
        .await
        .expect("C never served")
        .unwrap()
        .unwrap();
    assert_eq!(rows, vec![Some("c served".to_string())]);
}

/// A cancel request with a key Weir never gave out cancels nothing.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn cancel_with_wrong_key_cancels_nothing() {
    let pg = PgServer::start();
    let weir = weir(&pg, "transaction", 2);
    let mut a = RawConn::startup(weir.port(), "postgres", "postgres", &[]).unwrap();
    let (pid, key) = a.key.expect("no BackendKeyData");
    a.send(&proto::query("select pg_sleep(2), 'finished'"));
    assert!(eventually(TIMEOUT, || pg.count_backends_where(
        "query like 'select pg_sleep(2)%' and state = 'active'"
    ) == 1));
    let mut bogus = RawConn::connect(weir.port());
    bogus.send(&proto::cancel_request(pid, key.wrapping_add(1)));
    assert!(bogus.closes(), "weir must close a cancel connection");
    let mut bogus = RawConn::connect(weir.port());
    bogus.send(&proto::cancel_request(pid.wrapping_add(1), key));
    assert!(bogus.closes(), "weir must close a cancel connection");
    let msgs = a.read_until_ready();
    assert!(
        !msgs.iter().any(|m| m.tag == b'E'),
        "a cancel with a wrong key cancelled the query: {:?}",
        msgs.iter()
            .filter(|m| m.tag == b'E')
            .map(|m| proto::parse_error(&m.body))
            .collect::<Vec<_>>()
    );
}

/// Cancelling a client that is idle (no query running) is harmless: its next
/// query runs normally, and so do other clients' queries on the server.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn cancel_of_idle_client_is_harmless() {
    let pg = PgServer::start();
    let weir = weir(&pg, "transaction", 1);
    let a = connect(weir.port(), "postgres", "postgres").await.unwrap();
    let b = connect(weir.port(), "postgres", "postgres").await.unwrap();
    q1(&a, "select 1").await;
    let b_task = tokio::spawn(async move { q(&b, "select pg_sleep(1), 'b'").await.map(|_| ()) });
    assert!(eventually(TIMEOUT, || pg.count_backends_where(
        "query like 'select pg_sleep(1)%' and state = 'active'"
    ) == 1));
    a.cancel_token().cancel_query(NoTls).await.unwrap();
    let r = tokio::time::timeout(TIMEOUT, b_task)
        .await
        .expect("B hung")
        .unwrap();
    assert!(
        r.is_ok(),
        "cancelling idle A cancelled B's query on the shared server: {r:?}"
    );
    assert_eq!(q1(&a, "select 'a'").await, "a");
}
