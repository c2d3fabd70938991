//! Pipelined transaction pooling (pool::pipeline): a queued client's request sent to a
//! busy server behind another client's. Each case puts two clients, A then B, in the
//! queue of a one-server pool while a third holds the server, so that when the server
//! comes to A, B's request goes behind A's: what each sees must be what it would see
//! with the server to itself.

// Tests run on their own runtime, which has a time driver (clippy.toml is for Weir's
// workers).
#![allow(clippy::disallowed_methods)]

mod common;

use std::future::Future;
use std::time::Duration;

use common::console::ok;
use common::proto::RawConn;
use common::*;
use tokio_postgres::Client;

fn one_server(pg: &PgServer, depth: Option<u32>) -> Weir {
    let mut b = one_server_config(pg);
    if let Some(d) = depth {
        b = b.set("pipeline_depth", d);
    }
    b.start()
}

fn one_server_config(pg: &PgServer) -> WeirBuilder {
    Weir::for_pg(pg)
        .set("pool_mode", "transaction")
        .set("default_pool_size", 1)
        .set("admin_users", "postgres")
}

fn admin(port: u16) -> RawConn {
    RawConn::startup(port, "postgres", "pgbouncer", &[])
        .unwrap_or_else(|e| panic!("console login failed: {e:?}"))
}

/// Requests of the database `postgres` sent behind another's so far (SHOW STATS).
fn pipelined(weir: &Weir) -> i64 {
    pipelined_at(weir.port())
}

fn pipelined_at(port: u16) -> i64 {
    ok(&mut admin(port), "SHOW STATS").num("database", "postgres", "total_pipelined_count")
}

/// Clients waiting for a server, as SHOW POOLS counts them.
fn waiting(weir: &Weir) -> i64 {
    pools_at(weir.port(), "cl_waiting")
}

/// A column of SHOW POOLS for the database `postgres`.
fn pools_at(port: u16, column: &str) -> i64 {
    ok(&mut admin(port), "SHOW POOLS").num("database", "postgres", column)
}

/// Runs `first(A)` and then `second(B)` queued, in that order, behind a query of a third
/// client that holds the pool's one server for `hold` seconds; returns what each gave.
async fn queued_pair<FA, FB, RA, RB>(
    weir: &Weir,
    hold: f64,
    first: impl FnOnce(Client) -> FA,
    second: impl FnOnce(Client) -> FB,
) -> (RA, RB)
where
    FA: Future<Output = RA> + Send + 'static,
    FB: Future<Output = RB> + Send + 'static,
    RA: Send + 'static,
    RB: Send + 'static,
{
    let a = connect(weir.port(), "postgres", "postgres").await.unwrap();
    let b = connect(weir.port(), "postgres", "postgres").await.unwrap();
    queued_pair_of(weir, hold, (a, first), (b, second)).await
}

/// `queued_pair` with clients already connected.
async fn queued_pair_of<FA, FB, RA, RB>(
    weir: &Weir,
    hold: f64,
    (a, first): (Client, impl FnOnce(Client) -> FA),
    (b, second): (Client, impl FnOnce(Client) -> FB),
) -> (RA, RB)
where
    FA: Future<Output = RA> + Send + 'static,
    FB: Future<Output = RB> + Send + 'static,
    RA: Send + 'static,
    RB: Send + 'static,
{
    let x = connect(weir.port(), "postgres", "postgres").await.unwrap();
    let before = waiting(weir);
    let holder = tokio::spawn(async move {
        q(&x, &format!("select pg_sleep({hold})")).await.unwrap();
        x
    });
    // The holder's query is on the server, and has run for longer than
    // pipeline_slow_query when A queues: A does not go behind it (pool::pipeline).
    assert!(
        eventually(TIMEOUT, || pools_at(weir.port(), "sv_active") == 1),
        "the holder did not get the server"
    );
    tokio::time::sleep(Duration::from_millis(100)).await;
    let a_task = tokio::spawn(first(a));
    assert!(
        eventually(TIMEOUT, || waiting(weir) == before + 1),
        "A did not queue: {} waiting",
        waiting(weir)
    );
    let b_task = tokio::spawn(second(b));
    assert!(
        eventually(TIMEOUT, || waiting(weir) == before + 2),
        "B did not queue: {} waiting",
        waiting(weir)
    );
    let ra = tokio::time::timeout(TIMEOUT, a_task)
        .await
        .expect("A hung")
        .unwrap();
    let rb = tokio::time::timeout(TIMEOUT, b_task)
        .await
        .expect("B hung")
        .unwrap();
    tokio::time::timeout(TIMEOUT, holder)
        .await
        .expect("holder hung")
        .unwrap();
    (ra, rb)
}

