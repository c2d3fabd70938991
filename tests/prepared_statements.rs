//! Named prepared statements in transaction and statement pooling mode: every client
//! message sequence gets exactly the replies a direct connection gives, whichever server
//! the client is lent and whatever that server already holds.

mod common;

use common::proto::*;
use common::*;

fn close(kind: u8, name: &str) -> Vec<u8> {
    let mut b = vec![kind];
    b.extend_from_slice(name.as_bytes());
    b.push(0);
    msg(b'C', &b)
}

/// A Parse with declared parameter types.
fn parse_typed(name: &str, sql: &str, types: &[u32]) -> Vec<u8> {
    let mut b = Vec::new();
    b.extend_from_slice(name.as_bytes());
    b.push(0);
    b.extend_from_slice(sql.as_bytes());
    b.push(0);
    b.extend_from_slice(&(types.len() as u16).to_be_bytes());
    for t in types {
        b.extend_from_slice(&t.to_be_bytes());
    }
    msg(b'P', &b)
}

/// What a client sees of a reply, in a form two connections can be compared by: errors
/// by SQLSTATE and message (not the server's source position), rows by their values.
fn describe_reply(m: &Msg) -> String {
    match m.tag {
        b'E' => {
            let e = parse_error(&m.body);
            format!("E {} {}", e.code, e.message)
        }
        b'D' => format!("D {:?}", data_row(&m.body)),
        b'C' | b'Z' => format!("{} {}", m.tag_char(), String::from_utf8_lossy(&m.body)),
        b'N' | b'S' => String::new(),
        _ => format!("{} {:?}", m.tag_char(), m.body),
    }
}

/// Sends each step (a batch of messages) and reads its replies up to as many
/// ReadyForQuery as it holds Syncs and Queries (or, for a batch ending in Flush, the
/// given number of messages).
fn run(conn: &mut RawConn, steps: &[Step]) -> Vec<String> {
    let mut seen = Vec::new();
    for step in steps {
        let bytes: Vec<u8> = step.msgs.concat();
        conn.send(&bytes);
        let mut readies = step
            .msgs
            .iter()
            .filter(|m| matches!(m[0], b'S' | b'Q'))
            .count();
        let mut left = step.replies;
        while readies > 0 || left > 0 {
            let m = conn.read_message_or_panic("a reply");
            if m.tag == b'Z' {
                readies = readies.saturating_sub(1);
            }
            left = left.saturating_sub(1);
            let d = describe_reply(&m);
            if !d.is_empty() {
                seen.push(d);
            }
        }
    }
    seen
}

/// The script in a line a reader can follow: tag and the start of each body.
fn describe_script(steps: &[Step]) -> String {
    let mut out = String::new();
    for s in steps {
        out.push_str("\n  ");
        for m in &s.msgs {
            let body = String::from_utf8_lossy(&m[5..m.len().min(40)]).replace('\0', "/");
            out.push_str(&format!("{}({}) ", m[0] as char, body));
        }
    }
    out
}

struct Step {
    msgs: Vec<Vec<u8>>,
    /// For a batch without Sync: how many replies to wait for.
    replies: usize,
}

fn step(msgs: Vec<Vec<u8>>) -> Step {
    Step { msgs, replies: 0 }
}

fn flushed(msgs: Vec<Vec<u8>>, replies: usize) -> Step {
    Step { msgs, replies }
}

/// The rows a client gets up to its next ReadyForQuery.
fn rows_until_ready(c: &mut RawConn) -> Vec<Vec<Option<String>>> {
    c.read_until_ready()
        .into_iter()
        .filter(|m| m.tag == b'D')
        .map(|m| data_row(&m.body))
        .collect()
}

/// Weir in transaction mode with one server and a cache of `cap` statements on it.
fn one_server(pg: &PgServer, cap: u32) -> Weir {
    Weir::for_pg(pg)
        .set("pool_mode", "transaction")
        .set("default_pool_size", 1)
        .set("max_prepared_statements", cap)
        .start()
}

/// Runs `script` directly against PostgreSQL, then through Weir (transaction mode, one
/// server) on two clients in turn, so that the second finds the statements already on
/// the server, and on a third with a cache of one statement per server; each must see
/// what the direct connection saw.
fn same_as_direct(script: impl Fn() -> Vec<Step>) {
    let pg = PgServer::start();
    same_as_direct_on(&pg, "", script);
}

fn same_as_direct_on(pg: &PgServer, what: &str, script: impl Fn() -> Vec<Step>) {
    pg.exec("create table if not exists t (id int primary key, v text)");
    let mut direct = RawConn::startup(pg.port(), "postgres", "postgres", &[]).unwrap();
    let want = run(&mut direct, &script());
    for cap in [200, 1] {
        let weir = one_server(pg, cap);
        for round in 0..2 {
            let mut c = RawConn::startup(weir.port(), "postgres", "postgres", &[]).unwrap();
            let got = run(&mut c, &script());
            if got != want {
                let at = got.iter().zip(&want).take_while(|(g, w)| g == w).count();
                panic!(
                    "{what} max_prepared_statements={cap}, client {round}: replies differ from a \
                     direct connection at reply {at}: {:?} instead of {:?}\nscript: {}\ngot:  {got:?}\nwant: {want:?}",
                    got.get(at),
                    want.get(at),
                    describe_script(&script())
                );
            }
        }
    }
}

#[test]
fn parse_bind_execute_describe_close() {
    same_as_direct(|| {
        vec![
            step(vec![
                parse("s1", "select $1::int + 1 as n"),
                describe(b'S', "s1"),
                sync(),
            ]),
            step(vec![
                bind("", "s1", &[Some("41")]),
                describe(b'P', ""),
                execute("", 0),
                sync(),
            ]),
            step(vec![query("select 'between transactions'")]),
            step(vec![bind("p", "s1", &[Some("1")]), execute("p", 0), sync()]),
            step(vec![close(b'S', "s1"), sync()]),
            step(vec![bind("", "s1", &[Some("1")]), execute("", 0), sync()]),
        ]
    });
}

