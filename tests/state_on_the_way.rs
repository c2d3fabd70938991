//! A client with session state of its own (search_path, application_name) gets a server
//! put into that state in the same write as its request (gucs::on_the_way): a hand-over
//! costs no round trip. Counted where it shows, between Weir and PostgreSQL: a proxy
//! records what crosses it, and each request must be one burst from Weir, answered once.

mod common;

use std::io::{Read, Write};
use std::net::{TcpListener, TcpStream};
use std::sync::{Arc, Mutex};
use std::thread;

use common::console::*;
use common::proto::*;
use common::session::*;
use common::*;

/// What crossed the proxy, in the order it was read: (to PostgreSQL?, bytes).
type Log = Arc<Mutex<Vec<(bool, Vec<u8>)>>>;

/// A TCP proxy in front of PostgreSQL that logs every read in both directions.
fn logging_proxy(pg_port: u16) -> (u16, Log) {
    let listener = TcpListener::bind("127.0.0.1:0").expect("bind");
    let port = listener.local_addr().expect("addr").port();
    let log: Log = Arc::default();
    let log2 = log.clone();
    thread::spawn(move || {
        for conn in listener.incoming() {
            let Ok(weir) = conn else { return };
            let Ok(pg) = TcpStream::connect(("127.0.0.1", pg_port)) else {
                return;
            };
            for (from, to, to_pg) in [
                (
                    weir.try_clone().expect("clone"),
                    pg.try_clone().expect("clone"),
                    true,
                ),
                (pg, weir, false),
            ] {
                let log = log2.clone();
                thread::spawn(move || copy_logged(from, to, to_pg, log));
            }
        }
    });
    (port, log)
}

fn copy_logged(mut from: TcpStream, mut to: TcpStream, to_pg: bool, log: Log) {
    let mut buf = vec![0u8; 65536];
    loop {
        let n = match from.read(&mut buf) {
            Ok(0) | Err(_) => {
                let _ = to.shutdown(std::net::Shutdown::Write);
                return;
            }
            Ok(n) => n,
        };
        // Logged before it is passed on: an answer cannot be logged before its request.
        log.lock().unwrap().push((to_pg, buf[..n].to_vec()));
        if to.write_all(&buf[..n]).is_err() {
            return;
        }
    }
}

/// Weir in transaction mode with one server, reaching PostgreSQL through `proxy`.
fn through_proxy(proxy: u16) -> Weir {
    Weir::builder()
        .database(
            "postgres",
            &format!("host=127.0.0.1 port={proxy} dbname=postgres"),
        )
        .set("pool_mode", "transaction")
        .set("default_pool_size", 1)
        .set("admin_users", "postgres")
        .start()
}

/// PostgreSQL, the logging proxy in front of it, and Weir (`through_proxy`) behind that.
fn proxied() -> (PgServer, Log, Weir) {
    let pg = PgServer::start();
    let (proxy, log) = logging_proxy(pg.port());
    let weir = through_proxy(proxy);
    (pg, log, weir)
}

/// What Weir sent PostgreSQL in one go before each answer: consecutive reads towards
/// PostgreSQL with no answer between them are one burst.
fn bursts_to_pg(log: &[(bool, Vec<u8>)]) -> Vec<Vec<u8>> {
    let mut out: Vec<Vec<u8>> = Vec::new();
    let mut answered = true;
    for (to_pg, bytes) in log {
        if *to_pg {
            if answered {
                out.push(Vec::new());
            }
            if let Some(last) = out.last_mut() {
                last.extend_from_slice(bytes);
            }
            answered = false;
        } else {
            answered = true;
        }
    }
    out
}

/// States put on a server by a query of their own, a round trip apart (SHOW STATS).
fn applied_apart(console: &mut RawConn) -> i64 {
    ok(console, "SHOW STATS").num("database", "postgres", "total_state_round_trip_count")
}

fn contains(hay: &[u8], needle: &str) -> bool {
    hay.windows(needle.len()).any(|w| w == needle.as_bytes())
}

const ASK: &str =
    "select current_setting('search_path') || '/' || current_setting('application_name')";

fn extended_ask(c: &mut RawConn) -> String {
    c.send(&[parse("", ASK), bind("", "", &[]), execute("", 0), sync()].concat());
    let msgs = c.read_until_ready();
    let row = msgs
        .iter()
        .find(|m| m.tag == b'D')
        .unwrap_or_else(|| panic!("no row: {msgs:?}"));
    data_row(&row.body)[0].clone().expect("not null")
}

/// Two clients, each with a search_path and application_name of its own, and what ASK
/// answers them.
fn two_with_state(weir: &Weir) -> Vec<(RawConn, String)> {
    let mut clients = Vec::new();
    for name in ["a", "b"] {
        let mut c = client(weir);
        c.simple_query(&format!("SET search_path TO s_{name}, public"))
            .expect("set");
        c.simple_query(&format!("SET application_name = 'app_{name}'"))
            .expect("set");
        clients.push((c, format!("s_{name}, public/app_{name}")));
    }
    clients
}

