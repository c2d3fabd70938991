//! Online restart (`weir -R`): a new process started with the running one's configuration
//! takes over its listening sockets and its idle clients; the old one exits once the
//! clients it still serves have moved or left. Under pgbench (persistent connections and a
//! new connection per transaction) nothing fails and no connection is dropped.

// Tests run on their own runtime, which has a time driver (clippy.toml is for Weir's
// workers).
#![allow(clippy::disallowed_methods)]

mod common;

use common::tls::Certs;
use common::weir::weir_command;
use common::*;
use std::fs;
use std::process::{Child, Stdio};
use std::time::{Duration, Instant};
use tokio_postgres::NoTls;

/// The process started with -R, killed on drop.
struct Successor {
    child: Option<Child>,
    stderr: std::path::PathBuf,
}

impl Successor {
    fn start(old: &Weir) -> Successor {
        let stderr = old.dir().join(format!("successor-{}.log", free_port()));
        let child = weir_command()
            .arg("-R")
            .arg(old.config_path())
            .stdout(Stdio::null())
            .stderr(Stdio::from(fs::File::create(&stderr).unwrap()))
            .spawn()
            .expect("spawn weir -R");
        Successor {
            child: Some(child),
            stderr,
        }
    }

    /// Started, and taken over: the old process no longer accepts.
    fn start_accepting(old: &Weir) -> Successor {
        let new = Successor::start(old);
        assert!(
            eventually(TIMEOUT, || old.log_tail().contains("accepts now")),
            "{}",
            old.log_tail()
        );
        new
    }

    fn pid(&self) -> u32 {
        self.child.as_ref().expect("running").id()
    }

    fn log(&self) -> String {
        fs::read_to_string(&self.stderr).unwrap_or_default()
    }

    fn wait_exit(&mut self, timeout: Duration) -> Option<std::process::ExitStatus> {
        let st = wait_timeout(self.child.as_mut()?, timeout);
        if st.is_some() {
            self.child = None;
        }
        st
    }
}

impl Drop for Successor {
    fn drop(&mut self) {
        if let Some(mut c) = self.child.take() {
            let _ = c.kill();
            let _ = c.wait();
        }
    }
}

fn transaction_pooler(pg: &PgServer) -> Weir {
    Weir::for_pg(pg)
        .set("pool_mode", "transaction")
        .set("default_pool_size", 5)
        .set("max_client_conn", 200)
        .set("query_wait_timeout", 60)
        .start()
}

/// A long query of `c` is cancelled with its cancel key (through the listening port,
/// whichever process holds it).
async fn assert_cancel_works(pg: &PgServer, c: tokio_postgres::Client) {
    let token = c.cancel_token();
    let sleeper =
        tokio::spawn(async move { c.simple_query("select pg_sleep(30)").await.map(|_| ()) });
    assert!(
        eventually(TIMEOUT, || pg.count_backends_where(
            "query = 'select pg_sleep(30)' and state = 'active'"
        ) == 1),
        "the sleep never ran"
    );
    token.cancel_query(NoTls).await.unwrap();
    let r = tokio::time::timeout(TIMEOUT, sleeper)
        .await
        .expect("the cancel did not reach the client's query")
        .unwrap();
    assert_eq!(expect_db_error(&r.expect_err("cancelled")).code, "57014");
}

/// Three seconds into `load`, takes `old` over and waits for it to exit; `load` must
/// still run then, or its clients were waited for rather than moved.
async fn restart_under(old: &mut Weir, load: &std::thread::JoinHandle<PgbenchResult>) -> Successor {
    tokio::time::sleep(Duration::from_secs(3)).await;
    let new = Successor::start(old);
    let exited = old.wait_exit(Duration::from_secs(30));
    assert!(
        exited.is_some_and(|s| s.success()),
        "the old process did not exit cleanly: {exited:?}\n{}\n-- new --\n{}",
        old.log_tail(),
        new.log()
    );
    assert!(
        !load.is_finished(),
        "pgbench ended before the old process exited: its clients were not moved\n{}",
        old.log_tail()
    );
    new
}

fn pidfile_pid(path: &std::path::Path) -> Option<u32> {
    fs::read_to_string(path)
        .ok()
        .and_then(|t| t.trim().parse().ok())
}

