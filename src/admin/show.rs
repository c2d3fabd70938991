//! The SHOW commands, with PgBouncer 1.24's columns, order and types (its admin.c and
//! stats.c). Values come from Weir's live state; where Weir has no equivalent of a
//! PgBouncer internal (slab caches, libevent fds, a DNS cache, cancel-request queues) the
//! command returns its columns with the rows that are true for Weir (often none, or zero
//! counts), and values Weir cannot know are NULL rather than made up.

use crate::stream::Endpoint;
use std::collections::{BTreeMap, BTreeSet, HashMap};
use std::sync::Arc;

use weir_config::{Database, General, LoadBalanceHosts};

use super::rowset::{int, text, RowSet, Value, NULL};
use super::{control, period, sessions, COMPAT_VERSION};
use crate::app::{App, Snapshot};
use crate::pool::Pool;
use crate::registry::client_limits;
use crate::registry::clients::{ClientInfo, ClientState, CLIENTS};
use crate::registry::now_micros;
use crate::registry::servers::{ServerInfo, ServerState, SERVERS};
use crate::server::ServerAddr;
use crate::stats::Delta;

/// The admin console's own database and user, listed as PgBouncer lists them.
pub use crate::pool::gates::ADMIN_DB;

/// PgBouncer's `format_time_s`: local time, `YYYY-MM-DD HH:MM:SS TZ`.
pub fn format_time(micros: u64) -> String {
    let secs = (micros / 1_000_000) as libc::time_t;
    // SAFETY: localtime_r and strftime write only into the buffers given, which outlive
    // the calls; the format is a NUL-terminated literal.
    unsafe {
        let mut tm: libc::tm = std::mem::zeroed();
        if libc::localtime_r(&secs, &mut tm).is_null() {
            return String::new();
        }
        let mut buf = [0u8; 64];
        let n = libc::strftime(
            buf.as_mut_ptr().cast(),
            buf.len(),
            c"%Y-%m-%d %H:%M:%S %Z".as_ptr(),
            &tm,
        );
        String::from_utf8_lossy(&buf[..n]).into_owned()
    }
}

/// "host:port" / "[v6]:port" / "unix" into PgBouncer's addr and port columns.
fn split_addr(end: &Endpoint, unix_port: u16) -> (Value, Value) {
    match (end, end.addr()) {
        (_, Some(a)) => (text(a.ip().to_string()), int(a.port())),
        (Endpoint::Unix, None) => (text("unix"), int(unix_port)),
        _ => (text("?"), NULL),
    }
}

fn server_addr(addr: &ServerAddr) -> (Value, Value) {
    match addr {
        ServerAddr::Tcp { host, port } => (text(host), int(port)),
        ServerAddr::Unix { path } => {
            let port = path
                .to_string_lossy()
                .rsplit_once(".s.PGSQL.")
                .and_then(|(_, p)| p.parse::<u16>().ok());
            (text("unix"), port.map(|p| p.to_string()))
        }
    }
}

fn ptr<T>(a: &Arc<T>) -> String {
    format!("{:p}", Arc::as_ptr(a))
}

/// The pool user a client's pool uses: the database's forced user, else the client's own.
fn pool_user(snap: &Snapshot, database: &str, client_user: &str) -> String {
    snap.resolve_database(database)
        .and_then(|(db, _)| db.user.clone())
        .unwrap_or_else(|| client_user.to_owned())
}