#[test]
fn unnamed_statements_and_typed_parameters() {
    same_as_direct(|| {
        vec![
            step(vec![
                parse("", "select $1 as x"),
                bind("", "", &[Some("a")]),
                execute("", 0),
                parse_typed("typed", "select $1 as x", &[23]),
                bind("", "typed", &[Some("7")]),
                execute("", 0),
                sync(),
            ]),
            // Same text, other types: another statement.
            step(vec![
                parse_typed("untyped", "select $1 as x", &[]),
                describe(b'S', "untyped"),
                describe(b'S', "typed"),
                sync(),
            ]),
        ]
    });
}

#[test]
fn flush_without_sync() {
    same_as_direct(|| {
        vec![
            flushed(vec![parse("f1", "select 1 as one"), flush()], 1),
            flushed(vec![describe(b'S', "f1"), flush()], 2),
            flushed(vec![bind("", "f1", &[]), execute("", 0), flush()], 3),
            flushed(vec![close(b'S', "f1"), flush()], 1),
            step(vec![sync()]),
        ]
    });
}

#[test]
fn errors_in_a_pipeline_skip_to_sync() {
    same_as_direct(|| {
        vec![
            step(vec![
                parse("good", "select 1"),
                parse("bad", "select from from"),
                bind("", "good", &[]),
                execute("", 0),
                sync(),
                // After the Sync the server listens again; "bad" never existed.
                bind("", "good", &[]),
                execute("", 0),
                sync(),
                bind("", "bad", &[]),
                sync(),
            ]),
            // An error before a Parse: the Parse is skipped, the name stays free.
            step(vec![
                bind("", "nope", &[]),
                parse("later", "select 2"),
                close(b'S', "good"),
                sync(),
                parse("later", "select 2"),
                bind("", "later", &[]),
                execute("", 0),
                bind("", "good", &[]),
                execute("", 0),
                sync(),
            ]),
        ]
    });
}

#[test]
fn duplicate_names_missing_names_and_weirs_own_names() {
    same_as_direct(|| {
        vec![
            step(vec![parse("d", "select 1"), sync()]),
            step(vec![parse("d", "select 1"), sync()]),
            step(vec![
                parse("d", "select 2"),
                bind("", "d", &[]),
                execute("", 0),
                sync(),
            ]),
            step(vec![bind("", "weir_1", &[]), execute("", 0), sync()]),
            step(vec![describe(b'S', "weir_2"), sync()]),
            step(vec![close(b'S', "never"), close(b'P', "never"), sync()]),
        ]
    });
}

#[test]
fn failed_transactions_and_resets() {
    same_as_direct(|| {
        vec![
            step(vec![parse("a", "select 'a'"), sync()]),
            step(vec![query("begin"), query("select 1/0")]),
            // In a failed transaction a Parse fails, even of a text the server has.
            step(vec![parse("b", "select 'a'"), sync()]),
            step(vec![query("rollback")]),
            step(vec![bind("", "b", &[]), sync()]),
            step(vec![query("begin")]),
            step(vec![query("discard all")]),
            step(vec![query("rollback")]),
            step(vec![bind("", "a", &[]), execute("", 0), sync()]),
            step(vec![query("DEALLOCATE ALL")]),
            step(vec![bind("", "a", &[]), execute("", 0), sync()]),
            step(vec![
                parse("a", "select 'again'"),
                bind("", "a", &[]),
                execute("", 0),
                sync(),
            ]),
        ]
    });
}

#[test]
fn more_statements_than_the_cache_holds() {
    same_as_direct(|| {
        let mut steps = Vec::new();
        for i in 0..5 {
            steps.push(step(vec![
                parse(&format!("s{i}"), &format!("select {i}")),
                sync(),
            ]));
        }
        for round in 0..2 {
            let mut batch = Vec::new();
            for i in (0..5).rev() {
                batch.push(bind("", &format!("s{i}"), &[]));
                batch.push(execute("", 0));
            }
            batch.push(sync());
            steps.push(step(batch));
            steps.push(step(vec![query(&format!("select 'round {round}'"))]));
        }
        steps
    });
}

/// pgbench's prepared mode, many clients on few servers, each server preparing each
/// statement once.
fn pgbench_prepared(mode: &str, connect_per_tx: bool) {
    let pg = PgServer::start();
    let http = free_port();
    let weir = Weir::for_pg(&pg)
        .set("http_listen", format!("127.0.0.1:{http}"))
        .set("pool_mode", mode)
        .set("default_pool_size", 4)
        .set("max_client_conn", 200)
        .set("admin_users", "postgres")
        .start();
    pgbench_direct(&pg, "postgres", "postgres", &["-i", "-s", "1", "-q"]).assert_ok();
    let mut args = vec!["-n", "-c", "20", "-j", "2", "-T", "3", "-M", "prepared"];
    if mode == "statement" {
        args.push("-S");
    }
    if connect_per_tx {
        args.push("-C");
    }
    pgbench_via(&weir, "postgres", "postgres", &args).assert_clean();
    let stats = psql_via(&weir, "pgbouncer", "postgres", "show stats").unwrap();
    let row = stats
        .lines()
        .find(|l| l.starts_with("postgres|"))
        .unwrap_or_else(|| panic!("no stats for postgres in {stats}"));
    let cols: Vec<u64> = row
        .split('|')
        .skip(1)
        .map(|c| c.parse().unwrap_or(0))
        .collect();
    let (xacts, client_parses, server_parses, binds) = (cols[1], cols[8], cols[9], cols[10]);
    assert!(xacts > 0, "{row}");
    // pgbench's own setup queries are the few transactions that bind nothing.
    assert!(binds >= xacts - 10, "every transaction binds: {row}");
    assert!(client_parses > 0, "{row}");
    // Each of at most 4 servers prepares each of pgbench's statements (7 at most) once.
    assert!(server_parses <= 4 * 7, "servers re-prepared: {row}");
    let metrics = common::http::http_get(http, "/metrics").unwrap().body;
    let pool_metric = |name: &str| -> f64 {
        metrics
            .lines()
            .find(|l| l.starts_with(&format!("{name}{{")) && l.contains("database=\"postgres\""))
            .and_then(|l| l.rsplit(' ').next()?.parse().ok())
            .unwrap_or_else(|| panic!("no {name} in {metrics}"))
    };
    let binds_metric = pool_metric("weir_pool_binds_total");
    assert!(pool_metric("weir_pool_prepared_cache_hits_total") > 0.0);
    assert!(binds_metric >= binds as f64, "{binds_metric} < {binds}");
}

