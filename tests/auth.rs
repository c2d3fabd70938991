//! Authentication: clients against auth_file (trust, plain, md5,
//! scram-sha-256), and Weir's own login to PostgreSQL (trust, md5, scram;
//! password from the [databases] entry or from auth_file).

mod common;

use common::*;

/// Asserts a failed login with "wrong password" semantics.
fn assert_wrong_password(e: &tokio_postgres::Error, user: &str) {
    let f = expect_db_error(e);
    assert_eq!(f.severity, "FATAL", "{f:?}");
    assert_eq!(f.code, "28P01", "{f:?}");
    assert_eq!(
        f.message,
        format!("password authentication failed for user \"{user}\"")
    );
}

/// Asserts a failed SCRAM login: PgBouncer's wording, whatever went wrong (a wrong
/// password, an unknown user), with PostgreSQL's SQLSTATE.
fn assert_sasl_failed(e: &tokio_postgres::Error) {
    let f = expect_db_error(e);
    assert_eq!(
        (f.severity.as_str(), f.code.as_str(), f.message.as_str()),
        ("FATAL", "28P01", "SASL authentication failed"),
        "{f:?}"
    );
}

async fn assert_login_ok(weir: &Weir, user: &str, password: &str) {
    let c = connect_pw(weir.port(), "postgres", user, password)
        .await
        .unwrap_or_else(|e| panic!("login of {user} failed: {e:?}\n{}", weir.log_tail()));
    assert_eq!(q1(&c, "select 'in'").await, "in");
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn auth_trust_needs_no_password() {
    let pg = PgServer::start();
    let weir = Weir::for_pg(&pg)
        .set("auth_type", "trust")
        .userlist(&[("postgres", "whatever")])
        .start();
    let c = connect(weir.port(), "postgres", "postgres").await.unwrap();
    assert_eq!(q1(&c, "select current_user").await, "postgres");
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn auth_plain_checks_cleartext_password() {
    let pg = PgServer::start();
    let weir = Weir::for_pg(&pg)
        .set("auth_type", "plain")
        .userlist(&[("postgres", "s3cret")])
        .start();
    assert_login_ok(&weir, "postgres", "s3cret").await;
    let e = connect_pw(weir.port(), "postgres", "postgres", "wrong")
        .await
        .unwrap_err();
    assert_wrong_password(&e, "postgres");
    assert_login_ok(&weir, "postgres", "s3cret").await;
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn auth_md5_with_plaintext_entry() {
    let pg = PgServer::start();
    let weir = Weir::for_pg(&pg)
        .set("auth_type", "md5")
        .userlist(&[("postgres", "s3cret")])
        .start();
    assert_login_ok(&weir, "postgres", "s3cret").await;
    let e = connect_pw(weir.port(), "postgres", "postgres", "wrong")
        .await
        .unwrap_err();
    assert_wrong_password(&e, "postgres");
    // libpq (psql) too.
    let out = psql_at(
        "127.0.0.1",
        weir.port(),
        "postgres",
        "postgres",
        Some("s3cret"),
        "select 'libpq'",
    );
    assert_eq!(out.unwrap(), "libpq");
    let err = psql_at(
        "127.0.0.1",
        weir.port(),
        "postgres",
        "postgres",
        Some("nope"),
        "select 1",
    )
    .unwrap_err();
    assert!(err.contains("password authentication failed"), "{err}");
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn auth_md5_with_md5_hash_entry() {
    let pg = PgServer::start();
    let hash = pg.psql("select 'md5' || md5('s3cret' || 'postgres')");
    let weir = Weir::for_pg(&pg)
        .set("auth_type", "md5")
        .userlist(&[("postgres", &hash)])
        .start();
    assert_login_ok(&weir, "postgres", "s3cret").await;
    let e = connect_pw(weir.port(), "postgres", "postgres", &hash)
        .await
        .unwrap_err();
    assert_wrong_password(&e, "postgres");
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn auth_scram_with_plaintext_entry() {
    let pg = PgServer::start();
    let weir = Weir::for_pg(&pg)
        .set("auth_type", "scram-sha-256")
        .userlist(&[("postgres", "s3cret")])
        .start();
    assert_login_ok(&weir, "postgres", "s3cret").await;
    let e = connect_pw(weir.port(), "postgres", "postgres", "wrong")
        .await
        .unwrap_err();
    assert_sasl_failed(&e);
    let out = psql_at(
        "127.0.0.1",
        weir.port(),
        "postgres",
        "postgres",
        Some("s3cret"),
        "select 'libpq'",
    );
    assert_eq!(out.unwrap(), "libpq");
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn auth_scram_with_scram_secret_entry() {
    let pg = PgServer::start();
    pg.create_user("alice", "s3cret", "scram-sha-256");
    let secret = pg.stored_password("alice");
    assert!(secret.starts_with("SCRAM-SHA-256$"));
    let weir = Weir::for_pg(&pg)
        .set("auth_type", "scram-sha-256")
        .userlist(&[("alice", &secret)])
        .start();
    assert_login_ok(&weir, "alice", "s3cret").await;
    let e = connect_pw(weir.port(), "postgres", "alice", "wrong")
        .await
        .unwrap_err();
    assert_sasl_failed(&e);
}

/// SCRAM pass-through after RECONNECT (PgBouncer's test_scram_passthrough_after_reconnect
/// and test_scram_cached_adhoc_secrets_after_reconnect): PostgreSQL demands SCRAM of both
/// roles and the database entry has no password, so Weir logs in with the keys of the
/// client's own SCRAM exchange, from a SCRAM secret (alice) or worked out from a
/// cleartext entry (bob). RECONNECT closes the server; the same client's next query
/// logs a new one in with the keys Weir kept, and so does a new client's. ~2 s.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn scram_pass_through_survives_reconnect() {
    let pg = PgServer::start();
    pg.create_user("alice", "s3cret", "scram-sha-256");
    pg.create_user("bob", "s3cret", "scram-sha-256");
    pg.set_hba(&["host all alice,bob 127.0.0.1/32 scram-sha-256"]);
    let secret = pg.stored_password("alice");
    let weir = Weir::for_pg(&pg)
        .set("auth_type", "scram-sha-256")
        .set("pool_mode", "transaction")
        .set("admin_users", "admin")
        .userlist(&[("alice", &secret), ("bob", "s3cret"), ("admin", "adminpw")])
        .start();
    let admin = connect_pw(weir.port(), "pgbouncer", "admin", "adminpw")
        .await
        .unwrap_or_else(|e| panic!("console: {e:?}\n{}", weir.log_tail()));
    for user in ["alice", "bob"] {
        let c = connect_pw(weir.port(), "postgres", user, "s3cret")
            .await
            .unwrap_or_else(|e| panic!("{user}: {e:?}\n{}", weir.log_tail()));
        let before = q1(&c, "select pg_backend_pid()::text").await;
        admin.simple_query("RECONNECT").await.expect("RECONNECT");
        assert!(
            eventually(TIMEOUT, || pg.count_backends(user) == 0),
            "RECONNECT left {user}'s server open"
        );
        let after = q1(&c, "select current_user || ' ' || pg_backend_pid()").await;
        assert_eq!(after.split(' ').next(), Some(user), "{}", weir.log_tail());
        assert!(
            !after.ends_with(&before),
            "{user}: the old server was reused"
        );
        let again = connect_pw(weir.port(), "postgres", user, "s3cret")
            .await
            .unwrap_or_else(|e| panic!("{user} again: {e:?}\n{}", weir.log_tail()));
        assert_eq!(q1(&again, "select current_user").await, user);
    }
}

/// auth_query runs on a connection of Weir's own, with none of the client's settings
/// (PgBouncer's test_auth_query_no_set_commands): a lookup function that refuses to run
/// under the search_path the client asks for in `options` still finds the client, whose
/// session then has that search_path. ~2 s.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn auth_query_runs_none_of_the_clients_settings() {
    let pg = PgServer::start();
    pg.create_user("carol", "pw1", "md5");
    pg.create_user_lookup();
    pg.exec(
        "create schema malicious_schema; \
         create function public.checked_lookup(i_username text, out usename text, \
         out passwd text) returns record as $$ \
         begin \
           if current_setting('search_path') like '%malicious_schema%' then \
             raise exception 'malicious search_path detected in auth query'; \
           end if; \
           select s.usename, s.passwd from pg_catalog.pg_shadow s \
            where s.usename = i_username into usename, passwd; \
           return; \
         end; $$ language plpgsql security definer; \
         grant execute on function public.checked_lookup(text) to lookup;",
    );
    let weir = Weir::for_pg(&pg)
        .auth_query_lookup()
        .set(
            "auth_query",
            "SELECT usename, passwd FROM public.checked_lookup($1)",
        )
        .userlist(&[("lookup", "")])
        .start();
    let out = psql_at(
        "127.0.0.1",
        weir.port(),
        "dbname=postgres options='-c search_path=malicious_schema,public'",
        "carol",
        Some("pw1"),
        "show search_path",
    );
    assert_eq!(
        out.as_deref(),
        Ok("malicious_schema,public"),
        "{}",
        weir.log_tail()
    );
    assert!(!pg.log().contains("malicious search_path detected"));
}

/// A user missing from auth_file, password auth: refused like a wrong
/// password, after a full exchange, so that user names cannot be probed.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn auth_md5_unknown_user_is_refused_like_a_wrong_password() {
    let pg = PgServer::start();
    let weir = Weir::for_pg(&pg)
        .set("auth_type", "md5")
        .userlist(&[("postgres", "s3cret")])
        .start();
    let e = connect_pw(weir.port(), "postgres", "ghost", "s3cret")
        .await
        .unwrap_err();
    assert_wrong_password(&e, "ghost");
    assert_login_ok(&weir, "postgres", "s3cret").await;
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn auth_scram_unknown_user_is_refused_like_a_wrong_password() {
    let pg = PgServer::start();
    let weir = Weir::for_pg(&pg)
        .set("auth_type", "scram-sha-256")
        .userlist(&[("postgres", "s3cret")])
        .start();
    let e = connect_pw(weir.port(), "postgres", "ghost", "s3cret")
        .await
        .unwrap_err();
    assert_sasl_failed(&e);
}

/// A wrong password is answered alike whether the database is configured or not, as
/// PgBouncer's test_no_database_authfail has it; only a client that authenticated learns
/// that there is no such database. Likewise the console says who may use it only to a
/// client that authenticated.
async fn database_not_disclosed_before_authentication(method: &str) {
    let pg = PgServer::start();
    let weir = Weir::for_pg(&pg)
        .set("auth_type", method)
        .set("admin_users", "admin")
        .userlist(&[("postgres", "s3cret"), ("admin", "adminpw")])
        .start();
    let refusal = |db: &'static str, user: &'static str, password: &'static str| {
        let port = weir.port();
        async move {
            let e = connect_pw(port, db, user, password)
                .await
                .err()
                .unwrap_or_else(|| panic!("{user} logged in to {db} with {password}"));
            expect_db_error(&e)
        }
    };
    let known = refusal("postgres", "postgres", "wrong").await;
    assert_eq!(
        (known.severity.as_str(), known.code.as_str()),
        ("FATAL", "28P01"),
        "{known:?}"
    );
    assert_eq!(refusal("nosuchdb", "postgres", "wrong").await, known);
    assert_eq!(
        refusal("nosuchdb", "ghost", "wrong").await,
        refusal("postgres", "ghost", "wrong").await
    );
    // A user who is no admin, with a wrong password to the console.
    assert_eq!(refusal("pgbouncer", "postgres", "wrong").await, known);

    let unknown = refusal("nosuchdb", "postgres", "s3cret").await;
    assert_eq!(
        (unknown.severity.as_str(), unknown.code.as_str()),
        ("FATAL", "3D000"),
        "{unknown:?}"
    );
    assert_eq!(unknown.message, "no such database: nosuchdb");
    let console = refusal("pgbouncer", "postgres", "s3cret").await;
    assert_eq!(
        (console.code.as_str(), console.message.as_str()),
        ("28000", "not allowed to connect to the admin console"),
        "{console:?}"
    );
    assert_login_ok(&weir, "postgres", "s3cret").await;
    let admin = connect_pw(weir.port(), "pgbouncer", "admin", "adminpw")
        .await
        .unwrap_or_else(|e| panic!("admin refused: {e:?}\n{}", weir.log_tail()));
    admin.simple_query("SHOW POOLS").await.unwrap();
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn auth_md5_wrong_password_does_not_disclose_the_database() {
    database_not_disclosed_before_authentication("md5").await;
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn auth_scram_wrong_password_does_not_disclose_the_database() {
    database_not_disclosed_before_authentication("scram-sha-256").await;
}

/// With trust there is no exchange to hide behind: 28000 and PgBouncer's
/// `"trust" authentication failed`.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn auth_trust_unknown_user_is_refused() {
    let pg = PgServer::start();
    let weir = Weir::for_pg(&pg)
        .set("auth_type", "trust")
        .userlist(&[("postgres", "")])
        .start();
    let e = connect(weir.port(), "postgres", "ghost").await.unwrap_err();
    let f = expect_db_error(&e);
    assert_eq!(
        (f.severity.as_str(), f.code.as_str()),
        ("FATAL", "28000"),
        "{f:?}"
    );
    assert_eq!(f.message, "\"trust\" authentication failed");
    assert_serving(&weir, "postgres", "postgres").await;
}

/// Client authentication over the Unix socket uses the same auth_type.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn auth_md5_over_unix_socket() {
    let pg = PgServer::start();
    let weir = Weir::for_pg(&pg)
        .set("auth_type", "md5")
        .userlist(&[("postgres", "s3cret")])
        .start();
    let host = weir.dir().to_str().unwrap().to_string();
    assert_eq!(
        psql_at(
            &host,
            weir.port(),
            "postgres",
            "postgres",
            Some("s3cret"),
            "select 'unix'"
        )
        .unwrap(),
        "unix"
    );
    let err = psql_at(
        &host,
        weir.port(),
        "postgres",
        "postgres",
        Some("bad"),
        "select 1",
    )
    .unwrap_err();
    assert!(err.contains("password authentication failed"), "{err}");
}

// ---------------------------------------------------------------------------
// Weir's login to PostgreSQL

/// A role `srv` whose server login needs `method`.
fn server_with_password_role(method: &str) -> PgServer {
    let pg = PgServer::start();
    pg.create_user("srv", "srvpw", method);
    pg.set_hba(&[&format!("host all srv 127.0.0.1/32 {method}")]);
    // The role really cannot log in without its password.
    assert!(psql_at(
        "127.0.0.1",
        pg.port(),
        "postgres",
        "srv",
        Some("bad"),
        "select 1"
    )
    .is_err());
    pg
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn server_login_trust() {
    let pg = PgServer::start();
    pg.create_user("srv", "srvpw", "md5");
    let weir = Weir::builder()
        .database("db", &format!("{} user=srv", pg.connstr()))
        .start();
    let c = connect(weir.port(), "db", "postgres").await.unwrap();
    assert_eq!(q1(&c, "select current_user").await, "srv");
}

/// Weir logs in to a server whose pg_hba demands `method` for role srv, with the
/// password from the [databases] entry, and the client is connected as srv.
async fn server_login_from_database_entry(method: &str) {
    let pg = server_with_password_role(method);
    let weir = Weir::builder()
        .database("db", &format!("{} user=srv password=srvpw", pg.connstr()))
        .start();
    let c = connect(weir.port(), "db", "postgres")
        .await
        .unwrap_or_else(|e| panic!("{e:?}\n{}", weir.log_tail()));
    assert_eq!(q1(&c, "select current_user").await, "srv");
}

/// The same, with the password from the auth_file (the client authenticates with it
/// too, by `method`).
async fn server_login_from_auth_file(method: &str) {
    let pg = server_with_password_role(method);
    let weir = Weir::for_pg(&pg)
        .set("auth_type", method)
        .userlist(&[("srv", "srvpw")])
        .start();
    let c = connect_pw(weir.port(), "postgres", "srv", "srvpw")
        .await
        .unwrap_or_else(|e| panic!("{e:?}\n{}", weir.log_tail()));
    assert_eq!(q1(&c, "select current_user").await, "srv");
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn server_login_md5_password_from_database_entry() {
    server_login_from_database_entry("md5").await;
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn server_login_scram_password_from_database_entry() {
    server_login_from_database_entry("scram-sha-256").await;
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn server_login_md5_password_from_auth_file() {
    server_login_from_auth_file("md5").await;
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn server_login_scram_password_from_auth_file() {
    server_login_from_auth_file("scram-sha-256").await;
}

/// The server refuses Weir's login (wrong password in the database entry):
/// the client gets a FATAL error, and Weir keeps serving other databases.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn server_login_refused_is_reported_to_client() {
    let pg = server_with_password_role("scram-sha-256");
    let weir = Weir::for_pg(&pg)
        .database("bad", &format!("{} user=srv password=wrong", pg.connstr()))
        .start();
    let err = match connect(weir.port(), "bad", "postgres").await {
        Err(e) => e,
        Ok(c) => q(&c, "select 1")
            .await
            .expect_err("query on a server that refused login succeeded"),
    };
    let f = expect_db_error(&err);
    assert_eq!(f.severity, "FATAL", "{f:?}");
    assert!(
        f.code == "08006" || f.code == "28P01",
        "unexpected SQLSTATE: {f:?}"
    );
    assert!(
        f.message.contains("password authentication failed")
            || f.message.starts_with("server login failed"),
        "{f:?}"
    );
    assert_serving(&weir, "postgres", "postgres").await;
}

// ---------------------------------------------------------------------------
// Long secrets and a damaged auth_file

/// A password of `len` characters that PostgreSQL's SQL takes unquoted.
fn long_password(len: usize) -> String {
    const ALPHABET: &[u8] = b"ABCDEFGHIJKLMNOPQRSTUVWXYZabcdefghijklmnopqrstuvwxyz0123456789-_.~";
    (0..len)
        .map(|i| ALPHABET[i * 7 % ALPHABET.len()] as char)
        .collect()
}

/// Passwords of the length cloud IAM tokens run to, and more: 20,000 characters, in the
/// auth_file as plain text and as the SCRAM secret PostgreSQL stores. The userlist lines
/// are past the 2,048 characters once read, the cleartext password packet (auth_type
/// plain) past the 10,000 bytes once allowed; and PostgreSQL, which demands SCRAM of
/// both roles, takes Weir's login with either.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn long_passwords_log_in() {
    let pg = PgServer::start();
    let long = long_password(20_000);
    pg.create_user("plainlong", &long, "scram-sha-256");
    pg.create_user("scramlong", &long, "scram-sha-256");
    pg.set_hba(&["host all plainlong,scramlong 127.0.0.1/32 scram-sha-256"]);
    let secret = pg.stored_password("scramlong");
    // Weir can log in to PostgreSQL for scramlong only with the client's SCRAM proof.
    for (auth_type, users) in [
        ("plain", &["plainlong"][..]),
        ("scram-sha-256", &["plainlong", "scramlong"][..]),
    ] {
        let weir = Weir::for_pg(&pg)
            .set("auth_type", auth_type)
            .userlist(&[("plainlong", &long), ("scramlong", &secret)])
            .start();
        for user in users {
            let out = psql_at(
                "127.0.0.1",
                weir.port(),
                "postgres",
                user,
                Some(&long),
                "select current_user",
            );
            assert_eq!(
                out.as_deref(),
                Ok(*user),
                "{auth_type}\n{}",
                weir.log_tail()
            );
        }
        assert_login_ok(&weir, "plainlong", &long).await;
        let e = connect_pw(weir.port(), "postgres", "plainlong", &long[1..])
            .await
            .unwrap_err();
        if auth_type == "plain" {
            assert_wrong_password(&e, "plainlong");
        } else {
            assert_sasl_failed(&e);
        }
    }
}

/// The longest password packet is PgBouncer 1.25's: 65,535 bytes with its length word,
/// so a 65,530-character cleartext password (and its NUL); one byte more is refused as
/// a bad packet, 08P01, without a word on what the password was.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn longest_password_packet() {
    let pg = PgServer::start();
    let longest = long_password(65_530);
    let too_long = long_password(65_531);
    pg.exec("create role edge login; create role over login");
    let weir = Weir::for_pg(&pg)
        .set("auth_type", "plain")
        .userlist(&[("edge", &longest), ("over", &too_long)])
        .start();
    let mut c = RawConn::startup_pw(weir.port(), "edge", "postgres", &[], Some(&longest))
        .unwrap_or_else(|e| panic!("{e:?}\n{}", weir.log_tail()));
    assert_eq!(c.query_one("select current_user"), "edge");
    let e = RawConn::startup_pw(weir.port(), "over", "postgres", &[], Some(&too_long))
        .err()
        .expect("a 65,536-byte password packet was taken");
    assert_eq!((e.severity.as_str(), e.code.as_str()), ("FATAL", "08P01"));
    assert_eq!(e.message, "packet too large");
    assert_eq!(c.query_one("select 'still here'"), "still here");
}

/// A malformed line, and one whose password is past PgBouncer's 65,534 characters, in
/// the middle of the auth_file: each is skipped with one warning naming the file and
/// line, and the users on the lines after them log in. (PgBouncer stops reading at the
/// first, locking out everyone after it.)
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn auth_file_bad_lines_are_skipped_alone() {
    let pg = PgServer::start();
    for u in ["before", "after", "last"] {
        pg.create_user(u, "pw", "md5");
    }
    let dir = tempfile::tempdir().expect("tmp");
    let userlist = dir.path().join("users.txt");
    let text = format!(
        "\"before\" \"pw\"\n\
         before pw\n\
         \"after\" \"pw\"\n\
         \"huge\" \"{}\"\n\
         \"last\" \"pw\"\n",
        "x".repeat(70_000)
    );
    std::fs::write(&userlist, text).expect("write userlist");
    let weir = Weir::for_pg(&pg)
        .set("auth_type", "md5")
        .set("auth_file", userlist.display())
        .start();
    for user in ["before", "after", "last"] {
        assert_login_ok(&weir, user, "pw").await;
    }
    let log = weir.logfile();
    let path = userlist.display();
    for (line, why) in [(2, "broken auth file"), (4, "password too long")] {
        let warning = format!("{path}:{line}: {why}");
        assert_eq!(log.matches(&warning).count(), 1, "{warning}\n{log}");
    }
}

/// PostgreSQL asks for md5 where the auth_file holds a SCRAM secret, which cannot answer
/// it: PgBouncer's `server login failed: wrong password type`, to the client and in the
/// log.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn server_login_md5_with_a_scram_secret_is_the_wrong_password_type() {
    let pg = PgServer::start();
    // A SCRAM secret does not depend on the user name: one made for another role fits.
    pg.create_user("scramsrc", "srvpw", "scram-sha-256");
    let secret = pg.stored_password("scramsrc");
    pg.create_user("srv", "srvpw", "md5");
    pg.set_hba(&["host all srv 127.0.0.1/32 md5"]);
    let weir = Weir::for_pg(&pg)
        .set("auth_type", "scram-sha-256")
        .set("query_wait_timeout", 2)
        .userlist(&[("srv", &secret)])
        .start();
    let err = match connect_pw(weir.port(), "postgres", "srv", "srvpw").await {
        Err(e) => e,
        Ok(c) => q(&c, "select 1")
            .await
            .expect_err("a server login that cannot work succeeded"),
    };
    let f = expect_db_error(&err);
    assert_eq!(
        f.message, "server login failed: wrong password type",
        "{f:?}"
    );
    assert!(
        eventually(TIMEOUT, || weir
            .logfile()
            .contains("server login failed: wrong password type")),
        "{}",
        weir.log_tail()
    );
}

/// auth_type = any takes any user name without a password, so only a database that logs
/// in as a user of its own (a forced user) is served; another is a configuration error,
/// as in PgBouncer, not a login as whoever the client claims to be.
#[test]
fn auth_type_any_needs_a_forced_user() {
    let pg = PgServer::start();
    let weir = Weir::builder()
        .set("auth_type", "any")
        .database(
            "forced",
            &format!("{} dbname=postgres user=postgres", pg.connstr()),
        )
        .database("free", &format!("{} dbname=postgres", pg.connstr()))
        .start();
    let mut c = RawConn::startup(weir.port(), "whoever", "forced", &[]).expect("any user");
    assert_eq!(c.query_one("select current_user"), "postgres");
    let Err(e) = RawConn::startup(weir.port(), "postgres", "free", &[]) else {
        panic!("auth_type any served a database without a forced user");
    };
    assert_eq!(
        (e.code.as_str(), e.message.as_str()),
        ("08P01", "bouncer config error"),
        "{e:?}"
    );
    assert!(
        weir.log().contains("auth_type=any requires forced user"),
        "{}",
        weir.log_tail()
    );
}
