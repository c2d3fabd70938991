//! Replication connections through Weir (`replication=database|true`), as PgBouncer 1.23
//! passes them: pg_basebackup, pg_receivewal, pg_recvlogical and a logical subscription
//! work through it, each replication client has a server of its own that SHOW
//! CLIENTS/SERVERS/POOLS list and that is closed with it, and `replication` never reaches
//! a pooled server as a setting.

mod common;

use std::fs;
use std::time::Duration;

use common::console::ok;
use common::pg::bindir;
use common::*;

/// A console session as postgres (an admin user in these tests).
fn admin(weir: &Weir) -> RawConn {
    RawConn::startup(weir.port(), "postgres", "pgbouncer", &[])
        .unwrap_or_else(|e| panic!("console login failed: {e:?}"))
}

/// The `replication` column of SHOW CLIENTS or SHOW SERVERS, one entry per row.
fn replication_column(weir: &Weir, show: &str) -> Vec<String> {
    let res = ok(&mut admin(weir), show);
    let i = res.col("replication");
    let db = res.col("database");
    res.rows
        .iter()
        .filter(|r| r[db].as_deref() != Some("pgbouncer"))
        .map(|r| r[i].clone().unwrap_or_default())
        .collect()
}

fn count_of(column: &[String], kind: &str) -> usize {
    column.iter().filter(|k| *k == kind).count()
}

/// Walsenders PostgreSQL runs now.
fn walsenders(pg: &PgServer) -> i64 {
    pg.psql("select count(*) from pg_stat_activity where backend_type = 'walsender'")
        .trim()
        .parse()
        .unwrap_or(-1)
}

/// A replication connection as postgres (`replication=value`, and `extra`) that has
/// answered IDENTIFY_SYSTEM.
fn replication_client(port: u16, value: &str, extra: &[(&str, &str)]) -> RawConn {
    let mut params = vec![("replication", value)];
    params.extend_from_slice(extra);
    let mut c = RawConn::startup(port, "postgres", "postgres", &params)
        .unwrap_or_else(|e| panic!("replication={value} login failed: {e:?}"));
    let system = c.simple_query("IDENTIFY_SYSTEM").expect("IDENTIFY_SYSTEM");
    assert_eq!(system.len(), 1, "{system:?}");
    c
}

/// Once its clients have gone, no replication server is left, on either side, and the
/// pool serves ordinary clients (in the slots the replication servers had).
fn replication_servers_gone(pg: &PgServer, weir: &Weir) {
    assert!(
        eventually(TIMEOUT, || walsenders(pg) == 0),
        "walsenders outlived their clients"
    );
    let listed = || {
        let s = replication_column(weir, "SHOW SERVERS");
        count_of(&s, "logical") + count_of(&s, "physical")
    };
    assert!(eventually(TIMEOUT, || listed() == 0), "{}", listed());
    pooled_client_works(weir);
}

/// Runs one of PostgreSQL's client programs against Weir as postgres; its output.
fn run_tool(weir: &Weir, tool: &str, args: &[&str]) -> String {
    let port = weir.port().to_string();
    let out = run_with_timeout(
        clean_command(bindir().join(tool))
            .args(["-h", "127.0.0.1", "-p", &port, "-U", "postgres"])
            .args(args),
        None,
        Duration::from_secs(120),
    );
    let stdout = String::from_utf8_lossy(&out.stdout).into_owned();
    assert!(
        out.status.success(),
        "{tool} {args:?} through Weir failed:\n{stdout}\n{}\n{}",
        String::from_utf8_lossy(&out.stderr),
        weir.log_tail()
    );
    stdout
}

/// An ordinary client gets a pooled server and its answer.
fn pooled_client_works(weir: &Weir) {
    assert_eq!(
        psql_via(weir, "postgres", "postgres", "select 40 + 2").unwrap(),
        "42"
    );
}

fn weir_for(pg: &PgServer) -> WeirBuilder {
    Weir::for_pg(pg)
        .set("admin_users", "postgres")
        // Replication clients get their own server whatever the pool mode.
        .set("pool_mode", "transaction")
}

