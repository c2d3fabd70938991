//! Pipelined transaction pooling (issue 16), checked at random: many clients share a
//! small transaction pool, so that they queue and Weir writes a waiting client's request
//! behind the one in flight on a server. Each client runs a seeded random sequence of
//! operations through Weir and, in lockstep, on its own direct connection to an identical
//! database, and every reply must be the same: rows, row counts, errors (SQLSTATE and
//! message), session settings, prepared statements, transactions, cancels.
//!
//! Every operation touches only the client's own rows (ids `i * 1000 ..`) or static data,
//! so the answers do not depend on how the clients interleave. Three clients in four keep
//! the default session settings (Weir pipelines only to a server that has the waiter's
//! settings); the others SET, RESET and set_config their own. The seed is fixed (the
//! runs are reproducible as far as the interleaving allows); `WEIR_PIPE_SEED=<n>` runs
//! another one.
//!
//! A Cancel step through Weir may run whole in one case, which Weir must tell the client
//! of (a NoticeResponse) and log: the sleep began while Weir still had the client queued,
//! its request pipelined behind another's, with a third client's request written behind
//! it that Weir could not run again if the cancel reached PostgreSQL just after the sleep
//! ended (client::pipeline::cancel_behind). Such refusals are counted, must match Weir's
//! log, and must stay rare; the log of PostgreSQL shows whether any cancel hit another
//! client's statement. `WEIR_PIPE_LOG=<dir>` runs Weir with -v and keeps its log and
//! PostgreSQL's there.
//!
//! One difference is PostgreSQL's and is excused: a cancel request's second signal may
//! land on the next statement the backend runs (see `late_signals`), which behind a
//! pooler is another client's. The PostgreSQL log tells it from a cancel sent to the
//! wrong server, which fails the test.

// Tests run on their own runtime, which has a time driver (clippy.toml is for Weir's
// workers).
#![allow(clippy::disallowed_methods)]

mod common;

use common::console::*;
use common::rng::Rng;
use common::*;
use std::sync::Arc;
use std::time::{Duration, Instant};
use tokio::io::{AsyncReadExt, AsyncWriteExt, BufReader};
use tokio::net::TcpStream;
use tokio_postgres::types::{ToSql, Type};
use tokio_postgres::{Client, NoTls, Row, SimpleQueryMessage, Statement};

const CLIENTS: usize = 32;
const OPS: usize = 300;
const POOL: i64 = 2;
/// Rows each client owns at the start (ids `i * 1000 + 0 .. OWN_START`); its operations
/// use ids up to `OWN_RANGE`, so inserts sometimes collide and updates sometimes miss.
const OWN_START: i32 = 20;
const OWN_RANGE: i32 = 40;

fn base_seed() -> u64 {
    std::env::var("WEIR_PIPE_SEED")
        .ok()
        .and_then(|s| s.parse().ok())
        .unwrap_or(0x5eed_0016)
}

// ---------------------------------------------------------------------------
// Operations

#[derive(Clone, Debug)]
enum P {
    I(i32),
    T(String),
}

impl P {
    fn sql(&self) -> &(dyn ToSql + Sync) {
        match self {
            P::I(v) => v,
            P::T(s) => s,
        }
    }

    fn ty(&self) -> Type {
        match self {
            P::I(_) => Type::INT4,
            P::T(_) => Type::TEXT,
        }
    }
}

/// One request, as the client library sends it.
#[derive(Clone, Debug)]
enum Step {
    /// One simple-protocol Query (maybe several statements).
    Simple(String),
    /// `Client::query`: a named statement prepared, run and closed.
    Query(String, Vec<P>),
    /// `Client::execute`: the same, answering the row count.
    Execute(String, Vec<P>),
    /// `Client::query_typed`: the unnamed statement, Parse to Sync in one batch.
    Typed(String, Vec<P>),
    /// Prepares template `k`, kept for later `Run`s.
    Prepare(u64, String),
    /// Runs kept statement `n` with parameters.
    Run(usize, Vec<P>),
    /// Drops kept statement `n` (tokio-postgres sends Close).
    Forget(usize),
    /// A 2 s sleep cancelled through the client's cancel key once PostgreSQL shows it
    /// running, on both sides.
    Cancel { extended: bool, tag: String },
    /// Through Weir only: a 1 s sleep cancelled after `ms`, while it may still be queued or
    /// pipelined behind another client's request. Either outcome is fine for this client
    /// (cancelled, or run if the cancel came first); what matters is that no other client
    /// is hit, which their own comparisons check.
    EarlyCancel { ms: u64, tag: String },
    /// Through Weir only: another connection of the same client sends a query and leaves
    /// after `ms`, its request maybe still queued or pipelined behind another's; nothing of
    /// it may reach anyone else.
    Abandon { ms: u64 },
    /// On a raw connection, several requests in one write, as libpq's pipeline mode and
    /// batching drivers send them: `syncs` ReadyForQuery to wait for.
    Raw {
        bytes: Vec<u8>,
        syncs: usize,
        text: String,
    },
    /// On the raw connection: Parse/Bind/Describe/Execute and Flush, the answer read up to
    /// its CommandComplete or error, then the Sync: a request not whole until its Sync.
    RawFlush { sql: String, params: Vec<String> },
}

/// Extended-protocol statements with parameters, generated for client `i`.
const TEMPLATES: u64 = 12;

fn template(rng: &mut Rng, i: i32) -> (String, Vec<P>) {
    let k = rng.below(TEMPLATES);
    template_k(k, rng, i)
}

