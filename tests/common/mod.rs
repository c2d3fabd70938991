//! Test harness shared by all integration tests.
//!
//! * [`PgServer`]: a scratch PostgreSQL server for one test (copied from a
//!   template cluster that is `initdb`-ed once per machine).
//! * [`Weir`]: the `weir` binary under test, started with a generated
//!   `pgbouncer.ini`.
//! * Client helpers: `tokio-postgres` connections, `psql`, `pgbench`, and a
//!   raw protocol client ([`proto::RawConn`]) to send arbitrary bytes.
//!
//! Every wait has a timeout: a test never hangs forever.

// Tests run on their own runtime, which has a time driver (clippy.toml is for Weir's
// workers).
#![allow(clippy::disallowed_methods)]
#![allow(dead_code, unused_imports)]

pub mod console;
pub mod hosts;
pub mod http;
pub mod pg;
pub mod pg18;
pub mod proto;
pub mod rng;
pub mod session;
pub mod tls;
pub mod weir;

use std::io::Read;
use std::net::TcpListener;
use std::path::Path;
use std::process::{Child, Command, ExitStatus, Output, Stdio};
use std::sync::atomic::{AtomicBool, AtomicI64, Ordering};
use std::sync::{Arc, Mutex, OnceLock};
use std::time::{Duration, Instant};

pub use http::{http_get, metric, HttpResponse};
pub use pg::PgServer;
pub use proto::{ErrorFields, RawConn};
pub use weir::{Weir, WeirBuilder};

/// Generous bound for anything that should be quick (connects, single
/// queries). Only there so that a broken Weir fails the test instead of
/// hanging it.
pub const TIMEOUT: Duration = Duration::from_secs(30);

/// A TCP port that was free a moment ago. Ports handed out by this process
/// are never handed out twice.
pub fn free_port() -> u16 {
    static USED: OnceLock<Mutex<Vec<u16>>> = OnceLock::new();
    let used = USED.get_or_init(|| Mutex::new(Vec::new()));
    loop {
        let l = TcpListener::bind("127.0.0.1:0").expect("bind 127.0.0.1:0");
        let port = l.local_addr().unwrap().port();
        drop(l);
        let mut used = used.lock().unwrap();
        if !used.contains(&port) {
            used.push(port);
            return port;
        }
    }
}

/// Whether this machine can listen on the IPv6 loopback address.
pub fn ipv6_available() -> bool {
    static OK: OnceLock<bool> = OnceLock::new();
    *OK.get_or_init(|| TcpListener::bind("[::1]:0").is_ok())
}

pub fn is_root() -> bool {
    unsafe { libc::geteuid() == 0 }
}

/// Where scripts/install-drivers puts the drivers and programs tests run (WEIR_DRIVERS_DIR,
/// default ~/.cache/weir-drivers).
pub fn drivers_dir() -> std::path::PathBuf {
    std::env::var_os("WEIR_DRIVERS_DIR").map_or_else(
        || {
            std::path::PathBuf::from(std::env::var_os("HOME").unwrap_or_default())
                .join(".cache/weir-drivers")
        },
        std::path::PathBuf::from,
    )
}

/// Polls `f` until it returns true; false if `timeout` passes first.
pub fn eventually(timeout: Duration, mut f: impl FnMut() -> bool) -> bool {
    let deadline = Instant::now() + timeout;
    loop {
        if f() {
            return true;
        }
        if Instant::now() >= deadline {
            return false;
        }
        std::thread::sleep(Duration::from_millis(50));
    }
}

/// Awaits every task; the test fails with `what` if one is not done within `limit` of the
/// last, or panicked.
pub async fn join_all_within<T>(
    tasks: Vec<tokio::task::JoinHandle<T>>,
    limit: Duration,
    what: &str,
) -> Vec<T> {
    let mut out = Vec::with_capacity(tasks.len());
    for t in tasks {
        let r = tokio::time::timeout(limit, t)
            .await
            .unwrap_or_else(|_| panic!("{what}"));
        out.push(r.unwrap_or_else(|e| panic!("{what}: {e}")));
    }
    out
}

/// Async version of [`eventually`].
pub async fn eventually_async<F, Fut>(timeout: Duration, mut f: F) -> bool
where
    F: FnMut() -> Fut,
    Fut: std::future::Future<Output = bool>,
{
    let deadline = Instant::now() + timeout;
    loop {
        if f().await {
            return true;
        }
        if Instant::now() >= deadline {
            return false;
        }
        tokio::time::sleep(Duration::from_millis(50)).await;
    }
}

