//! Helpers of the session-state tests (tests/session_state*.rs): a transaction-mode Weir
//! with a small pool, named clients, and what SHOW CLIENTS says pins a client.

#![allow(dead_code)]

use std::time::Duration;

use super::console::ok;
use super::{eventually, PgServer, RawConn, Weir};

pub const DEFAULT_PATH: &str = "\"$user\", public";

/// Transaction mode with `size` servers, postgres allowed on the console.
pub fn pooled(pg: &PgServer, size: u32) -> Weir {
    Weir::for_pg(pg)
        .set("pool_mode", "transaction")
        .set("default_pool_size", size)
        .set("admin_users", "postgres")
        .start()
}

pub fn named_client(weir: &Weir, app: &str) -> RawConn {
    RawConn::startup(
        weir.port(),
        "postgres",
        "postgres",
        &[("application_name", app)],
    )
    .unwrap_or_else(|e| panic!("login failed: {e:?}"))
}

pub fn client(weir: &Weir) -> RawConn {
    named_client(weir, "app")
}

pub fn admin(weir: &Weir) -> RawConn {
    RawConn::startup(weir.port(), "postgres", "pgbouncer", &[])
        .unwrap_or_else(|e| panic!("console login failed: {e:?}"))
}

/// The `pinned` column of SHOW CLIENTS for the client named `app`.
pub fn pinned_of(weir: &Weir, app: &str) -> String {
    let mut con = admin(weir);
    ok(&mut con, "SHOW CLIENTS").get("application_name", app, "pinned")
}

/// The console shows a pin once Weir has read back what the transaction left, which is
/// a moment after the client has its reply.
pub fn assert_pinned(weir: &Weir, app: &str, want: &str) {
    let mut seen = String::new();
    let ok = eventually(Duration::from_secs(5), || {
        seen = pinned_of(weir, app);
        seen == want
    });
    assert!(ok, "{app} pinned by {seen:?}, expected {want:?}");
}
