use std::path::{Path, PathBuf};
use std::time::Duration;

use weir_config::{
    load, load_auth_file, load_auth_file_with_notices, AuthType, ConfigError, Database, General,
    LoadBalanceHosts, LogFormat, PoolMode, SigtermShutdown, SslMode,
};

/// A scratch directory holding config files.
struct Files {
    dir: tempfile::TempDir,
}

impl Files {
    fn new() -> Self {
        Files {
            dir: tempfile::tempdir().expect("temp dir"),
        }
    }

    fn write(&self, name: &str, text: &str) -> PathBuf {
        let path = self.dir.path().join(name);
        std::fs::write(&path, text).expect("write fixture");
        path
    }

    fn path(&self, name: &str) -> PathBuf {
        self.dir.path().join(name)
    }
}

fn load_text(text: &str) -> (Files, Result<weir_config::Config, ConfigError>) {
    let files = Files::new();
    let path = files.write("pgbouncer.ini", text);
    let result = load(&path);
    (files, result)
}

fn load_ok(text: &str) -> weir_config::Config {
    let (_files, result) = load_text(text);
    result.unwrap_or_else(|e| panic!("{e}"))
}

fn load_err(text: &str) -> ConfigError {
    let (files, result) = load_text(text);
    let err = result.expect_err("expected an error");
    assert_eq!(err.file, files.path("pgbouncer.ini"));
    err
}

#[test]
fn every_documented_option_is_accepted_and_typed() {
    let config =
        load(Path::new("tests/fixtures/all_options.ini")).unwrap_or_else(|e| panic!("{e}"));
    let g = &config.general;
    assert_eq!(g.admin_users, vec!["admin", "root"]);
    assert!(g.application_name_add_host);
    assert_eq!(g.auth_file, Some(PathBuf::from("userlist.txt")));
    assert_eq!(
        g.auth_ldap_options.as_deref(),
        Some("ldapurl=\"ldap://127.0.0.1:12345/dc=example,dc=net?uid?sub\"")
    );
    assert_eq!(g.auth_type, AuthType::ScramSha256);
    assert_eq!(g.cancel_wait_timeout, Duration::from_millis(2500));
    assert_eq!(g.client_tls_sslmode, SslMode::Require);
    assert_eq!(
        g.ignore_startup_parameters,
        vec!["extra_float_digits", "options"]
    );
    assert_eq!(g.job_name, "bouncer1");
    assert_eq!(g.listen_addr, vec!["127.0.0.1", "::1"]);
    assert_eq!(g.listen_port, 6543);
    assert!(!g.log_connections && !g.log_disconnections && !g.log_pooler_errors && !g.log_stats);
    assert_eq!(g.log_format, LogFormat::Json);
    assert_eq!(g.logfile, Some(PathBuf::from("/var/log/pgbouncer.log")));
    assert_eq!(g.max_client_conn, 1000);
    assert_eq!(g.max_packet_size, 1_048_576);
    assert_eq!(g.pool_mode, PoolMode::Transaction);
    assert_eq!(g.pipeline_depth, 3);
    assert_eq!(g.pipeline_slow_query, Duration::from_millis(20));
    assert_eq!(g.query_wait_timeout, Duration::from_millis(500));
    assert_eq!(g.server_check_query.as_deref(), Some("select 1"));
    assert_eq!(g.server_reset_query.as_deref(), Some("DEALLOCATE ALL"));
    assert_eq!(g.server_tls_sslmode, SslMode::VerifyFull);
    assert_eq!(g.shutdown_drain_timeout, Duration::from_secs(25));
    assert_eq!(g.shutdown_on_sigterm, SigtermShutdown::WaitForServers);
    assert_eq!(g.stats_users, vec!["stats", "monitor"]);
    assert!(g.syslog);
    assert_eq!(g.tcp_user_timeout, 5000);
    assert_eq!(
        g.track_extra_parameters,
        vec!["IntervalStyle", "search_path"]
    );
    assert_eq!(g.unix_socket_dir.as_deref(), Some("/var/run/postgresql"));
    assert_eq!(g.unix_socket_mode, 0o770);
    assert_eq!(g.user.as_deref(), Some("postgres"));
    assert_eq!(g.verbose, 2);

    // Every option differs from its default, so every option was really set.
    let text = std::fs::read_to_string("tests/fixtures/all_options.ini").expect("fixture");
    let set: Vec<&str> = text
        .lines()
        .filter(|l| l.contains(" = ") && !l.starts_with(';'))
        .filter_map(|l| l.split(' ').next())
        .filter(|name| General::OPTION_NAMES.contains(name))
        .collect();
    assert_eq!(
        set.len(),
        General::OPTION_NAMES.len(),
        "fixture covers every option"
    );
    for name in General::OPTION_NAMES {
        if *name == "tcp_defer_accept" && !cfg!(target_os = "linux") {
            continue;
        }
        assert!(
            !g.is_default(name),
            "{name} should differ from its default in the fixture"
        );
    }
}

