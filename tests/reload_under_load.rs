//! Issue 14, "Reload never drops a connection": SIGHUP and the console's RELOAD, sent
//! every ~300 ms while pgbench runs through Weir, cost no transaction and no client
//! connection, and the configuration read last is the one in force afterwards.
//!
//! Each storm cycles through configurations that change the pool size (5, 2, 10),
//! max_client_conn, query_wait_timeout, the database's host (127.0.0.1 <-> localhost:
//! the same server, reached under a new target, so servers are replaced as they are
//! given back) and a second database entry (added, removed).

// Tests run on their own runtime, which has a time driver (clippy.toml is for Weir's
// workers).
#![allow(clippy::disallowed_methods)]

mod common;

use common::console;
use common::*;
use std::sync::atomic::{AtomicBool, Ordering};
use std::sync::Arc;
use std::thread::JoinHandle;
use std::time::Duration;

/// How the storm makes Weir read the file again.
#[derive(Clone, Copy, Debug)]
enum Trigger {
    Sighup,
    /// RELOAD on one admin console session kept open for the whole storm.
    Console,
}

/// Rewrites the config and reloads every ~300 ms in a thread of its own, until stopped.
struct Storm {
    stop: Arc<AtomicBool>,
    thread: Option<JoinHandle<Result<usize, String>>>,
}

impl Storm {
    fn start(weir: &Weir, configs: Vec<WeirBuilder>, trigger: Trigger) -> Storm {
        let stop = Arc::new(AtomicBool::new(false));
        let (dir, port, pid) = (weir.dir().to_path_buf(), weir.port(), weir.pid());
        let s = stop.clone();
        let thread = std::thread::spawn(move || {
            let mut console = match trigger {
                Trigger::Console => Some(admin(port)),
                Trigger::Sighup => None,
            };
            let mut n = 0;
            loop {
                // The run starts under the first config for a moment.
                std::thread::sleep(Duration::from_millis(300));
                if s.load(Ordering::SeqCst) {
                    break;
                }
                reload(
                    &dir,
                    port,
                    pid,
                    &configs[n % configs.len()],
                    console.as_mut(),
                )?;
                n += 1;
            }
            Ok(n)
        });
        Storm {
            stop,
            thread: Some(thread),
        }
    }

    /// Stops the storm; how many reloads it made.
    fn stop(mut self) -> usize {
        self.stop.store(true, Ordering::SeqCst);
        let t = self.thread.take().expect("stopped twice");
        t.join()
            .expect("storm thread panicked")
            .unwrap_or_else(|e| panic!("a reload failed: {e}"))
    }
}

impl Drop for Storm {
    fn drop(&mut self) {
        self.stop.store(true, Ordering::SeqCst);
    }
}

fn admin(port: u16) -> RawConn {
    RawConn::startup(port, "postgres", "pgbouncer", &[])
        .unwrap_or_else(|e| panic!("admin console login failed: {e:?}"))
}

/// Writes `config` in place of Weir's file (whole, by rename: Weir never reads half a
/// file) and makes Weir read it, by SIGHUP or by RELOAD on `console`.
fn reload(
    dir: &std::path::Path,
    port: u16,
    pid: i32,
    config: &WeirBuilder,
    console: Option<&mut RawConn>,
) -> Result<(), String> {
    let tmp = dir.join("pgbouncer.ini.new");
    std::fs::write(&tmp, config.render(dir, port)).map_err(|e| e.to_string())?;
    std::fs::rename(&tmp, dir.join("pgbouncer.ini")).map_err(|e| e.to_string())?;
    match console {
        Some(c) => console::run(c, "RELOAD")
            .map(|_| ())
            .map_err(|e| format!("RELOAD: {e:?}")),
        None => {
            if unsafe { libc::kill(pid, libc::SIGHUP) } == 0 {
                Ok(())
            } else {
                Err(format!("kill({pid}, SIGHUP) failed"))
            }
        }
    }
}

fn connstr(pg: &PgServer, host: &str) -> String {
    format!("host={host} port={} dbname=postgres", pg.port())
}

/// `mode`, pool of 5, the console open to `postgres`.
fn base(pg: &PgServer, mode: &str) -> WeirBuilder {
    Weir::for_pg(pg)
        .set("pool_mode", mode)
        .set("admin_users", "postgres")
        .set("default_pool_size", 5)
        .set("max_client_conn", 100)
        .set("query_wait_timeout", 30)
}

