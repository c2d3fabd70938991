//! Admin console details PgBouncer users rely on: the OS user running the pooler gets
//! into the console as `pgbouncer` over the Unix socket without a password; SHOW
//! CLIENTS/SERVERS/SOCKETS `id`, SHOW SERVERS `local_addr`/`local_port`, SHOW VERSION's
//! shape; and the control commands' errors (wording and SQLSTATE of PgBouncer's
//! admin.c) for unknown databases, the console's own database, and wrong states.

mod common;

use common::console::*;
use common::*;
use std::collections::HashSet;

fn admin(weir: &Weir) -> RawConn {
    RawConn::startup(weir.port(), "postgres", "pgbouncer", &[])
        .unwrap_or_else(|e| panic!("console login failed: {e:?}"))
}

/// Weir that requires passwords (md5), with `pgbouncer` itself a listed admin that has one.
fn start_md5(pg: &PgServer) -> Weir {
    Weir::for_pg(pg)
        .set("auth_type", "md5")
        .set("admin_users", "postgres,pgbouncer")
        .userlist(&[("postgres", "pw"), ("pgbouncer", "secret")])
        .start()
}

fn socket_config(weir: &Weir, user: &str, db: &str) -> tokio_postgres::Config {
    let mut c = tokio_postgres::Config::new();
    c.host_path(weir.dir())
        .port(weir.port())
        .user(user)
        .dbname(db)
        .connect_timeout(TIMEOUT);
    c
}

/// Our own OS user (root in the tests, as Weir) connecting over the Unix socket as
/// `pgbouncer` gets a full console without a password: tokio-postgres and psql.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn own_os_user_gets_the_console_over_the_unix_socket() {
    let pg = PgServer::start();
    let weir = start_md5(&pg);
    let console = connect_with(&socket_config(&weir, "pgbouncer", "pgbouncer"))
        .await
        .unwrap_or_else(|e| panic!("own-user console login refused: {e:?}\n{}", weir.log_tail()));
    let version = q1(&console, "SHOW VERSION").await;
    assert!(version.contains("weir"), "{version}");
    // Full access: a command only admins may run.
    console.simple_query("RECONNECT").await.unwrap();
    let rows = console.simple_query("SHOW CLIENTS").await.unwrap();
    let me = rows
        .iter()
        .find_map(|m| match m {
            tokio_postgres::SimpleQueryMessage::Row(r) if r.get("user") == Some("pgbouncer") => {
                Some(r.get("addr").unwrap_or_default().to_owned())
            }
            _ => None,
        })
        .expect("the own-user session is not in SHOW CLIENTS");
    assert_eq!(me, "unix");

    let dir = weir.dir().display().to_string();
    let out = psql_at(
        &dir,
        weir.port(),
        "pgbouncer",
        "pgbouncer",
        None,
        "SHOW USERS",
    )
    .unwrap_or_else(|e| panic!("psql as pgbouncer over the socket failed: {e}"));
    // Both sessions are counted under pgbouncer.
    assert!(
        out.lines()
            .any(|l| l.starts_with("pgbouncer|") && l.ends_with("|2")),
        "{out}"
    );

    // The exception is for the console only: the same user on a real database needs a
    // password like anyone else.
    let e = connect_with(&socket_config(&weir, "pgbouncer", "postgres")).await;
    assert!(
        e.is_err(),
        "pgbouncer got into a real database without a password"
    );
}

/// Without the peer check passing (TCP, or another OS user on the socket), `pgbouncer`
/// is an ordinary user: asked for its password, and let in only with it.
#[test]
fn pgbouncer_without_password_is_refused_elsewhere() {
    let pg = PgServer::start();
    let weir = start_md5(&pg);
    let mut c = RawConn::connect(weir.port());
    c.send(&proto::startup_message(&[
        ("user", "pgbouncer"),
        ("database", "pgbouncer"),
    ]));
    let m = c.read_message_or_panic("auth request");
    assert_eq!(m.tag, b'R');
    let code = u32::from_be_bytes(m.body[0..4].try_into().unwrap());
    assert_eq!(
        code, 5,
        "TCP login as pgbouncer not asked for an md5 password"
    );
    c.send(&proto::password_message(
        "md5-not-the-password-at-all-000000",
    ));
    let e = c.expect_error();
    assert_eq!((e.code.as_str(), e.severity.as_str()), ("28P01", "FATAL"));

    // With its password it gets in over TCP.
    psql_at(
        "127.0.0.1",
        weir.port(),
        "pgbouncer",
        "pgbouncer",
        Some("secret"),
        "SHOW VERSION",
    )
    .unwrap_or_else(|e| panic!("pgbouncer with its password refused: {e}"));

    // Another OS user on the same socket is asked for a password too.
    if let Some((uid, gid)) = pg::pg_owner() {
        use std::os::unix::process::CommandExt;
        let mut cmd = clean_command("psql");
        cmd.uid(uid).gid(gid).args([
            "-X",
            "-w",
            "-h",
            &weir.dir().display().to_string(),
            "-p",
            &weir.port().to_string(),
            "-U",
            "pgbouncer",
            "-d",
            "pgbouncer",
            "-c",
            "SHOW VERSION",
        ]);
        let out = run_with_timeout(&mut cmd, None, TIMEOUT);
        let stderr = String::from_utf8_lossy(&out.stderr);
        assert!(
            !out.status.success(),
            "another OS user got in without a password"
        );
        assert!(stderr.contains("password"), "{stderr}");
    }
}

