//! Pool modes: session / transaction / statement, chosen globally, per
//! database and per user; what each mode lets a client do.

// Tests run on their own runtime, which has a time driver (clippy.toml is for Weir's
// workers).
#![allow(clippy::disallowed_methods)]

mod common;

use common::*;
use std::time::Duration;

/// Which pool mode Weir applies to (db, user), observed from behaviour.
/// Needs a pool size of 1 for that pool and a short query_wait_timeout.
///
/// * statement: `BEGIN` is refused (25000).
/// * transaction: a second client is served while the first one is
///   connected but idle outside a transaction.
/// * session: the second client is not served while the first one holds
///   the only server.
async fn observed_mode(weir: &Weir, db: &str, user: &str) -> &'static str {
    let a = connect(weir.port(), db, user)
        .await
        .unwrap_or_else(|e| panic!("connect {db}/{user}: {e:?}\n{}", weir.log_tail()));
    if let Err(e) = q(&a, "begin").await {
        let f = expect_db_error(&e);
        assert_eq!(f.code, "25000", "BEGIN failed unexpectedly: {f:?}");
        return "statement";
    }
    q(&a, "commit").await.unwrap();
    assert_eq!(q1(&a, "select 1").await, "1");
    let second = async {
        let b = connect(weir.port(), db, user).await?;
        q(&b, "select 2").await
    };
    let verdict = match tokio::time::timeout(Duration::from_secs(10), second).await {
        Ok(Ok(rows)) => {
            assert_eq!(rows, vec![Some("2".to_string())]);
            "transaction"
        }
        // query_wait_timeout, or still waiting.
        Ok(Err(_)) | Err(_) => "session",
    };
    // The first client still works in every mode.
    assert_eq!(q1(&a, "select 3").await, "3");
    verdict
}

