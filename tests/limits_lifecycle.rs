//! Pool limits and connection lifecycle, against real PostgreSQL:
//! reserve_pool_size, max_db_connections, max_user_connections,
//! max_db_client_connections, max_user_client_connections, min_pool_size,
//! queue order, query_wait_notify, cancelling a queued client, the client
//! timeouts (client_idle_timeout, idle_transaction_timeout, query_timeout,
//! transaction_timeout), server_lifetime, server_idle_timeout,
//! server_check_query, server_login_retry, server_round_robin, connect_query,
//! application_name_add_host, auth_query, server_fast_close, and a load test
//! with 1,000 clients.
//!
//! Most tests drive the wire protocol directly ([`RawConn`]) so that a query
//! can be sent, left waiting in Weir's queue, and its answer read later.
//! Timeouts in the configs are short (1-2 s); the waits in the tests are only
//! there so that a broken Weir fails instead of hanging.

mod common;

use common::*;
use std::collections::HashMap;
use std::time::{Duration, Instant};

// ---------------------------------------------------------------------------
// Helpers

/// A PostgreSQL server with login roles `app` and `app2` (trust over TCP).
fn pg_with_apps() -> PgServer {
    let pg = PgServer::start();
    pg.create_user("app", "x", "md5");
    pg.create_user("app2", "x", "md5");
    pg
}

/// Weir in transaction mode with the admin console open to `postgres`, and
/// `postgres`, `app`, `app2` in the auth_file.
fn base(pg: &PgServer) -> WeirBuilder {
    Weir::for_pg(pg)
        .set("pool_mode", "transaction")
        .set("admin_users", "postgres")
        .set("query_wait_timeout", 20)
        .userlist(&[("postgres", ""), ("app", ""), ("app2", "")])
}

fn login(weir: &Weir, db: &str, user: &str) -> RawConn {
    RawConn::startup(weir.port(), user, db, &[])
        .unwrap_or_else(|e| panic!("login of {user} to {db} failed: {e:?}\n{}", weir.log_tail()))
}

/// A client that holds a server: logged in, inside BEGIN, with a query done.
fn holder(weir: &Weir, db: &str, user: &str) -> RawConn {
    let mut c = login(weir, db, user);
    c.simple_query("begin").unwrap();
    assert_eq!(c.query_one("select 1"), "1");
    c
}

/// Reads the answer to a query sent earlier with `send`: its rows, or its
/// first error. Stops at ReadyForQuery, or at EOF (after a FATAL).
fn finish(c: &mut RawConn) -> Result<Vec<Vec<Option<String>>>, ErrorFields> {
    let mut rows = Vec::new();
    let mut err = None;
    loop {
        match c.read_message() {
            Ok(Some(m)) => match m.tag {
                b'D' => rows.push(proto::data_row(&m.body)),
                b'E' if err.is_none() => err = Some(proto::parse_error(&m.body)),
                b'Z' => break,
                _ => {}
            },
            Ok(None) => {
                if err.is_none() {
                    panic!("connection closed before an answer came");
                }
                break;
            }
            Err(e) => panic!("no answer within the timeout: {e}"),
        }
    }
    match err {
        Some(e) => Err(e),
        None => Ok(rows),
    }
}

/// True if nothing at all arrives on `c` within `t` (the query still waits).
fn silent_for(c: &mut RawConn, t: Duration) -> bool {
    c.set_read_timeout(t);
    let r = c.read_message();
    c.set_read_timeout(TIMEOUT);
    match r {
        Err(_) => true,
        Ok(m) => panic!("expected no answer yet, got {m:?}"),
    }
}

fn fields(f: &ErrorFields) -> (&str, &str, &str) {
    (f.severity.as_str(), f.code.as_str(), f.message.as_str())
}

/// Runs an admin console command; rows as column-name -> value maps.
fn admin_show(weir: &Weir, cmd: &str) -> Vec<HashMap<String, String>> {
    let mut c = RawConn::startup(weir.port(), "postgres", "pgbouncer", &[])
        .unwrap_or_else(|e| panic!("admin console login failed: {e:?}"));
    c.send(&proto::query(cmd));
    let mut names: Vec<String> = Vec::new();
    let mut out = Vec::new();
    for m in c.read_until_ready() {
        match m.tag {
            b'T' => {
                let n = i16::from_be_bytes([m.body[0], m.body[1]]) as usize;
                let mut rest = &m.body[2..];
                for _ in 0..n {
                    let end = rest.iter().position(|&b| b == 0).unwrap();
                    names.push(String::from_utf8_lossy(&rest[..end]).into_owned());
                    rest = &rest[end + 1 + 18..];
                }
            }
            b'D' => {
                let vals = proto::data_row(&m.body);
                out.push(
                    names
                        .iter()
                        .cloned()
                        .zip(vals.into_iter().map(|v| v.unwrap_or_default()))
                        .collect(),
                );
            }
            b'E' => panic!("{cmd} failed: {:?}", proto::parse_error(&m.body)),
            _ => {}
        }
    }
    out
}

