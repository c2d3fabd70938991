//! The driver matrix (issue 11): real client drivers, each with its default
//! settings, through Weir in transaction mode, ten or more clients on a pool
//! of two server connections.
//!
//! Each driver's program lives in tests/drivers/<language>/ and is installed by
//! scripts/install-drivers (which scripts/test runs) into WEIR_DRIVERS_DIR
//! (default ~/.cache/weir-drivers). The program reads the pooler's URL from
//! WEIR_URL and exits 0 when every check passed.

mod common;

use std::path::PathBuf;
use std::process::Command;
use std::time::{Duration, Instant};

use common::*;

fn program(rel: &str) -> PathBuf {
    PathBuf::from(env!("CARGO_MANIFEST_DIR"))
        .join("tests/drivers")
        .join(rel)
}

/// Weir in transaction mode with a pool of two server connections.
fn transaction_pool(pg: &PgServer) -> Weir {
    Weir::for_pg(pg)
        .set("pool_mode", "transaction")
        .set("default_pool_size", 2)
        .set("max_client_conn", 200)
        .start()
}

/// Runs a driver's program against `url`; panics with its output unless it
/// exits 0.
fn run_driver(weir: &Weir, mut cmd: std::process::Command) {
    let url = weir.url("postgres", "postgres");
    cmd.env("WEIR_URL", &url);
    let out = run_with_timeout(&mut cmd, None, Duration::from_secs(120));
    let stdout = String::from_utf8_lossy(&out.stdout);
    let stderr = String::from_utf8_lossy(&out.stderr);
    assert!(
        out.status.success(),
        "{cmd:?} failed ({}) through {url}\nstdout:\n{}\nstderr:\n{}\nweir log:\n{}",
        out.status,
        tail(&stdout, 40),
        tail(&stderr, 40),
        weir.log_tail()
    );
}

fn python(script: &str) -> std::process::Command {
    let mut cmd = clean_command(drivers_dir().join("venv/bin/python"));
    cmd.arg(program(script));
    cmd
}

/// A psql script: an error mid-transaction (the session goes on), COPY in
/// and out inside one transaction, SET that must stay with this client.
const PSQL_SCRIPT: &str = "BEGIN;
SELECT 1/0;
ROLLBACK;
SELECT 'after-error-' || 42;
BEGIN;
CREATE TEMP TABLE t (a int) ON COMMIT DROP;
COPY t FROM STDIN;
1
2
3
\\.
SELECT 'sum-' || sum(a) FROM t;
COPY (SELECT a FROM t ORDER BY a) TO STDOUT;
COMMIT;
";

#[test]
fn psql_ten_clients() {
    let pg = PgServer::start();
    let weir = transaction_pool(&pg);
    std::thread::scope(|s| {
        for _ in 0..10 {
            s.spawn(|| {
                let mut cmd = clean_command("psql");
                cmd.args([
                    "-X",
                    "-A",
                    "-t",
                    "-q",
                    "-f",
                    "-",
                    &weir.url("postgres", "postgres"),
                ]);
                let out = run_with_timeout(
                    &mut cmd,
                    Some(PSQL_SCRIPT.as_bytes()),
                    Duration::from_secs(60),
                );
                let stdout = String::from_utf8_lossy(&out.stdout);
                let stderr = String::from_utf8_lossy(&out.stderr);
                assert!(
                    stdout.contains("after-error-42")
                        && stdout.contains("sum-6")
                        && stdout.contains("1\n2\n3"),
                    "psql through Weir:\nstdout:\n{stdout}\nstderr:\n{stderr}"
                );
                assert!(stderr.contains("division by zero"), "{stderr}");
            });
        }
    });
}

fn pgbench_matrix(protocol: &str) {
    let pg = PgServer::start();
    let weir = transaction_pool(&pg);
    pgbench_via(&weir, "postgres", "postgres", &["-i", "-s", "1", "-q"]).assert_ok();
    // One thread per client: pgbench prepares with a synchronous call, which
    // blocks its thread's other clients; with fewer servers than clients a
    // queued prepare would then wait for servers its own siblings hold
    // idle in transaction (seen with -j 2: a hang until query_wait_timeout).
    let args = ["-n", "-c", "10", "-j", "10", "-t", "50", "-M", protocol];
    pgbench_via(&weir, "postgres", "postgres", &args).assert_clean();
}

#[test]
fn pgbench_simple() {
    pgbench_matrix("simple");
}

