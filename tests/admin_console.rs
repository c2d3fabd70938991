//! The admin console (`psql -p 6432 pgbouncer`): PgBouncer's SHOW commands with its
//! columns and types, values that follow real traffic, access rules, and the control
//! commands (PAUSE/RESUME, KILL, KILL_CLIENT, DISABLE/ENABLE, RECONNECT/WAIT_CLOSE, SET,
//! RELOAD, SHUTDOWN) against a real PostgreSQL.

mod common;

use common::console::*;
use common::*;
use std::sync::mpsc;
use std::time::{Duration, Instant};

// ---------------------------------------------------------------------------
// Local helpers.

fn admin(weir: &Weir, user: &str) -> RawConn {
    RawConn::startup(weir.port(), user, "pgbouncer", &[])
        .unwrap_or_else(|e| panic!("console login as {user} failed: {e:?}"))
}

fn client(weir: &Weir, app: &str) -> RawConn {
    RawConn::startup(
        weir.port(),
        "postgres",
        "postgres",
        &[("application_name", app)],
    )
    .unwrap_or_else(|e| panic!("client login failed: {e:?}"))
}

fn start(pg: &PgServer, mode: &str) -> Weir {
    Weir::for_pg(pg)
        .set("pool_mode", mode)
        .set("admin_users", "postgres")
        .set("stats_users", "stats")
        .userlist(&[("postgres", ""), ("stats", ""), ("app", "")])
        .start()
}

type QueryDone = (RawConn, Result<Vec<Vec<Option<String>>>, ErrorFields>);
type ConsoleDone = (RawConn, Result<Res, ErrorFields>);

/// Runs `sql` on a client in a thread; the receiver gets the result when it finishes.
fn in_thread(mut c: RawConn, sql: &'static str) -> mpsc::Receiver<QueryDone> {
    let (tx, rx) = mpsc::channel();
    std::thread::spawn(move || {
        let r = c.simple_query(sql);
        let _ = tx.send((c, r));
    });
    rx
}

fn console_in_thread(mut c: RawConn, sql: &'static str) -> mpsc::Receiver<ConsoleDone> {
    let (tx, rx) = mpsc::channel();
    std::thread::spawn(move || {
        let r = run(&mut c, sql);
        let _ = tx.send((c, r));
    });
    rx
}

const TEXT: u32 = 25;
const INT4: u32 = 23;
const INT8: u32 = 20;
const NUMERIC: u32 = 1700;
const BYTEA: u32 = 17;