/// Clients of pool (db, user) waiting for a server, per SHOW POOLS.
fn cl_waiting(weir: &Weir, db: &str, user: &str) -> i64 {
    admin_show(weir, "show pools")
        .iter()
        .filter(|r| r["database"] == db && r["user"] == user)
        .map(|r| r["cl_waiting"].parse::<i64>().unwrap())
        .sum()
}

/// Waits until `n` clients of (db, user) are queued.
fn wait_queued(weir: &Weir, db: &str, user: &str, n: i64) {
    assert!(
        eventually(TIMEOUT, || cl_waiting(weir, db, user) == n),
        "SHOW POOLS never showed {n} waiting client(s) for {db}/{user}: {:?}\n{}",
        admin_show(weir, "show pools"),
        weir.log_tail()
    );
}

fn backend_pids(pg: &PgServer, condition: &str) -> Vec<String> {
    let out = pg.psql(&format!(
        "select pid from pg_stat_activity where backend_type = 'client backend' \
         and pid <> pg_backend_pid() and ({condition}) order by pid"
    ));
    out.lines().map(str::to_string).collect()
}

// ---------------------------------------------------------------------------
// reserve_pool_size / reserve_pool_timeout

/// pool_size=1, reserve_pool_size=1, reserve_pool_timeout=1: while A holds
/// the only server, B is served by a reserve connection (after waiting
/// reserve_pool_timeout), so PostgreSQL sees 2 connections.
#[test]
fn reserve_pool_serves_a_waiting_client_after_reserve_pool_timeout() {
    let pg = pg_with_apps();
    let weir = base(&pg)
        .set("default_pool_size", 1)
        .set("reserve_pool_size", 1)
        .set("reserve_pool_timeout", 1)
        .start();
    let mut a = holder(&weir, "postgres", "app");
    let a_pid = a.query_one("select pg_backend_pid()");
    let mut b = login(&weir, "postgres", "app");
    let started = Instant::now();
    b.send(&proto::query("select pg_backend_pid()"));
    let rows = finish(&mut b).unwrap_or_else(|e| {
        panic!(
            "B was not served from the reserve pool: {e:?}\n{}",
            weir.log_tail()
        )
    });
    let waited = started.elapsed();
    let b_pid = rows[0][0].clone().unwrap();
    assert_ne!(a_pid, b_pid, "B ran on A's server inside A's transaction");
    assert!(
        waited >= Duration::from_millis(800),
        "the reserve was used after {waited:?}, before reserve_pool_timeout (1 s)"
    );
    assert_eq!(pg.count_backends("app"), 2);
    a.simple_query("commit").unwrap();
}

/// Same, with reserve_pool_size=0: B waits until query_wait_timeout and
/// PostgreSQL never sees a second connection.
#[test]
fn without_reserve_pool_a_waiting_client_times_out() {
    let pg = pg_with_apps();
    let weir = base(&pg)
        .set("default_pool_size", 1)
        .set("reserve_pool_size", 0)
        .set("reserve_pool_timeout", 1)
        .set("query_wait_timeout", 2)
        .start();
    let mut a = holder(&weir, "postgres", "app");
    let sampler = BackendSampler::start(&pg, "usename = 'app'");
    let mut b = login(&weir, "postgres", "app");
    b.send(&proto::query("select 1"));
    let e = finish(&mut b).expect_err("B was served while A holds the only server");
    let (max, _) = sampler.stop();
    assert_eq!(fields(&e), ("FATAL", "08P01", "query_wait_timeout"));
    assert_eq!(max, 1, "PostgreSQL saw {max} connections with pool_size=1");
    assert_eq!(a.query_one("select 'a'"), "a");
}

// ---------------------------------------------------------------------------
// max_db_connections / max_user_connections

/// Two pools (users app, app2) of one database with max_db_connections=1:
/// app2's client waits while app's client holds the one server in a
/// transaction, and is served once it commits. PostgreSQL never sees more
/// than one connection.
#[test]
fn max_db_connections_queues_the_other_pool_until_commit() {
    let pg = pg_with_apps();
    let weir = base(&pg)
        .database(
            "postgres",
            &format!("{} max_db_connections=1", pg.connstr()),
        )
        .set("default_pool_size", 5)
        .start();
    let sampler = BackendSampler::start(&pg, "usename in ('app', 'app2')");
    // B logs in first (its login needs a server, which then goes idle).
    let mut b = login(&weir, "postgres", "app2");
    let mut a = holder(&weir, "postgres", "app");
    b.send(&proto::query("select current_user"));
    wait_queued(&weir, "postgres", "app2", 1);
    assert!(silent_for(&mut b, Duration::from_millis(500)));
    a.simple_query("commit").unwrap();
    let rows = finish(&mut b).unwrap_or_else(|e| {
        panic!(
            "app2 not served after app committed: {e:?}\n{}",
            weir.log_tail()
        )
    });
    assert_eq!(rows[0][0].as_deref(), Some("app2"));
    // And back: app is served again.
    assert_eq!(a.query_one("select current_user"), "app");
    let (max, samples) = sampler.stop();
    assert!(samples > 0);
    assert_eq!(
        max, 1,
        "PostgreSQL saw {max} connections with max_db_connections=1"
    );
}

