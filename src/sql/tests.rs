use super::*;

fn set(name: &str, value: &str, local: bool) -> Stmt {
    Stmt::Set {
        name: name.into(),
        value: value.into(),
        local,
    }
}

#[test]
fn ordinary_queries_skip_the_lexer() {
    assert!(classify("select * from users where id = 1").is_empty());
    // "set" inside a name passes the cheap check but is no statement.
    assert!(classify("select offset_x from dataset").is_empty());
}

#[test]
fn set_forms() {
    assert_eq!(
        classify("SET search_path TO a, \"B\""),
        vec![set("search_path", "a, \"B\"", false)]
    );
    assert_eq!(
        classify("set session work_mem = '64MB'"),
        vec![set("work_mem", "'64MB'", false)]
    );
    assert_eq!(
        classify("SET LOCAL statement_timeout = 5"),
        vec![set("statement_timeout", "5", true)]
    );
    assert_eq!(
        classify("set time zone 'UTC'"),
        vec![set("timezone", "'UTC'", false)]
    );
    assert_eq!(
        classify("set myapp.user_id = 42"),
        vec![set("myapp.user_id", "42", false)]
    );
    assert_eq!(
        classify("set work_mem to default"),
        vec![Stmt::Reset {
            name: "work_mem".into()
        }]
    );
    assert!(classify("SET TRANSACTION ISOLATION LEVEL SERIALIZABLE").is_empty());
    assert!(classify("set session authorization bob").is_empty());
    assert!(classify("set role bob").is_empty());
}

#[test]
fn reset_discard() {
    assert_eq!(
        classify("RESET work_mem"),
        vec![Stmt::Reset {
            name: "work_mem".into()
        }]
    );
    assert_eq!(
        classify("reset time zone"),
        vec![Stmt::Reset {
            name: "timezone".into()
        }]
    );
    assert_eq!(classify("RESET ALL"), vec![Stmt::ResetAll]);
    assert_eq!(classify("DISCARD ALL"), vec![Stmt::DiscardAll]);
    assert!(classify("discard plans").is_empty());
}

#[test]
fn comments_literals_and_several_statements() {
    let q = "/* set x = 1 /* nested */ still comment */ select 'set y = 2'; -- set z = 3\n set a = 1; select $$; set b = 2$$; SET c=E'it\\'s'";
    assert_eq!(
        classify(q),
        vec![set("a", "1", false), set("c", "E'it\\'s'", false)]
    );
    assert!(classify("select \"set x = 1\"").is_empty());
    assert!(classify("select $tag$ ; set x = 1 $tag$").is_empty());
}

#[test]
fn set_config_literals_and_params() {
    assert_eq!(
        classify("select set_config('search_path', 'a,b', false)"),
        vec![Stmt::SetConfig {
            name: Arg::Lit("search_path".into()),
            value: Arg::Lit("a,b".into()),
            local: Arg::Lit("false".into())
        }]
    );
    assert_eq!(
        classify("SELECT set_config($1, $2, false)"),
        vec![Stmt::SetConfig {
            name: Arg::Param(1),
            value: Arg::Param(2),
            local: Arg::Lit("false".into())
        }]
    );
    // Not literal: left to the server, not tracked.
    assert!(classify("select set_config(n, v, false) from t").is_empty());
}

#[test]
fn listen_only_queries() {
    assert_eq!(
        listen_only("LISTEN a; listen \"B\";"),
        Some(vec![(true, Some("a".into())), (true, Some("B".into()))])
    );
    assert_eq!(listen_only("unlisten *"), Some(vec![(false, None)]));
    assert_eq!(listen_only("listen a; select 1"), None);
    assert_eq!(listen_only(";"), None);
    assert_eq!(
        unlistens("select pg_advisory_unlock_all(); UNLISTEN *; RESET ALL; unlisten x"),
        vec![None, Some("x".into())]
    );
    assert_eq!(unlistens("discard all"), vec![None]);
}

#[test]
fn listen_and_pins() {
    assert_eq!(
        classify("LISTEN jobs"),
        vec![Stmt::Listen {
            channel: "jobs".into()
        }]
    );
    assert_eq!(
        classify("unlisten *"),
        vec![Stmt::Unlisten { channel: None }]
    );
    assert_eq!(
        classify("select pg_advisory_lock(1)"),
        vec![Stmt::Pin(Pin::AdvisoryLock)]
    );
    assert!(classify("select pg_advisory_xact_lock(1)").is_empty());
    assert_eq!(
        classify("CREATE TEMP TABLE t (a int)"),
        vec![Stmt::Pin(Pin::TempTable)]
    );
    assert_eq!(
        classify("create local temporary table t (a int)"),
        vec![Stmt::Pin(Pin::TempTable)]
    );
    assert!(classify("create table temp_x (a int)").is_empty());
    assert_eq!(
        classify("DECLARE c CURSOR WITH HOLD FOR select 1"),
        vec![Stmt::Pin(Pin::HoldCursor)]
    );
    assert!(classify("declare c cursor without hold for select 1").is_empty());
}

#[test]
fn opens_block_reads_the_first_word_only() {
    for yes in [
        "BEGIN",
        "begin;",
        "  \n begin isolation level serializable\0",
        "START TRANSACTION READ ONLY",
        "-- a comment\r\nBEGIN",
        "/* a /* nested */ comment */begin; insert into t values (1); commit",
    ] {
        assert!(opens_block(yes.as_bytes()), "{yes:?}");
    }
    for no in [
        "",
        "COMMIT",
        "end",
        "rollback; begin",
        "beginning",
        "\"begin\"",
        "select 1; begin",
        "/* never closed begin",
        "-- begin",
        "(begin)",
        "abort",
        "prepare transaction 'x'",
    ] {
        assert!(!opens_block(no.as_bytes()), "{no:?}");
    }
}
