//! Acceptance: pgbench and psql through Weir in every pool mode.
//!
//! Each run is short (`-T 3`, scale 1) with 50 clients, simple and extended
//! protocol, with and without `-C` (a new connection per transaction), and
//! must report zero failed transactions.

mod common;

use common::*;

const CLIENTS: &str = "50";

/// Initialises pgbench tables (through Weir, except in statement mode where
/// `pgbench -i` would use transaction blocks) and runs pgbench through Weir.
fn pgbench_case(mode: &str, protocol: &str, connect_per_tx: bool) {
    let pg = PgServer::start();
    // Session mode keeps a server per client: give every client one.
    let pool_size = if mode == "session" { 60 } else { 20 };
    let weir = Weir::for_pg(&pg)
        .set("pool_mode", mode)
        .set("default_pool_size", pool_size)
        .set("max_client_conn", 500)
        .start();
    if mode == "statement" {
        pgbench_direct(&pg, "postgres", "postgres", &["-i", "-s", "1", "-q"]).assert_ok();
    } else {
        pgbench_via(&weir, "postgres", "postgres", &["-i", "-s", "1", "-q"]).assert_ok();
    }
    let mut args = vec!["-n", "-c", CLIENTS, "-j", "2", "-T", "3", "-M", protocol];
    if mode == "statement" {
        // tpcb-like uses BEGIN/END, which statement mode refuses by design.
        args.push("-S");
    }
    if connect_per_tx {
        args.push("-C");
    }
    let r = pgbench_via(&weir, "postgres", "postgres", &args);
    r.assert_clean();
}

#[test]
fn session_mode_pgbench_simple() {
    pgbench_case("session", "simple", false);
}

#[test]
fn session_mode_pgbench_extended() {
    pgbench_case("session", "extended", false);
}

#[test]
fn session_mode_pgbench_simple_connect_per_transaction() {
    pgbench_case("session", "simple", true);
}

#[test]
fn session_mode_pgbench_extended_connect_per_transaction() {
    pgbench_case("session", "extended", true);
}

#[test]
fn transaction_mode_pgbench_simple() {
    pgbench_case("transaction", "simple", false);
}

#[test]
fn transaction_mode_pgbench_extended() {
    pgbench_case("transaction", "extended", false);
}

#[test]
fn transaction_mode_pgbench_simple_connect_per_transaction() {
    pgbench_case("transaction", "simple", true);
}

#[test]
fn transaction_mode_pgbench_extended_connect_per_transaction() {
    pgbench_case("transaction", "extended", true);
}

#[test]
fn statement_mode_pgbench_select_only_simple() {
    pgbench_case("statement", "simple", false);
}

#[test]
fn statement_mode_pgbench_select_only_extended() {
    pgbench_case("statement", "extended", false);
}

#[test]
fn statement_mode_pgbench_select_only_simple_connect_per_transaction() {
    pgbench_case("statement", "simple", true);
}

#[test]
fn statement_mode_pgbench_select_only_extended_connect_per_transaction() {
    pgbench_case("statement", "extended", true);
}

/// Runs pgbench (as role `app`, tables made directly) through a transaction-mode Weir
/// with `default_pool_size = pool_size` and the extra settings, sampling
/// pg_stat_activity every ~50 ms: zero failed transactions, and PostgreSQL saw at least
/// one and never more than `pool_size` connections from Weir.
fn pgbench_within_pool_size(pool_size: u32, extra: &[(&str, &str)], args: &[&str]) {
    let pg = PgServer::start();
    pg.create_user("app", "x", "md5");
    pgbench_direct(&pg, "postgres", "app", &["-i", "-s", "1", "-q"]).assert_ok();
    let mut builder = Weir::for_pg(&pg)
        .set("pool_mode", "transaction")
        .set("default_pool_size", pool_size)
        .set("max_client_conn", 500);
    for (k, v) in extra {
        builder = builder.set(k, *v);
    }
    let weir = builder.start();
    let sampler = BackendSampler::start(&pg, "usename = 'app'");
    let r = pgbench_via(&weir, "postgres", "app", args);
    let (max, samples) = sampler.stop();
    r.assert_clean();
    assert!(
        samples > 5,
        "too few samples of pg_stat_activity ({samples})"
    );
    assert!(
        max > 0,
        "never saw a server connection from weir in {samples} samples"
    );
    assert!(
        max <= pool_size as i64,
        "PostgreSQL saw {max} connections from weir; default_pool_size is {pool_size}"
    );
}

/// Transaction mode, default_pool_size = 5, 100 clients: PostgreSQL never
/// sees more than 5 connections from Weir.
#[test]
fn transaction_mode_100_clients_use_at_most_default_pool_size_servers() {
    pgbench_within_pool_size(5, &[], &["-n", "-c", "100", "-j", "2", "-T", "3"]);
}

/// Same limit with a new client connection per transaction.
#[test]
fn transaction_mode_connect_per_transaction_uses_at_most_default_pool_size_servers() {
    pgbench_within_pool_size(
        5,
        &[],
        &["-n", "-S", "-C", "-c", "100", "-j", "2", "-T", "3"],
    );
}

#[test]
fn psql_works_through_weir() {
    let pg = PgServer::start();
    let weir = Weir::for_pg(&pg).set("pool_mode", "transaction").start();
    let out = psql_via(
        &weir,
        "postgres",
        "postgres",
        "begin; create table t (x int); insert into t values (1), (2); commit; select sum(x) from t",
    )
    .unwrap_or_else(|e| panic!("psql through weir failed: {e}\n{}", weir.log_tail()));
    assert_eq!(out, "3");
    // A meta-command (psql runs catalog queries for it).
    let out = psql_via(&weir, "postgres", "postgres", "\\dt").unwrap();
    assert!(out.contains("|t|table|"), "\\dt output: {out}");
    // psql reports the server's errors.
    let err = psql_via(&weir, "postgres", "postgres", "select 1/0").unwrap_err();
    assert!(err.contains("division by zero"), "psql stderr: {err}");
}

/// Several worker threads share one pool: servers opened on one worker are lent to
/// clients on another (and re-registered there), with the pool size still global.
fn multi_worker_case(protocol: &str, connect_per_tx: bool) {
    let mut args = vec!["-n", "-c", "40", "-j", "2", "-T", "3", "-M", protocol];
    if connect_per_tx {
        args.push("-C");
    }
    pgbench_within_pool_size(4, &[("workers", "3")], &args);
}

#[test]
fn three_workers_share_one_pool_simple() {
    multi_worker_case("simple", false);
}

#[test]
fn three_workers_share_one_pool_extended_connect_per_transaction() {
    multi_worker_case("extended", true);
}