/// max_db_connections=1: when the other pool's server sits idle, it is
/// closed to make room, so the client is served without waiting for any
/// timeout (query_wait_timeout would fail it).
#[test]
fn max_db_connections_closes_an_idle_server_of_another_pool() {
    let pg = pg_with_apps();
    let weir = base(&pg)
        .database(
            "postgres",
            &format!("{} max_db_connections=1", pg.connstr()),
        )
        .set("default_pool_size", 5)
        .set("query_wait_timeout", 5)
        .start();
    let sampler = BackendSampler::start(&pg, "usename in ('app', 'app2')");
    let mut a = login(&weir, "postgres", "app");
    let a_pid = a.query_one("select pg_backend_pid()");
    let mut b = login(&weir, "postgres", "app2");
    assert_eq!(b.query_one("select current_user"), "app2");
    assert!(
        eventually(TIMEOUT, || !backend_pids(&pg, "true").contains(&a_pid)),
        "app's idle server was not closed"
    );
    assert_eq!(a.query_one("select current_user"), "app");
    assert_eq!(b.query_one("select current_user"), "app2");
    let (max, _) = sampler.stop();
    assert_eq!(
        max, 1,
        "PostgreSQL saw {max} connections with max_db_connections=1"
    );
}

fn max_user_connections_case(builder: WeirBuilder, pg: &PgServer) {
    let weir = builder.start();
    let sampler = BackendSampler::start(pg, "usename = 'app'");
    let mut b = login(&weir, "db2", "app");
    let mut a = holder(&weir, "db1", "app");
    b.send(&proto::query("select 'b'"));
    wait_queued(&weir, "db2", "app", 1);
    assert!(silent_for(&mut b, Duration::from_millis(500)));
    a.simple_query("commit").unwrap();
    let rows = finish(&mut b).unwrap_or_else(|e| {
        panic!(
            "the db2 client was not served after db1's committed: {e:?}\n{}",
            weir.log_tail()
        )
    });
    assert_eq!(rows[0][0].as_deref(), Some("b"));
    assert_eq!(a.query_one("select 'a'"), "a");
    let (max, _) = sampler.stop();
    assert_eq!(
        max, 1,
        "PostgreSQL saw {max} connections of app with max_user_connections=1"
    );
}

/// max_user_connections=1 in [users]: one user, two databases; the second
/// database's client waits for the first's transaction.
#[test]
fn max_user_connections_in_users_section_spans_databases() {
    let pg = pg_with_apps();
    let b = base(&pg)
        .database("db1", &pg.connstr())
        .database("db2", &pg.connstr())
        .set("default_pool_size", 5)
        .user_setting("app", "max_user_connections=1");
    max_user_connections_case(b, &pg);
}

/// The same with the global max_user_connections.
#[test]
fn max_user_connections_global_spans_databases() {
    let pg = pg_with_apps();
    let b = base(&pg)
        .database("db1", &pg.connstr())
        .database("db2", &pg.connstr())
        .set("default_pool_size", 5)
        .set("max_user_connections", 1);
    max_user_connections_case(b, &pg);
}

// ---------------------------------------------------------------------------
// max_db_client_connections / max_user_client_connections

/// max_db_client_connections=2 on database `limited`: a third client is
/// refused with 08P01, as PgBouncer does; other databases are not affected; a client leaving
/// frees its place.
#[test]
fn max_db_client_connections_refuses_extra_clients() {
    let pg = pg_with_apps();
    let weir = base(&pg)
        .database(
            "limited",
            &format!("{} max_db_client_connections=2", pg.connstr()),
        )
        .start();
    let held = vec![
        login(&weir, "limited", "app"),
        login(&weir, "limited", "app2"),
    ];
    // Another database is not limited.
    let other = login(&weir, "postgres", "app");
    assert_limit_of_two(
        &weir,
        held,
        ("limited", "app"),
        "max_db_client_connections",
        other,
    );
}

/// max_user_client_connections=2 for `app`, across databases.
#[test]
fn max_user_client_connections_refuses_extra_clients() {
    let pg = pg_with_apps();
    let weir = base(&pg)
        .database("db2", &pg.connstr())
        .user_setting("app", "max_user_client_connections=2")
        .start();
    let held = vec![login(&weir, "postgres", "app"), login(&weir, "db2", "app")];
    // Another user is not limited.
    let other = login(&weir, "postgres", "app2");
    assert_limit_of_two(
        &weir,
        held,
        ("postgres", "app"),
        "max_user_client_connections",
        other,
    );
}

