//! pool_idle_timeout against real PostgreSQL: a pool (database and user) with no client
//! and no server for that long is freed, with its statistics (SHOW POOLS loses its row,
//! SHOW STATS its figures), and made again by the next client; a pool with a client
//! logged in or a server open is kept; 0 (the default) keeps every pool; the console's
//! SET turns it on.

mod common;

use std::time::Duration;

use common::console::{ok, Res};
use common::*;

/// Transaction mode, the console open to `postgres`, roles `app` and `app2`.
fn setup(pool_idle_timeout: u32, server_idle_timeout: u32) -> (PgServer, Weir) {
    let pg = PgServer::start();
    pg.create_user("app", "x", "md5");
    pg.create_user("app2", "x", "md5");
    let weir = Weir::for_pg(&pg)
        .set("pool_mode", "transaction")
        .set("admin_users", "postgres")
        .set("pool_idle_timeout", pool_idle_timeout)
        .set("server_idle_timeout", server_idle_timeout)
        .userlist(&[("postgres", ""), ("app", ""), ("app2", "")])
        .start();
    (pg, weir)
}

fn console(weir: &Weir) -> RawConn {
    RawConn::startup(weir.port(), "postgres", "pgbouncer", &[]).expect("console login")
}

fn show(weir: &Weir, what: &str) -> Res {
    ok(&mut console(weir), &format!("SHOW {what}"))
}

fn has_pool(weir: &Weir, user: &str) -> bool {
    !show(weir, "POOLS").find("user", user).is_empty()
}

/// psql, a client that logs in, runs `sql` and leaves.
fn run_as(weir: &Weir, user: &str, sql: &str) {
    psql_via(weir, "postgres", user, sql)
        .unwrap_or_else(|e| panic!("{user}: {sql}: {e}\n{}", weir.log_tail()));
}

#[test]
fn an_unused_pool_is_freed_with_its_stats_and_made_again() {
    let (_pg, weir) = setup(1, 1);
    for _ in 0..5 {
        run_as(&weir, "app", "select 1");
    }
    let stats = show(&weir, "STATS");
    let before = stats.num("database", "postgres", "total_xact_count");
    assert!(before >= 5, "{stats:#?}");

    // Its server goes at server_idle_timeout, then the pool a second later.
    assert!(
        eventually(Duration::from_secs(15), || !has_pool(&weir, "app")),
        "the pool of app was not freed: {:#?}\n{}",
        show(&weir, "POOLS"),
        weir.log_tail()
    );
    assert!(weir
        .log()
        .contains("freeing pool postgres/app: no clients and no servers"));
    // Its figures went with it: no pool of database postgres is left to sum.
    assert!(show(&weir, "STATS").find("database", "postgres").is_empty());

    // The next client gets a new pool, which counts from zero.
    run_as(&weir, "app", "select 1");
    assert!(has_pool(&weir, "app"));
    let after = show(&weir, "STATS").num("database", "postgres", "total_xact_count");
    assert!(after < before, "after {after}, before {before}");
}

#[test]
fn a_pool_with_a_client_or_a_server_is_kept() {
    // Servers are kept (server_idle_timeout 0) until the SET below.
    let (_pg, weir) = setup(1, 0);
    run_as(&weir, "app", "select 1");
    let mut stays = RawConn::startup(weir.port(), "app2", "postgres", &[]).expect("app2 login");
    assert_eq!(stays.query_one("select 2"), "2");

    // app's pool keeps an idle server, app2's a client (and a server).
    std::thread::sleep(Duration::from_secs(3));
    let pools = show(&weir, "POOLS");
    assert_eq!(pools.num("user", "app", "sv_idle"), 1, "{pools:#?}");
    assert_eq!(pools.num("user", "app2", "cl_active"), 1, "{pools:#?}");

    // Without servers, app's pool is empty and goes; app2's keeps its client.
    ok(&mut console(&weir), "SET server_idle_timeout = 1");
    assert!(
        eventually(Duration::from_secs(15), || !has_pool(&weir, "app")),
        "the pool of app was not freed: {:#?}\n{}",
        show(&weir, "POOLS"),
        weir.log_tail()
    );
    assert!(
        eventually(Duration::from_secs(15), || {
            let pools = show(&weir, "POOLS");
            pools.num("user", "app2", "sv_idle") == 0 && pools.num("user", "app2", "sv_active") == 0
        }),
        "app2's server was not closed: {:#?}",
        show(&weir, "POOLS")
    );
    std::thread::sleep(Duration::from_secs(3));
    let pools = show(&weir, "POOLS");
    assert_eq!(pools.num("user", "app2", "cl_active"), 1, "{pools:#?}");
    // Its client goes on in the same pool (a new server is opened for it).
    assert_eq!(stays.query_one("select 3"), "3");
    assert!(!weir.log().contains("freeing pool postgres/app2"));
}

#[test]
fn zero_keeps_every_pool_until_set_turns_it_on() {
    let (_pg, weir) = setup(0, 1);
    run_as(&weir, "app", "select 1");
    // The server goes; the pool stays, empty.
    assert!(
        eventually(Duration::from_secs(15), || {
            let pools = show(&weir, "POOLS");
            pools.num("user", "app", "sv_idle") == 0
        }),
        "the server of app was not closed: {:#?}",
        show(&weir, "POOLS")
    );
    std::thread::sleep(Duration::from_secs(3));
    assert!(has_pool(&weir, "app"));

    let mut con = console(&weir);
    ok(&mut con, "SET pool_idle_timeout = 2");
    let config = ok(&mut con, "SHOW CONFIG");
    assert_eq!(config.get("key", "pool_idle_timeout", "value"), "2");
    assert_eq!(config.get("key", "pool_idle_timeout", "changeable"), "yes");
    assert!(
        eventually(Duration::from_secs(15), || !has_pool(&weir, "app")),
        "SET pool_idle_timeout did not free the pool: {:#?}\n{}",
        show(&weir, "POOLS"),
        weir.log_tail()
    );
    assert!(!weir
        .log()
        .contains("option pool_idle_timeout is not implemented"));
}

#[test]
fn logins_around_the_timeout_always_find_their_pool_listed() {
    // Clients come about as often as pools are freed: one that got its pool just before
    // it was to be freed keeps it, and the pool stays in SHOW POOLS (not orphaned) while
    // the client is in it.
    let (_pg, weir) = setup(1, 1);
    for i in 0..8u64 {
        let mut c = RawConn::startup(weir.port(), "app", "postgres", &[]).expect("app login");
        assert!(
            has_pool(&weir, "app"),
            "round {i}: {:#?}",
            show(&weir, "POOLS")
        );
        assert_eq!(c.query_one("select 1"), "1");
        drop(c);
        std::thread::sleep(Duration::from_millis(800 + 150 * (i % 5)));
    }
}
