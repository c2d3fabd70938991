//! Several hosts per database entry (`host=a,b port=p,q`) against a real primary and a
//! streaming replica that the harness builds (pg_basebackup -R): load_balance_hosts,
//! skipping hosts that are down, target_session_attrs, promotion, and SHOW HOSTS.

mod common;

use common::hosts::*;
use common::*;

fn weir(entries: &[(&str, String)]) -> Weir {
    let mut b = Weir::builder()
        .set("pool_mode", "session")
        .set("admin_users", "postgres")
        .set("server_connect_timeout", 5)
        .set("server_login_retry", 1);
    for (name, connstr) in entries {
        b = b.database(name, connstr);
    }
    b.start()
}

/// The port of the server a client's session is on.
fn server_port(c: &mut RawConn) -> u16 {
    c.query_one("select inet_server_port()").parse().unwrap()
}

/// Opens `n` clients at once (each holds its own server in session mode) and returns
/// the server port of each, in order.
fn ports_of_new_servers(weir: &Weir, db: &str, n: usize) -> Vec<u16> {
    let mut clients: Vec<RawConn> = (0..n).map(|_| client(weir, db)).collect();
    clients.iter_mut().map(server_port).collect()
}

#[test]
fn hosts_balancing_session_attrs_and_show_hosts() {
    let (primary, replica) = pair();
    let (p, r) = (primary.port(), replica.port());
    let dead = free_port();
    let weir = weir(&[
        ("rr", entry(&[p, r], "")),
        (
            "dead",
            entry(&[dead, p, r], "load_balance_hosts=round-robin"),
        ),
        ("rw", entry(&[r, p], "target_session_attrs=read-write")),
        ("prim", entry(&[r, p], "target_session_attrs=primary")),
        ("ro", entry(&[p, r], "target_session_attrs=read-only")),
        ("stby", entry(&[p, r], "target_session_attrs=standby")),
        (
            "pstby",
            entry(&[p, r], "target_session_attrs=prefer-standby"),
        ),
        ("nostby", entry(&[p], "target_session_attrs=standby")),
        ("unused", entry(&[p, r], "load_balance_hosts=disable")),
    ]);

    // round-robin (the default with several hosts): new servers alternate.
    let ports = ports_of_new_servers(&weir, "rr", 4);
    assert_eq!(
        ports.iter().filter(|&&x| x == p).count(),
        2,
        "round-robin over primary {p} and replica {r}: {ports:?}"
    );
    assert_eq!(ports.iter().filter(|&&x| x == r).count(), 2, "{ports:?}");

    // A host that refuses connections is skipped, and the client never sees it.
    let ports = ports_of_new_servers(&weir, "dead", 4);
    assert!(
        ports.iter().all(|&x| x == p || x == r) && ports.contains(&p) && ports.contains(&r),
        "{ports:?}"
    );

    // target_session_attrs, whatever the order of the hosts.
    for (db, want) in [("rw", p), ("prim", p), ("ro", r), ("stby", r), ("pstby", r)] {
        for got in ports_of_new_servers(&weir, db, 3) {
            assert_eq!(got, want, "{db} reached {got}");
        }
    }

    // No host fits: the client is told so.
    let err = match RawConn::startup(weir.port(), "postgres", "nostby", &[]) {
        Ok(mut c) => c
            .simple_query("select 1")
            .expect_err("nostby has no standby, yet the query ran"),
        Err(e) => e,
    };
    assert_eq!(err.code, "08001", "{err:?}");
    assert!(
        err.message.contains("target_session_attrs=standby"),
        "{err:?}"
    );

    // SHOW HOSTS: one row per host of each entry.
    let mut held = client(&weir, "rr");
    server_port(&mut held);
    let res = show_hosts(&weir);
    assert_eq!(host_col(&res, "rr", p, "role").as_deref(), Some("primary"));
    assert_eq!(host_col(&res, "rr", r, "role").as_deref(), Some("standby"));
    assert_eq!(host_col(&res, "rr", p, "state").as_deref(), Some("up"));
    assert_eq!(host_col(&res, "rr", r, "state").as_deref(), Some("up"));
    assert_eq!(
        host_col(&res, "rr", p, "load_balance_hosts").as_deref(),
        Some("round-robin")
    );
    let active: i64 = [p, r]
        .iter()
        .map(|&port| {
            host_col(&res, "rr", port, "active")
                .unwrap()
                .parse::<i64>()
                .unwrap()
        })
        .sum();
    let idle: i64 = [p, r]
        .iter()
        .map(|&port| {
            host_col(&res, "rr", port, "idle")
                .unwrap()
                .parse::<i64>()
                .unwrap()
        })
        .sum();
    assert_eq!((active, idle), (1, 3), "{res:#?}");
    assert_eq!(
        host_col(&res, "dead", dead, "state").as_deref(),
        Some("down")
    );
    assert!(
        host_col(&res, "dead", dead, "last_error").is_some(),
        "{res:#?}"
    );
    assert_eq!(host_col(&res, "dead", p, "last_error"), None, "{res:#?}");
    // The replica refused read-write: that is its last error.
    assert!(
        host_col(&res, "rw", r, "last_error").is_some_and(|e| e.contains("hot standby")),
        "{res:#?}"
    );
    assert_eq!(
        host_col(&res, "unused", p, "state").as_deref(),
        Some("unknown")
    );
    assert_eq!(
        host_col(&res, "unused", r, "load_balance_hosts").as_deref(),
        Some("disable")
    );
}