/// With a client limit of 2 full (`held`), a third client to `db` as `user` is refused
/// with 08P01 naming `limit`; `other`, outside the limit, and the held clients are still
/// served; once one leaves, a new client gets in.
fn assert_limit_of_two(
    weir: &Weir,
    mut held: Vec<RawConn>,
    (db, user): (&str, &str),
    limit: &str,
    mut other: RawConn,
) {
    let e = RawConn::startup(weir.port(), user, db, &[])
        .err()
        .unwrap_or_else(|| panic!("a 3rd client was accepted with {limit}=2"));
    let message = format!("client connections exceeded ({limit})");
    assert_eq!(fields(&e), ("FATAL", "08P01", message.as_str()));
    assert_eq!(other.query_one("select 1"), "1");
    for c in &mut held {
        assert_eq!(c.query_one("select 1"), "1");
    }
    drop(held.pop());
    assert!(
        eventually(TIMEOUT, || RawConn::startup(weir.port(), user, db, &[])
            .is_ok()),
        "no client accepted after one of two left"
    );
}

/// The global max_user_client_connections applies to every user.
#[test]
fn max_user_client_connections_global() {
    let pg = pg_with_apps();
    let weir = base(&pg).set("max_user_client_connections", 1).start();
    let _a = login(&weir, "postgres", "app");
    let e = RawConn::startup(weir.port(), "app", "postgres", &[])
        .err()
        .expect("a 2nd client was accepted with max_user_client_connections=1");
    assert_eq!(e.code, "08P01");
    assert_eq!(
        e.message,
        "client connections exceeded (max_user_client_connections)"
    );
    let mut b = login(&weir, "postgres", "app2");
    assert_eq!(b.query_one("select 1"), "1");
}

// ---------------------------------------------------------------------------
// min_pool_size

/// min_pool_size=2: once a client has logged in (creating the pool),
/// PostgreSQL soon shows 2 connections from Weir although the client is idle.
#[test]
fn min_pool_size_opens_servers_for_an_idle_pool() {
    let pg = pg_with_apps();
    let weir = base(&pg)
        .set("default_pool_size", 5)
        .set("min_pool_size", 2)
        .start();
    let _c = login(&weir, "postgres", "app");
    assert!(
        eventually(Duration::from_secs(15), || pg.count_backends("app") == 2),
        "PostgreSQL shows {} connections of app, min_pool_size is 2\n{}",
        pg.count_backends("app"),
        weir.log_tail()
    );
    // And no more than that.
    std::thread::sleep(Duration::from_millis(1500));
    assert_eq!(pg.count_backends("app"), 2);
}

// ---------------------------------------------------------------------------
// Queue order, query_wait_notify, cancel while queued

/// pool_size=1: B, C, D queue in that order behind A's transaction and are
/// served in arrival order.
#[test]
fn queued_clients_are_served_in_arrival_order() {
    let pg = pg_with_apps();
    pg.exec("create table qorder (id serial primary key, who text); grant all on qorder, qorder_id_seq to app");
    let weir = base(&pg).set("default_pool_size", 1).start();
    let mut a = holder(&weir, "postgres", "app");
    let mut queued = Vec::new();
    for (i, who) in ["B", "C", "D"].iter().enumerate() {
        let mut c = login(&weir, "postgres", "app");
        c.send(&proto::query(&format!(
            "insert into qorder (who) values ('{who}')"
        )));
        wait_queued(&weir, "postgres", "app", i as i64 + 1);
        queued.push(c);
    }
    a.simple_query("commit").unwrap();
    for c in &mut queued {
        finish(c).unwrap();
    }
    let order = pg.psql("select string_agg(who, '' order by id) from qorder");
    assert_eq!(order, "BCD", "queued clients were served out of order");
}

/// query_wait_notify=1: a client queued for longer gets a NOTICE, then its
/// answer once a server is free.
#[test]
fn query_wait_notify_sends_a_notice_to_a_queued_client() {
    let pg = pg_with_apps();
    let weir = base(&pg)
        .set("default_pool_size", 1)
        .set("query_wait_notify", 1)
        .start();
    let mut a = holder(&weir, "postgres", "app");
    let mut b = login(&weir, "postgres", "app");
    b.send(&proto::query("select 'b'"));
    let m = b.read_message_or_panic("the queue NOTICE");
    assert_eq!(m.tag_char(), 'N', "expected a NoticeResponse first");
    let n = proto::parse_error(&m.body);
    assert_eq!(n.severity, "NOTICE");
    assert_eq!(
        n.message,
        "No server connection available in postgres backend, client being queued"
    );
    a.simple_query("commit").unwrap();
    let rows = finish(&mut b).unwrap();
    assert_eq!(rows[0][0].as_deref(), Some("b"));
}

/// A cancel request for a queued client ends its wait with ERROR 57014; the
/// client stays connected and is served normally afterwards.
#[test]
fn cancel_of_a_queued_client_fails_its_query_only() {
    let pg = pg_with_apps();
    let weir = base(&pg).set("default_pool_size", 1).start();
    let mut a = holder(&weir, "postgres", "app");
    let mut b = login(&weir, "postgres", "app");
    let (pid, key) = b.key.expect("no BackendKeyData");
    b.send(&proto::query("select 'b'"));
    wait_queued(&weir, "postgres", "app", 1);
    let mut cancel = RawConn::connect(weir.port());
    cancel.send(&proto::cancel_request(pid, key));
    let e = finish(&mut b).expect_err("the cancelled query succeeded");
    assert_eq!(
        fields(&e),
        ("ERROR", "57014", "canceling statement due to user request")
    );
    assert_eq!(cl_waiting(&weir, "postgres", "app"), 0);
    // A's transaction was not touched.
    assert_eq!(a.query_one("select 'a'"), "a");
    a.simple_query("commit").unwrap();
    assert_eq!(b.query_one("select 'again'"), "again");
}