/// Template `k` with random parameters.
fn template_k(k: u64, rng: &mut Rng, i: i32) -> (String, Vec<P>) {
    let own = |rng: &mut Rng| P::I(i * 1000 + rng.int(0, OWN_RANGE - 1));
    match k {
        0 => (
            "select id::text, val::text, note from t where owner = $1 and id >= $2 order by id"
                .into(),
            vec![P::I(i), own(rng)],
        ),
        1 => (
            "select v from s where k = $1".into(),
            vec![P::I(rng.int(0, 120))],
        ),
        2 => (
            "update t set val = val + $2 where id = $1 returning id::text, val::text".into(),
            vec![own(rng), P::I(rng.int(-5, 5))],
        ),
        3 => (
            "insert into t (id, owner, val, note) values ($1, $2, $3, $4) returning id::text"
                .into(),
            vec![
                own(rng),
                P::I(i),
                P::I(rng.int(0, 99)),
                P::T(format!("x{}", rng.below(1000))),
            ],
        ),
        4 => (
            "delete from t where id = $1 returning id::text, note".into(),
            vec![own(rng)],
        ),
        5 => (
            "select ($1::int / $2::int)::text".into(),
            vec![P::I(rng.int(0, 100)), P::I(rng.int(0, 3))],
        ),
        6 => (
            "select current_setting($1)".into(),
            vec![P::T(
                rng.pick(&[
                    "search_path",
                    "application_name",
                    "DateStyle",
                    "statement_timeout",
                ])
                .to_string(),
            )],
        ),
        7 => ("select w from which".into(), vec![]),
        8 if plain(i) => template_k(6, rng, i),
        8 => {
            let (name, value) = setting(rng, i);
            (
                "select set_config($1, $2, false)".into(),
                vec![P::T(name.into()), P::T(value)],
            )
        }
        9 => (
            "select count(*)::text, coalesce(sum(val), 0)::text from t where owner = $1".into(),
            vec![P::I(i)],
        ),
        // Fails at Parse: the error comes before Bind, and the rest skips to the Sync.
        10 => (
            "select x::text from no_such_table where x = $1".into(),
            vec![P::I(i)],
        ),
        11 if rng.chance(30) => (
            "select length($1)::text, $2::text".into(),
            vec![
                P::T("z".repeat(rng.int(1000, 300_000) as usize)),
                P::I(i),
            ],
        ),
        _ => (
            "select to_char('2024-03-05 12:34:56'::timestamp, 'YYYY') || ' ' || '2024-03-05'::date::text"
                .into(),
            vec![],
        ),
    }
}

/// A session setting and a value for it.
fn setting(rng: &mut Rng, i: i32) -> (&'static str, String) {
    match rng.below(4) {
        0 => (
            "search_path",
            rng.pick(&[
                "sch_a, public",
                "sch_b, public",
                "public",
                "sch_b, sch_a, public",
            ])
            .to_string(),
        ),
        1 => ("application_name", format!("c{i}_{}", rng.below(100))),
        2 => (
            "DateStyle",
            rng.pick(&["SQL, DMY", "ISO, MDY", "German", "Postgres, YMD"])
                .to_string(),
        ),
        _ => (
            "statement_timeout",
            rng.pick(&["30s", "0", "1min", "45000"]).to_string(),
        ),
    }
}

/// One statement for the simple protocol: reads, writes of own rows, errors.
fn statement(rng: &mut Rng, i: i32) -> String {
    let id = i * 1000 + rng.int(0, OWN_RANGE - 1);
    match rng.below(20) {
        0 | 1 => format!("select id, val, note from t where owner = {i} order by id"),
        2 => format!(
            "select id, val from t where owner = {i} and id % 3 = {} order by id",
            rng.below(3)
        ),
        3 => {
            let a = rng.int(0, 100);
            format!("select k, v from s where k between {a} and {} order by k", a + 4)
        }
        4 | 5 => format!(
            "update t set val = val + {}, note = 'u{}' where id = {id} returning id, val, note",
            rng.int(-9, 9),
            rng.below(100)
        ),
        6 => format!(
            "insert into t values ({id}, {i}, {}, 'i{}') returning id",
            rng.below(100),
            rng.below(100)
        ),
        7 => format!("delete from t where id = {id}"),
        8 => format!("select count(*), sum(val) from t where owner = {i}"),
        9 => rng
            .pick(&[
                "show search_path",
                "show application_name",
                "show statement_timeout",
                "show DateStyle",
                "select current_setting('search_path'), current_setting('application_name')",
            ])
            .to_string(),
        10 => "select w from which".into(),
        11 => "select '2024-03-05 12:34:56'::timestamp::text, '2024-03-05'::date".into(),
        // Errors, about one statement in ten (they also abort transactions).
        12..=16 if rng.chance(60) => format!("select id from t where owner = {i} order by id limit 3"),
        12 => "select 1/0".into(),
        13 => "select * from no_such_table".into(),
        14 => "selec 1".into(),
        15 => "select 'abc'::int".into(),
        16 => format!("insert into t values ({}, {i}, 0, 'dup')", i * 1000),
        // Now and then longer than pipeline_slow_query (50 ms): nothing should be
        // pipelined behind it once it has run that long.
        17 if rng.chance(25) => "select pg_sleep(0.06)".into(),
        17 => format!("select pg_sleep(0.00{})", rng.int(1, 9)),
        18 => format!(
            "with u as (update t set val = val * 2 where owner = {i} and id % 5 = {} returning val) \
             select count(*), coalesce(sum(val), 0) from u",
            rng.below(5)
        ),
        // Large answers and large requests: more than a socket buffer, so that a request
        // goes behind another in several writes and answers arrive in pieces.
        19 if rng.chance(30) => format!(
            "select k, repeat(v, {}) from s where k < {} order by k",
            rng.int(1, 3000),
            rng.int(1, 40)
        ),
        19 if rng.chance(30) => format!(
            "select length('{}'), {i}",
            "y".repeat(rng.int(1000, 300_000) as usize)
        ),
        _ => format!("select {} + {}", rng.below(1000), rng.below(1000)),
    }
}

/// Whether client `i` keeps the default session settings (three clients in four). Weir
/// pipelines a request only to a server that already has the waiting client's settings:
/// with every client setting its own, little would be pipelined.
fn plain(i: i32) -> bool {
    i % 4 != 0
}

/// A session-changing statement (simple protocol); a read of a setting for a plain client.
fn session(rng: &mut Rng, i: i32) -> String {
    let (name, value) = setting(rng, i);
    if plain(i) {
        return match rng.below(2) {
            0 => format!("show {name}"),
            _ => format!("select current_setting('{name}')"),
        };
    }
    match rng.below(8) {
        0..=2 => format!("set {name} = '{value}'"),
        3 => format!("set {name} to '{value}'"),
        4 => format!("reset {name}"),
        5 => format!("select set_config('{name}', '{value}', false)"),
        6 => {
            if rng.chance(30) {
                "reset all".into()
            } else {
                // Outside a transaction: a warning and no effect, as on PostgreSQL.
                format!("set local {name} = '{value}'")
            }
        }
        _ => format!("show {name}"),
    }
}

/// Statements inside an explicit transaction.
fn in_transaction(rng: &mut Rng, i: i32) -> Step {
    match rng.below(12) {
        0..=3 => Step::Simple(statement(rng, i)),
        4 => Step::Simple(session(rng, i)),
        5 => {
            let (name, value) = setting(rng, i);
            Step::Simple(format!("set local {name} = '{value}'"))
        }
        6 => Step::Simple(
            rng.pick(&[
                "savepoint sp",
                "rollback to savepoint sp",
                "release savepoint sp",
            ])
            .to_string(),
        ),
        7 | 8 => {
            let (sql, ps) = template(rng, i);
            Step::Query(sql, ps)
        }
        9 => {
            let (sql, ps) = template(rng, i);
            Step::Typed(sql, ps)
        }
        10 => Step::Simple(format!("{}; {}", statement(rng, i), statement(rng, i))),
        _ => {
            let (sql, ps) = template(rng, i);
            Step::Execute(sql, ps)
        }
    }
}