#[test]
fn pg_basebackup_and_pg_receivewal_through_weir() {
    let pg = PgServer::start();
    // pg_basebackup and pg_receivewal ignore any dbname given and send
    // `database=replication`, as PostgreSQL's physical walsender needs none: Weir, as
    // PgBouncer, must know that name (an entry of its own, or `*`).
    let weir = weir_for(&pg).database("replication", &pg.connstr()).start();
    let dir = tempfile::tempdir().unwrap();
    let target = dir.path().join("backup");
    let target_dir = target.to_str().unwrap();
    // The dbname is ignored: the entry named `replication` serves it.
    let base = [
        "-d",
        "dbname=postgres",
        "-X",
        "stream",
        "-c",
        "fast",
        "--no-sync",
    ];
    run_tool(
        &weir,
        "pg_basebackup",
        &[&base[..], &["-D", target_dir]].concat(),
    );
    let version = fs::read_to_string(target.join("PG_VERSION")).expect("PG_VERSION copied");
    assert!(!version.trim().is_empty());
    assert!(target.join("global/pg_control").exists());
    // pg_receivewal streams WAL up to a known position.
    let wal = dir.path().join("wal");
    fs::create_dir(&wal).unwrap();
    let end = pg.psql("select pg_current_wal_lsn()");
    let to = ["--no-loop", "--no-sync", "-E", end.trim()];
    run_tool(
        &weir,
        "pg_receivewal",
        &[&to[..], &["-D", wal.to_str().unwrap()]].concat(),
    );
    assert!(
        fs::read_dir(&wal).unwrap().next().is_some(),
        "no WAL received"
    );
    // The backup's two connections (base and WAL stream) were physical walsenders, gone
    // with the client.
    replication_servers_gone(&pg, &weir);
}

#[test]
fn logical_replication_through_weir() {
    let mut publisher = PgServer::start();
    {
        use std::io::Write;
        let mut conf = fs::OpenOptions::new()
            .append(true)
            .open(publisher.data_dir().join("postgresql.conf"))
            .unwrap();
        writeln!(conf, "wal_level = logical").unwrap();
    }
    publisher.restart();
    publisher.exec(
        "create table items (id int primary key, name text); \
         insert into items values (1, 'one'); \
         create publication pub for table items;",
    );
    let weir = weir_for(&publisher).start();
    let subscriber = PgServer::start();
    subscriber.exec("create table items (id int primary key, name text);");
    subscriber.exec(&format!(
        "create subscription sub connection 'host=127.0.0.1 port={} dbname=postgres user=postgres' \
         publication pub",
        weir.port()
    ));
    let rows = || subscriber.psql("select string_agg(id::text, ',' order by id) from items");
    assert!(
        eventually(Duration::from_secs(60), || rows().trim() == "1"),
        "the initial copy did not arrive: {:?}\n{}",
        rows(),
        weir.log_tail()
    );
    // A pooled client writes through the same Weir while the subscription streams.
    psql_via(
        &weir,
        "postgres",
        "postgres",
        "insert into items values (2, 'two')",
    )
    .unwrap();
    assert!(
        eventually(Duration::from_secs(60), || rows().trim() == "1,2"),
        "the insert did not stream: {:?}\n{}",
        rows(),
        weir.log_tail()
    );
    // The apply worker's connection is a logical one, listed as such on both sides.
    assert!(count_of(&replication_column(&weir, "SHOW CLIENTS"), "logical") >= 1);
    assert!(count_of(&replication_column(&weir, "SHOW SERVERS"), "logical") >= 1);
    let streaming =
        publisher.psql("select count(*) from pg_stat_replication where state = 'streaming'");
    assert_eq!(streaming.trim(), "1");
    subscriber.exec("drop subscription sub");
    replication_servers_gone(&publisher, &weir);
    assert_eq!(
        publisher
            .psql("select count(*) from pg_replication_slots")
            .trim(),
        "0",
        "DROP SUBSCRIPTION dropped its slot through Weir"
    );

    // pg_recvlogical: a slot made, read up to a known LSN and dropped, all through Weir.
    let recvlogical = |args: &[&str]| {
        let slot = ["-d", "postgres", "-S", "decoded"];
        run_tool(&weir, "pg_recvlogical", &[&slot[..], args].concat())
    };
    recvlogical(&["--create-slot", "-P", "test_decoding"]);
    publisher.exec("insert into items values (3, 'three')");
    // The insert position: the harness runs PostgreSQL with synchronous_commit off, so the
    // write position may not have reached the commit yet.
    let end = publisher.psql("select pg_current_wal_insert_lsn()");
    let decoded = recvlogical(&["--start", "--no-loop", "-f", "-", "-E", end.trim()]);
    assert!(
        decoded.contains("table public.items: INSERT: id[integer]:3"),
        "{decoded}"
    );
    recvlogical(&["--drop-slot"]);
    replication_servers_gone(&publisher, &weir);
    assert_eq!(
        publisher
            .psql("select count(*) from pg_replication_slots")
            .trim(),
        "0"
    );
}

