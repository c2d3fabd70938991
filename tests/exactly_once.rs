//! Every request reaches PostgreSQL at most once, whatever happens around it: checked
//! through what PostgreSQL itself did (rows inserted by autocommit statements, each with
//! its own id, in a table with no unique key, so that a request run twice shows as two
//! rows), not through what clients were told.

// Tests run on their own runtime, which has a time driver (clippy.toml is for Weir's
// workers).
#![allow(clippy::disallowed_methods)]

mod common;

use std::collections::HashMap;
use std::time::Duration;

use common::proto::RawConn;
use common::rng::Rng;
use common::*;

/// The ids PostgreSQL holds in `table`, with how many rows each has.
fn ids_in(pg: &PgServer, table: &str) -> HashMap<i64, i64> {
    pg.psql(&format!("select id, count(*) from {table} group by id"))
        .lines()
        .filter_map(|l| {
            let (id, n) = l.split_once('|')?;
            Some((id.trim().parse().ok()?, n.trim().parse().ok()?))
        })
        .collect()
}

/// Five autocommit clients each insert one row with a sleep, on a pool of two whose
/// reserve opens after a second (issue 24's report: with psycopg 3, 7 rows instead of
/// 5). Waiters whose request was already pipelined behind a busy server's must not take
/// a reserve slot and send it again.
fn five_sleepy_inserts(mode: &str) {
    let pg = PgServer::start();
    pg.exec("create table sleepy (id int)");
    let weir = Weir::for_pg(&pg)
        .set("pool_mode", mode)
        .set("default_pool_size", 2)
        .set("reserve_pool_size", 2)
        .set("reserve_pool_timeout", 1)
        .start();
    for round in 0..2 {
        let clients: Vec<_> = (0..5)
            .map(|i| {
                let port = weir.port();
                let id = round * 10 + i;
                std::thread::spawn(move || {
                    let mut c = RawConn::startup(port, "postgres", "postgres", &[])
                        .unwrap_or_else(|e| panic!("login: {e:?}"));
                    let r =
                        c.simple_query(&format!("insert into sleepy select {id} from pg_sleep(2)"));
                    let _ = c.try_send(&common::proto::terminate());
                    r.map(|_| ())
                })
            })
            .collect();
        for c in clients {
            if let Err(e) = c.join().expect("client thread") {
                panic!("an insert failed: {e:?}\n{}", weir.log_tail());
            }
        }
        let seen = ids_in(&pg, "sleepy");
        let twice: Vec<_> = seen.iter().filter(|(_, &n)| n > 1).collect();
        assert!(
            twice.is_empty(),
            "round {round} ({mode} mode): PostgreSQL ran these inserts more than once: {twice:?}\n{}",
            weir.log_tail()
        );
        assert_eq!(seen.len(), 5 * (round as usize + 1), "rows: {seen:?}");
    }
}

#[test]
fn five_sleepy_inserts_run_once_in_transaction_mode() {
    five_sleepy_inserts("transaction");
}

#[test]
fn five_sleepy_inserts_run_once_in_statement_mode() {
    five_sleepy_inserts("statement");
}

// ---------------------------------------------------------------------------
// At random: many clients, few servers, and everything that can happen to a request.

/// What PostgreSQL must show for a request, from what its client was told.
#[derive(Clone, Copy, Debug, PartialEq)]
enum Fate {
    /// Answered with its CommandComplete: it ran, once.
    Ran,
    /// Refused before it was sent (query_wait_timeout), or cancelled (57014: an
    /// autocommit statement cancelled is rolled back): it left no row.
    NotRun,
    /// The client left, or its server was lost: it may have run, once at most.
    Unknown,
}

struct Outcome {
    id: i64,
    fate: Fate,
    what: &'static str,
    told: String,
}

impl Outcome {
    fn describe(&self) -> String {
        format!(
            "id {} ({}): told {}, so {:?}",
            self.id, self.what, self.told, self.fate
        )
    }
}

/// How a request ended for its client.
enum Answer {
    Done,
    Error(ErrorFields),
    /// The connection closed before ReadyForQuery (after an error, if one came).
    Closed(Option<ErrorFields>),
}

impl Answer {
    fn fate(&self) -> Fate {
        match self {
            Answer::Done => Fate::Ran,
            Answer::Error(e) | Answer::Closed(Some(e)) if not_run(e) => Fate::NotRun,
            _ => Fate::Unknown,
        }
    }