/// `two_with_state`, each having run ASK once: what follows is hand-overs only.
fn two_that_ran(weir: &Weir) -> Vec<(RawConn, String)> {
    let mut clients = two_with_state(weir);
    for (c, want) in clients.iter_mut() {
        assert_eq!(&c.query_one(ASK), want);
    }
    clients
}

/// Two clients with their own search_path and application_name take turns on one
/// server: every turn needs the server put into the other's state, and each goes in one
/// write with the request (simple and extended protocol), and each answer is right.
#[test]
fn state_goes_in_the_same_write_as_the_request() {
    let (_pg, log, weir) = proxied();
    let mut clients = two_that_ran(&weir);
    let mut console = admin(&weir);
    let counts = |console: &mut RawConn| {
        let stats = ok(console, "SHOW STATS");
        (
            stats.num("database", "postgres", "total_state_applied_count"),
            stats.num("database", "postgres", "total_state_round_trip_count"),
        )
    };
    let before = counts(&mut console);
    log.lock().unwrap().clear();
    let turns = 12;
    for i in 0..turns {
        let (c, want) = &mut clients[i % 2];
        let got = if i % 4 < 2 {
            c.query_one(ASK)
        } else {
            extended_ask(c)
        };
        assert_eq!(&got, want, "turn {i}");
    }
    let bursts = bursts_to_pg(&log.lock().unwrap());
    assert_eq!(
        bursts.len(),
        turns,
        "one write (one round trip) per turn: {:?}",
        bursts
            .iter()
            .map(|b| String::from_utf8_lossy(b).into_owned())
            .collect::<Vec<_>>()
    );
    for (i, b) in bursts.iter().enumerate() {
        assert!(
            contains(b, "BEGIN\0") && contains(b, "SET \"search_path\" TO") && contains(b, ASK),
            "turn {i} did not carry state and request together: {}",
            String::from_utf8_lossy(b)
        );
    }
    let after = counts(&mut console);
    assert_eq!(
        after.0 - before.0,
        turns as i64,
        "state applied at every turn"
    );
    assert_eq!(
        after.1, before.1,
        "state applied apart, a round trip of its own"
    );
}

/// A request that sets a reported parameter back to what the last client had: PostgreSQL
/// reports a change only against the value it last reported, so a state put on the
/// server without a ReadyForQuery of its own (as Sync-less extended-protocol statements
/// would be) would leave the change unreported, to the client (whose driver reads dates
/// by DateStyle) and to Weir (which would then take the server for one in the client's
/// old DateStyle). The client is told, as a direct connection tells it, and the next
/// client in the old DateStyle gets a server put back into it.
#[test]
fn a_reported_parameter_set_back_is_reported() {
    let pg = PgServer::start();
    let weir = pooled(&pg, 1);
    let mut a = client(&weir);
    let mut b = client(&weir);
    let mut c = client(&weir);
    for x in [&mut a, &mut c] {
        x.simple_query("SET DateStyle = 'Postgres, YMD'")
            .expect("set");
    }
    assert_eq!(b.query_one("show DateStyle"), "ISO, MDY");
    // The server last reported ISO, MDY (b's); a sets it back to that.
    a.send(&query("SET DateStyle = 'ISO, MDY'"));
    let msgs = a.read_until_ready();
    let reported: Vec<String> = msgs
        .iter()
        .filter(|m| m.tag == b'S')
        .map(|m| String::from_utf8_lossy(&m.body).into_owned())
        .collect();
    assert_eq!(reported, ["DateStyle\0ISO, MDY\0"], "{msgs:?}");
    assert_eq!(a.query_one("show DateStyle"), "ISO, MDY");
    assert_eq!(c.query_one("show DateStyle"), "Postgres, YMD");
    assert_eq!(a.query_one("show DateStyle"), "ISO, MDY");
    assert_eq!(b.query_one("show DateStyle"), "ISO, MDY");
}

/// A state that cannot be put on the server fails the request written behind it without
/// running it: the role the client set is dropped, so Weir's query fails, and the
/// client's INSERT (which would otherwise run as the login role) never reaches the
/// table.
#[test]
fn a_failed_state_query_keeps_the_request_from_running() {
    let pg = PgServer::start();
    pg.exec("create role r_gone; grant all on schema public to r_gone;");
    pg.exec("create table t_gone (v int); grant all on t_gone to r_gone;");
    let weir = pooled(&pg, 1);
    let mut a = client(&weir);
    let mut b = client(&weir);
    a.simple_query("SET ROLE r_gone").expect("set role");
    assert_eq!(a.query_one("select current_user"), "r_gone");
    // b takes the server, then the role goes.
    assert_eq!(b.query_one("select current_user"), "postgres");
    pg.exec("drop owned by r_gone; drop role r_gone;");
    let mut console = admin(&weir);
    let before = applied_apart(&mut console);
    a.send(&query("insert into t_gone values (1)"));
    let e = a.error_or_eof().expect("the insert ran without its role");
    assert!(e.message.contains("r_gone"), "{e:?}");
    assert_eq!(
        applied_apart(&mut console),
        before,
        "the state query ran apart"
    );
    assert_eq!(pg.psql("select count(*) from t_gone"), "0");
    // The server is gone with the failure; b is served on a fresh one.
    assert_eq!(b.query_one("select current_user"), "postgres");
}