#[test]
fn defaults_without_settings() {
    let config = load_ok("[pgbouncer]\n");
    assert_eq!(config.general, General::default());
    assert!(config.databases.is_empty());
    assert!(config.fallback_database.is_none());
    assert!(config.notices.is_empty());
}

#[test]
fn relative_and_nested_includes_keep_order() {
    let config = load(Path::new("tests/fixtures/main.ini")).unwrap_or_else(|e| panic!("{e}"));
    assert_eq!(config.general.listen_port, 7000);
    let names: Vec<&str> = config.databases.iter().map(|(n, _)| n.as_str()).collect();
    assert_eq!(names, vec!["first", "second", "third"]);
    assert_eq!(
        config.database("second").and_then(|d| d.dbname.as_deref()),
        Some("two")
    );
    assert_eq!(config.users["alice"].pool_mode, Some(PoolMode::Session));
}

#[test]
fn include_loop_is_an_error() {
    let files = Files::new();
    let a = files.path("a.ini");
    let b = files.path("b.ini");
    files.write("a.ini", &format!("[pgbouncer]\n%include {}\n", b.display()));
    files.write("b.ini", &format!("\n\n%include {}\n", a.display()));
    let err = load(&a).expect_err("loop");
    assert_eq!(err.file, b);
    assert_eq!(err.line, Some(3));
    assert!(err.message.contains("include loop"), "{err}");
}

#[test]
fn include_depth_is_limited_like_pgbouncer() {
    let files = Files::new();
    // main.ini plus 10 nested levels is fine; one more is too deep.
    let chain = |levels: usize| {
        for i in 0..levels {
            let next = files.path(&format!("f{}.ini", i + 1));
            files.write(
                &format!("f{i}.ini"),
                &format!("%include {}\n", next.display()),
            );
        }
        files.write(&format!("f{levels}.ini"), "[pgbouncer]\n");
        load(&files.path("f0.ini"))
    };
    assert!(chain(10).is_ok());
    let err = chain(11).expect_err("too deep");
    assert!(err.message.contains("too deep"), "{err}");
}

#[test]
fn missing_include_names_the_including_line() {
    let err = load_err("[pgbouncer]\n\n%include /nonexistent/weir/x.ini\n");
    assert_eq!(err.line, Some(3));
    assert!(err.message.contains("/nonexistent/weir/x.ini"), "{err}");
}

#[test]
fn errors_in_included_files_name_that_file() {
    let files = Files::new();
    let inc = files.write("inc.ini", "listen_port = 1\nmax_client_conn = abc\n");
    let main = files.write(
        "main.ini",
        &format!("[pgbouncer]\n%include {}\n", inc.display()),
    );
    let err = load(&main).expect_err("bad value");
    assert_eq!(err.file, inc);
    assert_eq!(err.line, Some(2));
    assert_eq!(err.option.as_deref(), Some("max_client_conn"));
    assert_eq!(
        err.to_string(),
        format!(
            "{}:2: max_client_conn: invalid integer value \"abc\"",
            inc.display()
        )
    );
}

#[test]
fn bad_values_are_located() {
    let cases = [
        ("[pgbouncer]\nmax_client_conn = abc\n", 2, "max_client_conn"),
        ("[pgbouncer]\n\npool_mode = sometimes\n", 3, "pool_mode"),
        (
            "[pgbouncer]\nlog_connections = perhaps\n",
            2,
            "log_connections",
        ),
        (
            "[pgbouncer]\nserver_lifetime = forever\n",
            2,
            "server_lifetime",
        ),
        ("[pgbouncer]\nserver_lifetime = -5\n", 2, "server_lifetime"),
        ("[pgbouncer]\nlisten_port = 70000\n", 2, "listen_port"),
        ("[pgbouncer]\nauth_type = password\n", 2, "auth_type"),
        ("[pgbouncer]\nlog_format = yaml\n", 2, "log_format"),
        (
            "[pgbouncer]\nmax_client_conn = 100 ; comment\n",
            2,
            "max_client_conn",
        ),
        (
            "[pgbouncer]\n[databases]\nfoo = host=x pool_size=big\n",
            3,
            "foo",
        ),
        (
            "[pgbouncer]\n[databases]\nfoo = host=x nosuch=1\n",
            3,
            "foo",
        ),
        (
            "[pgbouncer]\n[databases]\nfoo = host='unterminated\n",
            3,
            "foo",
        ),
        ("[pgbouncer]\n[users]\nbob = pool_mode=x\n", 3, "bob"),
        ("[pgbouncer]\n[users]\nbob = color=blue\n", 3, "bob"),
        ("[pgbouncer]\n[peers]\n0 = host=x\n", 3, "0"),
        ("[pgbouncer]\n[peers]\n1 = port=1\n", 3, "1"),
    ];
    for (text, line, option) in cases {
        let err = load_err(text);
        assert_eq!(err.line, Some(line), "{text}: {err}");
        assert_eq!(err.option.as_deref(), Some(option), "{text}: {err}");
    }
}

