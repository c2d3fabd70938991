//! `log_format = json`: every line Weir writes (startup, connection events, errors,
//! stats) is one JSON object with `ts`, `level`, `pid`, `msg`, and for a connection's
//! lines `conn`, `db`, `user` and `addr`, saying what the text layout's prefix says; a
//! reload or the console's SET switches the format, and a bad value is refused.

// Tests run on their own runtime, which has a time driver (clippy.toml is for Weir's
// workers).
#![allow(clippy::disallowed_methods)]

mod common;

use common::*;
use serde_json::Value;

/// Parses every line, checking the keys every line has; panics on a line that is no
/// JSON object.
fn objects(text: &str, pid: i32) -> Vec<Value> {
    text.lines()
        .map(|line| {
            let v: Value = serde_json::from_str(line)
                .unwrap_or_else(|e| panic!("not JSON ({e}): {line:?}\n{text}"));
            let ts = v["ts"].as_str().unwrap_or_else(|| panic!("no ts: {line}"));
            // 2026-11-28T09:13:31.352Z
            let b = ts.as_bytes();
            assert!(
                ts.len() == 24 && b[10] == b'T' && b[19] == b'.' && b[23] == b'Z',
                "ts not RFC 3339 with milliseconds: {line}"
            );
            assert!(
                ["LOG", "WARNING", "ERROR", "DEBUG", "NOISE"]
                    .contains(&v["level"].as_str().unwrap_or("")),
                "bad level: {line}"
            );
            assert_eq!(v["pid"].as_i64(), Some(i64::from(pid)), "{line}");
            assert!(v["msg"].is_string(), "no msg: {line}");
            v
        })
        .collect()
}

fn msg(v: &Value) -> &str {
    v["msg"].as_str().unwrap_or("")
}

fn with_msg<'a>(all: &'a [Value], start: &str) -> Vec<&'a Value> {
    all.iter().filter(|v| msg(v).starts_with(start)).collect()
}