#[test]
fn pgbench_extended() {
    pgbench_matrix("extended");
}

#[test]
fn pgbench_prepared() {
    pgbench_matrix("prepared");
}

/// Session mode (one server per client) validates a driver's program itself;
/// transaction mode is what the matrix is about.
fn pool_for(mode: &str, pg: &PgServer) -> Weir {
    if mode == "session" {
        Weir::for_pg(pg)
            .set("pool_mode", "session")
            .set("default_pool_size", 20)
            .start()
    } else {
        transaction_pool(pg)
    }
}

/// Runs a Python driver's program through Weir in `mode`. Session mode
/// (one server per client) validates the program itself.
fn python_case(mode: &str, script: &str) {
    let pg = PgServer::start();
    let weir = pool_for(mode, &pg);
    run_driver(&weir, python(script));
}

#[test]
fn psycopg_in_session_mode() {
    python_case("session", "python/psycopg_check.py");
}

#[test]
fn psycopg() {
    python_case("transaction", "python/psycopg_check.py");
}

#[test]
fn asyncpg_in_session_mode() {
    python_case("session", "python/asyncpg_check.py");
}

#[test]
fn asyncpg() {
    python_case("transaction", "python/asyncpg_check.py");
}

#[test]
fn sqlalchemy_in_session_mode() {
    python_case("session", "python/sqlalchemy_check.py");
}

#[test]
fn sqlalchemy() {
    python_case("transaction", "python/sqlalchemy_check.py");
}

/// Runs a Node.js driver's program (its modules installed under the cache).
fn node_case(mode: &str, script: &str) {
    let pg = PgServer::start();
    let weir = pool_for(mode, &pg);
    let mut cmd = clean_command("node");
    cmd.env("NODE_PATH", drivers_dir().join("node/node_modules"))
        .arg(program(script));
    run_driver(&weir, cmd);
}

#[test]
fn node_postgres_in_session_mode() {
    node_case("session", "node/pg_check.js");
}

#[test]
fn node_postgres() {
    node_case("transaction", "node/pg_check.js");
}

#[test]
fn postgres_js_in_session_mode() {
    node_case("session", "node/postgresjs_check.js");
}

/// Passes in transaction mode today (why postgres.js copes with its named
/// statements meeting other servers was not examined).
#[test]
fn postgres_js() {
    node_case("transaction", "node/postgresjs_check.js");
}

// The programs below check each driver at its defaults in transaction mode without
// asserting SET/search_path isolation (not implemented yet: each leaves a commented-out
// SESSION-STATE check). They read WEIR_HOST, WEIR_PORT, WEIR_DB, WEIR_USER.

fn source_dir(driver: &str) -> PathBuf {
    program(driver)
}

/// The installed piece a driver's program needs, or a panic saying how to install it.
fn installed(rel: &str) -> PathBuf {
    let p = drivers_dir().join(rel);
    assert!(
        p.exists(),
        "{} is missing: run scripts/install-drivers (scripts/test does)",
        p.display()
    );
    p
}

/// PostgreSQL with the tables the programs write to, and Weir in transaction mode with
/// a pool of two servers.
fn setup() -> (PgServer, Weir) {
    let pg = PgServer::start();
    for t in [
        "psycopg",
        "asyncpg",
        "sqlalchemy",
        "node_pg",
        "postgres_js",
        "pgx",
        "pgjdbc",
        "prisma",
        "sqlx",
    ] {
        pg.exec(&format!(
            "create table drv_{t} (id int primary key, v text)"
        ));
    }
    let weir = transaction_pool(&pg);
    (pg, weir)
}

/// Runs a driver's program with the connection parameters in env; it must exit 0.
fn run_program(weir: &Weir, pg: &PgServer, cmd: Command, name: &str) {
    run_program_on(weir.port(), weir, pg, cmd, name);
}

