//! Shutdown for supervisors: systemd's Type=notify (READY, RELOADING, STOPPING through
//! NOTIFY_SOCKET) and SIGTERM as Kubernetes sends it (`shutdown_on_sigterm`,
//! `shutdown_drain_timeout`). SIGTERM's default, an immediate exit, is also checked in
//! tests/signals.rs.

// Tests run on their own runtime, which has a time driver (clippy.toml is for Weir's
// workers).
#![allow(clippy::disallowed_methods)]

mod common;

use common::*;
use std::net::TcpStream;
use std::os::unix::net::UnixDatagram;
use std::time::{Duration, Instant};

/// The next datagram Weir sent to its notify socket, as text.
fn next_notice(sock: &UnixDatagram) -> String {
    let mut buf = [0u8; 512];
    match sock.recv(&mut buf) {
        Ok(n) => String::from_utf8_lossy(&buf[..n]).into_owned(),
        Err(e) => panic!("no notification within the timeout: {e}"),
    }
}

fn monotonic_usec() -> u64 {
    let mut ts = libc::timespec {
        tv_sec: 0,
        tv_nsec: 0,
    };
    unsafe { libc::clock_gettime(libc::CLOCK_MONOTONIC, &mut ts) };
    (ts.tv_sec as u64) * 1_000_000 + (ts.tv_nsec as u64) / 1_000
}

/// READY=1 once Weir listens; SIGHUP gives RELOADING=1 with a current MONOTONIC_USEC,
/// then READY=1; SIGINT gives STOPPING=1.
#[test]
fn notify_socket_gets_ready_reloading_and_stopping() {
    let pg = PgServer::start();
    let dir = tempfile::tempdir().unwrap();
    let path = dir.path().join("notify.sock");
    let sock = UnixDatagram::bind(&path).unwrap();
    sock.set_read_timeout(Some(TIMEOUT)).unwrap();
    let builder = Weir::for_pg(&pg).env("NOTIFY_SOCKET", path.to_str().unwrap());
    let mut weir = builder.clone().start();
    assert_eq!(next_notice(&sock), "READY=1", "{}", weir.log_tail());
    // READY=1 comes once the listeners are up: a client gets in.
    let mut c = RawConn::startup(weir.port(), "postgres", "postgres", &[]).unwrap();
    assert_eq!(c.query_one("select 1"), "1");

    let before = monotonic_usec();
    weir.reload_with(builder.set("default_pool_size", 3));
    let reloading = next_notice(&sock);
    let after = monotonic_usec();
    let mut lines = reloading.lines();
    assert_eq!(lines.next(), Some("RELOADING=1"), "{reloading:?}");
    let usec: u64 = lines
        .next()
        .and_then(|l| l.strip_prefix("MONOTONIC_USEC="))
        .and_then(|v| v.parse().ok())
        .unwrap_or_else(|| panic!("no MONOTONIC_USEC in {reloading:?}"));
    assert!(
        (before..=after).contains(&usec),
        "MONOTONIC_USEC {usec} not between {before} and {after}"
    );
    assert_eq!(next_notice(&sock), "READY=1", "after the reload");
    assert_eq!(c.query_one("select 2"), "2");

    weir.signal(libc::SIGINT);
    assert_eq!(next_notice(&sock), "STOPPING=1");
    assert!(weir.wait_exit(TIMEOUT).is_some(), "{}", weir.log_tail());
}

/// An abstract socket ('@' in NOTIFY_SOCKET); SIGTERM by default still exits at once,
/// open transaction or not (PgBouncer 1.18 and Weir until now), after STOPPING=1.
#[test]
fn abstract_notify_socket_and_default_sigterm_exits_at_once() {
    use std::os::linux::net::SocketAddrExt;
    let pg = PgServer::start();
    let name = format!("weir-test-notify-{}-{}", std::process::id(), free_port());
    let addr = std::os::unix::net::SocketAddr::from_abstract_name(name.as_bytes()).unwrap();
    let sock = UnixDatagram::bind_addr(&addr).unwrap();
    sock.set_read_timeout(Some(TIMEOUT)).unwrap();
    let mut weir = Weir::for_pg(&pg)
        .set("pool_mode", "transaction")
        .env("NOTIFY_SOCKET", &format!("@{name}"))
        .start();
    assert_eq!(next_notice(&sock), "READY=1", "{}", weir.log_tail());
    let mut c = RawConn::startup(weir.port(), "postgres", "postgres", &[]).unwrap();
    c.simple_query("begin").unwrap();
    c.simple_query("select 1").unwrap();
    weir.signal(libc::SIGTERM);
    assert_eq!(next_notice(&sock), "STOPPING=1");
    assert!(
        weir.wait_exit(Duration::from_secs(5)).is_some(),
        "the default SIGTERM waited for the open transaction\n{}",
        weir.log_tail()
    );
}

fn draining(pg: &PgServer, http: u16, timeout_s: u32) -> Weir {
    Weir::for_pg(pg)
        .set("pool_mode", "transaction")
        .set("http_listen", format!("127.0.0.1:{http}"))
        .set("shutdown_on_sigterm", "wait_for_servers")
        .set("shutdown_drain_timeout", timeout_s)
        .start()
}

fn readyz(http: u16) -> (u16, String) {
    let r = http_get(http, "/readyz").expect("/readyz answers");
    (r.status, r.body)
}