// ---------------------------------------------------------------------------
// Client timeouts

/// client_idle_timeout=1: an idle client is disconnected with FATAL 57P05.
#[test]
fn client_idle_timeout_disconnects_idle_client() {
    let pg = pg_with_apps();
    let weir = base(&pg).set("client_idle_timeout", 1).start();
    let mut c = login(&weir, "postgres", "app");
    assert_eq!(c.query_one("select 1"), "1");
    let e = c.expect_error();
    assert_eq!(fields(&e), ("FATAL", "57P05", "client_idle_timeout"));
    assert!(c.closes(), "connection left open after client_idle_timeout");
}

/// idle_transaction_timeout=1: a client idle inside BEGIN is disconnected
/// with FATAL 08P01 (PgBouncer's SQLSTATE), its transaction is rolled back, and the server is not
/// left idle in transaction.
#[test]
fn idle_transaction_timeout_disconnects_and_rolls_back() {
    let pg = pg_with_apps();
    pg.exec("create table itt (x int); grant all on itt to app");
    let weir = base(&pg).set("idle_transaction_timeout", 1).start();
    let mut c = login(&weir, "postgres", "app");
    c.simple_query("begin").unwrap();
    c.simple_query("insert into itt values (1)").unwrap();
    let e = c.expect_error();
    assert_eq!(fields(&e), ("FATAL", "08P01", "idle transaction timeout"));
    assert!(c.closes(), "connection left open after the timeout");
    assert_eq!(pg.psql("select count(*) from itt"), "0");
    assert!(
        eventually(TIMEOUT, || pg.count_backends_where(
            "usename = 'app' and state like 'idle in transaction%'"
        ) == 0),
        "a server was left idle in transaction"
    );
    // Weir still serves.
    let mut d = login(&weir, "postgres", "app");
    assert_eq!(d.query_one("select count(*) from itt"), "0");
}

/// query_timeout=1: a long query fails with FATAL 08P01 `query timeout`, PgBouncer's; the
/// server it ran on is not given to anyone else (PostgreSQL may still be
/// running the query), the next client gets another one.
#[test]
fn query_timeout_ends_a_long_query() {
    let pg = pg_with_apps();
    let weir = base(&pg)
        .set("default_pool_size", 1)
        .set("query_timeout", 1)
        .start();
    let mut c = login(&weir, "postgres", "app");
    let pid = c.query_one("select pg_backend_pid()");
    c.send(&proto::query("select pg_backend_pid() from pg_sleep(10)"));
    let e = finish(&mut c).expect_err("pg_sleep(10) finished despite query_timeout=1");
    assert_eq!(fields(&e), ("FATAL", "08P01", "query timeout"));
    assert!(c.closes(), "connection left open after query_timeout");
    let mut d = login(&weir, "postgres", "app");
    let rows = d
        .simple_query("select pg_backend_pid()")
        .unwrap_or_else(|e| panic!("the next client was not served: {e:?}"));
    assert_ne!(
        rows[0][0].as_deref(),
        Some(pid.as_str()),
        "the server of the timed-out query was lent again"
    );
}

/// transaction_timeout=2: a transaction still open after 2 s is ended with
/// FATAL 08P01 although the client was active in it.
#[test]
fn transaction_timeout_ends_a_long_transaction() {
    let pg = pg_with_apps();
    let weir = base(&pg).set("transaction_timeout", 2).start();
    let mut c = login(&weir, "postgres", "app");
    c.simple_query("begin").unwrap();
    std::thread::sleep(Duration::from_millis(700));
    assert_eq!(c.query_one("select 1"), "1");
    std::thread::sleep(Duration::from_millis(700));
    assert_eq!(c.query_one("select 2"), "2");
    let e = c.expect_error();
    assert_eq!(fields(&e), ("FATAL", "08P01", "transaction timeout"));
    assert!(c.closes(), "connection left open after transaction_timeout");
}

// ---------------------------------------------------------------------------
// Server lifecycle

/// server_lifetime=1: an idle server older than that is closed; the next
/// query runs on a new one.
#[test]
fn server_lifetime_replaces_old_servers() {
    let pg = pg_with_apps();
    let weir = base(&pg).set("server_lifetime", 1).start();
    let mut c = login(&weir, "postgres", "app");
    let first = c.query_one("select pg_backend_pid()");
    std::thread::sleep(Duration::from_millis(2500));
    let second = c.query_one("select pg_backend_pid()");
    assert_ne!(first, second, "the server outlived server_lifetime");
    assert!(
        eventually(TIMEOUT, || !backend_pids(&pg, "usename = 'app'")
            .contains(&first)),
        "the old server is still connected"
    );
}