/// Under pgbench with persistent connections and with a connection per transaction, the
/// restart fails no transaction and drops no client: the old process exits while the
/// persistent clients are still running, so they were moved, not waited for. A client
/// with settings, a prepared statement and a cancel key keeps all three.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn restart_under_pgbench_moves_every_client() {
    let pg = PgServer::start();
    pgbench_direct(&pg, "postgres", "postgres", &["-i", "-q", "-s", "1"]).assert_ok();
    let piddir = tempfile::tempdir().unwrap();
    let pidfile = piddir.path().join("weir.pid");
    let mut old = Weir::for_pg(&pg)
        .set("pool_mode", "transaction")
        .set("default_pool_size", 5)
        .set("max_client_conn", 200)
        .set("query_wait_timeout", 60)
        .set("pidfile", pidfile.display())
        .start();
    assert_eq!(
        pidfile_pid(&pidfile),
        Some(old.pid() as u32),
        "{}",
        old.log_tail()
    );

    let c = connect(old.port(), "postgres", "postgres").await.unwrap();
    c.batch_execute(
        "create schema if not exists moved_schema; set search_path to moved_schema, public",
    )
    .await
    .unwrap();
    let stmt = c.prepare("select $1::int + 1").await.unwrap();
    let row = c.query_one(&stmt, &[&41i32]).await.unwrap();
    assert_eq!(row.get::<_, i32>(0), 42);

    let persistent = pgbench_in_thread(&old, &["-c", "8", "-j", "2", "-T", "12", "-S"]);
    let reconnecting = pgbench_in_thread(&old, &["-c", "4", "-j", "2", "-T", "12", "-C", "-N"]);
    let new = restart_under(&mut old, &persistent).await;
    assert_eq!(
        pidfile_pid(&pidfile),
        Some(new.pid()),
        "the pidfile names the new process"
    );

    let persistent = persistent.join().unwrap();
    let reconnecting = reconnecting.join().unwrap();
    for r in [&persistent, &reconnecting] {
        r.assert_clean();
        assert!(!r.stderr.contains("aborted"), "{}", r.stderr);
    }

    // The client with state kept its connection, its settings and its statement.
    assert_eq!(q1(&c, "show search_path").await, "moved_schema, public");
    let row = c.query_one(&stmt, &[&1i32]).await.unwrap();
    assert_eq!(row.get::<_, i32>(0), 2);
    // Its cancel key works on the new process.
    assert_cancel_works(&pg, c).await;
    let log = new.log();
    assert!(log.contains("clients taken over"), "{log}");
}

/// A client in a transaction when the restart begins finishes it on the old process,
/// which stays until then; the client then moves and goes on, and its write is there.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn an_open_transaction_finishes_on_the_old_process() {
    let pg = PgServer::start();
    pg.exec("create table restart_t (v int)");
    let mut old = transaction_pooler(&pg);
    let c = connect(old.port(), "postgres", "postgres").await.unwrap();
    c.batch_execute("begin; insert into restart_t values (1)")
        .await
        .unwrap();
    let new = Successor::start(&old);
    // The new process accepts: a new client gets in (on either, while both run).
    let fresh = tokio::time::timeout(TIMEOUT, async {
        loop {
            if new.log().contains("started") {
                break;
            }
            tokio::time::sleep(Duration::from_millis(50)).await;
        }
    })
    .await;
    assert!(fresh.is_ok(), "{}", new.log());
    tokio::time::sleep(Duration::from_millis(500)).await;
    assert!(
        old.is_running(),
        "the old process left a transaction open\n{}",
        old.log_tail()
    );
    c.batch_execute("insert into restart_t values (2); commit")
        .await
        .unwrap();
    assert_eq!(q1(&c, "select count(*) from restart_t").await, "2");
    let exited = old.wait_exit(Duration::from_secs(20));
    assert!(
        exited.is_some(),
        "the old process stayed\n{}",
        old.log_tail()
    );
    assert_eq!(q1(&c, "select sum(v) from restart_t").await, "3");
    assert_eq!(pg.psql("select count(*) from restart_t").trim(), "2");
    drop(new);
}