#[test]
fn pgbench_prepared_transaction_mode() {
    pgbench_prepared("transaction", false);
}

#[test]
fn pgbench_prepared_transaction_mode_connect_per_transaction() {
    pgbench_prepared("transaction", true);
}

#[test]
fn pgbench_prepared_statement_mode() {
    pgbench_prepared("statement", false);
}

/// tokio-postgres names every statement it prepares (s0, s1, ... per connection, so
/// clients collide by name) and closes the ones it drops: ten clients on two servers.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn tokio_postgres_clients_share_two_servers() {
    let pg = PgServer::start();
    let weir = Weir::for_pg(&pg)
        .set("pool_mode", "transaction")
        .set("default_pool_size", 2)
        .start();
    let mut tasks = Vec::new();
    for i in 0..10i32 {
        let port = weir.port();
        tasks.push(tokio::spawn(async move {
            let mut c = connect(port, "postgres", "postgres").await.unwrap();
            // Same names (s0, s1) in every client, different texts.
            let add = c
                .prepare(&format!("select $1::int + {i} as n"))
                .await
                .unwrap();
            let me = c
                .prepare(&format!("select 'client {i}' as who"))
                .await
                .unwrap();
            for round in 0..20i32 {
                let n: i32 = c.query_one(&add, &[&round]).await.unwrap().get(0);
                assert_eq!(n, round + i);
                let who: String = c.query_one(&me, &[]).await.unwrap().get(0);
                assert_eq!(who, format!("client {i}"));
                // A one-off statement: prepared, run and closed each time.
                let s: String = c
                    .query_one("select $1::text || '!'", &[&format!("{i}/{round}")])
                    .await
                    .unwrap()
                    .get(0);
                assert_eq!(s, format!("{i}/{round}!"));
                let tx = c.transaction().await.unwrap();
                let n: i32 = tx.query_one(&add, &[&1]).await.unwrap().get(0);
                assert_eq!(n, 1 + i);
                if round % 5 == 0 {
                    let e = tx.query_one("select 1/0", &[]).await.unwrap_err();
                    assert_eq!(expect_db_error(&e).code, "22012");
                    tx.rollback().await.unwrap();
                } else {
                    tx.commit().await.unwrap();
                }
            }
        }));
    }
    for t in tasks {
        t.await.unwrap();
    }
}

/// Two clients on one server: neither can use the other's statement by its name, and
/// each keeps its own after the other has run.
#[test]
fn clients_never_see_each_others_statements() {
    let pg = PgServer::start();
    let weir = Weir::for_pg(&pg)
        .set("pool_mode", "transaction")
        .set("default_pool_size", 1)
        .start();
    let mut a = RawConn::startup(weir.port(), "postgres", "postgres", &[]).unwrap();
    let mut b = RawConn::startup(weir.port(), "postgres", "postgres", &[]).unwrap();
    a.send(&[parse("mine", "select 'a'"), sync()].concat());
    a.read_until_ready();
    b.send(&[bind("", "mine", &[]), execute("", 0), sync()].concat());
    assert_eq!(b.expect_error().code, "26000");
    b.read_until_ready();
    b.send(
        &[
            parse("mine", "select 'b'"),
            bind("", "mine", &[]),
            execute("", 0),
            sync(),
        ]
        .concat(),
    );
    let rows = rows_until_ready(&mut b);
    assert_eq!(rows, vec![vec![Some("b".to_string())]]);
    a.send(&[bind("", "mine", &[]), execute("", 0), sync()].concat());
    let rows = rows_until_ready(&mut a);
    assert_eq!(rows, vec![vec![Some("a".to_string())]]);
}

/// Rails deallocates the statements its cache evicts with SQL `DEALLOCATE name`.
#[test]
fn sql_deallocate_of_protocol_statements() {
    same_as_direct(|| {
        vec![
            step(vec![
                parse("a1", "select 1"),
                parse("A2", "select 2"),
                sync(),
            ]),
            step(vec![query("DEALLOCATE a1")]),
            step(vec![bind("", "a1", &[]), execute("", 0), sync()]),
            step(vec![query("deallocate prepare \"A2\";")]),
            step(vec![query("DEALLOCATE a1")]),
            step(vec![query("DEALLOCATE weir_1")]),
            step(vec![
                parse("a1", "select 'again'"),
                bind("", "a1", &[]),
                execute("", 0),
                sync(),
            ]),
            step(vec![query("begin"), query("select 1/0")]),
            step(vec![query("DEALLOCATE a1")]),
            step(vec![query("rollback")]),
            step(vec![bind("", "a1", &[]), execute("", 0), sync()]),
        ]
    });
}

