//! The wire protocol through Weir (transaction mode unless said otherwise):
//! extended protocol with pipelining and Flush, COPY, large messages, errors
//! inside transactions, clients vanishing mid-transaction.

// Tests run on their own runtime, which has a time driver (clippy.toml is for Weir's
// workers).
#![allow(clippy::disallowed_methods)]

mod common;

use common::proto::{self, data_row, Msg};
use common::*;
use std::time::Duration;

fn tx_weir(pg: &PgServer, pool_size: u32) -> Weir {
    Weir::for_pg(pg)
        .set("pool_mode", "transaction")
        .set("default_pool_size", pool_size)
        .set("query_wait_timeout", 30)
        .start()
}

/// One unnamed Parse/Bind/Execute/Sync round computing `i * 10`.
fn batch(i: usize) -> Vec<u8> {
    let mut b = proto::parse("", "select $1::int * 10");
    b.extend(proto::bind("", "", &[Some(&i.to_string())]));
    b.extend(proto::execute("", 0));
    b.extend(proto::sync());
    b
}

/// Reads the answer to [`batch`]: ParseComplete, BindComplete, DataRow,
/// CommandComplete, ReadyForQuery(I). Returns the value.
fn read_batch(c: &mut RawConn) -> String {
    let msgs = c.read_until_ready();
    let tags: String = msgs.iter().map(Msg::tag_char).collect();
    assert_eq!(
        tags, "12DCZ",
        "unexpected reply to a pipelined batch: {msgs:?}"
    );
    assert_eq!(msgs[4].body, b"I", "ReadyForQuery status");
    data_row(&msgs[2].body)[0].clone().unwrap()
}

/// Many Parse/Bind/Execute/Sync groups written at once, before reading
/// anything; two such clients at the same time on one server. Each gets all
/// its answers, in order.
#[test]
fn pipelined_extended_queries_with_many_syncs() {
    let pg = PgServer::start();
    let weir = tx_weir(&pg, 1);
    let port = weir.port();
    let handles: Vec<_> = (0..2)
        .map(|client| {
            std::thread::spawn(move || {
                let mut c = RawConn::startup(port, "postgres", "postgres", &[]).unwrap();
                for round in 0..5 {
                    let base = client * 100_000 + round * 1000;
                    let mut all = Vec::new();
                    for i in 0..50 {
                        all.extend(batch(base + i));
                    }
                    c.send(&all);
                    for i in 0..50 {
                        assert_eq!(read_batch(&mut c), ((base + i) * 10).to_string());
                    }
                }
            })
        })
        .collect();
    for h in handles {
        h.join().expect("a pipelining client failed");
    }
}

/// Several Parse/Bind/Execute groups closed by a single Sync.
#[test]
fn pipelined_extended_queries_one_sync() {
    let pg = PgServer::start();
    let weir = tx_weir(&pg, 1);
    let mut c = RawConn::startup(weir.port(), "postgres", "postgres", &[]).unwrap();
    let mut all = Vec::new();
    for i in 0..10 {
        all.extend(proto::parse("", "select $1::int + 1"));
        all.extend(proto::bind("", "", &[Some(&i.to_string())]));
        all.extend(proto::execute("", 0));
    }
    all.extend(proto::sync());
    c.send(&all);
    let msgs = c.read_until_ready();
    let values: Vec<String> = msgs
        .iter()
        .filter(|m| m.tag == b'D')
        .map(|m| data_row(&m.body)[0].clone().unwrap())
        .collect();
    let want: Vec<String> = (1..=10).map(|i| i.to_string()).collect();
    assert_eq!(values, want);
}

/// Flush ('H') is forwarded: the results come back without a Sync.
#[test]
fn flush_gets_results_without_sync() {
    let pg = PgServer::start();
    let weir = tx_weir(&pg, 1);
    let mut c = RawConn::startup(weir.port(), "postgres", "postgres", &[]).unwrap();
    let mut m = proto::parse("s1", "select 'flushed'::text");
    m.extend(proto::bind("", "s1", &[]));
    m.extend(proto::describe(b'P', ""));
    m.extend(proto::execute("", 0));
    m.extend(proto::flush());
    c.send(&m);
    let mut tags = String::new();
    let mut value = None;
    while !tags.ends_with('C') {
        let msg = c.read_message_or_panic("the results of a Flush (no Sync sent)");
        if msg.tag == b'D' {
            value = data_row(&msg.body)[0].clone();
        }
        tags.push(msg.tag_char());
    }
    assert_eq!(tags, "12TDC");
    assert_eq!(value.as_deref(), Some("flushed"));
    // The named statement still exists on the same server until Sync.
    let mut m = proto::bind("", "s1", &[]);
    m.extend(proto::execute("", 0));
    m.extend(proto::sync());
    c.send(&m);
    let tags: String = c.read_until_ready().iter().map(Msg::tag_char).collect();
    assert_eq!(tags, "2DCZ");
}