/// Runs a driver's program against `port` (Weir's, or PostgreSQL's own for a control run).
fn run_program_on(port: u16, weir: &Weir, pg: &PgServer, mut cmd: Command, name: &str) {
    let through = if port == pg.port() {
        "directly"
    } else {
        "through Weir"
    };
    cmd.env("WEIR_HOST", "127.0.0.1")
        .env("WEIR_PORT", port.to_string())
        .env("WEIR_DB", "postgres")
        .env("WEIR_USER", "postgres")
        .env("WEIR_CLIENTS", "10");
    let started = Instant::now();
    let out = run_with_timeout(&mut cmd, None, Duration::from_secs(120));
    let stdout = String::from_utf8_lossy(&out.stdout);
    let stderr = String::from_utf8_lossy(&out.stderr);
    assert!(
        out.status.success(),
        "{name} failed ({:?}) {through}:\n--- stdout\n{stdout}\n--- stderr\n{stderr}\n--- weir log\n{}\n--- postgres log\n{}",
        out.status,
        weir.log_tail(),
        tail(&pg.log(), 40),
    );
    eprintln!(
        "{name} {through}: {} in {:?}",
        stdout.trim(),
        started.elapsed()
    );
}

fn python_args(program: &str, args: &[&str]) -> Command {
    let mut cmd = clean_command(installed("venv/bin/python"));
    cmd.arg(source_dir("python").join(program)).args(args);
    cmd
}

#[test]
fn psycopg_defaults() {
    let (pg, weir) = setup();
    run_program(&weir, &pg, python_args("psycopg3.py", &[]), "psycopg 3");
}

/// libpq 18 asking for protocol 3.2 (max_protocol_version=3.2): PostgreSQL 15 tells it
/// 3.0 and it goes on with that (asked for at least 3.2, it refuses the server); Weir in
/// front of PostgreSQL 15 gives it 3.2, as PostgreSQL 18 does, directly or through Weir.
/// Each time cancel_safe() cancels a running query, over 3.2 and over 3.0.
#[test]
fn psycopg_asks_for_protocol_3_2() {
    let pg = PgServer::start();
    let weir = Weir::for_pg(&pg).start();
    let program = |v| python_args("protocol_3_2.py", &[v]);
    let name = "libpq 18 asking for 3.2";
    run_program_on(pg.port(), &weir, &pg, program("3.0"), name);
    run_program(&weir, &pg, program("3.2"), name);
    let pg18 = PgServer::start_18();
    let weir18 = Weir::for_pg(&pg18).start();
    run_program_on(pg18.port(), &weir18, &pg18, program("3.2"), name);
    run_program(&weir18, &pg18, program("3.2"), name);
}

#[test]
fn asyncpg_defaults() {
    let (pg, weir) = setup();
    run_program(&weir, &pg, python_args("asyncpg_driver.py", &[]), "asyncpg");
}

#[test]
fn sqlalchemy_defaults() {
    let (pg, weir) = setup();
    run_program(
        &weir,
        &pg,
        python_args("sqlalchemy_driver.py", &[]),
        "SQLAlchemy 2",
    );
}

/// Asserts what PostgreSQL itself answers to `sql`, read directly (not through Weir).
fn assert_stored(pg: &PgServer, sql: &str, want: &str, what: &str) {
    assert_eq!(pg.psql(sql), want, "{what}: {sql}");
}

/// What django_orm.py's and active_record.rb's ten threads leave, the same work in both:
/// each an account of balance 1275 with 52 entries (1..50 in bulk, 1000 'outer' and 2000
/// 'after-savepoint'; nothing of what they rolled back), and 5 increments of one counter
/// under SELECT ... FOR UPDATE.
fn assert_ledger(pg: &PgServer, accounts: &str, entries: &str, counters: &str, what: &str) {
    let checks = [
        (
            format!(
                "select count(*), sum(balance), count(*) filter (where balance = 1275) \
                 from {accounts}"
            ),
            "10|12750|10",
        ),
        (
            format!("select count(*), sum(amount), count(distinct account_id) from {entries}"),
            "520|42750|10",
        ),
        (
            format!("select count(*) from {entries} where note in ('inner-lost', 'lost')"),
            "0",
        ),
        (format!("select value from {counters} where id = 1"), "50"),
    ];
    for (sql, want) in checks {
        assert_stored(pg, &sql, want, what);
    }
}

/// Weir logged a client pinned to its server by `by` at least `times` times.
fn assert_pinned(weir: &Weir, by: &str, times: usize, what: &str) {
    let line = format!("pinned to its server by: {by}");
    let n = weir.logfile().matches(line.as_str()).count();
    assert!(
        n >= times,
        "{what}: {n} clients pinned by {by}, not {times}"
    );
}