/// SQL PREPARE / EXECUTE / DEALLOCATE, and their names shared with the protocol's.
#[test]
fn sql_prepare_execute_deallocate() {
    same_as_direct(|| {
        vec![
            // The second client finds this one on the server: Weir answers the PREPARE.
            step(vec![query("PREPARE keep AS select 'kept'")]),
            step(vec![query("EXECUTE keep")]),
            step(vec![query("PREPARE q1 (int) AS select $1 + 1")]),
            step(vec![query("EXECUTE q1 (41)")]),
            step(vec![query("execute Q1(1);")]),
            step(vec![query("PREPARE q1 AS select 2")]),
            step(vec![parse("q1", "select 3"), sync()]),
            step(vec![query("PREPARE \"Q 2\" AS select 'two'")]),
            step(vec![query("EXECUTE \"Q 2\"")]),
            step(vec![query("EXECUTE nope")]),
            step(vec![query("PREPARE bad AS select from from")]),
            step(vec![query("EXECUTE bad")]),
            step(vec![parse("p1", "select 'protocol'"), sync()]),
            step(vec![query("EXECUTE p1")]),
            step(vec![query("begin"), query("select 1/0")]),
            step(vec![query("EXECUTE q1 (1)")]),
            step(vec![query("PREPARE q3 AS select 3")]),
            step(vec![query("rollback")]),
            step(vec![query("DEALLOCATE q1")]),
            step(vec![query("EXECUTE q1 (1)")]),
            step(vec![query("DEALLOCATE \"Q 2\"")]),
            step(vec![query("PREPARE q1 (text) AS select $1 || '!'")]),
            step(vec![query("EXECUTE q1 ('again')")]),
        ]
    });
}

/// SQL PREPARE, EXECUTE and DEALLOCATE of a name sent with the extended protocol (a
/// Parse of `PREPARE x AS ...`, as pgJDBC sends every statement) are refused in words
/// that say what to do, out of a block by Weir and in one by PostgreSQL (the block
/// fails, as the client's statement would have failed it): never passed on, where the
/// statement would stay on the shared server under the client's name for another
/// client's EXECUTE of that name to run. DEALLOCATE ALL and DISCARD ALL go on.
#[test]
fn sql_prepare_through_the_extended_protocol_is_refused() {
    let pg = PgServer::start();
    let weir = one_server(&pg, 20);
    let mut a = RawConn::startup(weir.port(), "postgres", "postgres", &[]).expect("login");
    let mut b = RawConn::startup(weir.port(), "postgres", "postgres", &[]).expect("login");
    let extended = |sql: &str| [parse("", sql), bind("", "", &[]), execute("", 0), sync()].concat();
    let refused = |c: &mut RawConn, sql: &str| {
        c.send(&extended(sql));
        let msgs = c.read_until_ready();
        let e = msgs
            .iter()
            .find(|m| m.tag == b'E')
            .map(|m| parse_error(&m.body))
            .unwrap_or_else(|| panic!("{sql} was not refused"));
        assert_eq!(e.code, "0A000", "{sql}: {e:?}");
        assert!(e.message.contains("simple queries"), "{sql}: {e:?}");
        let tags: String = msgs.iter().map(|m| m.tag_char()).collect();
        (tags, msgs.last().map(|m| m.body[0]))
    };
    for sql in [
        "PREPARE x AS select 'a''s'",
        "EXECUTE x",
        "deallocate prepare x",
    ] {
        assert_eq!(refused(&mut a, sql), ("EZ".into(), Some(b'I')), "{sql}");
    }
    // B never prepared x: PostgreSQL says so, as to a direct client.
    b.send(&query("EXECUTE x"));
    assert_eq!(replies(&mut b), ["E 26000", "Z"]);
    // In a block, the block fails as the client's own error would fail it.
    a.send(&query("begin"));
    assert_eq!(replies(&mut a), ["C", "Z"]);
    a.send(&[parse("", "select 1"), bind("", "", &[]), execute("", 0)].concat());
    let (tags, status) = refused(&mut a, "PREPARE y AS select 1");
    assert_eq!((tags.as_str(), status), ("12DCEZ", Some(b'E')));
    a.send(&query("select 1"));
    assert_eq!(replies(&mut a), ["E 25P02", "Z"]);
    a.send(&query("rollback"));
    assert_eq!(replies(&mut a), ["C", "Z"]);
    // The simple query's PREPARE is followed.
    a.send(&query("PREPARE x AS select 'simple'"));
    assert_eq!(replies(&mut a), ["C", "Z"]);
    a.send(&query("EXECUTE x"));
    assert_eq!(replies(&mut a), ["T 1", "D [Some(\"simple\")]", "C", "Z"]);
    // An extended DEALLOCATE ALL goes on; what it drops of other clients' statements on
    // the shared server, Weir prepares again.
    b.send(&[parse("sb", "select 'b'"), sync()].concat());
    assert_eq!(replies(&mut b), ["1", "Z"]);
    a.send(&extended("DEALLOCATE ALL"));
    assert_eq!(replies(&mut a), ["1", "2", "C", "Z"]);
    b.send(&run_prepared("sb"));
    assert_eq!(replies(&mut b), ["2", "T 1", "D [Some(\"b\")]", "C", "Z"]);
}

/// SHOW SERVERS and SHOW CLIENTS tell how many statements each holds.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn show_servers_counts_prepared_statements() {
    let pg = PgServer::start();
    let weir = Weir::for_pg(&pg)
        .set("pool_mode", "transaction")
        .set("default_pool_size", 1)
        .set("admin_users", "postgres")
        .start();
    let c = connect(weir.port(), "postgres", "postgres").await.unwrap();
    let _one = c.prepare("select 1").await.unwrap();
    c.prepare("select 2").await.unwrap();
    // After this, tokio-postgres's Close of the dropped statement has been answered.
    c.simple_query("select 3").await.unwrap();
    let admin = connect(weir.port(), "pgbouncer", "postgres").await.unwrap();
    let counts = |sql: &'static str| {
        let admin = &admin;
        async move {
            let rows = admin.simple_query(sql).await.unwrap();
            let mut v: Vec<String> = rows
                .iter()
                .filter_map(|m| match m {
                    tokio_postgres::SimpleQueryMessage::Row(r) => {
                        r.get("prepared_statements").map(String::from)
                    }
                    _ => None,
                })
                .collect();
            v.sort();
            v
        }
    };
    // The server holds both; the client, one (tokio-postgres closed the other).
    assert_eq!(counts("show servers").await, vec!["2".to_string()]);
    assert!(counts("show clients").await.contains(&"1".to_string()));
}