/// Transaction blocks of clients with state of their own, as drivers that are not in
/// autocommit send them: BEGIN as a Query of its own (psycopg, Django, Active Record,
/// node-postgres), or BEGIN parsed and run in front of the first statement up to one Sync
/// (pgJDBC). The state goes in the same write as BEGIN: a hand-over costs no round trip
/// of its own, and every row PostgreSQL stores carries its client's search_path.
#[test]
fn a_block_with_state_costs_no_round_trip_of_its_own() {
    let (pg, log, weir) = proxied();
    pg.exec("create table blocks (turn int, seen text)");
    let mut clients = two_that_ran(&weir);
    let mut console = admin(&weir);
    let before = applied_apart(&mut console);
    log.lock().unwrap().clear();
    let turns = 8;
    let insert =
        |turn: usize| format!("insert into blocks values ({turn}, current_setting('search_path'))");
    let mut expected_bursts = 0;
    for turn in 0..turns {
        let (c, _) = &mut clients[turn % 2];
        if turn % 4 < 2 {
            for sql in ["BEGIN".to_string(), insert(turn), "COMMIT".to_string()] {
                c.simple_query(&sql)
                    .unwrap_or_else(|e| panic!("turn {turn}: {sql}: {e:?}"));
            }
            expected_bursts += 3;
        } else {
            c.send(
                &[
                    parse("", "BEGIN"),
                    bind("", "", &[]),
                    execute("", 0),
                    parse("", &insert(turn)),
                    bind("", "", &[]),
                    execute("", 0),
                    sync(),
                ]
                .concat(),
            );
            let msgs = c.read_until_ready();
            assert!(
                msgs.iter().all(|m| m.tag != b'E')
                    && msgs.last().map(|m| m.body.clone()) == Some(b"T".to_vec()),
                "turn {turn}: {msgs:?}"
            );
            c.simple_query("COMMIT").expect("commit");
            expected_bursts += 2;
        }
    }
    let bursts = bursts_to_pg(&log.lock().unwrap());
    let shown: Vec<String> = bursts
        .iter()
        .map(|b| String::from_utf8_lossy(b).into_owned())
        .collect();
    assert_eq!(bursts.len(), expected_bursts, "round trips: {shown:?}");
    let firsts = bursts
        .iter()
        .filter(|b| contains(b, "SET \"search_path\" TO"))
        .count();
    assert_eq!(firsts, turns, "the state went with each BEGIN: {shown:?}");
    assert_eq!(applied_apart(&mut console), before, "state applied apart");
    let rows = pg.psql("select string_agg(turn || '=' || seen, ';' order by turn) from blocks");
    let want: Vec<String> = (0..turns)
        .map(|t| format!("{t}=s_{}, public", ["a", "b"][t % 2]))
        .collect();
    assert_eq!(rows, want.join(";"));
}

/// Clients with state of their own that SET their search_path at each turn, as a
/// schema-per-tenant app does at each checkout: the state goes in front of the SET, the
/// read-back behind it, all in one write; the query after it needs no state, since the
/// server is the client's already. Two round trips per turn, and each answer right.
#[test]
fn a_set_with_state_in_front_and_its_read_back_behind_is_one_write() {
    let (_pg, log, weir) = proxied();
    let mut clients = two_that_ran(&weir);
    let mut console = admin(&weir);
    let before = applied_apart(&mut console);
    log.lock().unwrap().clear();
    let turns = 8;
    for turn in 0..turns {
        let name = ["a", "b"][turn % 2];
        let (c, _) = &mut clients[turn % 2];
        c.simple_query(&format!("SET search_path TO s_{name}_{turn}, public"))
            .expect("set");
        assert_eq!(
            c.query_one(ASK),
            format!("s_{name}_{turn}, public/app_{name}")
        );
    }
    let bursts = bursts_to_pg(&log.lock().unwrap());
    let shown: Vec<String> = bursts
        .iter()
        .map(|b| String::from_utf8_lossy(b).into_owned())
        .collect();
    assert_eq!(bursts.len(), 2 * turns, "round trips: {shown:?}");
    for turn in 0..turns {
        let b = &bursts[2 * turn];
        assert!(
            contains(b, "BEGIN\0") && contains(b, "SET search_path TO s_"),
            "turn {turn}: the state did not go with the SET: {shown:?}"
        );
    }
    assert_eq!(applied_apart(&mut console), before, "state applied apart");
}

