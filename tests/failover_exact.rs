//! The failover acceptance test, counted exactly: a primary with a synchronous streaming
//! replica (so every commit acknowledged to a client is on the replica), Weir in
//! transaction mode over both with target_session_attrs=read-write, K clients looping
//! transactions (each on its one connection) and M idle clients. The primary dies under
//! load (immediate shutdown, or SIGKILL to all its processes) and the replica is promoted.
//! Then, exactly:
//! * no client lost its connection (each one's same connection runs on the new primary);
//! * every failure is SQLSTATE 08006 or 57P01, and leaves the client out of a transaction;
//! * only transactions that ran on the old primary failed: each started before the old
//!   primary was gone (usually one per client; see `several` for why not always);
//! * no acknowledged write is missing on the new primary, nothing never run is there, and
//!   the BEGIN..COMMIT blocks are whole;
//! * a failed transaction left nothing behind when it failed before its commit was asked
//!   for or when the client was told it was rolled back; a commit whose answer was lost
//!   has an unknown outcome (it may have committed and replicated) and is counted apart;
//! * every load client goes on succeeding on the new primary.

mod common;

use std::collections::{BTreeMap, BTreeSet};
use std::sync::atomic::{AtomicBool, AtomicUsize, Ordering};
use std::sync::Arc;
use std::thread::JoinHandle;
use std::time::{Duration, Instant};

use common::hosts::*;
use common::proto::query;
use common::*;

/// Load clients (one connection each, kept for the whole test).
const K: usize = 8;
/// Idle clients: connected and served before the kill, used again only after it.
const M: usize = 4;

/// The statement of a transaction a failure hit.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
enum Step {
    Begin,
    Insert,
    Update,
    /// The COMMIT of a BEGIN ... COMMIT block: whether it committed is unknown.
    Commit,
    /// A single-statement (autocommit) INSERT: whether it committed is unknown too.
    Single,
}

impl Failure {
    /// Whether the client was told its transaction was rolled back.
    fn claims_rollback(&self) -> bool {
        self.message.contains("rolled back") && !self.message.contains("unknown")
    }
}

impl Step {
    /// A failure before the commit was asked for: the transaction must be rolled back.
    fn before_commit(self) -> bool {
        matches!(self, Step::Begin | Step::Insert | Step::Update)
    }
}

#[derive(Debug)]
struct Failure {
    seq: i64,
    step: Step,
    code: String,
    message: String,
    /// The transaction status of the ReadyForQuery after the error.
    status: u8,
    started: Instant,
    at: Instant,
}

#[derive(Default)]
struct Record {
    /// Seqs whose transaction succeeded, with the kind of transaction ('b' block, 's' single).
    ok: BTreeMap<i64, char>,
    failures: Vec<Failure>,
    /// Successes that ended after `promote()` (pg_ctl promote -w and a check) returned.
    ok_after_promotion: usize,
    /// Longest a transaction took (a transaction waiting for the new primary).
    longest: Duration,
}

/// Runs one simple Query; the first error (if any) and the ReadyForQuery status.
fn run(c: &mut RawConn, sql: &str) -> (Result<(), ErrorFields>, u8) {
    c.send(&query(sql));
    let mut err = None;
    let mut status = 0;
    for m in c.read_until_ready() {
        match m.tag {
            b'E' if err.is_none() => err = Some(common::proto::parse_error(&m.body)),
            b'Z' => status = m.body.first().copied().unwrap_or(0),
            _ => {}
        }
    }
    (err.map_or(Ok(()), Err), status)
}