/// Django's ORM on psycopg 3 with `option` ("defaults", "pool", "server-side-binding"; see
/// tests/drivers/python/django_orm.py): migrate (contenttypes, auth and the app's own two
/// migrations), then ten threads of ORM work on two servers; what each thread committed,
/// and nothing it rolled back, is in PostgreSQL.
fn django(option: &str) {
    let pg = PgServer::start();
    let weir = transaction_pool(&pg);
    let name = format!("Django ({option})");
    run_program(&weir, &pg, python_args("django_orm.py", &[option]), &name);
    let stored = |sql: &str, want: &str| assert_stored(&pg, sql, want, &name);
    stored(
        "select count(*) from django_migrations \
         where (app, name) in (('django_drv', '0002_counter_row'), ('auth', '0001_initial'))",
        "2",
    );
    assert_ledger(
        &pg,
        "django_drv_account",
        "django_drv_entry",
        "django_drv_counter",
        &name,
    );
    // .iterator() outside a transaction declared a WITH HOLD cursor in each thread (what
    // Django's docs disable server-side cursors for under a transaction pooler).
    assert_pinned(&weir, "WITH HOLD cursor", 10, &name);
}

#[test]
fn django_defaults() {
    django("defaults");
}

#[test]
fn django_pool() {
    django("pool");
}

#[test]
fn django_server_side_binding() {
    django("server-side-binding");
}

/// SQLAlchemy's ORM on asyncpg at their defaults (tests/drivers/python/sqlalchemy_asyncpg.py):
/// every query a named statement, cached by asyncpg and by SQLAlchemy's dialect, ten tasks
/// on one engine, savepoints and rollbacks; then a column's type changed under statements
/// both servers hold: refused once (asyncpg's InvalidCachedStatementError), as directly, after
/// which every connection of the engine reads the new type.
#[test]
fn sqlalchemy_asyncpg_defaults() {
    let pg = PgServer::start();
    let weir = transaction_pool(&pg);
    let name = "SQLAlchemy on asyncpg";
    run_program(&weir, &pg, python_args("sqlalchemy_asyncpg.py", &[]), name);
    let stored = |sql: &str, want: &str| assert_stored(&pg, sql, want, name);
    stored(
        "select count(*), sum(total), count(*) filter (where total = 510) from sqla_owner",
        "10|5100|10",
    );
    // Per owner: items 1..20, 'outer' (100) and 'after-savepoint' (200).
    stored(
        "select count(*), sum(qty), count(distinct owner_id) from sqla_item",
        "220|5100|10",
    );
    stored("select count(*) from sqla_item where note = 'lost'", "0");
    stored(
        "select string_agg(v, ',' order by id) || ' ' || pg_typeof(min(v)) from sqla_ddl",
        "v41,v42 text",
    );
}

/// A named statement prepared before DDL changed its result type, run on a server that
/// never held it: directly, PostgreSQL refuses the old statement (asyncpg's
/// InvalidCachedStatementError, which needs the error's routine field). Prepared afresh
/// there without a look at its description, asyncpg decoded the new type with its old one
/// (the text 'abcd' read as the int4 1633837924), silently; Weir now refuses it as
/// PostgreSQL does (prepared::check).
#[test]
fn asyncpg_stale_statement_on_another_server() {
    let pg = PgServer::start();
    let weir = transaction_pool(&pg);
    let name = "asyncpg stale statement";
    let program = |arg: &str| python_args("asyncpg_stale_plan.py", &[arg]);
    run_program_on(pg.port(), &weir, &pg, program("direct"), name);
    run_program(&weir, &pg, program("weir"), name);
}

/// Active Record 6.1 on the pg gem (Debian bookworm's packages) at its defaults
/// (tests/drivers/ruby/active_record.rb): ActiveRecord::Schema.define and two migrations
/// (under a session advisory lock on a connection of their own, which Weir pins to its
/// server until the unlock), then ten threads on its pool of five: named statements,
/// requires_new savepoints, rollbacks, SELECT FOR UPDATE.
#[test]
fn active_record_defaults() {
    let pg = PgServer::start();
    let weir = transaction_pool(&pg);
    let name = "Active Record";
    let mut cmd = clean_command("ruby");
    cmd.arg(source_dir("ruby").join("active_record.rb"));
    run_program(&weir, &pg, cmd, name);
    let stored = |sql: &str, want: &str| assert_stored(&pg, sql, want, name);
    stored(
        "select string_agg(version, ',' order by version) from schema_migrations",
        "1,2,3",
    );
    assert_ledger(&pg, "ar_accounts", "ar_entries", "ar_counters", name);
    // The migrations' lock, taken and released on a connection of their own.
    assert_pinned(&weir, "advisory lock", 1, name);
}