fn code(e: &tokio_postgres::Error) -> String {
    expect_db_error(e).code
}

/// An error in the first request does not reach the one behind it, in the simple and in
/// the extended protocol (where PostgreSQL skips, after an error, to the failed batch's
/// Sync, which comes before the second request).
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn an_error_stays_with_its_request() {
    let pg = PgServer::start();
    let weir = one_server(&pg, None);
    let (a, b) = queued_pair(
        &weir,
        0.5,
        |a| async move { (q(&a, "select 1/0").await.map_err(|e| code(&e)), a) },
        |b| async move { (q(&b, "select 'b'").await.unwrap(), b) },
    )
    .await;
    assert_eq!(a.0, Err("22012".to_string()));
    assert_eq!(b.0, vec![Some("b".to_string())]);
    assert_eq!(pipelined(&weir), 1, "B's request did not go behind A's");
    // Both go on, on whatever server.
    assert_eq!(q1(&a.1, "select 'a again'").await, "a again");
    assert_eq!(q1(&b.1, "select 'b again'").await, "b again");

    // Extended protocol: Parse/Bind/Execute/Sync, a parameter each.
    // Prepared first: a Parse of a statement new to the pool waits for a server to be
    // rewritten for, and so never goes ahead of it.
    let before = pipelined(&weir);
    let (a, b) = (a.1, b.1);
    let sa = a.prepare("select 1 / $1::int").await.unwrap();
    let sb = b.prepare("select $1::text || '!'").await.unwrap();
    let (a, b) = queued_pair_of(
        &weir,
        0.5,
        (a, |a: Client| async move {
            a.query(&sa, &[&0i32])
                .await
                .map(|_| ())
                .map_err(|e| code(&e))
        }),
        (b, |b: Client| async move {
            let rows = b.query(&sb, &[&"b"]).await.unwrap();
            rows[0].get::<_, String>(0)
        }),
    )
    .await;
    assert_eq!(a, Err("22012".to_string()));
    assert_eq!(b, "b!");
    assert!(
        pipelined(&weir) > before,
        "no extended request went behind another"
    );
}

/// The first request kills its server (a FATAL): the request behind it never ran, and
/// its client is told the server was lost (08006), keeps its connection, and goes on.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_lost_server_fails_the_request_behind_as_its_own() {
    let pg = PgServer::start();
    pg.exec("create table behind_lost (id int)");
    let weir = one_server(&pg, None);
    let (a, b) = queued_pair(
        &weir,
        0.5,
        |a| async move {
            let r = q(&a, "select pg_terminate_backend(pg_backend_pid())").await;
            (r.map_err(|e| code(&e)), a)
        },
        |b| async move {
            let r = q(&b, "insert into behind_lost values (1)").await;
            (r.map_err(|e| code(&e)), b)
        },
    )
    .await;
    assert_eq!(pipelined(&weir), 1, "B's request did not go behind A's");
    assert_eq!(a.0, Err("57P01".to_string()));
    assert_eq!(b.0, Err("08006".to_string()));
    // Not run behind the lost server's back, and not run again elsewhere.
    assert_eq!(pg.psql("select count(*) from behind_lost").trim(), "0");
    assert_eq!(q1(&b.1, "select 'b again'").await, "b again");
    assert_eq!(q1(&a.1, "select 'a again'").await, "a again");
}