/// PgBouncer 1.24's columns: names and pktbuf type letters (s/T text, i int4, q int8,
/// N numeric, b bytea), from its src/admin.c and src/stats.c.
fn pgbouncer_columns(cmd: &str) -> (&'static str, Vec<&'static str>) {
    let socket = vec![
        "type",
        "user",
        "database",
        "replication",
        "state",
        "addr",
        "port",
        "local_addr",
        "local_port",
        "connect_time",
        "request_time",
        "wait",
        "wait_us",
        "close_needed",
        "ptr",
        "link",
        "remote_pid",
        "tls",
        "application_name",
        "prepared_statements",
        "id",
        // Weir's own, after PgBouncer's: what pins a client to its server.
        "pinned",
    ];
    let mut debug = socket.clone();
    debug.extend([
        "recv_pos",
        "pkt_pos",
        "pkt_remain",
        "send_pos",
        "send_remain",
        "pkt_avail",
        "send_avail",
    ]);
    match cmd {
        "STATS" => (
            "sNNNNNNNNNNNNNNNNNNNNNNNNNNNN",
            vec![
                "database",
                "total_server_assignment_count",
                "total_xact_count",
                "total_query_count",
                "total_received",
                "total_sent",
                "total_xact_time",
                "total_query_time",
                "total_wait_time",
                "total_client_parse_count",
                "total_server_parse_count",
                "total_bind_count",
                "total_client_login_count",
                "avg_server_assignment_count",
                "avg_xact_count",
                "avg_query_count",
                "avg_recv",
                "avg_sent",
                "avg_xact_time",
                "avg_query_time",
                "avg_wait_time",
                "avg_client_parse_count",
                "avg_server_parse_count",
                "avg_bind_count",
                "avg_client_login_count",
                "total_pipelined_count",
                "avg_pipelined_count",
                "total_state_applied_count",
                "total_state_round_trip_count",
            ],
        ),
        "STATS_TOTALS" => (
            "sNNNNNNNNNNNN",
            vec![
                "database",
                "server_assignment_count",
                "xact_count",
                "query_count",
                "bytes_received",
                "bytes_sent",
                "xact_time",
                "query_time",
                "wait_time",
                "client_parse_count",
                "server_parse_count",
                "bind_count",
                "client_login_count",
            ],
        ),
        "STATS_AVERAGES" => (
            "sNNNNNNNNNNNN",
            vec![
                "database",
                "server_assignment_count",
                "xact_count",
                "query_count",
                "bytes_received",
                "bytes_sent",
                "xact_time",
                "query_time",
                "wait_time",
                "avg_client_parse_count",
                "avg_server_parse_count",
                "avg_bind_count",
                "client_login_count",
            ],
        ),
        "TOTALS" => ("sN", vec!["name", "value"]),
        "SERVERS" | "CLIENTS" => ("ssssssisiTTiiississiis", socket),
        "SOCKETS" | "ACTIVE_SOCKETS" => ("ssssssisiTTiiississiisiiiiiii", debug),
        "POOLS" => (
            "ssiiiiiiiiiiiiissii",
            vec![
                "database",
                "user",
                "cl_active",
                "cl_waiting",
                "cl_active_cancel_req",
                "cl_waiting_cancel_req",
                "sv_active",
                "sv_active_cancel",
                "sv_being_canceled",
                "sv_idle",
                "sv_used",
                "sv_tested",
                "sv_login",
                "maxwait",
                "maxwait_us",
                "pool_mode",
                "load_balance_hosts",
                "cl_pipelined",
                "pipeline_depth",
            ],
        ),
        "LISTS" => ("si", vec!["list", "items"]),
        "USERS" => (
            "ssssiiii",
            vec![
                "name",
                "pool_size",
                "reserve_pool_size",
                "pool_mode",
                "max_user_connections",
                "current_connections",
                "max_user_client_connections",
                "current_client_connections",
            ],
        ),
        "DATABASES" => (
            "ssissiiiissiiiiii",
            vec![
                "name",
                "host",
                "port",
                "database",
                "force_user",
                "pool_size",
                "min_pool_size",
                "reserve_pool_size",
                "server_lifetime",
                "pool_mode",
                "load_balance_hosts",
                "max_connections",
                "current_connections",
                "max_client_connections",
                "current_client_connections",
                "paused",
                "disabled",
            ],
        ),
        "PEERS" => ("isii", vec!["peer_id", "host", "port", "pool_size"]),
        "PEER_POOLS" => (
            "iiiii",
            vec![
                "peer_id",
                "cl_active_cancel_req",
                "cl_waiting_cancel_req",
                "sv_active_cancel",
                "sv_login",
            ],
        ),
        "FDS" => (
            "issssiqisssssbb",
            vec![
                "fd",
                "task",
                "user",
                "database",
                "addr",
                "port",
                "cancel",
                "link",
                "client_encoding",
                "std_strings",
                "datestyle",
                "timezone",
                "password",
                "scram_client_key",
                "scram_server_key",
            ],
        ),
        "CONFIG" => ("ssss", vec!["key", "value", "default", "changeable"]),
        "MEM" => ("siiii", vec!["name", "size", "used", "free", "memtotal"]),
        "DNS_HOSTS" => ("sqs", vec!["hostname", "ttl", "addrs"]),
        "DNS_ZONES" => ("sqi", vec!["zonename", "serial", "count"]),
        "STATE" => ("ss", vec!["key", "value"]),
        "VERSION" => ("s", vec!["version"]),
        other => panic!("no column list for {other}"),
    }
}

fn oid_of(letter: char) -> u32 {
    match letter {
        'i' => INT4,
        'q' => INT8,
        'N' => NUMERIC,
        'b' => BYTEA,
        _ => TEXT,
    }
}

// ---------------------------------------------------------------------------

