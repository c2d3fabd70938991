//! Limits and timeouts: max_client_conn, client_login_timeout,
//! query_wait_timeout, server_connect_timeout; and servers that refuse, hang
//! or die. Each gets a PostgreSQL-style error and Weir keeps serving.

// Tests run on their own runtime, which has a time driver (clippy.toml is for Weir's
// workers).
#![allow(clippy::disallowed_methods)]

mod common;

use common::*;
use std::net::TcpListener;
use std::time::Duration;

#[test]
fn max_client_conn_refuses_extra_clients() {
    let pg = PgServer::start();
    let weir = Weir::for_pg(&pg).set("max_client_conn", 3).start();
    let mut held: Vec<RawConn> = (0..3)
        .map(|_| RawConn::startup(weir.port(), "postgres", "postgres", &[]).unwrap())
        .collect();
    let e = RawConn::startup(weir.port(), "postgres", "postgres", &[])
        .err()
        .expect("a 4th client was accepted with max_client_conn = 3");
    assert_eq!(e.severity, "FATAL");
    assert_eq!(e.code, "53300");
    assert_eq!(e.message, "no more connections allowed (max_client_conn)");
    // The three clients are unaffected.
    for c in &mut held {
        assert_eq!(c.query_one("select 1"), "1");
    }
    // A slot frees up when a client leaves.
    held.pop();
    assert!(
        eventually(TIMEOUT, || RawConn::startup(
            weir.port(),
            "postgres",
            "postgres",
            &[]
        )
        .is_ok()),
        "no client accepted after one of three left"
    );
}

/// A client that stops answering during authentication is dropped with
/// FATAL 08P01 client_login_timeout.
#[test]
fn client_login_timeout_during_authentication() {
    let pg = PgServer::start();
    let weir = Weir::for_pg(&pg)
        .set("auth_type", "md5")
        .userlist(&[("postgres", "pw")])
        .set("client_login_timeout", 1)
        .start();
    let mut c = RawConn::connect(weir.port());
    c.send(&proto::startup_message(&[
        ("user", "postgres"),
        ("database", "postgres"),
    ]));
    let m = c.read_message_or_panic("the password request");
    assert_eq!(m.tag_char(), 'R', "expected an authentication request");
    // ... and never answer it.
    let f = c.expect_error();
    assert_eq!(f.severity, "FATAL");
    assert_eq!(f.code, "08P01");
    assert_eq!(f.message, "client_login_timeout");
    assert!(
        c.closes(),
        "connection not closed after client_login_timeout"
    );
    // Others still log in.
    let rt = tokio::runtime::Runtime::new().unwrap();
    rt.block_on(async {
        let c = connect_pw(weir.port(), "postgres", "postgres", "pw")
            .await
            .unwrap();
        assert_eq!(q1(&c, "select 1").await, "1");
    });
}

/// A client that connects and sends nothing at all is disconnected after
/// client_login_timeout (once accepted: without tcp_defer_accept, at once).
#[test]
fn client_login_timeout_silent_client_is_disconnected() {
    let pg = PgServer::start();
    let weir = Weir::for_pg(&pg)
        .set("client_login_timeout", 1)
        .set("tcp_defer_accept", 0)
        .start();
    let mut c = RawConn::connect(weir.port());
    match c.error_or_eof() {
        None => {}
        Some(f) => assert_eq!(f.code, "08P01", "{f:?}"),
    }
}

/// tcp_defer_accept (on by default on Linux, as in PgBouncer): a connection is taken
/// only once its first bytes arrive, so a silent one is not even timed out yet, and it
/// logs in normally when it speaks.
#[test]
fn tcp_defer_accept_takes_a_connection_when_it_speaks() {
    let pg = PgServer::start();
    let weir = Weir::for_pg(&pg).set("client_login_timeout", 1).start();
    let mut c = RawConn::connect(weir.port());
    c.set_read_timeout(Duration::from_millis(2500));
    match c.read_byte() {
        Err(e)
            if e.kind() == std::io::ErrorKind::WouldBlock
                || e.kind() == std::io::ErrorKind::TimedOut => {}
        other => panic!("a silent connection was accepted and ended: {other:?}"),
    }
    c.set_read_timeout(TIMEOUT);
    c.send(&proto::startup_message(&[
        ("user", "postgres"),
        ("database", "postgres"),
    ]));
    c.finish_login();
    assert_eq!(c.query_one("select 1"), "1");
}