/// One load client: alternates BEGIN; INSERT; UPDATE; COMMIT blocks (each statement its
/// own Query) and single-statement INSERTs until `stop`, recording every outcome.
fn load(
    w: usize,
    mut c: RawConn,
    stop: Arc<AtomicBool>,
    promoted: Arc<AtomicBool>,
    ok_total: Arc<AtomicUsize>,
) -> (RawConn, Record) {
    let mut rec = Record::default();
    let mut seq = 0i64;
    while !stop.load(Ordering::SeqCst) {
        seq += 1;
        let started = Instant::now();
        let (kind, steps) = if seq % 2 == 0 {
            (
                'b',
                vec![
                    (Step::Begin, "begin".to_owned()),
                    (
                        Step::Insert,
                        format!("insert into t(worker, seq, kind) values ({w}, {seq}, 'b')"),
                    ),
                    (
                        Step::Update,
                        format!("update counters set n = n + 1 where worker = {w}"),
                    ),
                    (Step::Commit, "commit".to_owned()),
                ],
            )
        } else {
            (
                's',
                vec![(
                    Step::Single,
                    format!("insert into t(worker, seq, kind) values ({w}, {seq}, 's')"),
                )],
            )
        };
        let mut failed = None;
        for (step, sql) in steps {
            let (res, status) = run(&mut c, &sql);
            if let Err(e) = res {
                failed = Some(Failure {
                    seq,
                    step,
                    code: e.code,
                    message: e.message,
                    status,
                    started,
                    at: Instant::now(),
                });
                break;
            }
        }
        rec.longest = rec.longest.max(started.elapsed());
        match failed {
            Some(f) => {
                // A client told its transaction is gone must not be left inside one.
                if f.status != b'I' {
                    let _ = run(&mut c, "rollback");
                }
                rec.failures.push(f);
            }
            None => {
                rec.ok.insert(seq, kind);
                ok_total.fetch_add(1, Ordering::SeqCst);
                if promoted.load(Ordering::SeqCst) {
                    rec.ok_after_promotion += 1;
                }
            }
        }
    }
    (c, rec)
}

fn weir(entry: String) -> Weir {
    fast_checks()
        .set("query_wait_timeout", 30)
        .database("rw", &entry)
        .start()
}

/// A client whose read timeout outlasts query_wait_timeout: a transaction waiting for the
/// new primary is not a hang.
fn load_client(weir: &Weir) -> RawConn {
    let c = client(weir, "rw");
    c.set_read_timeout(Duration::from_secs(60));
    c
}

/// How the primary dies.
#[derive(Clone, Copy, Debug)]
enum Kill {
    /// `pg_ctl stop -m immediate`: backends are told 57P01 (as a WARNING) and exit; the
    /// shutdown takes some milliseconds, during which idle backends still answer.
    Immediate,
    /// SIGKILL to every process of the server (the postmaster stopped first): the
    /// connections just close, with no message.
    Sigkill,
}

#[test]
fn failover_under_load_immediate_shutdown() {
    failover_under_load(Kill::Immediate);
}

#[test]
fn failover_under_load_sigkill() {
    failover_under_load(Kill::Sigkill);
}