#[test]
fn show_commands_have_pgbouncers_columns_and_types() {
    let pg = PgServer::start();
    let weir = start(&pg, "transaction");
    let mut c = client(&weir, "cols");
    assert_eq!(c.query_one("select 1"), "1");
    let mut a = admin(&weir, "postgres");
    assert_eq!(
        a.params
            .get("server_version")
            .map(|v| v.ends_with("/bouncer")),
        Some(true),
        "{:?}",
        a.params
    );
    assert_eq!(
        a.params.get("client_encoding").map(String::as_str),
        Some("UTF8")
    );
    assert!(a.key.is_some(), "no BackendKeyData");
    for cmd in [
        "STATS",
        "STATS_TOTALS",
        "STATS_AVERAGES",
        "TOTALS",
        "SERVERS",
        "CLIENTS",
        "POOLS",
        "LISTS",
        "USERS",
        "DATABASES",
        "PEERS",
        "PEER_POOLS",
        "FDS",
        "SOCKETS",
        "ACTIVE_SOCKETS",
        "CONFIG",
        "MEM",
        "DNS_HOSTS",
        "DNS_ZONES",
        "STATE",
        "VERSION",
    ] {
        let res = ok(&mut a, &format!("SHOW {cmd};"));
        let (types, names) = pgbouncer_columns(cmd);
        let got: Vec<&str> = res.cols.iter().map(|(n, _)| n.as_str()).collect();
        assert_eq!(got, names, "columns of SHOW {cmd}");
        let oids: Vec<u32> = res.cols.iter().map(|(_, o)| *o).collect();
        let want: Vec<u32> = types.chars().map(oid_of).collect();
        assert_eq!(oids, want, "column types of SHOW {cmd}");
        assert_eq!(res.tags, vec!["SHOW"], "command tag of SHOW {cmd}");
        for r in &res.rows {
            assert_eq!(r.len(), names.len(), "row width of SHOW {cmd}");
        }
    }
    // Lower case works too, and so does SHOW's alias SELECT.
    assert_eq!(ok(&mut a, "show version").rows.len(), 1);
    let v = ok(&mut a, "SHOW VERSION").rows[0][0].clone().unwrap();
    assert!(v.starts_with("PgBouncer 1."), "{v}");
    let lists = ok(&mut a, "SHOW LISTS");
    let names: Vec<&str> = lists
        .rows
        .iter()
        .map(|r| r[0].as_deref().unwrap())
        .collect();
    assert_eq!(
        names,
        [
            "databases",
            "users",
            "peers",
            "pools",
            "peer_pools",
            "free_clients",
            "used_clients",
            "login_clients",
            "free_servers",
            "used_servers",
            "dns_names",
            "dns_zones",
            "dns_queries",
            "dns_pending"
        ]
    );
    let state = ok(&mut a, "SHOW STATE");
    assert_eq!(state.get("key", "active", "value"), "yes");
    assert_eq!(state.get("key", "paused", "value"), "no");
    // psql speaks to it too.
    let out = psql_via(&weir, "pgbouncer", "postgres", "SHOW STATE").unwrap();
    assert!(out.contains("active|yes"), "{out}");
}

#[test]
fn stats_count_the_traffic() {
    let pg = PgServer::start();
    let weir = start(&pg, "transaction");
    let mut a = admin(&weir, "postgres");
    let mut c = client(&weir, "stats");
    assert_eq!(c.query_one("select 1"), "1");
    let before = ok(&mut a, "SHOW STATS_TOTALS");
    let xacts0 = before.num("database", "postgres", "xact_count");
    let queries0 = before.num("database", "postgres", "query_count");
    const N: i64 = 25;
    for i in 0..N {
        assert_eq!(c.query_one(&format!("select {i}")), i.to_string());
    }
    // Two statements in one explicit transaction: one transaction, three queries.
    c.simple_query("begin").unwrap();
    c.simple_query("select 1").unwrap();
    c.simple_query("commit").unwrap();
    let after = ok(&mut a, "SHOW STATS_TOTALS");
    assert_eq!(
        after.num("database", "postgres", "xact_count") - xacts0,
        N + 1
    );
    assert_eq!(
        after.num("database", "postgres", "query_count") - queries0,
        N + 3
    );
    assert!(after.num("database", "postgres", "bytes_received") > 0);
    assert!(after.num("database", "postgres", "bytes_sent") > 0);
    assert!(after.num("database", "postgres", "query_time") > 0);
    let stats = ok(&mut a, "SHOW STATS");
    assert_eq!(
        stats.num("database", "postgres", "total_xact_count"),
        after.num("database", "postgres", "xact_count")
    );
    assert!(stats.num("database", "postgres", "avg_xact_count") > 0);
    // TOTALS adds the console's commands, which count on database pgbouncer.
    let totals = ok(&mut a, "SHOW TOTALS");
    assert_eq!(
        totals.num("name", "total_xact_count", "value"),
        after.num("database", "postgres", "xact_count")
            + after.num("database", "pgbouncer", "xact_count")
            + 2
    );
}