/// The next operation of client `i`, which keeps prepared statements of the templates
/// `kept`: one or more steps, run in order.
fn operation(rng: &mut Rng, i: i32, kept: &[u64]) -> Vec<Step> {
    let roll = rng.below(1000);
    match roll {
        0..=34 => vec![raw(rng, i)],
        35..=39 => vec![Step::RawFlush {
            sql: "update t set val = val + $2 where id = $1 returning id, val".into(),
            params: vec![
                (i * 1000 + rng.int(0, OWN_RANGE - 1)).to_string(),
                rng.int(-3, 3).to_string(),
            ],
        }],
        40..=279 => vec![Step::Simple(statement(rng, i))],
        280..=359 => {
            let n = rng.int(2, 4);
            let parts: Vec<String> = (0..n)
                .map(|_| {
                    if rng.chance(25) {
                        session(rng, i)
                    } else {
                        statement(rng, i)
                    }
                })
                .collect();
            vec![Step::Simple(parts.join("; "))]
        }
        360..=459 => vec![Step::Simple(session(rng, i))],
        460..=589 => {
            let (sql, ps) = template(rng, i);
            vec![Step::Query(sql, ps)]
        }
        590..=629 => {
            let (sql, ps) = template(rng, i);
            vec![Step::Execute(sql, ps)]
        }
        630..=679 => {
            let (sql, ps) = template(rng, i);
            vec![Step::Typed(sql, ps)]
        }
        680..=719 if kept.len() < 6 => {
            let k = rng.below(TEMPLATES);
            vec![Step::Prepare(k, template_k(k, rng, i).0)]
        }
        720..=849 if !kept.is_empty() => {
            let n = rng.below(kept.len() as u64) as usize;
            vec![Step::Run(n, template_k(kept[n], rng, i).1)]
        }
        850..=864 if !kept.is_empty() => vec![Step::Forget(rng.below(kept.len() as u64) as usize)],
        865..=984 => transaction(rng, i),
        985..=988 => vec![Step::Cancel {
            extended: rng.chance(50),
            // Tells this query from other clients' in pg_stat_activity and in the log.
            tag: format!("c{i}_{}", rng.below(1 << 40)),
        }],
        989..=993 => vec![Step::EarlyCancel {
            ms: rng.below(30),
            tag: format!("e{i}_{}", rng.below(1 << 40)),
        }],
        994..=996 => vec![Step::Abandon { ms: rng.below(10) }],
        _ => vec![Step::Simple(statement(rng, i))],
    }
}

/// Requests sent in one write: extended batches each ending in Sync (an error skips only
/// to its Sync), several Executes under one Sync (one implicit transaction: an error
/// undoes the earlier ones), simple Queries.
fn raw(rng: &mut Rng, i: i32) -> Step {
    use common::proto;
    let mut bytes = Vec::new();
    let mut syncs = 0;
    let mut text = Vec::new();
    for _ in 0..rng.int(1, 4) {
        let n = rng.int(1, 3);
        let simple = rng.chance(25);
        let mut parts = Vec::new();
        for _ in 0..n {
            let id = i * 1000 + rng.int(0, OWN_RANGE - 1);
            let (sql, params): (String, Vec<String>) = match rng.below(6) {
                0 => (
                    "select id, val, note from t where owner = $1 order by id".into(),
                    vec![i.to_string()],
                ),
                1 => (
                    "update t set val = val + $2 where id = $1 returning id, val".into(),
                    vec![id.to_string(), rng.int(-3, 3).to_string()],
                ),
                2 => (
                    "insert into t values ($1, $2, 7, 'raw') returning id".into(),
                    vec![id.to_string(), i.to_string()],
                ),
                3 => (
                    "select $1::int / $2::int".into(),
                    vec![rng.int(0, 9).to_string(), rng.int(0, 2).to_string()],
                ),
                4 => (
                    "select v from s where k = $1".into(),
                    vec![rng.int(0, 99).to_string()],
                ),
                _ => ("select * from no_such_table".into(), vec![]),
            };
            if simple {
                // The same statement inline (parameters are numbers).
                let mut inline = sql.clone();
                for (n, p) in params.iter().enumerate().rev() {
                    inline = inline.replace(&format!("${}", n + 1), p);
                }
                parts.push(inline);
                continue;
            }
            let refs: Vec<Option<&str>> = params.iter().map(|p| Some(p.as_str())).collect();
            bytes.extend(proto::parse("", &sql));
            bytes.extend(proto::bind("", "", &refs));
            bytes.extend(proto::describe(b'P', ""));
            bytes.extend(proto::execute("", 0));
            text.push(format!("{sql} {params:?}"));
        }
        if simple {
            let q = parts.join("; ");
            bytes.extend(proto::query(&q));
            text.push(format!("Q {q}"));
        } else {
            bytes.extend(proto::sync());
            text.push("Sync".into());
        }
        syncs += 1;
    }
    Step::Raw {
        bytes,
        syncs,
        text: text.join(" | "),
    }
}

/// A raw protocol connection (tokio), logged in with trust.
struct RawSide {
    stream: BufReader<TcpStream>,
}

impl RawSide {
    async fn connect(port: u16, db: &str) -> RawSide {
        let stream = TcpStream::connect(("127.0.0.1", port))
            .await
            .unwrap_or_else(|e| panic!("raw connect to {db}: {e}"));
        let mut side = RawSide {
            stream: BufReader::new(stream),
        };
        let startup = common::proto::startup_message(&[("user", "postgres"), ("database", db)]);
        side.stream.get_mut().write_all(&startup).await.unwrap();
        loop {
            let (tag, body) = side.read().await.expect("raw login");
            assert_ne!(
                tag,
                b'E',
                "raw login to {db}: {}",
                String::from_utf8_lossy(&body)
            );
            if tag == b'Z' {
                return side;
            }
        }
    }

    async fn read(&mut self) -> std::io::Result<(u8, Vec<u8>)> {
        let tag = self.stream.read_u8().await?;
        let len = self.stream.read_u32().await? as usize;
        let mut body = vec![0; len.saturating_sub(4)];
        self.stream.read_exact(&mut body).await?;
        Ok((tag, body))
    }