/// query_wait_timeout: a client waiting too long for a server gets FATAL
/// 08P01 query_wait_timeout; the client holding the server is unaffected.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn query_wait_timeout_errors_waiting_client() {
    let pg = PgServer::start();
    let weir = Weir::for_pg(&pg)
        .set("pool_mode", "transaction")
        .set("default_pool_size", 1)
        .set("query_wait_timeout", 1)
        .start();
    assert_waiter_times_out(&weir, "postgres", "postgres").await;
}

/// With the pool's only server held in a transaction, the next client of (`db`, `user`)
/// gets query_wait_timeout; the holder is unaffected.
async fn assert_waiter_times_out(weir: &Weir, db: &str, user: &str) {
    let a = connect(weir.port(), db, user).await.unwrap();
    q(&a, "begin").await.unwrap();
    let e = match connect(weir.port(), db, user).await {
        Err(e) => e,
        Ok(b) => q(&b, "select 1")
            .await
            .expect_err("B was served while A holds the only server"),
    };
    let f = expect_db_error(&e);
    assert_eq!(
        (f.severity.as_str(), f.code.as_str(), f.message.as_str()),
        ("FATAL", "08P01", "query_wait_timeout")
    );
    assert_eq!(q1(&a, "select 'a'").await, "a");
    q(&a, "commit").await.unwrap();
    assert_serving(weir, db, user).await;
}

/// query_wait_timeout on a database entry and in [users] (PgBouncer 1.24+), each for
/// its own pools only.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn query_wait_timeout_per_database_and_per_user() {
    let pg = PgServer::start();
    pg.create_user("app", "apppw", "md5");
    let weir = Weir::for_pg(&pg)
        .set("pool_mode", "transaction")
        .set("default_pool_size", 1)
        .set("query_wait_timeout", 60)
        .database("quick", &format!("{} query_wait_timeout=1", pg.connstr()))
        .user_setting("app", "query_wait_timeout=1")
        .start();
    assert_waiter_times_out(&weir, "quick", "postgres").await;
    assert_waiter_times_out(&weir, "postgres", "app").await;
    // The others wait on: B is served once A commits, 2 s later.
    let a = connect(weir.port(), "postgres", "postgres").await.unwrap();
    q(&a, "begin").await.unwrap();
    let b = tokio::spawn(async move {
        let b = connect(weir.port(), "postgres", "postgres").await?;
        let r = q1(&b, "select 'b'").await;
        Ok::<_, tokio_postgres::Error>((r, weir))
    });
    tokio::time::sleep(Duration::from_secs(2)).await;
    q(&a, "commit").await.unwrap();
    let (r, _weir) = b.await.unwrap().expect("B waits past 1 s and is served");
    assert_eq!(r, "b");
}

/// A server that accepts TCP but never answers the login: after
/// server_connect_timeout the client gets FATAL 08006.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn server_connect_timeout_when_server_never_answers() {
    let pg = PgServer::start();
    // Accepts connections (kernel backlog) but never says anything.
    let blackhole = TcpListener::bind("127.0.0.1:0").unwrap();
    let hole_port = blackhole.local_addr().unwrap().port();
    let weir = Weir::for_pg(&pg)
        .database("hole", &format!("host=127.0.0.1 port={hole_port} dbname=x"))
        .set("server_connect_timeout", 1)
        .set("query_wait_timeout", 20)
        .start();
    let err = match connect(weir.port(), "hole", "postgres").await {
        Err(e) => e,
        Ok(c) => q(&c, "select 1")
            .await
            .expect_err("query through a dead server succeeded"),
    };
    let f = expect_db_error(&err);
    assert_eq!(
        (f.severity.as_str(), f.code.as_str()),
        ("FATAL", "08006"),
        "{f:?}"
    );
    assert!(f.message.contains("timed out"), "{f:?}");
    assert_serving(&weir, "postgres", "postgres").await;
    drop(blackhole);
}

