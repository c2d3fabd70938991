//! Parameter sync: client_encoding, DateStyle, TimeZone,
//! standard_conforming_strings and application_name follow the client when
//! a server is lent to clients whose values differ (transaction mode, one
//! server shared by everyone).

mod common;

use common::*;

fn shared_server_weir(pg: &PgServer) -> Weir {
    Weir::for_pg(pg)
        .set("pool_mode", "transaction")
        .set("default_pool_size", 1)
        .set("query_wait_timeout", 30)
        .start()
}

fn show_all(c: &mut RawConn) -> (String, String, String, String) {
    (
        c.query_one("show timezone"),
        c.query_one("show datestyle"),
        c.query_one("show application_name"),
        c.query_one("show client_encoding"),
    )
}

/// Values sent in the StartupMessage apply to that client only.
#[test]
fn startup_parameters_follow_each_client() {
    let pg = PgServer::start();
    let weir = shared_server_weir(&pg);
    let mut a = RawConn::startup(
        weir.port(),
        "postgres",
        "postgres",
        &[
            ("TimeZone", "Asia/Tokyo"),
            ("DateStyle", "SQL, DMY"),
            ("application_name", "alpha"),
            ("client_encoding", "LATIN1"),
        ],
    )
    .unwrap_or_else(|e| panic!("startup with parameters refused: {e:?}"));
    let mut b = RawConn::startup(
        weir.port(),
        "postgres",
        "postgres",
        &[
            ("TimeZone", "UTC"),
            ("DateStyle", "ISO, MDY"),
            ("application_name", "beta"),
            ("client_encoding", "UTF8"),
        ],
    )
    .unwrap();
    let pid = a.query_one("select pg_backend_pid()");
    assert_eq!(
        b.query_one("select pg_backend_pid()"),
        pid,
        "the server is shared"
    );
    for _ in 0..3 {
        assert_eq!(
            show_all(&mut a),
            (
                "Asia/Tokyo".into(),
                "SQL, DMY".into(),
                "alpha".into(),
                "LATIN1".into()
            )
        );
        assert_eq!(
            show_all(&mut b),
            (
                "UTC".into(),
                "ISO, MDY".into(),
                "beta".into(),
                "UTF8".into()
            )
        );
    }
    // The values are really in effect, not just reported.
    assert_eq!(
        a.query_one("select '2024-03-01 12:00:00+00'::timestamptz::text"),
        "01/03/2024 21:00:00 JST"
    );
    assert_eq!(
        b.query_one("select '2024-03-01 12:00:00+00'::timestamptz::text"),
        "2024-03-01 12:00:00+00"
    );
    // application_name as PostgreSQL sees it.
    assert_eq!(
        a.query_one("select application_name from pg_stat_activity where pid = pg_backend_pid()"),
        "alpha"
    );
}

/// The ParameterStatus messages a client gets at login carry its own values.
#[test]
fn login_reports_clients_own_parameters() {
    let pg = PgServer::start();
    let weir = shared_server_weir(&pg);
    // Make the pool's server exist with other values first.
    let mut first =
        RawConn::startup(weir.port(), "postgres", "postgres", &[("TimeZone", "UTC")]).unwrap();
    first.query_one("select 1");
    let a = RawConn::startup(
        weir.port(),
        "postgres",
        "postgres",
        &[("TimeZone", "Asia/Tokyo"), ("application_name", "alpha")],
    )
    .unwrap();
    assert_eq!(
        a.params.get("TimeZone").map(String::as_str),
        Some("Asia/Tokyo")
    );
    assert_eq!(
        a.params.get("application_name").map(String::as_str),
        Some("alpha")
    );
    for p in [
        "server_version",
        "client_encoding",
        "DateStyle",
        "integer_datetimes",
        "standard_conforming_strings",
    ] {
        assert!(
            a.params.contains_key(p),
            "no ParameterStatus {p} at login: {:?}",
            a.params
        );
    }
    assert!(a.key.is_some(), "no BackendKeyData at login");
}

/// A client's SET of a reported parameter sticks to that client (Weir sees
/// the ParameterStatus) and does not leak to the others.
#[test]
fn set_parameter_follows_the_client_not_the_server() {
    let pg = PgServer::start();
    let weir = shared_server_weir(&pg);
    let mut a =
        RawConn::startup(weir.port(), "postgres", "postgres", &[("TimeZone", "UTC")]).unwrap();
    let mut b =
        RawConn::startup(weir.port(), "postgres", "postgres", &[("TimeZone", "UTC")]).unwrap();
    a.simple_query("set timezone = 'Europe/Paris'; set datestyle = 'German'; set standard_conforming_strings = off; set application_name = 'changed'")
        .unwrap();
    assert_eq!(b.query_one("show timezone"), "UTC");
    assert_eq!(b.query_one("show datestyle"), "ISO, MDY");
    assert_eq!(b.query_one("show standard_conforming_strings"), "on");
    assert_ne!(b.query_one("show application_name"), "changed");
    assert_eq!(a.query_one("show timezone"), "Europe/Paris");
    assert_eq!(a.query_one("show datestyle"), "German, DMY");
    assert_eq!(a.query_one("show standard_conforming_strings"), "off");
    assert_eq!(a.query_one("show application_name"), "changed");
    assert_eq!(b.query_one("show timezone"), "UTC");
}

/// Parameter sync also happens for clients served by tokio-postgres (which
/// sends client_encoding=UTF8) next to a psql-like client with LATIN1.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn client_encoding_is_synced_for_tokio_postgres() {
    let pg = PgServer::start();
    let weir = shared_server_weir(&pg);
    let mut latin = RawConn::startup(
        weir.port(),
        "postgres",
        "postgres",
        &[("client_encoding", "LATIN1")],
    )
    .unwrap();
    assert_eq!(latin.query_one("show client_encoding"), "LATIN1");
    let c = connect(weir.port(), "postgres", "postgres").await.unwrap();
    assert_eq!(q1(&c, "show client_encoding").await, "UTF8");
    assert_eq!(q1(&c, "select 'äöü'").await, "äöü");
    assert_eq!(latin.query_one("show client_encoding"), "LATIN1");
}