/// A command with all libpq `PG*` environment variables removed, so that the
/// environment of whoever runs the tests cannot change what they test.
pub fn clean_command(program: impl AsRef<std::ffi::OsStr>) -> Command {
    let mut cmd = Command::new(program);
    for (k, _) in std::env::vars_os() {
        if k.to_string_lossy().starts_with("PG") {
            cmd.env_remove(k);
        }
    }
    cmd.env("PGGSSENCMODE", "disable")
        .env("PGCONNECT_TIMEOUT", "20")
        .stdin(Stdio::null());
    cmd
}

/// Runs a command to completion, killing it if it takes longer than `timeout`
/// (then it panics, naming the command).
pub fn run_with_timeout(cmd: &mut Command, stdin: Option<&[u8]>, timeout: Duration) -> Output {
    cmd.stdout(Stdio::piped()).stderr(Stdio::piped());
    if stdin.is_some() {
        cmd.stdin(Stdio::piped());
    }
    let desc = format!("{cmd:?}");
    let mut child = cmd
        .spawn()
        .unwrap_or_else(|e| panic!("cannot run {desc}: {e}"));
    let writer = stdin.map(|data| {
        let mut pipe = child.stdin.take().unwrap();
        let data = data.to_vec();
        std::thread::spawn(move || {
            use std::io::Write;
            let _ = pipe.write_all(&data);
        })
    });
    let out = read_pipe(child.stdout.take());
    let err = read_pipe(child.stderr.take());
    let status = match wait_timeout(&mut child, timeout) {
        Some(s) => s,
        None => {
            let _ = child.kill();
            let _ = child.wait();
            panic!(
                "command did not finish within {timeout:?}: {desc}\nstderr so far: {}",
                String::from_utf8_lossy(&err.join().unwrap_or_default())
            );
        }
    };
    if let Some(w) = writer {
        let _ = w.join();
    }
    Output {
        status,
        stdout: out.join().unwrap_or_default(),
        stderr: err.join().unwrap_or_default(),
    }
}

fn read_pipe<R: Read + Send + 'static>(pipe: Option<R>) -> std::thread::JoinHandle<Vec<u8>> {
    std::thread::spawn(move || {
        let mut buf = Vec::new();
        if let Some(mut p) = pipe {
            let _ = p.read_to_end(&mut buf);
        }
        buf
    })
}

/// Waits for a child process to exit, at most `timeout`.
pub fn wait_timeout(child: &mut Child, timeout: Duration) -> Option<ExitStatus> {
    let deadline = Instant::now() + timeout;
    loop {
        match child.try_wait() {
            Ok(Some(s)) => return Some(s),
            Ok(None) => {}
            Err(_) => return None,
        }
        if Instant::now() >= deadline {
            return None;
        }
        std::thread::sleep(Duration::from_millis(20));
    }
}

/// Last `n` lines of a file (for failure messages).
pub fn tail_file(path: &Path, n: usize) -> String {
    let text = std::fs::read_to_string(path).unwrap_or_default();
    tail(&text, n)
}

pub fn tail(text: &str, n: usize) -> String {
    let lines: Vec<&str> = text.lines().collect();
    let start = lines.len().saturating_sub(n);
    lines[start..].join("\n")
}

// ---------------------------------------------------------------------------
// psql

/// Runs `psql -c sql` (unaligned, tuples only) against `host:port` and returns
/// stdout, or stderr on failure.
pub fn psql_at(
    host: &str,
    port: u16,
    db: &str,
    user: &str,
    password: Option<&str>,
    sql: &str,
) -> Result<String, String> {
    psql_full(host, port, db, user, password, sql, None)
}

/// Like [`psql_at`], feeding `input` to psql's stdin (for `COPY ... FROM STDIN`).
pub fn psql_full(
    host: &str,
    port: u16,
    db: &str,
    user: &str,
    password: Option<&str>,
    sql: &str,
    input: Option<&[u8]>,
) -> Result<String, String> {
    let mut cmd = clean_command("psql");
    cmd.args(["-X", "-A", "-t", "-q", "-v", "ON_ERROR_STOP=1"])
        .args([
            "-h",
            host,
            "-p",
            &port.to_string(),
            "-U",
            user,
            "-d",
            db,
            "-c",
            sql,
        ]);
    if let Some(pw) = password {
        cmd.env("PGPASSWORD", pw);
    }
    let out = run_with_timeout(&mut cmd, input, Duration::from_secs(120));
    if out.status.success() {
        Ok(String::from_utf8_lossy(&out.stdout).trim_end().to_string())
    } else {
        Err(String::from_utf8_lossy(&out.stderr).into_owned())
    }
}