/// A block opened by extended-protocol messages and closed by a Query of SETs with no
/// Sync between them (one request): the state goes in front, its answers are removed,
/// and the client gets exactly its own answers; no read-back is written behind a request
/// that opened a block.
#[test]
fn an_extended_begin_then_a_query_of_sets_gets_its_own_answers() {
    let (_pg, _log, weir) = proxied();
    let mut clients = two_with_state(&weir);
    for round in 0..3 {
        for (i, (c, want)) in clients.iter_mut().enumerate() {
            let mem = format!("{}MB", 8 + round * 2 + i);
            c.send(
                &[
                    parse("", "BEGIN"),
                    bind("", "", &[]),
                    execute("", 0),
                    query(&format!("SET work_mem = '{mem}'")),
                ]
                .concat(),
            );
            let msgs = c.read_until_ready();
            let tags: String = msgs.iter().map(|m| m.tag_char()).collect();
            assert_eq!(tags, "12CCZ", "round {round}, client {i}: {msgs:?}");
            assert_eq!(msgs[4].body, b"T", "{msgs:?}");
            assert_eq!(c.query_one("show work_mem"), mem);
            c.simple_query("COMMIT").expect("commit");
            assert_eq!(&c.query_one(ASK), want);
            assert_eq!(c.query_one("show work_mem"), mem);
        }
    }
}

/// What could end the block a failed state query leaves (COMMIT, ROLLBACK first), and
/// several requests written at once, take the state query apart, a round trip of its own.
#[test]
fn requests_that_could_end_the_block_take_the_state_apart() {
    let (_pg, _log, weir) = proxied();
    let mut clients = two_with_state(&weir);
    let mut console = admin(&weir);
    let requests = [
        query("COMMIT"),
        query("/* a comment */ ROLLBACK; BEGIN; COMMIT"),
        [query("BEGIN"), query("COMMIT")].concat(),
        [
            parse("", "ROLLBACK"),
            bind("", "", &[]),
            execute("", 0),
            sync(),
        ]
        .concat(),
    ];
    for (n, request) in requests.iter().enumerate() {
        let (c, want) = &mut clients[n % 2];
        let before = applied_apart(&mut console);
        c.send(request);
        let readies = if n == 2 { 2 } else { 1 };
        for _ in 0..readies {
            let msgs = c.read_until_ready();
            assert!(msgs.iter().all(|m| m.tag != b'E'), "request {n}: {msgs:?}");
        }
        assert_eq!(applied_apart(&mut console), before + 1, "request {n}");
        assert_eq!(&c.query_one(ASK), want);
    }
}

/// The state cannot be put on the server (the role the clients set is dropped): a block
/// sent behind the failed state query never runs, as a Query of BEGIN alone, as one Query
/// of the whole block, and as extended-protocol messages up to a Sync.
#[test]
fn a_failed_state_query_keeps_the_block_from_running() {
    let pg = PgServer::start();
    pg.exec("create role r_gone2; grant all on schema public to r_gone2;");
    pg.exec("create table t_gone2 (v int); grant all on t_gone2 to r_gone2;");
    let weir = pooled(&pg, 1);
    let mut gone: Vec<RawConn> = (0..5)
        .map(|_| {
            let mut a = client(&weir);
            a.simple_query("SET ROLE r_gone2").expect("set role");
            assert_eq!(a.query_one("select current_user"), "r_gone2");
            a
        })
        .collect();
    let mut b = client(&weir);
    assert_eq!(b.query_one("select current_user"), "postgres");
    pg.exec("drop owned by r_gone2; drop role r_gone2;");
    let mut console = admin(&weir);
    let before = applied_apart(&mut console);
    let requests = [
        query("BEGIN"),
        query("begin; insert into t_gone2 values (1); commit"),
        [
            parse("", "START TRANSACTION"),
            bind("", "", &[]),
            execute("", 0),
            parse("", "insert into t_gone2 values (2)"),
            bind("", "", &[]),
            execute("", 0),
            parse("", "COMMIT"),
            bind("", "", &[]),
            execute("", 0),
            sync(),
        ]
        .concat(),
        // Had it run as the login role, the insert below would see its search_path.
        query("SET search_path TO gone_path, public"),
        // Two requests in one write: the state query runs apart first.
        [query("BEGIN"), query("insert into t_gone2 values (3)")].concat(),
    ];
    for (a, request) in gone.iter_mut().zip(requests) {
        a.send(&request);
        let e = a.error_or_eof().expect("the block ran without its role");
        assert!(e.message.contains("r_gone2"), "{e:?}");
        // Had the block run as the login role, its insert would be there now.
        assert_eq!(pg.psql("select count(*) from t_gone2"), "0");
        assert_eq!(b.query_one("select current_user"), "postgres");
    }
    assert_eq!(
        applied_apart(&mut console),
        before + 1,
        "only the two requests written at once take the state query apart"
    );
}