/// SHOW SERVERS local_addr/local_port are our end of the server connection, the one
/// PostgreSQL sees as client_addr/client_port.
#[test]
fn show_servers_local_end_is_what_postgres_sees() {
    let pg = PgServer::start();
    let weir = Weir::for_pg(&pg)
        .set("admin_users", "postgres")
        .set("pool_mode", "session")
        .start();
    let mut c = RawConn::startup(weir.port(), "postgres", "postgres", &[]).unwrap();
    let pid = c.query_one("select pg_backend_pid()");
    let seen = c.query_one(
        "select client_addr::text || ' ' || client_port from pg_stat_activity \
         where pid = pg_backend_pid()",
    );
    let mut a = admin(&weir);
    let servers = ok(&mut a, "SHOW SERVERS");
    let local = format!(
        "{}/32 {}",
        servers.get("remote_pid", &pid, "local_addr"),
        servers.get("remote_pid", &pid, "local_port")
    );
    assert_eq!(local, seen);
}

/// `id` is the last of SHOW CLIENTS/SERVERS' columns (before SOCKETS' debug ones), one
/// sequence for clients (console sessions included) and servers; SHOW VERSION is one row of one
/// text column naming Weir and its version.
#[test]
fn ids_are_unique_and_version_has_pgbouncers_shape() {
    let pg = PgServer::start();
    let weir = Weir::for_pg(&pg)
        .set("admin_users", "postgres")
        .set("pool_mode", "session")
        .start();
    let mut clients: Vec<RawConn> = (0..3)
        .map(|_| RawConn::startup(weir.port(), "postgres", "postgres", &[]).unwrap())
        .collect();
    for c in &mut clients {
        assert_eq!(c.query_one("select 1"), "1");
    }
    let mut a = admin(&weir);
    let _a2 = admin(&weir);
    let mut all = HashSet::new();
    for (cmd, n) in [("SHOW CLIENTS", 5), ("SHOW SERVERS", 3)] {
        let res = ok(&mut a, cmd);
        // PgBouncer's last column, then Weir's own.
        assert_eq!(res.cols.last().unwrap().0, "pinned", "{cmd}");
        assert_eq!(res.col("id"), res.col("prepared_statements") + 1);
        let i = res.col("id");
        let ids: HashSet<String> = res.rows.iter().map(|r| r[i].clone().unwrap()).collect();
        assert_eq!(ids.len(), n, "{cmd}: ids not unique: {res:#?}");
        all.extend(ids.iter().map(|id| id.parse::<u64>().expect("numeric id")));
    }
    // One sequence for clients, console sessions and servers, as PgBouncer numbers its
    // sockets: no id names two of them, and a fresh Weir's are small.
    assert_eq!(all.len(), 8, "an id names two sockets: {all:?}");
    assert!(all.iter().all(|id| (1..=100).contains(id)), "{all:?}");
    let sockets = ok(&mut a, "SHOW SOCKETS");
    assert_eq!(sockets.col("pinned") + 1, sockets.col("recv_pos"));
    // Every client (the two console sessions too) and every server, each once.
    let (i, t) = (sockets.col("id"), sockets.col("type"));
    let ids: HashSet<(String, String)> = sockets
        .rows
        .iter()
        .map(|r| (r[t].clone().unwrap(), r[i].clone().unwrap()))
        .collect();
    assert_eq!(ids.len(), 8, "{sockets:#?}");
    assert_eq!(sockets.find("database", "pgbouncer").len(), 2);

    let version = ok(&mut a, "SHOW VERSION");
    assert_eq!(version.cols, vec![("version".to_string(), 25)]);
    assert_eq!(version.rows.len(), 1);
    let v = version.rows[0][0].clone().unwrap();
    assert!(
        v.starts_with("PgBouncer ") && v.contains(&format!("weir {}", env!("CARGO_PKG_VERSION"))),
        "{v}"
    );
    // `-V` and `--version` print the same line, as PgBouncer's `-V` and SHOW VERSION do.
    for flag in ["-V", "--version"] {
        let out = std::process::Command::new(common::weir::weir_bin())
            .arg(flag)
            .output()
            .expect("run weir");
        assert!(out.status.success(), "{flag}");
        let printed = String::from_utf8_lossy(&out.stdout);
        assert_eq!(printed.lines().next(), Some(v.as_str()), "{flag}");
    }
}