#[test]
fn replication_clients_have_their_own_server_listed_and_closed() {
    let pg = PgServer::start();
    let weir = weir_for(&pg).set("default_pool_size", 4).start();
    let mut logical = replication_client(
        weir.port(),
        "database",
        &[
            ("application_name", "repl_app"),
            ("options", "-c enable_seqscan=off"),
        ],
    );
    // Its startup parameters went to its server as PostgreSQL's own, not as settings.
    assert_eq!(logical.query_one("SHOW enable_seqscan"), "off");
    assert_eq!(logical.query_one("SHOW application_name"), "repl_app");

    let mut physical = replication_client(weir.port(), "yes", &[]);
    let e = physical
        .simple_query("select 1")
        .expect_err("SQL on a physical walsender");
    assert!(e.message.contains("WAL sender"), "{e:?}");
    assert_eq!(walsenders(&pg), 2);

    // Pooled clients carry on beside them, on servers of their own.
    pooled_client_works(&weir);
    let clients = replication_column(&weir, "SHOW CLIENTS");
    assert_eq!(count_of(&clients, "logical"), 1, "{clients:?}");
    assert_eq!(count_of(&clients, "physical"), 1, "{clients:?}");
    let servers = replication_column(&weir, "SHOW SERVERS");
    assert_eq!(count_of(&servers, "logical"), 1, "{servers:?}");
    assert_eq!(count_of(&servers, "physical"), 1, "{servers:?}");
    assert!(count_of(&servers, "none") >= 1, "{servers:?}");
    let pools = ok(&mut admin(&weir), "SHOW POOLS");
    assert!(pools.num("database", "postgres", "sv_active") >= 2);
    assert!(pools.num("database", "postgres", "cl_active") >= 2);
    // The pooled server never saw `replication`: it is an ordinary backend.
    assert_eq!(
        pg.psql(
            "select count(*) from pg_stat_activity \
             where backend_type = 'client backend' and usename = 'postgres' \
             and pid <> pg_backend_pid()"
        )
        .trim(),
        "1"
    );

    drop(logical);
    drop(physical);
    replication_servers_gone(&pg, &weir);
}

/// Replication over TLS on both sides (PgBouncer's test_ssl_replication): the client
/// speaks TLS to Weir, which opens the walsender's server over TLS too (PostgreSQL takes
/// nothing else); replication commands and SQL work on it. ~2 s.
#[test]
fn replication_over_tls_on_both_sides() {
    let certs = common::tls::Certs::new();
    let pg = PgServer::start();
    pg.enable_tls(
        &certs.path("server.crt"),
        &certs.path("server.key"),
        &certs.path("ca.crt"),
    );
    pg.set_hba_only(&["hostssl all postgres 127.0.0.1/32 trust"]);
    let weir = weir_for(&pg)
        .set("server_tls_sslmode", "require")
        .set("client_tls_sslmode", "require")
        .set("client_tls_cert_file", certs.p("server.crt"))
        .set("client_tls_key_file", certs.p("server.key"))
        .start();
    let replication = "sslmode=require replication=database";
    let system = psql_conninfo(&weir, replication, "IDENTIFY_SYSTEM")
        .unwrap_or_else(|e| panic!("{e}\n{}", weir.log_tail()));
    assert!(!system.is_empty());
    let seen = psql_conninfo(
        &weir,
        replication,
        "select s.ssl, a.backend_type from pg_stat_ssl s join pg_stat_activity a \
         using (pid) where pid = pg_backend_pid()",
    );
    assert_eq!(seen.as_deref(), Ok("t|walsender"), "{}", weir.log_tail());
    let plain = psql_conninfo(
        &weir,
        "sslmode=disable replication=database",
        "IDENTIFY_SYSTEM",
    );
    assert!(plain.is_err_and(|e| e.contains("SSL required")));
    assert!(eventually(TIMEOUT, || walsenders(&pg) == 0));
    let pooled = psql_conninfo(&weir, "sslmode=require", "select 40 + 2");
    assert_eq!(pooled.as_deref(), Ok("42"));
}