/// Named statements prepared and run by clients with their own application_name taking
/// turns on one server (Prisma's pattern: Parse/Describe/Sync, then Bind/Execute/Sync):
/// the state goes in front of either batch, and each client gets its own answers.
#[test]
fn named_statements_with_state_take_turns() {
    let pg = PgServer::start();
    let weir = pooled(&pg, 1);
    let mut clients: Vec<(RawConn, String)> = (0..3)
        .map(|i| {
            let app = format!("app_{i}");
            (named_client(&weir, &app), app)
        })
        .collect();
    for round in 0..3 {
        for (c, app) in clients.iter_mut() {
            let name = format!("s{round}");
            let sql = format!("select current_setting('application_name') || '{round}'");
            c.send(&[parse(&name, &sql), describe(b'S', &name), sync()].concat());
            let msgs = c.read_until_ready();
            let tags: Vec<u8> = msgs.iter().map(|m| m.tag).collect();
            assert_eq!(tags, b"1tTZ", "{app} round {round}: {msgs:?}");
            c.send(&[bind("", &name, &[]), execute("", 0), sync()].concat());
            let msgs = c.read_until_ready();
            let row = msgs
                .iter()
                .find(|m| m.tag == b'D')
                .unwrap_or_else(|| panic!("{app} round {round}: {msgs:?}"));
            assert_eq!(
                data_row(&row.body)[0].as_deref(),
                Some(format!("{app}{round}").as_str())
            );
        }
    }
}

/// Randomized, seeded: clients with settings of their own (application_name, search_path,
/// a custom setting), changed now and then, run plain inserts and selects (simple,
/// unnamed and named extended) at once on two servers with pipelining, so that states go
/// on the way in front of requests that run directly, are sent ahead and ride behind
/// others. Each insert records the settings PostgreSQL ran it with; at the end every row
/// must carry the settings its client had when it sent it, and every answered insert
/// must be there once. WEIR_STATE_WAY_SEED=n replays one seed.
#[test]
fn randomized_states_on_the_way_reach_postgresql_intact() {
    const CLIENTS: usize = 8;
    const STEPS: usize = 120;
    let pg = PgServer::start();
    pg.exec(
        "create table seen (client int, seq int, app text, path text, x text, \
         primary key (client, seq))",
    );
    let weir = Weir::for_pg(&pg)
        .set("pool_mode", "transaction")
        .set("default_pool_size", 2)
        .set("admin_users", "postgres")
        .start();
    let seeds: Vec<u64> = match std::env::var("WEIR_STATE_WAY_SEED") {
        Ok(s) => vec![s.parse().expect("WEIR_STATE_WAY_SEED is a number")],
        Err(_) => vec![1, 2],
    };
    for seed in seeds {
        pg.exec("truncate seen");
        let expected: Vec<Vec<(i32, [String; 3])>> = std::thread::scope(|s| {
            let handles: Vec<_> = (0..CLIENTS)
                .map(|i| {
                    let weir = &weir;
                    s.spawn(move || state_client(weir, seed, i, STEPS))
                })
                .collect();
            handles
                .into_iter()
                .map(|h| h.join().expect("client panicked"))
                .collect()
        });
        let rows = pg
            .psql("select client, seq, app, path, coalesce(x, '') from seen order by client, seq");
        let mut got: Vec<Vec<(i32, [String; 3])>> = vec![Vec::new(); CLIENTS];
        for line in rows.lines().filter(|l| !l.is_empty()) {
            let f: Vec<&str> = line.split('|').collect();
            let client: usize = f[0].parse().expect("client");
            got[client].push((
                f[1].parse().expect("seq"),
                [f[2].to_owned(), f[3].to_owned(), f[4].to_owned()],
            ));
        }
        for i in 0..CLIENTS {
            assert_eq!(
                got[i], expected[i],
                "seed {seed}, client {i}: rows PostgreSQL stored (seq, [application_name, \
                 search_path, myapp.x]) differ from what the client had set \
                 (replay with WEIR_STATE_WAY_SEED={seed})"
            );
        }
    }
    let stats = ok(&mut admin(&weir), "SHOW STATS");
    let on_the_way = stats.num("database", "postgres", "total_state_applied_count")
        - stats.num("database", "postgres", "total_state_round_trip_count");
    assert!(on_the_way > 0, "no state went on the way");
    assert!(
        stats.num("database", "postgres", "total_pipelined_count") > 0,
        "nothing was pipelined"
    );
}