    /// One extended request sent in two parts: up to a Flush, then (once its answer is
    /// in) the Sync.
    async fn run_flushed(&mut self, sql: &str, params: &[String]) -> String {
        use common::proto;
        let refs: Vec<Option<&str>> = params.iter().map(|p| Some(p.as_str())).collect();
        let mut first = proto::parse("", sql);
        first.extend(proto::bind("", "", &refs));
        first.extend(proto::describe(b'P', ""));
        first.extend(proto::execute("", 0));
        first.extend(proto::flush());
        if let Err(e) = self.stream.get_mut().write_all(&first).await {
            return format!("X write: {e}");
        }
        let mut out = Vec::new();
        loop {
            match self.read().await {
                Ok((b'C', body)) => {
                    out.push(format!("C[{}]", cstr(&body).0));
                    break;
                }
                Ok((b'E', body)) => {
                    let e = proto::parse_error(&body);
                    out.push(format!("E {} {}", e.code, e.message));
                    break;
                }
                Ok((tag, _)) => out.push((tag as char).to_string()),
                Err(e) => return format!("X read: {e}"),
            }
        }
        out.push(self.run(&proto::sync(), 1).await);
        out.join(" ")
    }

    /// Sends `bytes` in one write and renders every message up to the `syncs`-th
    /// ReadyForQuery (ParameterStatus left out: a pooler reports its own).
    async fn run(&mut self, bytes: &[u8], syncs: usize) -> String {
        if let Err(e) = self.stream.get_mut().write_all(bytes).await {
            return format!("X write: {e}");
        }
        let mut out = Vec::new();
        let mut seen = 0;
        while seen < syncs {
            let (tag, body) = match self.read().await {
                Ok(m) => m,
                Err(e) => {
                    out.push(format!("X read: {e}"));
                    break;
                }
            };
            out.push(match tag {
                b'S' => continue,
                b'Z' => {
                    seen += 1;
                    format!("Z{}", body.first().map_or('?', |&b| b as char))
                }
                b'D' => format!(
                    "D[{}]",
                    common::proto::data_row(&body)
                        .iter()
                        .map(|c| c.as_deref().unwrap_or("NULL"))
                        .collect::<Vec<_>>()
                        .join("|")
                ),
                b'T' => format!(
                    "T[{}]",
                    row_description(&body)
                        .iter()
                        .map(|(n, _)| n.as_str())
                        .collect::<Vec<_>>()
                        .join(",")
                ),
                b'C' => format!("C[{}]", cstr(&body).0),
                b'E' | b'N' => {
                    let e = common::proto::parse_error(&body);
                    format!("{} {} {}", tag as char, e.code, e.message)
                }
                t => (t as char).to_string(),
            });
        }
        out.join(" ")
    }
}

fn transaction(rng: &mut Rng, i: i32) -> Vec<Step> {
    let mut steps = vec![match rng.below(5) {
        0 => Step::Simple("begin".into()),
        1 => Step::Simple("start transaction isolation level repeatable read".into()),
        2 => Step::Execute("begin".into(), vec![]),
        3 => Step::Simple(format!("begin; {}", statement(rng, i))),
        _ => Step::Simple("BEGIN".into()),
    }];
    if rng.chance(10) {
        // A statement timeout that fires whatever the load: the same error on both sides.
        steps.push(Step::Simple("set local statement_timeout = '50ms'".into()));
        steps.push(Step::Simple("select pg_sleep(0.3)".into()));
    }
    for _ in 0..rng.int(1, 5) {
        steps.push(in_transaction(rng, i));
    }
    steps.push(match rng.below(6) {
        0 => Step::Simple("commit".into()),
        1 => Step::Simple("rollback".into()),
        2 => Step::Execute("commit".into(), vec![]),
        3 => Step::Execute("rollback".into(), vec![]),
        4 => Step::Simple("end".into()),
        _ => Step::Simple("abort".into()),
    });
    steps
}

// ---------------------------------------------------------------------------
// Replies, rendered as text to compare

fn err_text(e: &tokio_postgres::Error) -> String {
    match e.as_db_error() {
        Some(d) => format!("E {} {}", d.code().code(), d.message()),
        None => format!("X {e}"),
    }
}

fn simple_text(r: Result<Vec<SimpleQueryMessage>, tokio_postgres::Error>) -> String {
    match r {
        Ok(msgs) => msgs
            .iter()
            .map(|m| match m {
                SimpleQueryMessage::Row(row) => format!(
                    "R[{}]",
                    (0..row.len())
                        .map(|c| short(row.get(c).unwrap_or("NULL")))
                        .collect::<Vec<_>>()
                        .join("|")
                ),
                SimpleQueryMessage::CommandComplete(n) => format!("C{n}"),
                SimpleQueryMessage::RowDescription(cols) => format!(
                    "T[{}]",
                    cols.iter().map(|c| c.name()).collect::<Vec<_>>().join(",")
                ),
                _ => "?".into(),
            })
            .collect::<Vec<_>>()
            .join(" "),
        Err(e) => err_text(&e),
    }
}

fn rows_text(r: Result<Vec<Row>, tokio_postgres::Error>) -> String {
    match r {
        Ok(rows) => {
            let mut out = Vec::new();
            if let Some(first) = rows.first() {
                let names: Vec<&str> = first.columns().iter().map(|c| c.name()).collect();
                out.push(format!("T[{}]", names.join(",")));
            }
            for row in &rows {
                let vals: Vec<String> = (0..row.len())
                    .map(|c| match row.try_get::<_, Option<String>>(c) {
                        Ok(Some(s)) => short(&s).into_owned(),
                        Ok(None) => "NULL".into(),
                        Err(_) => format!("<{}>", row.columns()[c].type_()),
                    })
                    .collect();
                out.push(format!("R[{}]", vals.join("|")));
            }
            out.push(format!("n={}", rows.len()));
            out.join(" ")
        }
        Err(e) => err_text(&e),
    }
}

/// A step as printed: long texts cut.
fn brief(step: &Step) -> String {
    let text = match step {
        Step::Raw { syncs, text, .. } => format!("Raw ({syncs} syncs): {text}"),
        Step::RawFlush { sql, params } => format!("RawFlush: {sql} {params:?}"),
        _ => format!("{step:?}"),
    };
    match text.char_indices().nth(400) {
        Some((at, _)) => format!("{}... ({} bytes)", &text[..at], text.len()),
        None => text,
    }
}

/// A long value as its length and a hash (the replies are printed on a mismatch).
fn short(v: &str) -> std::borrow::Cow<'_, str> {
    if v.len() <= 200 {
        return v.into();
    }
    let mut h: u64 = 0xcbf2_9ce4_8422_2325;
    for b in v.bytes() {
        h = (h ^ u64::from(b)).wrapping_mul(0x0100_0000_01b3);
    }
    format!("<{} bytes, fnv {h:016x}>", v.len()).into()
}