#[test]
fn disable_stays_on_the_first_host_until_it_fails() {
    let (mut primary, replica) = pair();
    let (p, r) = (primary.port(), replica.port());
    let weir = weir(&[("d", entry(&[p, r], "load_balance_hosts=disable"))]);
    assert_eq!(ports_of_new_servers(&weir, "d", 3), vec![p, p, p]);
    primary.stop();
    assert_eq!(ports_of_new_servers(&weir, "d", 3), vec![r, r, r]);
    let res = show_hosts(&weir);
    assert_eq!(host_col(&res, "d", p, "state").as_deref(), Some("down"));
    assert_eq!(host_col(&res, "d", r, "state").as_deref(), Some("up"));
}

#[test]
fn prefer_standby_falls_back_to_the_primary() {
    let (primary, mut replica) = pair();
    let (p, r) = (primary.port(), replica.port());
    let weir = weir(&[("ps", entry(&[p, r], "target_session_attrs=prefer-standby"))]);
    assert_eq!(ports_of_new_servers(&weir, "ps", 2), vec![r, r]);
    replica.stop();
    assert_eq!(ports_of_new_servers(&weir, "ps", 2), vec![p, p]);
}

#[test]
fn read_write_follows_a_promoted_replica() {
    let (mut primary, replica) = pair();
    let (p, r) = (primary.port(), replica.port());
    let weir = weir(&[("rw", entry(&[p, r], "target_session_attrs=read-write"))]);
    assert_eq!(ports_of_new_servers(&weir, "rw", 2), vec![p, p]);
    primary.stop();
    replica.promote();
    let mut c = client(&weir, "rw");
    assert_eq!(server_port(&mut c), r);
    assert_eq!(c.query_one("select pg_is_in_recovery()"), "f");
    c.simple_query("create table after_promotion(x int)")
        .expect("a write on the promoted replica");
    let res = show_hosts(&weir);
    assert_eq!(host_col(&res, "rw", r, "role").as_deref(), Some("primary"));
    assert_eq!(host_col(&res, "rw", p, "state").as_deref(), Some("down"));
}