/// One client of the randomized test: returns the rows it expects PostgreSQL to hold.
fn state_client(weir: &Weir, seed: u64, i: usize, steps: usize) -> Vec<(i32, [String; 3])> {
    let mut rng = common::rng::Rng::new(seed * 1000 + i as u64);
    let mut app = format!("c{i}");
    let mut c = named_client(weir, &app);
    let mut path = "\"$user\", public".to_owned();
    let mut x = String::new();
    let mut rows = Vec::new();
    let mut prepared = false;
    for seq in 0..steps as i32 {
        if rng.chance(12) {
            let k = rng.below(3);
            match rng.below(3) {
                0 => {
                    path = format!("s{i}_{k}, public");
                    c.simple_query(&format!("SET search_path TO {path}"))
                        .expect("set");
                }
                1 => {
                    app = format!("c{i}-{k}");
                    c.simple_query(&format!("SET application_name = '{app}'"))
                        .expect("set");
                }
                _ => {
                    x = format!("{i}.{k}");
                    c.simple_query(&format!("SELECT set_config('myapp.x', '{x}', false)"))
                        .expect("set_config");
                }
            }
        }
        let want = [app.clone(), path.clone(), x.clone()];
        if rng.chance(30) {
            let sql = "select current_setting('application_name'), \
                       current_setting('search_path'), current_setting('myapp.x', true)";
            let row = c.simple_query(sql).expect("select").remove(0);
            let row: Vec<String> = row.into_iter().map(Option::unwrap_or_default).collect();
            assert_eq!(row, want.to_vec(), "client {i}, step {seq}: what it sees");
            continue;
        }
        // Now and then a request that fails: the state written in front of it must stay
        // on the server all the same (the client behind, with the state the server is
        // taken to hold, gets no SET for it).
        let fails = rng.chance(8);
        let insert = format!(
            "insert into seen select {i}, {seq}, current_setting('application_name'), \
             current_setting('search_path'), current_setting('myapp.x', true){}",
            if fails { " || (1 / 0)::text" } else { "" }
        );
        // A failing one is not the named statement (prepared once, for the inserts).
        let form = match (fails, rng.below(4)) {
            (true, 2) => 3,
            (_, f) => f,
        };
        let msgs = match form {
            3 => {
                // A transaction block, a request at a time (BEGIN goes with the state).
                c.simple_query("BEGIN").expect("begin");
                c.send(&query(&insert));
                let msgs = c.read_until_ready();
                let end = if fails { "ROLLBACK" } else { "COMMIT" };
                c.simple_query(end).expect(end);
                msgs
            }
            0 => {
                c.send(&query(&insert));
                c.read_until_ready()
            }
            1 => {
                c.send(
                    &[
                        parse("", &insert),
                        bind("", "", &[]),
                        execute("", 0),
                        sync(),
                    ]
                    .concat(),
                );
                c.read_until_ready()
            }
            _ => {
                // A named statement with the step as its parameter.
                let sql = format!(
                    "insert into seen select {i}, $1::int, current_setting('application_name'), \
                     current_setting('search_path'), current_setting('myapp.x', true)"
                );
                let mut batch = Vec::new();
                if !prepared {
                    batch.extend(parse("ins", &sql));
                    prepared = true;
                }
                let arg = seq.to_string();
                batch.extend([bind("", "ins", &[Some(&arg)]), execute("", 0), sync()].concat());
                c.send(&batch);
                c.read_until_ready()
            }
        };
        let error = msgs
            .iter()
            .find(|m| m.tag == b'E')
            .map(|e| parse_error(&e.body));
        match error {
            Some(e) if fails && e.code == "22012" => continue,
            None if !fails => rows.push((seq, want)),
            other => panic!("client {i}, step {seq} (fails: {fails}): {other:?}"),
        }
    }
    rows
}

/// A request of SETs gets the read-back that follows it written behind it, in the same
/// write: the session is read without a round trip of its own, and the settings follow
/// the client to the next server it is lent. A statement_timeout too short for the
/// read-back (1 ms) still ends right: it is read back apart then.
#[test]
fn a_set_is_read_back_in_the_same_write() {
    let (_pg, log, weir) = proxied();
    let mut a = client(&weir);
    let mut b = client(&weir);
    assert_eq!(b.query_one("show search_path"), "\"$user\", public");
    log.lock().unwrap().clear();
    a.simple_query("SET search_path TO s_a, public")
        .expect("set");
    let bursts = bursts_to_pg(&log.lock().unwrap());
    let shown: Vec<String> = bursts
        .iter()
        .map(|b| String::from_utf8_lossy(b).into_owned())
        .collect();
    // The SET goes in front of b's state being taken off (one write, it is no plain
    // request: the sync runs apart), then SET and read-back together.
    let last = shown.last().expect("something was sent");
    assert!(
        last.contains("SET search_path TO s_a") && last.contains("current_setting"),
        "SET and read-back not in one write: {shown:?}"
    );
    assert!(
        !shown
            .iter()
            .any(|s| s.contains("current_setting") && !s.contains("SET search_path")),
        "a read-back went alone: {shown:?}"
    );
    assert_eq!(b.query_one("show search_path"), "\"$user\", public");
    assert_eq!(a.query_one("show search_path"), "s_a, public");
    a.simple_query("SET statement_timeout = 1").expect("set");
    assert_eq!(b.query_one("show statement_timeout"), "0");
    assert_eq!(a.query_one("show statement_timeout"), "1ms");
    assert_eq!(a.query_one("show search_path"), "s_a, public");
}

