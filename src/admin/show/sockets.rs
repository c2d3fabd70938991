//! SHOW CLIENTS, SERVERS, SOCKETS and ACTIVE_SOCKETS: one row per connection, all with
//! the same columns, so that they share the row builders and the orders here.

use std::collections::HashMap;
use std::sync::Arc;

use super::super::rowset::{int, text, RowSet, Value, NULL};
use super::super::{control, sessions};
use super::{format_time, server_addr, sorted_pools, ADMIN_DB};
use crate::app::App;
use crate::pool::Pool;
use crate::registry::clients::{ClientInfo, ClientState, CLIENTS};
use crate::registry::now_micros;
use crate::registry::servers::{ServerInfo, ServerState, SERVERS};
use crate::stream::Endpoint;

/// "host:port" / "[v6]:port" / "unix" into PgBouncer's addr and port columns.
fn split_addr(end: &Endpoint, unix_port: u16) -> (Value, Value) {
    match (end, end.addr()) {
        (_, Some(a)) => (text(a.ip().to_string()), int(a.port())),
        (Endpoint::Unix, None) => (text("unix"), int(unix_port)),
        _ => (text("?"), NULL),
    }
}

fn ptr<T>(a: &Arc<T>) -> String {
    format!("{:p}", Arc::as_ptr(a))
}

/// Which pool each registered server belongs to, by matching targets.
fn server_pools(pools: &[Arc<Pool>]) -> HashMap<u64, Arc<Pool>> {
    let mut out = HashMap::new();
    for s in SERVERS.snapshot() {
        if let Some(p) = pools.iter().find(|p| {
            let t = &p.settings().target;
            t.hosts.hosts.iter().any(|h| h.addr == s.addr)
                && t.user == s.user
                && t.database == s.database
        }) {
            out.insert(s.id, p.clone());
        }
    }
    out
}

const SOCKET_COLS: [&str; 22] = [
    "type",
    "user",
    "database",
    "replication",
    "state",
    "addr",
    "port",
    "local_addr",
    "local_port",
    "connect_time",
    "request_time",
    "wait",
    "wait_us",
    "close_needed",
    "ptr",
    "link",
    "remote_pid",
    "tls",
    "application_name",
    "prepared_statements",
    "id",
    // Weir's own, last so that PgBouncer's columns keep their places: what keeps a client
    // on its server in a pooled mode (and a server on its client).
    "pinned",
];
const SOCKET_TYPES: &str = "ssssssisiTTiiississiis";
const DEBUG_COLS: [&str; 7] = [
    "recv_pos",
    "pkt_pos",
    "pkt_remain",
    "send_pos",
    "send_remain",
    "pkt_avail",
    "send_avail",
];

fn socket_rowset(debug: bool) -> RowSet {
    if debug {
        let mut names = SOCKET_COLS.to_vec();
        names.extend(DEBUG_COLS);
        RowSet::new(&format!("{SOCKET_TYPES}iiiiiii"), &names)
    } else {
        RowSet::new(SOCKET_TYPES, &SOCKET_COLS)
    }
}

struct Ctx {
    now: u64,
    listen_port: u16,
    pools: Vec<Arc<Pool>>,
    by_server: HashMap<u64, Arc<Pool>>,
    servers: HashMap<u64, Arc<ServerInfo>>,
    clients: HashMap<u32, Arc<ClientInfo>>,
}

impl Ctx {
    fn new(app: &App) -> Ctx {
        let pools = sorted_pools(app);
        let by_server = server_pools(&pools);
        Ctx {
            now: now_micros(),
            listen_port: app.snapshot.load().config.general.listen_port,
            pools,
            by_server,
            servers: SERVERS.snapshot().into_iter().map(|s| (s.id, s)).collect(),
            clients: CLIENTS
                .snapshot()
                .into_iter()
                .map(|c| (c.key.pid, c))
                .collect(),
        }
    }
}

fn client_state(c: &ClientInfo) -> &'static str {
    match c.state() {
        ClientState::Active => "active",
        ClientState::Waiting => "waiting",
        ClientState::Idle => "idle",
    }
}

fn client_row(ctx: &Ctx, c: &Arc<ClientInfo>, state: &str, debug: bool) -> Vec<Value> {
    let (addr, port) = split_addr(&c.peer, ctx.listen_port);
    let (laddr, lport) = split_addr(&c.local, ctx.listen_port);
    let wait = c
        .wait_since()
        .filter(|_| c.state() == ClientState::Waiting)
        .map(|t| ctx.now.saturating_sub(t))
        .unwrap_or(0);
    let link = c
        .link()
        .and_then(|l| ctx.servers.get(&l.server_id))
        .map(ptr);
    let request = match c.request_time() {
        0 => c.connect_time,
        t => t,
    };
    let mut row = vec![
        text("C"),
        text(&*c.user),
        text(&*c.database),
        text(c.replication().as_str()),
        text(state),
        addr,
        port,
        laddr,
        lport,
        text(format_time(c.connect_time)),
        text(format_time(request)),
        int(wait / 1_000_000),
        int(wait % 1_000_000),
        int(0),
        text(ptr(c)),
        link,
        int(0),
        text(crate::registry::client_tls::get(c)),
        text(&*c.application_name),
        int(c.prepared()),
        int(c.id),
        text(crate::gucs::pin_text(c.pinned())),
    ];
    if debug {
        row.extend((0..7).map(|_| NULL));
    }
    row
}