fn is_cancelled(reply: &str) -> bool {
    reply == "E 57014 canceling statement due to user request"
}

// ---------------------------------------------------------------------------
// Running a client

/// One side (through Weir or direct) of a client.
struct Side {
    client: Client,
    port: u16,
    db: &'static str,
    kept: Vec<Statement>,
    /// Opened at the first `Step::Raw`.
    raw: Option<RawSide>,
    /// The notices the connection received (Weir's side only).
    notices: Arc<std::sync::Mutex<Vec<String>>>,
}

impl Side {
    /// How many of the notices received since last asked say a cancel was not forwarded.
    fn take_refusals(&self) -> usize {
        let mut n = self.notices.lock().unwrap_or_else(|p| p.into_inner());
        let refused = n.iter().filter(|m| m.starts_with(REFUSED)).count();
        n.clear();
        refused
    }

    async fn step(&mut self, step: &Step, monitor: &Client) -> String {
        let fut = self.step_inner(step, monitor);
        match tokio::time::timeout(TIMEOUT, fut).await {
            Ok(r) => r,
            Err(_) => format!("TIMEOUT after {TIMEOUT:?}"),
        }
    }

    async fn step_inner(&mut self, step: &Step, monitor: &Client) -> String {
        let c = &self.client;
        match step {
            Step::Simple(sql) => simple_text(c.simple_query(sql).await),
            Step::Query(sql, ps) => {
                let refs: Vec<_> = ps.iter().map(P::sql).collect();
                rows_text(c.query(sql.as_str(), &refs).await)
            }
            Step::Execute(sql, ps) => {
                let refs: Vec<_> = ps.iter().map(P::sql).collect();
                match c.execute(sql.as_str(), &refs).await {
                    Ok(n) => format!("n={n}"),
                    Err(e) => err_text(&e),
                }
            }
            Step::Typed(sql, ps) => {
                let typed: Vec<_> = ps.iter().map(|p| (p.sql(), p.ty())).collect();
                rows_text(c.query_typed(sql, &typed).await)
            }
            Step::Prepare(_, sql) => match c.prepare(sql).await {
                Ok(st) => {
                    let text = format!("prepared {:?}", st.params());
                    self.kept.push(st);
                    text
                }
                Err(e) => err_text(&e),
            },
            Step::Run(n, ps) => {
                let refs: Vec<_> = ps.iter().map(P::sql).collect();
                rows_text(c.query(&self.kept[*n], &refs).await)
            }
            Step::Forget(n) => {
                self.kept.remove(*n);
                "forgotten".into()
            }
            Step::Cancel { extended, tag } => {
                let sql = &format!("select pg_sleep(2) /* {tag} */");
                let token = c.cancel_token();
                // Prepared first: its Parse shows in pg_stat_activity as the query text
                // too, and a cancel sent then would reach the server after the Parse, when
                // it may serve another client.
                let prepared = match extended {
                    true => match c.prepare(sql).await {
                        Ok(st) => Some(st),
                        Err(e) => return err_text(&e),
                    },
                    false => None,
                };
                let query = async {
                    if let Some(st) = &prepared {
                        rows_text(c.query(st, &[]).await)
                    } else {
                        simple_text(c.simple_query(sql).await)
                    }
                };
                let db = self.db;
                tokio::pin!(query);
                let seen = tokio::select! {
                    // Ended before it was seen running: cancelled by a late signal (see
                    // `late_signals`), or not cancelled at all, which the reply shows.
                    reply = &mut query => return reply,
                    seen = eventually_async(TIMEOUT, || running(monitor, db, sql)) => seen,
                };
                if !seen {
                    return query.await + " (never seen running)";
                }
                if let Err(e) = token.cancel_query(NoTls).await {
                    return query.await + &format!(" (cancel request failed: {e})");
                }
                query.await
            }
            Step::Raw { .. } | Step::RawFlush { .. } => {
                if self.raw.is_none() {
                    self.raw = Some(RawSide::connect(self.port, self.db).await);
                }
                let Some(r) = &mut self.raw else {
                    unreachable!()
                };
                match step {
                    Step::Raw { bytes, syncs, .. } => r.run(bytes, *syncs).await,
                    Step::RawFlush { sql, params } => r.run_flushed(sql, params).await,
                    _ => unreachable!(),
                }
            }
            Step::Abandon { ms } => {
                let other = match connect(self.port, self.db, "postgres").await {
                    Ok(c) => c,
                    Err(e) => return format!("cannot connect: {e}"),
                };
                let sql = "select pg_sleep(0.005), k, v from s order by k";
                let _ =
                    tokio::time::timeout(Duration::from_millis(*ms), other.simple_query(sql)).await;
                drop(other);
                "ok".into()
            }
            Step::EarlyCancel { ms, tag } => {
                // Weir clears the client's link to its last server just after relaying
                // the last ReadyForQuery; a cancel sent before that reaches the server,
                // which may by then serve another client (the cancel protocol's own race,
                // a pooler's as much as PostgreSQL's). Not what this step is about.
                tokio::time::sleep(Duration::from_millis(30)).await;
                let token = c.cancel_token();
                let sql = format!("select pg_sleep(1) /* {tag} */");
                let query = c.simple_query(&sql);
                let cancel = async {
                    tokio::time::sleep(Duration::from_millis(*ms)).await;
                    token.cancel_query(NoTls).await.err()
                };
                let (reply, err) = tokio::join!(query, cancel);
                let reply = simple_text(reply);
                match err {
                    Some(e) => format!("{reply} (cancel request failed: {e})"),
                    // Cancelled, or run whole: both right for this client.
                    None if is_cancelled(&reply) => "ok (cancelled)".into(),
                    None if reply.starts_with("T[pg_sleep] R[]") => "ok (ran)".into(),
                    None => reply,
                }
            }
        }
    }
}

/// The start of the warning Weir gives a client whose cancel it did not forward, since
/// a request of another client's ran next behind its query and could not be run again
/// had the cancel hit it (client::checkout, CANCEL_REFUSED).
const REFUSED: &str = "cancel request not forwarded";

/// Whether `sql` is running in database `db`, as PostgreSQL shows it.
async fn running(monitor: &Client, db: &str, sql: &str) -> bool {
    let rows = monitor
        .query(
            "select count(*) from pg_stat_activity where datname = $1 and state = 'active' \
             and query = $2",
            &[&db, &sql],
        )
        .await
        .unwrap_or_else(|e| panic!("pg_stat_activity: {e:?}"));
    rows[0].get::<_, i64>(0) > 0
}

