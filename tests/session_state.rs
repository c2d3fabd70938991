//! Session state in transaction pooling mode: what a client sets (SET, set_config, SET
//! ROLE, RESET) follows it to whichever server it is lent and never reaches another
//! client; what cannot move (advisory locks, temporary tables, WITH HOLD cursors, LISTEN)
//! keeps the client on its server until released, shown in SHOW CLIENTS.

mod common;

use common::console::*;
use common::session::*;
use common::*;

fn settings(c: &mut RawConn) -> (String, String, String) {
    (
        c.query_one("show search_path"),
        c.query_one("select coalesce(current_setting('myapp.user_id', true), '')"),
        c.query_one("show statement_timeout"),
    )
}

/// Two clients share one server: each sees its own settings and never the other's,
/// whatever order they run in.
#[test]
fn two_clients_on_one_server_keep_their_own_settings() {
    let pg = PgServer::start();
    let weir = pooled(&pg, 1);
    let mut a = client(&weir);
    let mut b = client(&weir);
    a.simple_query("create schema if not exists s_a")
        .expect("schema");
    a.simple_query("SET search_path TO s_a, public")
        .expect("set");
    a.simple_query("select set_config('myapp.user_id', '42', false)")
        .expect("set_config");
    a.simple_query("set statement_timeout = '7s'").expect("set");
    let pid = a.query_one("select pg_backend_pid()");
    assert_eq!(b.query_one("select pg_backend_pid()"), pid, "one server");
    assert_eq!(
        settings(&mut b),
        (DEFAULT_PATH.into(), String::new(), "0".into())
    );
    assert_eq!(
        settings(&mut a),
        ("s_a, public".into(), "42".into(), "7s".into())
    );
    b.simple_query("set search_path = pg_catalog").expect("set");
    b.simple_query("set work_mem = '9MB'").expect("set");
    assert_eq!(a.query_one("show search_path"), "s_a, public");
    assert_eq!(a.query_one("show work_mem"), "4MB");
    assert_eq!(b.query_one("show search_path"), "pg_catalog");
    assert_eq!(b.query_one("show work_mem"), "9MB");
    // RESET takes one back to the default; the other client keeps its own.
    a.simple_query("RESET search_path").expect("reset");
    assert_eq!(a.query_one("show search_path"), DEFAULT_PATH);
    assert_eq!(b.query_one("show search_path"), "pg_catalog");
    assert_eq!(a.query_one("show statement_timeout"), "7s");
}

/// A client moved to another server finds its settings there.
#[test]
fn settings_follow_the_client_to_another_server() {
    let pg = PgServer::start();
    let weir = pooled(&pg, 2);
    let mut a = client(&weir);
    a.simple_query("SET search_path TO pg_catalog, public; SET myapp.user_id = 'u7'")
        .expect("set");
    let first = a.query_one("select pg_backend_pid()");
    // Two other clients hold both servers in open transactions; the one on A's server
    // keeps it, the other lets go: A's next query runs on the other server.
    let mut h1 = client(&weir);
    let mut h2 = client(&weir);
    h1.simple_query("begin").expect("begin");
    h2.simple_query("begin").expect("begin");
    let p1 = h1.query_one("select pg_backend_pid()");
    let p2 = h2.query_one("select pg_backend_pid()");
    assert_ne!(p1, p2);
    let (keep, other) = if p1 == first { (h1, h2) } else { (h2, h1) };
    let mut other = other;
    other.simple_query("commit").expect("commit");
    assert_ne!(a.query_one("select pg_backend_pid()"), first);
    assert_eq!(a.query_one("show search_path"), "pg_catalog, public");
    assert_eq!(a.query_one("select current_setting('myapp.user_id')"), "u7");
    // And the server it left is clean for the next client.
    drop(keep);
    let mut c = client(&weir);
    for _ in 0..4 {
        assert_eq!(c.query_one("show search_path"), DEFAULT_PATH);
    }
}

