//! Listening: several addresses (IPv4, IPv6 ::1, *) and the Unix socket
//! `.s.PGSQL.<port>` in unix_socket_dir.

mod common;

use common::*;

async fn select_via(config: &tokio_postgres::Config) -> String {
    let c = connect_with(config)
        .await
        .unwrap_or_else(|e| panic!("connect {config:?}: {e:?}"));
    q1(&c, "select 'hello'").await
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn listens_on_unix_socket() {
    let pg = PgServer::start();
    let weir = Weir::for_pg(&pg).start();
    let sock = weir.socket_path();
    assert!(sock.exists(), "no Unix socket at {sock:?}");
    let mut cfg = tokio_postgres::Config::new();
    cfg.host_path(weir.dir())
        .port(weir.port())
        .user("postgres")
        .dbname("postgres");
    match connect_with(&cfg).await {
        Ok(c) => assert_eq!(q1(&c, "select 'hello'").await, "hello"),
        Err(e) => panic!(
            "connect {sock:?}: {e:?}\nalive: {}\n{}\n{}",
            std::path::Path::new(&format!("/proc/{}", weir.pid())).exists(),
            std::fs::read_to_string("/proc/net/unix")
                .unwrap_or_default()
                .lines()
                .filter(|l| l.contains("weir-test"))
                .collect::<Vec<_>>()
                .join("\n"),
            weir.log_tail()
        ),
    }
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn empty_unix_socket_dir_disables_unix_socket() {
    let pg = PgServer::start();
    let weir = Weir::for_pg(&pg).set("unix_socket_dir", "").start();
    assert!(!weir.socket_path().exists());
    assert_serving(&weir, "postgres", "postgres").await;
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn listens_on_ipv4_and_ipv6_loopback() {
    if !ipv6_available() {
        eprintln!("skipped: no IPv6 loopback on this machine");
        return;
    }
    let pg = PgServer::start();
    let weir = Weir::for_pg(&pg)
        .set("listen_addr", "127.0.0.1,::1")
        .start();
    let mut v6 = tokio_postgres::Config::new();
    v6.host("::1")
        .port(weir.port())
        .user("postgres")
        .dbname("postgres");
    assert_eq!(select_via(&v6).await, "hello");
    assert_eq!(
        select_via(&pg_config(weir.port(), "postgres", "postgres")).await,
        "hello"
    );
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn listen_addr_star_listens_everywhere() {
    let pg = PgServer::start();
    let weir = Weir::for_pg(&pg).set("listen_addr", "*").start();
    assert_eq!(
        select_via(&pg_config(weir.port(), "postgres", "postgres")).await,
        "hello"
    );
    if ipv6_available() {
        let mut v6 = tokio_postgres::Config::new();
        v6.host("::1")
            .port(weir.port())
            .user("postgres")
            .dbname("postgres");
        assert_eq!(select_via(&v6).await, "hello");
    }
}

/// Weir can reach PostgreSQL over its Unix socket (host = a directory).
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn server_over_unix_socket() {
    let pg = PgServer::start();
    let weir = Weir::builder()
        .database(
            "postgres",
            &format!(
                "host={} port={} dbname=postgres",
                pg.socket_dir().display(),
                pg.port()
            ),
        )
        .start();
    let c = connect(weir.port(), "postgres", "postgres").await.unwrap();
    // A Unix-socket backend has no client address.
    assert_eq!(
        q1(&c, "select coalesce(client_addr::text, 'unix') from pg_stat_activity where pid = pg_backend_pid()").await,
        "unix"
    );
}
