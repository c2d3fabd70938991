//! Log lines in PgBouncer's layout and wording, read back from Weir's logfile after real
//! clients did things through it: `<date> <time> UTC [pid] LEVEL C-0x<id>: db/user@addr:port
//! <event>`, for logins, closes, pooler errors, server connections and the reserve pool;
//! and the log_* switches that turn them off.

mod common;

use common::*;

/// A parsed log line: level, the connection prefix (when there is one) and the message.
struct Line<'a> {
    level: &'a str,
    conn: Option<&'a str>,
    who: Option<&'a str>,
    message: &'a str,
}

/// Splits a line written as `YYYY-MM-DD HH:MM:SS.mmm UTC [pid] LEVEL rest`, checking the
/// layout on the way.
fn parse(line: &str, pid: i32) -> Line<'_> {
    let (date, rest) = line.split_once(' ').expect("no date");
    assert!(
        date.len() == 10 && date.as_bytes()[4] == b'-' && date.as_bytes()[7] == b'-',
        "bad date in {line:?}"
    );
    let (time, rest) = rest.split_once(' ').expect("no time");
    assert!(
        time.len() == 12 && time.as_bytes()[8] == b'.',
        "bad time in {line:?}"
    );
    let rest = rest.strip_prefix("UTC ").expect("no UTC");
    let rest = rest
        .strip_prefix(&format!("[{pid}] "))
        .unwrap_or_else(|| panic!("no [{pid}] in {line:?}"));
    let (level, rest) = rest.split_once(' ').expect("no level");
    assert!(
        ["LOG", "WARNING", "ERROR"].contains(&level),
        "bad level in {line:?}"
    );
    let prefixed = (rest.starts_with("C-0x") || rest.starts_with("S-0x"))
        .then(|| rest.split_once(": "))
        .flatten();
    match prefixed {
        Some((conn, after)) => {
            let id = &conn[4..];
            assert!(
                id.len() == 12 && id.bytes().all(|b| b.is_ascii_hexdigit()),
                "bad id in {line:?}"
            );
            let (who, message) = after.split_once(' ').expect("no message");
            Line {
                level,
                conn: Some(conn),
                who: Some(who),
                message,
            }
        }
        None => Line {
            level,
            conn: None,
            who: None,
            message: rest,
        },
    }
}

fn lines(weir: &Weir) -> Vec<String> {
    weir.logfile().lines().map(str::to_owned).collect()
}

/// The parsed lines whose message starts with `start`.
fn find<'a>(all: &'a [String], pid: i32, start: &str) -> Vec<Line<'a>> {
    all.iter()
        .map(|l| parse(l, pid))
        .filter(|l| l.message.starts_with(start))
        .collect()
}

#[test]
fn client_and_server_lines_like_pgbouncer() {
    let pg = PgServer::start();
    let weir = Weir::for_pg(&pg).start();
    let mut c = RawConn::startup(weir.port(), "postgres", "postgres", &[]).unwrap();
    assert_eq!(c.query_one("select 1"), "1");
    c.send(&proto::terminate());
    drop(c);
    weir.wait_for_log("closing because: client close request");

    let all = lines(&weir);
    let pid = weir.pid();
    let logins = find(&all, pid, "login attempt: ");
    assert_eq!(logins.len(), 1, "{all:#?}");
    let login = &logins[0];
    assert_eq!(login.level, "LOG");
    assert_eq!(
        login.message,
        "login attempt: db=postgres user=postgres tls=no"
    );
    let conn = login.conn.unwrap();
    assert!(conn.starts_with("C-0x"));
    let who = login.who.unwrap();
    assert!(who.starts_with("postgres/postgres@127.0.0.1:"), "{who}");

    // The same id and address on the close, with the age PgBouncer prints.
    let closes = find(&all, pid, "closing because: client close request");
    assert_eq!(closes.len(), 1, "{all:#?}");
    assert_eq!(closes[0].conn, Some(conn));
    assert_eq!(closes[0].who, Some(who));
    assert!(closes[0].message.ends_with("s)"), "{}", closes[0].message);
    assert!(
        closes[0].message.contains(" (age="),
        "{}",
        closes[0].message
    );

    let opened = find(&all, pid, "new connection to server (from 127.0.0.1:");
    assert_eq!(opened.len(), 1, "{all:#?}");
    assert!(opened[0].conn.unwrap().starts_with("S-0x"));
    assert_eq!(
        opened[0].who.unwrap(),
        format!("postgres/postgres@127.0.0.1:{}", pg.port())
    );
}