/// `psql` through Weir (TCP, 127.0.0.1).
pub fn psql_via(weir: &Weir, db: &str, user: &str, sql: &str) -> Result<String, String> {
    psql_at("127.0.0.1", weir.port(), db, user, None, sql)
}

/// `psql` through Weir to database `postgres` as `postgres`, with more of a connection
/// string (`sslmode=...`); Ok(stdout) or Err(stderr).
pub fn psql_conninfo(weir: &Weir, conninfo: &str, sql: &str) -> Result<String, String> {
    psql_at(
        "127.0.0.1",
        weir.port(),
        &format!("dbname=postgres {conninfo}"),
        "postgres",
        None,
        sql,
    )
}

// ---------------------------------------------------------------------------
// tokio-postgres

/// A tokio-postgres config for `127.0.0.1:port`.
pub fn pg_config(port: u16, db: &str, user: &str) -> tokio_postgres::Config {
    let mut c = tokio_postgres::Config::new();
    c.host("127.0.0.1")
        .port(port)
        .dbname(db)
        .user(user)
        .connect_timeout(TIMEOUT);
    c
}

/// Connects with `config` and spawns the connection task.
pub async fn connect_with(
    config: &tokio_postgres::Config,
) -> Result<tokio_postgres::Client, tokio_postgres::Error> {
    let fut = config.connect(tokio_postgres::NoTls);
    let (client, conn) = match tokio::time::timeout(TIMEOUT, fut).await {
        Ok(r) => r?,
        Err(_) => panic!("connect did not finish within {TIMEOUT:?}: {config:?}"),
    };
    tokio::spawn(async move {
        let _ = conn.await;
    });
    Ok(client)
}

/// Connects to `127.0.0.1:port` (Weir or PostgreSQL) without a password.
pub async fn connect(
    port: u16,
    db: &str,
    user: &str,
) -> Result<tokio_postgres::Client, tokio_postgres::Error> {
    connect_with(&pg_config(port, db, user)).await
}

/// Connects as `connect` does, keeping the notices the server sends in `notices` (a
/// notice, unlike an error, comes to no caller).
pub async fn connect_noting(
    port: u16,
    db: &str,
    user: &str,
    notices: std::sync::Arc<std::sync::Mutex<Vec<String>>>,
) -> Result<tokio_postgres::Client, tokio_postgres::Error> {
    let config = pg_config(port, db, user);
    let fut = config.connect(tokio_postgres::NoTls);
    let (client, mut conn) = match tokio::time::timeout(TIMEOUT, fut).await {
        Ok(r) => r?,
        Err(_) => panic!("connect to port {port} did not finish within {TIMEOUT:?}"),
    };
    tokio::spawn(async move {
        while let Some(m) = std::future::poll_fn(|cx| conn.poll_message(cx)).await {
            match m {
                Ok(tokio_postgres::AsyncMessage::Notice(n)) => notices
                    .lock()
                    .unwrap_or_else(|p| p.into_inner())
                    .push(n.message().to_string()),
                Ok(_) => {}
                Err(_) => break,
            }
        }
    });
    Ok(client)
}

/// Connects with a password.
pub async fn connect_pw(
    port: u16,
    db: &str,
    user: &str,
    password: &str,
) -> Result<tokio_postgres::Client, tokio_postgres::Error> {
    let mut c = pg_config(port, db, user);
    c.password(password);
    connect_with(&c).await
}

/// The ErrorResponse fields carried by a tokio-postgres error, if it has any.
pub fn db_error(e: &tokio_postgres::Error) -> Option<ErrorFields> {
    e.as_db_error().map(|d| ErrorFields {
        severity: d.severity().to_string(),
        code: d.code().code().to_string(),
        message: d.message().to_string(),
    })
}

/// Like [`db_error`], panicking (with the error) when there is no
/// ErrorResponse in it.
pub fn expect_db_error(e: &tokio_postgres::Error) -> ErrorFields {
    db_error(e).unwrap_or_else(|| panic!("expected an ErrorResponse from the server, got: {e:?}"))
}