/// asyncpg's own pool resets a connection on release with `SELECT pg_advisory_unlock_all();
/// CLOSE ALL; UNLISTEN *; RESET ALL;` (one simple Query). On a direct connection RESET ALL
/// puts application_name back to the value of the startup packet; the server Weir lends
/// was started with Weir's own, so Weir gives the client its startup values back after a
/// RESET ALL (PgBouncer 1.18 in transaction mode leaves the client with '', checked by hand
/// with this program). The program runs directly, then through Weir, with the same checks.
#[test]
fn asyncpg_pool_reset_all() {
    let (pg, weir) = setup();
    let program = || python_args("asyncpg_driver.py", &["pool-app"]);
    run_program_on(pg.port(), &weir, &pg, program(), "asyncpg pool");
    run_program(&weir, &pg, program(), "asyncpg pool");
}

/// asyncpg's pool (its release runs RESET ALL, CLOSE ALL, UNLISTEN *) with 40 tasks on 4
/// connections.
#[test]
fn asyncpg_pool() {
    let (pg, weir) = setup();
    run_program(
        &weir,
        &pg,
        python_args("asyncpg_driver.py", &["pool"]),
        "asyncpg pool",
    );
}

fn node_program(program: &str) -> Command {
    let mut cmd = clean_command("node");
    cmd.env("NODE_PATH", installed("node/node_modules"))
        .arg(source_dir("node").join(program));
    cmd
}

#[test]
fn node_postgres_named_queries() {
    let (pg, weir) = setup();
    run_program(&weir, &pg, node_program("node_pg.js"), "node-postgres");
}

#[test]
fn postgres_js_defaults() {
    let (pg, weir) = setup();
    run_program(&weir, &pg, node_program("postgres_js.js"), "postgres.js");
}

#[test]
fn pgx_v5() {
    let (pg, weir) = setup();
    let cmd = clean_command(installed("bin/pgx-driver"));
    run_program(&weir, &pg, cmd, "pgx v5");
}

/// pgxpool at its defaults (QueryExecModeCacheStatement on each pooled connection): 20
/// goroutines on a pool of 10 connections on Weir's 2 servers; parameterised queries,
/// transactions (rolled back; committed at repeatable read with a savepoint rolled back),
/// CopyFrom, SendBatch, then an ALTER that changes the result type of a statement every
/// connection has cached: each is refused ("cached plan must not change result type",
/// pgx 5.12 sends no Describe with a cached statement, so Weir's retry does not apply)
/// and pgx prepares it again.
#[test]
fn pgx_v5_pool() {
    let (pg, weir) = setup();
    pg.exec(
        "create table drv_pgx_ddl (id int primary key, v int);
         insert into drv_pgx_ddl select g, g * 10 from generate_series(0, 19) g",
    );
    let mut cmd = clean_command(installed("bin/pgx-driver"));
    cmd.arg("pool");
    run_program(&weir, &pg, cmd, "pgxpool");
    // Per worker: 10 inserts, 1 in the committed transaction, 50 copied, 20 batched.
    assert_eq!(
        pg.psql(
            "select count(*), count(distinct id / 1000), count(*) filter (where v = 'tx'),
                    count(*) filter (where v like 'c%'), count(*) filter (where v like 'b%'),
                    count(*) filter (where v in ('lost', 'duplicate'))
             from drv_pgx"
        )
        .trim(),
        "1620|20|20|1000|400|0"
    );
    assert_eq!(
        pg.psql("select pg_typeof(v), count(*) from drv_pgx_ddl group by 1")
            .trim(),
        "text|20"
    );
}

fn pgjdbc_program() -> Command {
    let classpath = std::fs::read_to_string(installed("java/classpath")).expect("read classpath");
    let mut cmd = clean_command("java");
    cmd.arg("-cp")
        .arg(classpath.trim())
        .arg(source_dir("pgjdbc").join("Main.java"));
    cmd
}

