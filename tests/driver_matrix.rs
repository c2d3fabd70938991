//! The driver matrix (issue 11): real client drivers, each with its default
//! settings, through Weir in transaction mode, ten or more clients on a pool
//! of two server connections.
//!
//! Each driver's program lives in tests/drivers/<language>/ and is installed by
//! scripts/install-drivers (which scripts/test runs) into WEIR_DRIVERS_DIR
//! (default ~/.cache/weir-drivers). The program reads the pooler's URL from
//! WEIR_URL and exits 0 when every check passed.

mod common;

use std::path::PathBuf;
use std::time::Duration;

use common::*;

fn drivers_dir() -> PathBuf {
    match std::env::var_os("WEIR_DRIVERS_DIR") {
        Some(d) => PathBuf::from(d),
        None => PathBuf::from(std::env::var("HOME").expect("HOME")).join(".cache/weir-drivers"),
    }
}

fn program(rel: &str) -> PathBuf {
    PathBuf::from(env!("CARGO_MANIFEST_DIR"))
        .join("tests/drivers")
        .join(rel)
}

/// Weir in transaction mode with a pool of two server connections.
fn transaction_pool(pg: &PgServer) -> Weir {
    Weir::for_pg(pg)
        .set("pool_mode", "transaction")
        .set("default_pool_size", 2)
        .set("max_client_conn", 200)
        .start()
}

/// Runs a driver's program against `url`; panics with its output unless it
/// exits 0.
fn run_driver(weir: &Weir, mut cmd: std::process::Command) {
    let url = weir.url("postgres", "postgres");
    cmd.env("WEIR_URL", &url);
    let out = run_with_timeout(&mut cmd, None, Duration::from_secs(120));
    let stdout = String::from_utf8_lossy(&out.stdout);
    let stderr = String::from_utf8_lossy(&out.stderr);
    assert!(
        out.status.success(),
        "{cmd:?} failed ({}) through {url}\nstdout:\n{}\nstderr:\n{}\nweir log:\n{}",
        out.status,
        tail(&stdout, 40),
        tail(&stderr, 40),
        weir.log_tail()
    );
}

fn python(script: &str) -> std::process::Command {
    let mut cmd = clean_command(drivers_dir().join("venv/bin/python"));
    cmd.arg(program(script));
    cmd
}

/// A psql script: an error mid-transaction (the session goes on), COPY in
/// and out inside one transaction, SET that must stay with this client.
const PSQL_SCRIPT: &str = "BEGIN;
SELECT 1/0;
ROLLBACK;
SELECT 'after-error-' || 42;
BEGIN;
CREATE TEMP TABLE t (a int) ON COMMIT DROP;
COPY t FROM STDIN;
1
2
3
\\.
SELECT 'sum-' || sum(a) FROM t;
COPY (SELECT a FROM t ORDER BY a) TO STDOUT;
COMMIT;
";

#[test]
fn psql_ten_clients() {
    let pg = PgServer::start();
    let weir = transaction_pool(&pg);
    std::thread::scope(|s| {
        for _ in 0..10 {
            s.spawn(|| {
                let mut cmd = clean_command("psql");
                cmd.args([
                    "-X",
                    "-A",
                    "-t",
                    "-q",
                    "-f",
                    "-",
                    &weir.url("postgres", "postgres"),
                ]);
                let out = run_with_timeout(
                    &mut cmd,
                    Some(PSQL_SCRIPT.as_bytes()),
                    Duration::from_secs(60),
                );
                let stdout = String::from_utf8_lossy(&out.stdout);
                let stderr = String::from_utf8_lossy(&out.stderr);
                assert!(
                    stdout.contains("after-error-42")
                        && stdout.contains("sum-6")
                        && stdout.contains("1\n2\n3"),
                    "psql through Weir:\nstdout:\n{stdout}\nstderr:\n{stderr}"
                );
                assert!(stderr.contains("division by zero"), "{stderr}");
            });
        }
    });
}

fn pgbench_matrix(protocol: &str) {
    let pg = PgServer::start();
    let weir = transaction_pool(&pg);
    pgbench_via(&weir, "postgres", "postgres", &["-i", "-s", "1", "-q"]).assert_ok();
    // One thread per client: pgbench prepares with a synchronous call, which
    // blocks its thread's other clients; with fewer servers than clients a
    // queued prepare would then wait for servers its own siblings hold
    // idle in transaction (seen with -j 2: a hang until query_wait_timeout).
    let args = ["-n", "-c", "10", "-j", "10", "-t", "50", "-M", protocol];
    pgbench_via(&weir, "postgres", "postgres", &args).assert_clean();
}

#[test]
fn pgbench_simple() {
    pgbench_matrix("simple");
}

#[test]
fn pgbench_extended() {
    pgbench_matrix("extended");
}

#[test]
fn pgbench_prepared() {
    pgbench_matrix("prepared");
}

/// Session mode (one server per client) validates a driver's program itself;
/// transaction mode is what the matrix is about.
fn pool_for(mode: &str, pg: &PgServer) -> Weir {
    if mode == "session" {
        Weir::for_pg(pg)
            .set("pool_mode", "session")
            .set("default_pool_size", 20)
            .start()
    } else {
        transaction_pool(pg)
    }
}

/// Runs a Python driver's program through Weir in `mode`. Session mode
/// (one server per client) validates the program itself.
fn python_case(mode: &str, script: &str) {
    let pg = PgServer::start();
    let weir = pool_for(mode, &pg);
    run_driver(&weir, python(script));
}

#[test]
fn psycopg_in_session_mode() {
    python_case("session", "python/psycopg_check.py");
}

#[test]
// Prepared statements pass; client B sees client A's SET search_path.
#[ignore = "needs issue 11 session state"]
fn psycopg() {
    python_case("transaction", "python/psycopg_check.py");
}

#[test]
fn asyncpg_in_session_mode() {
    python_case("session", "python/asyncpg_check.py");
}

#[test]
// Prepared statements pass; client B sees client A's SET search_path.
#[ignore = "needs issue 11 session state"]
fn asyncpg() {
    python_case("transaction", "python/asyncpg_check.py");
}

#[test]
fn sqlalchemy_in_session_mode() {
    python_case("session", "python/sqlalchemy_check.py");
}

#[test]
fn sqlalchemy() {
    python_case("transaction", "python/sqlalchemy_check.py");
}

/// Runs a Node.js driver's program (its modules installed under the cache).
fn node_case(mode: &str, script: &str) {
    let pg = PgServer::start();
    let weir = pool_for(mode, &pg);
    let mut cmd = clean_command("node");
    cmd.env("NODE_PATH", drivers_dir().join("node/node_modules"))
        .arg(program(script));
    run_driver(&weir, cmd);
}

#[test]
fn node_postgres_in_session_mode() {
    node_case("session", "node/pg_check.js");
}

#[test]
// Prepared statements pass; client B sees client A's SET search_path.
#[ignore = "needs issue 11 session state"]
fn node_postgres() {
    node_case("transaction", "node/pg_check.js");
}

#[test]
fn postgres_js_in_session_mode() {
    node_case("session", "node/postgresjs_check.js");
}

/// Passes in transaction mode today (why postgres.js copes with its named
/// statements meeting other servers was not examined).
#[test]
fn postgres_js() {
    node_case("transaction", "node/postgresjs_check.js");
}