/// The configurations a storm cycles through. `pool_mode_too` adds one in statement
/// mode (only for select-only runs: tpcb's BEGIN/END is refused in statement mode).
fn cycle(pg: &PgServer, pool_mode_too: bool) -> Vec<WeirBuilder> {
    let b = base(pg, "transaction");
    let second = connstr(pg, "127.0.0.1");
    let mut v = vec![
        b.clone().set("default_pool_size", 2),
        b.clone()
            .set("default_pool_size", 10)
            .set("max_client_conn", 150)
            .database("second", &second),
        b.clone()
            .set("default_pool_size", 10)
            .set("query_wait_timeout", 40)
            .database("postgres", &connstr(pg, "localhost"))
            .database("second", &second),
        b.clone()
            .set("default_pool_size", 2)
            .set("max_client_conn", 200)
            .database("postgres", &connstr(pg, "localhost")),
        b.clone().set("query_wait_timeout", 50),
    ];
    if pool_mode_too {
        v.push(b.set("pool_mode", "statement").set("default_pool_size", 10));
    }
    v
}

/// The configuration every test ends with: what SHOW must report afterwards.
fn last_config(pg: &PgServer, mode: &str) -> WeirBuilder {
    base(pg, mode)
        .set("default_pool_size", 3)
        .set("max_client_conn", 333)
        .set("query_wait_timeout", 44)
        .database("postgres", &connstr(pg, "localhost"))
        .database("second", &connstr(pg, "127.0.0.1"))
}

/// Asserts what a pgbench run under a storm must give: exit 0, some transactions, none
/// failed, no client aborted.
fn assert_clean_run(r: &PgbenchResult, weir: &Weir, reloads: usize) {
    assert!(
        r.success && r.failed == 0 && r.processed > 0 && !r.stderr.contains("aborted"),
        "pgbench under {reloads} reloads was not clean: exit {:?}, processed {}, failed {}\n\
         stdout:\n{}\nstderr:\n{}\n{}",
        r.status,
        r.processed,
        r.failed,
        r.stdout,
        tail(&r.stderr, 40),
        weir.log_tail()
    );
    assert!(
        reloads >= 10,
        "only {reloads} reloads during the run: the storm did not storm"
    );
}

/// Servers the pool of database `postgres` has, in any state.
fn pool_servers(c: &mut RawConn) -> i64 {
    let pools = console::ok(c, "SHOW POOLS");
    ["sv_active", "sv_idle", "sv_used", "sv_tested", "sv_login"]
        .iter()
        .map(|k| pools.num("database", "postgres", k))
        .sum()
}

/// Reloads `config` (by `trigger`) and waits until SHOW DATABASES has its host and
/// pool size for database `postgres`, and database `second`.
fn reload_and_wait(
    weir: &Weir,
    c: &mut RawConn,
    config: &WeirBuilder,
    trigger: Trigger,
    host: &str,
    size: u32,
) {
    let console = match trigger {
        Trigger::Console => Some(&mut *c),
        Trigger::Sighup => None,
    };
    reload(weir.dir(), weir.port(), weir.pid(), config, console)
        .unwrap_or_else(|e| panic!("reload failed: {e}"));
    let applied = eventually(TIMEOUT, || {
        let dbs = console::ok(c, "SHOW DATABASES");
        dbs.find("name", "second").len() == 1
            && dbs.get("name", "postgres", "host") == host
            && dbs.get("name", "postgres", "pool_size") == size.to_string()
    });
    assert!(
        applied,
        "the config is not in SHOW DATABASES: {:#?}\n{}",
        console::ok(c, "SHOW DATABASES"),
        weir.log_tail()
    );
}

