//! Read/write splitting (`read_write_split=1`) against a real primary and streaming
//! replicas: reads go to the standbys, every statement that writes or might reaches the
//! primary (on a standby it would fail with 25006), a client reads its own writes under
//! replica lag, and a lagging standby gets no reads past max_replica_lag.

mod common;

use std::time::{Duration, Instant};

use common::hosts::*;
use common::proto::{bind, execute, parse, query, sync, Msg};
use common::*;

fn weir(entries: &[(&str, String)], extra: &[(&str, &str)]) -> Weir {
    let mut b = fast_checks();
    for (k, v) in extra {
        b = b.set(k, *v);
    }
    for (name, connstr) in entries {
        b = b.database(name, connstr);
    }
    b.start()
}

/// Waits until the checks know `port` as a standby (reads go to the primary before).
fn wait_standby(weir: &Weir, db: &str, port: u16) {
    assert!(
        eventually(Duration::from_secs(10), || host_col(
            &show_hosts(weir),
            db,
            port,
            "role"
        )
        .as_deref()
            == Some("standby")),
        "{port} never seen as a standby\n{}",
        weir.log_tail()
    );
}

fn wait_replayed(replica: &PgServer, sql: &str, want: &str) {
    assert!(
        eventually(Duration::from_secs(10), || replica
            .try_psql(sql)
            .is_ok_and(|s| s.trim() == want)),
        "the replica never answered {want} to {sql}"
    );
}

/// Which server ran a simple query: its port.
fn port_of(c: &mut RawConn) -> u16 {
    c.query_one("select inet_server_port()").parse().unwrap()
}

#[test]
fn reads_go_to_the_standbys_and_writes_to_the_primary() {
    let primary = PgServer::start();
    let r1 = PgServer::replica_of(&primary);
    let r2 = PgServer::replica_of(&primary);
    let (p, s1, s2) = (primary.port(), r1.port(), r2.port());
    primary.exec("create table kv(k int primary key, v text)");
    wait_replayed(&r2, "select count(*) from kv", "0");
    let http = free_port();
    let listen = format!("127.0.0.1:{http}");
    let weir = weir(
        &[("app", entry(&[p, s1, s2], "read_write_split=1"))],
        &[("default_pool_size", "10"), ("http_listen", &listen)],
    );
    let mut c = client(&weir, "app");
    // Before the checks have seen the standbys, reads are served by the primary.
    assert_eq!(c.query_one("select 1"), "1");
    wait_standby(&weir, "app", s1);
    wait_standby(&weir, "app", s2);

    assert!(
        [s1, s2].contains(&port_of(&mut c)),
        "a read went to the primary"
    );
    assert_eq!(c.query_one("select pg_is_in_recovery()"), "t");
    c.simple_query("insert into kv values (1, 'one')")
        .unwrap_or_else(|e| panic!("write: {e:?}\n{}", weir.log_tail()));
    assert_eq!(primary.psql("select v from kv where k = 1").trim(), "one");

    // The extended protocol: an unnamed read (by another client: this one's reads wait
    // for the standbys to replay its write), then a named write run twice.
    let mut reader = client(&weir, "app");
    reader.send(
        &[
            parse("", "select inet_server_port()"),
            bind("", "", &[]),
            execute("", 0),
            sync(),
        ]
        .concat(),
    );
    let port: u16 = first_value(&reader.read_until_ready()).parse().unwrap();
    assert!([s1, s2].contains(&port), "extended read on {port}");
    c.send(&[parse("ins", "insert into kv values ($1, 'x')"), sync()].concat());
    c.read_until_ready();
    for k in [10, 11] {
        let k = k.to_string();
        c.send(&[bind("", "ins", &[Some(&k)]), execute("", 0), sync()].concat());
        let msgs = c.read_until_ready();
        assert!(
            msgs.iter().all(|m| m.tag != b'E'),
            "named write {k}: {msgs:?}\n{}",
            weir.log_tail()
        );
    }
    assert_eq!(
        primary.psql("select count(*) from kv where k >= 10").trim(),
        "2"
    );

    // Reads spread over both standbys (round-robin): ten open read-only transactions
    // hold ten servers of the pool of reads.
    let mut open: Vec<RawConn> = (0..10).map(|_| client(&weir, "app")).collect();
    let mut on = std::collections::HashMap::new();
    for o in &mut open {
        o.simple_query("begin read only").unwrap();
        *on.entry(port_of(o)).or_insert(0) += 1;
    }
    assert!(
        !on.contains_key(&p),
        "a read-only transaction on the primary: {on:?}"
    );
    assert!(
        on.get(&s1).is_some_and(|&n| n >= 3) && on.get(&s2).is_some_and(|&n| n >= 3),
        "reads not spread over the standbys: {on:?}"
    );
    for o in &mut open {
        o.simple_query("commit").unwrap();
    }
    // /metrics counts where requests went.
    let body = common::http::http_get(http, "/metrics").unwrap().body;
    let count = |to: &str, class: &str| -> f64 {
        let want =
            format!("weir_split_requests_total{{database=\"app\",to=\"{to}\",class=\"{class}\"}} ");
        body.lines()
            .find_map(|l| l.strip_prefix(&want))
            .and_then(|v| v.trim().parse().ok())
            .unwrap_or_else(|| panic!("no {want} in\n{body}"))
    };
    assert!(count("standby", "read") >= 12.0, "{body}");
    assert!(count("primary", "write") >= 3.0, "{body}");
    count("primary", "read");
}