/// A cancel for a client whose request waits behind another's does not cancel the other
/// (it is held until its own request runs, then cancels that).
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_cancel_reaches_only_its_own_request() {
    let pg = PgServer::start();
    let weir = one_server(&pg, None);
    let port = weir.port();
    let (a, b) = queued_pair(
        &weir,
        0.4,
        |a| async move {
            q(&a, "select pg_sleep(1.5), 'a'")
                .await
                .map_err(|e| code(&e))
        },
        move |b| async move {
            let token = b.cancel_token();
            let canceller = tokio::spawn(async move {
                // Once B's request has gone behind A's.
                let aboard = tokio::task::spawn_blocking(move || {
                    eventually(TIMEOUT, || pipelined_at(port) == 1)
                });
                assert!(aboard.await.unwrap());
                // A runs for a second more: B is still aboard, behind it.
                let shown = tokio::task::spawn_blocking(move || {
                    (
                        pools_at(port, "cl_pipelined"),
                        pools_at(port, "pipeline_depth"),
                    )
                });
                assert_eq!(
                    shown.await.unwrap(),
                    (1, 2),
                    "SHOW POOLS cl_pipelined, pipeline_depth"
                );
                token.cancel_query(tokio_postgres::NoTls).await.unwrap();
            });
            let r = q(&b, "select pg_sleep(5), 'b'").await.map_err(|e| code(&e));
            canceller.await.unwrap();
            r
        },
    )
    .await;
    assert!(a.is_ok(), "A's query was cancelled: {a:?}");
    assert_eq!(b, Err("57014".to_string()));
    assert_eq!(pools_at(port, "cl_pipelined"), 0);
}

/// Nothing goes behind a transaction block or a session change, and a depth of 0 turns
/// pipelining off: the clients still get their own answers.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn only_plain_requests_share_a_server() {
    let pg = PgServer::start();
    let weir = one_server(&pg, None);
    for first in [
        "set application_name = 'a'",
        "begin; select 1; commit",
        "select set_config('application_name', 'a', false)",
    ] {
        let (_, b) = queued_pair(
            &weir,
            0.3,
            |a| async move { q(&a, first).await.unwrap() },
            |b| async move { q1(&b, "show application_name").await },
        )
        .await;
        assert_eq!(b, "", "after {first}");
    }
    assert_eq!(pipelined(&weir), 0);

    let off = one_server(&pg, Some(0));
    let (a, b) = queued_pair(
        &off,
        0.3,
        |a| async move { q1(&a, "select 'a'").await },
        |b| async move { q1(&b, "select 'b'").await },
    )
    .await;
    assert_eq!((a.as_str(), b.as_str()), ("a", "b"));
    assert_eq!(pipelined(&off), 0);
    assert_eq!(pools_at(off.port(), "pipeline_depth"), 0);
}

/// A function of the application's that sets a reported parameter (TimeZone here) sets
/// it for the session, and PostgreSQL reports the change just before the request's
/// ReadyForQuery, when a request sent behind it would already be on the server: nothing
/// goes behind a call of a function that is not PostgreSQL's own (sql::calls), so the
/// request behind runs with its own client's TimeZone.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_function_setting_a_reported_parameter_does_not_reach_the_request_behind() {
    let pg = PgServer::start();
    pg.exec(
        "create function leak_timezone() returns text language sql \
         as $$ select set_config('TimeZone', 'Asia/Tokyo', false) $$",
    );
    let weir = one_server(&pg, None);
    let own = q1(
        &connect(weir.port(), "postgres", "postgres").await.unwrap(),
        "show timezone",
    )
    .await;
    assert_ne!(own, "Asia/Tokyo");
    let (a, b) = queued_pair(
        &weir,
        0.3,
        |a| async move { q1(&a, "select leak_timezone()").await },
        |b| async move { q1(&b, "show timezone").await },
    )
    .await;
    assert_eq!(a, "Asia/Tokyo");
    assert_eq!(
        b, own,
        "the request behind ran with another client's TimeZone"
    );
    assert_eq!(pipelined(&weir), 0);
}

/// A one-server pool whose server a client holds with a query of one second, which is
/// not slow there (pipeline_slow_query 10 s): requests may go behind it all along.
async fn holding_one_second(
    pg: &PgServer,
) -> (
    Weir,
    tokio::task::JoinHandle<Result<(), tokio_postgres::Error>>,
) {
    let weir = one_server_config(pg)
        .set("pipeline_slow_query", "10s")
        .start();
    let port = weir.port();
    let x = connect(port, "postgres", "postgres").await.unwrap();
    let holder = tokio::spawn(async move { q(&x, "select pg_sleep(1), 'x'").await.map(|_| ()) });
    assert!(
        eventually(TIMEOUT, || pools_at(port, "sv_active") == 1),
        "the holder did not get the server"
    );
    (weir, holder)
}