/// Two restarts in a row: the process that took over can itself be taken over.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_restarted_process_can_be_restarted() {
    let pg = PgServer::start();
    let mut old = transaction_pooler(&pg);
    let c = connect(old.port(), "postgres", "postgres").await.unwrap();
    let mut first = Successor::start(&old);
    assert!(
        old.wait_exit(Duration::from_secs(20)).is_some(),
        "{}",
        old.log_tail()
    );
    assert_eq!(q1(&c, "select 1").await, "1");
    // The first successor's own control socket is there for the next one.
    let second = {
        let started = Instant::now();
        loop {
            let mut s = Successor::start(&old);
            if s.wait_exit(Duration::from_millis(500)).is_none() {
                break s;
            }
            assert!(started.elapsed() < TIMEOUT, "{}", s.log());
        }
    };
    assert!(
        first.wait_exit(Duration::from_secs(20)).is_some(),
        "the first successor stayed\n{}",
        first.log()
    );
    assert_eq!(q1(&c, "select 2").await, "2");
    let fresh = connect(old.port(), "postgres", "postgres").await.unwrap();
    assert_eq!(q1(&fresh, "select 3").await, "3");
    drop(second);
}

/// Without a Unix socket directory there is no way to reach the running process: -R says
/// so, starts normally as PgBouncer's does, finds the port taken and exits; the running
/// process is untouched.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn restart_without_unix_socket_dir_is_refused() {
    let pg = PgServer::start();
    let mut old = Weir::for_pg(&pg).set("unix_socket_dir", "").start();
    let mut new = Successor::start(&old);
    let st = new.wait_exit(TIMEOUT).expect("weir -R exits");
    assert!(!st.success());
    assert!(new.log().contains("unix_socket_dir"), "{}", new.log());
    assert!(new.log().contains("cannot listen"), "{}", new.log());
    assert!(old.is_running());
    let c = connect(old.port(), "postgres", "postgres").await.unwrap();
    assert_eq!(q1(&c, "select 1").await, "1");
}

/// With no process running, -R starts as usual (PgBouncer's -R does the same), and can
/// itself be taken over.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn restart_with_nothing_running_starts_normally() {
    let pg = PgServer::start();
    let mut first = Weir::for_pg(&pg)
        .set("pool_mode", "transaction")
        .arg("-R")
        .start();
    assert!(first.log().contains("starting normally"), "{}", first.log());
    let c = connect(first.port(), "postgres", "postgres").await.unwrap();
    assert_eq!(q1(&c, "select 1").await, "1");
    let _new = Successor::start(&first);
    assert!(
        first.wait_exit(Duration::from_secs(20)).is_some(),
        "{}",
        first.log_tail()
    );
    assert_eq!(q1(&c, "select 2").await, "2");
}

/// In session mode a client moves with its server, between two transactions: its
/// backend, temporary table, prepared statements and cancel key all stay; pgbench with
/// server-side prepared statements (which live on the server) fails nothing.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn session_mode_clients_move_with_their_servers() {
    let pg = PgServer::start();
    pgbench_direct(&pg, "postgres", "postgres", &["-i", "-q", "-s", "1"]).assert_ok();
    let mut old = Weir::for_pg(&pg)
        .set("pool_mode", "session")
        .set("default_pool_size", 20)
        .start();
    let c = connect(old.port(), "postgres", "postgres").await.unwrap();
    c.batch_execute("create temp table moved_tmp (v int); insert into moved_tmp values (7)")
        .await
        .unwrap();
    let backend = q1(&c, "select pg_backend_pid()").await;
    let stmt = c.prepare("select $1::int * 2").await.unwrap();

    let persistent = pgbench_in_thread(
        &old,
        &["-c", "6", "-j", "2", "-T", "10", "-S", "-M", "prepared"],
    );
    let _new = restart_under(&mut old, &persistent).await;
    let persistent = persistent.join().unwrap();
    persistent.assert_clean();
    assert!(
        !persistent.stderr.contains("aborted"),
        "{}",
        persistent.stderr
    );

    assert_eq!(
        q1(&c, "select pg_backend_pid()").await,
        backend,
        "the same server"
    );
    assert_eq!(q1(&c, "select v from moved_tmp").await, "7");
    let row = c.query_one(&stmt, &[&21i32]).await.unwrap();
    assert_eq!(row.get::<_, i32>(0), 42);
    assert_cancel_works(&pg, c).await;
}