/// An error in the extended protocol skips to Sync; the next group works and
/// the server is back to idle.
#[test]
fn extended_protocol_error_then_next_sync_group_works() {
    let pg = PgServer::start();
    let weir = tx_weir(&pg, 1);
    let mut c = RawConn::startup(weir.port(), "postgres", "postgres", &[]).unwrap();
    let mut m = proto::parse("", "select 1/$1::int");
    m.extend(proto::bind("", "", &[Some("0")]));
    m.extend(proto::execute("", 0));
    m.extend(proto::sync());
    m.extend(batch(7));
    c.send(&m);
    let msgs = c.read_until_ready();
    let err = msgs
        .iter()
        .find(|m| m.tag == b'E')
        .expect("no error for 1/0");
    assert_eq!(proto::parse_error(&err.body).code, "22012");
    assert_eq!(read_batch(&mut c), "70");
    let mut other = RawConn::startup(weir.port(), "postgres", "postgres", &[]).unwrap();
    assert_eq!(other.query_one("select 'ok'"), "ok");
}

/// tokio-postgres' one-round-trip unnamed statements with binary
/// parameters, issued concurrently from many tasks on one connection (the
/// driver pipelines them).
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn tokio_postgres_pipelined_typed_queries() {
    let pg = PgServer::start();
    let weir = tx_weir(&pg, 2);
    let c = std::sync::Arc::new(connect(weir.port(), "postgres", "postgres").await.unwrap());
    let tasks: Vec<_> = (0..50i32)
        .map(|i| {
            let c = c.clone();
            tokio::spawn(async move {
                let rows = c
                    .query_typed(
                        "select $1::int4 * 2",
                        &[(&i, tokio_postgres::types::Type::INT4)],
                    )
                    .await
                    .unwrap_or_else(|e| panic!("query {i}: {e:?}"));
                let v: i32 = rows[0].get(0);
                assert_eq!(v, i * 2);
            })
        })
        .collect();
    join_all_within(tasks, TIMEOUT, "query hung").await;
}

/// COPY FROM STDIN and COPY TO STDOUT through Weir with psql, ~2 MB each way.
#[test]
fn copy_from_stdin_and_to_stdout() {
    let pg = PgServer::start();
    pg.exec("create table t (id int, payload text)");
    let weir = tx_weir(&pg, 2);
    let mut data = String::new();
    for i in 0..50_000 {
        data.push_str(&format!("{i}\tpayload-{i}-abcdefghijklmnopqrstuvwxyz\n"));
    }
    let port = weir.port();
    psql_full(
        "127.0.0.1",
        port,
        "postgres",
        "postgres",
        None,
        "copy t from stdin",
        Some(data.as_bytes()),
    )
    .unwrap_or_else(|e| {
        panic!(
            "COPY FROM STDIN through weir failed: {e}\n{}",
            weir.log_tail()
        )
    });
    assert_eq!(pg.psql("select count(*) from t"), "50000");
    let out = psql_full(
        "127.0.0.1",
        port,
        "postgres",
        "postgres",
        None,
        "copy (select * from t order by id) to stdout",
        None,
    )
    .unwrap_or_else(|e| panic!("COPY TO STDOUT through weir failed: {e}"));
    assert_eq!(out, data.trim_end());
    // The server is idle and usable afterwards.
    assert_eq!(
        psql_via(&weir, "postgres", "postgres", "select count(*) from t").unwrap(),
        "50000"
    );
}