/// A client that queues while a request runs goes behind it then, not at the next
/// release: the holder's relay is woken when a client queues (pool::Pool::boarding).
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_client_queueing_while_a_request_runs_goes_behind_it() {
    let pg = PgServer::start();
    let (weir, holder) = holding_one_second(&pg).await;
    let port = weir.port();
    let a = connect(port, "postgres", "postgres").await.unwrap();
    tokio::time::sleep(Duration::from_millis(100)).await;
    let a_task = tokio::spawn(async move { q1(&a, "select 'a'").await });
    // Aboard while the holder's query still has most of its second to run.
    assert!(
        eventually(TIMEOUT, || pools_at(port, "cl_pipelined") == 1),
        "A did not go behind the running request"
    );
    assert_eq!(pipelined(&weir), 1);
    let ra = tokio::time::timeout(TIMEOUT, a_task)
        .await
        .expect("A hung")
        .unwrap();
    assert_eq!(ra, "a");
    assert!(holder.await.unwrap().is_ok());
    assert_eq!(pools_at(port, "cl_pipelined"), 0);
}

/// A cancel that was not the client's (sent for the request in front, reaching
/// PostgreSQL just after that request ended) hits the request pipelined behind it: that
/// request, its own implicit transaction which the cancel rolled back, runs again, and
/// its client never sees the error (issue 24). pg_cancel_backend stands in for the late
/// cancel: PostgreSQL signals the backend alike.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_stray_cancel_runs_the_request_behind_again() {
    let pg = PgServer::start();
    pg.exec("create table stray (id int)");
    // A simple Query, then an extended batch of the unnamed statement (query_typed);
    // then a simple Query with a third client's request behind it, which keeps the
    // server: the cancelled request runs again on its client's next server.
    for (extended, behind) in [(false, false), (true, false), (false, true)] {
        stray_cancel_behind(&pg, extended, behind).await;
    }
    assert_eq!(pg.psql("select count(*) from stray").trim(), "3");
}

async fn stray_cancel_behind(pg: &PgServer, extended: bool, behind: bool) {
    let (weir, holder) = holding_one_second(pg).await;
    let port = weir.port();
    let a = connect(port, "postgres", "postgres").await.unwrap();
    let c = connect(port, "postgres", "postgres").await.unwrap();
    let a_task = tokio::spawn(async move {
        // Long enough for the psql below to start and cancel it on a loaded machine.
        let sql = "insert into stray select 1 from pg_sleep(2)";
        let r = match extended {
            false => q(&a, sql).await.map(|_| ()),
            true => a.query_typed(sql, &[]).await.map(|_| ()),
        };
        r.map_err(|e| code(&e))
    });
    assert!(
        eventually(TIMEOUT, || pools_at(port, "cl_pipelined") == 1),
        "A did not go behind the running request"
    );
    let c_task = tokio::spawn(async move {
        if behind {
            q1(&c, "select 'c'").await
        } else {
            "c".to_string()
        }
    });
    if behind {
        assert!(
            eventually(TIMEOUT, || pools_at(port, "cl_pipelined") == 2),
            "C did not go behind A"
        );
    }
    assert!(holder.await.unwrap().is_ok());
    let running = "query like 'insert into stray%' and state = 'active'";
    assert!(
        eventually(TIMEOUT, || pg.count_backends_where(running) == 1),
        "A's insert never ran"
    );
    let cancelled = || {
        pg.log()
            .matches("canceling statement due to user request")
            .count()
    };
    let before = cancelled();
    pg.exec(&format!(
        "select pg_cancel_backend(pid) from pg_stat_activity where {running}"
    ));
    let ra = tokio::time::timeout(TIMEOUT, a_task)
        .await
        .expect("A hung")
        .unwrap();
    assert!(
        ra.is_ok(),
        "A saw another's cancel (extended: {extended}): {ra:?}"
    );
    assert!(cancelled() > before, "the cancel did not hit A's insert");
    assert_eq!(c_task.await.unwrap(), "c");
}