/// Lines with structured fields (here the failed server login's db=, user=, addr=) are
/// where the formatter used to add terminal colours: the file gets plain text.
#[test]
fn no_colour_escapes_in_the_logfile() {
    let pg = PgServer::start();
    let down = free_port();
    let weir = Weir::for_pg(&pg)
        .database_at("down", down)
        .set("query_wait_timeout", 1)
        .start();
    assert!(RawConn::startup(weir.port(), "postgres", "down", &[]).is_err());
    weir.wait_for_log("server login failed");
    let log = weir.logfile();
    let line = log
        .lines()
        .find(|l| l.contains("server login failed"))
        .unwrap();
    assert!(line.contains("db=down"), "{line}");
    assert!(!log.contains('\x1b'), "escape codes in the logfile:\n{log}");
}

#[test]
fn pooler_errors_logged_and_switches_honoured() {
    let pg = PgServer::start();
    let weir = Weir::for_pg(&pg)
        .set("log_connections", 0)
        .set("log_disconnections", 0)
        .start();
    let e = RawConn::startup(weir.port(), "postgres", "nosuchdb", &[])
        .err()
        .expect("an unknown database was accepted");
    weir.wait_for_log("pooler error: ");
    let mut c = RawConn::startup(weir.port(), "postgres", "postgres", &[]).unwrap();
    assert_eq!(c.query_one("select 1"), "1");
    drop(c);

    let all = lines(&weir);
    let pid = weir.pid();
    let errors = find(&all, pid, "pooler error: ");
    assert_eq!(errors.len(), 1, "{all:#?}");
    assert_eq!(errors[0].level, "WARNING");
    assert_eq!(errors[0].message, format!("pooler error: {}", e.message));
    assert!(errors[0]
        .who
        .unwrap()
        .starts_with("nosuchdb/postgres@127.0.0.1:"));
    // log_connections = 0 and log_disconnections = 0.
    assert!(find(&all, pid, "login attempt").is_empty(), "{all:#?}");
    assert!(find(&all, pid, "new connection to server").is_empty());
    assert!(find(&all, pid, "closing because").is_empty(), "{all:#?}");

    let quiet = Weir::for_pg(&pg).set("log_pooler_errors", 0).start();
    assert!(RawConn::startup(quiet.port(), "postgres", "nosuchdb", &[]).is_err());
    quiet.wait_for_log("closing because: ");
    assert!(
        !quiet.logfile().contains("pooler error"),
        "{}",
        quiet.logfile()
    );
}

#[test]
fn server_lifetime_and_idle_closes_are_logged() {
    let pg = PgServer::start();
    for (setting, reason) in [
        ("server_lifetime", "server lifetime over"),
        ("server_idle_timeout", "server idle timeout"),
    ] {
        let weir = Weir::for_pg(&pg).set(setting, 1).start();
        let mut c = RawConn::startup(weir.port(), "postgres", "postgres", &[]).unwrap();
        assert_eq!(c.query_one("select 1"), "1");
        // In session mode the server comes back to the pool when the client leaves.
        drop(c);
        let close = format!("closing because: {reason} (age=");
        weir.wait_for_log(&close);
        let all = lines(&weir);
        let closes = find(&all, weir.pid(), &close);
        assert_eq!(closes.len(), 1, "{all:#?}");
        assert!(closes[0].conn.unwrap().starts_with("S-0x"));
        let opened = find(&all, weir.pid(), "new connection to server");
        assert_eq!(opened[0].conn, closes[0].conn, "{all:#?}");
    }
}