fn failover_under_load(kill: Kill) {
    let (mut primary, replica) = pair();
    let (p, r) = (primary.port(), replica.port());
    primary.exec(
        "create table t(worker int, seq bigint, kind text not null, primary key (worker, seq)); \
         create table counters(worker int primary key, n int not null default 0);",
    );
    primary.exec(&format!(
        "insert into counters(worker) select generate_series(0, {})",
        K - 1
    ));
    // Synchronous replication: a commit is acknowledged once the replica has flushed it,
    // so a promoted replica holds every acknowledged commit. (The harness's template turns
    // synchronous_commit off, for speed: without it the commits acknowledged in the last
    // milliseconds before the kill are lost, as seen in the first runs of this test.)
    primary.exec("alter system set synchronous_standby_names = '*'");
    primary.exec("alter system set synchronous_commit = on");
    primary.reload();
    let mut sync = String::new();
    assert!(
        eventually(Duration::from_secs(10), || {
            sync = primary.psql("select string_agg(sync_state, ',') from pg_stat_replication");
            sync.trim() == "sync"
        }),
        "the replica is not synchronous: {sync:?}"
    );
    // (Flushed there is not yet applied: wait until the replica shows the tables.)
    assert!(eventually(Duration::from_secs(10), || replica
        .try_psql("select count(*) from counters")
        .is_ok_and(|s| s.trim() == K.to_string())));

    let weir = weir(entry(&[p, r], "target_session_attrs=read-write"));
    let mut idle: Vec<RawConn> = (0..M).map(|_| client(&weir, "rw")).collect();
    for c in &mut idle {
        assert_eq!(c.query_one("select inet_server_port()"), p.to_string());
        assert_eq!(c.query_one("show synchronous_commit"), "on");
    }

    let stop = Arc::new(AtomicBool::new(false));
    let promoted = Arc::new(AtomicBool::new(false));
    let ok_total = Arc::new(AtomicUsize::new(0));
    let workers: Vec<JoinHandle<(RawConn, Record)>> = (0..K)
        .map(|w| {
            let c = load_client(&weir);
            let (stop, promoted, ok_total) = (stop.clone(), promoted.clone(), ok_total.clone());
            std::thread::spawn(move || load(w, c, stop, promoted, ok_total))
        })
        .collect();

    // Load on the primary first.
    assert!(
        eventually(Duration::from_secs(20), || ok_total.load(Ordering::SeqCst)
            >= 40 * K),
        "no load on the primary: {} transactions\n{}",
        ok_total.load(Ordering::SeqCst),
        weir.log_tail()
    );
    let killed_at = Instant::now();
    let ok_before_kill = ok_total.load(Ordering::SeqCst);
    match kill {
        Kill::Immediate => primary.stop_immediate(),
        Kill::Sigkill => primary.kill_hard(),
    }
    // Every process of the old primary is gone, and with it every connection to it.
    let down_at = Instant::now();
    std::thread::sleep(Duration::from_secs(1));
    replica.promote();
    let promote_done = Instant::now();
    promoted.store(true, Ordering::SeqCst);
    let ok_at_promotion = ok_total.load(Ordering::SeqCst);
    // Load goes on on the new primary for a while.
    assert!(
        eventually(Duration::from_secs(30), || ok_total.load(Ordering::SeqCst)
            >= ok_at_promotion + 40 * K),
        "load did not resume on the new primary: {} transactions since the promotion\n{}",
        ok_total.load(Ordering::SeqCst) - ok_at_promotion,
        weir.log_tail()
    );
    stop.store(true, Ordering::SeqCst);
    let mut results: Vec<(RawConn, Record)> = workers
        .into_iter()
        .enumerate()
        .map(|(w, h)| {
            h.join()
                .unwrap_or_else(|_| panic!("load client {w} panicked\n{}", weir.log_tail()))
        })
        .collect();

    // Every connection survived: the idle clients' and the load clients' own.
    for (i, c) in idle.iter_mut().enumerate() {
        let (res, _) = run(
            c,
            &format!("insert into t(worker, seq, kind) values (-1, {i}, 'i')"),
        );
        res.unwrap_or_else(|e| {
            panic!(
                "idle client {i} after the failover: {e:?}\n{}",
                weir.log_tail()
            )
        });
        assert_eq!(c.query_one("select inet_server_port()"), r.to_string());
    }
    for (w, (c, _)) in results.iter_mut().enumerate() {
        let port = c
            .simple_query("select inet_server_port()")
            .unwrap_or_else(|e| {
                panic!(
                    "load client {w} after the failover: {e:?}\n{}",
                    weir.log_tail()
                )
            });
        assert_eq!(port[0][0].as_deref(), Some(r.to_string().as_str()));
    }

    // Counts, for the record, before any assertion on them.
    let total_ok: usize = results.iter().map(|(_, rec)| rec.ok.len()).sum();
    let total_failed: usize = results.iter().map(|(_, rec)| rec.failures.len()).sum();
    let after: usize = results.iter().map(|(_, rec)| rec.ok_after_promotion).sum();
    let longest = results
        .iter()
        .map(|(_, rec)| rec.longest)
        .max()
        .unwrap_or_default();
    let mut unknown_committed = 0;
    let mut unknown_rolled_back = 0;
    let mut several = 0;
    let mut problems = Vec::new();
    for (w, (_, rec)) in results.iter().enumerate() {
        let rows = replica.psql(&format!(
            "select coalesce(string_agg(seq || ':' || kind, ',' order by seq), '') from t where worker = {w}"
        ));
        let present: BTreeMap<i64, char> = rows
            .trim()
            .split(',')
            .filter(|s| !s.is_empty())
            .map(|s| {
                let (seq, kind) = s.split_once(':').unwrap();
                (seq.parse().unwrap(), kind.chars().next().unwrap())
            })
            .collect();
        let counter: usize = replica
            .psql(&format!("select n from counters where worker = {w}"))
            .trim()
            .parse()
            .unwrap();
        for f in &rec.failures {
            eprintln!(
                "{kill:?} worker {w}: seq {} failed at {:?}, started {} and failed {:?} after the kill: {} {} (then status {})",
                f.seq,
                f.step,
                match f.started.checked_duration_since(killed_at) {
                    Some(d) => format!("{d:?} after the kill"),
                    None => format!("{:?} before the kill", killed_at - f.started),
                },
                f.at.duration_since(killed_at),
                f.code,
                f.message,
                f.status as char
            );
        }
        // Every acknowledged transaction is there.
        for seq in rec.ok.keys() {
            if !present.contains_key(seq) {
                problems.push(format!("worker {w}: acknowledged seq {seq} is lost"));
            }
        }
        let failed: BTreeSet<i64> = rec.failures.iter().map(|f| f.seq).collect();
        for f in &rec.failures {
            // Rolled back for sure: a failure before the commit was asked for, or one
            // whose message says so. Otherwise the commit's answer was lost: unknown.
            let rolled_back = f.step.before_commit() || f.claims_rollback();
            match (rolled_back, present.contains_key(&f.seq)) {
                (true, true) => problems.push(format!(
                    "worker {w}: seq {} failed at {:?} ({}) but its row is there",
                    f.seq, f.step, f.message
                )),
                (false, true) => unknown_committed += 1,
                (false, false) => unknown_rolled_back += 1,
                (true, false) => {}
            }
        }
        for seq in present.keys() {
            if !rec.ok.contains_key(seq) && !failed.contains(seq) {
                problems.push(format!("worker {w}: seq {seq} was never run but is there"));
            }
        }
        // The blocks are atomic: the counter moved once per block row present.
        let blocks = present.values().filter(|&&k| k == 'b').count();
        if counter != blocks {
            problems.push(format!(
                "worker {w}: counter {counter} but {blocks} block rows"
            ));
        }
        // Only transactions that ran on the old primary fail: each failed transaction
        // started before the old primary was gone. Not "one per client": the server's
        // processes do not all die at the same instant (an immediate shutdown takes
        // 20-90 ms here, SIGKILL to all of them 10-80 ms on 2 cores), so a client whose
        // transaction failed may start its next one on an idle backend that is still up,
        // then lose it too; that one was in flight on the dying server as well. Counted
        // as `several`.
        for f in &rec.failures {
            if f.started >= down_at {
                problems.push(format!(
                    "worker {w}: seq {} started {:?} after the old primary was gone, yet failed: {f:?}",
                    f.seq,
                    f.started.duration_since(down_at)
                ));
            }
        }
        if rec.failures.len() > 1 {
            several += 1;
        }
        for f in &rec.failures {
            if f.code != "08006" && f.code != "57P01" {
                problems.push(format!(
                    "worker {w}: failure with SQLSTATE {}: {f:?}",
                    f.code
                ));
            }
            if f.status != b'I' {
                problems.push(format!(
                    "worker {w}: status {} after the failure {f:?}",
                    f.status as char
                ));
            }
        }
        if rec.ok_after_promotion == 0 {
            problems.push(format!("worker {w}: nothing succeeded after the promotion"));
        }
    }
    eprintln!(
        "failover counted ({kill:?}, old primary gone {:?} after the kill): {K} load clients, {M} idle clients; {total_ok} transactions succeeded \
         ({ok_before_kill} before the kill, {after} after pg_ctl promote returned), {total_failed} failed \
         ({unknown_committed} of them with an unknown outcome committed, \
         {unknown_rolled_back} with an unknown outcome rolled back; {several} clients failed \
         more than once); longest transaction {longest:?}; promotion done {:?} after the kill",
        down_at.duration_since(killed_at),
        promote_done.duration_since(killed_at)
    );
    assert!(
        problems.is_empty(),
        "{}\n{}",
        problems.join("\n"),
        weir.log_tail()
    );
}
