//! Clients queued for a server: the task that releases a server sends the longest waiter's
//! request to it before handing it over (pool::ahead). What a client sees must not change:
//! its own session parameters, its own results, nothing run for a client that left.

// Tests run on their own runtime, which has a time driver (clippy.toml is for Weir's
// workers).
#![allow(clippy::disallowed_methods)]

mod common;

use common::*;
use std::time::Duration;

fn one_server(pg: &PgServer) -> Weir {
    Weir::for_pg(pg)
        .set("pool_mode", "transaction")
        .set("default_pool_size", 1)
        .set("admin_users", "postgres")
        .start()
}

/// Clients waiting for a pool's server, as SHOW POOLS counts them.
fn waiting(weir: &Weir) -> i64 {
    let out = psql_via(weir, "pgbouncer", "postgres", "SHOW POOLS")
        .unwrap_or_else(|e| panic!("SHOW POOLS failed: {e}"));
    out.lines()
        .filter(|l| l.starts_with("postgres|"))
        .map(|l| {
            l.split('|')
                .nth(3)
                .and_then(|v| v.parse().ok())
                .unwrap_or(0)
        })
        .sum()
}

/// A client with its own application_name and (set after login, as PgBouncer refuses the
/// `options` startup parameter) TimeZone.
async fn connect_as(weir: &Weir, app: &str, tz: &str) -> tokio_postgres::Client {
    let mut cfg = pg_config(weir.port(), "postgres", "postgres");
    cfg.application_name(app);
    let c = connect_with(&cfg).await.unwrap();
    q(&c, &format!("set timezone = '{tz}'")).await.unwrap();
    c
}

/// A queued client's request runs on the released server, and sees its own results.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn queued_request_runs_on_the_released_server() {
    let pg = PgServer::start();
    let weir = one_server(&pg);
    let a = connect(weir.port(), "postgres", "postgres").await.unwrap();
    let b = connect(weir.port(), "postgres", "postgres").await.unwrap();
    q(&a, "begin").await.unwrap();
    let pid = q1(&a, "select pg_backend_pid()").await;
    // Extended protocol (Parse/Bind/Execute/Sync) while queued.
    let b_task = tokio::spawn(async move {
        let rows = b
            .query("select pg_backend_pid()::text, $1::text", &[&"from b"])
            .await
            .unwrap();
        let simple = q1(&b, "select 'simple from b'").await;
        (
            rows[0].get::<_, String>(0),
            rows[0].get::<_, String>(1),
            simple,
        )
    });
    assert!(eventually(TIMEOUT, || waiting(&weir) == 1));
    q(&a, "commit").await.unwrap();
    let (b_pid, value, simple) = tokio::time::timeout(TIMEOUT, b_task)
        .await
        .expect("B was never served")
        .unwrap();
    assert_eq!(b_pid, pid, "B did not get the released server");
    assert_eq!(value, "from b");
    assert_eq!(simple, "simple from b");
    assert_eq!(q1(&a, "select 'a again'").await, "a again");
}

/// A request may only go ahead to a server that already has the waiter's session
/// parameters; otherwise the waiter's own values are set first.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn queued_client_with_other_parameters_gets_them_first() {
    let pg = PgServer::start();
    let weir = one_server(&pg);
    let a = connect_as(&weir, "client_a", "UTC").await;
    let b = std::sync::Arc::new(connect_as(&weir, "client_b", "Asia/Tokyo").await);
    for _ in 0..3 {
        q(&a, "begin").await.unwrap();
        assert_eq!(q1(&a, "show application_name").await, "client_a");
        let b_task = tokio::spawn({
            let b = b.clone();
            async move {
                let app = q1(&b, "show application_name").await;
                let tz = q1(&b, "show timezone").await;
                (app, tz)
            }
        });
        assert!(eventually(TIMEOUT, || waiting(&weir) == 1));
        q(&a, "commit").await.unwrap();
        let (app, tz) = tokio::time::timeout(TIMEOUT, b_task)
            .await
            .expect("B was never served")
            .unwrap();
        assert_eq!(app, "client_b", "B's query ran with A's application_name");
        assert_eq!(tz, "Asia/Tokyo", "B's query ran with A's TimeZone");
        assert_eq!(q1(&a, "show timezone").await, "UTC");
    }
}