/// Runs one simple-protocol query, wrapped in a timeout, returning the first
/// column of every row as text.
pub async fn q(
    client: &tokio_postgres::Client,
    sql: &str,
) -> Result<Vec<Option<String>>, tokio_postgres::Error> {
    let fut = client.simple_query(sql);
    let msgs = match tokio::time::timeout(TIMEOUT, fut).await {
        Ok(r) => r?,
        Err(_) => panic!("query did not finish within {TIMEOUT:?}: {sql}"),
    };
    Ok(msgs
        .into_iter()
        .filter_map(|m| match m {
            tokio_postgres::SimpleQueryMessage::Row(r) => Some(r.get(0).map(str::to_string)),
            _ => None,
        })
        .collect())
}

/// Runs a query expected to return exactly one value.
pub async fn q1(client: &tokio_postgres::Client, sql: &str) -> String {
    let rows = q(client, sql)
        .await
        .unwrap_or_else(|e| panic!("query failed: {sql}: {e:?}"));
    assert_eq!(rows.len(), 1, "expected one row from {sql}, got {rows:?}");
    rows[0].clone().unwrap_or_default()
}

/// Asserts that Weir still serves a fresh client (after some bad input).
pub async fn assert_serving(weir: &Weir, db: &str, user: &str) {
    let c = connect(weir.port(), db, user).await.unwrap_or_else(|e| {
        panic!(
            "weir no longer serves new clients: {e:?}\n{}",
            weir.log_tail()
        )
    });
    assert_eq!(q1(&c, "select 40 + 2").await, "42");
}

// ---------------------------------------------------------------------------
// pgbench

#[derive(Debug, Clone)]
pub struct PgbenchResult {
    pub success: bool,
    pub status: Option<i32>,
    pub tps: f64,
    pub processed: u64,
    pub failed: u64,
    pub stdout: String,
    pub stderr: String,
}

impl PgbenchResult {
    /// Panics (with the output) unless pgbench exited 0 (for `pgbench -i`).
    pub fn assert_ok(&self) {
        assert!(
            self.success,
            "pgbench failed: exit {:?}\nstdout:\n{}\nstderr:\n{}",
            self.status,
            self.stdout,
            tail(&self.stderr, 60)
        );
    }

    /// Panics (with the full output) unless pgbench exited 0, processed some
    /// transactions and reported no failed ones.
    pub fn assert_clean(&self) {
        assert!(
            self.success && self.failed == 0 && self.processed > 0,
            "pgbench was not clean: exit {:?}, processed {}, failed {}\nstdout:\n{}\nstderr:\n{}",
            self.status,
            self.processed,
            self.failed,
            self.stdout,
            tail(&self.stderr, 60)
        );
    }
}

/// Parses pgbench's summary output. The "number of failed transactions" line
/// only exists in some versions; when absent, failed = 0 if pgbench exited 0.
pub fn parse_pgbench(stdout: &str, stderr: &str, status: Option<i32>) -> PgbenchResult {
    let success = status == Some(0);
    let mut tps = 0.0;
    let mut processed = 0;
    let mut failed = None;
    for line in stdout.lines() {
        let line = line.trim();
        if let Some(rest) = line.strip_prefix("tps = ") {
            tps = rest
                .split_whitespace()
                .next()
                .and_then(|v| v.parse().ok())
                .unwrap_or(0.0);
        } else if let Some(rest) = line.strip_prefix("number of transactions actually processed:") {
            // "1234" or "1234/5000"
            processed = rest
                .trim()
                .split(['/', ' '])
                .next()
                .and_then(|v| v.parse().ok())
                .unwrap_or(0);
        } else if let Some(rest) = line.strip_prefix("number of failed transactions:") {
            failed = rest.split_whitespace().next().and_then(|v| v.parse().ok());
        }
    }
    let failed = match failed {
        Some(f) => f,
        None if success => 0,
        None => u64::MAX,
    };
    PgbenchResult {
        success,
        status,
        tps,
        processed,
        failed,
        stdout: stdout.to_string(),
        stderr: stderr.to_string(),
    }
}

/// Runs pgbench with `args` (which must include host/port/user/db).
pub fn pgbench(args: &[&str]) -> PgbenchResult {
    let mut cmd = clean_command("pgbench");
    cmd.args(args);
    let out = run_with_timeout(&mut cmd, None, Duration::from_secs(300));
    parse_pgbench(
        &String::from_utf8_lossy(&out.stdout),
        &String::from_utf8_lossy(&out.stderr),
        out.status.code(),
    )
}