    fn closed(&self) -> bool {
        matches!(self, Answer::Closed(_))
            || matches!(self, Answer::Error(e) if e.severity == "FATAL")
    }

    fn told(&self) -> String {
        match self {
            Answer::Done => "ok".into(),
            Answer::Error(e) => format!("{} {}", e.code, e.message),
            Answer::Closed(e) => format!("closed after {e:?}"),
        }
    }
}

fn not_run(e: &ErrorFields) -> bool {
    e.code == "57014" || e.message.contains("query_wait_timeout")
}

/// Reads a request's answer up to its ReadyForQuery, or the close. A read that times out
/// is a hung client: the test fails.
fn answer(c: &mut RawConn, what: &str) -> Answer {
    let mut err = None;
    loop {
        match c.read_message() {
            Ok(Some(m)) if m.tag == b'E' => err = Some(common::proto::parse_error(&m.body)),
            Ok(Some(m)) if m.tag == b'Z' => {
                return match err {
                    Some(e) => Answer::Error(e),
                    None => Answer::Done,
                }
            }
            Ok(Some(_)) => {}
            Ok(None) => return Answer::Closed(err),
            Err(e) => panic!("a client hung: no answer to {what} ({e})"),
        }
    }
}

/// One round's settings, drawn from its seed.
struct Round {
    mode: &'static str,
    pool: u64,
    reserve: u64,
    depth: u64,
    query_wait_timeout: u64,
    kills: bool,
}

impl Round {
    fn draw(seed: u64) -> Round {
        let mut rng = Rng::new(seed);
        Round {
            mode: if rng.chance(75) {
                "transaction"
            } else {
                "statement"
            },
            pool: 1 + rng.below(3),
            reserve: rng.below(3),
            depth: 1 + rng.below(3),
            query_wait_timeout: *rng.pick(&[0, 1, 2]),
            kills: rng.chance(67),
        }
    }
}

const CLIENTS: u64 = 12;
const OPS: u64 = 30;

/// One client's seeded run of requests, each inserting its own id; what each client was
/// told goes to `out`.
fn client_run(port: u16, seed: u64, first_id: i64, out: &std::sync::Mutex<Vec<Outcome>>) {
    let mut rng = Rng::new(seed);
    let mut conn: Option<RawConn> = None;
    for op in 0..OPS as i64 {
        let id = first_id + op;
        let mut c = match conn.take() {
            Some(c) => c,
            None => match RawConn::startup(port, "postgres", "postgres", &[]) {
                Ok(c) => c,
                // Refused at login (a wait timed out): nothing was sent.
                Err(_) => continue,
            },
        };
        let sleep = *rng.pick(&["0", "0", "0.001", "0.005", "0.02"]);
        let insert = format!("insert into once select {id} from pg_sleep({sleep})");
        let roll = rng.below(100);
        let (what, reply) = match roll {
            0..=44 => {
                c.send(&common::proto::query(&insert));
                ("simple", Some(answer(&mut c, &insert)))
            }
            45..=59 => {
                let sql = "insert into once select $1::int from pg_sleep($2::float8)";
                let id_text = id.to_string();
                c.send(
                    &[
                        common::proto::parse("", sql),
                        common::proto::bind("", "", &[Some(&id_text), Some(sleep)]),
                        common::proto::execute("", 0),
                        common::proto::sync(),
                    ]
                    .concat(),
                );
                ("extended", Some(answer(&mut c, sql)))
            }
            60..=69 => {
                // Gone with its request in flight: queued, sent ahead, pipelined or running.
                c.send(&common::proto::query(&insert));
                std::thread::sleep(Duration::from_millis(rng.below(20)));
                let _ = c.stream.shutdown(std::net::Shutdown::Both);
                ("vanished mid-request", None)
            }
            70..=77 => {
                // Gone right after its answer, without Terminate.
                c.send(&common::proto::query(&insert));
                let a = answer(&mut c, &insert);
                let _ = c.stream.shutdown(std::net::Shutdown::Both);
                out.lock().unwrap().push(Outcome {
                    id,
                    fate: a.fate(),
                    what: "answered, then vanished",
                    told: a.told(),
                });
                continue;
            }
            78..=87 => {
                let slow = format!(
                    "insert into once select {id} from pg_sleep(0.{})",
                    rng.int(1, 3)
                );
                c.send(&common::proto::query(&slow));
                std::thread::sleep(Duration::from_millis(rng.below(150)));
                if let Some((pid, key)) = c.key {
                    let mut k = RawConn::connect(port);
                    let _ = k.try_send(&common::proto::cancel_request(pid, key));
                    let _ = k.closes();
                }
                ("cancelled", Some(answer(&mut c, &slow)))
            }
            88..=93 => {
                let block = format!("begin; {insert}; commit");
                c.send(&common::proto::query(&block));
                ("transaction block", Some(answer(&mut c, &block)))
            }
            _ => {
                // Holds a server long enough for others to queue past reserve_pool_timeout
                // and, with a pool of one, past query_wait_timeout.
                let long = format!("insert into once select {id} from pg_sleep(0.5)");
                c.send(&common::proto::query(&long));
                ("long", Some(answer(&mut c, &long)))
            }
        };
        let (fate, told) = match &reply {
            Some(a) => (a.fate(), a.told()),
            None => (Fate::Unknown, "left".into()),
        };
        out.lock().unwrap().push(Outcome {
            id,
            fate,
            what,
            told,
        });
        if reply.is_some_and(|a| !a.closed()) {
            conn = Some(c);
        }
    }
    if let Some(mut c) = conn {
        let _ = c.try_send(&common::proto::terminate());
    }
}