/// A client with state of its own cancels each request as soon as it is sent: the cancel
/// often reaches PostgreSQL while it still runs Weir's state query written in front of
/// the request (made slow to parse by a large custom setting). Whatever the cancel hits,
/// the client gets what a direct connection gives, the request's answer or ERROR 57014,
/// and keeps its connection; PostgreSQL holds each answered insert once and no cancelled
/// one; the client's state is whole on the server it gets next. Simple, extended and
/// BEGIN-led requests, and extended ones whose Sync comes after the cancel. About 4 s.
#[test]
fn a_cancel_that_hits_the_state_query_is_an_error_and_the_client_stays() {
    const ROUNDS: i32 = 24;
    let pg = PgServer::start();
    pg.exec("create table cancelled (id int, path text)");
    let weir = pooled(&pg, 1);
    let mut other = client(&weir);
    let set_state = |c: &mut RawConn| {
        c.simple_query("SET search_path TO s_cancel, public")
            .expect("set");
        c.simple_query("SELECT set_config('myapp.pad', repeat('x', 1 << 20), false)")
            .expect("set_config");
    };
    let mut a = client(&weir);
    set_state(&mut a);
    let (mut ran, mut refused, mut fatal) = (Vec::new(), Vec::new(), Vec::new());
    for id in 0..ROUNDS {
        // The server holds `other`'s state when `a` asks: `a`'s goes on the way.
        assert_eq!(other.query_one("show search_path"), DEFAULT_PATH);
        let insert = format!("insert into cancelled values ({id}, current_setting('search_path'))");
        let extended = [parse("", &insert), bind("", "", &[]), execute("", 0)].concat();
        let request = match id % 4 {
            0 => query(&insert),
            1 => [extended, sync()].concat(),
            2 => query(&format!("begin; {insert}; commit")),
            // Its Sync comes after the cancel.
            _ => extended,
        };
        let (pid, key) = a.key.expect("backend key");
        a.send(&request);
        let mut cancel = RawConn::connect(weir.port());
        cancel.send(&cancel_request(pid, key));
        if id % 4 == 3 {
            a.send(&sync());
        }
        let mut errors = Vec::new();
        let mut closed = false;
        loop {
            match a.read_message() {
                Ok(Some(m)) if m.tag == b'E' => errors.push(parse_error(&m.body)),
                Ok(Some(m)) if m.tag == b'Z' => break,
                Ok(Some(_)) => {}
                Ok(None) => {
                    closed = true;
                    break;
                }
                Err(e) => panic!("round {id}: no answer: {e}"),
            }
        }
        match (closed, errors.as_slice()) {
            (false, []) => ran.push(id),
            (false, [e]) if e.code == "57014" && e.severity == "ERROR" => refused.push(id),
            _ => {
                fatal.push((id, errors));
                a = client(&weir);
                set_state(&mut a);
            }
        }
        // Let the cancel connection end before the next round: a cancel still on its
        // way would hit the next request.
        assert!(
            cancel.closes(),
            "round {id}: the cancel connection stayed open"
        );
    }
    assert!(
        fatal.is_empty(),
        "{} of {ROUNDS} rounds ended the client or failed otherwise ({} ran, {} \
         cancelled): {fatal:?}",
        fatal.len(),
        ran.len(),
        refused.len()
    );
    let stored = pg.psql("select string_agg(id || '=' || path, ';' order by id) from cancelled");
    let want: Vec<String> = ran
        .iter()
        .map(|id| format!("{id}=s_cancel, public"))
        .collect();
    assert_eq!(
        stored,
        want.join(";"),
        "PostgreSQL holds exactly the answered inserts, once each, in the client's state"
    );
    assert_eq!(
        a.query_one(
            "select current_setting('search_path') || length(current_setting('myapp.pad'))"
        ),
        format!("s_cancel, public{}", 1 << 20)
    );
    eprintln!("{} ran, {} cancelled", ran.len(), refused.len());
}

