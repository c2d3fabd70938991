//! Recovery from a PostgreSQL restart: a client waiting for a server while PostgreSQL is
//! down is served soon after PostgreSQL accepts logins again, not after the whole
//! server_login_retry (docs/recovery.md).

mod common;

use common::*;
use std::sync::mpsc;
use std::thread;
use std::time::Duration;

/// Far longer than the short retry Weir uses while clients wait (at most 1 s), and far
/// shorter than server_login_retry below: the client cannot be served in time by waiting
/// out server_login_retry, and has ample time otherwise.
const SERVED_WITHIN: Duration = Duration::from_secs(12);

fn weir(pg: &PgServer) -> Weir {
    Weir::for_pg(pg)
        .set("pool_mode", "transaction")
        .set("server_login_retry", 60)
        .set("query_wait_timeout", 120)
        .start()
}

/// Runs `select 1` on `c` in a thread; the answer (or error) comes on the channel.
fn query_in_background(mut c: RawConn) -> mpsc::Receiver<Result<String, String>> {
    let (tx, rx) = mpsc::channel();
    thread::spawn(move || {
        let r = c
            .simple_query("select 42")
            .map(|rows| format!("{:?}", rows))
            .map_err(|e| format!("{e:?}"));
        let _ = tx.send(r);
    });
    rx
}

/// With PostgreSQL stopped and `c`'s query waiting for a server: Weir's logins fail a
/// few times while the client waits, then PostgreSQL starts again and the client must be
/// answered.
fn restart_and_expect_served(pg: &mut PgServer, weir: &Weir, c: RawConn) {
    expect_served_after_restart(pg, weir, query_in_background(c));
}

/// As `restart_and_expect_served`, for a client whose answer comes on `answer`.
fn expect_served_after_restart(
    pg: &mut PgServer,
    weir: &Weir,
    answer: mpsc::Receiver<Result<String, String>>,
) {
    assert!(
        eventually(TIMEOUT, || weir
            .log()
            .matches("server login failed")
            .count()
            >= 2),
        "no failed server logins while PostgreSQL was down:\n{}",
        weir.log_tail()
    );
    assert!(
        answer.try_recv().is_err(),
        "the client was answered while PostgreSQL was down"
    );
    pg.start_again();
    let got = answer
        .recv_timeout(SERVED_WITHIN)
        .expect("the waiting client was not served after PostgreSQL came back");
    let rows = got.expect("the waiting client got an error");
    assert!(rows.contains("42"), "{rows}");
}

/// A client whose idle server died with PostgreSQL waits for a new one.
#[test]
fn waiting_client_is_served_soon_after_postgres_restarts() {
    let mut pg = PgServer::start();
    let weir = weir(&pg);
    let mut c = RawConn::startup(weir.port(), "postgres", "postgres", &[]).expect("login");
    assert_eq!(c.query_one("select 1"), "1");
    pg.stop();
    restart_and_expect_served(&mut pg, &weir, c);
}

/// A client that logs in while PostgreSQL is down (the greeting is cached) and whose
/// first query waits for a server is served too once PostgreSQL is back.
#[test]
fn client_waiting_for_its_first_server_is_served_after_a_restart() {
    let mut pg = PgServer::start();
    let weir = weir(&pg);
    // The greeting is cached by a first client, so later logins need no server.
    let mut first = RawConn::startup(weir.port(), "postgres", "postgres", &[]).expect("login");
    assert_eq!(first.query_one("select 1"), "1");
    drop(first);
    pg.stop();
    let c = RawConn::startup(weir.port(), "postgres", "postgres", &[])
        .expect("login with PostgreSQL down, greeting cached");
    restart_and_expect_served(&mut pg, &weir, c);
}

/// The first client of a pool, logging in while PostgreSQL is down (no greeting cached,
/// so its login needs a server): it waits, as PgBouncer's clients do (its suite's
/// test_server_login_retry), and is logged in and served once PostgreSQL is back.
#[test]
fn a_first_login_waits_for_postgresql_to_come_back() {
    let mut pg = PgServer::start();
    let weir = weir(&pg);
    pg.stop();
    let port = weir.port();
    let (tx, answer) = mpsc::channel();
    thread::spawn(move || {
        let r = RawConn::startup(port, "postgres", "postgres", &[])
            .map_err(|e| format!("login: {e:?}"))
            .and_then(|mut c| {
                c.simple_query("select 42")
                    .map(|rows| format!("{rows:?}"))
                    .map_err(|e| format!("{e:?}"))
            });
        let _ = tx.send(r);
    });
    expect_served_after_restart(&mut pg, &weir, answer);
}

/// PgBouncer's test_scram_server (test_misc.py): a SCRAM client's first login to a
/// database whose server never answers, with query_wait_notify under the wait, is kept
/// waiting and then ends (here at query_wait_timeout, FATAL, with why), and Weir goes
/// on serving: the same client logs in to a database that is up. ~3 s.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_scram_client_waiting_for_a_down_server_ends_cleanly() {
    let pg = PgServer::start();
    let down = free_port();
    let secret = "alicepw";
    let weir = Weir::for_pg(&pg)
        .database(
            "down",
            &format!("host=127.0.0.1 port={down} dbname=postgres user=alice password={secret}"),
        )
        .set("auth_type", "scram-sha-256")
        .set("query_wait_timeout", 2)
        .set("query_wait_notify", 1)
        .userlist(&[("alice", secret), ("postgres", "pgpw")])
        .start();
    let started = std::time::Instant::now();
    let e = connect_pw(weir.port(), "down", "alice", secret)
        .await
        .expect_err("logged in to a database whose server is down");
    assert!(
        started.elapsed() >= Duration::from_secs(2),
        "the login failed before query_wait_timeout: {e:?}"
    );
    let db = e.as_db_error().unwrap_or_else(|| panic!("{e:?}"));
    assert_eq!(db.code().code(), "08006", "{db:?}");
    assert!(db.message().starts_with("server login failed"), "{db:?}");
    let c = connect_pw(weir.port(), "postgres", "postgres", "pgpw")
        .await
        .unwrap_or_else(|e| panic!("{e:?}\n{}", weir.log_tail()));
    assert_eq!(q1(&c, "select 1").await, "1");
    assert!(!weir.log().contains("panicked"), "{}", weir.log_tail());
}