/// SET LOCAL and set_config(..., true) end with the transaction; a SET in a transaction
/// that rolls back or fails is undone, as on a direct connection.
#[test]
fn transaction_scoped_and_undone_settings_are_not_kept() {
    let pg = PgServer::start();
    let weir = pooled(&pg, 1);
    let mut a = client(&weir);
    let mut b = client(&weir);
    a.simple_query(
        "begin; set local work_mem = '11MB'; select set_config('myapp.user_id', 'x', true)",
    )
    .expect("local");
    assert_eq!(a.query_one("show work_mem"), "11MB");
    a.simple_query("commit").expect("commit");
    assert_eq!(a.query_one("show work_mem"), "4MB");
    a.simple_query("begin; set work_mem = '12MB'; rollback")
        .expect("rollback");
    assert_eq!(a.query_one("show work_mem"), "4MB");
    let e = a
        .simple_query("set work_mem = '13MB'; select 1/0")
        .expect_err("division by zero");
    assert_eq!(e.code, "22012");
    assert_eq!(a.query_one("show work_mem"), "4MB");
    a.simple_query("begin; set work_mem = '14MB'; commit")
        .expect("commit");
    assert_eq!(a.query_one("show work_mem"), "14MB");
    assert_eq!(b.query_one("show work_mem"), "4MB");
    // A savepoint rolled back undoes what came after it only.
    a.simple_query(
        "begin; set statement_timeout = '3s'; savepoint s; set work_mem = '15MB'; rollback to s; commit",
    )
    .expect("savepoint");
    assert_eq!(a.query_one("show work_mem"), "14MB");
    assert_eq!(a.query_one("show statement_timeout"), "3s");
    assert_eq!(b.query_one("show statement_timeout"), "0");
}

/// SET ROLE is a setting like the others: the next client on the server is not that
/// role.
#[test]
fn a_role_does_not_leak() {
    let pg = PgServer::start();
    pg.psql("create role reader nologin");
    let weir = pooled(&pg, 1);
    let mut a = client(&weir);
    let mut b = client(&weir);
    a.simple_query("set role reader").expect("set role");
    a.simple_query("set work_mem = '5MB'").expect("set");
    assert_eq!(a.query_one("select current_user"), "reader");
    assert_eq!(b.query_one("select current_user"), "postgres");
    assert_eq!(a.query_one("select current_user"), "reader");
    a.simple_query("reset role").expect("reset role");
    assert_eq!(a.query_one("select current_user"), "postgres");
    assert_eq!(a.query_one("show work_mem"), "5MB");
}

/// RESET ALL and DISCARD ALL act on the client's own session as on a direct connection:
/// its settings go, and its startup parameters (application_name) stay its own.
#[test]
fn reset_all_and_discard_all_act_on_the_clients_session() {
    let pg = PgServer::start();
    let weir = pooled(&pg, 1);
    let mut a = client(&weir);
    let mut b = named_client(&weir, "other");
    for reset in ["RESET ALL", "DISCARD ALL"] {
        a.simple_query("set search_path = pg_catalog; set application_name = 'changed'")
            .expect("set");
        assert_eq!(b.query_one("show application_name"), "other");
        a.simple_query(reset).expect(reset);
        assert_eq!(a.query_one("show search_path"), DEFAULT_PATH, "{reset}");
        assert_eq!(a.query_one("show application_name"), "app", "{reset}");
        assert_eq!(
            a.params.get("application_name").map(String::as_str),
            Some("app"),
            "{reset}: the client was told its own value back"
        );
        assert_eq!(b.query_one("show application_name"), "other");
    }
}