/// A server port where nothing listens: FATAL 08006, others keep working.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn server_refusing_connections_gives_08006() {
    let pg = PgServer::start();
    let closed = free_port();
    let weir = Weir::for_pg(&pg)
        .database(
            "down",
            &format!("host=127.0.0.1 port={closed} dbname=postgres"),
        )
        // The login waits for the server as PgBouncer's do, until this.
        .set("query_wait_timeout", 2)
        .start();
    let err = match connect(weir.port(), "down", "postgres").await {
        Err(e) => e,
        Ok(c) => q(&c, "select 1")
            .await
            .expect_err("query through a closed port succeeded"),
    };
    let f = expect_db_error(&err);
    assert_eq!(
        (f.severity.as_str(), f.code.as_str()),
        ("FATAL", "08006"),
        "{f:?}"
    );
    assert_serving(&weir, "postgres", "postgres").await;
}

/// The server behind a [databases] entry has no such database: the server's
/// FATAL reaches the client (relayed, or as 08006).
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn server_side_unknown_database_is_reported() {
    let pg = PgServer::start();
    let weir = Weir::for_pg(&pg)
        .database(
            "ghostdb",
            &format!("host=127.0.0.1 port={} dbname=not_there", pg.port()),
        )
        .set("query_wait_timeout", 20)
        .start();
    let err = match connect(weir.port(), "ghostdb", "postgres").await {
        Err(e) => e,
        Ok(c) => q(&c, "select 1")
            .await
            .expect_err("query on a missing database succeeded"),
    };
    let f = expect_db_error(&err);
    assert_eq!(f.severity, "FATAL", "{f:?}");
    assert!(f.code == "3D000" || f.code == "08006", "{f:?}");
    assert!(f.message.contains("not_there"), "{f:?}");
    assert_serving(&weir, "postgres", "postgres").await;
}

/// The server process of a client dies in the middle of a transaction: that
/// client gets an error and carries on; other clients and new clients are served.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn server_dying_mid_transaction() {
    let pg = PgServer::start();
    let weir = Weir::for_pg(&pg)
        .set("pool_mode", "transaction")
        .set("default_pool_size", 2)
        .start();
    let a = connect(weir.port(), "postgres", "postgres").await.unwrap();
    let b = connect(weir.port(), "postgres", "postgres").await.unwrap();
    q(&a, "begin").await.unwrap();
    let pid = q1(&a, "select pg_backend_pid()").await;
    pg.exec(&format!("select pg_terminate_backend({pid})"));
    let e = q(&a, "select 1")
        .await
        .expect_err("A's server was killed; its query cannot succeed");
    if let Some(f) = db_error(&e) {
        assert!(f.code == "08006" || f.code == "57P01", "{f:?}");
    }
    // In transaction mode the client keeps its connection: its next transaction runs on
    // another server.
    assert_eq!(q1(&a, "select 'a'").await, "a");
    assert_eq!(q1(&b, "select 'b'").await, "b");
    assert_serving(&weir, "postgres", "postgres").await;
}

/// PostgreSQL restarts: queries fail while it is down; afterwards Weir
/// reconnects and new clients are served, without restarting Weir.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn postgres_restart_is_survived() {
    let mut pg = PgServer::start();
    let weir = Weir::for_pg(&pg)
        .set("pool_mode", "transaction")
        .set("default_pool_size", 2)
        .set("query_wait_timeout", 5)
        .set("server_connect_timeout", 2)
        .start();
    let a = connect(weir.port(), "postgres", "postgres").await.unwrap();
    assert_eq!(q1(&a, "select 1").await, "1");
    pg.stop();
    match connect(weir.port(), "postgres", "postgres").await {
        Ok(c) => assert!(
            q(&c, "select 1").await.is_err(),
            "served while PostgreSQL is down"
        ),
        Err(e) => {
            let f = expect_db_error(&e);
            assert_eq!(f.severity, "FATAL", "{f:?}");
        }
    }
    pg.start_again();
    let port = weir.port();
    let ok = eventually_async(Duration::from_secs(60), move || async move {
        match connect(port, "postgres", "postgres").await {
            Ok(c) => q(&c, "select 1").await.is_ok(),
            Err(_) => false,
        }
    })
    .await;
    assert!(
        ok,
        "weir did not recover after PostgreSQL restarted\n{}",
        weir.log_tail()
    );
}

