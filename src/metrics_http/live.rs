//! One reading of everything the endpoint reports, taken at once so that /metrics, the
//! JSON API and the sampler agree. Pool figures come from the admin console's SHOW POOLS
//! (so the dashboard and `SHOW POOLS` never disagree), traffic from the pools' counters,
//! the rest from the client and server registries and the process-wide event counters.

use std::collections::HashMap;
use std::sync::atomic::Ordering;
use std::time::Instant;

use crate::admin::{self, rowset::RowSet};
use crate::app::App;
use crate::registry::clients::{ClientState, CLIENTS};
use crate::registry::servers::{ServerState, SERVERS};
use crate::stats::{Delta, LATENCY_BUCKETS};

/// A pool as SHOW POOLS shows it, with its traffic counters and latency histograms.
#[derive(Debug, Clone)]
pub struct PoolLive {
    pub database: String,
    pub user: String,
    pub pool_mode: String,
    pub cl_active: u64,
    /// Clients kept on their server by session state that cannot move (client::state).
    pub pinned: u64,
    pub cl_waiting: u64,
    pub sv_active: u64,
    pub sv_idle: u64,
    pub sv_login: u64,
    pub max_wait_us: u64,
    pub pool_size: u64,
    /// SHOW POOLS cl_pipelined and pipeline_depth.
    pub cl_pipelined: u64,
    pub pipeline_depth: u64,
    pub totals: Delta,
    pub xact_hist: [u64; LATENCY_BUCKETS],
    pub query_hist: [u64; LATENCY_BUCKETS],
    /// The last server login that failed (seconds ago, message), until one succeeds.
    pub login_failure: Option<(f64, String)>,
}

#[derive(Debug, Clone)]
pub struct Live {
    pub pools: Vec<PoolLive>,
    /// Logged-in clients by state (active, waiting, idle), and those still logging in.
    pub clients_active: u64,
    pub clients_waiting: u64,
    pub clients_idle: u64,
    pub clients_login: u64,
    /// Server connections by state.
    pub servers_active: u64,
    pub servers_idle: u64,
    pub servers_login: u64,
    /// Connections over TLS, each side.
    pub clients_tls: u64,
    pub servers_tls: u64,
    /// Every open client connection, logged in or not, console sessions included.
    pub client_connections: u64,
    pub max_client_conn: u64,
    pub uptime_secs: f64,
    pub start_time_secs: f64,
}

/// Reads the rows of an admin RowSet by column name.
struct Table<'a> {
    rs: &'a RowSet,
}

impl<'a> Table<'a> {
    fn get(&self, row: &'a [Option<String>], col: &str) -> Option<&'a str> {
        let i = self.rs.column(col)?;
        row.get(i)?.as_deref()
    }

    fn num(&self, row: &[Option<String>], col: &str) -> u64 {
        self.get(row, col)
            .and_then(|v| v.trim().parse().ok())
            .unwrap_or(0)
    }
}

pub fn read(app: &App, started: Instant, start_time_secs: f64) -> Live {
    let by_key: HashMap<(String, String), _> = app
        .all_pools()
        .into_iter()
        .map(|p| ((p.database.clone(), p.user.clone()), p))
        .collect();
    let rs = admin::show::pools(app);
    let t = Table { rs: &rs };
    let mut pools = Vec::new();
    for row in rs.rows() {
        let database = t.get(row, "database").unwrap_or_default().to_owned();
        let user = t.get(row, "user").unwrap_or_default().to_owned();
        // The console's own pseudo-pool has no servers and no traffic.
        let Some(pool) = by_key.get(&(database.clone(), user.clone())) else {
            continue;
        };
        pools.push(PoolLive {
            pool_mode: t.get(row, "pool_mode").unwrap_or_default().to_owned(),
            cl_active: t.num(row, "cl_active"),
            cl_waiting: t.num(row, "cl_waiting"),
            sv_active: t.num(row, "sv_active"),
            sv_idle: t.num(row, "sv_idle"),
            sv_login: t.num(row, "sv_login"),
            max_wait_us: t.num(row, "maxwait") * 1_000_000 + t.num(row, "maxwait_us"),
            pool_size: pool.settings().pool_size as u64,
            cl_pipelined: t.num(row, "cl_pipelined"),
            pipeline_depth: t.num(row, "pipeline_depth"),
            pinned: pool.pinned.load(Ordering::Relaxed) as u64,
            totals: pool.stats.read(),
            xact_hist: pool.stats.xact_latency.read(),
            query_hist: pool.stats.query_latency.read(),
            login_failure: pool
                .last_login_failure()
                .map(|(at, e)| (at.elapsed().as_secs_f64(), e.message.clone())),
            database,
            user,
        });
    }

    let mut live = Live {
        pools,
        clients_active: 0,
        clients_waiting: 0,
        clients_idle: 0,
        clients_login: 0,
        servers_active: 0,
        servers_idle: 0,
        servers_login: 0,
        clients_tls: crate::registry::client_tls::count() as u64,
        servers_tls: 0,
        client_connections: app.clients.load(Ordering::Relaxed) as u64,
        max_client_conn: app.snapshot.load().config.general.max_client_conn as u64,
        uptime_secs: started.elapsed().as_secs_f64(),
        start_time_secs,
    };
    let clients = CLIENTS.snapshot();
    for c in &clients {
        match c.state() {
            ClientState::Active => live.clients_active += 1,
            ClientState::Waiting => live.clients_waiting += 1,
            ClientState::Idle => live.clients_idle += 1,
        }
    }
    let logged_in = clients.len() + admin::sessions::count();
    live.clients_login = (live.client_connections as usize).saturating_sub(logged_in) as u64;
    for s in SERVERS.snapshot() {
        match s.state() {
            ServerState::Active => live.servers_active += 1,
            ServerState::Idle => live.servers_idle += 1,
            ServerState::Login => live.servers_login += 1,
        }
        live.servers_tls += u64::from(!s.tls().is_empty());
    }
    live
}

impl Live {
    /// Traffic summed over every pool.
    pub fn totals(&self) -> Delta {
        let mut d = Delta::default();
        for p in &self.pools {
            admin::period::add(&mut d, &p.totals);
        }
        d
    }

    /// Latency histograms summed over every pool: (transactions, queries).
    pub fn histograms(&self) -> ([u64; LATENCY_BUCKETS], [u64; LATENCY_BUCKETS]) {
        let mut x = [0; LATENCY_BUCKETS];
        let mut q = [0; LATENCY_BUCKETS];
        for p in &self.pools {
            for i in 0..LATENCY_BUCKETS {
                x[i] += p.xact_hist[i];
                q[i] += p.query_hist[i];
            }
        }
        (x, q)
    }
}