/// A COPY FROM STDIN that fails half-way: the client gets the error, nothing
/// is inserted, and the server is clean for the next client.
#[test]
fn copy_from_stdin_error_leaves_server_clean() {
    let pg = PgServer::start();
    pg.exec("create table t (id int)");
    let weir = tx_weir(&pg, 1);
    let data = "1\n2\nnot-a-number\n4\n";
    let err = psql_full(
        "127.0.0.1",
        weir.port(),
        "postgres",
        "postgres",
        None,
        "copy t from stdin",
        Some(data.as_bytes()),
    )
    .expect_err("COPY with a bad row must fail");
    assert!(err.contains("invalid input syntax"), "psql stderr: {err}");
    assert_eq!(pg.psql("select count(*) from t"), "0");
    let mut c = RawConn::startup(weir.port(), "postgres", "postgres", &[]).unwrap();
    assert_eq!(c.query_one("select count(*) from t"), "0");
    assert_eq!(c.query_one("select 'clean'"), "clean");
}

/// COPY over the raw protocol: CopyData in many small messages, CopyDone.
#[test]
fn copy_in_raw_protocol() {
    let pg = PgServer::start();
    pg.exec("create table t (id int)");
    let weir = tx_weir(&pg, 1);
    let mut c = RawConn::startup(weir.port(), "postgres", "postgres", &[]).unwrap();
    c.send(&proto::query("copy t from stdin"));
    let m = c.read_message_or_panic("CopyInResponse");
    assert_eq!(m.tag_char(), 'G', "expected CopyInResponse");
    let mut all = Vec::new();
    for i in 0..1000 {
        all.extend(proto::msg(b'd', format!("{i}\n").as_bytes()));
    }
    all.extend(proto::msg(b'c', &[]));
    c.send(&all);
    let tags: String = c.read_until_ready().iter().map(Msg::tag_char).collect();
    assert_eq!(tags, "CZ");
    assert_eq!(c.query_one("select sum(id) from t"), "499500");
}

/// A 16 MB single value and many 1 MB rows coming back.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn large_rows_from_server() {
    let pg = PgServer::start();
    let weir = tx_weir(&pg, 1);
    let c = connect(weir.port(), "postgres", "postgres").await.unwrap();
    let rows = q(&c, "select repeat('x', 16 * 1024 * 1024)").await.unwrap();
    assert_eq!(rows[0].as_ref().unwrap().len(), 16 * 1024 * 1024);
    let rows = q(
        &c,
        "select repeat(chr(65 + (i % 26)), 1024 * 1024) from generate_series(1, 20) i",
    )
    .await
    .unwrap();
    assert_eq!(rows.len(), 20);
    for (i, r) in rows.iter().enumerate() {
        let r = r.as_ref().unwrap();
        assert_eq!(r.len(), 1024 * 1024);
        let want = (b'A' + ((i as u8 + 1) % 26)) as char;
        assert!(r.chars().all(|ch| ch == want), "row {i} corrupted");
    }
}

/// Multi-megabyte messages from the client: an 8 MB simple Query and an 8 MB
/// Bind parameter.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn multi_megabyte_client_messages() {
    let pg = PgServer::start();
    let weir = tx_weir(&pg, 1);
    let c = connect(weir.port(), "postgres", "postgres").await.unwrap();
    let big: String = (0..8 * 1024 * 1024)
        .map(|i| (b'a' + (i % 26) as u8) as char)
        .collect();
    let n = q1(&c, &format!("select length('{big}')")).await;
    assert_eq!(n, (8 * 1024 * 1024).to_string());
    let row = c
        .query_typed(
            "select length($1::text), md5($1::text)",
            &[(&big, tokio_postgres::types::Type::TEXT)],
        )
        .await
        .unwrap_or_else(|e| panic!("8 MB bind parameter failed: {e:?}"));
    let len: i32 = row[0].get(0);
    assert_eq!(len, 8 * 1024 * 1024);
    let md5_direct = pg.psql(&format!(
        "select md5(string_agg(chr(97 + (i % 26)), '' order by i)) from generate_series(0, {}) i",
        8 * 1024 * 1024 - 1
    ));
    let md5_via: String = row[0].get(1);
    assert_eq!(md5_via, md5_direct, "the parameter arrived corrupted");
}