/// pgJDBC at its defaults against Weir's default configuration. From 42.7.5 on it sends no
/// extra_float_digits to PostgreSQL 12 or later (42.7.4 sent extra_float_digits=3 in its
/// startup packet, which PgBouncer refuses unless `ignore_startup_parameters` lists it) and
/// sets application_name with a SET after the login: the program checks that the session's
/// extra_float_digits is PostgreSQL's default, that its application_name stays its own, and
/// that the fifth execution of a PreparedStatement is the first named one.
#[test]
fn pgjdbc() {
    let (pg, weir) = setup();
    run_program(&weir, &pg, pgjdbc_program(), "pgJDBC");
    // Each client's 20 batched rows; the insert of its failed transaction is gone.
    assert_eq!(
        pg.psql(
            "select count(*), count(distinct id / 1000), count(*) filter (where id >= 100000)
             from drv_pgjdbc"
        )
        .trim(),
        "200|10|0"
    );
}

/// PostgreSQL with the table drv_`driver`, and Weir in transaction mode with a pool of two
/// servers that accepts (and ignores) extra_float_digits in a startup packet.
fn setup_ignoring_extra_float_digits(driver: &str) -> (PgServer, Weir) {
    let pg = PgServer::start();
    pg.exec(&format!(
        "create table drv_{driver} (id int primary key, v text)"
    ));
    let weir = Weir::for_pg(&pg)
        .set("pool_mode", "transaction")
        .set("default_pool_size", 2)
        .set("ignore_startup_parameters", "extra_float_digits")
        .start();
    (pg, weir)
}

/// sqlx at its defaults: a PgPool of 10 connections, every query a named statement in a
/// cache of 100 per connection (evictions closed with Close), COPY both ways, errors in
/// transactions. It sends extra_float_digits=2 in its startup packet (as pgJDBC did up to
/// 42.7.4), which PgBouncer accepts only when `ignore_startup_parameters` lists it; here it
/// is listed.
#[test]
fn sqlx() {
    let (pg, weir) = setup_ignoring_extra_float_digits("sqlx");
    run_program(
        &weir,
        &pg,
        clean_command(installed("bin/sqlx-driver")),
        "sqlx",
    );
}

/// sqlx against Weir's default configuration: its extra_float_digits is carried as the
/// client's setting.
#[test]
fn sqlx_default_config() {
    let (pg, weir) = setup();
    run_program(
        &weir,
        &pg,
        clean_command(installed("bin/sqlx-driver")),
        "sqlx",
    );
}

/// A replay of what Prisma's query engine sends (its engine is a binary fetched from
/// outside the registries at install time, so it cannot be installed here): each new SQL
/// text is a named statement s0, s1, ... in the order the connection first met it (Parse,
/// Describe statement, Sync), then every run is Bind/Execute/Sync of that name; a
/// reconnecting engine sends DEALLOCATE ALL and counts from s0 again.
struct PrismaConn {
    conn: proto::RawConn,
    statements: Vec<String>,
}

impl PrismaConn {
    fn connect(port: u16, app: &str) -> PrismaConn {
        let mut conn =
            proto::RawConn::startup(port, "postgres", "postgres", &[("application_name", app)])
                .unwrap_or_else(|e| panic!("{app}: connect: {e:?}"));
        conn.simple_query("DEALLOCATE ALL")
            .unwrap_or_else(|e| panic!("{app}: DEALLOCATE ALL: {e:?}"));
        PrismaConn {
            conn,
            statements: Vec::new(),
        }
    }

    fn no_error(msgs: &[proto::Msg], what: &str) {
        if let Some(e) = msgs.iter().find(|m| m.tag == b'E') {
            panic!("{what}: {:?}", proto::parse_error(&e.body));
        }
    }

    fn query(&mut self, sql: &str, params: &[Option<&str>]) -> Vec<Vec<Option<String>>> {
        let name = match self.statements.iter().position(|s| s == sql) {
            Some(k) => format!("s{k}"),
            None => {
                let name = format!("s{}", self.statements.len());
                self.statements.push(sql.to_string());
                self.conn.send(
                    &[
                        proto::parse(&name, sql),
                        proto::describe(b'S', &name),
                        proto::sync(),
                    ]
                    .concat(),
                );
                let msgs = self.conn.read_until_ready();
                Self::no_error(&msgs, &format!("Parse {name} {sql}"));
                let tags: Vec<u8> = msgs.iter().map(|m| m.tag).collect();
                assert_eq!(&tags[..2], b"1t", "Parse/Describe {name}: {tags:?}");
                name
            }
        };
        self.conn.send(
            &[
                proto::bind("", &name, params),
                proto::execute("", 0),
                proto::sync(),
            ]
            .concat(),
        );
        let msgs = self.conn.read_until_ready();
        Self::no_error(&msgs, &format!("Bind/Execute {name} {sql}"));
        msgs.iter()
            .filter(|m| m.tag == b'D')
            .map(|m| proto::data_row(&m.body))
            .collect()
    }
}

