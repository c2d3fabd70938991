//! Pipelined transaction pooling (pool::pipeline), cases found in review: each puts two
//! raw clients, A then B, in the queue of a one-server pool while a third holds the
//! server, so that when the server comes to A, B's request goes behind A's.

mod common;

use std::time::Duration;

use common::console::ok;
use common::proto::*;
use common::*;

/// PostgreSQL with the table `rt` (one column, one row), and Weir in transaction mode
/// with one server.
fn table_and_weir() -> (PgServer, Weir) {
    let pg = PgServer::start();
    pg.exec("create table rt (a int); insert into rt values (1)");
    let weir = Weir::for_pg(&pg)
        .set("pool_mode", "transaction")
        .set("default_pool_size", 1)
        .set("admin_users", "postgres")
        .start();
    (pg, weir)
}

fn admin(port: u16) -> RawConn {
    RawConn::startup(port, "postgres", "pgbouncer", &[])
        .unwrap_or_else(|e| panic!("console login failed: {e:?}"))
}

fn pipelined(weir: &Weir) -> i64 {
    ok(&mut admin(weir.port()), "SHOW STATS").num("database", "postgres", "total_pipelined_count")
}

fn waiting(weir: &Weir) -> i64 {
    ok(&mut admin(weir.port()), "SHOW POOLS").num("database", "postgres", "cl_waiting")
}

fn client(weir: &Weir) -> RawConn {
    let c = RawConn::startup(weir.port(), "postgres", "postgres", &[]).unwrap();
    c.set_read_timeout(Duration::from_secs(10));
    c
}

/// Sends `a` from A then `b` from B while a third client holds the one server for half a
/// second, each once the one before has queued; returns the holder, to read its answer.
fn queue_pair(weir: &Weir, a: (&mut RawConn, &[u8]), b: (&mut RawConn, &[u8])) -> RawConn {
    let mut x = client(weir);
    x.send(&query("select pg_sleep(0.5)"));
    std::thread::sleep(Duration::from_millis(100));
    let before = waiting(weir);
    a.0.send(a.1);
    assert!(
        eventually(TIMEOUT, || waiting(weir) == before + 1),
        "A did not queue"
    );
    b.0.send(b.1);
    assert!(
        eventually(TIMEOUT, || waiting(weir) == before + 2),
        "B did not queue"
    );
    x
}