/// Runs `sql` on the console and checks it fails with PgBouncer's ERROR 08P01 `message`.
fn fails_with(a: &mut RawConn, sql: &str, message: &str) {
    let e = run(a, sql).expect_err(sql);
    assert_eq!(
        (e.severity.as_str(), e.code.as_str(), e.message.as_str()),
        ("ERROR", "08P01", message),
        "{sql}"
    );
}

/// The control commands refuse as PgBouncer's admin.c does: an ERROR with SQLSTATE 08P01
/// and its exact message.
#[test]
fn control_commands_fail_with_pgbouncers_errors() {
    let pg = PgServer::start();
    let weir = Weir::for_pg(&pg).set("admin_users", "postgres").start();
    let mut a = admin(&weir);
    let mut fails = |sql: &str, message: &str| fails_with(&mut a, sql, message);
    fails("RESUME", "pooler is not paused/suspended");
    fails("RESUME postgres", "database postgres is not paused");
    fails("RESUME pgbouncer", "database pgbouncer is not paused");
    for cmd in [
        "PAUSE",
        "RESUME",
        "KILL",
        "ENABLE",
        "DISABLE",
        "RECONNECT",
        "WAIT_CLOSE",
    ] {
        fails(&format!("{cmd} nosuch"), "no such database: nosuch");
    }
    fails("PAUSE pgbouncer", "cannot pause admin db: pgbouncer");
    fails("KILL pgbouncer", "cannot kill admin db: pgbouncer");
    fails("DISABLE pgbouncer", "cannot disable admin db: pgbouncer");
    fails("ENABLE pgbouncer", "cannot disable admin db: pgbouncer");
    fails(
        "RECONNECT pgbouncer",
        "cannot reconnect admin db: pgbouncer",
    );
    fails("WAIT_CLOSE pgbouncer", "cannot wait in admin db: pgbouncer");

    ok(&mut a, "PAUSE");
    for sql in ["PAUSE", "PAUSE postgres", "SUSPEND", "KILL postgres"] {
        fails_with(&mut a, sql, "already suspended/paused");
    }
    ok(&mut a, "RESUME");
    ok(&mut a, "SUSPEND");
    fails_with(&mut a, "PAUSE", "already suspended/paused");
    ok(&mut a, "RESUME");
    fails_with(&mut a, "RESUME", "pooler is not paused/suspended");
    // And the pooler serves again.
    let mut c = RawConn::startup(weir.port(), "postgres", "postgres", &[]).unwrap();
    assert_eq!(c.query_one("select 1"), "1");
}

/// With max_client_conn full, clients are refused but the console is still reachable
/// (PgBouncer does not limit its admin database).
#[test]
fn console_is_reachable_when_max_client_conn_is_full() {
    let pg = PgServer::start();
    let weir = Weir::for_pg(&pg)
        .set("admin_users", "postgres")
        .set("max_client_conn", 1)
        .start();
    let mut c = RawConn::startup(weir.port(), "postgres", "postgres", &[]).unwrap();
    let e = RawConn::startup(weir.port(), "postgres", "postgres", &[])
        .err()
        .expect("a second client got in with max_client_conn=1");
    assert_eq!(e.message, "no more connections allowed (max_client_conn)");
    let mut a = admin(&weir);
    assert_eq!(
        ok(&mut a, "SHOW USERS").num("name", "postgres", "current_client_connections"),
        2
    );
    assert_eq!(c.query_one("select 1"), "1");
}

/// The console's own logins and commands count on the `pgbouncer` database, as in
/// PgBouncer (SHOW STATS_TOTALS, and so SHOW TOTALS).
#[test]
fn console_logins_and_commands_are_counted() {
    let pg = PgServer::start();
    let weir = Weir::for_pg(&pg).set("admin_users", "postgres").start();
    let mut a = admin(&weir);
    ok(&mut a, "SHOW VERSION");
    ok(&mut a, "SHOW VERSION");
    // The third command counts itself: PgBouncer counts a query as it arrives.
    let stats = ok(&mut a, "SHOW STATS_TOTALS");
    for (col, want) in [
        ("client_login_count", 1),
        ("xact_count", 3),
        ("query_count", 3),
    ] {
        assert_eq!(stats.num("database", "pgbouncer", col), want, "{col}");
    }
    let totals = ok(&mut a, "SHOW TOTALS");
    assert_eq!(totals.num("name", "total_query_count", "value"), 4);
    assert_eq!(totals.num("name", "total_client_login_count", "value"), 1);
}