/// What the clients ran, to show that the mix covers what it should.
#[derive(Default)]
struct Tally {
    steps: usize,
    simple: usize,
    extended: usize,
    errors: usize,
    transactions: usize,
    cancels: usize,
    early_cancels: usize,
    abandoned: usize,
    /// Steps run again after a late signal cancelled them.
    retried: usize,
    /// Cancels Weir did not forward, telling the client (REFUSED).
    refused: usize,
}

impl Tally {
    fn count(&mut self, step: &Step, reply: &str) {
        self.steps += 1;
        match step {
            Step::Simple(sql) => {
                self.simple += 1;
                let sql = sql.to_ascii_lowercase();
                if sql.starts_with("begin") || sql.starts_with("start transaction") {
                    self.transactions += 1;
                }
            }
            Step::Execute(sql, _) if sql == "begin" => {
                self.extended += 1;
                self.transactions += 1;
            }
            Step::Cancel { .. } => self.cancels += 1,
            Step::EarlyCancel { .. } => self.early_cancels += 1,
            Step::Abandon { .. } => self.abandoned += 1,
            _ => self.extended += 1,
        }
        if reply.starts_with("E ") {
            self.errors += 1;
        }
    }

    fn add(&mut self, o: &Tally) {
        self.steps += o.steps;
        self.simple += o.simple;
        self.extended += o.extended;
        self.errors += o.errors;
        self.transactions += o.transactions;
        self.cancels += o.cancels;
        self.early_cancels += o.early_cancels;
        self.abandoned += o.abandoned;
        self.retried += o.retried;
        self.refused += o.refused;
    }
}

impl std::fmt::Display for Tally {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        write!(
            f,
            "{} steps: {} simple, {} extended, {} errors, {} transactions, {} cancels, {} early cancels, {} abandoned, {} run again after a late signal, {} cancels not forwarded",
            self.steps,
            self.simple,
            self.extended,
            self.errors,
            self.transactions,
            self.cancels,
            self.early_cancels,
            self.abandoned,
            self.retried,
            self.refused
        )
    }
}

struct Mismatch {
    client: usize,
    seed: u64,
    op: usize,
    step: Step,
    history: Vec<String>,
    weir: String,
    direct: String,
    /// The step was part of an explicit transaction (else it would have been run again).
    op_in_transaction: bool,
}

impl Mismatch {
    /// One side's statement was cancelled "due to user request" and the other's was not,
    /// in a step that asked for no cancel: a late signal (see `late_signals`) or a cancel
    /// Weir sent to the wrong server, which the PostgreSQL log tells apart.
    fn hit_by_a_cancel(&self) -> bool {
        !matches!(self.step, Step::Cancel { .. } | Step::EarlyCancel { .. })
            && is_cancelled(&self.weir) != is_cancelled(&self.direct)
            && self.op_in_transaction
    }
}

/// PostgreSQL (before 18) answers a cancel request with two SIGINTs, to the backend and
/// then to its process group (postmaster.c, signal_child); on a busy machine the process
/// sending them can be descheduled between the two, and the second lands later on
/// whatever the backend runs next. Straight to PostgreSQL, that is the same session's
/// idle time; behind a pooler, it may be another client's statement. Seen here 5-30 ms
/// after the first, with two cores shared by 70 processes.
///
/// Reads `log` (PostgreSQL's, with `%m [%p] %u@%d` prefixes): the number of cancels of
/// statements no client asked to cancel that follow another cancel on the same backend
/// within 500 ms (late signals), and the others (cancels no request explains).
fn late_signals(log: &str) -> (usize, Vec<String>) {
    let mut last: std::collections::HashMap<String, u64> = Default::default();
    let mut late = 0;
    let mut unexplained = Vec::new();
    let lines: Vec<&str> = log.lines().collect();
    for (n, line) in lines.iter().enumerate() {
        if !line.contains("ERROR:  canceling statement due to user request")
            || !line.contains("@rand_")
        {
            continue;
        }
        let f: Vec<&str> = line.split_whitespace().collect();
        let (Some(time), Some(pid)) = (f.get(1), f.get(3)) else {
            continue;
        };
        let ms = time
            .split(':')
            .map(|x| x.parse::<f64>().unwrap_or(0.0))
            .fold(0.0, |acc, x| acc * 60.0 + x);
        let ms = (ms * 1000.0) as u64;
        let statement = lines
            .get(n + 1)
            .filter(|l| l.contains(pid) && l.contains("STATEMENT:"))
            .copied()
            .unwrap_or("");
        let asked =
            statement.contains("pg_sleep(2) /* c") || statement.contains("pg_sleep(1) /* e");
        let after = last.insert(pid.to_string(), ms);
        if !asked {
            match after {
                Some(t) if ms.saturating_sub(t) <= 500 => late += 1,
                _ => unexplained.push(format!("{line}\n{statement}")),
            }
        }
    }
    (late, unexplained)
}

impl std::fmt::Display for Mismatch {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        writeln!(
            f,
            "client {} (seed {}), operation {}: {}\n  via weir: {}\n  direct:   {}\n  steps before (last 40):",
            self.client,
            self.seed,
            self.op,
            brief(&self.step),
            self.weir,
            self.direct
        )?;
        for h in &self.history {
            writeln!(f, "    {h}")?;
        }
        Ok(())
    }
}

