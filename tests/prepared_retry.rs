//! Issue 11: after DDL changes what a prepared statement returns, PostgreSQL refuses its
//! old plan ("cached plan must not change result type", 0A000). Outside a transaction
//! block, where that refusal is the first reply of a batch that describes what it runs,
//! Weir prepares the statement again and runs the batch again, so the client gets the new
//! rows and their description; anywhere else the client gets the error, as from
//! PostgreSQL directly.

mod common;

use common::proto::*;
use common::*;

/// PostgreSQL with the table `rt` (one column, one row) and Weir in transaction mode
/// with `servers` servers in front of it.
fn table_and_weir(servers: u32) -> (PgServer, Weir) {
    table_and_weir_with(servers, &[])
}

fn table_and_weir_with(servers: u32, settings: &[(&str, &str)]) -> (PgServer, Weir) {
    let pg = PgServer::start();
    pg.exec("create table rt (a int); insert into rt values (1)");
    let mut weir = Weir::for_pg(&pg)
        .set("pool_mode", "transaction")
        .set("default_pool_size", servers);
    for (k, v) in settings {
        weir = weir.set(k, v);
    }
    (pg, weir.start())
}

/// What running "s" returns before the ALTER TABLE, and after it adds b (default 7).
const BEFORE: [&str; 5] = ["2", "T 1", r#"D [Some("1")]"#, "C", "Z"];
const AFTER: [&str; 5] = ["2", "T 2", r#"D [Some("1"), Some("7")]"#, "C", "Z"];
const ADD_B: &str = "alter table rt add column b int default 7";

/// Runs the client's statement "s" as libpq does; what the client sees of it.
fn run_s(c: &mut RawConn) -> Vec<String> {
    c.send(&run_prepared("s"));
    replies(c)
}

fn prepare_raw(c: &mut RawConn, name: &str, sql: &str) {
    c.send(&[parse(name, sql), sync()].concat());
    assert_eq!(replies(c), ["1", "Z"]);
}

/// The batch of a statement prepared before an ALTER TABLE: a direct connection gets
/// 0A000; through Weir it runs again on a fresh statement and the client gets the new
/// columns, described. A batch without the Describe (tokio-postgres's) would get rows
/// that contradict the description the client has: it gets the refusal, as directly.
#[test]
fn batches_run_again_on_a_fresh_statement() {
    let (pg, weir) = table_and_weir(1);
    let mut direct = RawConn::startup(pg.port(), "postgres", "postgres", &[]).unwrap();
    let mut pooled = RawConn::startup(weir.port(), "postgres", "postgres", &[]).unwrap();
    let undescribed = [bind("", "s", &[]), execute("", 0), sync()].concat();
    for c in [&mut direct, &mut pooled] {
        prepare_raw(c, "s", "select * from rt");
        assert_eq!(run_s(c), BEFORE);
    }
    pg.exec(ADD_B);
    assert_eq!(run_s(&mut direct), ["E 0A000", "Z"], "PostgreSQL itself");
    direct.send(&undescribed);
    assert_eq!(replies(&mut direct), ["E 0A000", "Z"], "PostgreSQL itself");
    pooled.send(&undescribed);
    assert_eq!(
        replies(&mut pooled),
        ["E 0A000", "Z"],
        "not described: not run again"
    );
    assert_eq!(run_s(&mut pooled), AFTER);
    pooled.send(&undescribed);
    assert_eq!(
        replies(&mut pooled),
        ["2", r#"D [Some("1"), Some("7")]"#, "C", "Z"]
    );

    pg.exec("alter table rt add column c text default 'x'");
    assert_eq!(
        run_s(&mut pooled),
        [
            "2",
            "T 3",
            r#"D [Some("1"), Some("7"), Some("x")]"#,
            "C",
            "Z"
        ],
        "the statement made fresh goes stale in turn"
    );
    // The client's own Parse of the same text, by another name, gets the fresh statement.
    prepare_raw(&mut pooled, "s2", "select * from rt");
    pooled.send(&[describe(b'S', "s2"), sync()].concat());
    assert_eq!(replies(&mut pooled), ["t", "T 3", "Z"]);
}

/// A Bind that gives a format for each column (pgx does) no longer fits the new
/// columns: the batch sent again fails, and the client gets the refusal, as directly
/// (on which pgx drops its statement), not the error of a retry it never asked for.
#[test]
fn a_retry_that_fails_gives_the_refusal() {
    let (pg, weir) = table_and_weir(1);
    pg.exec("create table rf (a int, b int); insert into rf values (1, 2)");
    let mut direct = RawConn::startup(pg.port(), "postgres", "postgres", &[]).unwrap();
    let mut pooled = RawConn::startup(weir.port(), "postgres", "postgres", &[]).unwrap();
    // Bind: unnamed portal, statement "f", no parameters, two text result formats.
    let per_column = msg(b'B', b"\0f\0\0\0\0\0\0\x02\0\0\0\0");
    let batch = [per_column, describe(b'P', ""), execute("", 0), sync()].concat();
    for c in [&mut direct, &mut pooled] {
        prepare_raw(c, "f", "select * from rf");
        c.send(&batch);
        assert_eq!(
            replies(c),
            ["2", "T 2", r#"D [Some("1"), Some("2")]"#, "C", "Z"]
        );
    }
    pg.exec("alter table rf add column c int");
    for c in [&mut direct, &mut pooled] {
        c.send(&batch);
        assert_eq!(replies(c), ["E 0A000", "Z"]);
    }
    // And again: the client's name is still the stale statement's.
    for c in [&mut direct, &mut pooled] {
        c.send(&batch);
        assert_eq!(replies(c), ["E 0A000", "Z"]);
    }
}

/// In statement mode, and with a cache of one statement per server (the fresh statement
/// takes the stale one's place, closed first), the same.
#[test]
fn statement_mode_and_a_cache_of_one() {
    let settings = [("pool_mode", "statement"), ("max_prepared_statements", "1")];
    let (pg, weir) = table_and_weir_with(1, &settings);
    let mut c = RawConn::startup(weir.port(), "postgres", "postgres", &[]).unwrap();
    prepare_raw(&mut c, "s", "select * from rt");
    assert_eq!(run_s(&mut c), BEFORE);
    pg.exec(ADD_B);
    assert_eq!(run_s(&mut c), AFTER);
    assert_eq!(run_s(&mut c), AFTER);
    let held = c.query_one("select count(*) from pg_prepared_statements");
    assert_eq!(held, "1", "the stale statement was closed");
}

/// In a transaction block the refusal aborts the transaction: it reaches the client as
/// it would directly, and the statement runs again after the block.
#[test]
fn in_a_transaction_block_the_refusal_goes_through() {
    let (pg, weir) = table_and_weir(1);
    let mut direct = RawConn::startup(pg.port(), "postgres", "postgres", &[]).unwrap();
    let mut pooled = RawConn::startup(weir.port(), "postgres", "postgres", &[]).unwrap();
    for c in [&mut direct, &mut pooled] {
        prepare_raw(c, "s", "select * from rt");
        assert_eq!(run_s(c), BEFORE);
    }
    pg.exec(ADD_B);
    let mut seen = Vec::new();
    for c in [&mut direct, &mut pooled] {
        c.simple_query("begin").unwrap();
        let mut got = run_s(c);
        c.send(&query("rollback"));
        got.extend(replies(c));
        seen.push(got);
    }
    assert_eq!(seen[0], ["E 0A000", "Z", "C", "Z"], "PostgreSQL itself");
    assert_eq!(seen[1], seen[0]);
    assert_eq!(run_s(&mut pooled), AFTER);
}

/// A batch that began in the same write as a BEGIN runs inside the block: not again.
/// Nor one whose refusal comes after replies the client already got.
#[test]
fn batches_with_replies_before_the_refusal_are_not_run_again() {
    let (pg, weir) = table_and_weir(1);
    let mut c = RawConn::startup(weir.port(), "postgres", "postgres", &[]).unwrap();
    prepare_raw(&mut c, "s", "select * from rt");
    prepare_raw(&mut c, "one", "select 1");
    assert_eq!(run_s(&mut c), BEFORE);
    pg.exec(ADD_B);
    c.send(&[query("begin"), run_prepared("s")].concat());
    assert_eq!(replies(&mut c), ["C", "Z"]);
    assert_eq!(replies(&mut c), ["E 0A000", "Z"]);
    c.send(&query("rollback"));
    assert_eq!(replies(&mut c), ["C", "Z"]);
    // The refusal comes after "one"'s rows, in the same implicit transaction.
    c.send(
        &[
            bind("", "one", &[]),
            execute("", 0),
            bind("", "s", &[]),
            describe(b'P', ""),
            execute("", 0),
            sync(),
        ]
        .concat(),
    );
    assert_eq!(
        replies(&mut c),
        ["2", r#"D [Some("1")]"#, "C", "E 0A000", "Z"]
    );
    assert_eq!(run_s(&mut c), AFTER);
}

/// Eight clients on two servers, the statement prepared before the ALTER on both: each
/// client's batch runs again on whichever server it gets, until both servers hold the
/// fresh statement besides the stale one.
#[test]
fn clients_on_two_servers() {
    let (pg, weir) = table_and_weir(2);
    let sql = "select * from rt";
    let connect = || RawConn::startup(weir.port(), "postgres", "postgres", &[]).unwrap();
    let mut clients: Vec<RawConn> = (0..8).map(|_| connect()).collect();
    for c in &mut clients {
        prepare_raw(c, "s", sql);
    }
    // Both servers prepare it: two clients run it in a transaction each, at once.
    let (mut h0, mut h1) = (connect(), connect());
    for h in [&mut h0, &mut h1] {
        prepare_raw(h, "s", sql);
        h.simple_query("begin").unwrap();
        assert_eq!(run_s(h), BEFORE);
    }
    for h in [&mut h0, &mut h1] {
        h.simple_query("commit").unwrap();
    }
    pg.exec(ADD_B);
    let count = format!("select count(*) from pg_prepared_statements where statement = '{sql}'");
    let mut covered = false;
    for c in &mut clients {
        // h0 holds one server in a transaction: c runs on the other. The servers take
        // turns (the idle one lent first is the one idle longest).
        h0.simple_query("begin").unwrap();
        assert_eq!(run_s(c), AFTER);
        h0.simple_query("rollback").unwrap();
        h0.simple_query("begin").unwrap();
        h1.simple_query("begin").unwrap();
        let held = [h0.query_one(&count), h1.query_one(&count)];
        h0.simple_query("rollback").unwrap();
        h1.simple_query("rollback").unwrap();
        if held == ["2", "2"] {
            covered = true;
            break;
        }
    }
    assert!(
        covered,
        "the statement was never made fresh on both servers"
    );
    for c in &mut clients {
        assert_eq!(run_s(c), AFTER);
    }
}

/// tokio-postgres runs a prepared statement with Bind, Execute, Sync: rows of the new
/// shape would contradict the description it has (it refuses them, "DataRow field count
/// does not match"), so it gets the refusal as directly, in a transaction or not; the
/// statement it prepares again is fresh.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn tokio_postgres_gets_the_refusal_as_directly() {
    let (pg, weir) = table_and_weir(2);
    let sql = "select * from rt";
    let mut direct = connect(pg.port(), "postgres", "postgres").await.unwrap();
    let mut pooled = connect(weir.port(), "postgres", "postgres").await.unwrap();
    let (ds, ps) = (
        direct.prepare(sql).await.unwrap(),
        pooled.prepare(sql).await.unwrap(),
    );
    assert_eq!(pooled.query(&ps, &[]).await.unwrap().len(), 1);
    pg.exec(ADD_B);
    for (c, s) in [(&mut direct, &ds), (&mut pooled, &ps)] {
        let e = c.query(s, &[]).await.unwrap_err();
        assert_eq!(expect_db_error(&e).code, "0A000");
        let tx = c.transaction().await.unwrap();
        let e = tx.query(s, &[]).await.unwrap_err();
        assert_eq!(expect_db_error(&e).code, "0A000");
        tx.rollback().await.unwrap();
        let fresh = c.prepare(sql).await.unwrap();
        let row = c.query_one(&fresh, &[]).await.unwrap();
        assert_eq!((row.get::<_, i32>(0), row.get::<_, i32>(1)), (1, 7));
    }
}

/// Preparing after the ALTER a text the server holds from before (another client still
/// has it): Weir answers the Parse itself, PostgreSQL describes the stale statement's
/// parameters and then refuses it. The client gets what a direct connection gives, the
/// description of a fresh statement, once.
#[test]
fn preparing_a_text_held_stale_describes_a_fresh_statement() {
    let (pg, weir) = table_and_weir(1);
    let mut holder = RawConn::startup(weir.port(), "postgres", "postgres", &[]).unwrap();
    prepare_raw(&mut holder, "s", "select * from rt where a = $1");
    holder.send(&[bind("", "s", &[Some("1")]), execute("", 0), sync()].concat());
    assert_eq!(replies(&mut holder), ["2", r#"D [Some("1")]"#, "C", "Z"]);
    pg.exec(ADD_B);
    let mut direct = RawConn::startup(pg.port(), "postgres", "postgres", &[]).unwrap();
    let mut pooled = RawConn::startup(weir.port(), "postgres", "postgres", &[]).unwrap();
    let prepare = [
        parse("s0", "select * from rt where a = $1"),
        describe(b'S', "s0"),
        sync(),
    ]
    .concat();
    for c in [&mut direct, &mut pooled] {
        c.send(&prepare);
        assert_eq!(replies(c), ["1", "t", "T 2", "Z"]);
    }
    // In a transaction block the refusal comes through (a known limit: a direct
    // connection would describe a fresh statement), but the statement the client just
    // prepared is a fresh one from then on.
    prepare_raw(&mut holder, "s2", "select * from rt");
    pg.exec("alter table rt add column c int default 8");
    pooled.simple_query("begin").unwrap();
    pooled.send(
        &[
            parse("s1", "select * from rt"),
            describe(b'S', "s1"),
            sync(),
        ]
        .concat(),
    );
    assert_eq!(replies(&mut pooled), ["1", "t", "E 0A000", "Z"]);
    pooled.simple_query("rollback").unwrap();
    pooled.send(&[describe(b'S', "s1"), sync()].concat());
    assert_eq!(replies(&mut pooled), ["t", "T 3", "Z"]);
}

/// The same with a ParameterDescription too large for the relay to hold back (4,200
/// parameters): it reaches the client, and then so does the refusal (a known limit; a
/// direct connection would describe a fresh statement).
#[test]
fn a_description_too_large_to_hold_lets_the_refusal_through() {
    let (pg, weir) = table_and_weir(1);
    let params: Vec<String> = (1..=4200).map(|i| format!("${i}::int")).collect();
    let sql = format!("select * from rt where a in ({})", params.join(","));
    let mut holder = RawConn::startup(weir.port(), "postgres", "postgres", &[]).unwrap();
    prepare_raw(&mut holder, "s", &sql);
    pg.exec(ADD_B);
    let mut pooled = RawConn::startup(weir.port(), "postgres", "postgres", &[]).unwrap();
    pooled.send(&[parse("s0", &sql), describe(b'S', "s0"), sync()].concat());
    assert_eq!(replies(&mut pooled), ["1", "t", "E 0A000", "Z"]);
    pooled.send(&[describe(b'S', "s0"), sync()].concat());
    assert_eq!(
        replies(&mut pooled),
        ["t", "T 2", "Z"],
        "fresh once refused"
    );
}

/// A statement prepared after the ALTER, of a text some server holds prepared from
/// before: Weir answers the Parse itself and PostgreSQL refuses the stale plan at the
/// Describe, where a direct connection would have made a fresh statement. The Describe
/// goes again on a fresh one: tokio-postgres prepares and runs the text as directly, with
/// the new columns, on either of two servers, and never sees the refusal.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn tokio_postgres_prepares_after_ddl_as_directly() {
    let (pg, weir) = table_and_weir(2);
    let sql = "select * from rt";
    let mut holders = Vec::new();
    for _ in 0..2 {
        let c = connect(weir.port(), "postgres", "postgres").await.unwrap();
        let s = c.prepare(sql).await.unwrap();
        holders.push((c, s));
    }
    // Both servers prepare it: each holder runs it in a transaction, at once.
    let mut txs = Vec::new();
    for (c, s) in &mut holders {
        let tx = c.transaction().await.unwrap();
        assert_eq!(tx.query(&*s, &[]).await.unwrap().len(), 1);
        txs.push(tx);
    }
    for tx in txs {
        tx.commit().await.unwrap();
    }
    pg.exec(ADD_B);
    let client = connect(weir.port(), "postgres", "postgres").await.unwrap();
    for _ in 0..4 {
        let rows = client.query(sql, &[]).await.unwrap();
        assert_eq!(rows[0].columns().len(), 2);
        assert_eq!((rows[0].get::<_, i32>(0), rows[0].get::<_, i32>(1)), (1, 7));
    }
    pg.exec("alter table rt add column c int default 8");
    let s = client.prepare(sql).await.unwrap();
    assert_eq!(s.columns().len(), 3);
}

/// pgbench -M prepared, more clients than servers, while another connection keeps adding
/// columns to the table its script selects everything from: no transaction fails.
#[test]
fn pgbench_prepared_through_repeated_ddl() {
    let (pg, weir) = table_and_weir(2);
    let dir = tempfile::tempdir().unwrap();
    let script = dir.path().join("select_all.sql");
    std::fs::write(&script, "select * from rt;\n").unwrap();
    let script = script.to_str().unwrap().to_string();
    let port = weir.port();
    let bench = std::thread::spawn(move || {
        let args = [
            "-n", "-c", "6", "-j", "2", "-T", "4", "-M", "prepared", "-f", &script,
        ];
        let port = port.to_string();
        let mut all = vec!["-h", "127.0.0.1", "-p", &port, "-U", "postgres"];
        all.extend_from_slice(&args);
        all.push("postgres");
        pgbench(&all)
    });
    for i in 0..5 {
        std::thread::sleep(std::time::Duration::from_millis(500));
        pg.exec(&format!("alter table rt add column c{i} int"));
    }
    let result = bench.join().unwrap();
    result.assert_clean();
}

/// psycopg 3 with autocommit (tests/drivers/python/ddl_retry.py): its prepared
/// statement sees the new columns after each ALTER; in a transaction block it gets
/// the refusal. Needs the drivers scripts/install-drivers installs (as the driver
/// matrix does).
#[test]
fn psycopg_prepared_statement_after_ddl() {
    let (pg, weir) = table_and_weir(2);
    let dir = match std::env::var_os("WEIR_DRIVERS_DIR") {
        Some(d) => std::path::PathBuf::from(d),
        None => {
            std::path::PathBuf::from(std::env::var("HOME").unwrap()).join(".cache/weir-drivers")
        }
    };
    let mut cmd = clean_command(dir.join("venv/bin/python"));
    cmd.arg(concat!(
        env!("CARGO_MANIFEST_DIR"),
        "/tests/drivers/python/ddl_retry.py"
    ))
    .env("WEIR_URL", weir.url("postgres", "postgres"))
    .env(
        "PG_URL",
        format!("postgresql://postgres@127.0.0.1:{}/postgres", pg.port()),
    );
    let out = run_with_timeout(&mut cmd, None, std::time::Duration::from_secs(60));
    assert!(
        out.status.success(),
        "{}\n{}\nweir log:\n{}",
        String::from_utf8_lossy(&out.stdout),
        String::from_utf8_lossy(&out.stderr),
        weir.log_tail()
    );
}