/// A console session, as PgBouncer shows its admin pool's clients.
fn admin_row(ctx: &Ctx, a: &Arc<sessions::AdminSession>, state: &str) -> Vec<Value> {
    let (addr, port) = split_addr(&a.peer, ctx.listen_port);
    let (laddr, lport) = split_addr(&a.local, ctx.listen_port);
    vec![
        text("C"),
        text(&a.user),
        text(ADMIN_DB),
        text("none"),
        text(state),
        addr,
        port,
        laddr,
        lport,
        text(format_time(a.connect_time)),
        text(format_time(a.request_time())),
        int(0),
        int(0),
        int(0),
        text(ptr(a)),
        NULL,
        int(0),
        text(""),
        text(&a.application_name),
        int(0),
        int(a.serial),
        text(""),
    ]
}

fn server_state(s: &ServerInfo) -> &'static str {
    match s.state() {
        ServerState::Login => "new",
        ServerState::Idle => "idle",
        ServerState::Active => "active",
    }
}

fn server_row(ctx: &Ctx, s: &Arc<ServerInfo>, state: &str, debug: bool) -> Vec<Value> {
    let (addr, port) = server_addr(&s.addr);
    // Over a Unix socket our end has no address of its own: "unix" and the server's port.
    let (laddr, lport) = match s.local() {
        Some(Endpoint::Unix) => (text("unix"), port.clone()),
        Some(end) => split_addr(end, 0),
        None => (NULL, NULL),
    };
    let database = ctx
        .by_server
        .get(&s.id)
        .map(|p| p.database.clone())
        .unwrap_or_else(|| s.database.clone());
    let client = s.client().and_then(|pid| ctx.clients.get(&pid));
    let request = match s.request_time() {
        0 => s.connect_time,
        t => t,
    };
    let mut row = vec![
        text("S"),
        text(&s.user),
        text(database),
        text(s.replication().as_str()),
        text(state),
        addr,
        port,
        laddr,
        lport,
        text(format_time(s.connect_time)),
        text(format_time(request)),
        int(0),
        int(0),
        int(u8::from(control::close_needed(s.id))),
        text(ptr(s)),
        client.map(ptr),
        int(s.remote_pid()),
        text(s.tls()),
        text(client.map(|c| &*c.application_name).unwrap_or("")),
        int(s.prepared()),
        int(s.id),
        text(
            client
                .map(|c| crate::gucs::pin_text(c.pinned()))
                .unwrap_or_default(),
        ),
    ];
    if debug {
        row.extend((0..7).map(|_| NULL));
    }
    row
}

/// Clients in PgBouncer's order: by pool, active before waiting, oldest first.
fn ordered_clients(ctx: &Ctx) -> Vec<&Arc<ClientInfo>> {
    let mut v: Vec<_> = ctx.clients.values().collect();
    v.sort_by_key(|c| {
        (
            c.database.clone(),
            c.user.clone(),
            c.state() == ClientState::Waiting,
            c.connect_time,
            c.key.pid,
        )
    });
    v
}

/// Servers by pool, then active, idle, login, oldest first.
fn ordered_servers(ctx: &Ctx) -> Vec<&Arc<ServerInfo>> {
    let mut v: Vec<_> = ctx.servers.values().collect();
    let rank = |s: &ServerInfo| match s.state() {
        ServerState::Active => 0,
        ServerState::Idle => 1,
        ServerState::Login => 2,
    };
    v.sort_by_key(|s| {
        let pool = ctx
            .by_server
            .get(&s.id)
            .map(|p| (p.database.clone(), p.user.clone()))
            .unwrap_or_default();
        (pool, rank(s), s.connect_time, s.id)
    });
    v
}

pub(crate) fn clients(app: &App) -> RowSet {
    let ctx = Ctx::new(app);
    let mut rs = socket_rowset(false);
    let mut rows: Vec<(String, Vec<Value>)> = Vec::new();
    for c in ordered_clients(&ctx) {
        rows.push((
            c.database.to_string(),
            client_row(&ctx, c, client_state(c), false),
        ));
    }
    for a in sessions::all() {
        rows.push((ADMIN_DB.to_owned(), admin_row(&ctx, &a, "idle")));
    }
    rows.sort_by(|a, b| a.0.cmp(&b.0));
    for (_, r) in rows {
        rs.push(r);
    }
    rs
}

pub(crate) fn servers(app: &App) -> RowSet {
    let ctx = Ctx::new(app);
    let mut rs = socket_rowset(false);
    for s in ordered_servers(&ctx) {
        rs.push(server_row(&ctx, s, server_state(s), false));
    }
    rs
}

/// SHOW SOCKETS, or SHOW ACTIVE_SOCKETS (`active_only`): PgBouncer lists there the sockets
/// with unsent or unparsed bytes; Weir forwards as it reads and cannot see into its
/// buffers from here, so it lists the connections linked to a peer, whose bytes are in
/// flight.
pub(crate) fn sockets(app: &App, active_only: bool) -> RowSet {
    let ctx = Ctx::new(app);
    let mut rs = socket_rowset(true);
    for c in ordered_clients(&ctx) {
        if active_only && c.state() != ClientState::Active {
            continue;
        }
        let state = match c.state() {
            ClientState::Waiting => "cl_waiting",
            _ => "cl_active",
        };
        rs.push(client_row(&ctx, c, state, true));
    }
    // Console sessions are sockets too (PgBouncer lists its admin clients here); they are
    // in no pool's traffic, so only the full list shows them.
    if !active_only {
        for a in sessions::all() {
            let mut row = admin_row(&ctx, &a, "cl_active");
            row.extend((0..7).map(|_| NULL));
            rs.push(row);
        }
    }
    for s in ordered_servers(&ctx) {
        if active_only && s.state() != ServerState::Active {
            continue;
        }
        let state = match s.state() {
            ServerState::Active => "sv_active",
            ServerState::Idle => "sv_idle",
            ServerState::Login => "sv_login",
        };
        rs.push(server_row(&ctx, s, state, true));
    }
    let _ = &ctx.pools;
    rs
}