#[test]
fn reserve_pool_use_is_logged() {
    let pg = PgServer::start();
    let weir = Weir::for_pg(&pg)
        .set("default_pool_size", 1)
        .set("reserve_pool_size", 1)
        .set("reserve_pool_timeout", 1)
        .start();
    let mut holder = RawConn::startup(weir.port(), "postgres", "postgres", &[]).unwrap();
    holder.simple_query("begin").unwrap();
    let mut waiter = RawConn::startup(weir.port(), "postgres", "postgres", &[]).unwrap();
    // Served by a reserve connection once reserve_pool_timeout has passed.
    assert_eq!(waiter.query_one("select 2"), "2");
    let all = lines(&weir);
    let taken = find(&all, weir.pid(), "taking connection from reserve_pool");
    assert_eq!(taken.len(), 1, "{all:#?}");
    assert_eq!(taken[0].level, "WARNING");
    // On the waiting client's prefix, as PgBouncer writes it.
    let logins = find(&all, weir.pid(), "login attempt: ");
    assert_eq!(logins.len(), 2, "{all:#?}");
    assert_eq!(taken[0].conn, logins[1].conn, "{all:#?}");
    holder.simple_query("commit").unwrap();
}

/// SET log_connections = 0 on the console takes effect for the next login, as in PgBouncer.
#[test]
fn set_on_console_switches_connection_lines() {
    let pg = PgServer::start();
    let weir = Weir::for_pg(&pg).set("admin_users", "postgres").start();
    let count = |w: &Weir| w.logfile().matches("login attempt: db=postgres").count();
    let mut a = RawConn::startup(weir.port(), "postgres", "postgres", &[]).unwrap();
    assert_eq!(a.query_one("select 1"), "1");
    // The login line is written before the client is told it is in.
    assert_eq!(count(&weir), 1, "{}", weir.logfile());
    let mut admin = RawConn::startup(weir.port(), "postgres", "pgbouncer", &[]).unwrap();
    // Console sessions are logged as PgBouncer logs its admin clients.
    let all = lines(&weir);
    let console = find(
        &all,
        weir.pid(),
        "login attempt: db=pgbouncer user=postgres tls=no",
    );
    assert_eq!(console.len(), 1, "{all:#?}");
    assert!(console[0]
        .who
        .unwrap()
        .starts_with("pgbouncer/postgres@127.0.0.1:"));
    admin.simple_query("SET log_connections = 0").unwrap();
    let mut b = RawConn::startup(weir.port(), "postgres", "postgres", &[]).unwrap();
    assert_eq!(b.query_one("select 2"), "2");
    assert_eq!(count(&weir), 1, "{}", weir.logfile());
    admin.simple_query("SET log_connections = 1").unwrap();
    let mut c = RawConn::startup(weir.port(), "postgres", "postgres", &[]).unwrap();
    assert_eq!(c.query_one("select 3"), "3");
    assert_eq!(count(&weir), 2, "{}", weir.logfile());
}

/// An error Weir sends mid-session is a pooler error on the client's own prefix, followed
/// by its close with the same reason.
#[test]
fn session_error_logged_on_the_client_prefix() {
    let pg = PgServer::start();
    let weir = Weir::for_pg(&pg)
        .set("pool_mode", "transaction")
        .set("client_idle_timeout", 1)
        .start();
    let mut c = RawConn::startup(weir.port(), "postgres", "postgres", &[]).unwrap();
    assert_eq!(c.query_one("select 1"), "1");
    let e = c.expect_error();
    assert_eq!(e.message, "client_idle_timeout");
    weir.wait_for_log("closing because: client_idle_timeout");
    let all = lines(&weir);
    let pid = weir.pid();
    let login = find(&all, pid, "login attempt: ");
    let error = find(&all, pid, "pooler error: client_idle_timeout");
    let close = find(&all, pid, "closing because: client_idle_timeout (age=");
    assert_eq!(error.len(), 1, "{all:#?}");
    assert_eq!(close.len(), 1, "{all:#?}");
    assert_eq!(error[0].level, "WARNING");
    assert_eq!(error[0].conn, login[0].conn);
    assert_eq!(close[0].conn, login[0].conn);
}