/// Every successful client login counts once in its database's client_login_count, however
/// many queries the session then runs; refused logins do not count, console sessions
/// count on database pgbouncer, as in PgBouncer.
#[test]
fn stats_count_client_logins() {
    let pg = PgServer::start();
    let weir = Weir::for_pg(&pg)
        .database("other", &pg.connstr())
        .set("admin_users", "postgres")
        .start();
    let mut a = admin(&weir, "postgres");
    const N: i64 = 7;
    for i in 0..N {
        let mut c = client(&weir, "logins");
        // Queries are not logins: each session runs several.
        for _ in 0..=i {
            assert_eq!(c.query_one("select 1"), "1");
        }
    }
    for _ in 0..2 {
        let mut c = RawConn::startup(weir.port(), "postgres", "other", &[]).unwrap();
        assert_eq!(c.query_one("select 1"), "1");
    }
    // Refused: a user not in auth_file, a database not configured.
    for (user, db) in [("nosuchuser", "postgres"), ("postgres", "nosuchdb")] {
        assert!(
            RawConn::startup(weir.port(), user, db, &[]).is_err(),
            "{user}@{db} logged in"
        );
    }
    let _second_console = admin(&weir, "postgres");

    let totals = ok(&mut a, "SHOW STATS_TOTALS");
    assert_eq!(
        totals.num("database", "postgres", "client_login_count"),
        N,
        "{totals:#?}"
    );
    assert_eq!(totals.num("database", "other", "client_login_count"), 2);
    assert_eq!(totals.num("database", "pgbouncer", "client_login_count"), 2);
    let stats = ok(&mut a, "SHOW STATS");
    assert_eq!(
        stats.num("database", "postgres", "total_client_login_count"),
        N
    );
    // The average is per second over a window of at least one second (PgBouncer's
    // calc_average), so it cannot exceed the total.
    let avg = stats.num("database", "postgres", "avg_client_login_count");
    assert!((0..=N).contains(&avg), "avg_client_login_count {avg}");
    let averages = ok(&mut a, "SHOW STATS_AVERAGES");
    let avg = averages.num("database", "other", "client_login_count");
    assert!((0..=2).contains(&avg), "client_login_count average {avg}");
    let all = ok(&mut a, "SHOW TOTALS");
    // The two console sessions too.
    assert_eq!(all.num("name", "total_client_login_count", "value"), N + 4);
    let avg = all.num("name", "avg_client_login_count", "value");
    assert!((0..=N + 4).contains(&avg), "avg_client_login_count {avg}");
}

/// With a wildcard listen_addr the listener knows no local address: each client's is read
/// from its socket, the address it actually reached (not 0.0.0.0).
#[test]
fn show_clients_local_end_behind_a_wildcard_listen_addr() {
    let pg = PgServer::start();
    let weir = Weir::for_pg(&pg)
        .set("listen_addr", "*")
        .set("admin_users", "postgres")
        .userlist(&[("postgres", "")])
        .start();
    let c = client(&weir, "wild");
    let mut a = admin(&weir, "postgres");
    let clients = ok(&mut a, "SHOW CLIENTS");
    assert_client_ends(&clients, "wild", &c, &weir);
}

/// SHOW CLIENTS has both ends of the client's connection as its socket has them (taken
/// from accept() and the listener's bound address, not looked up per connection).
fn assert_client_ends(clients: &Res, app: &str, c: &RawConn, weir: &Weir) {
    let mine = c.stream.local_addr().expect("local addr");
    let row = |col| clients.get("application_name", app, col);
    assert_eq!(row("addr"), mine.ip().to_string());
    assert_eq!(row("port"), mine.port().to_string());
    assert_eq!(row("local_addr"), "127.0.0.1");
    assert_eq!(row("local_port"), weir.port().to_string());
}

