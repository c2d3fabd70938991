//! Self-tests of the test harness (no Weir involved).

mod common;

use common::*;

#[test]
fn postgres_starts_and_answers_select_1() {
    let pg = PgServer::start();
    assert_eq!(pg.psql("select 1"), "1");
    // Also over TCP, as Weir will connect.
    assert_eq!(
        psql_at(
            "127.0.0.1",
            pg.port(),
            "postgres",
            "postgres",
            None,
            "select 1"
        )
        .unwrap(),
        "1"
    );
}

#[test]
fn two_servers_run_side_by_side_and_restart() {
    let mut a = PgServer::start();
    let b = PgServer::start();
    assert_ne!(a.port(), b.port());
    a.exec("create table t (x int); insert into t values (7)");
    assert!(
        b.try_psql("select * from t").is_err(),
        "servers must not share data"
    );
    a.restart();
    assert_eq!(a.psql("select x from t"), "7");
}

#[test]
fn create_user_and_hba_scram() {
    let pg = PgServer::start();
    pg.create_user("alice", "s3cret", "scram-sha-256");
    pg.set_hba(&["host all alice 127.0.0.1/32 scram-sha-256"]);
    assert!(pg.stored_password("alice").starts_with("SCRAM-SHA-256$"));
    assert!(psql_at(
        "127.0.0.1",
        pg.port(),
        "postgres",
        "alice",
        Some("wrong"),
        "select 1"
    )
    .is_err());
    assert_eq!(
        psql_at(
            "127.0.0.1",
            pg.port(),
            "postgres",
            "alice",
            Some("s3cret"),
            "select 1"
        )
        .unwrap(),
        "1"
    );
}

#[tokio::test]
async fn tokio_postgres_and_backend_count() {
    let pg = PgServer::start();
    pg.create_user("app", "x", "md5");
    let c = connect(pg.port(), "postgres", "app").await.unwrap();
    assert_eq!(q1(&c, "select 1 + 1").await, "2");
    assert_eq!(pg.count_backends("app"), 1);
}

#[test]
fn pgbench_direct_is_parsed() {
    let pg = PgServer::start();
    pgbench_direct(&pg, "postgres", "postgres", &["-i", "-s", "1", "-q"]);
    let r = pgbench_direct(
        &pg,
        "postgres",
        "postgres",
        &["-c", "4", "-j", "2", "-t", "20"],
    );
    r.assert_clean();
    assert_eq!(r.processed, 80);
    assert!(r.tps > 0.0);
}

#[test]
fn raw_client_reads_errors() {
    let pg = PgServer::start();
    let mut c = RawConn::startup(pg.port(), "postgres", "postgres", &[]).unwrap();
    assert_eq!(c.query_one("select 'x'"), "x");
    let e = c.simple_query("select 1/0").unwrap_err();
    assert_eq!(e.code, "22012");
    assert_eq!(e.severity, "ERROR");
    let e = RawConn::startup(pg.port(), "postgres", "nope", &[])
        .err()
        .unwrap();
    assert_eq!((e.severity.as_str(), e.code.as_str()), ("FATAL", "3D000"));
}