/// A TLS client cannot move (its TLS session stays with the process that made it): it is
/// served by the old process until it leaves, with its connection and settings intact,
/// and the old process exits after it.
#[test]
fn a_tls_client_finishes_on_the_old_process() {
    let pg = PgServer::start();
    let certs = Certs::new();
    let mut old = Weir::for_pg(&pg)
        .set("pool_mode", "transaction")
        .set("client_tls_sslmode", "require")
        .set("client_tls_cert_file", certs.p("server.crt"))
        .set("client_tls_key_file", certs.p("server.key"))
        .start();
    let conninfo = format!(
        "host=127.0.0.1 port={} user=postgres dbname=postgres sslmode=require",
        old.port()
    );
    let script = "set application_name = 'tls_kept';\nselect 'before';\n\\! sleep 4\nselect 'after', current_setting('application_name');\n";
    let psql = std::thread::spawn(move || {
        let mut cmd = clean_command("psql");
        cmd.args([
            "-X",
            "-A",
            "-t",
            "-q",
            "-v",
            "ON_ERROR_STOP=1",
            &conninfo,
            "-f",
            "-",
        ]);
        run_with_timeout(&mut cmd, Some(script.as_bytes()), Duration::from_secs(60))
    });
    assert!(
        eventually(TIMEOUT, || old.logfile().contains("tls=TLS")),
        "{}",
        old.log_tail()
    );
    let new = Successor::start(&old);
    // Its idle servers close (the new process opens its own), while its client stays.
    assert!(
        eventually(Duration::from_secs(3), || pg.count_backends("postgres")
            == 0),
        "the old process kept its idle servers\n{}",
        old.log_tail()
    );
    assert!(
        old.is_running(),
        "the old process left its TLS client\n{}",
        old.log_tail()
    );
    let out = psql.join().unwrap();
    let stdout = String::from_utf8_lossy(&out.stdout);
    assert!(
        out.status.success() && stdout.contains("after|tls_kept"),
        "the TLS client lost its connection or settings: {stdout}\n{}",
        String::from_utf8_lossy(&out.stderr)
    );
    assert!(
        old.wait_exit(Duration::from_secs(20)).is_some(),
        "the old process stayed after its last client left\n{}",
        old.log_tail()
    );
    drop(new);
}

/// Many idle clients move at once: the old process must not exit while some of them are
/// still on their way to the new one (written out, so no longer counted as its clients,
/// but not yet sent). Every client keeps its connection.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn many_parked_clients_all_arrive() {
    const N: usize = 1500;
    let pg = PgServer::start();
    let mut old = Weir::for_pg(&pg)
        .set("pool_mode", "transaction")
        .set("default_pool_size", 5)
        .set("max_client_conn", N + 100)
        .start();
    let mut clients = Vec::with_capacity(N);
    for _ in 0..N {
        clients.push(connect(old.port(), "postgres", "postgres").await.unwrap());
    }
    // Idle for a while: parked.
    tokio::time::sleep(Duration::from_secs(3)).await;
    let new = Successor::start(&old);
    let exited = old.wait_exit(Duration::from_secs(30));
    assert!(
        exited.is_some_and(|s| s.success()),
        "the old process did not exit cleanly: {exited:?}\n{}",
        old.log_tail()
    );
    let mut lost = 0;
    for c in &clients {
        if tokio::time::timeout(TIMEOUT, c.simple_query("select 1"))
            .await
            .map_or(true, |r| r.is_err())
        {
            lost += 1;
        }
    }
    assert_eq!(
        lost,
        0,
        "clients lost in the move\n-- new --\n{}",
        new.log()
    );
}

/// A client whose password auth_query looked up (md5, so no SCRAM keys of its own to log
/// servers in with) moves: the new process's pool has not learnt the secret at a login of
/// its own, so the moved client brings it, and its next transaction gets a server.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_client_logged_in_through_auth_query_gets_servers_after_the_move() {
    let pg = PgServer::start();
    pg.create_user("carol", "pw1", "md5");
    pg.create_user_lookup();
    // Weir's own logins as carol must use the password too.
    pg.set_hba(&["host all carol 127.0.0.1/32 md5"]);
    let mut old = Weir::for_pg(&pg)
        .set("pool_mode", "transaction")
        .set("auth_type", "md5")
        .auth_query_lookup()
        .userlist(&[("lookup", "")])
        .start();
    logged_in_then_moved(&mut old, "carol", "pw1").await;
}