#[test]
fn pools_clients_servers_and_databases_show_live_connections() {
    let pg = PgServer::start();
    let weir = start(&pg, "transaction");
    let mut c1 = client(&weir, "app-one");
    let mut c2 = client(&weir, "app-two");
    assert_eq!(c1.query_one("select 1"), "1");
    let pid: String = c2.query_one("select pg_backend_pid()");
    let mut a = admin(&weir, "postgres");

    let pools = ok(&mut a, "SHOW POOLS");
    let p = pools.find("database", "postgres");
    assert_eq!(p.len(), 1, "{pools:#?}");
    assert_eq!(pools.num("database", "postgres", "cl_active"), 2);
    assert_eq!(pools.num("database", "postgres", "cl_waiting"), 0);
    assert_eq!(pools.num("database", "postgres", "sv_active"), 0);
    assert!(pools.num("database", "postgres", "sv_idle") >= 1);
    assert_eq!(
        pools.get("database", "postgres", "pool_mode"),
        "transaction"
    );
    assert_eq!(pools.get("database", "postgres", "user"), "postgres");

    let clients = ok(&mut a, "SHOW CLIENTS");
    let id = clients.get("application_name", "app-one", "id");
    assert_eq!(clients.get("application_name", "app-one", "state"), "idle");
    assert_eq!(
        clients.get("application_name", "app-one", "database"),
        "postgres"
    );
    assert_eq!(
        clients.get("application_name", "app-one", "addr"),
        "127.0.0.1"
    );
    assert_client_ends(&clients, "app-one", &c1, &weir);
    assert_eq!(clients.get("application_name", "app-two", "type"), "C");
    assert!(id.parse::<u32>().is_ok(), "id {id}");
    // The console's own session is listed under database pgbouncer, with its addresses.
    assert!(
        !clients.find("database", "pgbouncer").is_empty(),
        "{clients:#?}"
    );
    assert_client_ends(&clients, "", &a, &weir);

    let servers = ok(&mut a, "SHOW SERVERS");
    let s = servers.find("remote_pid", &pid);
    assert_eq!(
        s.len(),
        1,
        "backend {pid} not in SHOW SERVERS: {servers:#?}"
    );
    assert_eq!(servers.get("remote_pid", &pid, "state"), "idle");
    assert_eq!(servers.get("remote_pid", &pid, "database"), "postgres");
    assert_eq!(
        servers.get("remote_pid", &pid, "port"),
        pg.port().to_string()
    );

    // A transaction in progress: the client is linked to an active server.
    c1.simple_query("begin").unwrap();
    c1.simple_query("select 1").unwrap();
    let pools = ok(&mut a, "SHOW POOLS");
    assert_eq!(pools.num("database", "postgres", "sv_active"), 1);
    let clients = ok(&mut a, "SHOW CLIENTS");
    assert_eq!(
        clients.get("application_name", "app-one", "state"),
        "active"
    );
    let link = clients.get("application_name", "app-one", "link");
    let servers = ok(&mut a, "SHOW SERVERS");
    assert_eq!(servers.get("ptr", &link, "state"), "active");
    assert_eq!(servers.get("ptr", &link, "application_name"), "app-one");
    c1.simple_query("commit").unwrap();

    let dbs = ok(&mut a, "SHOW DATABASES");
    assert_eq!(dbs.num("name", "postgres", "current_client_connections"), 2);
    assert_eq!(dbs.get("name", "postgres", "host"), "127.0.0.1");
    assert_eq!(dbs.num("name", "postgres", "port"), pg.port() as i64);
    assert_eq!(dbs.num("name", "postgres", "paused"), 0);
    assert_eq!(dbs.get("name", "pgbouncer", "pool_mode"), "statement");

    // The console session itself is a client of user postgres too, as in PgBouncer.
    let users = ok(&mut a, "SHOW USERS");
    assert_eq!(
        users.num("name", "postgres", "current_client_connections"),
        3
    );

    let config = ok(&mut a, "SHOW CONFIG");
    assert_eq!(config.get("key", "pool_mode", "value"), "transaction");
    assert_eq!(config.get("key", "listen_port", "changeable"), "no");
    assert_eq!(config.get("key", "server_lifetime", "value"), "3600");
    assert_eq!(config.get("key", "log_connections", "value"), "1");
}

#[test]
fn stats_users_are_read_only_and_others_are_refused() {
    let pg = PgServer::start();
    let weir = start(&pg, "transaction");
    let mut s = admin(&weir, "stats");
    ok(&mut s, "SHOW POOLS");
    ok(&mut s, "SHOW STATS");
    for cmd in [
        "PAUSE",
        "RESUME",
        "KILL postgres",
        "RELOAD",
        "SHUTDOWN",
        "SET default_pool_size = 5",
        "SHOW FDS",
        "DISABLE postgres",
        "RECONNECT",
        "KILL_CLIENT 1",
    ] {
        let e = run(&mut s, cmd)
            .err()
            .unwrap_or_else(|| panic!("{cmd} allowed to a stats user"));
        assert_eq!(e.message, "admin access needed", "{cmd}");
        assert_eq!(e.severity, "ERROR");
    }
    // The session goes on after the refusals.
    assert_eq!(ok(&mut s, "SHOW STATE").rows.len(), 3);
    let e = RawConn::startup(weir.port(), "app", "pgbouncer", &[])
        .err()
        .expect("a user in neither admin_users nor stats_users got in");
    assert_eq!(e.severity, "FATAL");
    assert_eq!(e.code, "28000");
}