/// A client whose request is aboard asks to cancel it: nothing goes behind it until the
/// cancel is sent (pool::pipeline::HoldBoarding), else the cancel would be dropped, as it
/// could hit the request behind.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_cancel_aboard_holds_back_the_next_passenger() {
    let pg = PgServer::start();
    let (weir, a_task) = holding_one_second(&pg).await;
    let port = weir.port();
    let b = connect(port, "postgres", "postgres").await.unwrap();
    let c = connect(port, "postgres", "postgres").await.unwrap();
    let token = b.cancel_token();
    let b_task = tokio::spawn(async move {
        q(&b, "select pg_sleep(5), 'b'")
            .await
            .map(|_| ())
            .map_err(|e| code(&e))
    });
    assert!(
        eventually(TIMEOUT, || pools_at(port, "cl_pipelined") == 1),
        "B did not go behind A"
    );
    token.cancel_query(tokio_postgres::NoTls).await.unwrap();
    // C queues once the cancel has reached Weir.
    tokio::time::sleep(Duration::from_millis(100)).await;
    let c_task = tokio::spawn(async move { q1(&c, "select 'c'").await });
    let rb = tokio::time::timeout(TIMEOUT, b_task)
        .await
        .expect("B hung")
        .unwrap();
    assert_eq!(rb, Err("57014".to_string()), "B's cancel was lost");
    let rc = tokio::time::timeout(TIMEOUT, c_task)
        .await
        .expect("C hung")
        .unwrap();
    assert_eq!(rc, "c");
    assert!(a_task.await.unwrap().is_ok(), "A's query was cancelled");
    assert_eq!(pipelined(&weir), 1, "C went behind B");
}

/// What a client's task gave, within the tests' time limit.
async fn joined<T>(task: tokio::task::JoinHandle<T>, who: &str) -> T {
    match tokio::time::timeout(TIMEOUT, task).await {
        Ok(r) => r.unwrap_or_else(|e| panic!("{who} failed: {e}")),
        Err(_) => panic!("{who} hung"),
    }
}

/// A client whose request rides behind another's, with a third client's request behind
/// its own, asks to cancel it. Once its request runs the cancel is sent when the request
/// behind could be run again should the cancel hit it (it ends a moment too soon, say),
/// and is not sent otherwise, the client being told. Either way the one behind gets its
/// answer, and PostgreSQL cancels nothing of it. (Before, the cancel was dropped
/// whenever anything rode behind, though the request it was for had only begun.)
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_cancel_aboard_with_a_request_behind_it() {
    let pg = PgServer::start();
    let weir = one_server_config(&pg)
        .set("pipeline_slow_query", "10s")
        .set("pipeline_depth", 3)
        .start();
    let port = weir.port();
    for behind_prepared in [false, true] {
        let x = connect(port, "postgres", "postgres").await.unwrap();
        let notices = std::sync::Arc::new(std::sync::Mutex::new(Vec::new()));
        let b = connect_noting(port, "postgres", "postgres", notices.clone())
            .await
            .unwrap();
        let c = connect(port, "postgres", "postgres").await.unwrap();
        // Prepared now: a named statement's Bind cannot be run again by Weir.
        let st = c.prepare("select $1::text").await.unwrap();
        let x_task =
            tokio::spawn(async move { q(&x, "select pg_sleep(2), 'x'").await.map(|_| ()) });
        assert!(eventually(TIMEOUT, || pools_at(port, "sv_active") == 1));
        let token = b.cancel_token();
        let b_task = tokio::spawn(async move {
            q(&b, "select pg_sleep(3), 'b'")
                .await
                .map(|_| ())
                .map_err(|e| code(&e))
        });
        assert!(eventually(TIMEOUT, || pools_at(port, "cl_pipelined") == 1));
        let c_task = tokio::spawn(async move {
            match behind_prepared {
                true => c
                    .query(&st, &[&"c"])
                    .await
                    .map(|r| r[0].get::<_, String>(0)),
                false => c.simple_query("select 'c'").await.map(|_| "c".to_string()),
            }
            .map_err(|e| code(&e))
        });
        assert!(
            eventually(TIMEOUT, || pools_at(port, "cl_pipelined") == 2),
            "C did not go behind B"
        );
        let cancels_before = pg.log().matches("canceling statement").count();
        token.cancel_query(tokio_postgres::NoTls).await.unwrap();
        let (rb, rc) = (joined(b_task, "B").await, joined(c_task, "C").await);
        assert!(joined(x_task, "X").await.is_ok(), "X's query was cancelled");
        assert_eq!(
            rc,
            Ok("c".to_string()),
            "behind_prepared: {behind_prepared}"
        );
        let told = notices.lock().unwrap().clone();
        let log = pg.log();
        let cancelled: Vec<&str> = log
            .lines()
            .filter(|l| l.contains("canceling statement"))
            .skip(cancels_before)
            .collect();
        if behind_prepared {
            assert_eq!(rb, Ok(()), "B's query ran whole");
            assert!(
                told.iter()
                    .any(|n| n.starts_with("cancel request not forwarded")),
                "B was not told its cancel was not forwarded: {told:?}"
            );
            assert!(cancelled.is_empty(), "{cancelled:?}");
        } else {
            assert_eq!(rb, Err("57014".to_string()), "B's cancel was lost");
            assert!(told.is_empty(), "{told:?}");
            assert_eq!(cancelled.len(), 1, "{cancelled:?}");
        }
    }
}