/// Ends or cancels active inserts now and then, straight on PostgreSQL, until `stop`.
fn killer(pg_port: u16, seed: u64, stop: &std::sync::atomic::AtomicBool) -> u64 {
    let mut rng = Rng::new(seed);
    let mut c = RawConn::startup(pg_port, "postgres", "postgres", &[])
        .unwrap_or_else(|e| panic!("killer login: {e:?}"));
    let mut kills = 0;
    while !stop.load(std::sync::atomic::Ordering::Relaxed) {
        std::thread::sleep(Duration::from_millis(100 + rng.below(300)));
        // Half the time a cancel none of the clients sent, as a late cancel for the
        // request in front looks to the one behind it (client::stray_cancel).
        let how = if rng.chance(50) {
            "pg_terminate_backend"
        } else {
            "pg_cancel_backend"
        };
        let rows = c
            .simple_query(&format!(
                "select {how}(pid) from (select pid from pg_stat_activity \
                 where query like 'insert into once%' and state = 'active' \
                 and pid <> pg_backend_pid() order by random() limit 1) s"
            ))
            .unwrap_or_else(|e| panic!("kill: {e:?}"));
        kills += rows.len() as u64;
    }
    kills
}

/// What Weir and PostgreSQL hold now, for a failure's message.
fn state_of(weir: &Weir, pg: &PgServer) -> String {
    let mut out = String::new();
    if let Ok(mut c) = RawConn::startup(weir.port(), "postgres", "pgbouncer", &[]) {
        for show in ["SHOW POOLS", "SHOW CLIENTS", "SHOW SERVERS"] {
            if let Ok(r) = common::console::run(&mut c, show) {
                let names: Vec<_> = r.cols.iter().map(|c| c.0.as_str()).collect();
                out.push_str(&format!("{show}: {names:?}\n"));
                for row in r.rows {
                    out.push_str(&format!("  {row:?}\n"));
                }
            }
        }
    }
    out + &pg.psql(
        "select pid, state, wait_event, left(query, 60) from pg_stat_activity \
         where backend_type = 'client backend'",
    )
}

fn seeds() -> Vec<u64> {
    let base = std::env::var("WEIR_ONCE_SEED")
        .ok()
        .and_then(|s| s.parse().ok())
        .unwrap_or(0x00a7_00ce);
    let rounds = std::env::var("WEIR_ONCE_ROUNDS")
        .ok()
        .and_then(|s| s.parse().ok())
        .unwrap_or(3);
    (0..rounds).map(|i| base + i).collect()
}