#[test]
fn errors_protocol_and_settings() {
    let pg = PgServer::start();
    let weir = start(&pg, "session");
    let mut a = admin(&weir, "postgres");
    let e = run(&mut a, "SHOW NONSENSE").unwrap_err();
    assert_eq!(e.message, "invalid command 'SHOW NONSENSE', use SHOW HELP;");
    assert_eq!(e.code, "08P01");
    assert_eq!(e.severity, "ERROR");
    let e = run(&mut a, "select * from pg_class").unwrap_err();
    assert!(e.message.starts_with("invalid command"), "{e:?}");
    // Several commands in one query, a trailing semicolon.
    let r = ok(&mut a, "SHOW VERSION; show state;");
    assert_eq!(r.tags, vec!["SHOW", "SHOW"]);
    assert_eq!(r.cols[0].0, "key");
    // HELP is a notice.
    let r = ok(&mut a, "SHOW HELP");
    assert_eq!(r.notices, vec!["Console usage"]);
    assert_eq!(r.tags, vec!["SHOW"]);
    // Extended protocol: refused, and the session continues.
    a.send(&proto::parse("", "SHOW POOLS"));
    a.send(&proto::bind("", "", &[]));
    a.send(&proto::execute("", 0));
    a.send(&proto::sync());
    let e = a.expect_error();
    assert_eq!(
        e.message,
        "extended query protocol not supported by admin console"
    );
    let m = a.read_message_or_panic("ReadyForQuery after Sync");
    assert_eq!(m.tag_char(), 'Z');
    assert_eq!(ok(&mut a, "SHOW VERSION").rows.len(), 1);
    // SET of a client parameter is ignored, with a notice.
    let r = ok(&mut a, "SET client_encoding = 'UTF8'");
    assert_eq!(r.notices, vec!["SET ignored"]);
    assert_eq!(r.tags, vec!["SET"]);
    // SET of an option changes the live configuration ...
    let r = ok(&mut a, "SET default_pool_size = 7");
    assert_eq!(r.tags, vec!["SET default_pool_size=7"]);
    let cfg = ok(&mut a, "SHOW CONFIG");
    assert_eq!(cfg.get("key", "default_pool_size", "value"), "7");
    assert_eq!(cfg.get("key", "default_pool_size", "default"), "20");
    let r = ok(&mut a, "SET server_reset_query = 'DISCARD ALL; SELECT 1'");
    assert_eq!(r.tags.len(), 1);
    assert_eq!(
        ok(&mut a, "SHOW CONFIG").get("key", "server_reset_query", "value"),
        "DISCARD ALL; SELECT 1"
    );
    assert_eq!(
        run(&mut a, "SET listen_port = 1").unwrap_err().message,
        "SET failed"
    );
    assert_eq!(
        run(&mut a, "SET no_such_thing = 1").unwrap_err().message,
        "SET failed"
    );
    // ... until RELOAD reads the file again.
    assert_eq!(ok(&mut a, "RELOAD").tags, vec!["RELOAD"]);
    assert_eq!(
        ok(&mut a, "SHOW CONFIG").get("key", "default_pool_size", "value"),
        "20"
    );
    assert_eq!(
        run(&mut a, "RESUME").unwrap_err().message,
        "pooler is not paused/suspended"
    );
    assert_eq!(
        run(&mut a, "PAUSE nosuchdb").unwrap_err().message,
        "no such database: nosuchdb"
    );
    assert_eq!(
        run(&mut a, "DISABLE").unwrap_err().message,
        "a database is required"
    );
    // Terminate ends the session cleanly.
    a.send(&proto::terminate());
    assert!(a.closes());
}

