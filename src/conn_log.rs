//! Connection events logged in PgBouncer's wording and layout, so that what operators grep
//! and feed to log tools keeps working: each line starts with the connection's prefix,
//! `C-0x<id>: db/user@addr:port ` for clients and `S-0x<id>: ...` for servers. PgBouncer
//! prints a pointer there; Weir prints an id that stays the same for the connection's
//! life (a client's cancel pid, a server's number), padded to 12 hex digits.
//!
//! `log_connections`, `log_disconnections` and `log_pooler_errors` are read from flags
//! that `configure` sets whenever a configuration is installed, so the call sites need
//! no access to the configuration.

use std::fmt;
use std::future::Future;
use std::sync::atomic::{AtomicBool, Ordering};
use std::sync::Arc;

use crate::registry::clients::ClientInfo;
use crate::registry::now_micros;
use crate::registry::servers::ServerInfo;
use crate::stream::Endpoint;

/// The admin console's database, as PgBouncer names it in its prefix.
const CONSOLE_DB: &str = "pgbouncer";

static CONNECTIONS: AtomicBool = AtomicBool::new(true);
static DISCONNECTIONS: AtomicBool = AtomicBool::new(true);
static POOLER_ERRORS: AtomicBool = AtomicBool::new(true);

/// Takes the log_* settings of a configuration being installed.
pub fn configure(g: &weir_config::General) {
    CONNECTIONS.store(g.log_connections, Ordering::Relaxed);
    DISCONNECTIONS.store(g.log_disconnections, Ordering::Relaxed);
    POOLER_ERRORS.store(g.log_pooler_errors, Ordering::Relaxed);
}

struct Prefix<'a> {
    kind: char,
    id: u64,
    database: &'a str,
    user: &'a str,
    addr: &'a dyn fmt::Display,
}

impl Prefix<'_> {
    /// `C-0x<id>` or `S-0x<id>`: the JSON lines' `conn`.
    fn conn(&self) -> ConnId {
        ConnId(self.kind, self.id)
    }
}

struct ConnId(char, u64);

impl fmt::Display for ConnId {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        write!(f, "{}-0x{:012x}", self.0, self.1)
    }
}

impl fmt::Display for Prefix<'_> {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        write!(
            f,
            "{}: {}/{}@{}",
            self.conn(),
            self.database,
            self.user,
            self.addr
        )
    }
}

/// A line about a connection. In text its prefix leads the message, as PgBouncer writes
/// it; in JSON the prefix's parts are fields of their own (conn, db, user, addr), so that
/// a collector needs no pattern to take the prefix apart.
macro_rules! conn_line {
    ($level:ident, $who:expr, $($msg:tt)+) => {{
        let who: &Prefix<'_> = &$who;
        if crate::logging::json() {
            tracing::$level!(
                conn = %who.conn(),
                db = who.database,
                user = who.user,
                addr = %who.addr,
                $($msg)+
            )
        } else {
            tracing::$level!("{} {}", who, format_args!($($msg)+))
        }
    }};
}

fn client(c: &ClientInfo) -> Prefix<'_> {
    Prefix {
        kind: 'C',
        id: u64::from(c.key.pid),
        database: &c.database,
        user: &c.user,
        addr: &c.peer,
    }
}

fn server(s: &ServerInfo) -> Prefix<'_> {
    Prefix {
        kind: 'S',
        id: s.id,
        database: &s.pool_database,
        user: &s.user,
        addr: &s.addr,
    }
}

fn age_secs(connect_time: u64) -> u64 {
    now_micros().saturating_sub(connect_time) / 1_000_000
}

/// An admin console session: its id (SHOW CLIENTS id and cancel pid), user and peer.
fn console<'a>(id: u32, user: &'a str, peer: &'a Endpoint) -> Prefix<'a> {
    Prefix {
        kind: 'C',
        id: u64::from(id),
        database: CONSOLE_DB,
        user,
        addr: peer,
    }
}

/// A client that has logged in (PgBouncer logs it once authentication passed).
pub fn login_attempt(c: &std::sync::Arc<ClientInfo>) {
    if CONNECTIONS.load(Ordering::Relaxed) {
        let tls = crate::registry::client_tls::get(c);
        logged_in(client(c), if tls.is_empty() { "no" } else { &tls });
    }
}

pub fn console_login(id: u32, user: &str, peer: &Endpoint) {
    logged_in(console(id, user, peer), "no");
}

fn logged_in(who: Prefix<'_>, tls: &str) {
    if CONNECTIONS.load(Ordering::Relaxed) {
        conn_line!(
            info,
            who,
            "login attempt: db={} user={} tls={tls}",
            who.database,
            who.user
        );
    }
}

