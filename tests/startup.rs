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

/// Beyond PgBouncer (which refuses what it does not track unless ignore_startup_parameters
/// lists it): any other startup setting, and the `-c` settings of `options` (PGOPTIONS),
/// are the client's own in transaction mode, on whichever server it is lent, and no other
/// client's. sqlx sends extra_float_digits at its defaults, as pgJDBC did up to 42.7.4.
#[test]
fn startup_settings_follow_the_client() {
    let pg = PgServer::start();
    let weir = Weir::for_pg(&pg)
        .set("pool_mode", "transaction")
        .set("default_pool_size", 1)
        .start();
    let mut a = RawConn::startup(
        weir.port(),
        "postgres",
        "postgres",
        &[
            ("extra_float_digits", "2"),
            ("options", "-c geqo=off --statement-timeout=5s"),
        ],
    )
    .unwrap_or_else(|e| panic!("startup settings refused: {e:?}"));
    let mut b = RawConn::startup(weir.port(), "postgres", "postgres", &[]).expect("login");
    for _ in 0..2 {
        assert_eq!(a.query_one("show extra_float_digits"), "2");
        assert_eq!(a.query_one("show geqo"), "off");
        assert_eq!(a.query_one("show statement_timeout"), "5s");
        assert_eq!(b.query_one("show extra_float_digits"), "1");
        assert_eq!(b.query_one("show geqo"), "on");
    }
    // RESET ALL goes back to them, as on a direct connection.
    a.simple_query("set extra_float_digits = 0; reset all")
        .expect("reset all");
    assert_eq!(a.query_one("show extra_float_digits"), "2");
    assert_eq!(b.query_one("show extra_float_digits"), "1");
    assert_eq!(a.query_one("show extra_float_digits"), "2");
    // Other server switches in options are still refused.
    let e = RawConn::startup(weir.port(), "postgres", "postgres", &[("options", "-e")])
        .err()
        .expect("options -e accepted");
    assert_eq!((e.code.as_str(), e.severity.as_str()), ("08P01", "FATAL"));
    // A setting PostgreSQL does not know fails the first query, as it fails the login of
    // a direct connection, with PostgreSQL's own error.
    let mut c = RawConn::startup(
        weir.port(),
        "postgres",
        "postgres",
        &[("no_such_setting", "1")],
    )
    .expect("login");
    c.send(&common::proto::query("select 1"));
    let e = c.expect_error();
    assert_eq!(
        (e.code.as_str(), e.severity.as_str()),
        ("42704", "FATAL"),
        "{e:?}"
    );
    assert!(c.closes());
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
    // Listed ones are dropped, as PgBouncer drops them.
    assert_eq!(c.query_one("show extra_float_digits"), "1");
    assert_eq!(c.query_one("show geqo"), "on");
}

/// The `-c` settings of `options` are startup parameters each, as PgBouncer 1.21+ reads
/// them: one ignore_startup_parameters lists is dropped, the others are kept.
#[test]
fn ignore_startup_parameters_applies_to_the_settings_of_options() {
    let pg = PgServer::start();
    let weir = Weir::for_pg(&pg)
        .set("ignore_startup_parameters", "extra_float_digits")
        .start();
    let mut c = RawConn::startup(
        weir.port(),
        "postgres",
        "postgres",
        &[("options", "-c extra_float_digits=2 -c geqo=off")],
    )
    .unwrap_or_else(|e| panic!("options refused: {e:?}"));
    assert_eq!(c.query_one("show extra_float_digits"), "1");
    assert_eq!(c.query_one("show geqo"), "off");
}

/// As PgBouncer's test_options_startup_param: an `options` that is not `-c`/`--` settings
/// is refused in PgBouncer's words; with `options` itself in ignore_startup_parameters the
/// tracked settings in it still apply and the others are dropped, and a malformed one is
/// still refused. About 1 s.
#[test]
fn options_are_refused_and_ignored_as_pgbouncer_does() {
    let pg = PgServer::start();
    let refused = |weir: &Weir, options: &str| {
        let e = RawConn::startup(weir.port(), "postgres", "postgres", &[("options", options)])
            .err()
            .unwrap_or_else(|| panic!("options {options:?} were taken"));
        assert_eq!(
            e.message,
            "unsupported options startup parameter: only '-c config=val' and '--config=val' are allowed"
        );
    };
    let weir = Weir::for_pg(&pg).start();
    refused(&weir, "-d");
    refused(&weir, "-c timezone");

    let weir = Weir::for_pg(&pg)
        .set("ignore_startup_parameters", "options")
        .start();
    let mut c = RawConn::startup(
        weir.port(),
        "postgres",
        "postgres",
        &[(
            "options",
            "-c enable_seqscan=false -ctimezone=Europe/Lisbon --datestyle=German,\\ YMD",
        )],
    )
    .unwrap_or_else(|e| panic!("options refused: {e:?}"));
    assert_eq!(c.query_one("show enable_seqscan"), "on");
    assert_eq!(c.query_one("show timezone"), "Europe/Lisbon");
    assert_eq!(c.query_one("show datestyle"), "German, YMD");
    refused(&weir, "-d");
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

/// What a client asking for protocol 3.`minor` with `options` is told before it is
/// logged in: the NegotiateProtocolVersion body, if any, and the BackendKeyData body's
/// length (8 in 3.0: a 4-byte key). The login must then answer a query.
fn negotiation(port: u16, minor: u16, options: &[(&str, &str)]) -> (Option<Vec<u8>>, usize) {
    let mut c = RawConn::connect(port);
    let mut params = vec![("user", "postgres"), ("database", "postgres")];
    params.extend_from_slice(options);
    c.send(&proto::startup_message_version(3, minor, &params));
    let msgs = c.read_until_ready();
    let body = |tag| msgs.iter().find(|m| m.tag == tag).map(|m| m.body.clone());
    let key_len = body(b'K').map_or(0, |k| k.len());
    assert_eq!(c.query_one("select 'negotiated'"), "negotiated");
    (body(b'v'), key_len)
}

/// NegotiateProtocolVersion names the protocol as the whole number (196608: 3.0, never a
/// bare minor, which libpq 18 takes for 0.0) and the `_pq_.` options Weir did not
/// recognize, byte for byte what PostgreSQL 15 sends to a client asking for 3.0 with
/// protocol options. A client asking for 3.0 alone is sent none. (Protocol 3.2, which
/// PostgreSQL 15 does not speak and Weir does: tests/protocol_3_2.rs.)
#[test]
fn negotiate_protocol_version_is_postgresqls() {
    let pg = PgServer::start();
    let weir = Weir::for_pg(&pg).start();
    let with_options: &[(&str, &str)] = &[("_pq_.compression", "on"), ("_pq_.x", "1")];
    let mut listed = 196_608u32.to_be_bytes().to_vec();
    listed.extend_from_slice(&2u32.to_be_bytes());
    listed.extend_from_slice(b"_pq_.compression\0_pq_.x\0");
    for (minor, options, want) in [(0, with_options, Some(listed)), (0, &[][..], None)] {
        let direct = negotiation(pg.port(), minor, options);
        assert_eq!(
            direct,
            (want.clone(), 8),
            "PostgreSQL, 3.{minor} {options:?}"
        );
        let through = negotiation(weir.port(), minor, options);
        assert_eq!(through, direct, "Weir, 3.{minor} {options:?}");
    }
}