/// A request that waits for a server is rewritten while it queues, as if the server it
/// gets held its statements: it goes ahead to a server that does, and one that does not
/// prepares them first.
#[test]
fn queued_requests_with_named_statements() {
    let pg = PgServer::start();
    for cap in [200, 1] {
        let weir = one_server(&pg, cap);
        let mut a = RawConn::startup(weir.port(), "postgres", "postgres", &[]).unwrap();
        let mut b = RawConn::startup(weir.port(), "postgres", "postgres", &[]).unwrap();
        b.send(&[parse("s", "select 'b'"), sync()].concat());
        b.read_until_ready();
        // With a cache of one, this takes b's statement off the only server.
        a.send(&[parse("t", "select 'a'"), sync()].concat());
        a.read_until_ready();
        a.send(&query("begin"));
        a.read_until_ready();
        b.send(
            &[
                bind("", "s", &[]),
                describe(b'P', ""),
                execute("", 0),
                sync(),
            ]
            .concat(),
        );
        // b queues behind a's transaction.
        std::thread::sleep(std::time::Duration::from_millis(300));
        a.send(&[bind("", "t", &[]), execute("", 0), sync(), query("commit")].concat());
        a.read_until_ready();
        a.read_until_ready();
        let rows = rows_until_ready(&mut b);
        assert_eq!(rows, vec![vec![Some("b".to_string())]], "cap {cap}");
    }
}

/// Random message sequences (fixed seeds, so a failure reproduces): named and unnamed
/// statements, errors in and out of pipelines, several Syncs, transactions, Close,
/// DEALLOCATE [ALL], DISCARD ALL, SQL PREPARE/EXECUTE; each must get what a direct
/// connection gets. To narrow a failure down: SEED=n STEPS=k runs the first k steps of
/// one seed.
#[test]
fn random_sequences_match_a_direct_connection() {
    let pg = PgServer::start();
    if let Ok(seed) = std::env::var("SEED") {
        let seed: u64 = seed.parse().unwrap();
        let steps: usize = std::env::var("STEPS").unwrap().parse().unwrap();
        same_as_direct_on(&pg, "debug", || {
            let mut s = random_script(seed);
            s.truncate(steps);
            s.push(step(vec![query("rollback")]));
            s
        });
        return;
    }
    for seed in 1..=60u64 {
        same_as_direct_on(&pg, &format!("seed {seed}:"), || random_script(seed));
    }
}

fn random_script(seed: u64) -> Vec<Step> {
    let mut state = seed.wrapping_mul(0x9E37_79B9_7F4A_7C15) | 1;
    let mut next = move |n: u64| {
        state ^= state << 13;
        state ^= state >> 7;
        state ^= state << 17;
        state % n
    };
    let names = ["a", "b", "c"];
    // All take one parameter: in a failed transaction PostgreSQL checks a Bind's parameter
    // count before it refuses the Bind, and Weir, preparing on a server that lacks the
    // statement, would meet the refusal first (the one difference known and accepted).
    let texts = [
        "select $1::int as n",
        "select $1::text || 'x' as x",
        "select $1::int * 2",
        "select 1 / ($1::int - 21)",
        "select from from $1",
    ];
    let mut steps = Vec::new();
    // A batch is closed (with a Sync unless it ends with a query) before a query starts
    // the next: after an error PostgreSQL skips even a query until Sync.
    let close_batch = |steps: &mut Vec<Step>, batch: &mut Vec<Vec<u8>>| {
        if batch.last().is_some_and(|m| m[0] != b'Q' && m[0] != b'S') {
            batch.push(sync());
        }
        steps.push(step(std::mem::take(batch)));
    };
    for _ in 0..25 {
        let mut batch = Vec::new();
        for _ in 0..1 + next(4) {
            let name = names[next(3) as usize];
            match next(12) {
                0..=2 => batch.push(parse(name, texts[next(5) as usize])),
                3..=5 => {
                    batch.push(bind("", name, &[Some("21")]));
                    batch.push(execute("", 0));
                }
                6 => batch.push(describe(b'S', name)),
                7 => batch.push(close(b'S', name)),
                8 => batch.push(sync()),
                9 => {
                    batch.push(parse("", texts[next(5) as usize]));
                    batch.push(bind("", "", &[Some("21")]));
                    batch.push(execute("", 0));
                }
                10 => {
                    close_batch(&mut steps, &mut batch);
                    let q = ["begin", "commit", "rollback", "select 1/0"][next(4) as usize];
                    batch.push(query(q));
                }
                _ => {
                    close_batch(&mut steps, &mut batch);
                    let sql = match next(6) {
                        0 | 1 => format!("deallocate {name}"),
                        2 => "deallocate all".to_string(),
                        // SQL names apart: a Bind of a statement of SQL PREPARE that its
                        // server lost mid-batch is a known limit (see rewrite::ensure_any).
                        3 => format!("prepare q{name} (int) as select $1 + 1"),
                        4 if next(2) == 0 => format!("execute q{name} (21)"),
                        4 => format!("execute {name} (21)"),
                        _ => "discard all".to_string(),
                    };
                    batch.push(query(&sql));
                }
            }
        }
        close_batch(&mut steps, &mut batch);
    }
    steps.retain(|s| !s.msgs.is_empty());
    steps.push(step(vec![query("rollback")]));
    steps
}

/// After DDL changes what a statement returns, a client that prepared it before gets
/// PostgreSQL's "cached plan must not change result type" when it runs it without
/// describing the portal (as on a direct connection: see tests/prepared_retry.rs for the
/// batches Weir runs again), and whoever prepares the text again gets a fresh statement,
/// not the stale plan the shared server still holds, without a refusal on the way.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn statements_prepared_again_after_ddl_are_fresh() {
    let pg = PgServer::start();
    pg.exec("create table ddl_t (a int); insert into ddl_t values (1)");
    let weir = one_server(&pg, 200);
    let a = connect(weir.port(), "postgres", "postgres").await.unwrap();
    let old = a.prepare("select * from ddl_t").await.unwrap();
    assert_eq!(a.query(&old, &[]).await.unwrap().len(), 1);
    pg.exec("alter table ddl_t add column b int");
    let b = connect(weir.port(), "postgres", "postgres").await.unwrap();
    let s = b.prepare("select * from ddl_t").await.unwrap();
    assert_eq!(s.columns().len(), 2);
    let rows = b.query(&s, &[]).await.unwrap();
    assert_eq!(rows[0].len(), 2);
    let e = a.query(&old, &[]).await.unwrap_err();
    assert_eq!(expect_db_error(&e).code, "0A000");
}