/// Rounds of `CLIENTS` clients on a small pool, each with its own seeded settings, check
/// after each that PostgreSQL ran no request twice, ran every one it answered, and none
/// refused or cancelled; that no client hung; and that Weir gave back every server.
#[test]
fn every_request_reaches_postgresql_at_most_once() {
    let pg = PgServer::start();
    pg.exec("create table once (id bigint)");
    for seed in seeds() {
        let r = Round::draw(seed);
        eprintln!(
            "seed {seed}: {} mode, pool {}+{}, depth {}, query_wait_timeout {}s, kills {}",
            r.mode, r.pool, r.reserve, r.depth, r.query_wait_timeout, r.kills
        );
        let weir = Weir::for_pg(&pg)
            .set("pool_mode", r.mode)
            .set("default_pool_size", r.pool)
            .set("reserve_pool_size", r.reserve)
            .set("reserve_pool_timeout", "0.3")
            .set("pipeline_depth", r.depth)
            .set("query_wait_timeout", r.query_wait_timeout)
            .set("admin_users", "postgres")
            .start();
        let first = (seed as i64 % 1_000) * 1_000_000;
        let outcomes = std::sync::Mutex::new(Vec::new());
        let stop = std::sync::atomic::AtomicBool::new(false);
        let kills = std::thread::scope(|s| {
            let killer = r.kills.then(|| s.spawn(|| killer(pg.port(), seed, &stop)));
            let clients: Vec<_> = (0..CLIENTS)
                .map(|i| {
                    let (port, outcomes) = (weir.port(), &outcomes);
                    let first_id = first + i as i64 * 1_000;
                    s.spawn(move || client_run(port, seed * 1_000 + i, first_id, outcomes))
                })
                .collect();
            let mut hung = Vec::new();
            for (i, c) in clients.into_iter().enumerate() {
                if let Err(e) = c.join() {
                    hung.push(format!("client {i}: {e:?}"));
                }
            }
            stop.store(true, std::sync::atomic::Ordering::Relaxed);
            let kills = killer.map_or(0, |k| k.join().expect("killer"));
            assert!(
                hung.is_empty(),
                "seed {seed}: {hung:?}\n{}\n{}",
                state_of(&weir, &pg),
                weir.log_tail()
            );
            kills
        });
        let outcomes = outcomes.into_inner().unwrap();
        let seen: HashMap<i64, i64> = ids_in(&pg, "once")
            .into_iter()
            .filter(|(id, _)| (first..first + 1_000_000).contains(id))
            .collect();
        let mut wrong = Vec::new();
        for (id, n) in &seen {
            if *n > 1 {
                let told = outcomes.iter().find(|o| o.id == *id).map(Outcome::describe);
                wrong.push(format!("id {id} ran {n} times ({told:?})"));
            }
        }
        for o in &outcomes {
            let n = seen.get(&o.id).copied().unwrap_or(0);
            let fine = match o.fate {
                Fate::Ran => n == 1,
                Fate::NotRun => n == 0,
                Fate::Unknown => n <= 1,
            };
            if !fine {
                wrong.push(format!("{}, but PostgreSQL has {n} rows", o.describe()));
            }
        }
        let count = |f: Fate| outcomes.iter().filter(|o| o.fate == f).count();
        let mut console = RawConn::startup(weir.port(), "postgres", "pgbouncer", &[])
            .unwrap_or_else(|e| panic!("console: {e:?}"));
        let pipelined = common::console::ok(&mut console, "SHOW STATS").num(
            "database",
            "postgres",
            "total_pipelined_count",
        );
        eprintln!(
            "seed {seed}: {kills} kills, {} ran, {} not run, {} unknown, {pipelined} pipelined",
            count(Fate::Ran),
            count(Fate::NotRun),
            count(Fate::Unknown),
        );
        assert!(
            wrong.is_empty(),
            "seed {seed} (WEIR_ONCE_SEED={seed} WEIR_ONCE_ROUNDS=1 reruns it):\n{}\n{}",
            wrong.join("\n"),
            weir.log_tail()
        );
        // Every server back in the pool or closed: none lent to a client that has gone,
        // none busy with a request nobody reads.
        let settled = eventually(TIMEOUT, || {
            let pools = common::console::ok(&mut console, "SHOW POOLS");
            ["cl_active", "cl_waiting", "sv_active"]
                .iter()
                .all(|c| pools.num("database", "postgres", c) == 0)
        });
        assert!(
            settled,
            "seed {seed}: servers or clients left busy: {:?}",
            common::console::ok(&mut console, "SHOW POOLS").rows
        );
        // A closed server's backend may take a moment to exit.
        let mut backends = 0;
        let within = eventually(TIMEOUT, || {
            backends = pg.count_backends_where("datname = 'postgres'");
            backends as u64 <= r.pool + r.reserve
        });
        assert!(
            within,
            "seed {seed}: PostgreSQL has {backends} backends for a pool of {}+{}",
            r.pool, r.reserve
        );
    }
}