/// An error inside a transaction keeps the client in its (failed)
/// transaction on its server: another client waiting for the only server is
/// not given it in that state, and gets it once the client rolls back.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn error_inside_transaction_keeps_server_until_rollback() {
    let pg = PgServer::start();
    let weir = tx_weir(&pg, 1);
    let a = connect(weir.port(), "postgres", "postgres").await.unwrap();
    let b = connect(weir.port(), "postgres", "postgres").await.unwrap();
    q(&a, "begin").await.unwrap();
    let e = q(&a, "select 1/0").await.unwrap_err();
    assert_eq!(expect_db_error(&e).code, "22012");
    // B asks for the server while A's transaction is failed ('E').
    let b_task = tokio::spawn(async move {
        let r = q(&b, "select 'b-ok'").await;
        (b, r)
    });
    tokio::time::sleep(Duration::from_millis(500)).await;
    let e = q(&a, "select 1").await.unwrap_err();
    assert_eq!(
        expect_db_error(&e).code,
        "25P02",
        "A is no longer in its failed transaction"
    );
    q(&a, "rollback").await.unwrap();
    let (_b, r) = tokio::time::timeout(TIMEOUT, b_task)
        .await
        .expect("B never got a server")
        .unwrap();
    match r {
        Ok(rows) => assert_eq!(rows, vec![Some("b-ok".to_string())]),
        Err(e) => panic!("B was given the server in A's failed transaction: {e:?}"),
    }
    assert_eq!(q1(&a, "select 'a-ok'").await, "a-ok");
}

/// A client that disconnects inside a transaction: its work is rolled back
/// and the server is never handed to another client inside that transaction.
#[test]
fn client_disconnect_mid_transaction_rolls_back() {
    let pg = PgServer::start();
    pg.exec("create table t (x int)");
    let weir = tx_weir(&pg, 1);
    let mut a = RawConn::startup(weir.port(), "postgres", "postgres", &[]).unwrap();
    a.simple_query("begin").unwrap();
    a.simple_query("insert into t values (1)").unwrap();
    drop(a); // no Terminate, just gone
    let mut b = RawConn::startup(weir.port(), "postgres", "postgres", &[]).unwrap();
    b.simple_query("insert into t values (2)").unwrap();
    assert_eq!(b.query_one("select string_agg(x::text, ',') from t"), "2");
    drop(b);
    assert_eq!(
        pg.psql("select string_agg(x::text, ',') from t"),
        "2",
        "B's insert is not committed, or A's is"
    );
}

/// Same with a Terminate message sent inside the transaction.
#[test]
fn client_terminate_mid_transaction_rolls_back() {
    let pg = PgServer::start();
    pg.exec("create table t (x int)");
    let weir = tx_weir(&pg, 1);
    let mut a = RawConn::startup(weir.port(), "postgres", "postgres", &[]).unwrap();
    a.simple_query("begin; insert into t values (1)").unwrap();
    a.send(&proto::terminate());
    drop(a);
    let mut b = RawConn::startup(weir.port(), "postgres", "postgres", &[]).unwrap();
    b.simple_query("insert into t values (2)").unwrap();
    assert_eq!(pg.psql("select string_agg(x::text, ',') from t"), "2");
}

/// A client that vanishes half-way through an extended-protocol batch (no
/// Sync sent) does not leave the server in a state the next client sees.
#[test]
fn client_disconnect_mid_extended_batch() {
    let pg = PgServer::start();
    pg.exec("create table t (x int)");
    let weir = tx_weir(&pg, 1);
    let mut a = RawConn::startup(weir.port(), "postgres", "postgres", &[]).unwrap();
    a.simple_query("begin").unwrap();
    let mut m = proto::parse("half", "insert into t values (1)");
    m.extend(proto::bind("", "half", &[]));
    m.extend(proto::execute("", 0));
    a.send(&m);
    std::thread::sleep(Duration::from_millis(200));
    drop(a);
    let mut b = RawConn::startup(weir.port(), "postgres", "postgres", &[]).unwrap();
    b.simple_query("insert into t values (2)").unwrap();
    assert_eq!(
        b.query_one("select count(*) from pg_prepared_statements where name = 'half'"),
        "0"
    );
    assert_eq!(pg.psql("select string_agg(x::text, ',') from t"), "2");
}

/// A client that disconnects while its query runs does not keep the only
/// server busy for it: the next client is served (the server is cancelled or
/// closed), long before the abandoned 10-minute query would end.
#[test]
fn client_disconnect_during_long_query_frees_the_server() {
    let pg = PgServer::start();
    let weir = tx_weir(&pg, 1);
    let mut a = RawConn::startup(weir.port(), "postgres", "postgres", &[]).unwrap();
    a.send(&proto::query("select pg_sleep(600)"));
    std::thread::sleep(Duration::from_millis(300));
    drop(a);
    let mut b = RawConn::startup(weir.port(), "postgres", "postgres", &[]).unwrap();
    assert_eq!(b.query_one("select 'served'"), "served");
}
