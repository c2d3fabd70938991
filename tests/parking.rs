//! Idle clients are parked: after about a second without a request their task ends and
//! the session waits, boxed, until the client speaks again (client::park). A parked
//! client must not notice: its session parameters, timeouts, KILL and shutdown all reach
//! it as before, and a client that hangs up while parked is let go.

mod common;

use common::*;
use std::time::{Duration, Instant};

fn with_http(pg: &PgServer, extra: &[(&str, &str)]) -> (Weir, u16) {
    let http = free_port();
    let mut b = Weir::for_pg(pg)
        .set("pool_mode", "transaction")
        .set("admin_users", "postgres")
        .set("http_listen", format!("127.0.0.1:{http}"));
    for (k, v) in extra {
        b = b.set(k, *v);
    }
    let weir = b.start();
    assert!(
        eventually(TIMEOUT, || http_get(http, "/healthz").is_ok()),
        "nothing listens on http_listen\n{}",
        weir.log_tail()
    );
    (weir, http)
}

fn parked(http: u16) -> f64 {
    metric(http, "weir_clients_parked").unwrap_or(-1.0)
}

fn wait_parked(weir: &Weir, http: u16, n: f64) {
    assert!(
        eventually(TIMEOUT, || parked(http) == n),
        "expected {n} parked clients, /metrics says {}\n{}",
        parked(http),
        weir.log_tail()
    );
}

/// A raw client that ran one query and is now parked.
fn parked_raw_client(weir: &Weir, http: u16) -> RawConn {
    let mut c = RawConn::startup(weir.port(), "postgres", "postgres", &[]).unwrap();
    assert_eq!(c.query_one("select 1"), "1");
    wait_parked(weir, http, 1.0);
    c.set_read_timeout(TIMEOUT);
    c
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn parked_client_resumes_with_its_session() {
    let pg = PgServer::start();
    let (weir, http) = with_http(&pg, &[]);
    let c = connect(weir.port(), "postgres", "postgres").await.unwrap();
    q(&c, "set timezone = 'Asia/Tokyo'").await.unwrap();
    for round in 0..2 {
        wait_parked(&weir, http, 1.0);
        assert_eq!(q1(&c, "show timezone").await, "Asia/Tokyo", "round {round}");
        let rows = c.query("select $1::int + 1", &[&41i32]).await.unwrap();
        assert_eq!(rows[0].get::<_, i32>(0), 42);
    }
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn parked_unix_socket_client_resumes() {
    let pg = PgServer::start();
    let (weir, http) = with_http(&pg, &[]);
    let mut cfg = tokio_postgres::Config::new();
    cfg.host_path(weir.dir())
        .port(weir.port())
        .user("postgres")
        .dbname("postgres");
    let c = connect_with(&cfg).await.unwrap();
    wait_parked(&weir, http, 1.0);
    assert_eq!(q1(&c, "select 'over unix'").await, "over unix");
}

#[test]
fn parked_client_that_hangs_up_is_let_go() {
    let pg = PgServer::start();
    let (weir, http) = with_http(&pg, &[]);
    drop(parked_raw_client(&weir, http));
    assert!(
        eventually(TIMEOUT, || metric(http, "weir_client_connections")
            == Some(0.0)),
        "the client that hung up is still counted\n{}",
        weir.log_tail()
    );
    assert_eq!(parked(http), 0.0);
}

/// client_idle_timeout counts from the client's last transaction, parked or not.
#[test]
fn client_idle_timeout_reaches_a_parked_client() {
    let pg = PgServer::start();
    let (weir, http) = with_http(&pg, &[("client_idle_timeout", "3")]);
    let mut c = RawConn::startup(weir.port(), "postgres", "postgres", &[]).unwrap();
    assert_eq!(c.query_one("select 1"), "1");
    let idle_from = Instant::now();
    wait_parked(&weir, http, 1.0);
    c.set_read_timeout(Duration::from_secs(20));
    let e = c.expect_error();
    assert_eq!(
        (e.severity.as_str(), e.code.as_str(), e.message.as_str()),
        ("FATAL", "57P05", "client_idle_timeout")
    );
    let after = idle_from.elapsed();
    assert!(
        after >= Duration::from_millis(2500) && after < Duration::from_secs(10),
        "client_idle_timeout=3 fired after {after:?}"
    );
    assert!(c.closes());
}

#[test]
fn kill_reaches_a_parked_client() {
    let pg = PgServer::start();
    let (weir, http) = with_http(&pg, &[]);
    let mut c = parked_raw_client(&weir, http);
    psql_via(&weir, "pgbouncer", "postgres", "KILL postgres").unwrap();
    let e = c.expect_error();
    assert_eq!(
        (e.severity.as_str(), e.message.as_str()),
        ("FATAL", "database removed")
    );
    assert!(c.closes());
}

#[test]
fn safe_shutdown_reaches_a_parked_client() {
    let pg = PgServer::start();
    let (mut weir, http) = with_http(&pg, &[]);
    let mut c = parked_raw_client(&weir, http);
    weir.signal(libc::SIGINT);
    let e = c.expect_error();
    assert_eq!(e.code, "57P01", "{e:?}");
    assert!(
        weir.wait_exit(TIMEOUT).is_some(),
        "weir did not exit on SIGINT with a parked client"
    );
}

/// Many clients parked at once, then all asking at once.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn many_parked_clients_resume_together() {
    let pg = PgServer::start();
    let (weir, http) = with_http(
        &pg,
        &[("default_pool_size", "4"), ("max_client_conn", "300")],
    );
    let mut clients = Vec::new();
    for _ in 0..200 {
        clients.push(connect(weir.port(), "postgres", "postgres").await.unwrap());
    }
    wait_parked(&weir, http, 200.0);
    let tasks: Vec<_> = clients
        .into_iter()
        .enumerate()
        .map(|(i, c)| {
            tokio::spawn(async move {
                assert_eq!(q1(&c, &format!("select {i}")).await, i.to_string());
                c
            })
        })
        .collect();
    join_all_within(tasks, TIMEOUT, "a resumed client was not served").await;
}