/// A prepared statement gone stale ("cached plan must not change result type") in a
/// request with another client's behind it: the batch may not go again on that server
/// (behind the other's request, whose answer would be taken for its own), and must not
/// hang (the relay reads nothing more of a client with requests behind its own). The
/// server goes to the client behind, and the batch runs again on the client's next one.
#[test]
fn a_stale_statement_runs_again_after_the_request_behind() {
    let (pg, weir) = table_and_weir();
    let mut a = client(&weir);
    let mut b = client(&weir);
    a.send(&[parse("s", "select * from rt"), sync()].concat());
    assert_eq!(replies(&mut a), ["1", "Z"]);
    a.send(&run_prepared("s"));
    assert_eq!(replies(&mut a), ["2", "T 1", r#"D [Some("1")]"#, "C", "Z"]);
    pg.exec("alter table rt add column b int default 7");

    let run = run_prepared("s");
    let b_query = query("select 'b'");
    let mut x = queue_pair(&weir, (&mut a, &run), (&mut b, &b_query));
    replies(&mut x);
    // A's batch runs again on a fresh statement (prepared::retry), after B's request, on
    // A's next server: A never sees the refusal, B gets its own answer.
    assert_eq!(
        replies(&mut a),
        ["2", "T 2", r#"D [Some("1"), Some("7")]"#, "C", "Z"]
    );
    assert_eq!(replies(&mut b), ["T 1", r#"D [Some("b")]"#, "C", "Z"]);
    assert_eq!(pipelined(&weir), 1, "B did not go behind A");
    // Both clients go on.
    a.send(&run_prepared("s"));
    assert_eq!(
        replies(&mut a),
        ["2", "T 2", r#"D [Some("1"), Some("7")]"#, "C", "Z"]
    );
    assert_eq!(b.query_one("select 2"), "2");
}

/// A request that changes a reported parameter from inside a function hidden in a view
/// (which the classifier cannot see: a call in the request's own text keeps anything
/// from going behind it, sql::calls) with another client's behind it: the server reports the change
/// (ParameterStatus) after B's request was written, so B's settings no longer match. B
/// must still get its own answer, not the reply to a SET Weir sends to put its settings
/// back while its request is already on the server.
#[test]
fn a_parameter_changed_by_a_function_does_not_mix_up_the_request_behind() {
    let (pg, weir) = table_and_weir();
    pg.exec(
        "create function tz() returns text language sql \
         as $$ select set_config('TimeZone', 'Pacific/Chatham', false) $$",
    );
    pg.exec("create view zone_setter as select tz() as zone");
    let mut a = client(&weir);
    let mut b = client(&weir);
    let zone = b.query_one("show timezone");
    assert_ne!(zone, "Pacific/Chatham");

    let a_query = query("select zone from zone_setter");
    // Slow enough for its answer not to come with A's (carried over to B with the server).
    let b_query = query("select 'b' from pg_sleep(0.1)");
    let mut x = queue_pair(&weir, (&mut a, &a_query), (&mut b, &b_query));
    replies(&mut x);
    assert_eq!(
        replies(&mut a),
        ["T 1", r#"D [Some("Pacific/Chatham")]"#, "C", "Z"]
    );
    assert_eq!(replies(&mut b), ["T 1", r#"D [Some("b")]"#, "C", "Z"]);
    assert_eq!(pipelined(&weir), 1, "B did not go behind A");
    // Each keeps its own setting from the next request on.
    assert_eq!(b.query_one("show timezone"), zone);
    assert_eq!(a.query_one("show timezone"), "Pacific/Chatham");
    assert_eq!(x.query_one("show timezone"), zone);
}

/// With standard_conforming_strings off, a backslash escapes a quote in a plain literal:
/// `select 'x\' '; begin; --'` is two statements to PostgreSQL, the second a BEGIN, but
/// one to a lexer that reads the literal as standard. Nothing may go behind it: the
/// request behind would run in A's transaction, and A, carrying it, would not be read
/// again (its COMMIT never sent).
#[test]
fn nothing_goes_behind_a_begin_hidden_by_a_backslash() {
    let (pg, weir) = table_and_weir();
    pg.exec("alter database postgres set standard_conforming_strings = off");
    let mut a = client(&weir);
    let mut b = client(&weir);
    assert_eq!(a.query_one("show standard_conforming_strings"), "off");

    let a_query = query(r"select 'x\' '; begin; --'");
    let b_query = query("select 'b'");
    let mut x = queue_pair(&weir, (&mut a, &a_query), (&mut b, &b_query));
    replies(&mut x);
    assert_eq!(
        replies(&mut a),
        ["T 1", r#"D [Some("x' ")]"#, "C", "C", "Z"]
    );
    a.send(&query("commit"));
    assert_eq!(replies(&mut a), ["C", "Z"]);
    assert_eq!(replies(&mut b), ["T 1", r#"D [Some("b")]"#, "C", "Z"]);
    assert_eq!(pipelined(&weir), 0, "B went behind a BEGIN");
}

/// Three clients queued behind a holder: when the server comes to A, B and C both go
/// behind A's request (depth 2). B's client cancels while B waits there: its request
/// cannot be taken back, so the cancel is forwarded once B gets the server, by when
/// PostgreSQL has run B's short request and started C's. The cancel must not reach C.
#[test]
fn a_late_cancel_does_not_reach_the_request_behind() {
    let (_pg, weir) = table_and_weir();
    let mut a = client(&weir);
    let mut b = client(&weir);
    let mut c = client(&weir);
    let (pid, key) = b.key.expect("B's cancel key");
    let mut x = client(&weir);
    x.send(&query("select pg_sleep(0.5)"));
    std::thread::sleep(Duration::from_millis(100));
    let before = waiting(&weir);
    let queued = [
        (&mut a, "select 'a' from pg_sleep(0.5)"),
        (&mut b, "select 'b'"),
        (&mut c, "select 'c' from pg_sleep(1)"),
    ];
    for (n, (conn, sql)) in (before + 1..).zip(queued) {
        conn.send(&query(sql));
        assert!(
            eventually(TIMEOUT, || waiting(&weir) == n),
            "{sql} did not queue"
        );
    }
    assert!(
        eventually(TIMEOUT, || pipelined(&weir) == 2),
        "B and C did not go behind A"
    );
    let mut cancel = RawConn::connect(weir.port());
    cancel.send(&cancel_request(pid, key));
    replies(&mut x);
    assert_eq!(replies(&mut a), ["T 1", r#"D [Some("a")]"#, "C", "Z"]);
    let rb = replies(&mut b);
    assert!(
        rb == ["E 57014", "Z"] || rb == ["T 1", r#"D [Some("b")]"#, "C", "Z"],
        "B: {rb:?}"
    );
    assert_eq!(
        replies(&mut c),
        ["T 1", r#"D [Some("c")]"#, "C", "Z"],
        "B's cancel reached C"
    );
}

/// A client that leaves while its answer is still coming, with another's request behind
/// its own: Weir reads the rest of its answer for nobody and hands the server on, so the
/// client behind gets its own answer (closing the server would fail it with 08006).
#[test]
fn the_request_behind_a_client_that_left_still_gets_its_answer() {
    let (_pg, weir) = table_and_weir();
    let mut a = client(&weir);
    let mut b = client(&weir);
    // About 20 MB: Weir is still relaying it when it finds A gone.
    let a_query = query("select repeat('x', 1000000) from generate_series(1, 20)");
    let b_query = query("select 'b'");
    let mut x = queue_pair(&weir, (&mut a, &a_query), (&mut b, &b_query));
    replies(&mut x);
    assert!(
        eventually(TIMEOUT, || pipelined(&weir) == 1),
        "B did not go behind A"
    );
    drop(a);
    assert_eq!(replies(&mut b), ["T 1", r#"D [Some("b")]"#, "C", "Z"]);
    assert_eq!(b.query_one("select 'b again'"), "b again");
    assert_eq!(x.query_one("select 'x again'"), "x again");
}
