//! Shutdown for supervisors: systemd's Type=notify (READY, RELOADING, STOPPING through
//! NOTIFY_SOCKET) and SIGTERM as Kubernetes sends it (`shutdown_on_sigterm`,
//! `shutdown_drain_timeout`); and what a graceful shutdown leaves open, as PgBouncer
//! 1.23+: the TCP listeners close (a `so_reuseport` peer takes the new clients), the Unix
//! socket stays for the admin console, queued clients are released and session-mode
//! clients keep their session (PgBouncer's test_misc.py: test_shutdown_wait_for_servers,
//! test_shutdown_wait_for_clients, test_repeated_sigint,
//! test_already_paused_client_during_wait_for_servers_shutdown).

// Tests run on their own runtime, which has a time driver (clippy.toml is for Weir's
// workers).
#![allow(clippy::disallowed_methods)]

mod common;

use common::console::ok;
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

    // A session-mode client would hold the safe shutdown up (its server is its own).
    drop(c);
    weir.signal(libc::SIGINT);
    assert_eq!(next_notice(&sock), "STOPPING=1");
    assert!(weir.wait_exit(TIMEOUT).is_some(), "{}", weir.log_tail());
}

/// An abstract socket ('@' in NOTIFY_SOCKET); SIGTERM with `shutdown_on_sigterm =
/// immediate` exits at once, open transaction or not (PgBouncer up to 1.22), after
/// STOPPING=1.
#[test]
fn abstract_notify_socket_and_immediate_sigterm() {
    use std::os::linux::net::SocketAddrExt;
    let pg = PgServer::start();
    let name = format!("weir-test-notify-{}-{}", std::process::id(), free_port());
    let addr = std::os::unix::net::SocketAddr::from_abstract_name(name.as_bytes()).unwrap();
    let sock = UnixDatagram::bind_addr(&addr).unwrap();
    sock.set_read_timeout(Some(TIMEOUT)).unwrap();
    let mut weir = Weir::for_pg(&pg)
        .set("pool_mode", "transaction")
        .set("shutdown_on_sigterm", "immediate")
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
        "an immediate SIGTERM waited for the open transaction\n{}",
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

/// SIGTERM by default is PgBouncer 1.23+'s "super safe shutdown" (SHUTDOWN
/// WAIT_FOR_CLIENTS): the TCP port refuses new connections, connected clients keep being
/// served until they leave; a second SIGTERM exits at once.
#[test]
fn sigterm_by_default_waits_for_clients() {
    let pg = PgServer::start();
    let mut weir = Weir::for_pg(&pg).set("pool_mode", "transaction").start();
    let mut c = RawConn::startup(weir.port(), "postgres", "postgres", &[]).unwrap();
    c.query_one("select 1");
    weir.signal(libc::SIGTERM);
    assert_tcp_closed(&weir, "SIGTERM");
    std::thread::sleep(Duration::from_millis(300));
    assert!(weir.is_running(), "exited with a client connected");
    assert_eq!(c.query_one("select 'still served'"), "still served");
    second_signal_exits_at_once(&mut weir, libc::SIGTERM);
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

/// A signal repeated during a graceful shutdown exits at once, as in PgBouncer 1.23+.
fn second_signal_exits_at_once(weir: &mut Weir, sig: i32) {
    weir.signal(sig);
    assert!(
        weir.wait_exit(Duration::from_secs(5)).is_some(),
        "a second signal {sig} did not exit at once\n{}",
        weir.log_tail()
    );
}

/// Weir's TCP port refuses connections (the kernel's answer, not a FATAL from Weir).
fn assert_tcp_closed(weir: &Weir, after: &str) {
    let port = weir.port();
    let refused = || {
        matches!(
            TcpStream::connect(("127.0.0.1", port)),
            Err(e) if e.kind() == std::io::ErrorKind::ConnectionRefused
        )
    };
    assert!(
        eventually(Duration::from_secs(5), refused),
        "TCP still accepts after {after}\n{}",
        weir.log_tail()
    );
}

/// `sql` through Weir's Unix socket, as `postgres`.
fn over_unix(weir: &Weir, db: &str, sql: &str) -> Result<String, String> {
    let dir = weir.dir().display().to_string();
    psql_at(&dir, weir.port(), db, "postgres", None, sql)
}

fn console(weir: &Weir) -> RawConn {
    RawConn::startup(weir.port(), "postgres", "pgbouncer", &[])
        .unwrap_or_else(|e| panic!("console login failed: {e:?}"))
}

/// SHUTDOWN WAIT_FOR_CLIENTS: the TCP port refuses new connections at once; the Unix
/// socket takes console logins (and no other), the console that asked stays; the
/// connected client is served until it leaves, and then Weir exits, console sessions or
/// not, and removes its socket file.
#[test]
fn wait_for_clients_closes_tcp_and_keeps_the_console() {
    let pg = PgServer::start();
    let mut weir = Weir::for_pg(&pg).set("admin_users", "postgres").start();
    let mut c = RawConn::startup(weir.port(), "postgres", "postgres", &[]).unwrap();
    assert_eq!(c.query_one("select 1"), "1");
    let mut a = console(&weir);
    assert_eq!(
        ok(&mut a, "SHUTDOWN WAIT_FOR_CLIENTS").tags,
        vec!["SHUTDOWN"]
    );

    assert_tcp_closed(&weir, "SHUTDOWN WAIT_FOR_CLIENTS");
    let version = over_unix(&weir, "pgbouncer", "SHOW VERSION")
        .unwrap_or_else(|e| panic!("console over the Unix socket: {e}"));
    assert!(version.contains("PgBouncer"), "{version}");
    let e = over_unix(&weir, "postgres", "select 1").expect_err("a client logged in");
    assert!(e.contains("pooler is shutting down"), "{e}");
    assert_eq!(ok(&mut a, "SHOW STATE").get("key", "paused", "value"), "no");
    assert_eq!(c.query_one("select 'still served'"), "still served");
    assert!(
        weir.wait_exit(Duration::from_millis(500)).is_none(),
        "exited with a client left"
    );

    c.send(&proto::terminate());
    assert!(
        weir.wait_exit(TIMEOUT).is_some(),
        "the console session held the process up\n{}",
        weir.log_tail()
    );
    assert!(!weir.socket_path().exists(), "socket file left behind");
}

/// SIGINT (SHUTDOWN WAIT_FOR_SERVERS): TCP refused, the console reachable over the Unix
/// socket, and a session-mode client keeps its session (PgBouncer waits for its server);
/// a second SIGINT exits at once.
#[test]
fn sigint_keeps_session_clients_and_the_console() {
    let pg = PgServer::start();
    let mut weir = Weir::for_pg(&pg)
        .set("pool_mode", "session")
        .set("admin_users", "postgres")
        .start();
    let mut s = RawConn::startup(weir.port(), "postgres", "postgres", &[]).unwrap();
    s.simple_query("create temp table mine (x int)").unwrap();
    s.simple_query("insert into mine values (7)").unwrap();

    weir.signal(libc::SIGINT);
    assert_tcp_closed(&weir, "SIGINT");
    let clients = over_unix(&weir, "pgbouncer", "SHOW CLIENTS")
        .unwrap_or_else(|e| panic!("console over the Unix socket: {e}"));
    assert!(!clients.is_empty(), "SHOW CLIENTS: {clients:?}");
    std::thread::sleep(Duration::from_millis(300));
    assert_eq!(
        s.query_one("select x from mine"),
        "7",
        "the session was cut"
    );
    assert!(weir.is_running(), "exited with a session-mode client");

    second_signal_exits_at_once(&mut weir, libc::SIGINT);
}

/// A client queued for a server when SHUTDOWN WAIT_FOR_SERVERS comes is released at once
/// (FATAL "server shutting down", as PgBouncer's janitor closes it), while the client
/// holding the server finishes its transaction; then Weir exits.
#[test]
fn wait_for_servers_releases_a_queued_client() {
    let pg = PgServer::start();
    pg.exec("create table t (x int)");
    let mut weir = Weir::for_pg(&pg)
        .set("pool_mode", "transaction")
        .set("default_pool_size", 1)
        .set("admin_users", "postgres")
        .start();
    let mut a = console(&weir);
    let mut busy = RawConn::startup(weir.port(), "postgres", "postgres", &[]).unwrap();
    busy.simple_query("begin").unwrap();
    busy.simple_query("insert into t values (1)").unwrap();
    let mut queued = RawConn::startup(weir.port(), "postgres", "postgres", &[]).unwrap();
    queued.send(&proto::query("insert into t values (2)"));
    assert!(
        eventually(Duration::from_secs(5), || {
            ok(&mut a, "SHOW POOLS").num("database", "postgres", "cl_waiting") == 1
        }),
        "the second client never queued"
    );

    assert_eq!(
        ok(&mut a, "SHUTDOWN WAIT_FOR_SERVERS").tags,
        vec!["SHUTDOWN"]
    );
    queued.set_read_timeout(Duration::from_secs(3));
    let e = queued
        .error_or_eof()
        .expect("the queued client was closed without an error");
    assert_eq!(
        (e.severity.as_str(), e.code.as_str(), e.message.as_str()),
        ("FATAL", "08P01", "server shutting down")
    );
    assert!(weir.is_running(), "exited with a transaction open");
    busy.simple_query("insert into t values (3)").unwrap();
    busy.simple_query("commit").unwrap();
    assert!(
        weir.wait_exit(TIMEOUT).is_some(),
        "weir did not exit after the last transaction\n{}",
        weir.log_tail()
    );
    assert_eq!(
        pg.psql("select string_agg(x::text, ',' order by x) from t"),
        "1,3"
    );
}

/// The rolling restart PgBouncer documents: two processes on one port with
/// `so_reuseport`; once one is told SHUTDOWN WAIT_FOR_CLIENTS, every new client lands on
/// the other, while the first still serves the client it has.
#[test]
fn so_reuseport_peer_takes_new_clients_during_wait_for_clients() {
    let pg = PgServer::start();
    let port = free_port();
    let peer = || {
        Weir::for_pg(&pg)
            .listen_on(port)
            .set("pool_mode", "transaction")
            .set("so_reuseport", 1)
            .set("admin_users", "postgres")
            .start()
    };
    let mut old = peer();
    // On the old process: the new one does not listen yet.
    let mut kept = RawConn::startup(port, "postgres", "postgres", &[]).unwrap();
    kept.query_one("select 1");
    let new = peer();
    over_unix(&old, "pgbouncer", "SHUTDOWN WAIT_FOR_CLIENTS").unwrap();

    let mut failures = Vec::new();
    let mut conns = Vec::new();
    for _ in 0..40 {
        match RawConn::startup(port, "postgres", "postgres", &[]) {
            Ok(mut c) => {
                assert_eq!(c.query_one("select 1"), "1");
                conns.push(c);
            }
            Err(e) => failures.push(e.message),
        }
    }
    assert!(
        failures.is_empty(),
        "refused during the restart: {failures:?}"
    );
    assert_eq!(kept.query_one("select 'kept'"), "kept");
    assert!(old.is_running(), "the old process left its client");
    let on_new = over_unix(&new, "pgbouncer", "SHOW CLIENTS").unwrap();
    assert!(
        on_new.lines().count() >= 40,
        "the new process has {} clients\n{on_new}",
        on_new.lines().count()
    );
    drop(conns);
    kept.send(&proto::terminate());
    assert!(
        old.wait_exit(TIMEOUT).is_some(),
        "the old process did not exit once its clients left\n{}",
        old.log_tail()
    );
}

/// What a client still waiting when a safe shutdown comes is told, within a few seconds:
/// the queue's FATAL "server shutting down", as for a client queued for a pooled server.
fn released_at_once(c: &mut RawConn, what: &str) {
    c.set_read_timeout(Duration::from_secs(5));
    let started = Instant::now();
    let e = c
        .error_or_eof()
        .unwrap_or_else(|| panic!("{what}: closed without an error"));
    assert_eq!(
        (e.severity.as_str(), e.code.as_str(), e.message.as_str()),
        ("FATAL", "08P01", "server shutting down"),
        "{what}"
    );
    assert!(
        started.elapsed() < Duration::from_secs(4),
        "{what}: released after {:?}",
        started.elapsed()
    );
}

/// A client logging in while its pool has no server yet waits for the first server's
/// login, which an unreachable server makes last up to query_wait_timeout. SIGINT
/// releases it at once, as a queued client; then Weir exits, having no client left.
#[test]
fn sigint_releases_a_client_waiting_for_the_first_server_login() {
    let unreachable = free_port();
    let mut weir = Weir::builder()
        .database(
            "postgres",
            &format!("host=127.0.0.1 port={unreachable} dbname=postgres"),
        )
        .set("pool_mode", "transaction")
        .set("query_wait_timeout", 60)
        .set("admin_users", "postgres")
        .start();
    let mut c = RawConn::connect(weir.port());
    c.send(&proto::startup_message(&[
        ("user", "postgres"),
        ("database", "postgres"),
    ]));
    let waiting = || {
        let mut a = console(&weir);
        ok(&mut a, "SHOW CLIENTS")
            .rows
            .iter()
            .filter(|r| r.iter().any(|v| v.as_deref() == Some("postgres")))
            .count()
    };
    // Logged in to Weir, and waiting for the pool's first server.
    assert!(
        eventually(TIMEOUT, || waiting() >= 1),
        "{}",
        weir.log_tail()
    );
    std::thread::sleep(Duration::from_millis(300));

    weir.signal(libc::SIGINT);
    released_at_once(&mut c, "the client waiting for the first server login");
    assert!(
        weir.wait_exit(TIMEOUT).is_some(),
        "weir did not exit with no client left\n{}",
        weir.log_tail()
    );
}

/// The same for a client whose login waits for an auth_query server (it is no session
/// yet, and reached only through the pool).
#[test]
fn sigint_releases_a_client_whose_auth_query_waits_for_a_server() {
    let unreachable = free_port();
    let mut weir = Weir::builder()
        .database(
            "postgres",
            &format!("host=127.0.0.1 port={unreachable} dbname=postgres"),
        )
        .auth_query_lookup()
        .set("query_wait_timeout", 60)
        .start();
    let mut c = RawConn::connect(weir.port());
    c.send(&proto::startup_message(&[
        ("user", "not_in_the_auth_file"),
        ("database", "postgres"),
    ]));
    assert!(
        eventually(TIMEOUT, || weir.log().contains("server login failed")),
        "{}",
        weir.log_tail()
    );
    weir.signal(libc::SIGINT);
    released_at_once(&mut c, "the client whose auth_query waits");
    assert!(
        weir.wait_exit(TIMEOUT).is_some(),
        "weir did not exit with no client left\n{}",
        weir.log_tail()
    );
}

/// A replication client queued for its pool's one slot (held by another replication
/// client) is released at SHUTDOWN WAIT_FOR_SERVERS (SIGINT's) as any queued client; the
/// one streaming keeps its server until it leaves (a replication session has no
/// transaction end to stop at).
#[test]
fn wait_for_servers_releases_a_queued_replication_client() {
    let pg = PgServer::start();
    let mut weir = Weir::for_pg(&pg)
        .set("pool_mode", "transaction")
        .set("default_pool_size", 1)
        .set("query_wait_timeout", 60)
        .set("admin_users", "postgres")
        .start();
    let replication = [
        ("user", "postgres"),
        ("database", "postgres"),
        ("replication", "database"),
    ];
    let mut first = RawConn::startup(weir.port(), "postgres", "postgres", &replication[2..])
        .unwrap_or_else(|e| panic!("replication login: {e:?}"));
    assert_eq!(first.simple_query("IDENTIFY_SYSTEM").unwrap().len(), 1);
    let mut queued = RawConn::connect(weir.port());
    queued.send(&proto::startup_message(&replication));
    let mut a = console(&weir);
    assert!(
        eventually(TIMEOUT, || {
            ok(&mut a, "SHOW POOLS").num("database", "postgres", "cl_waiting") == 1
        }),
        "the second replication client never queued"
    );

    assert_eq!(
        ok(&mut a, "SHUTDOWN WAIT_FOR_SERVERS").tags,
        vec!["SHUTDOWN"]
    );
    released_at_once(&mut queued, "the queued replication client");
    assert_eq!(first.simple_query("IDENTIFY_SYSTEM").unwrap().len(), 1);
    assert!(
        weir.is_running(),
        "exited with a replication client streaming"
    );
    drop(first);
    assert!(
        weir.wait_exit(TIMEOUT).is_some(),
        "weir did not exit once the replication client left\n{}",
        weir.log_tail()
    );
}