/// Nothing goes behind a request like one that ran longer than pipeline_slow_query
/// lately (the same text but for its values): a client queued behind it waits for any
/// server instead of being stuck behind a slow query. Quick runs of its like make it
/// pipelined again.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn nothing_goes_behind_a_query_known_to_be_slow() {
    let pg = PgServer::start();
    let weir = one_server(&pg, None);
    let c = connect(weir.port(), "postgres", "postgres").await.unwrap();
    // Once alone: 200 ms, over the 50 ms default.
    q(&c, "select pg_sleep(0.2), 'slow'").await.unwrap();
    // A runs `first` with B's quick query queued behind it.
    let a_then_b = |first: &'static str| {
        queued_pair(
            &weir,
            0.3,
            move |a| async move { q(&a, first).await.map(|_| ()).map_err(|e| code(&e)) },
            |b| async move { q1(&b, "select 'b'").await },
        )
    };
    let (a, b) = a_then_b("select pg_sleep(0.21), 'slower'").await;
    assert_eq!((a, b.as_str()), (Ok(()), "b"));
    assert_eq!(
        pipelined(&weir),
        0,
        "B went behind a query known to be slow"
    );
    // Two slow runs, then as many quick ones as they weigh (pool::pipeline SLOW_RUN).
    for _ in 0..8 {
        q(&c, "select pg_sleep(0), 'quick'").await.unwrap();
    }
    let (a, b) = a_then_b("select pg_sleep(0.001), 'quick again'").await;
    assert_eq!((a, b.as_str()), (Ok(()), "b"));
    assert_eq!(pipelined(&weir), 1);
}

/// Many clients on few servers, single-statement writes: every write counted once (none
/// lost, none run twice), no failed transaction, and requests did go behind others.
#[test]
fn pgbench_writes_each_once() {
    let pg = PgServer::start();
    let weir = Weir::for_pg(&pg)
        .set("pool_mode", "transaction")
        .set("default_pool_size", 2)
        .set("max_client_conn", 200)
        .set("admin_users", "postgres")
        .start();
    pgbench_direct(&pg, "postgres", "postgres", &["-i", "-s", "1", "-q"]).assert_ok();
    let script = weir.dir().join("update.sql");
    std::fs::write(
        &script,
        "\\set aid random(1, 100000)\nUPDATE pgbench_accounts SET abalance = abalance + 1 WHERE aid = :aid;\n",
    )
    .unwrap();
    let script = script.display().to_string();
    let (clients, per_client) = (24, 100);
    for protocol in ["simple", "extended", "prepared"] {
        let (c, t) = (clients.to_string(), per_client.to_string());
        let args = [
            "-n", "-c", &c, "-j", "2", "-t", &t, "-M", protocol, "-f", &script,
        ];
        pgbench_via(&weir, "postgres", "postgres", &args).assert_clean();
        let args = ["-n", "-c", &c, "-j", "2", "-T", "2", "-M", protocol, "-S"];
        pgbench_via(&weir, "postgres", "postgres", &args).assert_clean();
    }
    let sum = pg.psql("select sum(abalance) from pgbench_accounts");
    assert_eq!(sum.trim(), (3 * clients * per_client).to_string());
    assert!(pipelined(&weir) > 0, "nothing was pipelined");
}