/// server_idle_timeout=1 (min_pool_size=0): idle servers are closed, so
/// PostgreSQL soon shows none from Weir while the client stays connected.
#[test]
fn server_idle_timeout_closes_idle_servers() {
    let pg = pg_with_apps();
    let weir = base(&pg)
        .set("server_idle_timeout", 1)
        .set("min_pool_size", 0)
        .start();
    let mut c = login(&weir, "postgres", "app");
    assert_eq!(c.query_one("select 1"), "1");
    assert_eq!(pg.count_backends("app"), 1);
    assert!(
        eventually(Duration::from_secs(10), || pg.count_backends("app") == 0),
        "the idle server was not closed after server_idle_timeout"
    );
    assert_eq!(c.query_one("select 2"), "2");
}

/// server_check_query with server_check_delay=0: a server killed while idle
/// is noticed before being lent; the client's query runs on a new server.
#[test]
fn server_check_query_notices_a_killed_idle_server() {
    let pg = pg_with_apps();
    let weir = base(&pg)
        .set("default_pool_size", 1)
        .set("server_check_query", "select 1")
        .set("server_check_delay", 0)
        .start();
    let mut c = login(&weir, "postgres", "app");
    let pid = c.query_one("select pg_backend_pid()");
    pg.exec(&format!("select pg_terminate_backend({pid})"));
    assert!(eventually(TIMEOUT, || !backend_pids(&pg, "true").contains(&pid)));
    let rows = c
        .simple_query("select pg_backend_pid()")
        .unwrap_or_else(|e| panic!("query after the server was killed failed: {e:?}"));
    let new_pid = rows[0][0].clone().unwrap();
    assert_ne!(pid, new_pid);
}

/// server_check_query runs on an idle server before it is lent, once it has
/// been idle for server_check_delay (here 0: every time); with a long delay it
/// does not run. The check query bumps a sequence so that its runs are seen.
fn check_query_runs(delay: u32) -> i64 {
    let pg = pg_with_apps();
    pg.exec("create sequence checks; grant all on sequence checks to app");
    let weir = base(&pg)
        .set("default_pool_size", 1)
        .set("server_check_query", "select nextval('checks')")
        .set("server_check_delay", delay)
        .start();
    let mut c = login(&weir, "postgres", "app");
    for i in 0..3 {
        assert_eq!(c.query_one(&format!("select {i}")), i.to_string());
    }
    pg.psql("select case when is_called then last_value else 0 end from checks")
        .parse()
        .unwrap()
}

#[test]
fn server_check_query_runs_before_lending_an_idle_server() {
    let runs = check_query_runs(0);
    assert!(
        runs >= 2,
        "server_check_query ran {runs} times for 3 transactions with server_check_delay=0"
    );
}

#[test]
fn server_check_query_skipped_within_server_check_delay() {
    let runs = check_query_runs(60);
    assert_eq!(
        runs, 0,
        "server_check_query ran although the server was idle less than server_check_delay"
    );
}

/// server_login_retry: after the server refused Weir's login, a second
/// client within server_login_retry gets the same error without Weir trying
/// to log in again.
#[test]
fn server_login_retry_reports_the_last_error_without_retrying() {
    let pg = PgServer::start();
    pg.create_user("srv", "srvpw", "scram-sha-256");
    pg.set_hba(&["host all srv 127.0.0.1/32 scram-sha-256"]);
    let weir = base(&pg)
        .database("bad", &format!("{} user=srv password=wrong", pg.connstr()))
        .set("server_login_retry", 30)
        .start();
    let failures = || {
        pg.log()
            .matches("password authentication failed for user \"srv\"")
            .count()
    };
    let e1 = RawConn::startup(weir.port(), "app", "bad", &[])
        .err()
        .expect("login through a server refusing Weir succeeded");
    assert_eq!(e1.severity, "FATAL", "{e1:?}");
    assert_eq!(e1.code, "28P01", "{e1:?}");
    assert!(
        eventually(TIMEOUT, || failures() == 1),
        "PostgreSQL logged {} failed logins",
        failures()
    );
    let e2 = RawConn::startup(weir.port(), "app", "bad", &[])
        .err()
        .expect("second login through a server refusing Weir succeeded");
    assert_eq!(e2, e1);
    std::thread::sleep(Duration::from_millis(500));
    assert_eq!(
        failures(),
        1,
        "Weir tried to log in again within server_login_retry"
    );
}

/// Two idle servers: by default (LIFO) sequential queries keep using the
/// most recently used one; with server_round_robin=1 they alternate.
fn pids_of_sequential_queries(round_robin: bool) -> Vec<String> {
    let pg = pg_with_apps();
    let weir = base(&pg)
        .set("default_pool_size", 2)
        .set("server_round_robin", if round_robin { 1 } else { 0 })
        .start();
    let mut a = holder(&weir, "postgres", "app");
    let mut b = holder(&weir, "postgres", "app");
    a.simple_query("commit").unwrap();
    b.simple_query("commit").unwrap();
    assert_eq!(pg.count_backends("app"), 2);
    let mut c = login(&weir, "postgres", "app");
    (0..6)
        .map(|_| c.query_one("select pg_backend_pid()"))
        .collect()
}

