//! Databases with a forced `user=`: one pool per entry, keyed by and sized for the forced
//! user (the logging-in user's `[users]` settings do not apply), and min_pool_size kept
//! for it from the start, as PgBouncer does.

mod common;

use common::console::*;
use common::*;
use std::sync::mpsc;
use std::thread;

fn admin(weir: &Weir) -> RawConn {
    RawConn::startup(weir.port(), "postgres", "pgbouncer", &[])
        .unwrap_or_else(|e| panic!("console login failed: {e:?}"))
}

/// Five clients of a user with `pool_size=1` hold a transaction open each through a
/// forced-user database with `pool_size=2`: the database's size applies, so two servers
/// serve them (the user's size would allow one), all in one pool keyed by the forced user.
#[test]
fn forced_user_pool_is_sized_for_the_database_entry() {
    let pg = PgServer::start();
    pg.create_user("srv", "srvpw", "md5");
    let weir = Weir::builder()
        .database("fdb", &format!("{} user=srv pool_size=2", pg.connstr()))
        .set("pool_mode", "transaction")
        .set("admin_users", "postgres")
        .user_setting("app", "pool_size=1 reserve_pool_size=0")
        .start();
    let (release_tx, release_rx) = mpsc::channel::<()>();
    let release_rx = std::sync::Arc::new(std::sync::Mutex::new(release_rx));
    let (done_tx, done_rx) = mpsc::channel();
    let clients: Vec<_> = (0..5)
        .map(|_| {
            let port = weir.port();
            let release = release_rx.clone();
            let done = done_tx.clone();
            thread::spawn(move || {
                let mut c = RawConn::startup(port, "app", "fdb", &[]).expect("login");
                c.simple_query("begin").expect("begin");
                assert_eq!(c.query_one("select current_user"), "srv");
                // Hold the transaction (and so the server) until told to finish.
                let _ = release.lock().unwrap().recv();
                c.simple_query("commit").expect("commit");
                done.send(()).unwrap();
            })
        })
        .collect();
    assert!(
        eventually(TIMEOUT, || pg.count_backends("srv") == 2),
        "the forced-user database did not open pool_size=2 servers: {} open",
        pg.count_backends("srv")
    );
    let mut a = admin(&weir);
    let pools = ok(&mut a, "show pools");
    let ours = pools.find("database", "fdb");
    assert_eq!(ours.len(), 1, "one pool for the entry: {pools:#?}");
    assert_eq!(pools.get("database", "fdb", "user"), "srv");
    assert_eq!(pools.num("database", "fdb", "sv_active"), 2);
    // A second user through the same entry shares that pool.
    let mut other = RawConn::startup(weir.port(), "postgres", "fdb", &[]).expect("login");
    for _ in 0..5 {
        release_tx.send(()).unwrap();
    }
    for _ in 0..5 {
        done_rx.recv_timeout(TIMEOUT).expect("a client finished");
    }
    for t in clients {
        t.join().unwrap();
    }
    assert_eq!(other.query_one("select current_user"), "srv");
    let pools = ok(&mut a, "show pools");
    assert_eq!(pools.find("database", "fdb").len(), 1, "{pools:#?}");
    assert!(pg.count_backends("srv") <= 2);
}

/// min_pool_size of a forced-user database is opened at start, before any client.
#[test]
fn forced_user_min_pool_size_is_filled_without_clients() {
    let pg = PgServer::start();
    pg.create_user("srv", "srvpw", "md5");
    let _weir = Weir::builder()
        .database("fdb", &format!("{} user=srv min_pool_size=3", pg.connstr()))
        .start();
    assert!(
        eventually(TIMEOUT, || pg.count_backends("srv") == 3),
        "min_pool_size=3 not filled before any client: {} open",
        pg.count_backends("srv")
    );
}

/// A forced-user database added by a reload gets its min_pool_size too.
#[test]
fn forced_user_min_pool_size_is_filled_for_a_database_added_by_reload() {
    let pg = PgServer::start();
    pg.create_user("srv", "srvpw", "md5");
    let mut weir = Weir::for_pg(&pg).start();
    assert_eq!(pg.count_backends("srv"), 0);
    let builder = weir
        .builder_used()
        .clone()
        .database("fdb", &format!("{} user=srv min_pool_size=3", pg.connstr()));
    weir.reload_with(builder);
    assert!(
        eventually(TIMEOUT, || pg.count_backends("srv") == 3),
        "min_pool_size=3 not filled after RELOAD: {} open",
        pg.count_backends("srv")
    );
}

/// max_db_connections and max_user_connections cap what min_pool_size opens, as
/// PgBouncer's launch_new_connection does.
#[test]
fn forced_user_min_pool_size_is_capped_by_connection_limits() {
    let pg = PgServer::start();
    pg.create_user("srv", "srvpw", "md5");
    pg.create_user("srv2", "srvpw", "md5");
    let weir = Weir::builder()
        .database(
            "bydb",
            &format!(
                "{} user=srv min_pool_size=3 max_db_connections=2",
                pg.connstr()
            ),
        )
        .database(
            "byuser",
            &format!("{} user=srv2 min_pool_size=3", pg.connstr()),
        )
        .user_setting("srv2", "max_user_connections=1")
        .start();
    assert!(
        eventually(TIMEOUT, || pg.count_backends("srv") == 2
            && pg.count_backends("srv2") == 1),
        "min_pool_size not filled up to the limits: srv {}, srv2 {}",
        pg.count_backends("srv"),
        pg.count_backends("srv2")
    );
    // Several janitor rounds later, still within the limits.
    std::thread::sleep(std::time::Duration::from_secs(3));
    assert_eq!(pg.count_backends("srv"), 2);
    assert_eq!(pg.count_backends("srv2"), 1);
    // And the pools serve.
    let mut c = RawConn::startup(weir.port(), "app", "bydb", &[]).expect("login");
    assert_eq!(c.query_one("select current_user"), "srv");
    let mut c = RawConn::startup(weir.port(), "app", "byuser", &[]).expect("login");
    assert_eq!(c.query_one("select current_user"), "srv2");
}

/// A forced-user database removed by a reload stops being kept at min_pool_size: its idle
/// servers close at server_idle_timeout.
#[test]
fn forced_user_database_removed_by_reload_lets_its_servers_go() {
    let pg = PgServer::start();
    pg.create_user("srv", "srvpw", "md5");
    let mut weir = Weir::for_pg(&pg)
        .database("fdb", &format!("{} user=srv min_pool_size=2", pg.connstr()))
        .set("server_idle_timeout", 1)
        .start();
    assert!(
        eventually(TIMEOUT, || pg.count_backends("srv") == 2),
        "min_pool_size=2 not filled: {} open",
        pg.count_backends("srv")
    );
    weir.reload_with(Weir::for_pg(&pg).set("server_idle_timeout", 1));
    assert!(
        eventually(TIMEOUT, || pg.count_backends("srv") == 0),
        "servers of the removed database still open: {}",
        pg.count_backends("srv")
    );
}