/// Client `i`: the same random operations through Weir and direct, compared step by
/// step; stops at the first difference.
async fn run_client(
    i: usize,
    seed: u64,
    weir_port: u16,
    pg_port: u16,
    monitor: Arc<Client>,
) -> Result<Tally, Box<Mismatch>> {
    let connect_side = |port: u16, db: &'static str| async move {
        let notices = Arc::new(std::sync::Mutex::new(Vec::new()));
        Side {
            client: connect_noting(port, db, "postgres", notices.clone())
                .await
                .unwrap_or_else(|e| panic!("client {i} cannot connect to {db}: {e:?}")),
            port,
            db,
            kept: Vec::new(),
            raw: None,
            notices,
        }
    };
    let mut w = connect_side(weir_port, "rand_weir").await;
    let mut d = connect_side(pg_port, "rand_direct").await;
    let mut rng = Rng::new(seed);
    let mut history: Vec<String> = Vec::new();
    let mut tally = Tally::default();
    // The template of each statement both sides keep prepared.
    let mut kept: Vec<u64> = Vec::new();
    for op in 0..OPS {
        let steps = operation(&mut rng, i as i32, &kept);
        let alone = steps.len() == 1;
        for step in steps {
            let (mut weir, mut direct) = match &step {
                Step::EarlyCancel { .. } | Step::Abandon { .. } => {
                    let weir = w.step(&step, &monitor).await;
                    let direct = match weir.starts_with("ok") {
                        true => weir.clone(),
                        false => "ok".into(),
                    };
                    (weir, direct)
                }
                _ => tokio::join!(w.step(&step, &monitor), d.step(&step, &monitor)),
            };
            tally.count(&step, &weir);
            let refused = w.take_refusals();
            tally.refused += refused;
            // A cancel Weir did not forward, and told the client so (see REFUSED): the
            // query ran whole, as on a direct connection when the cancel comes too late.
            let refused_cancel = refused > 0
                && matches!(step, Step::Cancel { .. })
                && weir.starts_with("T[pg_sleep]")
                && is_cancelled(&direct);
            if refused_cancel {
                weir = format!("{direct} (through Weir: ran whole, the cancel refused)");
            }
            // A late signal (see `late_signals`) cancelled a step outside a transaction:
            // it left nothing behind, so it runs again on that side (the PostgreSQL log
            // must then show the late signal, checked at the end).
            let hit = !matches!(step, Step::Cancel { .. } | Step::EarlyCancel { .. })
                && is_cancelled(&weir) != is_cancelled(&direct);
            if hit && alone {
                tally.retried += 1;
                if is_cancelled(&weir) {
                    weir = w.step(&step, &monitor).await;
                } else {
                    direct = d.step(&step, &monitor).await;
                }
            }
            let cancel_ok =
                !matches!(step, Step::Cancel { .. }) || is_cancelled(&weir) || refused_cancel;
            if (weir != direct && !refused_cancel) || !cancel_ok {
                return Err(Box::new(Mismatch {
                    client: i,
                    seed,
                    op,
                    step,
                    history: history[history.len().saturating_sub(40)..].to_vec(),
                    weir,
                    direct,
                    op_in_transaction: !alone,
                }));
            }
            match &step {
                Step::Prepare(k, _) if weir.starts_with("prepared") => kept.push(*k),
                Step::Forget(n) => {
                    kept.remove(*n);
                }
                _ => {}
            }
            history.push(format!("op {op}: {} -> {weir}", brief(&step)));
        }
    }
    Ok(tally)
}

// ---------------------------------------------------------------------------
// The two databases and Weir

/// Two databases with the same content: `rand_direct`, and `rand_weir` copied from it.
fn databases(pg: &PgServer) {
    pg.exec("create database rand_direct");
    let mut sql = String::from(
        "create table t (id int primary key, owner int not null, val int not null, note text);\n\
         create table s (k int primary key, v text);\n\
         insert into s select k, 'v' || k from generate_series(0, 99) k;\n\
         create schema sch_a; create schema sch_b;\n\
         create table sch_a.which (w text); insert into sch_a.which values ('a');\n\
         create table sch_b.which (w text); insert into sch_b.which values ('b');\n\
         create table public.which (w text); insert into public.which values ('public');\n",
    );
    sql.push_str(&format!(
        "insert into t select c * 1000 + r, c, c + r, 'n' || r \
         from generate_series(0, {}) c, generate_series(0, {}) r;\n",
        CLIENTS - 1,
        OWN_START - 1
    ));
    common::psql_at(
        pg.socket_dir().to_str().unwrap(),
        pg.port(),
        "rand_direct",
        "postgres",
        None,
        &sql,
    )
    .unwrap_or_else(|e| panic!("filling rand_direct: {e}"));
    pg.exec("create database rand_weir template rand_direct");
}

fn admin(weir: &Weir) -> RawConn {
    RawConn::startup(weir.port(), "postgres", "pgbouncer", &[])
        .unwrap_or_else(|e| panic!("console login failed: {e:?}"))
}

/// Copies Weir's and PostgreSQL's logs to `dir` when dropped, whether the run passed
/// or not (`WEIR_PIPE_LOG`).
struct KeptLogs<'a> {
    dir: String,
    depth: u32,
    weir: &'a Weir,
    pg: &'a PgServer,
}

impl Drop for KeptLogs<'_> {
    fn drop(&mut self) {
        let (dir, depth) = (&self.dir, self.depth);
        let _ = std::fs::write(format!("{dir}/weir-{depth}.log"), self.weir.logfile());
        let _ = std::fs::write(format!("{dir}/weir-{depth}.err"), self.weir.stderr());
        let _ = std::fs::write(format!("{dir}/pg-{depth}.log"), self.pg.log());
    }
}