#[test]
fn lifo_reuses_the_same_server() {
    let pids = pids_of_sequential_queries(false);
    assert!(
        pids.iter().all(|p| *p == pids[0]),
        "LIFO should reuse one server: {pids:?}"
    );
}

#[test]
fn server_round_robin_alternates_servers() {
    let pids = pids_of_sequential_queries(true);
    for w in pids.windows(2) {
        assert_ne!(w[0], w[1], "round robin reused a server at once: {pids:?}");
    }
    let distinct: std::collections::BTreeSet<_> = pids.iter().collect();
    assert_eq!(distinct.len(), 2, "{pids:?}");
}

/// connect_query runs on each new server connection: here it sets a custom
/// setting that the client sees (session mode).
#[test]
fn connect_query_runs_on_new_servers() {
    let pg = pg_with_apps();
    let weir = base(&pg)
        .database(
            "postgres",
            &format!(
                "{} connect_query='select set_config(''weir.test'', ''from connect_query'', false)'",
                pg.connstr()
            ),
        )
        .set("pool_mode", "session")
        .start();
    let mut c = login(&weir, "postgres", "app");
    assert_eq!(
        c.query_one("select current_setting('weir.test', true)"),
        "from connect_query"
    );
}

/// application_name_add_host=1: the application name gets " - host:port".
#[test]
fn application_name_add_host_appends_client_address() {
    let pg = pg_with_apps();
    let weir = base(&pg)
        .set("pool_mode", "session")
        .set("application_name_add_host", 1)
        .start();
    let mut c = RawConn::startup(
        weir.port(),
        "app",
        "postgres",
        &[("application_name", "myapp")],
    )
    .unwrap();
    let local_port = c.stream.local_addr().unwrap().port();
    assert_eq!(
        c.query_one("show application_name"),
        format!("myapp - 127.0.0.1:{local_port}")
    );
}

// ---------------------------------------------------------------------------
// auth_query

/// auth_query through auth_user with a SECURITY DEFINER lookup function
/// (PgBouncer's documented setup): a role missing from the auth_file logs in
/// with its PostgreSQL password; a wrong one is refused; a superuser is
/// filtered out; after ALTER ROLE ... PASSWORD only the new one works.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn auth_query_with_auth_user_checks_postgres_passwords() {
    let pg = PgServer::start();
    pg.create_user("carol", "pw1", "md5");
    pg.exec("alter role postgres password 'supw'");
    pg.create_user_lookup();
    // Weir's own logins as carol must use the password too.
    pg.set_hba(&["host all carol 127.0.0.1/32 md5"]);
    let weir = Weir::for_pg(&pg)
        .set("pool_mode", "transaction")
        .auth_query_lookup()
        .userlist(&[("lookup", "")])
        .start();
    let port = weir.port();
    let wrong_password = |e: &tokio_postgres::Error, who: &str| {
        let f = expect_db_error(e);
        assert_eq!(f.code, "28P01", "{who}: {f:?}");
    };

    let c = connect_pw(port, "postgres", "carol", "pw1")
        .await
        .unwrap_or_else(|e| panic!("carol could not log in: {e:?}\n{}", weir.log_tail()));
    assert_eq!(q1(&c, "select current_user").await, "carol");
    drop(c);

    let e = connect_pw(port, "postgres", "carol", "nope")
        .await
        .expect_err("wrong password accepted");
    wrong_password(&e, "wrong password");

    let e = connect_pw(port, "postgres", "postgres", "supw")
        .await
        .expect_err("a superuser logged in although user_lookup filters them out");
    wrong_password(&e, "superuser");

    pg.exec("set password_encryption = 'md5'; alter role carol password 'pw2'");
    let c = connect_pw(port, "postgres", "carol", "pw2")
        .await
        .unwrap_or_else(|e| panic!("the new password was refused: {e:?}\n{}", weir.log_tail()));
    assert_eq!(q1(&c, "select current_user").await, "carol");
    let e = connect_pw(port, "postgres", "carol", "pw1")
        .await
        .expect_err("the old password still works after ALTER ROLE");
    wrong_password(&e, "old password");
}

// ---------------------------------------------------------------------------
// server_fast_close