/// A client that leaves the queue has nothing run for it: its request is not sent to the
/// server released after it left.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn request_of_a_client_that_left_the_queue_is_not_run() {
    let pg = PgServer::start();
    pg.exec("create table handoff (x int)");
    let weir = one_server(&pg);
    let a = connect(weir.port(), "postgres", "postgres").await.unwrap();
    q(&a, "begin").await.unwrap();
    q(&a, "select 1").await.unwrap();
    let mut b = RawConn::startup(weir.port(), "postgres", "postgres", &[]).unwrap();
    b.send(&proto::query("insert into handoff values (1)"));
    assert!(eventually(TIMEOUT, || waiting(&weir) == 1));
    drop(b);
    assert!(
        eventually(TIMEOUT, || waiting(&weir) == 0),
        "Weir did not notice the queued client leave"
    );
    q(&a, "commit").await.unwrap();
    // The server goes back to the pool clean and serves the next client.
    let c = connect(weir.port(), "postgres", "postgres").await.unwrap();
    assert_eq!(q1(&c, "select count(*) from handoff").await, "0");
    assert_eq!(q1(&a, "select count(*) from handoff").await, "0");
}

/// Many clients through one server, each checking that it gets its own answers.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn many_queued_clients_each_get_their_own_results() {
    let pg = PgServer::start();
    let weir = one_server(&pg);
    let mut tasks = Vec::new();
    for i in 0..20 {
        let port = weir.port();
        tasks.push(tokio::spawn(async move {
            let c = connect(port, "postgres", "postgres").await.unwrap();
            for j in 0..30 {
                let want = format!("{i}-{j}");
                if j % 2 == 0 {
                    assert_eq!(q1(&c, &format!("select '{want}'")).await, want);
                } else {
                    let rows = c.query("select $1::text", &[&want]).await.unwrap();
                    assert_eq!(rows[0].get::<_, String>(0), want);
                }
            }
        }));
    }
    join_all_within(tasks, Duration::from_secs(60), "a client was not served").await;
}

/// Time spent in the queue counts as wait time, not as query time, whether or not the
/// request went ahead (here it cannot: the two clients' parameters differ).
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn queue_wait_is_not_counted_as_query_time() {
    let pg = PgServer::start();
    let weir = one_server(&pg);
    let a = connect_as(&weir, "client_a", "UTC").await;
    let b = connect_as(&weir, "client_b", "Asia/Tokyo").await;
    q(&a, "begin").await.unwrap();
    let b_task = tokio::spawn(async move { q1(&b, "show application_name").await });
    assert!(eventually(TIMEOUT, || waiting(&weir) == 1));
    tokio::time::sleep(Duration::from_millis(1500)).await;
    q(&a, "commit").await.unwrap();
    assert_eq!(b_task.await.unwrap(), "client_b");
    let stats = psql_via(&weir, "pgbouncer", "postgres", "SHOW STATS").unwrap();
    let row: Vec<i64> = stats
        .lines()
        .find(|l| l.starts_with("postgres|"))
        .unwrap_or_else(|| panic!("no stats for postgres in {stats}"))
        .split('|')
        .skip(1)
        .map(|v| v.parse().unwrap_or(0))
        .collect();
    let (query_us, wait_us) = (row[6], row[7]);
    assert!(wait_us >= 1_000_000, "wait time {wait_us} us");
    assert!(
        query_us < 1_000_000,
        "the queue wait was counted as query time: {query_us} us of queries (wait {wait_us} us)"
    );
}