fn first_value(msgs: &[Msg]) -> String {
    msgs.iter()
        .find(|m| m.tag == b'D')
        .and_then(|m| {
            common::proto::data_row(&m.body)
                .into_iter()
                .next()
                .flatten()
        })
        .unwrap_or_else(|| panic!("no row in {msgs:?}"))
}

/// Everything that writes, might write, or is not understood must reach the primary: on
/// a standby each of these fails (25006, or a missing object), so each succeeding
/// through Weir shows it ran on the primary.
#[test]
fn tricky_statements_always_reach_the_primary() {
    let (primary, replica) = pair();
    let (p, r) = (primary.port(), replica.port());
    primary.exec(
        "create table t(a int); create sequence s; \
         create function add_row() returns int language sql as 'insert into t values (42) returning 1'; \
         create function stable_read() returns int stable language sql as 'select 7'",
    );
    wait_replayed(
        &replica,
        "select count(*) from pg_proc where proname = 'stable_read'",
        "1",
    );
    let weir = weir(&[("app", entry(&[p, r], "read_write_split=1"))], &[]);
    let mut c = client(&weir, "app");
    wait_standby(&weir, "app", r);
    assert_eq!(c.query_one("select pg_is_in_recovery()"), "t");

    let tricky = [
        "select nextval('s')",
        "SELECT setval('s', 100)",
        "select currval('s')",
        "select * from t for update",
        "select * from t for share",
        "select * from t for no key update",
        "select * from t for key share",
        "select * from (select * from t for update) x",
        "with x as (insert into t values (1) returning a) select * from x",
        "with y as (update t set a = a where false returning 1) select count(*) from y",
        "with z as (delete from t where false returning 1) select count(*) from z",
        "select add_row()",
        "select public.add_row() where true",
        "select * into t_copy from t",
        "drop table t_copy",
        "explain analyze insert into t values (2)",
        "select 1; insert into t values (3)",
        "/* hint */ insert into t values (4)",
        "(select 1) union all (select nextval('s'))",
        "select pg_catalog.set_config('application_name', 'x', false)",
        "select txid_current()",
        "values (nextval('s'))",
        "select a from t where a = (select nextval('s'))",
        "select * from t limit (select nextval('s'))",
        "select count(*) filter (where nextval('s') > 0) from t",
        "listen chan",
        "unlisten chan",
        "select from_the_future()",
    ];
    // A function created after Weir read the database's list: not known, so a write.
    primary.exec(
        "create function from_the_future() returns int language sql as 'insert into t values (9) returning 1'",
    );
    wait_replayed(
        &replica,
        "select count(*) from pg_proc where proname = 'from_the_future'",
        "1",
    );
    for sql in tricky {
        c.simple_query(sql)
            .unwrap_or_else(|e| panic!("{sql}: {e:?} (went to a standby?)\n{}", weir.log_tail()));
    }
    // A transaction that starts with BEGIN is the primary's, reads and all.
    c.simple_query("begin").unwrap();
    assert_eq!(port_of(&mut c), p);
    c.simple_query("insert into t values (5)").unwrap();
    c.simple_query("commit").unwrap();

    // A write sent while a read runs on a standby waits for it, then goes to the primary
    // (a client with no write of its own yet, whose reads go to the standby).
    let mut h = client(&weir, "app");
    h.send(&query("select pg_is_in_recovery() from pg_sleep(0.3)"));
    std::thread::sleep(Duration::from_millis(100));
    h.send(&query(
        "insert into t values (6) returning inet_server_port()",
    ));
    let first = h.read_until_ready();
    assert_eq!(first_value(&first), "t", "{first:?}");
    let second = h.read_until_ready();
    assert_eq!(
        first_value(&second),
        p.to_string(),
        "{second:?}\n{}",
        weir.log_tail()
    );

    // A batch that arrives in two reads: its start (a read) must not decide for its end.
    let mut b = client(&weir, "app");
    b.send(&[parse("", "select 1"), bind("", "", &[]), execute("", 0)].concat());
    std::thread::sleep(Duration::from_millis(100));
    b.send(
        &[
            parse("", "insert into t values (8)"),
            bind("", "", &[]),
            execute("", 0),
            sync(),
        ]
        .concat(),
    );
    let msgs = b.read_until_ready();
    assert!(
        msgs.iter().all(|m| m.tag != b'E'),
        "split batch: {msgs:?}\n{}",
        weir.log_tail()
    );

    // What a standby refuses although it reads: serializable transactions (by BEGIN, by
    // the session's default), a BEGIN whose last word is READ WRITE, and any text read
    // with standard_conforming_strings off (where the parser could be misled).
    let mut z = client(&weir, "app");
    for sql in [
        "begin isolation level serializable, read only, deferrable; select count(*) from t; commit",
        "begin read only, read write; insert into t values (11); commit",
        "set default_transaction_isolation = 'serializable'",
        "select count(*) from t",
        "reset default_transaction_isolation",
        "set standard_conforming_strings = off",
        r"select 'a\'; insert into t values (12); --'",
        "set standard_conforming_strings = on",
    ] {
        z.simple_query(sql)
            .unwrap_or_else(|e| panic!("{sql}: {e:?}\n{}", weir.log_tail()));
    }

    // A write prepared by name, run later: its Bind names it, and Weir knows its text.
    c.send(&[parse("w", "insert into t values ($1)"), sync()].concat());
    c.read_until_ready();
    c.simple_query("select 1").unwrap();
    c.send(&[bind("", "w", &[Some("7")]), execute("", 0), sync()].concat());
    let msgs = c.read_until_ready();
    assert!(
        msgs.iter().all(|m| m.tag != b'E'),
        "{msgs:?}\n{}",
        weir.log_tail()
    );

    assert_eq!(
        primary
            .psql("select count(*) from t where a in (1, 2, 3, 4, 5, 6, 7, 9, 42)")
            .trim(),
        // add_row() ran twice.
        "10"
    );
    // A stable function is a read: once Weir has the database's function list, it is
    // served by a standby (for a client with no write of its own to wait for).
    let mut fresh = client(&weir, "app");
    assert!(
        eventually(Duration::from_secs(5), || fresh.query_one(
            "select pg_is_in_recovery() from (select stable_read()) x"
        ) == "t"),
        "a stable function's read never went to the standby\n{}",
        weir.log_tail()
    );
}