#[test]
fn pause_waits_for_transactions_and_holds_queries_until_resume() {
    let pg = PgServer::start();
    let weir = start(&pg, "transaction");
    let mut a = admin(&weir, "postgres");
    let mut busy = client(&weir, "busy");
    let idle = client(&weir, "idle");
    busy.simple_query("begin").unwrap();
    busy.simple_query("select 1").unwrap();

    // PAUSE does not answer while a transaction holds a server.
    let pausing = console_in_thread(admin(&weir, "postgres"), "PAUSE postgres");
    assert!(
        pausing.recv_timeout(Duration::from_millis(700)).is_err(),
        "PAUSE answered while a transaction was open"
    );
    busy.simple_query("commit").unwrap();
    let (_, r) = pausing
        .recv_timeout(TIMEOUT)
        .expect("PAUSE did not finish after COMMIT");
    assert_eq!(r.unwrap().tags, vec!["PAUSE"]);
    let dbs = ok(&mut a, "SHOW DATABASES");
    assert_eq!(dbs.num("name", "postgres", "paused"), 1);
    // PAUSE disconnects from the servers.
    assert!(
        eventually(TIMEOUT, || ok(&mut a, "SHOW SERVERS").rows.is_empty()),
        "servers left open after PAUSE"
    );

    // A query during PAUSE waits ...
    let started = Instant::now();
    let waiting = in_thread(idle, "select 42");
    assert!(
        waiting.recv_timeout(Duration::from_millis(700)).is_err(),
        "query ran during PAUSE"
    );
    let pools = ok(&mut a, "SHOW POOLS");
    assert_eq!(
        pools.num("database", "postgres", "cl_waiting"),
        1,
        "{pools:#?}"
    );
    let clients = ok(&mut a, "SHOW CLIENTS");
    assert_eq!(clients.get("application_name", "idle", "state"), "waiting");
    // ... and completes after RESUME.
    assert_eq!(ok(&mut a, "RESUME postgres").tags, vec!["RESUME"]);
    let (_, r) = waiting
        .recv_timeout(TIMEOUT)
        .expect("query did not finish after RESUME");
    assert_eq!(r.unwrap()[0][0].as_deref(), Some("42"));
    assert!(started.elapsed() >= Duration::from_millis(700));
    assert_eq!(
        run(&mut a, "RESUME postgres").unwrap_err().message,
        "database postgres is not paused"
    );

    // Pooler-wide PAUSE, SHOW STATE, RESUME.
    assert_eq!(ok(&mut a, "PAUSE").tags, vec!["PAUSE"]);
    let st = ok(&mut a, "SHOW STATE");
    assert_eq!(st.get("key", "paused", "value"), "yes");
    assert_eq!(
        run(&mut a, "PAUSE").unwrap_err().message,
        "already suspended/paused"
    );
    let held = in_thread(busy, "select 7");
    assert!(
        held.recv_timeout(Duration::from_millis(500)).is_err(),
        "query ran during PAUSE"
    );
    ok(&mut a, "RESUME");
    let (_, r) = held
        .recv_timeout(TIMEOUT)
        .expect("query did not finish after RESUME");
    assert_eq!(r.unwrap()[0][0].as_deref(), Some("7"));
}

#[test]
fn kill_client_disconnects_only_that_client() {
    let pg = PgServer::start();
    let weir = start(&pg, "transaction");
    let mut a = admin(&weir, "postgres");
    let mut victim = client(&weir, "victim");
    let mut other = client(&weir, "bystander");
    assert_eq!(victim.query_one("select 1"), "1");
    let id = ok(&mut a, "SHOW CLIENTS").get("application_name", "victim", "id");
    let r = ok(&mut a, &format!("KILL_CLIENT {id}"));
    assert_eq!(r.tags, vec!["KILL_CLIENT"]);
    let e = victim.error_or_eof();
    if let Some(e) = e {
        assert_eq!(e.message, "admin forced disconnect");
        assert_eq!(e.severity, "FATAL");
    }
    assert!(victim.closes(), "killed client still connected");
    assert_eq!(other.query_one("select 2"), "2");
    assert!(ok(&mut a, "SHOW CLIENTS")
        .find("application_name", "victim")
        .is_empty());
    assert_eq!(
        run(&mut a, "KILL_CLIENT 12345").unwrap_err().message,
        "client not found"
    );
    assert_eq!(
        run(&mut a, "KILL_CLIENT abc").unwrap_err().message,
        "invalid client pointer supplied"
    );
}