/// `pool_size` in a [databases] entry overrides default_pool_size: with
/// pool_size=2, two open transactions get servers and a third client waits
/// (here: until query_wait_timeout).
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn database_pool_size_overrides_default_pool_size() {
    let pg = PgServer::start();
    let weir = Weir::for_pg(&pg)
        .database("small", &format!("{} pool_size=2", pg.connstr()))
        .set("pool_mode", "transaction")
        .set("default_pool_size", 20)
        .set("query_wait_timeout", 2)
        .start();
    let mut holders = Vec::new();
    for _ in 0..2 {
        let c = connect(weir.port(), "small", "postgres").await.unwrap();
        q(&c, "begin").await.unwrap();
        q1(&c, "select 1").await;
        holders.push(c);
    }
    let e = match connect(weir.port(), "small", "postgres").await {
        Err(e) => e,
        Ok(c) => q(&c, "select 1")
            .await
            .expect_err("a 3rd server was opened with pool_size=2"),
    };
    assert_eq!(expect_db_error(&e).message, "query_wait_timeout");
    assert_eq!(pg.count_backends("postgres"), 2);
    // The default pool size still applies to the other database.
    let mut others = Vec::new();
    for _ in 0..3 {
        let c = connect(weir.port(), "postgres", "postgres").await.unwrap();
        q(&c, "begin").await.unwrap();
        q1(&c, "select 1").await;
        others.push(c);
    }
}

/// A shell's soft limit on open files (here 256) does not cap max_client_conn: Weir
/// raises it to the hard limit at startup and logs the figures, as PgBouncer does.
#[test]
fn open_files_soft_limit_is_raised_to_the_hard_limit() {
    let mut lim = libc::rlimit {
        rlim_cur: 0,
        rlim_max: 0,
    };
    // SAFETY: getrlimit writes only the struct passed.
    unsafe { libc::getrlimit(libc::RLIMIT_NOFILE, &mut lim) };
    if lim.rlim_max < 1000 {
        eprintln!("skipped: hard limit on open files is only {}", lim.rlim_max);
        return;
    }
    let pg = PgServer::start();
    let weir = Weir::for_pg(&pg)
        .set("max_client_conn", 1000)
        .nofile_soft_limit(256)
        .start();
    let mut clients: Vec<RawConn> = (0..300)
        .map(|i| {
            RawConn::startup(weir.port(), "postgres", "postgres", &[])
                .unwrap_or_else(|e| panic!("client {i} refused: {e:?}"))
        })
        .collect();
    for c in clients.iter_mut().step_by(60) {
        assert_eq!(c.query_one("select 1"), "1");
    }
    let limits = std::fs::read_to_string(format!("/proc/{}/limits", weir.pid())).unwrap();
    let open_files = limits
        .lines()
        .find(|l| l.starts_with("Max open files"))
        .unwrap()
        .split_whitespace()
        .skip(3)
        .take(2)
        .collect::<Vec<_>>();
    assert_eq!(
        open_files[0], open_files[1],
        "soft limit not raised: {limits}"
    );
    let log = std::fs::read_to_string(weir.dir().join("stderr.log")).unwrap_or_default()
        + &std::fs::read_to_string(weir.dir().join("weir.log")).unwrap_or_default();
    assert!(
        log.contains(&format!(
            "kernel file descriptor limit: {} (hard: {})",
            lim.rlim_max, lim.rlim_max
        )),
        "no file descriptor line in the log:\n{}",
        weir.log_tail()
    );
}