/// A client that writes then reads sees its write, even on a standby that applies WAL a
/// second late: its reads go to the primary until the standby has replayed the write.
#[test]
fn a_client_reads_its_own_writes_under_replica_lag() {
    let (primary, replica) = pair();
    let (p, r) = (primary.port(), replica.port());
    primary.exec("create table ryw(k int primary key)");
    wait_replayed(&replica, "select count(*) from ryw", "0");
    replica.exec("alter system set recovery_min_apply_delay = '1s'");
    replica.reload();
    let weir = weir(&[("app", entry(&[p, r], "read_write_split=1"))], &[]);
    let mut writer = client(&weir, "app");
    let mut other = client(&weir, "app");
    wait_standby(&weir, "app", r);
    let mut lagged = 0;
    for k in 0..15 {
        writer
            .simple_query(&format!("insert into ryw values ({k})"))
            .unwrap();
        let seen = writer.query_one(&format!("select count(*) from ryw where k = {k}"));
        assert_eq!(seen, "1", "write {k} not read back\n{}", weir.log_tail());
        // Another client has no write to wait for: it reads on the lagging standby.
        if other.query_one(&format!("select count(*) from ryw where k = {k}")) == "0" {
            lagged += 1;
        }
    }
    assert!(lagged > 10, "the standby was not lagging ({lagged} of 15)");
    assert_eq!(other.query_one("select pg_is_in_recovery()"), "t");
    // Once the standby has replayed its writes, the writer reads there again.
    let started = Instant::now();
    assert!(
        eventually(Duration::from_secs(10), || writer
            .query_one("select pg_is_in_recovery()")
            == "t"),
        "the writer's reads never went back to the standby\n{}",
        weir.log_tail()
    );
    eprintln!("writer back on the standby after {:?}", started.elapsed());
}