#[test]
fn a_full_pool_makes_room_or_queues_the_replication_client() {
    let pg = PgServer::start();
    let weir = weir_for(&pg).set("default_pool_size", 1).start();
    psql_via(&weir, "postgres", "postgres", "select 1").unwrap();
    assert_eq!(replication_column(&weir, "SHOW SERVERS"), vec!["none"]);
    // The pool's one slot is held by an idle server: closed to make room.
    let first = replication_client(weir.port(), "database", &[]);
    assert_eq!(replication_column(&weir, "SHOW SERVERS"), vec!["logical"]);
    assert!(
        weir.log().contains("evicted for pool_size"),
        "{}",
        weir.log_tail()
    );
    // Held by a replication server: the next one waits for it to go.
    let port = weir.port();
    let second = std::thread::spawn(move || replication_client(port, "database", &[]));
    assert!(
        eventually(TIMEOUT, || ok(&mut admin(&weir), "SHOW POOLS").num(
            "database",
            "postgres",
            "cl_waiting"
        ) == 1),
        "the second replication client should wait for the pool's one slot"
    );
    // One that gives up while waiting leaves the queue, and no server is opened for it.
    let mut quitter = RawConn::connect(weir.port());
    quitter.send(&common::proto::startup_message(&[
        ("user", "postgres"),
        ("database", "postgres"),
        ("replication", "database"),
    ]));
    let waiting = || ok(&mut admin(&weir), "SHOW POOLS").num("database", "postgres", "cl_waiting");
    assert!(eventually(TIMEOUT, || waiting() == 2));
    drop(quitter);
    assert!(eventually(TIMEOUT, || waiting() == 1));
    assert_eq!(walsenders(&pg), 1);
    drop(first);
    let second = second.join().expect("the second replication client got in");
    assert!(eventually(TIMEOUT, || walsenders(&pg) == 1));
    drop(second);
    replication_servers_gone(&pg, &weir);
}

/// A pool over its pool_size by the reserve (PgBouncer's
/// test_replication_pool_size_over_full_pool): a replication client closes enough idle
/// servers to get below pool_size, two here, rather than open one more on top. ~4 s.
#[test]
fn a_pool_over_its_size_by_the_reserve_makes_room_for_replication() {
    let pg = PgServer::start();
    let weir = weir_for(&pg)
        .set("default_pool_size", 1)
        .set("reserve_pool_size", 1)
        .set("reserve_pool_timeout", 1)
        // The second sleep waits for a server, rather than go behind the first.
        .set("pipeline_depth", 0)
        .start();
    let port = weir.port();
    let sleepers: Vec<_> = (0..2)
        .map(|_| {
            std::thread::spawn(move || {
                let mut c = RawConn::startup(port, "postgres", "postgres", &[]).expect("login");
                c.simple_query("select pg_sleep(2)").expect("sleep");
            })
        })
        .collect();
    for s in sleepers {
        s.join().expect("a sleeper failed");
    }
    assert_eq!(
        weir.logfile()
            .matches("taking connection from reserve_pool")
            .count(),
        1,
        "{}",
        weir.log_tail()
    );
    assert_eq!(
        count_of(&replication_column(&weir, "SHOW SERVERS"), "none"),
        2
    );
    let c = replication_client(weir.port(), "database", &[]);
    assert_eq!(
        weir.logfile().matches("evicted for pool_size").count(),
        2,
        "{}",
        weir.log_tail()
    );
    assert_eq!(replication_column(&weir, "SHOW SERVERS"), vec!["logical"]);
    drop(c);
    replication_servers_gone(&pg, &weir);
}

#[test]
fn replication_servers_count_against_max_db_connections() {
    let pg = PgServer::start();
    let weir = weir_for(&pg)
        .set("max_db_connections", 1)
        .set("query_wait_timeout", 2)
        .start();
    let logical = replication_client(weir.port(), "database", &[]);
    let e = psql_via(&weir, "postgres", "postgres", "select 1")
        .expect_err("a pooled client got a server past max_db_connections");
    assert!(e.contains("query_wait_timeout"), "{e}");
    drop(logical);
    replication_servers_gone(&pg, &weir);
}