pub fn client_closing(c: &ClientInfo, reason: &str) {
    closing(client(c), c.connect_time, reason);
}

pub fn console_closing(id: u32, user: &str, peer: &Endpoint, connect_time: u64, reason: &str) {
    closing(console(id, user, peer), connect_time, reason);
}

fn closing(who: Prefix<'_>, connect_time: u64, reason: &str) {
    if DISCONNECTIONS.load(Ordering::Relaxed) {
        conn_line!(
            info,
            who,
            "closing because: {reason} (age={}s)",
            age_secs(connect_time)
        );
    }
}

/// A client in a pooled mode now holds something its server cannot hand on (an advisory
/// lock, a temporary table, ...): it keeps that server until it lets go. Logged once per
/// pinning, so that an operator can find what turns transaction pooling into sessions.
pub fn client_pinned(c: &ClientInfo, by: &str) {
    conn_line!(info, client(c), "pinned to its server by: {by}");
}

/// A client prepared a name it still had: PgBouncer's line, at its level.
pub fn statement_reused(c: &ClientInfo, name: &str) {
    conn_line!(
        error,
        client(c),
        "prepared statement '{name}' was already prepared"
    );
}

/// An error Weir itself sends to a client (not one relayed from PostgreSQL).
pub fn pooler_error(c: &ClientInfo, message: &str) {
    if POOLER_ERRORS.load(Ordering::Relaxed) {
        conn_line!(warn, client(c), "pooler error: {message}");
    }
}

/// A client refused before it was registered: it gets a number of its own for the two
/// lines PgBouncer writes for it, the error and the close.
pub fn refused(database: &str, user: &str, peer: &Endpoint, message: &str) {
    let who = Prefix {
        kind: 'C',
        id: u64::from(rand::random::<u32>() & 0x7fff_ffff),
        database,
        user,
        addr: peer,
    };
    if POOLER_ERRORS.load(Ordering::Relaxed) {
        conn_line!(warn, who, "pooler error: {message}");
    }
    closing(who, now_micros(), message);
}

/// A server connection just opened (its local end already recorded).
pub fn server_opened(s: &ServerInfo) {
    if CONNECTIONS.load(Ordering::Relaxed) {
        match s.local() {
            Some(local @ (Endpoint::V4(..) | Endpoint::V6(_))) => {
                conn_line!(info, server(s), "new connection to server (from {local})")
            }
            _ => conn_line!(info, server(s), "new connection to server"),
        }
    }
}

pub fn server_closing(s: &ServerInfo, reason: &str) {
    closing(server(s), s.connect_time, reason);
}

/// Why a server coming back from a client is closed instead of pooled.
pub fn checkin_reason(stale: bool, too_many: bool) -> &'static str {
    match (stale, too_many) {
        (true, _) => "database configuration changed",
        (_, true) => "too many servers in the pool",
        _ => "server lifetime over",
    }
}

tokio::task_local! {
    /// The client a pool checkout waits for, so that the pool can name it in the log
    /// without every checkout carrying it.
    static WAITING: Arc<ClientInfo>;
}

/// Runs a client's checkout with the client known to `reserve_taken`.
pub fn waiting<F: Future>(c: Arc<ClientInfo>, checkout: F) -> impl Future<Output = F::Output> {
    WAITING.scope(c, checkout)
}

/// A waiting client got a connection beyond pool_size (PgBouncer logs it as a warning, on
/// the client's prefix).
pub fn reserve_taken(database: &str, user: &str) {
    let named = WAITING.try_with(|c| {
        conn_line!(warn, client(c), "taking connection from reserve_pool");
    });
    if named.is_err() {
        if crate::logging::json() {
            tracing::warn!(db = database, user, "taking connection from reserve_pool");
        } else {
            tracing::warn!("{database}/{user} taking connection from reserve_pool");
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn prefix_like_pgbouncer() {
        let addr = Endpoint::tcp("127.0.0.1:5432".parse().unwrap());
        let p = Prefix {
            kind: 'C',
            id: 0xabc,
            database: "db",
            user: "u",
            addr: &addr,
        };
        assert_eq!(p.to_string(), "C-0x000000000abc: db/u@127.0.0.1:5432");
        let v6 = Endpoint::tcp("[::1]:6432".parse().unwrap());
        let p = Prefix { addr: &v6, ..p };
        assert_eq!(p.to_string(), "C-0x000000000abc: db/u@[::1]:6432");
    }
}