/// The conn key: `C-0x` or `S-0x` and 12 hex digits, as in the text layout.
fn conn_of<'a>(v: &'a Value, kind: &str) -> &'a str {
    let conn = v["conn"].as_str().unwrap_or_else(|| panic!("no conn: {v}"));
    let id = conn
        .strip_prefix(kind)
        .unwrap_or_else(|| panic!("not {kind}: {v}"));
    assert!(
        id.len() == 12 && id.bytes().all(|b| b.is_ascii_hexdigit()),
        "{v}"
    );
    conn
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn every_line_is_a_json_object() {
    let pg = PgServer::start();
    let down = free_port();
    let weir = Weir::for_pg(&pg)
        .database_at("down", down)
        .set("log_format", "json")
        .set("auth_type", "md5")
        .set("stats_period", 1)
        .set("query_wait_timeout", 1)
        // Not implemented: its startup warning must come out as JSON too.
        .set("dns_zone_check_period", 10)
        .userlist(&[("postgres", "s3cret")])
        .start();

    let c = connect_pw(weir.port(), "postgres", "postgres", "s3cret")
        .await
        .unwrap();
    assert_eq!(q1(&c, "select 'in'").await, "in");
    drop(c);
    let e = connect_pw(weir.port(), "postgres", "postgres", "wrong")
        .await
        .unwrap_err();
    assert_eq!(expect_db_error(&e).code, "28P01");
    assert!(connect_pw(weir.port(), "down", "postgres", "s3cret")
        .await
        .is_err());
    // A name with a quote, a tab and a control character, as a peer may send it.
    let odd = "no\"such\tdb\u{1}";
    assert!(connect_pw(weir.port(), odd, "postgres", "s3cret")
        .await
        .is_err());
    weir.wait_for_log("server login failed");
    weir.wait_for_log(r#""msg":"closing because: client close request"#);
    weir.wait_for_log(r#""msg":"stats: "#);

    let pid = weir.pid();
    let all = objects(&weir.logfile(), pid);
    // stderr gets the same lines (the harness runs Weir without -q).
    objects(&weir.stderr(), pid);

    let notice = all
        .iter()
        .find(|v| msg(v).contains("dns_zone_check_period"))
        .unwrap_or_else(|| panic!("no notice: {all:#?}"));
    assert_eq!(notice["level"], "WARNING");

    let logins = with_msg(&all, "login attempt: db=postgres ");
    assert_eq!(logins.len(), 1, "{all:#?}");
    let login = logins[0];
    assert_eq!(login["level"], "LOG");
    assert_eq!(
        msg(login),
        "login attempt: db=postgres user=postgres tls=no"
    );
    let conn = conn_of(login, "C-0x");
    assert_eq!(login["db"], "postgres");
    assert_eq!(login["user"], "postgres");
    let addr = login["addr"].as_str().unwrap();
    assert!(addr.starts_with("127.0.0.1:"), "{login}");

    let closes = with_msg(&all, "closing because: client close request (age=");
    assert_eq!(closes.len(), 1, "{all:#?}");
    assert_eq!(closes[0]["conn"], conn);
    assert_eq!(closes[0]["addr"], addr);

    let opened = with_msg(&all, "new connection to server (from 127.0.0.1:");
    assert_eq!(opened.len(), 1, "{all:#?}");
    conn_of(opened[0], "S-0x");
    assert_eq!(opened[0]["addr"], format!("127.0.0.1:{}", pg.port()));
    assert_eq!(opened[0]["db"], "postgres");

    // The quotes of the message survive the escaping.
    let refused = with_msg(
        &all,
        r#"pooler error: password authentication failed for user "postgres""#,
    );
    assert_eq!(refused.len(), 1, "{all:#?}");
    assert_eq!(refused[0]["level"], "WARNING");
    conn_of(refused[0], "C-0x");
    assert_eq!(refused[0]["user"], "postgres");
    assert!(refused[0]["addr"]
        .as_str()
        .unwrap()
        .starts_with("127.0.0.1:"));

    let odd_lines: Vec<&Value> = all.iter().filter(|v| v["db"] == odd).collect();
    assert!(
        odd_lines
            .iter()
            .any(|v| msg(v).starts_with("pooler error: ")),
        "{all:#?}"
    );

    // An event's own fields are keys of their own.
    let failed = all
        .iter()
        .find(|v| msg(v).starts_with("server login failed"))
        .unwrap();
    assert_eq!(failed["db"], "down", "{failed}");
    assert_eq!(failed["addr"], format!("127.0.0.1:{down}"), "{failed}");

    let stats = with_msg(&all, "stats: ");
    assert!(stats[0].get("conn").is_none(), "{}", stats[0]);
}

/// The text layout's connection prefix, `C-0x<id>: db/user@addr`, rebuilt from a JSON
/// line's keys, with the line's message after it.
fn as_text(v: &Value) -> String {
    format!(
        "{}: {}/{}@{} {}",
        v["conn"].as_str().unwrap(),
        v["db"].as_str().unwrap(),
        v["user"].as_str().unwrap(),
        v["addr"].as_str().unwrap(),
        msg(v)
    )
}

/// What stays the same between two clients' lines: ids, ports and ages blanked out.
fn shape(line: &str) -> String {
    let mut out = String::new();
    let mut chars = line.chars().peekable();
    while let Some(c) = chars.next() {
        if c.is_ascii_hexdigit() {
            while chars.peek().is_some_and(|c| c.is_ascii_hexdigit()) {
                chars.next();
            }
            out.push('#');
        } else {
            out.push(c);
        }
    }
    out
}

/// The text lines (after the date, time, pid and level) of a connection's events.
fn text_events(log: &str, what: &str) -> Vec<String> {
    log.lines()
        .filter(|l| !l.starts_with('{') && l.contains(what))
        .map(|l| {
            let rest = l.split_once("] ").unwrap().1;
            rest.split_once(' ').unwrap().1.to_owned()
        })
        .collect()
}

#[test]
fn reload_and_set_switch_the_format_and_bad_values_are_refused() {
    let pg = PgServer::start();
    let builder = Weir::for_pg(&pg).set("admin_users", "postgres");
    let mut weir = builder.clone().start();
    let mut a = RawConn::startup(weir.port(), "postgres", "postgres", &[]).unwrap();
    assert_eq!(a.query_one("select 1"), "1");
    a.send(&proto::terminate());
    drop(a);
    weir.wait_for_log("closing because: client close request");

    weir.reload_with(builder.clone().set("log_format", "json"));
    weir.wait_for_log(r#""msg":"configuration reloaded from"#);
    let mut b = RawConn::startup(weir.port(), "postgres", "postgres", &[]).unwrap();
    assert_eq!(b.query_one("select 2"), "2");
    b.send(&proto::terminate());
    drop(b);
    weir.wait_for_log(r#""msg":"closing because: client close request"#);

    let log = weir.logfile();
    let json: Vec<&str> = log.lines().filter(|l| l.starts_with('{')).collect();
    let all = objects(&json.join("\n"), weir.pid());
    // Text up to the reload, JSON from its line on.
    let first = log.lines().position(|l| l.starts_with('{')).unwrap();
    assert!(log.lines().skip(first).all(|l| l.starts_with('{')), "{log}");
    for what in ["login attempt: ", "closing because: client close request"] {
        let text = text_events(&log, what);
        let json = with_msg(&all, what);
        assert_eq!((text.len(), json.len()), (1, 1), "{log}");
        assert_eq!(shape(&as_text(json[0])), shape(&text[0]), "{log}");
    }

    // A bad value on the console: refused, the format kept.
    let mut admin = RawConn::startup(weir.port(), "postgres", "pgbouncer", &[]).unwrap();
    assert!(admin.simple_query("SET log_format = yaml").is_err());
    let config = console::ok(&mut admin, "SHOW CONFIG");
    assert_eq!(config.get("key", "log_format", "value"), "json");
    // And in a reloaded file: the reload fails as a whole.
    weir.reload_with(builder.clone().set("log_format", "yaml"));
    weir.wait_for_log("reload failed, keeping the old configuration");
    let log = weir.logfile();
    let refused = log.lines().last().unwrap();
    let v: Value = serde_json::from_str(refused).unwrap();
    assert!(msg(&v).contains("log_format"), "{refused}");

    // The console's SET switches back.
    admin.simple_query("SET log_format = text").unwrap();
    let mut c = RawConn::startup(weir.port(), "postgres", "postgres", &[]).unwrap();
    assert_eq!(c.query_one("select 3"), "3");
    let log = weir.logfile();
    let after: Vec<&str> = log
        .lines()
        .skip_while(|l| !l.contains("SET log_format = text"))
        .collect();
    assert!(
        !after.is_empty() && after.iter().all(|l| !l.starts_with('{')),
        "{log}"
    );
    assert_eq!(
        text_events(
            &after.join("\n"),
            "login attempt: db=postgres user=postgres"
        )
        .len(),
        1,
        "{log}"
    );
}