#[test]
fn replication_is_checked_and_never_a_setting() {
    let pg = PgServer::start();
    let weir = weir_for(&pg).start();
    // `false` is an ordinary connection, pooled.
    let mut plain = RawConn::startup(
        weir.port(),
        "postgres",
        "postgres",
        &[("replication", "off")],
    )
    .unwrap_or_else(|e| panic!("replication=off login failed: {e:?}"));
    assert_eq!(plain.query_one("select 'pooled'"), "pooled");
    assert_eq!(walsenders(&pg), 0);
    assert_eq!(
        replication_column(&weir, "SHOW CLIENTS"),
        vec!["none"],
        "replication=off is a plain client"
    );
    let refused = |db: &str, value: &str| {
        RawConn::startup(weir.port(), "postgres", db, &[("replication", value)])
            .err()
            .unwrap_or_else(|| panic!("replication={value} to {db} was let in"))
    };
    let e = refused("postgres", "sometimes");
    assert_eq!(e.code, "22023", "{e:?}");
    assert!(e.message.contains("replication"), "{e:?}");
    let e = refused("pgbouncer", "database");
    assert_eq!(e.code, "0A000", "{e:?}");
    // The client's settings go into its server's startup packet: none may name the
    // database or user the pool logs in as, or it would log in elsewhere.
    for setting in [
        "-c database=template1",
        "-c user=nobody",
        "-c replication=true",
    ] {
        let e = RawConn::startup(
            weir.port(),
            "postgres",
            "postgres",
            &[("replication", "database"), ("options", setting)],
        )
        .err()
        .unwrap_or_else(|| panic!("replication with options {setting} was let in"));
        assert_eq!(e.code, "42704", "{setting}: {e:?}");
    }
    assert_eq!(walsenders(&pg), 0);
    // Weir is unharmed.
    assert_eq!(plain.query_one("select 'still here'"), "still here");
}

#[test]
fn replication_login_with_auth_query_and_refused_roles() {
    let pg = PgServer::start();
    pg.create_user_lookup();
    pg.exec(
        "set password_encryption = 'md5'; \
         create role repl login replication password 'repl-pw'; \
         create role norepl login password 'norepl-pw';",
    );
    let weir = weir_for(&pg)
        .auth_query_lookup()
        .userlist(&[("postgres", "pw"), ("lookup", "")])
        .start();
    let repl = |user: &str, password: &str| {
        psql_at(
            "127.0.0.1",
            weir.port(),
            "dbname=postgres replication=database",
            user,
            Some(password),
            "IDENTIFY_SYSTEM",
        )
    };
    let system = repl("repl", "repl-pw")
        .unwrap_or_else(|e| panic!("auth_query user's replication login failed: {e}"));
    assert!(!system.is_empty());
    // A role without REPLICATION is refused by PostgreSQL, and told why.
    let e = repl("norepl", "norepl-pw").expect_err("a role without REPLICATION is refused");
    assert!(e.contains("WAL sender") || e.contains("replication"), "{e}");
    // A wrong password is Weir's to refuse, before any server is opened.
    let e = repl("repl", "wrong").expect_err("a wrong password is refused");
    assert!(e.contains("password authentication failed"), "{e}");
    // Its ordinary logins are not held up by that refusal.
    assert_eq!(
        psql_at(
            "127.0.0.1",
            weir.port(),
            "postgres",
            "norepl",
            Some("norepl-pw"),
            "select 3"
        )
        .unwrap(),
        "3"
    );
}

/// auth_type = hba as PostgreSQL reads pg_hba.conf: `all` does not take a physical
/// replication client (it could copy the whole cluster); only a `replication` line does.
/// A logical one is matched by its database.
#[test]
fn hba_takes_physical_replication_only_by_its_keyword() {
    let pg = PgServer::start();
    let dir = tempfile::tempdir().expect("tempdir");
    let start = |hba: &str| {
        let path = dir.path().join("hba.conf");
        std::fs::write(&path, hba).expect("write hba");
        weir_for(&pg)
            .database("replication", &pg.connstr())
            .set("auth_type", "hba")
            .set("auth_hba_file", path.display())
            .start()
    };
    let login = |weir: &Weir, kind: &str, db: &str| {
        RawConn::startup(weir.port(), "postgres", db, &[("replication", kind)])
    };
    let weir = start("host all all 127.0.0.1/32 trust\n");
    let e = login(&weir, "true", "replication")
        .err()
        .expect("a physical client let in by an `all` line");
    assert_eq!(e.code, "28000", "{e:?}");
    assert!(e.message.contains("no pg_hba.conf entry"), "{e:?}");
    login(&weir, "database", "postgres").expect("a logical client, matched by its database");
    drop(weir);
    let weir = start("host replication all 127.0.0.1/32 trust\nhost all all 127.0.0.1/32 reject\n");
    let mut c = login(&weir, "true", "replication").expect("physical, by the replication line");
    assert!(c.simple_query("IDENTIFY_SYSTEM").is_ok());
}