/// pgbench through Weir: `pgbench -h 127.0.0.1 -p <weir> -U user <args> db`.
pub fn pgbench_via(weir: &Weir, db: &str, user: &str, args: &[&str]) -> PgbenchResult {
    let port = weir.port().to_string();
    let mut all = vec!["-h", "127.0.0.1", "-p", &port, "-U", user];
    all.extend_from_slice(args);
    all.push(db);
    pgbench(&all)
}

/// pgbench through `weir` (user and database postgres) in a thread of its own, for a
/// test that acts while it runs.
pub fn pgbench_in_thread(weir: &Weir, args: &[&str]) -> std::thread::JoinHandle<PgbenchResult> {
    let port = weir.port().to_string();
    let mut all: Vec<String> = ["-h", "127.0.0.1", "-p", &port, "-U", "postgres"]
        .iter()
        .chain(args)
        .map(|a| a.to_string())
        .collect();
    all.push("postgres".into());
    std::thread::spawn(move || pgbench(&all.iter().map(String::as_str).collect::<Vec<_>>()))
}

/// pgbench directly against PostgreSQL.
pub fn pgbench_direct(pg: &PgServer, db: &str, user: &str, args: &[&str]) -> PgbenchResult {
    let port = pg.port().to_string();
    let mut all = vec!["-h", "127.0.0.1", "-p", &port, "-U", user];
    all.extend_from_slice(args);
    all.push(db);
    pgbench(&all)
}

// ---------------------------------------------------------------------------
// Sampling pg_stat_activity while something runs

/// Counts client backends matching a condition every ~50 ms from a direct
/// connection, in a thread of its own, until stopped.
pub struct BackendSampler {
    stop: Arc<AtomicBool>,
    max: Arc<AtomicI64>,
    samples: Arc<AtomicI64>,
    thread: Option<std::thread::JoinHandle<Result<(), String>>>,
}

impl BackendSampler {
    /// `condition` is an SQL boolean expression over pg_stat_activity, e.g.
    /// `usename = 'app'`.
    pub fn start(pg: &PgServer, condition: &str) -> BackendSampler {
        let stop = Arc::new(AtomicBool::new(false));
        let max = Arc::new(AtomicI64::new(0));
        let samples = Arc::new(AtomicI64::new(0));
        let sql = format!(
            "select count(*) from pg_stat_activity where backend_type = 'client backend' \
             and pid <> pg_backend_pid() and ({condition})"
        );
        let port = pg.port();
        let (s, m, n) = (stop.clone(), max.clone(), samples.clone());
        let (ready_tx, ready_rx) = std::sync::mpsc::channel();
        let thread = std::thread::spawn(move || {
            let rt = tokio::runtime::Builder::new_current_thread()
                .enable_all()
                .build()
                .unwrap();
            rt.block_on(async move {
                let client = connect(port, "postgres", "postgres")
                    .await
                    .map_err(|e| format!("sampler connect: {e}"))?;
                let stmt = client.prepare(&sql).await.map_err(|e| e.to_string())?;
                let _ = ready_tx.send(());
                // A sample is always taken after stop is asked for, so a test
                // that finishes within one interval still sees its backends.
                loop {
                    let stopping = s.load(Ordering::SeqCst);
                    let row = client
                        .query_one(&stmt, &[])
                        .await
                        .map_err(|e| e.to_string())?;
                    let c: i64 = row.get(0);
                    m.fetch_max(c, Ordering::SeqCst);
                    n.fetch_add(1, Ordering::SeqCst);
                    if stopping {
                        break;
                    }
                    tokio::time::sleep(Duration::from_millis(50)).await;
                }
                Ok(())
            })
        });
        let _ = ready_rx.recv_timeout(TIMEOUT);
        BackendSampler {
            stop,
            max,
            samples,
            thread: Some(thread),
        }
    }

    /// Stops sampling; returns (maximum seen, number of samples).
    pub fn stop(mut self) -> (i64, i64) {
        self.stop.store(true, Ordering::SeqCst);
        if let Some(t) = self.thread.take() {
            t.join()
                .expect("sampler thread panicked")
                .unwrap_or_else(|e| panic!("sampler failed: {e}"));
        }
        (
            self.max.load(Ordering::SeqCst),
            self.samples.load(Ordering::SeqCst),
        )
    }
}

impl Drop for BackendSampler {
    fn drop(&mut self) {
        self.stop.store(true, Ordering::SeqCst);
    }
}