fn prisma_client(port: u16, i: usize, meet: &std::sync::Barrier) {
    let app = format!("drv-prisma-{i}");
    let one = |v: String| vec![vec![Some(v)]];
    for round in 0..2 {
        // A reconnect starts again from s0 with other texts than the last connection had.
        let mut c = PrismaConn::connect(port, &app);
        let add = format!("select $1::int + {} as n", i + 100 * round);
        for n in 0..6 {
            let arg = n.to_string();
            assert_eq!(
                c.query(&add, &[Some(&arg)]),
                one((n + i + 100 * round).to_string()),
                "{app}: {add}"
            );
            assert_eq!(
                c.query("select current_setting('application_name')", &[]),
                one(app.clone()),
                "{app}: application_name"
            );
            if n == 2 {
                meet.wait();
            }
        }
        c.conn.simple_query("BEGIN").unwrap();
        let id = (i * 1000 + round).to_string();
        c.query(
            "insert into drv_prisma (id, v) values ($1::int, $2)",
            &[Some(&id), Some(&app)],
        );
        c.conn.simple_query("COMMIT").unwrap();
        assert_eq!(
            c.query("select v from drv_prisma where id = $1::int", &[Some(&id)]),
            one(app.clone())
        );
        // SESSION-STATE (SET/search_path isolation is not implemented in Weir yet; uncomment
        // when session state follows the client in transaction mode):
        // c.conn.simple_query(&format!("set search_path to drv_schema_{i}, public")).unwrap();
        // meet.wait();
        // assert_eq!(c.query("show search_path", &[]), one(format!("drv_schema_{i}, public")));
        c.conn.send(&proto::terminate());
    }
}

#[test]
fn prisma_replay() {
    let (_pg, weir) = setup();
    let meet = std::sync::Barrier::new(10);
    std::thread::scope(|s| {
        for i in 0..10 {
            let meet = &meet;
            let port = weir.port();
            s.spawn(move || prisma_client(port, i, meet));
        }
    });
}

/// Prisma 7's client (query compiler in WASM, generated at install time; queries through
/// @prisma/adapter-pg, i.e. node-postgres), run with tsx as Prisma's quickstart does: 10
/// PrismaClients at once, each with its adapter's own pg.Pool.
fn prisma7_program(mode: &[&str]) -> Command {
    let mut cmd = clean_command(installed("prisma/node_modules/.bin/tsx"));
    cmd.env("NODE_PATH", installed("prisma/node_modules"))
        .env(
            "WEIR_PRISMA_CLIENT",
            installed("prisma/generated/client.ts"),
        )
        .arg(source_dir("prisma").join("prisma7.ts"))
        .args(mode);
    cmd
}

/// What each of the 10 PrismaClients left in drv_prisma: 8 rows created, 1 by a committed
/// interactive transaction, 2 by a committed batch one, none of the rolled-back ones.
fn assert_prisma7_rows(pg: &PgServer) {
    assert_eq!(
        pg.psql(
            "select count(*), count(distinct id / 1000), count(*) filter (where v = 'updated'),
                    count(*) filter (where v = 'batch'), count(*) filter (where v = 'interactive'),
                    count(*) filter (where v in ('lost', 'duplicate'))
             from drv_prisma"
        )
        .trim(),
        "110|10|10|30|10|0"
    );
}

/// At the adapter's defaults every query is an unnamed statement (the program checks that
/// the servers hold no prepared statement); interactive transactions (committed, rolled back
/// by a throw, rolled back by PostgreSQL's error) and batch ones (`$transaction([...])`).
#[test]
fn prisma7() {
    let (pg, weir) = setup();
    run_program(&weir, &pg, prisma7_program(&[]), "Prisma 7");
    assert_prisma7_rows(&pg);
}

/// The same with the adapter's `statementNameGenerator` (node-postgres prepares each text
/// once per connection under that name) and `pgbouncer=true` in the URL, which the adapter
/// does not read: the statements are named all the same.
#[test]
fn prisma7_named_statements() {
    let (pg, weir) = setup();
    run_program(&weir, &pg, prisma7_program(&["named"]), "Prisma 7");
    assert_prisma7_rows(&pg);
}
