//! Helpers of the several-hosts tests (tests/hosts.rs, tests/host_health.rs): a primary
//! with its streaming replica, database entries over several ports, SHOW HOSTS rows.

#![allow(dead_code)]

use super::console::{ok, Res};
use super::{PgServer, RawConn, Weir, WeirBuilder};

/// A primary and its streaming replica.
pub fn pair() -> (PgServer, PgServer) {
    let primary = PgServer::start();
    let replica = PgServer::replica_of(&primary);
    assert!(replica.in_recovery() && !primary.in_recovery());
    (primary, replica)
}

/// A `[databases]` entry over `ports` on 127.0.0.1, with extra parameters.
pub fn entry(ports: &[u16], extra: &str) -> String {
    let hosts = vec!["127.0.0.1"; ports.len()].join(",");
    let ports: Vec<String> = ports.iter().map(u16::to_string).collect();
    format!(
        "host={hosts} port={} dbname=postgres {extra}",
        ports.join(",")
    )
}

pub fn client(weir: &Weir, db: &str) -> RawConn {
    RawConn::startup(weir.port(), "postgres", db, &[])
        .unwrap_or_else(|e| panic!("login to {db} failed: {e:?}\n{}", weir.log_tail()))
}

pub fn show_hosts(weir: &Weir) -> Res {
    let mut admin = RawConn::startup(weir.port(), "postgres", "pgbouncer", &[])
        .unwrap_or_else(|e| panic!("console login failed: {e:?}"));
    ok(&mut admin, "SHOW HOSTS")
}

/// Column `name` of the SHOW HOSTS row for (database, port).
pub fn host_col(res: &Res, db: &str, port: u16, name: &str) -> Option<String> {
    let (d, p, c) = (res.col("database"), res.col("port"), res.col(name));
    let rows: Vec<_> = res
        .rows
        .iter()
        .filter(|r| r[d].as_deref() == Some(db) && r[p].as_deref() == Some(&port.to_string()))
        .collect();
    assert_eq!(rows.len(), 1, "one row for {db} port {port}: {res:#?}");
    rows[0][c].clone()
}

/// Weir in transaction mode with fast host checks (every 200 ms, down after 2 failures)
/// and quick server connects, as the several-hosts tests want it.
pub fn fast_checks() -> WeirBuilder {
    Weir::builder()
        .set("pool_mode", "transaction")
        .set("admin_users", "postgres")
        .set("server_connect_timeout", 2)
        .set("server_login_retry", 0)
        .set("host_check_interval", "0.2")
        .set("host_check_timeout", 1)
        .set("host_failure_threshold", 2)
}