fn one_server_weir(pg: &PgServer, mode: &str) -> WeirBuilder {
    Weir::for_pg(pg)
        .set("pool_mode", mode)
        .set("default_pool_size", 1)
        .set("query_wait_timeout", 2)
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn global_pool_mode_session() {
    let pg = PgServer::start();
    let weir = one_server_weir(&pg, "session").start();
    assert_eq!(
        observed_mode(&weir, "postgres", "postgres").await,
        "session"
    );
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn global_pool_mode_transaction() {
    let pg = PgServer::start();
    let weir = one_server_weir(&pg, "transaction").start();
    assert_eq!(
        observed_mode(&weir, "postgres", "postgres").await,
        "transaction"
    );
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn global_pool_mode_statement() {
    let pg = PgServer::start();
    let weir = one_server_weir(&pg, "statement").start();
    assert_eq!(
        observed_mode(&weir, "postgres", "postgres").await,
        "statement"
    );
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn default_pool_mode_is_session() {
    let pg = PgServer::start();
    let weir = Weir::for_pg(&pg)
        .set("default_pool_size", 1)
        .set("query_wait_timeout", 2)
        .start();
    assert_eq!(
        observed_mode(&weir, "postgres", "postgres").await,
        "session"
    );
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn pool_mode_per_database_overrides_global() {
    let pg = PgServer::start();
    let weir = one_server_weir(&pg, "session")
        .database("tx", &format!("{} pool_mode=transaction", pg.connstr()))
        .database("st", &format!("{} pool_mode=statement", pg.connstr()))
        .start();
    assert_eq!(observed_mode(&weir, "tx", "postgres").await, "transaction");
    assert_eq!(observed_mode(&weir, "st", "postgres").await, "statement");
    assert_eq!(
        observed_mode(&weir, "postgres", "postgres").await,
        "session"
    );
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn pool_mode_per_user_overrides_database_and_global() {
    let pg = PgServer::start();
    pg.create_user("app", "x", "md5");
    let weir = one_server_weir(&pg, "transaction")
        .database("st", &format!("{} pool_mode=statement", pg.connstr()))
        .user_setting("app", "pool_mode=session")
        .start();
    assert_eq!(observed_mode(&weir, "postgres", "app").await, "session");
    assert_eq!(observed_mode(&weir, "st", "app").await, "session");
    assert_eq!(observed_mode(&weir, "st", "postgres").await, "statement");
    assert_eq!(
        observed_mode(&weir, "postgres", "postgres").await,
        "transaction"
    );
}

/// Session mode: a client keeps its own server for its whole session, and
/// concurrent clients get different servers.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn session_mode_client_keeps_its_server() {
    let pg = PgServer::start();
    let weir = Weir::for_pg(&pg)
        .set("pool_mode", "session")
        .set("default_pool_size", 5)
        .start();
    let a = connect(weir.port(), "postgres", "postgres").await.unwrap();
    let b = connect(weir.port(), "postgres", "postgres").await.unwrap();
    let pid_a = q1(&a, "select pg_backend_pid()").await;
    let pid_b = q1(&b, "select pg_backend_pid()").await;
    assert_ne!(pid_a, pid_b, "two session-mode clients share one server");
    for _ in 0..5 {
        assert_eq!(q1(&b, "select pg_backend_pid()").await, pid_b);
        assert_eq!(q1(&a, "select pg_backend_pid()").await, pid_a);
    }
}

/// Transaction mode: clients take turns on one server between transactions.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn transaction_mode_clients_share_one_server() {
    let pg = PgServer::start();
    let weir = one_server_weir(&pg, "transaction").start();
    let a = connect(weir.port(), "postgres", "postgres").await.unwrap();
    let b = connect(weir.port(), "postgres", "postgres").await.unwrap();
    let pid = q1(&a, "select pg_backend_pid()").await;
    for _ in 0..5 {
        assert_eq!(q1(&b, "select pg_backend_pid()").await, pid);
        assert_eq!(q1(&a, "select pg_backend_pid()").await, pid);
    }
}

/// Transaction mode: while a client is inside a transaction its server is
/// not lent to anyone else; another client's query runs only after COMMIT /
/// ROLLBACK (the end is seen from ReadyForQuery's status).
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn transaction_mode_server_stays_with_client_until_transaction_ends() {
    let pg = PgServer::start();
    pg.exec("create table t (x int)");
    let weir = one_server_weir(&pg, "transaction")
        .set("query_wait_timeout", 30)
        .start();
    let a = connect(weir.port(), "postgres", "postgres").await.unwrap();
    let b = connect(weir.port(), "postgres", "postgres").await.unwrap();
    q(&a, "begin").await.unwrap();
    q(&a, "insert into t values (1)").await.unwrap();
    // If B got A's server now, it would run inside A's transaction and see
    // the uncommitted row.
    let b_task = tokio::spawn(async move { q1(&b, "select count(*) from t").await });
    tokio::time::sleep(Duration::from_millis(500)).await;
    q(&a, "rollback").await.unwrap();
    let seen = tokio::time::timeout(TIMEOUT, b_task)
        .await
        .expect("B never got a server")
        .unwrap();
    assert_eq!(seen, "0", "B ran inside A's open transaction");
}

/// Transaction mode with a multi-statement simple query that opens and
/// closes a transaction in one message.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn transaction_mode_transaction_in_one_query_string() {
    let pg = PgServer::start();
    pg.exec("create table t (x int)");
    let weir = one_server_weir(&pg, "transaction").start();
    let a = connect(weir.port(), "postgres", "postgres").await.unwrap();
    let b = connect(weir.port(), "postgres", "postgres").await.unwrap();
    q(
        &a,
        "begin; insert into t values (1); insert into t values (2); commit",
    )
    .await
    .unwrap();
    assert_eq!(q1(&b, "select sum(x) from t").await, "3");
}

/// Statement mode: a transaction block is refused with FATAL 25000, the
/// server is not left inside the transaction, and others keep working.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn statement_mode_refuses_transaction_blocks() {
    let pg = PgServer::start();
    pg.exec("create table t (x int)");
    let weir = one_server_weir(&pg, "statement").start();
    let a = connect(weir.port(), "postgres", "postgres").await.unwrap();
    let e = q(&a, "begin")
        .await
        .expect_err("BEGIN must be refused in statement mode");
    let f = expect_db_error(&e);
    assert_eq!(f.code, "25000", "{f:?}");
    assert_eq!(f.severity, "FATAL", "{f:?}");
    assert_eq!(
        f.message,
        "transaction blocks not allowed in statement pooling mode"
    );
    // Statements run in autocommit; the single server is usable and not
    // inside a transaction.
    let b = connect(weir.port(), "postgres", "postgres").await.unwrap();
    q(&b, "insert into t values (1)").await.unwrap();
    assert_eq!(q1(&b, "select count(*) from t").await, "1");
    assert_eq!(
        pg.psql("select count(*) from t"),
        "1",
        "the insert was not committed"
    );
    assert!(
        eventually(TIMEOUT, || pg
            .count_backends_where("state like 'idle in transaction%'")
            == 0),
        "a server stays idle in transaction after the refused BEGIN"
    );
}

/// Statement mode refuses a transaction opened over the extended protocol too.
#[test]
fn statement_mode_refuses_transaction_block_extended_protocol() {
    let pg = PgServer::start();
    let weir = one_server_weir(&pg, "statement").start();
    let mut c = RawConn::startup(weir.port(), "postgres", "postgres", &[]).unwrap();
    let mut batch = proto::parse("", "begin");
    batch.extend(proto::bind("", "", &[]));
    batch.extend(proto::execute("", 0));
    batch.extend(proto::sync());
    c.send(&batch);
    let f = c.expect_error();
    assert_eq!(
        (f.severity.as_str(), f.code.as_str()),
        ("FATAL", "25000"),
        "{f:?}"
    );
}

/// Session mode: server_reset_query (DISCARD ALL by default) runs when a
/// client leaves, so the next client of that server starts clean.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn session_mode_runs_server_reset_query_between_clients() {
    let pg = PgServer::start();
    let weir = one_server_weir(&pg, "session").start();
    let a = connect(weir.port(), "postgres", "postgres").await.unwrap();
    let pid_a = q1(&a, "select pg_backend_pid()").await;
    q(
        &a,
        "prepare p as select 1; set my.var = 'dirty'; create temp table tt (x int)",
    )
    .await
    .unwrap();
    drop(a);
    // A's server comes back to the pool once A has gone.
    let deadline = std::time::Instant::now() + TIMEOUT;
    let (b, pid_b) = loop {
        if let Ok(c) = connect(weir.port(), "postgres", "postgres").await {
            if let Ok(rows) = q(&c, "select pg_backend_pid()").await {
                break (c, rows[0].clone().unwrap());
            }
        }
        assert!(
            std::time::Instant::now() < deadline,
            "second client never got the server back"
        );
        tokio::time::sleep(Duration::from_millis(100)).await;
    };
    assert_eq!(pid_b, pid_a, "pool size 1: B should reuse A's server");
    assert_eq!(
        q1(&b, "select count(*) from pg_prepared_statements").await,
        "0"
    );
    assert_eq!(
        q1(&b, "select coalesce(current_setting('my.var', true), '')").await,
        ""
    );
    assert_eq!(
        q1(
            &b,
            "select count(*) from pg_class where relname = 'tt' and relpersistence = 't'"
        )
        .await,
        "0"
    );
}

/// A custom server_reset_query is what runs.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn session_mode_uses_configured_server_reset_query() {
    let pg = PgServer::start();
    pg.exec("create table resets (n int)");
    let weir = one_server_weir(&pg, "session")
        .set("server_reset_query", "insert into resets values (1)")
        .start();
    let a = connect(weir.port(), "postgres", "postgres").await.unwrap();
    q1(&a, "select 1").await;
    drop(a);
    assert!(
        eventually(TIMEOUT, || pg.psql("select count(*) from resets") == "1"),
        "server_reset_query did not run when the session-mode client left"
    );
}