/// Runs all clients against a Weir whose `rand_weir` pool pipelines `depth` deep; the
/// number of pipelined requests SHOW STATS counted.
async fn run(depth: u32, per_database: bool) -> i64 {
    let started = Instant::now();
    let pg = PgServer::start();
    databases(&pg);
    let mut connstr = format!("host=127.0.0.1 port={} dbname=rand_weir", pg.port());
    let http = free_port();
    let mut builder = Weir::builder()
        .set("pool_mode", "transaction")
        .set("default_pool_size", POOL)
        .set("max_client_conn", 200)
        .set("admin_users", "postgres")
        .set("http_listen", format!("127.0.0.1:{http}"));
    if per_database {
        connstr.push_str(&format!(" pipeline_depth={depth}"));
    } else {
        builder = builder.set("pipeline_depth", depth);
    }
    let keep_log = std::env::var("WEIR_PIPE_LOG").ok();
    if keep_log.is_some() {
        builder = builder.arg("-v");
    }
    let weir = builder.database("rand_weir", &connstr).start();
    weir.wait_ready();
    let _kept = keep_log.map(|dir| KeptLogs {
        dir,
        depth,
        weir: &weir,
        pg: &pg,
    });

    let monitor = Arc::new(connect(pg.port(), "postgres", "postgres").await.unwrap());
    let base = base_seed() ^ (u64::from(depth) << 32);
    let tasks: Vec<_> = (0..CLIENTS)
        .map(|i| {
            let seed = base.wrapping_mul(1_000_003).wrapping_add(i as u64);
            tokio::spawn(run_client(i, seed, weir.port(), pg.port(), monitor.clone()))
        })
        .collect();
    let results = join_all_within(tasks, Duration::from_secs(120), "a client did not finish").await;
    let mut steps = Tally::default();
    let mut mismatches = Vec::new();
    for r in results {
        match r {
            Ok(t) => steps.add(&t),
            Err(m) => mismatches.push(m),
        }
    }
    let (late, unexplained) = late_signals(&pg.log());
    let (hit, real): (Vec<_>, Vec<_>) = mismatches
        .into_iter()
        .partition(|m| m.hit_by_a_cancel() && unexplained.is_empty());
    let first = real.iter().min_by_key(|m| m.op).map(|m| m.to_string());
    assert!(
        real.is_empty(),
        "{} of {CLIENTS} clients saw a reply through Weir differ from PostgreSQL's \
         (pipeline_depth {depth}; other clients: {steps}); the earliest:\n{}\nclients: {:?}\n\
         cancels no request explains: {unexplained:#?}",
        real.len(),
        first.unwrap_or_default(),
        real.iter().map(|m| (m.client, m.op)).collect::<Vec<_>>()
    );
    assert!(
        unexplained.is_empty(),
        "PostgreSQL cancelled statements no client asked to cancel: {unexplained:#?}"
    );

    // Each cancel not forwarded was Weir's decision, logged with its reason, and rare:
    // only for a query that started while Weir still had its client queued, with a
    // request behind it that could not run again (a regression refusing cancels
    // wholesale would show here).
    let logged = weir
        .logfile()
        .lines()
        .filter(|l| l.contains(REFUSED))
        .count();
    assert!(
        steps.refused <= logged && (steps.refused == logged || !hit.is_empty()),
        "clients were told of {} cancels not forwarded, Weir logged {logged}",
        steps.refused
    );
    assert!(
        steps.refused * 2 <= steps.cancels + steps.early_cancels,
        "too many cancels not forwarded: {steps}"
    );

    // Whatever ran must have left the same rows (but for clients stopped by a late signal).
    let stopped: Vec<String> = hit.iter().map(|m| m.client.to_string()).collect();
    let query = format!(
        "select id, owner, val, note from t where owner not in (-1{}) order by id",
        stopped.iter().map(|c| format!(", {c}")).collect::<String>()
    );
    let table = |db: &str| {
        common::psql_at(
            pg.socket_dir().to_str().unwrap(),
            pg.port(),
            db,
            "postgres",
            None,
            &query,
        )
        .unwrap()
    };
    assert!(
        table("rand_weir") == table("rand_direct"),
        "table t differs between rand_weir and rand_direct"
    );

    // The pool settled: nobody waits, no more servers than the pool holds.
    let mut a = admin(&weir);
    let settled = eventually(TIMEOUT, || {
        let pools = ok(&mut a, "SHOW POOLS");
        let n = |c: &str| pools.num("database", "rand_weir", c);
        n("cl_waiting") == 0
            && n("sv_active") + n("sv_idle") + n("sv_used") + n("sv_tested") + n("sv_login") <= POOL
    });
    assert!(
        settled,
        "the pool did not settle: {:#?}",
        ok(&mut a, "SHOW POOLS")
    );

    let stats = ok(&mut a, "SHOW STATS");
    let pipelined = match stats.cols.iter().any(|(n, _)| n == "total_pipelined_count") {
        true => stats.num("database", "rand_weir", "total_pipelined_count"),
        false => -1,
    };
    if pipelined >= 0 {
        // /metrics counts the same requests.
        let from_metrics = || {
            let body = http_get(http, "/metrics")
                .map(|r| r.body)
                .unwrap_or_default();
            body.lines()
                .filter(|l| l.starts_with("weir_pool_pipelined_requests_total{"))
                .filter(|l| l.contains("database=\"rand_weir\""))
                .find_map(|l| l.rsplit(' ').next()?.trim().parse::<f64>().ok())
        };
        assert!(
            eventually(TIMEOUT, || from_metrics() == Some(pipelined as f64)),
            "/metrics weir_pool_pipelined_requests_total for rand_weir is {:?}, SHOW STATS says {pipelined}",
            from_metrics()
        );
        // The pool settled: no one aboard; the depth in force, in both places.
        let pools = ok(&mut a, "SHOW POOLS");
        let shown = |c: &str| pools.num("database", "rand_weir", c);
        assert_eq!(
            (shown("cl_pipelined"), shown("pipeline_depth")),
            (0, depth as i64)
        );
        let gauge = |name: &str| {
            let body = http_get(http, "/metrics")
                .map(|r| r.body)
                .unwrap_or_default();
            body.lines()
                .filter(|l| l.starts_with(&format!("{name}{{")))
                .filter(|l| l.contains("database=\"rand_weir\""))
                .find_map(|l| l.rsplit(' ').next()?.trim().parse::<f64>().ok())
        };
        assert_eq!(gauge("weir_pool_client_pipelined"), Some(0.0));
        assert_eq!(gauge("weir_pool_pipeline_depth"), Some(depth as f64));
    }
    eprintln!(
        "pipeline_depth {depth}: {CLIENTS} clients, all replies equal ({steps}); \
         {pipelined} requests pipelined; {late} late cancel signals, which stopped clients \
         {stopped:?}; {:.1} s",
        started.elapsed().as_secs_f64()
    );
    pipelined
}

/// Default depth, set in [pgbouncer].
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn random_clients_see_what_postgres_answers_depth_1() {
    let pipelined = run(1, false).await;
    assert!(
        pipelined > 0,
        "no request was pipelined (SHOW STATS total_pipelined_count = {pipelined}; -1: no such column)"
    );
}

/// A deeper pipeline, set per database in the connection string.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn random_clients_see_what_postgres_answers_depth_3() {
    let pipelined = run(3, true).await;
    assert!(
        pipelined > 0,
        "no request was pipelined (SHOW STATS total_pipelined_count = {pipelined}; -1: no such column)"
    );
}

/// The log reading that tells PostgreSQL's late second signal from a cancel nobody asked
/// for: only a cancel within 500 ms after another on the same backend is excused.
#[test]
fn late_signals_are_told_from_stray_cancels() {
    let log = "\
2026-11-26 00:59:28.064 UTC [8871] postgres@rand_weir ERROR:  canceling statement due to user request
2026-11-26 00:59:28.064 UTC [8871] postgres@rand_weir STATEMENT:  select pg_sleep(2) /* c4_87 */
2026-11-26 00:59:28.100 UTC [8872] postgres@rand_weir ERROR:  division by zero
2026-11-26 00:59:28.122 UTC [8871] postgres@rand_weir ERROR:  canceling statement due to user request
2026-11-26 00:59:28.122 UTC [8871] postgres@rand_weir STATEMENT:  select pg_sleep(0.3)
2026-11-26 00:59:28.200 UTC [8872] postgres@rand_weir ERROR:  canceling statement due to user request
2026-11-26 00:59:28.200 UTC [8872] postgres@rand_weir STATEMENT:  select 1
2026-11-26 00:59:29.000 UTC [8871] postgres@rand_weir ERROR:  canceling statement due to user request
2026-11-26 00:59:29.000 UTC [8871] postgres@rand_weir STATEMENT:  select 2
2026-11-26 00:59:29.100 UTC [8873] postgres@postgres ERROR:  canceling statement due to user request
";
    let (late, unexplained) = late_signals(log);
    assert_eq!(late, 1);
    assert_eq!(unexplained.len(), 2, "{unexplained:#?}");
    assert!(unexplained[0].contains("select 1"));
    assert!(unexplained[1].contains("select 2"));
}