/// Logs `user` in to `old`, restarts it online, and checks that the moved client's next
/// transaction gets a server from the new process.
async fn logged_in_then_moved(old: &mut Weir, user: &str, password: &str) {
    let c = connect_pw(old.port(), "postgres", user, password)
        .await
        .unwrap_or_else(|e| panic!("{user} could not log in: {e:?}\n{}", old.log_tail()));
    assert_eq!(q1(&c, "select current_user").await, user);
    let new = Successor::start(old);
    assert!(
        old.wait_exit(Duration::from_secs(20)).is_some(),
        "{}",
        old.log_tail()
    );
    let r = c.simple_query("select current_user").await;
    assert!(r.is_ok(), "{r:?}\n-- new --\n{}", new.log());
    assert_eq!(q1(&c, "select current_user").await, user);
}

/// A SCRAM client in transaction mode moves (PgBouncer's test_scram_takeover):
/// PostgreSQL demands SCRAM and the entry has no password, so servers are logged in
/// with the keys of the client's own exchange, which the new process never saw; the
/// moved client brings them, and its next transaction gets a server there. ~3 s.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_scram_client_gets_servers_after_the_move() {
    let pg = PgServer::start();
    pg.create_user("alice", "pw1", "scram-sha-256");
    pg.set_hba(&["host all alice 127.0.0.1/32 scram-sha-256"]);
    let secret = pg.stored_password("alice");
    let mut old = Weir::for_pg(&pg)
        .set("pool_mode", "transaction")
        .set("auth_type", "scram-sha-256")
        .userlist(&[("alice", &secret)])
        .start();
    logged_in_then_moved(&mut old, "alice", "pw1").await;
}

/// read_write_split: a client that wrote and then went idle waits (in the old process) for
/// the standbys to replay its write before it reads there. It moves all the same, and in
/// the new process its reads still see its write on a lagging standby.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_client_that_wrote_under_read_write_split_moves_and_reads_its_write() {
    use common::hosts::{client, entry, fast_checks, host_col, pair, show_hosts};
    let (primary, replica) = pair();
    let (p, r) = (primary.port(), replica.port());
    primary.exec("create table moved_ryw(k int primary key)");
    assert!(eventually(TIMEOUT, || replica
        .try_psql("select count(*) from moved_ryw")
        .is_ok_and(|s| s.trim() == "0")));
    replica.exec("alter system set recovery_min_apply_delay = '5s'");
    replica.reload();
    let mut old = fast_checks()
        .database("app", &entry(&[p, r], "read_write_split=1"))
        .start();
    let mut writer = client(&old, "app");
    assert!(
        eventually(Duration::from_secs(10), || host_col(
            &show_hosts(&old),
            "app",
            r,
            "role"
        )
        .as_deref()
            == Some("standby")),
        "{}",
        old.log_tail()
    );
    writer
        .simple_query("insert into moved_ryw values (1)")
        .unwrap();
    let new = Successor::start(&old);
    assert!(
        old.wait_exit(Duration::from_secs(20)).is_some(),
        "the client that wrote did not move\n{}",
        old.log_tail()
    );
    // The new process knows the standby: a read not held for the write would go there.
    assert!(eventually(Duration::from_secs(10), || host_col(
        &show_hosts(&old),
        "app",
        r,
        "role"
    )
    .as_deref()
        == Some("standby")));
    assert_eq!(
        writer.query_one("select count(*) from moved_ryw where k = 1"),
        "1",
        "the moved client did not read its write\n{}",
        new.log()
    );
}