/// After the storm: the last config is in force (SHOW DATABASES, SHOW CONFIG), and a
/// pool shrunk by a reload (the only change: the host stays, so its servers are not
/// replaced anyway) closes what it has over its new size, idle or under load with
/// clients waiting for servers, and then PostgreSQL sees no more than that.
fn assert_last_config_in_force(pg: &PgServer, weir: &Weir, mode: &str, trigger: Trigger) {
    let mut c = admin(weir.port());
    let last = last_config(pg, mode);
    let wide = last.clone().set("default_pool_size", 10);

    let warm = || {
        pgbench_via(
            weir,
            "postgres",
            "postgres",
            &["-n", "-S", "-c", "10", "-j", "2", "-T", "1"],
        )
        .assert_clean()
    };
    // The host change: servers opened for 127.0.0.1 are replaced by ones for localhost.
    let old_host = wide.clone().database("postgres", &connstr(pg, "127.0.0.1"));
    reload_and_wait(weir, &mut c, &old_host, trigger, "127.0.0.1", 10);
    warm();
    reload_and_wait(weir, &mut c, &wide, trigger, "localhost", 10);
    warm();
    let servers = console::ok(&mut c, "SHOW SERVERS");
    let hosts: Vec<_> = servers
        .find("database", "postgres")
        .iter()
        .map(|r| r[servers.col("addr")].clone().unwrap_or_default())
        .collect();
    assert!(
        !hosts.is_empty() && hosts.iter().all(|h| h == "localhost"),
        "servers after the host changed to localhost: {hosts:?}"
    );

    // An idle pool shrinks at the reload.
    let before = pool_servers(&mut c);
    assert!(
        before > 3,
        "a pool of 10 under 10 clients opened only {before} servers"
    );
    reload_and_wait(weir, &mut c, &last, trigger, "localhost", 3);
    assert!(
        eventually(Duration::from_secs(3), || pool_servers(&mut c) <= 3),
        "SHOW POOLS still lists {} idle servers 3 s after the pool size went from 10 to 3 \
         (had {before}): {:#?}",
        pool_servers(&mut c),
        console::ok(&mut c, "SHOW POOLS")
    );

    // A busy one too.
    reload_and_wait(weir, &mut c, &wide, trigger, "localhost", 10);
    // Twice as many clients as servers, so that some always wait. In session mode a
    // new connection per transaction: a persistent client would keep its server.
    let mut args = vec!["-n", "-S", "-c", "20", "-j", "2", "-T", "8"];
    if mode == "session" {
        args.push("-C");
    }
    let load = pgbench_in_thread(weir, &args);
    assert!(
        eventually(TIMEOUT, || pool_servers(&mut c) > 3),
        "a pool of 10 under 20 clients never had more than 3 servers: {:#?}",
        console::ok(&mut c, "SHOW POOLS")
    );
    let before = pool_servers(&mut c);

    reload_and_wait(weir, &mut c, &last, trigger, "localhost", 3);
    let config = console::ok(&mut c, "SHOW CONFIG");
    assert_eq!(config.get("key", "max_client_conn", "value"), "333");
    assert_eq!(config.get("key", "query_wait_timeout", "value"), "44");
    assert_eq!(config.get("key", "pool_mode", "value"), mode);
    let shrunk = eventually(Duration::from_secs(3), || pool_servers(&mut c) <= 3);
    let still_loaded = !load.is_finished();
    assert!(
        shrunk,
        "SHOW POOLS still lists {} servers 3 s after the pool size went from 10 to 3 \
         (had {before}): {:#?}",
        pool_servers(&mut c),
        console::ok(&mut c, "SHOW POOLS")
    );
    assert!(
        still_loaded,
        "pgbench ended before the pool shrank: the check proves nothing"
    );
    // The closed servers' backends take a moment to exit.
    let from_weir = "datname = 'postgres'";
    assert!(
        eventually(Duration::from_secs(3), || pg
            .count_backends_where(from_weir)
            <= 3),
        "PostgreSQL still has {} backends from Weir for a pool of 3",
        pg.count_backends_where(from_weir)
    );
    let sampler = BackendSampler::start(pg, from_weir);
    std::thread::sleep(Duration::from_secs(1));
    let (max, samples) = sampler.stop();
    let still_loaded = !load.is_finished();
    let r = load.join().expect("pgbench thread panicked");
    r.assert_clean();
    assert!(
        still_loaded && samples > 5,
        "too few samples under load ({samples})"
    );
    // One more may be seen for a moment: a server Weir closed (a stale one from the
    // host change, at its checkin) whose backend is still exiting while its replacement
    // logs in. Seen once in a CI run under load; Weir's own count is checked above.
    assert!(
        max <= 4,
        "PostgreSQL saw {max} servers from Weir after the pool size went to 3"
    );
}

/// Starts PostgreSQL with pgbench tables.
fn pg_with_tables() -> PgServer {
    let pg = PgServer::start();
    pgbench_direct(&pg, "postgres", "postgres", &["-i", "-s", "1", "-q"]).assert_ok();
    pg
}

fn storm_case(args: &[&str], pool_mode_too: bool, trigger: Trigger) {
    let pg = pg_with_tables();
    let weir = base(&pg, "transaction").start();
    let storm = Storm::start(&weir, cycle(&pg, pool_mode_too), trigger);
    let mut all = vec!["-n", "-c", "20", "-j", "2", "-T", "8"];
    all.extend_from_slice(args);
    let r = pgbench_via(&weir, "postgres", "postgres", &all);
    let reloads = storm.stop();
    assert_clean_run(&r, &weir, reloads);
    assert_last_config_in_force(&pg, &weir, "transaction", trigger);
}

/// Select-only, persistent connections, SIGHUP (pool_mode flips to statement too).
#[test]
fn select_only_under_sighup_storm() {
    storm_case(&["-S"], true, Trigger::Sighup);
}

/// tpcb-like without branch/teller updates (-N: BEGIN, UPDATE, SELECT, INSERT, END),
/// persistent connections, RELOAD through the console.
#[test]
fn tpcb_under_console_reload_storm() {
    storm_case(&["-N"], false, Trigger::Console);
}