/// set_config with bind parameters through the extended protocol (as drivers send it).
#[tokio::test]
async fn set_config_with_parameters() {
    let pg = PgServer::start();
    let weir = pooled(&pg, 1);
    let a = connect(weir.port(), "postgres", "postgres")
        .await
        .expect("a");
    let b = connect(weir.port(), "postgres", "postgres")
        .await
        .expect("b");
    a.query("select set_config('myapp.tenant', $1, false)", &[&"t-1"])
        .await
        .expect("set_config");
    let show = "select coalesce(current_setting('myapp.tenant', true), '')";
    let va: String = a.query_one(show, &[]).await.expect("a").get(0);
    let vb: String = b.query_one(show, &[]).await.expect("b").get(0);
    assert_eq!((va.as_str(), vb.as_str()), ("t-1", ""));
    // The name as a parameter too.
    a.query(
        "select set_config($1, $2, false)",
        &[&"statement_timeout", &"8s"],
    )
    .await
    .expect("set_config");
    let va: String = a
        .query_one("show statement_timeout", &[])
        .await
        .expect("a")
        .get(0);
    let vb: String = b
        .query_one("show statement_timeout", &[])
        .await
        .expect("b")
        .get(0);
    assert_eq!((va.as_str(), vb.as_str()), ("8s", "0"));
    // A custom setting named by a parameter (pg_settings does not list those).
    a.query(
        "select set_config($1, $2, false)",
        &[&"myapp.role_id", &"r9"],
    )
    .await
    .expect("set_config");
    let show = "select coalesce(current_setting('myapp.role_id', true), '')";
    let va: String = a.query_one(show, &[]).await.expect("a").get(0);
    let vb: String = b.query_one(show, &[]).await.expect("b").get(0);
    let va2: String = a.query_one(show, &[]).await.expect("a").get(0);
    assert_eq!((va.as_str(), vb.as_str(), va2.as_str()), ("r9", "", "r9"));
    // A prepared SET run again later, in another transaction.
    let set = a
        .prepare("set search_path = pg_catalog")
        .await
        .expect("prepare");
    a.execute(&set, &[]).await.expect("set");
    let vb: String = b
        .query_one("show search_path", &[])
        .await
        .expect("b")
        .get(0);
    assert_eq!(vb, DEFAULT_PATH);
    a.batch_execute("reset search_path").await.expect("reset");
    a.execute(&set, &[]).await.expect("set again");
    let vb: String = b
        .query_one("show search_path", &[])
        .await
        .expect("b")
        .get(0);
    let va: String = a
        .query_one("show search_path", &[])
        .await
        .expect("a")
        .get(0);
    assert_eq!((va.as_str(), vb.as_str()), ("pg_catalog", DEFAULT_PATH));
}

/// What cannot move keeps the client on its server until it lets go, and SHOW CLIENTS
/// says why; other clients use the other server meanwhile.
#[test]
fn locks_temp_tables_and_hold_cursors_pin_the_client() {
    let pg = PgServer::start();
    let weir = pooled(&pg, 2);
    let mut a = named_client(&weir, "pinner");
    let mut b = client(&weir);
    assert_pinned(&weir, "pinner", "");

    a.simple_query("select pg_advisory_lock(7)").expect("lock");
    assert_pinned(&weir, "pinner", "advisory lock");
    let pid = a.query_one("select pg_backend_pid()");
    for _ in 0..3 {
        assert_ne!(b.query_one("select pg_backend_pid()"), pid);
        assert_eq!(a.query_one("select pg_backend_pid()"), pid);
    }
    a.simple_query("create temp table t (x int); insert into t values (1)")
        .expect("temp");
    assert_pinned(&weir, "pinner", "advisory lock,temporary table");
    a.simple_query("select pg_advisory_unlock(7)")
        .expect("unlock");
    assert_pinned(&weir, "pinner", "temporary table");
    assert_eq!(a.query_one("select count(*) from t"), "1");
    a.simple_query("drop table t").expect("drop");
    assert_pinned(&weir, "pinner", "");

    a.simple_query(
        "begin; declare c cursor with hold for select g from generate_series(1, 3) g; commit",
    )
    .expect("cursor");
    assert_pinned(&weir, "pinner", "WITH HOLD cursor");
    assert_eq!(a.query_one("fetch 1 from c"), "1");
    assert_eq!(a.query_one("fetch 1 from c"), "2");
    a.simple_query("close c").expect("close");
    assert_pinned(&weir, "pinner", "");
    assert!(weir
        .log()
        .contains("pinned to its server by: advisory lock"));
}

/// A pinned client that leaves gives its server back clean: its lock released, its
/// temporary table gone.
#[test]
fn a_pinned_client_leaves_nothing_behind() {
    let pg = PgServer::start();
    let weir = pooled(&pg, 1);
    let mut a = client(&weir);
    a.simple_query("select pg_advisory_lock(8); create temp table gone (x int)")
        .expect("pin");
    a.simple_query("set search_path = pg_catalog").expect("set");
    drop(a);
    let mut b = client(&weir);
    assert_eq!(b.query_one("select pg_try_advisory_lock(8)::text"), "true");
    assert_eq!(b.query_one("select pg_advisory_unlock(8)::text"), "true");
    assert_eq!(
        b.query_one("select count(*) from pg_class where relname = 'gone'"),
        "0"
    );
    assert_eq!(b.query_one("show search_path"), DEFAULT_PATH);
}

fn read_notification(c: &mut RawConn) -> String {
    c.set_read_timeout(std::time::Duration::from_secs(10));
    let m = c.read_message_or_panic("a notification");
    assert_eq!(
        m.tag,
        b'A',
        "expected a NotificationResponse, got {:?}",
        m.tag_char()
    );
    // pid, channel, payload
    let parts: Vec<String> = m.body[4..]
        .split(|&b| b == 0)
        .map(|p| String::from_utf8_lossy(p).into_owned())
        .collect();
    format!("{}:{}", parts[0], parts[1])
}