fn sorted_pools(app: &App) -> Vec<Arc<Pool>> {
    let mut pools = app.all_pools();
    pools.sort_by(|a, b| (&a.database, &a.user).cmp(&(&b.database, &b.user)));
    pools
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

// ---- SHOW STATS family ----

const STATS_TOTALS_COLS: [&str; 12] = [
    "server_assignment_count",
    "xact_count",
    "query_count",
    "bytes_received",
    "bytes_sent",
    "xact_time",
    "query_time",
    "wait_time",
    "client_parse_count",
    "server_parse_count",
    "bind_count",
    "client_login_count",
];

/// The twelve figures PgBouncer reports, in its order.
fn figures(d: &Delta) -> [u64; 12] {
    [
        d.server_assignments,
        d.xacts,
        d.queries,
        d.received,
        d.sent,
        d.xact_time_us,
        d.query_time_us,
        d.wait_time_us,
        d.prepared.client_parses,
        d.prepared.server_parses,
        d.prepared.binds,
        d.client_logins,
    ]
}

/// Per database: (totals now, totals at the start of the averaging window).
fn stats_by_database(app: &App) -> BTreeMap<String, (Delta, Delta)> {
    let mut out: BTreeMap<String, (Delta, Delta)> = BTreeMap::new();
    out.insert(ADMIN_DB.to_owned(), Default::default());
    for p in sorted_pools(app) {
        let e = out.entry(p.database.clone()).or_default();
        period::add(&mut e.0, &p.stats.read());
        period::add(&mut e.1, &period::window_start(&p.database, &p.user));
    }
    out
}

pub fn stats(app: &App) -> RowSet {
    let mut rs = RowSet::new(
        "sNNNNNNNNNNNNNNNNNNNNNNNNNN",
        &[
            "database",
            "total_server_assignment_count",
            "total_xact_count",
            "total_query_count",
            "total_received",
            "total_sent",
            "total_xact_time",
            "total_query_time",
            "total_wait_time",
            "total_client_parse_count",
            "total_server_parse_count",
            "total_bind_count",
            "total_client_login_count",
            "avg_server_assignment_count",
            "avg_xact_count",
            "avg_query_count",
            "avg_recv",
            "avg_sent",
            "avg_xact_time",
            "avg_query_time",
            "avg_wait_time",
            "avg_client_parse_count",
            "avg_server_parse_count",
            "avg_bind_count",
            "avg_client_login_count",
            // Weir's own, after PgBouncer's: requests pipelined (pool::pipeline).
            "total_pipelined_count",
            "avg_pipelined_count",
        ],
    );
    let window = period::window_us();
    for (db, (cur, old)) in stats_by_database(app) {
        let avg = period::averages(&cur, &old, window);
        let mut row = vec![text(db)];
        row.extend(figures(&cur).iter().map(int));
        row.extend(figures(&avg).iter().map(int));
        row.push(int(cur.pipelined));
        row.push(int(avg.pipelined));
        rs.push(row);
    }
    rs
}

pub fn stats_totals(app: &App) -> RowSet {
    let mut names = vec!["database"];
    names.extend(STATS_TOTALS_COLS);
    let mut rs = RowSet::new("sNNNNNNNNNNNN", &names);
    for (db, (cur, _)) in stats_by_database(app) {
        let mut row = vec![text(db)];
        row.extend(figures(&cur).iter().map(int));
        rs.push(row);
    }
    rs
}

pub fn stats_averages(app: &App) -> RowSet {
    let mut names = vec!["database"];
    names.extend(&STATS_TOTALS_COLS[..8]);
    names.extend([
        "avg_client_parse_count",
        "avg_server_parse_count",
        "avg_bind_count",
        // Unprefixed, like the rates above that are not prepared-statement counts.
        "client_login_count",
    ]);
    let mut rs = RowSet::new("sNNNNNNNNNNNN", &names);
    let window = period::window_us();
    for (db, (cur, old)) in stats_by_database(app) {
        let mut row = vec![text(db)];
        row.extend(
            figures(&period::averages(&cur, &old, window))
                .iter()
                .map(int),
        );
        rs.push(row);
    }
    rs
}

pub fn totals(app: &App) -> RowSet {
    let mut rs = RowSet::new("sN", &["name", "value"]);
    let mut cur = Delta::default();
    let mut old = Delta::default();
    for (c, o) in stats_by_database(app).values() {
        period::add(&mut cur, c);
        period::add(&mut old, o);
    }
    let avg = period::averages(&cur, &old, period::window_us());
    let names = [
        "server_assignment_count",
        "xact_count",
        "query_count",
        "client_bytes",
        "server_bytes",
        "xact_time",
        "query_time",
        "wait_time",
        "ps_client_parse_count",
        "ps_server_parse_count",
        "ps_bind_count",
        "client_login_count",
    ];
    for (prefix, d) in [("total_", &cur), ("avg_", &avg)] {
        for (name, v) in names.iter().zip(figures(d)) {
            rs.push(vec![text(format!("{prefix}{name}")), int(v)]);
        }
    }
    rs
}

// ---- POOLS ----

pub fn pools(app: &App) -> RowSet {
    let mut rs = RowSet::new(
        "ssiiiiiiiiiiiiissii",
        &[
            "database",
            "user",
            "cl_active",
            "cl_waiting",
            "cl_active_cancel_req",
            "cl_waiting_cancel_req",
            "sv_active",
            "sv_active_cancel",
            "sv_being_canceled",
            "sv_idle",
            "sv_used",
            "sv_tested",
            "sv_login",
            "maxwait",
            "maxwait_us",
            "pool_mode",
            "load_balance_hosts",
            // Weir's own, after PgBouncer's (pool::pipeline): of cl_waiting, the clients
            // whose request already runs behind another's on a busy server; and how many
            // may go behind one, 0 where pipelining is off.
            "cl_pipelined",
            "pipeline_depth",
        ],
    );
    let snap = app.snapshot.load();
    let now = now_micros();
    // Waiting clients per pool, and when the oldest began to wait.
    let mut waiting: HashMap<(String, String), (usize, u64)> = HashMap::new();
    for c in CLIENTS.snapshot() {
        if c.state() == ClientState::Waiting {
            let key = (
                c.database.to_string(),
                pool_user(&snap, &c.database, &c.user),
            );
            let e = waiting.entry(key).or_insert((0, u64::MAX));
            e.0 += 1;
            e.1 = e.1.min(c.wait_since().unwrap_or(now));
        }
    }
    let admin_clients = sessions::count();
    let mut rows: Vec<(String, String, Vec<Value>)> = Vec::new();
    rows.push((
        ADMIN_DB.into(),
        ADMIN_DB.into(),
        admin_pool_row(admin_clients),
    ));
    for p in sorted_pools(app) {
        let c = p.counts();
        // Held back until a cancel sent for them is done (pool::lease), as PgBouncer's.
        let canceled = p.being_canceled.load(std::sync::atomic::Ordering::Relaxed);
        let (n_wait, since) = waiting
            .get(&(p.database.clone(), p.user.clone()))
            .copied()
            .unwrap_or((0, u64::MAX));
        let n_wait = n_wait.max(c.waiting);
        let max_wait = if since != u64::MAX {
            now.saturating_sub(since)
        } else {
            c.max_wait.as_micros() as u64
        };
        let db = snap.resolve_database(&p.database).map(|d| d.0);
        let mode = db
            .as_ref()
            .map(|d| snap.pool_mode(d, &p.user))
            .unwrap_or(snap.config.general.pool_mode);
        rows.push((
            p.database.clone(),
            p.user.clone(),
            vec![
                text(&p.database),
                text(&p.user),
                int(c.clients.saturating_sub(n_wait)),
                int(n_wait),
                int(0),
                int(0),
                int(c.active.saturating_sub(canceled)),
                int(0),
                int(canceled),
                int(c.idle),
                int(0),
                int(0),
                int(c.connecting),
                int(max_wait / 1_000_000),
                int(max_wait % 1_000_000),
                text(mode.as_str()),
                load_balance(db),
                int(p.pipelined_now()),
                int(p.pipeline_depth()),
            ],
        ));
    }
    rows.sort_by(|a, b| (&a.0, &a.1).cmp(&(&b.0, &b.1)));
    for (_, _, r) in rows {
        rs.push(r);
    }
    rs
}

fn admin_pool_row(clients: usize) -> Vec<Value> {
    let mut r = vec![text(ADMIN_DB), text(ADMIN_DB), int(clients)];
    r.extend((0..12).map(|_| int(0)));
    r.push(text("statement"));
    r.push(NULL);
    r.extend([int(0), int(0)]);
    r
}

fn load_balance(db: Option<&Database>) -> Value {
    let db = db?;
    if db.host.len() > 1 {
        Some(
            db.load_balance_hosts
                .unwrap_or(LoadBalanceHosts::RoundRobin)
                .as_str()
                .to_owned(),
        )
    } else {
        None
    }
}

// ---- CLIENTS, SERVERS, SOCKETS ----

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
        text("none"),
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
        int(c.key.pid),
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
        int(a.id),
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
        text("none"),
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

pub fn clients(app: &App) -> RowSet {
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

pub fn servers(app: &App) -> RowSet {
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
pub fn sockets(app: &App, active_only: bool) -> RowSet {
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

// ---- DATABASES, USERS, PEERS, LISTS ----

pub fn databases(app: &App) -> RowSet {
    let mut rs = RowSet::new(
        "ssissiiiissiiiiii",
        &[
            "name",
            "host",
            "port",
            "database",
            "force_user",
            "pool_size",
            "min_pool_size",
            "reserve_pool_size",
            "server_lifetime",
            "pool_mode",
            "load_balance_hosts",
            "max_connections",
            "current_connections",
            "max_client_connections",
            "current_client_connections",
            "paused",
            "disabled",
        ],
    );
    let snap = app.snapshot.load();
    let g = &snap.config.general;
    let pools = sorted_pools(app);
    let mut names: BTreeSet<String> = snap
        .config
        .databases
        .iter()
        .map(|(n, _)| n.clone())
        .collect();
    names.extend(pools.iter().map(|p| p.database.clone()));
    let mut rows = vec![(
        ADMIN_DB.to_owned(),
        vec![
            text(ADMIN_DB),
            NULL,
            int(g.listen_port),
            text(ADMIN_DB),
            text(ADMIN_DB),
            int(2),
            int(g.min_pool_size),
            int(g.reserve_pool_size),
            int(g.server_lifetime.as_secs()),
            text("statement"),
            NULL,
            int(g.max_db_connections),
            int(0),
            int(g.max_db_client_connections),
            int(client_limits::in_database(ADMIN_DB)),
            int(0),
            int(0),
        ],
    )];
    for name in names {
        let Some((db, server_db)) = snap.resolve_database(&name) else {
            continue;
        };
        let servers: usize = pools
            .iter()
            .filter(|p| p.database == name)
            .map(|p| {
                let c = p.counts();
                c.active + c.idle + c.connecting
            })
            .sum();
        rows.push((
            name.clone(),
            vec![
                text(&name),
                if db.host.is_empty() {
                    NULL
                } else {
                    text(db.host.join(","))
                },
                int(db.port_for(0)),
                text(server_db),
                db.user.clone(),
                int(db.pool_size.unwrap_or(g.default_pool_size)),
                int(db.min_pool_size.unwrap_or(g.min_pool_size)),
                int(db.reserve_pool_size.unwrap_or(g.reserve_pool_size)),
                int(db.server_lifetime.unwrap_or(g.server_lifetime).as_secs()),
                db.pool_mode.map(|m| m.as_str().to_owned()),
                load_balance(Some(db)),
                int(db.max_db_connections.unwrap_or(g.max_db_connections)),
                int(servers),
                int(db
                    .max_db_client_connections
                    .unwrap_or(g.max_db_client_connections)),
                int(client_limits::in_database(&name)),
                int(u8::from(control::is_paused(&name))),
                int(u8::from(control::is_disabled(&name))),
            ],
        ));
    }
    rows.sort_by(|a, b| a.0.cmp(&b.0));
    for (_, r) in rows {
        rs.push(r);
    }
    rs
}

fn user_names(app: &App, snap: &Snapshot) -> BTreeSet<String> {
    let mut names: BTreeSet<String> = snap.auth_file.keys().cloned().collect();
    names.extend(snap.config.users.keys().cloned());
    names.extend(app.all_pools().iter().map(|p| p.user.clone()));
    names.extend(CLIENTS.snapshot().iter().map(|c| c.user.to_string()));
    names.extend(sessions::all().iter().map(|a| a.user.clone()));
    names.insert(ADMIN_DB.to_owned());
    names
}

pub fn users(app: &App) -> RowSet {
    let mut rs = RowSet::new(
        "ssssiiii",
        &[
            "name",
            "pool_size",
            "reserve_pool_size",
            "pool_mode",
            "max_user_connections",
            "current_connections",
            "max_user_client_connections",
            "current_client_connections",
        ],
    );
    let snap = app.snapshot.load();
    let g = &snap.config.general;
    let pools = app.all_pools();
    for name in user_names(app, &snap) {
        let u = snap.config.users.get(&name);
        let servers: usize = pools
            .iter()
            .filter(|p| p.user == name)
            .map(|p| {
                let c = p.counts();
                c.active + c.idle + c.connecting
            })
            .sum();
        rs.push(vec![
            text(&name),
            text(
                u.and_then(|u| u.pool_size)
                    .map(|n| format!("{n:>9}"))
                    .unwrap_or_default(),
            ),
            text(
                u.and_then(|u| u.reserve_pool_size)
                    .map(|n| format!("{n:>9}"))
                    .unwrap_or_default(),
            ),
            u.and_then(|u| u.pool_mode).map(|m| m.as_str().to_owned()),
            int(u
                .and_then(|u| u.max_user_connections)
                .unwrap_or(g.max_user_connections)),
            int(servers),
            int(u
                .and_then(|u| u.max_user_client_connections)
                .unwrap_or(g.max_user_client_connections)),
            int(client_limits::of_user(&name)),
        ]);
    }
    rs
}

pub fn peers(app: &App) -> RowSet {
    let mut rs = RowSet::new("isii", &["peer_id", "host", "port", "pool_size"]);
    let snap = app.snapshot.load();
    let default = snap.config.general.default_pool_size;
    for (id, p) in &snap.config.peers {
        rs.push(vec![
            int(id),
            text(&p.host),
            int(p.port),
            int(p.pool_size.unwrap_or(default)),
        ]);
    }
    rs
}

/// Weir keeps no pools of connections to peers (yet): no rows.
pub fn peer_pools() -> RowSet {
    RowSet::new(
        "iiiii",
        &[
            "peer_id",
            "cl_active_cancel_req",
            "cl_waiting_cancel_req",
            "sv_active_cancel",
            "sv_login",
        ],
    )
}

pub fn lists(app: &App) -> RowSet {
    let mut rs = RowSet::new("si", &["list", "items"]);
    let snap = app.snapshot.load();
    let databases = databases(app).rows().len();
    let users = user_names(app, &snap).len();
    let pools = app.all_pools().len() + 1;
    let logged_in = CLIENTS.snapshot().len() + sessions::count();
    let total = app.clients.load(std::sync::atomic::Ordering::Relaxed);
    let servers = SERVERS.snapshot().len();
    for (name, n) in [
        ("databases", databases),
        ("users", users),
        ("peers", snap.config.peers.len()),
        ("pools", pools),
        ("peer_pools", 0),
        // Weir keeps no free lists of client or server objects.
        ("free_clients", 0),
        ("used_clients", total.max(logged_in)),
        ("login_clients", total.saturating_sub(logged_in)),
        ("free_servers", 0),
        ("used_servers", servers),
        // Weir resolves host names per connect and keeps no DNS cache.
        ("dns_names", 0),
        ("dns_zones", 0),
        ("dns_queries", 0),
        ("dns_pending", 0),
    ] {
        rs.push(vec![text(name), int(n)]);
    }
    rs
}

// ---- CONFIG, STATE, VERSION and the empty ones ----

pub fn config(app: &App) -> RowSet {
    let mut rs = RowSet::new("ssss", &["key", "value", "default", "changeable"]);
    let snap = app.snapshot.load();
    let g = &snap.config.general;
    let defaults = General::default();
    for name in General::OPTION_NAMES {
        let value = g.show_option(name).flatten();
        let default = defaults.show_option(name).flatten();
        let changeable = !control::NOT_RELOADABLE.contains(name);
        rs.push(vec![
            text(*name),
            value,
            default,
            text(if changeable { "yes" } else { "no" }),
        ]);
    }
    rs
}

pub fn state() -> RowSet {
    let mut rs = RowSet::new("ss", &["key", "value"]);
    let mode = control::mode();
    let yn = |b: bool| text(if b { "yes" } else { "no" });
    rs.push(vec![text("active"), yn(mode == control::Mode::Running)]);
    rs.push(vec![text("paused"), yn(mode == control::Mode::Paused)]);
    rs.push(vec![
        text("suspended"),
        yn(mode == control::Mode::Suspended),
    ]);
    rs
}

pub fn version() -> RowSet {
    let mut rs = RowSet::new("s", &["version"]);
    rs.push(vec![text(format!(
        "PgBouncer {COMPAT_VERSION} (weir {})",
        env!("CARGO_PKG_VERSION")
    ))]);
    rs
}

/// Weir allocates from the system allocator, not slab caches: no rows.
pub fn mem() -> RowSet {
    RowSet::new("siiii", &["name", "size", "used", "free", "memtotal"])
}

/// PgBouncer hands these to a new process for an online restart (-R); Weir has no online
/// restart, so there is nothing to hand over: no rows.
pub fn fds() -> RowSet {
    RowSet::new(
        "issssiqisssssbb",
        &[
            "fd",
            "task",
            "user",
            "database",
            "addr",
            "port",
            "cancel",
            "link",
            "client_encoding",
            "std_strings",
            "datestyle",
            "timezone",
            "password",
            "scram_client_key",
            "scram_server_key",
        ],
    )
}

/// Weir's own: one row per host of each database entry (`host=a,b,c`), with what the last
/// connections to it found (role from `in_hot_standby` or `pg_is_in_recovery()`, reachable
/// or not, the last error) and its servers now.
pub fn hosts(app: &App) -> RowSet {
    let mut rs = RowSet::new(
        "ssisssssiiiss",
        &[
            "database",
            "host",
            "port",
            "role",
            "state",
            "lag",
            "in_rotation",
            "load_balance_hosts",
            "weight",
            "active",
            "idle",
            "last_error",
            "last_error_time",
        ],
    );
    for row in crate::app::host_rows(app) {
        let h = row.host();
        let (host, port) = server_addr(&h.addr);
        let (err, at) = match h.last_error() {
            Some((at, e)) => (text(e), text(format_time(at))),
            None => (NULL, NULL),
        };
        rs.push(vec![
            text(&row.database),
            host,
            port,
            text(h.role().as_str()),
            text(h.state()),
            h.lag().map_or(NULL, |l| text(format!("{l:.3}"))),
            text(if h.out_of_rotation() { "no" } else { "yes" }),
            text(row.set.balance.as_str()),
            int(row.set.weights.get(row.index).copied().unwrap_or(1)),
            int(row.active),
            int(row.idle),
            err,
            at,
        ]);
    }
    rs
}

/// Weir keeps no DNS cache: no rows.
pub fn dns_hosts() -> RowSet {
    RowSet::new("sqs", &["hostname", "ttl", "addrs"])
}

pub fn dns_zones() -> RowSet {
    RowSet::new("sqi", &["zonename", "serial", "count"])
}

/// The session parameters PgBouncer's console pretends to have, for clients that SHOW them.
pub const FAKE_PARAMS: &[(&str, &str)] = &[
    ("client_encoding", "UTF-8"),
    ("default_transaction_isolation", "read committed"),
    ("standard_conforming_strings", "on"),
    ("datestyle", "ISO"),
    ("timezone", "GMT"),
    ("extra_float_digits", "2"),
];

pub fn fake_param(name: &str) -> Option<RowSet> {
    let (n, v) = FAKE_PARAMS
        .iter()
        .find(|(n, _)| n.eq_ignore_ascii_case(name))?;
    let mut rs = RowSet::new("s", &[n]);
    rs.push(vec![text(*v)]);
    Some(rs)
}