/// With PostgreSQL down for good, a first login ends at query_wait_timeout with why the
/// server logins failed, not at once.
#[test]
fn a_first_login_to_a_down_server_ends_at_query_wait_timeout() {
    let pg = PgServer::start();
    let down = free_port();
    let weir = Weir::for_pg(&pg)
        .database(
            "down",
            &format!("host=127.0.0.1 port={down} dbname=postgres"),
        )
        .set("query_wait_timeout", 2)
        .start();
    let started = std::time::Instant::now();
    let Err(err) = RawConn::startup(weir.port(), "postgres", "down", &[]) else {
        panic!("logged in to a database whose server is down");
    };
    assert!(
        started.elapsed() >= Duration::from_secs(2),
        "the login failed before query_wait_timeout: {err:?}"
    );
    assert_eq!(
        (err.severity.as_str(), err.code.as_str()),
        ("FATAL", "08006"),
        "{err:?}"
    );
    assert!(err.message.starts_with("server login failed"), "{err:?}");
    assert!(
        weir.log().matches("server login failed").count() >= 2,
        "the login was not retried while the client waited:\n{}",
        weir.log_tail()
    );
}

/// Cuts every TCP connection to `port` on this machine (`ss -K`, as a network partition
/// or a proxy restart would): Weir's sockets to PostgreSQL are gone.
fn cut_connections_to(port: u16) {
    let out = std::process::Command::new("ss")
        .args(["-K", "dst", "127.0.0.1", "dport", "=", &port.to_string()])
        .output()
        .unwrap_or_else(|e| panic!("ss (iproute2, scripts/install-deps) is needed: {e}"));
    assert!(out.status.success(), "ss -K failed: {out:?}");
}

/// The server is lost while a large result streams to the client (a row half sent):
/// the client is closed, as a direct connection is when its server dies mid-row, and
/// gets no error glued inside the row (it used to wait for the rest of that "row" for
/// good).
#[test]
fn a_server_lost_in_the_middle_of_a_row_closes_the_client() {
    let pg = PgServer::start();
    let weir = Weir::for_pg(&pg).set("pool_mode", "transaction").start();
    let mut c = RawConn::startup(weir.port(), "postgres", "postgres", &[]).unwrap();
    assert_eq!(c.query_one("select 1"), "1");
    c.send(&common::proto::query(
        "select g, repeat('x', 2000), case when g = 3000 then pg_sleep(3)::text end \
         from generate_series(1, 4000) g",
    ));
    thread::sleep(Duration::from_millis(1000));
    cut_connections_to(pg.port());
    c.set_read_timeout(Duration::from_secs(20));
    let mut rows = 0;
    let end = loop {
        match c.read_message() {
            Ok(Some(m)) if m.tag == b'D' => rows += 1,
            Ok(Some(m)) if m.tag == b'Z' => break "a ReadyForQuery".to_string(),
            Ok(Some(m)) if m.tag == b'E' => {
                let e = common::proto::parse_error(&m.body);
                assert_eq!(e.code, "08006", "{}", e.message);
            }
            Ok(Some(_)) => {}
            Ok(None) => break "closed".to_string(),
            Err(e) => break format!("{:?}", e.kind()),
        }
    };
    assert!(rows < 4000, "the cut came after the whole result");
    // Closed (a reset is also a close); a whole row-by-row answer with an error is fine
    // too when the cut fell between two rows.
    assert!(
        end == "closed" || end == "ConnectionReset" || end == "a ReadyForQuery",
        "after {rows} rows: {end}\n{}",
        weir.log_tail()
    );
}

/// Two queries written at once, the server lost under the first: the second, which
/// never ran, gets an error too, not a ReadyForQuery alone (which says it succeeded).
#[test]
fn each_pipelined_query_on_a_lost_server_gets_an_error() {
    let pg = PgServer::start();
    pg.exec("create table t (x int)");
    let weir = Weir::for_pg(&pg).set("pool_mode", "transaction").start();
    let mut c = RawConn::startup(weir.port(), "postgres", "postgres", &[]).unwrap();
    assert_eq!(c.query_one("select 1"), "1");
    let mut two = common::proto::query("select pg_sleep(2)");
    two.extend(common::proto::query("insert into t values (99)"));
    c.send(&two);
    thread::sleep(Duration::from_millis(500));
    cut_connections_to(pg.port());
    let tags = |c: &mut RawConn| -> String {
        c.read_until_ready().iter().map(|m| m.tag as char).collect()
    };
    let (first, second) = (tags(&mut c), tags(&mut c));
    assert_eq!((first.as_str(), second.as_str()), ("EZ", "EZ"));
    thread::sleep(Duration::from_millis(2000));
    assert_eq!(pg.psql("select count(*) from t").trim(), "0");
}