/// max_replica_lag: a standby further behind gets no reads (they go to the primary) and
/// gets them back once it catches up.
#[test]
fn a_standby_past_max_replica_lag_gets_no_reads() {
    let (primary, replica) = pair();
    let (p, r) = (primary.port(), replica.port());
    primary.exec("create table lag(x int)");
    wait_replayed(&replica, "select count(*) from lag", "0");
    replica.exec("alter system set recovery_min_apply_delay = '3s'");
    replica.reload();
    let weir = weir(
        &[(
            "app",
            entry(&[p, r], "read_write_split=1 max_replica_lag=1"),
        )],
        &[],
    );
    let mut c = client(&weir, "app");
    wait_standby(&weir, "app", r);
    assert_eq!(c.query_one("select pg_is_in_recovery()"), "t");
    // Writes every 100 ms keep the standby 3 s behind.
    let stop = std::sync::Arc::new(std::sync::atomic::AtomicBool::new(false));
    let writer = {
        let stop = stop.clone();
        let port = weir.port();
        std::thread::spawn(move || {
            let mut w = RawConn::startup(port, "postgres", "app", &[]).unwrap();
            while !stop.load(std::sync::atomic::Ordering::Relaxed) {
                w.simple_query("insert into lag values (1)").unwrap();
                std::thread::sleep(Duration::from_millis(100));
            }
        })
    };
    let off = eventually(Duration::from_secs(15), || {
        c.query_one("select pg_is_in_recovery()") == "f"
    });
    let lag = host_col(&show_hosts(&weir), "app", r, "lag");
    stop.store(true, std::sync::atomic::Ordering::Relaxed);
    writer.join().unwrap();
    assert!(
        off,
        "reads stayed on a standby {lag:?} s behind\n{}",
        weir.log_tail()
    );
    // Caught up (nothing left to apply), the standby serves reads again.
    assert!(
        eventually(Duration::from_secs(15), || c
            .query_one("select pg_is_in_recovery()")
            == "t"),
        "reads never went back to the standby\n{}",
        weir.log_tail()
    );
}