/// tokio-postgres pipelines the queries of one connection that are awaited together:
/// several Syncs in flight, prepared and unprepared statements, errors among them, while
/// ten clients share two servers.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn pipelined_clients_share_two_servers() {
    let pg = PgServer::start();
    let weir = Weir::for_pg(&pg)
        .set("pool_mode", "transaction")
        .set("default_pool_size", 2)
        .set("max_prepared_statements", 3)
        .start();
    let mut tasks = Vec::new();
    for i in 0..10i32 {
        let port = weir.port();
        tasks.push(tokio::spawn(async move {
            let c = connect(port, "postgres", "postgres").await.unwrap();
            let stmts = [
                c.prepare(&format!("select $1::int + {i}")).await.unwrap(),
                c.prepare("select $1::int * 2").await.unwrap(),
                c.prepare(&format!("select 1 / ($1::int - {i})"))
                    .await
                    .unwrap(),
                c.prepare("select $1::int - 1").await.unwrap(),
            ];
            for round in 0..10i32 {
                let calls = (0..8i32).map(|k| {
                    let s = &stmts[(k % 4) as usize];
                    let c = &c;
                    async move { c.query_one(s, &[&(round + k)]).await }
                });
                let results = futures_join_all(calls).await;
                for (k, r) in (0..8i32).zip(results) {
                    let x = round + k;
                    match k % 4 {
                        0 => assert_eq!(r.unwrap().get::<_, i32>(0), x + i),
                        1 => assert_eq!(r.unwrap().get::<_, i32>(0), x * 2),
                        2 if x == i => assert_eq!(expect_db_error(&r.unwrap_err()).code, "22012"),
                        2 => assert_eq!(r.unwrap().get::<_, i32>(0), 1 / (x - i)),
                        _ => assert_eq!(r.unwrap().get::<_, i32>(0), x - 1),
                    }
                }
            }
        }));
    }
    for t in tasks {
        t.await.unwrap();
    }
}

/// Awaits all the futures together (so that tokio-postgres pipelines them), in order.
async fn futures_join_all<F: std::future::Future>(fs: impl Iterator<Item = F>) -> Vec<F::Output> {
    let mut pinned: Vec<_> = fs.map(Box::pin).collect();
    let mut out: Vec<Option<F::Output>> = (0..pinned.len()).map(|_| None).collect();
    std::future::poll_fn(|cx| {
        let mut pending = false;
        for (f, slot) in pinned.iter_mut().zip(out.iter_mut()) {
            if slot.is_none() {
                match f.as_mut().poll(cx) {
                    std::task::Poll::Ready(v) => *slot = Some(v),
                    std::task::Poll::Pending => pending = true,
                }
            }
        }
        if pending {
            std::task::Poll::Pending
        } else {
            std::task::Poll::Ready(())
        }
    })
    .await;
    out.into_iter().flatten().collect()
}

/// A runtime `SET max_prepared_statements` reaches clients already connected, at their
/// next transaction, as PgBouncer's does: a statement prepared after it is found on a
/// server the client has not used before (here: after RECONNECT closed the one it had).
#[test]
fn a_runtime_set_of_max_prepared_statements_reaches_connected_clients() {
    let pg = PgServer::start();
    let weir = Weir::for_pg(&pg)
        .set("pool_mode", "transaction")
        .set("default_pool_size", 1)
        .set("max_prepared_statements", 0)
        .set("admin_users", "postgres")
        .start();
    let mut c = RawConn::startup(weir.port(), "postgres", "postgres", &[]).expect("login");
    assert_eq!(c.query_one("select 1"), "1");
    let mut console =
        RawConn::startup(weir.port(), "postgres", "pgbouncer", &[]).expect("console login");
    // Out of PgBouncer's C int: refused as PgBouncer does (test_prepared.py:
    // test_prepared_statement_parsing_admin), the value kept.
    for bad in ["-1", "3147483648"] {
        let sql = format!("SET max_prepared_statements = '{bad}'");
        let e = common::console::run(&mut console, &sql).expect_err("refused");
        assert!(e.message.starts_with("SET failed"), "{bad}: {e:?}");
    }
    common::console::ok(&mut console, "SET max_prepared_statements = '2147483647'");
    common::console::ok(&mut console, "SET max_prepared_statements = 10");
    // The transaction that ends after the SET is where the client takes it up.
    assert_eq!(c.query_one("select 2"), "2");
    c.send(&[parse("s1", "select 42"), sync()].concat());
    assert_eq!(replies(&mut c), ["1", "Z"]);
    common::console::ok(&mut console, "RECONNECT postgres");
    assert!(
        eventually(TIMEOUT, || pg.count_backends("postgres") <= 1),
        "RECONNECT left the idle server open"
    );
    c.send(&run_prepared("s1"));
    assert_eq!(replies(&mut c), ["2", "T 1", "D [Some(\"42\")]", "C", "Z"]);
}