/// A session-mode client moves with its server; if the new configuration pools its
/// database in transaction mode, the client keeps its session (as a reload leaves a
/// logged-in client's mode): its server, with its temporary table, is not given to
/// another client.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_session_mode_client_keeps_its_server_when_the_new_configuration_pools_transactions() {
    let pg = PgServer::start();
    let mut old = Weir::for_pg(&pg)
        .set("pool_mode", "session")
        .set("default_pool_size", 5)
        .start();
    let c = connect(old.port(), "postgres", "postgres").await.unwrap();
    c.batch_execute("create temp table kept_tmp (v int); insert into kept_tmp values (7)")
        .await
        .unwrap();
    let backend = q1(&c, "select pg_backend_pid()").await;
    let ini = fs::read_to_string(old.config_path()).unwrap();
    assert!(ini.contains("pool_mode = session"), "{ini}");
    fs::write(
        old.config_path(),
        ini.replace("pool_mode = session", "pool_mode = transaction"),
    )
    .unwrap();
    let new = Successor::start(&old);
    assert!(
        old.wait_exit(Duration::from_secs(20)).is_some(),
        "{}",
        old.log_tail()
    );
    assert_eq!(q1(&c, "select v from kept_tmp").await, "7", "{}", new.log());
    let other = connect(old.port(), "postgres", "postgres").await.unwrap();
    assert_ne!(
        q1(&other, "select pg_backend_pid()").await,
        backend,
        "the moved client's server was lent to another client"
    );
    assert_eq!(q1(&c, "select pg_backend_pid()").await, backend);
    assert_eq!(q1(&c, "select v from kept_tmp").await, "7");
}

/// A second restart while the first one's old process still finishes a transaction: the
/// process in the middle must stay until the first has gone, as the client in the
/// transaction still moves through it; the client keeps its connection and the first
/// process exits.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_restart_during_a_restart_loses_no_client() {
    let pg = PgServer::start();
    pg.exec("create table chain_t (v int)");
    let mut first = transaction_pooler(&pg);
    let c = connect(first.port(), "postgres", "postgres").await.unwrap();
    c.batch_execute("begin; insert into chain_t values (1)")
        .await
        .unwrap();
    let mut second = Successor::start_accepting(&first);
    let third = {
        let started = Instant::now();
        loop {
            let mut s = Successor::start(&first);
            if s.wait_exit(Duration::from_millis(500)).is_none() {
                break s;
            }
            assert!(started.elapsed() < TIMEOUT, "{}", s.log());
        }
    };
    assert!(
        eventually(TIMEOUT, || second.log().contains("accepts now")),
        "{}",
        second.log()
    );
    tokio::time::sleep(Duration::from_millis(500)).await;
    c.batch_execute("commit").await.unwrap();
    assert!(
        first.wait_exit(Duration::from_secs(20)).is_some(),
        "{}",
        first.log_tail()
    );
    assert!(
        second.wait_exit(Duration::from_secs(20)).is_some(),
        "{}",
        second.log()
    );
    let r = c.simple_query("select count(*) from chain_t").await;
    assert!(
        r.is_ok(),
        "{r:?}\n-- first --\n{}\n-- second --\n{}\n-- third --\n{}",
        first.log_tail(),
        second.log(),
        third.log()
    );
    drop(third);
}

/// The new process dies during the move: the clients still on the old process stay there
/// and are served, rather than being sent into a channel no one reads.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn clients_left_stay_when_the_new_process_dies() {
    let pg = PgServer::start();
    let http = free_port();
    let mut old = Weir::for_pg(&pg)
        .set("pool_mode", "transaction")
        .set("http_listen", format!("127.0.0.1:{http}"))
        .start();
    let c = connect(old.port(), "postgres", "postgres").await.unwrap();
    c.batch_execute("begin").await.unwrap();
    let new = Successor::start_accepting(&old);
    drop(new);
    assert!(
        eventually(TIMEOUT, || old
            .log_tail()
            .contains("the new process is gone")),
        "{}",
        old.log_tail()
    );
    c.batch_execute("commit").await.unwrap();
    tokio::time::sleep(Duration::from_millis(300)).await;
    assert_eq!(q1(&c, "select 1").await, "1", "{}", old.log_tail());
    assert!(old.is_running());
    // It accepts again, over TCP and its Unix socket, and can be taken over again.
    let fresh = connect(old.port(), "postgres", "postgres")
        .await
        .unwrap_or_else(|e| {
            panic!(
                "the old process does not accept again: {e}\n{}",
                old.log_tail()
            )
        });
    assert_eq!(q1(&fresh, "select 2").await, "2");
    let mut over_unix = pg_config(old.port(), "postgres", "postgres");
    over_unix.host_path(old.dir());
    let u = connect_with(&over_unix).await.unwrap();
    assert_eq!(q1(&u, "select 3").await, "3");
    let health = http_get(http, "/healthz");
    assert!(
        health.as_ref().is_ok_and(|r| r.status == 200),
        "the old process does not serve http_listen again: {:?}",
        health.map(|r| r.status)
    );
    let again = Successor::start(&old);
    assert!(
        old.wait_exit(Duration::from_secs(20)).is_some(),
        "the second restart did not take over\n{}\n{}",
        old.log_tail(),
        again.log()
    );
    assert_eq!(q1(&c, "select 4").await, "4");
    assert_eq!(q1(&fresh, "select 5").await, "5");
}

