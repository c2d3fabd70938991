//! Startup: SSLRequest / GSSENCRequest without TLS, startup parameters and
//! ignore_startup_parameters.

mod common;

use common::*;

#[test]
fn ssl_request_is_declined_then_startup_works() {
    let pg = PgServer::start();
    let weir = Weir::for_pg(&pg).start();
    let mut c = RawConn::connect(weir.port());
    c.send(&proto::ssl_request());
    assert_eq!(
        c.read_byte().unwrap(),
        Some(b'N'),
        "SSLRequest must be answered 'N' without TLS"
    );
    c.send(&proto::startup_message(&[
        ("user", "postgres"),
        ("database", "postgres"),
    ]));
    let msgs = c.read_until_ready();
    assert!(msgs.iter().any(|m| m.tag == b'R'), "no AuthenticationOk");
    assert_eq!(
        c.query_one("select 'after ssl request'"),
        "after ssl request"
    );
}

#[test]
fn gssenc_request_is_declined_then_startup_works() {
    let pg = PgServer::start();
    let weir = Weir::for_pg(&pg).start();
    let mut c = RawConn::connect(weir.port());
    c.send(&proto::gssenc_request());
    assert_eq!(
        c.read_byte().unwrap(),
        Some(b'N'),
        "GSSENCRequest must be answered 'N'"
    );
    c.send(&proto::startup_message(&[
        ("user", "postgres"),
        ("database", "postgres"),
    ]));
    c.read_until_ready();
    assert_eq!(c.query_one("select 1"), "1");
}

/// libpq with sslmode=prefer (its default) goes through the SSLRequest path.
#[test]
fn psql_with_sslmode_prefer() {
    let pg = PgServer::start();
    let weir = Weir::for_pg(&pg).start();
    let mut cmd = clean_command("psql");
    cmd.args(["-X", "-A", "-t", "-c", "select 'prefer'"])
        .arg(format!(
            "host=127.0.0.1 port={} user=postgres dbname=postgres sslmode=prefer",
            weir.port()
        ));
    let out = run_with_timeout(&mut cmd, None, TIMEOUT);
    assert!(
        out.status.success(),
        "psql failed: {}",
        String::from_utf8_lossy(&out.stderr)
    );
    assert_eq!(String::from_utf8_lossy(&out.stdout).trim(), "prefer");
}

/// By default only tracked parameters are accepted in the StartupMessage.
#[test]
fn unsupported_startup_parameter_is_refused() {
    let pg = PgServer::start();
    let weir = Weir::for_pg(&pg).start();
    let e = RawConn::startup(
        weir.port(),
        "postgres",
        "postgres",
        &[("extra_float_digits", "2")],
    )
    .err()
    .expect("extra_float_digits accepted without ignore_startup_parameters");
    assert_eq!(
        (e.severity.as_str(), e.code.as_str()),
        ("FATAL", "08P01"),
        "{e:?}"
    );
    assert_eq!(
        e.message,
        "unsupported startup parameter: extra_float_digits"
    );
}

#[test]
fn ignore_startup_parameters_accepts_listed_ones() {
    let pg = PgServer::start();
    let weir = Weir::for_pg(&pg)
        .set("ignore_startup_parameters", "extra_float_digits, options")
        .start();
    let mut c = RawConn::startup(
        weir.port(),
        "postgres",
        "postgres",
        &[("extra_float_digits", "2"), ("options", "-c geqo=off")],
    )
    .unwrap_or_else(|e| panic!("ignored parameters refused: {e:?}"));
    assert_eq!(c.query_one("select 1"), "1");
    // Still refused: a parameter not in the list.
    let e = RawConn::startup(weir.port(), "postgres", "postgres", &[("search_path", "x")])
        .err()
        .expect("search_path accepted although not ignored");
    assert_eq!(e.message, "unsupported startup parameter: search_path");
}

/// The parameters Weir tracks are accepted without configuration.
#[test]
fn tracked_startup_parameters_are_accepted() {
    let pg = PgServer::start();
    let weir = Weir::for_pg(&pg).start();
    let mut c = RawConn::startup(
        weir.port(),
        "postgres",
        "postgres",
        &[
            ("client_encoding", "UTF8"),
            ("DateStyle", "ISO, MDY"),
            ("TimeZone", "UTC"),
            ("standard_conforming_strings", "on"),
            ("application_name", "tracked"),
        ],
    )
    .unwrap_or_else(|e| panic!("tracked parameters refused: {e:?}"));
    assert_eq!(c.query_one("show application_name"), "tracked");
}