/// A client reusing a statement name gets PostgreSQL's 42P05 (the Bind and Execute after
/// it skipped, a transaction block failed). Out of a transaction block Weir answers it
/// itself, so PostgreSQL logs nothing; in one, PostgreSQL must fail the block and so logs
/// the error, in the client's words, as for a direct client: never an error of Weir's
/// making (it used to log `function pg_catalog.weir_statement_check() does not exist`,
/// then `prepared statement "weir_1" already exists`).
#[test]
fn reused_name_leaves_no_error_of_weirs_in_postgres_log() {
    let pg = PgServer::start();
    let weir = Weir::for_pg(&pg).set("pool_mode", "transaction").start();
    let mut c = RawConn::startup(weir.port(), "postgres", "postgres", &[]).unwrap();
    c.send(&parse("x", "select 1"));
    c.send(&sync());
    c.read_until_ready();
    for in_block in [false, true] {
        if in_block {
            c.simple_query("begin").unwrap();
        }
        c.send(&parse("x", "select 2"));
        c.send(&bind("", "x", &[]));
        c.send(&execute("", 0));
        c.send(&sync());
        let got = c.read_until_ready();
        let tags: Vec<char> = got.iter().map(|m| m.tag_char()).collect();
        assert_eq!(tags, ['E', 'Z'], "{in_block}");
        let e = parse_error(&got[0].body);
        assert_eq!(
            (e.code.as_str(), e.message.as_str()),
            ("42P05", r#"prepared statement "x" already exists"#)
        );
        let status = got[1].body[0];
        assert_eq!(status, if in_block { b'E' } else { b'I' });
        let log = pg.log();
        let errors: Vec<&str> = log.lines().filter(|l| l.contains("ERROR:")).collect();
        if in_block {
            assert_eq!(errors.len(), 1, "{log}");
            assert!(
                errors[0].ends_with(r#"ERROR:  prepared statement "x" already exists"#),
                "{log}"
            );
        } else {
            assert!(
                errors.is_empty(),
                "Weir answered, yet PostgreSQL logged:\n{log}"
            );
        }
    }
    c.simple_query("rollback").unwrap();
    // The statement the client has is still the first one.
    c.send(&bind("", "x", &[]));
    c.send(&execute("", 0));
    c.send(&sync());
    assert_eq!(rows_until_ready(&mut c), vec![vec![Some("1".to_string())]]);
    // The name PostgreSQL was made to refuse is not left on the server.
    let names = c
        .simple_query("select name from pg_prepared_statements")
        .unwrap();
    assert!(
        names
            .iter()
            .flatten()
            .flatten()
            .all(|n| n.starts_with("weir_")),
        "{names:?}"
    );
}

/// A reused name in every position a batch can hold it, pipelined with what follows: the
/// client sees what a direct connection sees (the rest of the batch skipped up to Sync,
/// the next batch run; what the batch ran before the error rolled back; a block failed),
/// and PostgreSQL logs for Weir's clients only errors it logs for the direct one, never a
/// name of Weir's, and none at all where Weir answered without a transaction to fail.
#[test]
fn reused_names_match_a_direct_connection_and_its_log() {
    let script = || {
        vec![
            step(vec![parse("x", "select 1"), sync()]),
            // Out of a block, with the next batch pipelined behind.
            step(vec![
                parse("x", "select 2"),
                bind("", "x", &[]),
                execute("", 0),
                parse("later", "select 'skipped'"),
                sync(),
                parse("", "select 'after'"),
                bind("", "", &[]),
                execute("", 0),
                sync(),
                bind("", "later", &[]),
                sync(),
            ]),
            // The text's own error comes first.
            step(vec![parse("x", "selec 2"), bind("", "x", &[]), sync()]),
            // Flushed, the error comes at once; what follows it is skipped up to Sync.
            flushed(vec![parse("x", "select 2"), flush()], 1),
            step(vec![bind("", "x", &[]), execute("", 0), sync()]),
            // A name like Weir's own.
            step(vec![parse("weir_1", "select 5"), sync()]),
            step(vec![
                parse("weir_1", "select 6"),
                bind("", "weir_1", &[]),
                execute("", 0),
                sync(),
            ]),
            // Reused within one batch.
            step(vec![
                parse("y", "select 3"),
                parse("y", "select 4"),
                bind("", "y", &[]),
                execute("", 0),
                sync(),
                bind("", "y", &[]),
                execute("", 0),
                sync(),
            ]),
            // What the batch ran before the error is rolled back.
            step(vec![
                parse("", "insert into t values (1, 'rolled back')"),
                bind("", "", &[]),
                execute("", 0),
                parse("x", "select 2"),
                bind("", "x", &[]),
                execute("", 0),
                sync(),
                query("select count(*) from t"),
            ]),
            // In a block: the block fails.
            step(vec![query("begin")]),
            step(vec![
                parse("x", "select 2"),
                sync(),
                parse("", "select 'in a failed block'"),
                bind("", "", &[]),
                execute("", 0),
                sync(),
            ]),
            step(vec![query("rollback")]),
            // In a failed block, that is what the client hears of.
            step(vec![query("begin"), query("select 1/0")]),
            step(vec![parse("x", "select 2"), sync()]),
            step(vec![query("rollback")]),
            // A name of Weir's own the client never prepared, out of a block.
            step(vec![
                bind("", "weir_1", &[]),
                execute("", 0),
                sync(),
                bind("", "x", &[]),
                execute("", 0),
                sync(),
            ]),
            // The same in SQL, out of a block.
            step(vec![query("prepare q as select 7")]),
            step(vec![query("prepare q as select 8"), query("execute q")]),
            step(vec![query("execute weir_1"), query("deallocate weir_1")]),
        ]
    };
    let pg = PgServer::start();
    pg.exec("create table t (id int primary key, v text); create role direct superuser login");
    let mut direct = RawConn::startup(pg.port(), "direct", "postgres", &[]).unwrap();
    let want = run(&mut direct, &script());
    let mut clients = 0;
    for cap in [200, 1] {
        let weir = one_server(&pg, cap);
        for round in 0..2 {
            let mut c = RawConn::startup(weir.port(), "postgres", "postgres", &[]).unwrap();
            let got = run(&mut c, &script());
            let script = describe_script(&script());
            assert_eq!(got, want, "cap {cap}, client {round}\nscript: {script}");
            clients += 1;
        }
    }
    // What each logged, by the role in the log line's prefix (`%u@%d`).
    let log = pg.log();
    let errors = |role: &str| -> Vec<String> {
        let who = format!(" {role}@postgres ERROR:  ");
        log.lines()
            .filter_map(|l| l.split_once(&who).map(|(_, m)| m.to_string()))
            .collect()
    };
    let (direct_errors, weir_errors) = (errors("direct"), errors("postgres"));
    for e in &weir_errors {
        assert!(
            !e.contains("weir_"),
            "an error of Weir's making: {e}\n{log}"
        );
        assert!(
            direct_errors.contains(e),
            "not logged for a direct client: {e}\n{log}"
        );
    }
    let reused = |errors: &[String]| errors.iter().filter(|e| e.contains("already")).count();
    // Direct: all seven reused names; through Weir, per client, the two that failed a
    // transaction.
    assert_eq!(reused(&direct_errors), 7, "{log}");
    assert_eq!(reused(&weir_errors), 2 * clients, "{log}");
}

/// DEALLOCATE ALL or DISCARD ALL by a client that never named a statement (or sent in
/// a way Weir does not rewrite): another client's statement on that server still runs.
#[test]
fn deallocate_all_variants_keep_other_clients_statements() {
    let pg = PgServer::start();
    let weir = common::session::pooled(&pg, 1);
    let mut b = common::session::named_client(&weir, "b");
    let extended = |sql: &str| [parse("", sql), bind("", "", &[]), execute("", 0), sync()].concat();
    let mut fails = Vec::new();
    for (i, steps) in [
        vec![query("deallocate all")],
        vec![extended("DEALLOCATE ALL")],
        vec![extended("DISCARD ALL")],
        vec![query("select 1; deallocate all")],
        vec![
            query("begin"),
            extended("DEALLOCATE ALL"),
            query("rollback"),
        ],
        vec![
            query("begin"),
            query("select 1/0"),
            extended("DEALLOCATE ALL"),
            query("rollback"),
        ],
        vec![query("begin; deallocate all; rollback")],
        vec![query("select 1"), extended("DISCARD ALL")],
    ]
    .into_iter()
    .enumerate()
    {
        let name = format!("sb{i}");
        b.send(&[parse(&name, &format!("select 'b{i}'")), sync()].concat());
        assert_eq!(replies(&mut b), ["1", "Z"]);
        b.send(&run_prepared(&name));
        let r = replies(&mut b);
        assert!(
            r.contains(&format!("D [Some(\"b{i}\")]")),
            "step {i} before: {r:?}"
        );
        // A fresh client that never prepared anything.
        let mut a = common::session::named_client(&weir, "a");
        for s in steps {
            a.send(&s);
            let _ = a.read_until_ready();
        }
        b.send(&run_prepared(&name));
        let r = replies(&mut b);
        if !r.contains(&format!("D [Some(\"b{i}\")]")) {
            fails.push(format!("step {i}: {r:?}"));
        }
    }
    assert!(fails.is_empty(), "{fails:#?}");
}

/// A client's own protocol-level statement, after its DEALLOCATE ALL in a failed block:
/// still there, as directly.
#[test]
fn own_statement_after_deallocate_all_in_failed_block() {
    let pg = PgServer::start();
    let weir = common::session::pooled(&pg, 1);
    let extended = |sql: &str| [parse("", sql), bind("", "", &[]), execute("", 0), sync()].concat();
    let mut outs = Vec::new();
    for port in [weir.port(), pg.port()] {
        let mut a = RawConn::startup(port, "postgres", "postgres", &[]).unwrap();
        a.send(&[parse("sa", "select 'a'"), sync()].concat());
        let _ = replies(&mut a);
        a.send(&query("begin"));
        let _ = replies(&mut a);
        a.send(&query("select 1/0"));
        let _ = replies(&mut a);
        a.send(&extended("DEALLOCATE ALL"));
        let x = replies(&mut a);
        a.send(&query("rollback"));
        let _ = replies(&mut a);
        a.send(&run_prepared("sa"));
        let y = replies(&mut a);
        a.send(&extended("DEALLOCATE ALL"));
        let z = replies(&mut a);
        a.send(&run_prepared("sa"));
        let w = replies(&mut a);
        outs.push((x, y, z, w));
    }
    assert_eq!(outs[0], outs[1]);
}

/// DEALLOCATE ALL that runs, followed in the same query by a statement that fails:
/// PostgreSQL's statements are not transactional, so they are gone; Weir's Reset is
/// undone by the error.
#[test]
fn deallocate_all_then_error_in_one_query() {
    let pg = PgServer::start();
    let weir = common::session::pooled(&pg, 1);
    let mut b = common::session::named_client(&weir, "b");
    let mut fails = Vec::new();
    // (DISCARD ALL cannot run in a query of several statements.)
    for (i, sql) in [
        "deallocate all; select 1/0",
        "select 1; deallocate all; select 1/0",
    ]
    .into_iter()
    .enumerate()
    {
        let name = format!("sb{i}");
        b.send(&[parse(&name, &format!("select 'b{i}'")), sync()].concat());
        assert_eq!(replies(&mut b), ["1", "Z"]);
        let mut a = common::session::named_client(&weir, "a");
        // A tracks statements (it used the extended protocol once).
        a.send(&[parse("sa", "select 'a'"), sync()].concat());
        let _ = replies(&mut a);
        a.send(&query(sql));
        let ra = replies(&mut a);
        b.send(&run_prepared(&name));
        let r = replies(&mut b);
        if !r.contains(&format!("D [Some(\"b{i}\")]")) {
            fails.push(format!("{sql}: A got {ra:?}; B then {r:?}"));
        }
        a.send(&run_prepared("sa"));
        let r = replies(&mut a);
        // Direct: 26000 (A's sa was dropped too).
        if r.first().map(String::as_str) != Some("E 26000") {
            fails.push(format!("{sql}: A's own sa after: {r:?}"));
        }
    }
    assert!(fails.is_empty(), "{fails:#?}");
}