#[test]
fn a_host_that_never_answers_is_skipped_at_server_connect_timeout() {
    let primary = PgServer::start();
    // Accepts TCP connections (the kernel does, into the backlog) and never says a word.
    let silent = std::net::TcpListener::bind("127.0.0.1:0").unwrap();
    let s = silent.local_addr().unwrap().port();
    let weir = Weir::builder()
        .set("pool_mode", "session")
        .set("admin_users", "postgres")
        .set("server_connect_timeout", 1)
        .database(
            "d",
            &entry(&[s, primary.port()], "load_balance_hosts=disable"),
        )
        .start();
    let started = std::time::Instant::now();
    let mut c = client(&weir, "d");
    assert_eq!(server_port(&mut c), primary.port());
    let took = started.elapsed();
    assert!(
        took >= std::time::Duration::from_millis(900),
        "the silent host was not tried first ({took:?})"
    );
    let res = show_hosts(&weir);
    assert_eq!(host_col(&res, "d", s, "state").as_deref(), Some("down"));
    assert!(
        host_col(&res, "d", s, "last_error").is_some_and(|e| e.contains("timed out")),
        "{res:#?}"
    );
    // disable stays on the host that answered.
    drop(c);
    assert_eq!(
        ports_of_new_servers(&weir, "d", 2),
        vec![primary.port(), primary.port()]
    );
    drop(silent);
}

/// SHOW HOSTS' `idle` for (database, port).
fn idle_on(weir: &Weir, db: &str, port: u16) -> i64 {
    host_col(&show_hosts(weir), db, port, "idle")
        .and_then(|v| v.parse().ok())
        .unwrap_or(-1)
}

#[test]
fn least_outstanding_fills_the_host_with_fewer_servers() {
    let (primary, replica) = pair();
    let (p, r) = (primary.port(), replica.port());
    let weir = Weir::builder()
        .set("pool_mode", "session")
        .set("admin_users", "postgres")
        .set("server_idle_timeout", 1)
        .database(
            "lo",
            &entry(&[p, r], "load_balance_hosts=least-outstanding"),
        )
        .start();
    // Three held clients: ties take turns, so p, r, p.
    let mut held: Vec<RawConn> = (0..3).map(|_| client(&weir, "lo")).collect();
    let ports: Vec<u16> = held.iter_mut().map(server_port).collect();
    assert_eq!(ports, vec![p, r, p]);
    // The client on r leaves and its server is closed as idle: p has 2 open, r none.
    drop(held.remove(1));
    let deadline = std::time::Instant::now() + std::time::Duration::from_secs(10);
    while idle_on(&weir, "lo", r) != 0
        || host_col(&show_hosts(&weir), "lo", r, "active").as_deref() != Some("0")
    {
        assert!(
            std::time::Instant::now() < deadline,
            "the idle server on r stayed"
        );
        std::thread::sleep(std::time::Duration::from_millis(200));
    }
    // round-robin would now go to p then r; least-outstanding sends both to r.
    let mut more: Vec<RawConn> = (0..2).map(|_| client(&weir, "lo")).collect();
    let ports: Vec<u16> = more.iter_mut().map(server_port).collect();
    assert_eq!(ports, vec![r, r], "{}", weir.log_tail());
    let res = show_hosts(&weir);
    assert_eq!(
        host_col(&res, "lo", p, "load_balance_hosts").as_deref(),
        Some("least-outstanding")
    );
}

#[test]
fn host_weights_share_new_servers_in_proportion() {
    let (primary, replica) = pair();
    let (p, r) = (primary.port(), replica.port());
    let weir = weir(&[("w", entry(&[p, r], "host_weights=3,1"))]);
    // Smooth weighted round-robin over 8 new servers: exactly 6 and 2, interleaved.
    let ports = ports_of_new_servers(&weir, "w", 8);
    assert_eq!(
        ports,
        vec![p, p, r, p, p, p, r, p],
        "primary {p}, replica {r}"
    );
    let res = show_hosts(&weir);
    assert_eq!(host_col(&res, "w", p, "weight").as_deref(), Some("3"));
    assert_eq!(host_col(&res, "w", r, "weight").as_deref(), Some("1"));
}