/// A cancel request for a client still on the old process (its query runs there) reaches
/// the new process, which now holds the port, and is passed back to the old one.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_cancel_for_a_client_left_on_the_old_process_is_passed_back() {
    let pg = PgServer::start();
    let mut old = transaction_pooler(&pg);
    let c = connect(old.port(), "postgres", "postgres").await.unwrap();
    let token = c.cancel_token();
    let sleeper =
        tokio::spawn(async move { c.simple_query("select pg_sleep(30)").await.map(|_| ()) });
    assert!(
        eventually(TIMEOUT, || pg.count_backends_where(
            "query = 'select pg_sleep(30)' and state = 'active'"
        ) == 1),
        "the sleep never ran"
    );
    let new = Successor::start_accepting(&old);
    token.cancel_query(NoTls).await.unwrap();
    let r = tokio::time::timeout(TIMEOUT, sleeper)
        .await
        .unwrap_or_else(|_| panic!("the cancel was not passed back\n{}", new.log()))
        .unwrap();
    assert_eq!(expect_db_error(&r.expect_err("cancelled")).code, "57014");
    assert!(
        old.wait_exit(Duration::from_secs(20)).is_some(),
        "{}",
        old.log_tail()
    );
}

/// Protocol 3.2 clients of PostgreSQL 18 in session mode: their 32-byte keys, and their
/// servers' (which PostgreSQL 18 wants whole), survive an online restart. A client still
/// running a query on the old process is cancelled through the new one, which passes
/// the whole key back; one that moved is cancelled on the new process with its own key,
/// and with a forged rest of it not.
#[test]
fn long_cancel_keys_survive_an_online_restart() {
    use common::proto::{cancel_request_key, query};
    let pg = PgServer::start_18();
    let mut old = Weir::for_pg(&pg).set("pool_mode", "session").start();
    let port = old.port();
    let login = || {
        let c = RawConn::startup_minor(port, 2);
        assert_eq!(c.secret.len(), 32);
        c
    };
    let cancel = |c: &RawConn, secret: &[u8]| {
        let mut k = RawConn::connect(port);
        k.send(&cancel_request_key(c.key.expect("a key").0, secret));
        assert!(k.closes());
    };
    let sleeping = || pg.count_backends_where("query = 'select pg_sleep(30)' and state = 'active'");
    let mut moving = login();
    assert_eq!(moving.query_one("select 'before'"), "before");
    let mut staying = login();
    staying.send(&query("select pg_sleep(30)"));
    assert!(
        eventually(TIMEOUT, || sleeping() == 1),
        "the sleep never ran"
    );
    let new = Successor::start_accepting(&old);
    cancel(&staying, &staying.secret.clone());
    assert_eq!(staying.expect_error().code, "57014", "{}", new.log());
    staying.read_until_ready();
    assert!(
        old.wait_exit(Duration::from_secs(20)).is_some(),
        "{}",
        old.log_tail()
    );
    moving.send(&query("select pg_sleep(30)"));
    assert!(
        eventually(TIMEOUT, || sleeping() == 1),
        "the sleep never ran"
    );
    let mut forged = moving.secret.clone();
    forged[9] ^= 1;
    cancel(&moving, &forged);
    std::thread::sleep(Duration::from_millis(300));
    assert_eq!(sleeping(), 1, "a forged key cancelled the query");
    cancel(&moving, &moving.secret.clone());
    assert_eq!(moving.expect_error().code, "57014", "{}", new.log());
    moving.read_until_ready();
    assert_eq!(moving.query_one("select 'after'"), "after");
}
