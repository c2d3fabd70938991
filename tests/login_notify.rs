//! login_notify_message against real PostgreSQL: the NOTICE every client gets as its
//! login succeeds (PgBouncer's NOTICE with SQLSTATE 00000), seen by tokio-postgres and
//! psql, where the protocol allows it (after AuthenticationOk, before ReadyForQuery), on
//! the admin console too, none when unset, and changed by the console's SET and RELOAD
//! for the logins that follow.

// Tests run on their own runtime, which has a time driver (clippy.toml is for Weir's
// workers).
#![allow(clippy::disallowed_methods)]

mod common;

use common::console::ok;
use common::*;

const WELCOME: &str = "You are connected to Weir, a connection pooler, not to PostgreSQL";

fn weir_with(pg: &PgServer, message: Option<&str>) -> WeirBuilder {
    let b = Weir::for_pg(pg)
        .set("pool_mode", "transaction")
        .set("admin_users", "postgres");
    match message {
        Some(m) => b.set("login_notify_message", m),
        None => b,
    }
}

/// Logs in over the raw protocol to `db` and returns the notices of the login (severity,
/// SQLSTATE, text), checking that each came after AuthenticationOk and before
/// ReadyForQuery.
fn login_notices(weir: &Weir, db: &str) -> Vec<ErrorFields> {
    login_notices_with(weir, db, &[])
}

/// Like `login_notices`, with `extra` startup parameters.
fn login_notices_with(weir: &Weir, db: &str, extra: &[(&str, &str)]) -> Vec<ErrorFields> {
    let mut c = RawConn::connect(weir.port());
    let mut params = vec![("user", "postgres"), ("database", db)];
    params.extend_from_slice(extra);
    c.send(&proto::startup_message(&params));
    let mut authenticated = false;
    let mut notices = Vec::new();
    loop {
        let m = c.read_message_or_panic("the login");
        match m.tag {
            b'R' => {
                assert_eq!(&m.body[..4], &[0, 0, 0, 0], "trust: AuthenticationOk");
                authenticated = true;
            }
            b'N' => {
                assert!(authenticated, "a notice before AuthenticationOk");
                notices.push(proto::parse_error(&m.body));
            }
            b'E' => panic!("login to {db} failed: {:?}", proto::parse_error(&m.body)),
            b'Z' => break,
            _ => {}
        }
    }
    // The session works after it.
    if db == "pgbouncer" {
        ok(&mut c, "SHOW VERSION");
    } else if !extra.is_empty() {
        let system = c.simple_query("IDENTIFY_SYSTEM").expect("IDENTIFY_SYSTEM");
        assert_eq!(system.len(), 1, "{system:?}");
    } else {
        assert_eq!(c.query_one("select 1"), "1");
    }
    notices
}

fn welcome(text: &str) -> ErrorFields {
    ErrorFields {
        severity: "NOTICE".into(),
        code: "00000".into(),
        message: text.into(),
    }
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn tokio_postgres_gets_the_notice_at_login() {
    let pg = PgServer::start();
    let weir = weir_with(&pg, Some(WELCOME)).start();
    let config = pg_config(weir.port(), "postgres", "postgres");
    let (client, mut conn) = tokio::time::timeout(TIMEOUT, config.connect(tokio_postgres::NoTls))
        .await
        .expect("connect in time")
        .expect("login through weir");
    // tokio-postgres keeps the notices of the startup and hands them out as the connection
    // is polled.
    let (tx, mut rx) = tokio::sync::mpsc::unbounded_channel();
    tokio::spawn(async move {
        while let Some(Ok(m)) = std::future::poll_fn(|cx| conn.poll_message(cx)).await {
            if let tokio_postgres::AsyncMessage::Notice(n) = m {
                let _ = tx.send(n);
            }
        }
    });
    assert_eq!(
        q(&client, "select 1").await.unwrap(),
        vec![Some("1".into())]
    );
    let notice = tokio::time::timeout(TIMEOUT, rx.recv())
        .await
        .expect("a notice in time")
        .expect("the login's notice");
    assert_eq!(notice.severity(), "NOTICE");
    assert_eq!(notice.code().code(), "00000");
    assert_eq!(notice.message(), WELCOME);
    assert!(rx.try_recv().is_err(), "one notice per login");
}

#[test]
fn psql_shows_the_notice() {
    let pg = PgServer::start();
    let weir = weir_with(&pg, Some(WELCOME)).start();
    let mut cmd = clean_command("psql");
    cmd.args(["-X", "-A", "-t", "-h", "127.0.0.1", "-p"])
        .arg(weir.port().to_string())
        .args(["-U", "postgres", "-d", "postgres", "-c", "select 42"]);
    let out = run_with_timeout(&mut cmd, None, TIMEOUT);
    let stderr = String::from_utf8_lossy(&out.stderr);
    assert!(out.status.success(), "psql failed: {stderr}");
    assert_eq!(String::from_utf8_lossy(&out.stdout).trim(), "42");
    assert!(
        stderr.contains(&format!("NOTICE:  {WELCOME}")),
        "psql printed no login notice: {stderr:?}"
    );
}

#[test]
fn every_login_gets_it_until_set_or_reload_changes_it() {
    let pg = PgServer::start();
    let mut weir = weir_with(&pg, Some(WELCOME)).start();

    assert_eq!(login_notices(&weir, "postgres"), vec![welcome(WELCOME)]);
    // A second client of the same pool (welcomed from the pool's cached parameters).
    assert_eq!(login_notices(&weir, "postgres"), vec![welcome(WELCOME)]);
    // The admin console: PgBouncer welcomes it as any client.
    assert_eq!(login_notices(&weir, "pgbouncer"), vec![welcome(WELCOME)]);

    let mut console = RawConn::startup(weir.port(), "postgres", "pgbouncer", &[]).unwrap();
    let config = ok(&mut console, "SHOW CONFIG");
    assert_eq!(config.get("key", "login_notify_message", "value"), WELCOME);
    assert_eq!(
        config.get("key", "login_notify_message", "changeable"),
        "yes"
    );

    ok(&mut console, "SET login_notify_message = 'changed by SET'");
    assert_eq!(
        login_notices(&weir, "postgres"),
        vec![welcome("changed by SET")]
    );
    ok(&mut console, "SET login_notify_message = ''");
    assert_eq!(login_notices(&weir, "postgres"), vec![]);
    assert_eq!(login_notices(&weir, "pgbouncer"), vec![]);

    // RELOAD puts the file's value back (a SET lasts until then, as in PgBouncer).
    weir.reload_with(weir_with(&pg, Some("from the file")));
    assert!(
        eventually(TIMEOUT, || login_notices(&weir, "postgres")
            == vec![welcome("from the file")]),
        "reload did not change the notice\n{}",
        weir.log_tail()
    );
    // Taken out of the file: no notice.
    weir.reload_with(weir_with(&pg, None));
    assert!(
        eventually(TIMEOUT, || login_notices(&weir, "postgres").is_empty()),
        "reload did not remove the notice\n{}",
        weir.log_tail()
    );
    assert!(
        !weir
            .log()
            .contains("option login_notify_message is not implemented"),
        "still named as not implemented: {}",
        weir.log_tail()
    );
}

#[test]
fn replication_clients_get_it_too() {
    // A replication client is welcomed by Weir with its own server's parameters, not the
    // pool's: the notice goes with those.
    let pg = PgServer::start();
    let weir = weir_with(&pg, Some(WELCOME)).start();
    assert_eq!(
        login_notices_with(&weir, "postgres", &[("replication", "database")]),
        vec![welcome(WELCOME)]
    );
}