#[test]
fn unknown_option_is_an_error() {
    let err = load_err("[pgbouncer]\nlisten_port = 1\nno_such_thing = 1\n");
    assert_eq!(err.line, Some(3));
    assert_eq!(err.option.as_deref(), Some("no_such_thing"));
    assert_eq!(err.message, "unknown option");
}

#[test]
fn structural_errors() {
    let err = load_err("[pgbouncer]\n[pgbouncr]\n");
    assert_eq!(err.line, Some(2));
    assert!(err.message.contains("invalid section"), "{err}");

    let err = load_err("listen_port = 1\n[pgbouncer]\n");
    assert_eq!(err.line, Some(1));
    assert!(err.message.contains("without section"), "{err}");

    let err = load_err("[databases]\nfoo = host=x\n");
    assert_eq!(err.line, None);
    assert!(err.message.contains("[pgbouncer]"), "{err}");

    let err = load_err("[pgbouncer]\nthis is not ini\n");
    assert_eq!(err.line, Some(2));
    assert!(err.message.contains("syntax error"), "{err}");

    let err = load_err("[pgbouncer]\n[databases]\npgbouncer = host=x\n");
    assert!(err.message.contains("reserved"), "{err}");

    let err = load(Path::new("/nonexistent/weir/pgbouncer.ini")).expect_err("missing");
    assert_eq!(err.line, None);
}

#[test]
fn keys_are_case_insensitive_and_aliases_work() {
    let config = load_ok("[pgbouncer]\nListen_Port = 7001\nservice_name = svc\n");
    assert_eq!(config.general.listen_port, 7001);
    assert_eq!(config.general.job_name, "svc");
}

#[test]
fn connection_string_quoting() {
    let config = load_ok(
        "[pgbouncer]\n[databases]\n\
         q = host=localhost password='it''s a secret' connect_query='SELECT ''x'', 1' dbname='my db'\n\
         'spaced name' = host=h\n\
         \"quoted\"\"name\" = host=h\n",
    );
    let q = config.database("q").expect("q");
    assert_eq!(q.password.as_deref(), Some("it's a secret"));
    assert_eq!(q.connect_query.as_deref(), Some("SELECT 'x', 1"));
    assert_eq!(q.dbname.as_deref(), Some("my db"));
    assert!(config.database("spaced name").is_some());
    assert!(config.database("quoted\"name").is_some());
}

#[test]
fn fallback_database_and_exact_lookup() {
    let config = load_ok(
        "[pgbouncer]\n[databases]\nfoodb =\nbardb = host=localhost dbname=bazdb load_balance_hosts=disable\n* = host=fallback port=6000\n",
    );
    assert_eq!(config.databases.len(), 2);
    assert_eq!(config.database("foodb"), Some(&Database::default()));
    assert_eq!(
        config.database("bardb").and_then(|d| d.load_balance_hosts),
        Some(LoadBalanceHosts::Disable)
    );
    assert!(config.database("*").is_none());
    assert!(config.database("FOODB").is_none());
    assert!(config.database("other").is_none());
    let fallback = config.fallback_database.expect("fallback");
    assert_eq!(fallback.host, vec!["fallback"]);
    assert_eq!(fallback.port, vec![6000]);
}

#[test]
fn repeated_database_keeps_position_and_last_definition() {
    let config = load_ok("[pgbouncer]\n[databases]\na = dbname=one\nb =\na = dbname=two\n");
    let names: Vec<&str> = config.databases.iter().map(|(n, _)| n.as_str()).collect();
    assert_eq!(names, vec!["a", "b"]);
    assert_eq!(
        config.database("a").and_then(|d| d.dbname.as_deref()),
        Some("two")
    );
}

#[test]
fn peers_are_parsed() {
    let config = load_ok(
        "[pgbouncer]\npeer_id = 1\n[peers]\n1 = host=/tmp/pgbouncer1\n2 = host=/tmp/pgbouncer2 port=5555 pool_size=3\n",
    );
    assert_eq!(config.peers.len(), 2);
    assert_eq!(config.peers[1].0, 2);
    assert_eq!(config.peers[1].1.host, "/tmp/pgbouncer2");
    assert_eq!(config.peers[1].1.port, 5555);
    assert_eq!(config.peers[1].1.pool_size, Some(3));
    assert_eq!(config.peers[0].1.port, 6432);
}

