//! The README's minimal configuration (examples/pgbouncer.ini and examples/userlist.txt)
//! works as it is written, but for where PostgreSQL listens, the port and the path to
//! the userlist: the substitutions a user makes.

mod common;

use common::weir::weir_command;
use common::*;
use std::process::Stdio;

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn readme_minimal_config_pools_for_a_real_client() {
    let pg = PgServer::start();
    pg.create_user("app", "change-me", "scram-sha-256");
    pg.exec("create database appdb owner app");
    let dir = tempfile::tempdir().unwrap();
    let root = env!("CARGO_MANIFEST_DIR");
    let ini = std::fs::read_to_string(format!("{root}/examples/pgbouncer.ini")).unwrap();
    let port = free_port();
    let userlist = dir.path().join("userlist.txt");
    std::fs::copy(format!("{root}/examples/userlist.txt"), &userlist).unwrap();
    let ini = ini
        .replace("port=5432", &format!("port={}", pg.port()))
        .replace("listen_port = 6432", &format!("listen_port = {port}"))
        .replace(
            "/etc/pgbouncer/userlist.txt",
            &userlist.display().to_string(),
        );
    // Keep the test's Unix socket out of /tmp, where other tests' would be.
    let ini = format!("{ini}unix_socket_dir = {}\n", dir.path().display());
    let config = dir.path().join("pgbouncer.ini");
    std::fs::write(&config, ini).unwrap();
    let mut child = weir_command()
        .arg(&config)
        .stdout(Stdio::null())
        .stderr(Stdio::null())
        .spawn()
        .unwrap();
    let mut cfg = pg_config(port, "appdb", "app");
    cfg.password("change-me");
    let ok = eventually_async(TIMEOUT, || async {
        match connect_with(&cfg).await {
            Ok(c) => {
                q1(&c, "select current_user || '@' || current_database()").await == "app@appdb"
            }
            Err(_) => false,
        }
    })
    .await;
    // psql, as the README tells a newcomer to use it: through the pool, and on the admin
    // console as the example's admin_users comment says.
    let psql = |db: &str, sql: &str| psql_at("127.0.0.1", port, db, "app", Some("change-me"), sql);
    let pooled = psql("appdb", "select current_user");
    let console = psql("pgbouncer", "SHOW POOLS");
    let _ = child.kill();
    let _ = child.wait();
    assert!(
        ok,
        "no client got through Weir with the README's configuration"
    );
    assert_eq!(pooled.as_deref(), Ok("app"), "psql through the pool");
    let console = console.expect("psql on the admin console as admin_users' app");
    assert!(
        console.lines().any(|l| l.starts_with("appdb|app|")),
        "SHOW POOLS lists appdb/app: {console}"
    );
}