#[test]
fn disable_enable_and_kill_a_database() {
    let pg = PgServer::start();
    let weir = start(&pg, "transaction");
    let mut a = admin(&weir, "postgres");
    let mut c = client(&weir, "before");
    assert_eq!(c.query_one("select 1"), "1");

    assert_eq!(ok(&mut a, "DISABLE postgres").tags, vec!["DISABLE"]);
    assert_eq!(
        ok(&mut a, "SHOW DATABASES").num("name", "postgres", "disabled"),
        1
    );
    let e = RawConn::startup(weir.port(), "postgres", "postgres", &[])
        .err()
        .expect("login to a disabled database succeeded");
    assert_eq!(e.message, "database \"postgres\" is disabled");
    // Connected clients are not affected.
    assert_eq!(c.query_one("select 2"), "2");
    assert_eq!(ok(&mut a, "ENABLE postgres").tags, vec!["ENABLE"]);
    let mut fresh = client(&weir, "after-enable");
    assert_eq!(fresh.query_one("select 3"), "3");

    // KILL drops every client and server of the database and pauses it.
    assert_eq!(ok(&mut a, "KILL postgres").tags, vec!["KILL"]);
    for conn in [&mut c, &mut fresh] {
        if let Some(e) = conn.error_or_eof() {
            assert_eq!(e.message, "database removed");
        }
    }
    assert!(
        eventually(TIMEOUT, || ok(&mut a, "SHOW SERVERS").rows.is_empty()),
        "servers left after KILL"
    );
    // New clients may log in but wait until RESUME.
    let late = client(&weir, "late");
    let q = in_thread(late, "select 9");
    assert!(
        q.recv_timeout(Duration::from_millis(500)).is_err(),
        "query ran after KILL"
    );
    ok(&mut a, "RESUME postgres");
    let (_, r) = q.recv_timeout(TIMEOUT).expect("no answer after RESUME");
    assert_eq!(r.unwrap()[0][0].as_deref(), Some("9"));
}

#[test]
fn reconnect_marks_servers_and_wait_close_waits_for_them() {
    let pg = PgServer::start();
    let weir = start(&pg, "transaction");
    let mut a = admin(&weir, "postgres");
    let mut c = client(&weir, "rc");
    c.simple_query("begin").unwrap();
    let old_pid = c.query_one("select pg_backend_pid()");
    assert_eq!(ok(&mut a, "RECONNECT postgres").tags, vec!["RECONNECT"]);
    let servers = ok(&mut a, "SHOW SERVERS");
    assert_eq!(servers.get("remote_pid", &old_pid, "close_needed"), "1");
    let waiting = console_in_thread(admin(&weir, "postgres"), "WAIT_CLOSE postgres");
    assert!(
        waiting.recv_timeout(Duration::from_millis(500)).is_err(),
        "WAIT_CLOSE answered while the marked server was in a transaction"
    );
    c.simple_query("commit").unwrap();
    let (_, r) = waiting
        .recv_timeout(TIMEOUT)
        .expect("WAIT_CLOSE did not finish");
    assert_eq!(r.unwrap().tags, vec!["WAIT_CLOSE"]);
    let new_pid = c.query_one("select pg_backend_pid()");
    assert_ne!(old_pid, new_pid, "the server was reused after RECONNECT");
}

#[test]
fn shutdown_stops_the_process() {
    let pg = PgServer::start();
    let mut weir = start(&pg, "session");
    let mut a = admin(&weir, "postgres");
    a.send(&proto::query("SHUTDOWN"));
    assert!(a.closes(), "console stayed open after SHUTDOWN");
    assert!(
        weir.wait_exit(TIMEOUT).is_some(),
        "weir still running after SHUTDOWN"
    );
}

// SHUTDOWN WAIT_FOR_CLIENTS and WAIT_FOR_SERVERS: tests/graceful_shutdown.rs.

#[test]
fn suspend_holds_queries_and_is_undone_when_the_admin_leaves() {
    let pg = PgServer::start();
    let weir = start(&pg, "transaction");
    let mut a = admin(&weir, "postgres");
    let c = client(&weir, "sus");
    assert_eq!(ok(&mut a, "SUSPEND").tags, vec!["SUSPEND"]);
    assert_eq!(
        ok(&mut a, "SHOW STATE").get("key", "suspended", "value"),
        "yes"
    );
    assert_eq!(
        run(&mut a, "SUSPEND").unwrap_err().message,
        "already suspended/paused"
    );
    let q = in_thread(c, "select 5");
    assert!(
        q.recv_timeout(Duration::from_millis(500)).is_err(),
        "query ran while suspended"
    );
    // The only console session leaves: Weir resumes by itself, as PgBouncer does.
    a.send(&proto::terminate());
    assert!(a.closes());
    let (_, r) = q
        .recv_timeout(TIMEOUT)
        .expect("query still held after the admin left");
    assert_eq!(r.unwrap()[0][0].as_deref(), Some("5"));
    let mut b = admin(&weir, "postgres");
    assert_eq!(
        ok(&mut b, "SHOW STATE").get("key", "active", "value"),
        "yes"
    );
}