fn servers(weir: &Weir) -> usize {
    let mut con = admin(weir);
    ok(&mut con, "SHOW SERVERS").rows.len()
}

/// LISTEN in transaction mode: one server listens for every listener of the pool, and
/// each gets the notifications of its channels, idle or between messages of a
/// transaction; listeners keep no server of their own.
#[test]
fn listeners_share_one_listening_server() {
    let pg = PgServer::start();
    let weir = pooled(&pg, 3);
    let mut l1 = named_client(&weir, "l1");
    let mut l2 = named_client(&weir, "l2");
    let mut n = client(&weir);
    l1.simple_query("LISTEN jobs").expect("listen");
    l2.simple_query("listen jobs; LISTEN \"Other\"")
        .expect("listen");
    assert_pinned(&weir, "l1", "");
    n.simple_query("NOTIFY jobs, 'one'").expect("notify");
    assert_eq!(read_notification(&mut l1), "jobs:one");
    assert_eq!(read_notification(&mut l2), "jobs:one");
    n.simple_query("NOTIFY \"Other\", 'two'").expect("notify");
    assert_eq!(read_notification(&mut l2), "Other:two");
    // One server for n's queries and one listening: the listeners hold none.
    assert_eq!(servers(&weir), 2);
    // Delivered between the messages of a transaction too.
    l1.simple_query("begin").expect("begin");
    n.simple_query("NOTIFY jobs, 'three'").expect("notify");
    assert_eq!(read_notification(&mut l1), "jobs:three");
    assert_eq!(l1.query_one("select 1"), "1");
    l1.simple_query("commit").expect("commit");
    assert_eq!(read_notification(&mut l2), "jobs:three");
    // UNLISTEN: l1 no longer hears; l2 still does.
    l1.simple_query("UNLISTEN *").expect("unlisten");
    n.simple_query("NOTIFY jobs, 'four'").expect("notify");
    assert_eq!(read_notification(&mut l2), "jobs:four");
    l1.send(&common::proto::query("select 1"));
    assert!(
        l1.read_until_ready().iter().all(|m| m.tag != b'A'),
        "l1 was told after UNLISTEN *"
    );
    drop(l2);
    drop(l1);
    // Nobody listens: the listening server goes back to the pool.
    assert!(eventually(std::time::Duration::from_secs(5), || {
        let mut con = admin(&weir);
        let res = ok(&mut con, "SHOW SERVERS");
        res.rows
            .iter()
            .all(|r| r[res.col("state")].as_deref() == Some("idle"))
    }));
}

/// The extended-protocol LISTEN drivers such as psycopg send (unnamed Parse, Bind,
/// Describe, Execute, Sync) gets a server's replies, from the hub.
#[test]
fn extended_protocol_listen() {
    use common::proto::*;
    let pg = PgServer::start();
    let weir = pooled(&pg, 2);
    let mut l = client(&weir);
    let mut n = client(&weir);
    let batch = [
        parse("", "LISTEN ext"),
        bind("", "", &[]),
        describe(b'P', ""),
        execute("", 0),
        sync(),
    ]
    .concat();
    l.send(&batch);
    let tags: Vec<char> = l.read_until_ready().iter().map(|m| m.tag_char()).collect();
    assert_eq!(tags, vec!['1', '2', 'n', 'C', 'Z']);
    n.simple_query("NOTIFY ext, 'x'").expect("notify");
    assert_eq!(read_notification(&mut l), "ext:x");
}

/// LISTEN inside a transaction block runs on the client's server, which it then keeps.
#[test]
fn listen_in_a_transaction_pins() {
    let pg = PgServer::start();
    let weir = pooled(&pg, 2);
    let mut l = named_client(&weir, "listener");
    let mut n = client(&weir);
    l.simple_query("begin; LISTEN jobs; commit")
        .expect("listen");
    assert_pinned(&weir, "listener", "LISTEN");
    n.simple_query("NOTIFY jobs, 'one'").expect("notify");
    assert_eq!(read_notification(&mut l), "jobs:one");
    l.simple_query("UNLISTEN *").expect("unlisten");
    assert_pinned(&weir, "listener", "");
}