/// Requests Weir cannot know the result of (set_config(), RESET ALL, DO, a failing
/// set_config()) sent as one whole implicit transaction on an idle server: their
/// read-back goes behind them in the same write, one round trip in all, and what it
/// read follows the client to its next server (another client used the server between).
/// A block in one Query still has its read-back apart. About 1 s.
#[test]
fn a_read_back_goes_behind_a_whole_implicit_transaction() {
    let (_pg, log, weir) = proxied();
    let mut a = named_client(&weir, "app_a");
    let mut b = client(&weir);
    let seen = "select coalesce(current_setting('myapp.x', true), '') || '/' || \
                coalesce(current_setting('myapp.y', true), '') || '/' || \
                current_setting('application_name') || '/' || current_setting('work_mem')";
    assert_eq!(b.query_one(seen), "//app/4MB");
    a.simple_query("SET application_name = 'changed'")
        .expect("set");
    // (request, whether it fails, bursts it takes, what `a` sees after it)
    let steps = [
        (
            "SELECT set_config('myapp.x', 'one', false)",
            false,
            1,
            "one//changed/4MB",
        ),
        (
            "DO $$ BEGIN PERFORM set_config('myapp.y', 'two', false); \
             PERFORM set_config('work_mem', '7MB', false); END $$",
            false,
            1,
            "one/two/changed/7MB",
        ),
        (
            "select set_config('myapp.x', 'lost', false), 1 / 0",
            true,
            1,
            "one/two/changed/7MB",
        ),
        ("RESET ALL", false, 1, "//app_a/4MB"),
        (
            "BEGIN; SELECT set_config('myapp.x', 'three', false); COMMIT",
            false,
            2,
            "three//app_a/4MB",
        ),
    ];
    for (request, fails, bursts, want) in steps {
        // The server holds a's state already: nothing goes in front of the request.
        a.query_one("select 1");
        log.lock().unwrap().clear();
        let r = a.simple_query(request);
        assert_eq!(r.is_err(), fails, "{request}: {r:?}");
        // A read-back apart runs after the client has its answer, before its next
        // request is sent.
        a.query_one("select 2");
        let mut sent: Vec<String> = bursts_to_pg(&log.lock().unwrap())
            .iter()
            .map(|b| String::from_utf8_lossy(b).into_owned())
            .collect();
        assert!(
            sent.pop().is_some_and(|s| s.contains("select 2")),
            "{request}: {sent:?}"
        );
        assert_eq!(sent.len(), bursts, "{request}: round trips {sent:?}");
        assert!(
            sent[0].contains(request) && sent.last().is_some_and(|s| s.contains("current_setting")),
            "{request}: request and read-back: {sent:?}"
        );
        assert_eq!(b.query_one(seen), "//app/4MB", "after {request}");
        assert_eq!(a.query_one(seen), want, "after {request}");
    }
}

/// The answers to `n` requests: rows, SQLSTATEs, command tags, statuses.
fn answers_of(c: &mut RawConn, n: usize) -> Vec<String> {
    let mut out = Vec::new();
    for _ in 0..n {
        for m in c.read_until_ready() {
            match m.tag {
                b'D' => out.push(format!("D{:?}", data_row(&m.body))),
                b'E' => out.push(format!("E{}", parse_error(&m.body).code)),
                b'C' => out.push(format!(
                    "C{}",
                    String::from_utf8_lossy(&m.body[..m.body.len() - 1])
                )),
                b'Z' => out.push(format!("Z{}", m.body[0] as char)),
                _ => {}
            }
        }
    }
    out
}

/// SQL EXECUTE of a protocol-level statement that is BEGIN (reachable with
/// max_prepared_statements = 0) opens a block: no read-back may go behind it (it would
/// run in the client's block, its guard taking the block's timeouts away).
#[test]
fn execute_of_a_protocol_begin_behind_read_back() {
    let pg = PgServer::start();
    let weir = Weir::builder()
        .database(
            "postgres",
            &format!("host=127.0.0.1 port={} dbname=postgres", pg.port()),
        )
        .set("pool_mode", "transaction")
        .set("default_pool_size", 1)
        .set("max_prepared_statements", 0)
        .start();
    let mut a = client(&weir);
    let mut d = RawConn::startup_minor(pg.port(), 0);
    for c in [&mut a, &mut d] {
        c.send(&[parse("s", "BEGIN"), sync()].concat());
        let _ = answers_of(c, 1);
    }
    let batch = [
        "SET statement_timeout = '1500ms'",
        "SELECT set_config('enable_seqscan', 'off', false); EXECUTE s",
        "SHOW statement_timeout",
        "SELECT current_setting('myapp.q')",
        "SELECT pg_catalog.txid_current_if_assigned() IS NULL",
        "COMMIT",
    ];
    for q in batch {
        a.send(&query(q));
        d.send(&query(q));
        let got = answers_of(&mut a, 1);
        let want = answers_of(&mut d, 1);
        eprintln!("{q}: weir {got:?} direct {want:?}");
        assert_eq!(got, want, "{q}");
    }
}
