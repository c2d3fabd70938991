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

/// A TCP proxy in front of PostgreSQL that passes everything on, but keeps a cancel
/// request's connection open for `hold` after PostgreSQL has closed its side, as a slow
/// network would: Weir must not lend the cancelled server to another client meanwhile.
async fn slow_cancel_proxy(pg_port: u16, hold: Duration) -> u16 {
    let listener = tokio::net::TcpListener::bind("127.0.0.1:0").await.unwrap();
    let port = listener.local_addr().unwrap().port();
    tokio::spawn(async move {
        loop {
            let Ok((mut client, _)) = listener.accept().await else {
                return;
            };
            tokio::spawn(async move {
                use tokio::io::{AsyncReadExt, AsyncWriteExt};
                let mut head = [0u8; 8];
                if client.read_exact(&mut head).await.is_err() {
                    return;
                }
                let Ok(mut server) = tokio::net::TcpStream::connect(("127.0.0.1", pg_port)).await
                else {
                    return;
                };
                let _ = server.write_all(&head).await;
                let cancel = head[4..8] == 80877102u32.to_be_bytes();
                if cancel {
                    let mut rest = [0u8; 8];
                    let _ = client.read_exact(&mut rest).await;
                    let _ = server.write_all(&rest).await;
                    let mut sink = Vec::new();
                    let _ = server.read_to_end(&mut sink).await;
                    tokio::time::sleep(hold).await;
                    return;
                }
                let _ = tokio::io::copy_bidirectional(&mut client, &mut server).await;
            });
        }
    });
    port
}

/// Until the cancel request sent for its query is done, a server is not lent to the next
/// client (SHOW POOLS sv_being_canceled): PostgreSQL signals a cancelled backend twice,
/// and a late second signal would cancel that client's query (PgBouncer 1.18 does the
/// same).
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_cancelled_server_waits_for_its_cancel_to_finish() {
    let pg = PgServer::start();
    let proxy = slow_cancel_proxy(pg.port(), Duration::from_millis(1500)).await;
    let weir = Weir::builder()
        .database(
            "postgres",
            &format!("host=127.0.0.1 port={proxy} dbname=postgres"),
        )
        .set("pool_mode", "transaction")
        .set("default_pool_size", 1)
        .set("admin_users", "postgres")
        .start();
    let a = connect(weir.port(), "postgres", "postgres").await.unwrap();
    let b = connect(weir.port(), "postgres", "postgres").await.unwrap();
    let token = a.cancel_token();
    let a_task = tokio::spawn(async move { q(&a, "select pg_sleep(30)").await.map(|_| ()) });
    assert!(eventually(TIMEOUT, || {
        pg.count_backends_where("query = 'select pg_sleep(30)' and state = 'active'") == 1
    }));
    token.cancel_query(NoTls).await.unwrap();
    let err = tokio::time::timeout(TIMEOUT, a_task)
        .await
        .unwrap()
        .unwrap();
    assert_eq!(expect_db_error(&err.unwrap_err()).code, "57014");
    // The cancel connection is still open: the server waits, and B with it.
    let started = std::time::Instant::now();
    let b_task = tokio::spawn(async move { q1(&b, "select 'b'").await });
    let held = eventually(Duration::from_secs(1), || {
        let mut c =
            common::proto::RawConn::startup(weir.port(), "postgres", "pgbouncer", &[]).unwrap();
        common::console::ok(&mut c, "SHOW POOLS").num("database", "postgres", "sv_being_canceled")
            == 1
    });
    assert!(held, "SHOW POOLS never showed the server being canceled");
    assert_eq!(
        tokio::time::timeout(TIMEOUT, b_task)
            .await
            .unwrap()
            .unwrap(),
        "b"
    );
    let waited = started.elapsed();
    assert!(
        waited >= Duration::from_millis(1000),
        "B ran on the cancelled server after {waited:?}, before its cancel was done"
    );
}

/// Sends SIGCONT to the stopped postmaster whatever ends the test, so that PostgreSQL can
/// be shut down.
struct Continue(i32);

impl Drop for Continue {
    fn drop(&mut self) {
        unsafe { libc::kill(self.0, libc::SIGCONT) };
    }
}

/// cancel_wait_timeout (PgBouncer's test_timeouts.py: test_cancel_wait_timeout): a cancel
/// request the server never takes (its postmaster stopped: the kernel accepts the
/// connection, nobody reads it) is given up after cancel_wait_timeout, logged in
/// PgBouncer's words, where Weir used to wait a fixed 10 s. About 4 s.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_cancel_the_server_never_takes_ends_at_cancel_wait_timeout() {
    let pg = PgServer::start();
    let weir = Weir::for_pg(&pg)
        .set("pool_mode", "session")
        .set("cancel_wait_timeout", 1)
        .start();
    let a = connect(weir.port(), "postgres", "postgres").await.unwrap();
    let token = a.cancel_token();
    let task = tokio::spawn(async move { a.simple_query("select pg_sleep(2)").await.map(|_| ()) });
    assert!(
        eventually(TIMEOUT, || {
            pg.count_backends_where("query like 'select pg_sleep(%' and state = 'active'") == 1
        }),
        "the query never ran"
    );
    let pid_file = std::fs::read_to_string(pg.data_dir().join("postmaster.pid")).unwrap();
    let postmaster: i32 = pid_file.lines().next().unwrap().trim().parse().unwrap();
    let stopped = Continue(postmaster);
    assert_eq!(unsafe { libc::kill(postmaster, libc::SIGSTOP) }, 0);
    let sent = std::time::Instant::now();
    token
        .cancel_query(NoTls)
        .await
        .unwrap_or_else(|e| panic!("sending the cancel request to weir failed: {e:?}"));
    weir.wait_for_log("closing because: cancel_wait_timeout");
    assert!(
        sent.elapsed() < Duration::from_secs(8),
        "given up after {:?}, not after cancel_wait_timeout",
        sent.elapsed()
    );
    drop(stopped);
    // The stopped postmaster may still act on the request it finds queued once it runs
    // again: the query ends either way, and Weir goes on serving.
    let _ = tokio::time::timeout(TIMEOUT, task)
        .await
        .expect("the query never ended");
    assert_serving(&weir, "postgres", "postgres").await;
}