#[test]
fn notices_for_unimplemented_settings() {
    let config = load_ok(
        "[pgbouncer]\n\
         listen_port = 7000\n\
         max_prepared_statements = 30\n\
         min_pool_size = 0\n\
         server_tls_sslmode = require\n\
         client_tls_sslmode = disable\n\
         track_extra_parameters = IntervalStyle\n\
         track_extra_parameters = search_path\n\
         [databases]\n\
         a = host=x application_name=app pool_size=5\n\
         b = host=y min_pool_size=2 query_wait_timeout=3 target_session_attrs=read-write\n\
         [users]\n\
         u = pool_mode=session query_wait_timeout=5\n\
         [peers]\n\
         1 = host=p\n",
    );
    let file = "pgbouncer.ini";
    let short: Vec<String> = config
        .notices
        .iter()
        .map(|n| {
            n.rsplit_once(file)
                .map_or(n.clone(), |(_, rest)| rest.to_owned())
        })
        .collect();
    assert_eq!(
        short,
        vec![
            ":8: option track_extra_parameters is not implemented yet and is ignored",
            ":10: [databases] parameter application_name is not implemented yet and is ignored",
        ]
    );
}

#[test]
fn every_tls_mode_is_implemented() {
    for mode in [
        "disable",
        "allow",
        "prefer",
        "require",
        "verify-ca",
        "verify-full",
    ] {
        let config = load_ok(&format!("[pgbouncer]\nserver_tls_sslmode = {mode}\n"));
        assert!(config.notices.is_empty(), "{mode}: {:?}", config.notices);
    }
    // TLS towards clients is there: every mode is acted on.
    let config = load_ok("[pgbouncer]\nclient_tls_sslmode = prefer\n");
    assert!(config.notices.is_empty(), "{:?}", config.notices);
}

#[test]
fn second_pgbouncer_section_resets_like_pgbouncer() {
    let config = load_ok(
        "[pgbouncer]\nlisten_port = 7000\nauth_file = users.txt\n[databases]\n[pgbouncer]\nmax_client_conn = 5\n",
    );
    assert_eq!(config.general.listen_port, 6432, "reset to default");
    assert_eq!(config.general.max_client_conn, 5);
    assert_eq!(
        config.general.auth_file,
        Some(PathBuf::from("users.txt")),
        "NULL-default options survive"
    );
    assert_eq!(config.notices.len(), 1);
    assert!(
        config.notices[0].contains("appears again"),
        "{:?}",
        config.notices
    );
}

#[test]
fn auth_file_fixture() {
    let users =
        load_auth_file(Path::new("tests/fixtures/userlist.txt")).unwrap_or_else(|e| panic!("{e}"));
    assert_eq!(users.len(), 4);
    assert_eq!(users["admin"], "1234");
    assert_eq!(users["md5user"], "md545f2603610af569b6155c45067268c6b");
    assert_eq!(
        users["scramuser"],
        "SCRAM-SHA-256$4096:dGVzdHNhbHQ=$TVlT3RvcmVkS2V5:U2VydmVyS2V5"
    );
    assert_eq!(users["quo\"ted"], "pass\"word");

    let files = Files::new();
    let path = files.write("userlist.txt", "\"a\" \"1\"\nbroken\n\"b\" \"2\"\n");
    let loaded = load_auth_file_with_notices(&path).unwrap_or_else(|e| panic!("{e}"));
    assert_eq!(loaded.users.len(), 2);
    assert_eq!(loaded.notices.len(), 1);
    assert!(
        loaded.notices[0].contains("userlist.txt:2:"),
        "{:?}",
        loaded.notices
    );
}

/// Each entry used to be looked up by a scan of the ones before it: 40,000 took 5 s
/// (release, 14 s debug; found driving the config_ini fuzz entry point with large
/// inputs). The bound only catches a quadratic again.
#[test]
fn many_databases_load_in_linear_time() {
    let mut text = String::from("[pgbouncer]\n[databases]\n");
    for i in 0..40_000 {
        text.push_str(&format!("db{i} = host=h{i} dbname=x\n"));
    }
    text.push_str("db7 = host=again\n");
    let start = std::time::Instant::now();
    let config = weir_config::load_str(&text, std::path::Path::new("many.ini")).unwrap();
    let took = start.elapsed();
    assert!(took < std::time::Duration::from_secs(10), "{took:?}");
    assert_eq!(config.databases.len(), 40_000);
    // A name given twice keeps its first position and its last definition.
    assert_eq!(config.databases[7].0, "db7");
    assert_eq!(config.databases[7].1.host, vec!["again".to_string()]);
}

#[test]
fn load_str_refuses_include() {
    let err = weir_config::load_str(
        "%include /etc/passwd\n[pgbouncer]\n",
        std::path::Path::new("x.ini"),
    )
    .unwrap_err();
    assert!(
        err.to_string().contains("%include is not followed here"),
        "{err}"
    );
}