/// SIGTERM with draining on: the listeners close, /readyz says 503, an idle client is
/// closed with 57P01, and a client in a transaction commits; then the process exits,
/// well before the drain timeout.
#[test]
fn sigterm_drain_lets_open_transaction_commit() {
    let pg = PgServer::start();
    pg.exec("create table t (x int)");
    let http = free_port();
    let mut weir = draining(&pg, http, 60);
    assert!(
        eventually(TIMEOUT, || readyz(http).0 == 200),
        "/readyz never 200: {:?}",
        readyz(http)
    );
    let mut busy = RawConn::startup(weir.port(), "postgres", "postgres", &[]).unwrap();
    busy.simple_query("begin").unwrap();
    busy.simple_query("insert into t values (1)").unwrap();
    let mut idle = RawConn::startup(weir.port(), "postgres", "postgres", &[]).unwrap();
    idle.query_one("select 1");

    weir.signal(libc::SIGTERM);
    let err = idle
        .error_or_eof()
        .expect("the idle client was closed without an error");
    assert_eq!(
        (err.code.as_str(), err.severity.as_str()),
        ("57P01", "FATAL")
    );
    assert!(weir.is_running(), "exited with a transaction open");
    let (status, body) = readyz(http);
    assert_eq!(status, 503, "/readyz during the drain: {body}");
    assert!(body.contains("shutting down"), "{body}");
    let port = weir.port();
    assert!(
        eventually(Duration::from_secs(5), || TcpStream::connect((
            "127.0.0.1",
            port
        ))
        .is_err()),
        "new connections are still accepted during the drain"
    );

    busy.simple_query("insert into t values (2)").unwrap();
    busy.simple_query("commit")
        .unwrap_or_else(|e| panic!("COMMIT failed during the drain: {e:?}"));
    let start = Instant::now();
    assert!(
        weir.wait_exit(Duration::from_secs(10)).is_some(),
        "weir did not exit once the transaction ended\n{}",
        weir.log_tail()
    );
    assert!(start.elapsed() < Duration::from_secs(10));
    assert_eq!(
        pg.psql("select string_agg(x::text, ',' order by x) from t"),
        "1,2"
    );
}

/// SIGTERM with draining on and a transaction that does not end: at
/// shutdown_drain_timeout its client is told the pooler is shutting down, the
/// transaction is rolled back, and the process exits.
#[test]
fn sigterm_drain_timeout_closes_open_transaction() {
    let pg = PgServer::start();
    pg.exec("create table t (x int)");
    let http = free_port();
    let mut weir = draining(&pg, http, 3);
    let mut busy = RawConn::startup(weir.port(), "postgres", "postgres", &[]).unwrap();
    busy.simple_query("begin").unwrap();
    busy.simple_query("insert into t values (1)").unwrap();

    let start = Instant::now();
    weir.signal(libc::SIGTERM);
    std::thread::sleep(Duration::from_millis(1000));
    assert!(weir.is_running(), "exited before the drain timeout");
    assert_eq!(readyz(http).0, 503);
    let err = busy
        .error_or_eof()
        .expect("the client in a transaction was closed without an error");
    let waited = start.elapsed();
    assert_eq!(err.severity, "FATAL", "{err:?}");
    assert_eq!(err.code, "57P01", "{err:?}");
    assert_eq!(err.message, "pooler is shutting down", "{err:?}");
    assert!(
        waited >= Duration::from_millis(2900),
        "closed after {waited:?}, before the 3 s timeout"
    );
    assert!(
        weir.wait_exit(Duration::from_secs(10)).is_some(),
        "weir did not exit after the drain timeout\n{}",
        weir.log_tail()
    );
    assert!(
        eventually(TIMEOUT, || pg.count_backends("postgres") == 0),
        "weir's server connections outlived it"
    );
    assert_eq!(pg.psql("select count(*) from t"), "0");
}

/// `shutdown_on_sigterm = wait_for_clients` is PgBouncer 1.23+'s "super safe shutdown":
/// new logins are refused, connected clients keep being served until they leave; a
/// second SIGTERM exits at once.
#[test]
fn sigterm_wait_for_clients_serves_connected_clients() {
    let pg = PgServer::start();
    let mut weir = Weir::for_pg(&pg)
        .set("pool_mode", "transaction")
        .set("shutdown_on_sigterm", "wait_for_clients")
        .start();
    let mut c = RawConn::startup(weir.port(), "postgres", "postgres", &[]).unwrap();
    c.query_one("select 1");
    weir.signal(libc::SIGTERM);
    std::thread::sleep(Duration::from_millis(500));
    assert!(weir.is_running(), "exited with a client connected");
    if TcpStream::connect(("127.0.0.1", weir.port())).is_ok() {
        let e = RawConn::startup(weir.port(), "postgres", "postgres", &[])
            .err()
            .expect("a new client logged in after SIGTERM");
        assert_eq!(e.code, "57P01", "{e:?}");
    }
    assert_eq!(c.query_one("select 'still served'"), "still served");
    weir.signal(libc::SIGTERM);
    assert!(
        weir.wait_exit(Duration::from_secs(5)).is_some(),
        "a second SIGTERM did not exit at once\n{}",
        weir.log_tail()
    );
}

/// SIGQUIT exits at once whatever `shutdown_on_sigterm` says, open transaction or not
/// (PgBouncer 1.23+'s immediate shutdown).
#[test]
fn sigquit_exits_at_once_even_when_sigterm_drains() {
    let pg = PgServer::start();
    let mut weir = Weir::for_pg(&pg)
        .set("pool_mode", "transaction")
        .set("shutdown_on_sigterm", "wait_for_servers")
        .start();
    let mut c = RawConn::startup(weir.port(), "postgres", "postgres", &[]).unwrap();
    c.simple_query("begin").unwrap();
    c.simple_query("select 1").unwrap();
    weir.signal(libc::SIGQUIT);
    let st = weir
        .wait_exit(Duration::from_secs(5))
        .unwrap_or_else(|| panic!("SIGQUIT did not exit at once\n{}", weir.log_tail()));
    assert!(st.success(), "exit status {st}");
}