/// server_fast_close=1, session mode, as PgBouncer documents it: after a reload changes
/// the database's connection settings (or RECONNECT), a session idle on its server loses
/// it at once and is closed with it, so that it notices its session state is gone; one
/// in a transaction finishes it first. Without the setting the session keeps its server.
#[test]
fn server_fast_close_ends_session_clients_after_reload_or_reconnect() {
    let pg = pg_with_apps();
    let builder = |q: &str| {
        base(&pg)
            .set("pool_mode", "session")
            .set("server_fast_close", 1)
            .database("postgres", &format!("{} connect_query='{q}'", pg.connstr()))
    };
    let mut weir = builder("select 1").start();
    let mut idle = login(&weir, "postgres", "app");
    let idle_pid = idle.query_one("select pg_backend_pid()");
    let mut busy = login(&weir, "postgres", "app2");
    busy.simple_query("begin").unwrap();
    let busy_pid = busy.query_one("select pg_backend_pid()");
    weir.reload_with(builder("select 2"));
    let e = idle.expect_error();
    assert_eq!(
        (e.severity.as_str(), e.code.as_str()),
        ("FATAL", "57P01"),
        "{e:?}"
    );
    assert!(e.message.contains("server_fast_close"), "{e:?}");
    assert!(idle.closes());
    assert!(
        eventually(TIMEOUT, || !backend_pids(&pg, "true").contains(&idle_pid)),
        "the idle session's server was not closed"
    );
    // The transaction runs to its end on its server, then the session goes.
    assert_eq!(busy.query_one("select pg_backend_pid()"), busy_pid);
    busy.simple_query("commit").unwrap();
    let e = busy.expect_error();
    assert_eq!(e.code, "57P01", "{e:?}");
    // RECONNECT marks the servers the same way.
    let mut c = login(&weir, "postgres", "app");
    assert_eq!(c.query_one("select 1"), "1");
    let mut console = login(&weir, "pgbouncer", "postgres");
    common::console::ok(&mut console, "RECONNECT postgres");
    let e = c.expect_error();
    assert_eq!(e.code, "57P01", "{e:?}");
    // Off (the default): a session keeps its server across a reload.
    let mut weir = base(&pg)
        .set("pool_mode", "session")
        .database(
            "postgres",
            &format!("{} connect_query='select 1'", pg.connstr()),
        )
        .start();
    let mut kept = login(&weir, "postgres", "app");
    let pid = kept.query_one("select pg_backend_pid()");
    weir.reload_with(base(&pg).set("pool_mode", "session").database(
        "postgres",
        &format!("{} connect_query='select 2'", pg.connstr()),
    ));
    assert_eq!(kept.query_one("select pg_backend_pid()"), pid);
}

// ---------------------------------------------------------------------------
// Load

/// 1,000 pgbench clients (tpcb-like, 3 transactions each) through
/// pool_size=10 + reserve_pool_size=2: no failed transaction, and PostgreSQL
/// never sees more than 12 connections from Weir.
#[test]
fn thousand_clients_share_twelve_servers() {
    // 1,000 client sockets in pgbench plus 1,000 in Weir.
    unsafe {
        let mut lim = libc::rlimit {
            rlim_cur: 0,
            rlim_max: 0,
        };
        if libc::getrlimit(libc::RLIMIT_NOFILE, &mut lim) == 0 && lim.rlim_cur < 8192 {
            lim.rlim_cur = lim.rlim_max.min(8192);
            libc::setrlimit(libc::RLIMIT_NOFILE, &lim);
        }
    }
    let pg = pg_with_apps();
    pgbench_direct(&pg, "postgres", "app", &["-i", "-s", "1", "-q"]).assert_ok();
    let weir = base(&pg)
        .set("default_pool_size", 10)
        .set("reserve_pool_size", 2)
        .set("max_client_conn", 1100)
        .set("query_wait_timeout", 120)
        .start();
    let sampler = BackendSampler::start(&pg, "usename = 'app'");
    let r = pgbench_via(
        &weir,
        "postgres",
        "app",
        &["-n", "-c", "1000", "-j", "2", "-t", "3"],
    );
    let (max, samples) = sampler.stop();
    r.assert_clean();
    assert_eq!(r.processed, 3000, "{}", r.stdout);
    assert!(max > 0, "never saw a server connection ({samples} samples)");
    assert!(
        max <= 12,
        "PostgreSQL saw {max} connections; pool_size 10 + reserve 2"
    );
}

/// A reload that changes nothing keeps the servers of a pool that logs in with a secret
/// auth_query learnt, so server_fast_close ends none of its sessions: the learnt secret
/// used to be forgotten at each reload, every server retired, and each such session ended
/// at every SIGHUP (a daily logrotate, say).
#[test]
fn a_reload_that_changes_nothing_keeps_sessions_of_auth_query_users() {
    let pg = PgServer::start();
    pg.create_user_lookup();
    pg.create_user("bob", "bobpw", "md5");
    let builder = Weir::for_pg(&pg)
        .auth_query_lookup()
        .set("auth_type", "plain")
        .set("pool_mode", "session")
        .set("server_fast_close", 1)
        .userlist(&[("lookup", ""), ("postgres", "")]);
    let mut weir = builder.clone().start();
    let mut c = RawConn::startup_pw(weir.port(), "bob", "postgres", &[], Some("bobpw"))
        .unwrap_or_else(|e| panic!("bob, looked up: {e:?}\n{}", weir.log_tail()));
    let pid = c.query_one("select pg_backend_pid()");
    weir.reload_with(builder);
    assert!(
        eventually(TIMEOUT, || weir.log().contains("configuration reloaded")),
        "{}",
        weir.log_tail()
    );
    assert_eq!(c.query_one("select pg_backend_pid()"), pid);
}