/// A new connection per transaction: every login meets some reload.
#[test]
fn connect_per_transaction_under_sighup_storm() {
    storm_case(&["-N", "-C"], false, Trigger::Sighup);
}

/// Select-only, a new connection per transaction, with pool_mode flipping, by RELOAD.
#[test]
fn connect_per_transaction_select_only_under_console_reload_storm() {
    storm_case(&["-S", "-C"], true, Trigger::Console);
}

/// Session mode, 8 persistent clients, the pool starting at 3 and going 10, 2, 10, 3:
/// clients beyond the pool wait for a server (pgbench connects them all at once), a
/// shrink takes no server from a client that has one, and nothing fails.
#[test]
fn session_mode_pool_shrinks_below_clients_and_grows_back() {
    let pg = pg_with_tables();
    let b = base(&pg, "session");
    let weir = b.clone().set("default_pool_size", 3).start();
    let sizes = [10, 2, 10, 3];
    let configs = sizes
        .iter()
        .map(|n| b.clone().set("default_pool_size", n))
        .collect();
    let load = pgbench_in_thread(&weir, &["-n", "-S", "-c", "8", "-j", "2", "-T", "6"]);
    let storm = Storm::start(&weir, configs, Trigger::Sighup);
    // Once the pool has grown, the clients that waited have a server each, and keep it
    // through the shrinks.
    let mut c = admin(weir.port());
    let all_served = eventually(Duration::from_secs(4), || {
        let pools = console::ok(&mut c, "SHOW POOLS");
        // No row until the first client has logged in.
        !pools.find("database", "postgres").is_empty()
            && pools.num("database", "postgres", "sv_active") == 8
            && pools.num("database", "postgres", "cl_waiting") == 0
    });
    let still_loaded = !load.is_finished();
    assert!(
        all_served,
        "the 8 clients never had a server each: {:#?}",
        console::ok(&mut c, "SHOW POOLS")
    );
    assert!(still_loaded, "pgbench ended before the check");
    let r = load.join().expect("pgbench thread panicked");
    let reloads = storm.stop();
    assert_clean_run(&r, &weir, reloads);
    assert_last_config_in_force(&pg, &weir, "session", Trigger::Sighup);
}

/// A database entry removed by a reload while clients are logged in to it drains: new
/// logins are refused, an idle client is closed with "database removed" (08P01, PgBouncer's
/// words), and a transaction in progress finishes and commits, its client closed after.
///
/// PgBouncer drops a removed database's clients at the reload, open transactions too
/// (kill_database on db_dead in config_postprocess); Weir lets the transaction finish.
fn removed_database_case(mode: &str) {
    let pg = PgServer::start();
    pg.exec("create database second");
    psql_at(
        "127.0.0.1",
        pg.port(),
        "second",
        "postgres",
        None,
        "create table t (x int)",
    )
    .unwrap();
    let second = format!("host=127.0.0.1 port={} dbname=second", pg.port());
    let without = base(&pg, mode);
    let mut weir = without.clone().database("second", &second).start();
    let port = weir.port();
    let mut idle = RawConn::startup(port, "postgres", "second", &[]).unwrap();
    assert_eq!(idle.query_one("select 1"), "1");
    let mut busy = RawConn::startup(port, "postgres", "second", &[]).unwrap();
    busy.simple_query("begin").unwrap();
    busy.simple_query("insert into t values (1)").unwrap();

    weir.reload_with(without);
    let mut c = admin(port);
    assert!(
        eventually(TIMEOUT, || console::ok(&mut c, "SHOW DATABASES")
            .find("name", "second")
            .is_empty()),
        "database second still listed after the reload\n{}",
        weir.log_tail()
    );
    match RawConn::startup(port, "postgres", "second", &[]) {
        Ok(_) => panic!("a new client logged in to a removed database"),
        Err(e) => assert_eq!(e.code, "3D000", "{e:?}"),
    }
    // The transaction in progress finishes.
    busy.simple_query("insert into t values (2)")
        .unwrap_or_else(|e| panic!("the open transaction was broken by the reload: {e:?}"));
    busy.simple_query("commit").unwrap();
    assert_eq!(
        psql_at(
            "127.0.0.1",
            pg.port(),
            "second",
            "postgres",
            None,
            "select count(*) from t"
        )
        .unwrap(),
        "2"
    );
    // Then both are closed: the idle one at the reload, the busy one after its commit.
    for c in [&mut idle, &mut busy] {
        let e = c
            .error_or_eof()
            .expect("a client of a removed database was not told");
        assert_eq!(
            (e.code.as_str(), e.message.as_str()),
            ("08P01", "database removed")
        );
    }
}

#[test]
fn removed_database_transaction_mode_drains() {
    removed_database_case("transaction");
}

#[test]
fn removed_database_session_mode_drains() {
    removed_database_case("session");
}