/// A server login PostgreSQL refused is logged as PgBouncer logs it: `server login
/// failed: FATAL <message>`, the SQLSTATE no part of it.
#[test]
fn server_login_failure_logged_without_sqlstate() {
    let pg = PgServer::start();
    pg.create_user("srv", "srvpw", "md5");
    pg.set_hba(&["host all srv 127.0.0.1/32 md5"]);
    let weir = Weir::for_pg(&pg)
        .database("bad", &format!("{} user=srv password=nope", pg.connstr()))
        .set("query_wait_timeout", 2)
        .start();
    assert!(RawConn::startup(weir.port(), "postgres", "bad", &[]).is_err());
    weir.wait_for_log("server login failed: ");
    let log = weir.logfile();
    let line = log
        .lines()
        .find(|l| l.contains("server login failed: "))
        .unwrap();
    assert!(
        line.contains(
            r#"server login failed: FATAL password authentication failed for user "srv""#
        ),
        "{line}"
    );
    assert!(!line.contains("28P01"), "{line}");
}

/// The `S-` prefix names the pooler's database (the `[databases]` entry), as the `C-`
/// prefix does, not the one PostgreSQL was asked for.
#[test]
fn server_prefix_names_the_pooler_database() {
    let pg = PgServer::start();
    let weir = Weir::for_pg(&pg).database("alias", &pg.connstr()).start();
    let mut c = RawConn::startup(weir.port(), "postgres", "alias", &[]).unwrap();
    assert_eq!(c.query_one("select current_database()"), "postgres");
    weir.wait_for_log("new connection to server");
    let all = lines(&weir);
    let opened = find(&all, weir.pid(), "new connection to server");
    assert_eq!(opened.len(), 1, "{all:#?}");
    let who = opened[0].who.unwrap();
    assert!(who.starts_with("alias/postgres@"), "{who}");
}

/// Weir's own host checks are no connections of a pool: they log no `new connection
/// to server`, which log parsers count as PgBouncer's.
#[test]
fn host_checks_log_no_server_connections() {
    let pg = PgServer::start();
    let weir = Weir::for_pg(&pg)
        .database(
            "checked",
            &format!("{} target_session_attrs=read-write", pg.connstr()),
        )
        .set("host_check_interval", "0.2")
        .start();
    let mut c = RawConn::startup(weir.port(), "postgres", "checked", &[]).unwrap();
    assert_eq!(c.query_one("select 1"), "1");
    // Enough for several checks of the entry's one host.
    std::thread::sleep(std::time::Duration::from_millis(1500));
    assert!(
        pg.count_backends_where("usename = 'postgres'") >= 1,
        "no server at all"
    );
    let all = lines(&weir);
    let opened = find(&all, weir.pid(), "new connection to server");
    assert_eq!(opened.len(), 1, "{all:#?}");
}

/// A client preparing a name it still has: PgBouncer's line, on the client's prefix.
#[test]
fn reused_statement_name_is_logged() {
    let pg = PgServer::start();
    let weir = Weir::for_pg(&pg).set("pool_mode", "transaction").start();
    let mut c = RawConn::startup(weir.port(), "postgres", "postgres", &[]).unwrap();
    c.send(&proto::parse("x", "select 1"));
    c.send(&proto::sync());
    c.read_until_ready();
    c.send(&proto::parse("x", "select 2"));
    c.send(&proto::sync());
    let e = c.expect_error();
    assert_eq!(e.code, "42P05", "{e:?}");
    weir.wait_for_log("was already prepared");
    let all = lines(&weir);
    let pid = weir.pid();
    let reused = find(&all, pid, "prepared statement 'x' was already prepared");
    assert_eq!(reused.len(), 1, "{all:#?}");
    assert_eq!(reused[0].level, "ERROR");
    let login = find(&all, pid, "login attempt: ");
    assert_eq!(reused[0].conn, login[0].conn);
}

/// The first client of a database only the `*` entry serves: PgBouncer's line.
#[test]
fn auto_database_registration_is_logged() {
    let pg = PgServer::start();
    pg.exec("create database autodb");
    let weir = Weir::for_pg(&pg)
        .database("*", &format!("host=127.0.0.1 port={}", pg.port()))
        .start();
    for _ in 0..2 {
        let mut c = RawConn::startup(weir.port(), "postgres", "autodb", &[]).unwrap();
        assert_eq!(c.query_one("select current_database()"), "autodb");
    }
    weir.wait_for_log("registered new auto-database: db=autodb");
    let log = weir.logfile();
    assert_eq!(
        log.matches("registered new auto-database: db=autodb")
            .count(),
        1,
        "{log}"
    );
}
