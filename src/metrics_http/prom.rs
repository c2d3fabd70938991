//! `/metrics`: the live figures in the OpenMetrics text format (which Prometheus scrapes
//! natively), encoded by `prometheus-client` so that names, escaping, `_total` suffixes,
//! cumulative buckets and `# EOF` are right by construction.

use prometheus_client::collector::Collector;
use prometheus_client::encoding::{DescriptorEncoder, EncodeMetric, MetricEncoder, NoLabelSet};
use prometheus_client::metrics::MetricType;
use prometheus_client::registry::{Registry, Unit};

use super::live::{Live, PoolLive};
use crate::stats::{self, ErrorSource, LATENCY_BOUNDS_US, LATENCY_BUCKETS};

/// The content type of what [`encode`] produces.
pub const CONTENT_TYPE: &str = "application/openmetrics-text; version=1.0.0; charset=utf-8";

pub fn encode(live: Live) -> String {
    let mut registry = Registry::default();
    registry.register_collector(Box::new(LiveCollector(live)));
    let mut out = String::with_capacity(16 * 1024);
    // Writing into a String cannot fail.
    let _ = prometheus_client::encoding::text::encode(&mut out, &registry);
    out
}

#[derive(Debug)]
struct LiveCollector(Live);

type Labels = Vec<(&'static str, String)>;

fn pool_labels(p: &PoolLive) -> Labels {
    vec![("database", p.database.clone()), ("user", p.user.clone())]
}

/// A value ready to encode: a gauge or a counter, integral or not.
#[derive(Debug, Clone, Copy)]
enum V {
    Gauge(f64),
    GaugeInt(u64),
    Counter(f64),
    CounterInt(u64),
}

fn put(e: &mut MetricEncoder, v: V) -> Result<(), std::fmt::Error> {
    match v {
        V::Gauge(g) => e.encode_gauge(&g),
        V::GaugeInt(g) => e.encode_gauge(&g),
        V::Counter(c) => e.encode_counter::<NoLabelSet, _, f64>(&c, None),
        V::CounterInt(c) => e.encode_counter::<NoLabelSet, _, u64>(&c, None),
    }
}

/// One metric family: name, help, unit, type, and its labelled values.
fn family(
    enc: &mut DescriptorEncoder,
    name: &str,
    help: &str,
    unit: Option<Unit>,
    values: Vec<(Labels, V)>,
) -> Result<(), std::fmt::Error> {
    let Some((_, first)) = values.first() else {
        return Ok(());
    };
    let ty = match first {
        V::Gauge(_) | V::GaugeInt(_) => MetricType::Gauge,
        V::Counter(_) | V::CounterInt(_) => MetricType::Counter,
    };
    let mut m = enc.encode_descriptor(name, help, unit.as_ref(), ty)?;
    for (labels, v) in values {
        if labels.is_empty() {
            put(&mut m, v)?;
        } else {
            put(&mut m.encode_family(&labels)?, v)?;
        }
    }
    Ok(())
}

fn per_pool(pools: &[PoolLive], f: impl Fn(&PoolLive) -> V) -> Vec<(Labels, V)> {
    pools.iter().map(|p| (pool_labels(p), f(p))).collect()
}

fn secs(us: u64) -> f64 {
    us as f64 / 1e6
}

/// A histogram from non-cumulative bucket counts and a sum in microseconds.
#[derive(Debug)]
struct Hist {
    sum_us: u64,
    buckets: [u64; LATENCY_BUCKETS],
}

impl EncodeMetric for Hist {
    fn encode(&self, mut encoder: MetricEncoder) -> Result<(), std::fmt::Error> {
        let buckets: Vec<(f64, u64)> = (0..LATENCY_BUCKETS)
            .map(|i| {
                let le = LATENCY_BOUNDS_US.get(i).map_or(f64::INFINITY, |b| secs(*b));
                (le, self.buckets[i])
            })
            .collect();
        let count = self.buckets.iter().sum();
        encoder.encode_histogram::<NoLabelSet>(secs(self.sum_us), count, &buckets, None)
    }

    fn metric_type(&self) -> MetricType {
        MetricType::Histogram
    }
}

impl Collector for LiveCollector {
    fn encode(&self, mut enc: DescriptorEncoder) -> Result<(), std::fmt::Error> {
        let live = &self.0;
        let pools = &live.pools;
        let e = &mut enc;
        let g = V::GaugeInt;
        let c = V::CounterInt;

        // ---- process ----
        let info = [("version", env!("CARGO_PKG_VERSION"))];
        e.encode_descriptor("weir_build", "Weir's version.", None, MetricType::Info)?
            .encode_info(&info)?;
        family(
            e,
            "weir_uptime",
            "Time since Weir started.",
            Some(Unit::Seconds),
            vec![(vec![], V::Gauge(live.uptime_secs))],
        )?;
        family(
            e,
            "weir_start_time",
            "When Weir started, seconds since the Unix epoch.",
            Some(Unit::Seconds),
            vec![(vec![], V::Gauge(live.start_time_secs))],
        )?;
        family(
            e,
            "weir_client_connections",
            "Open client connections (logged in or not, console sessions included).",
            None,
            vec![(vec![], g(live.client_connections))],
        )?;
        family(
            e,
            "weir_clients_parked",
            "Idle clients parked without a task (they resume when they send something).",
            None,
            vec![(vec![], g(crate::client::park::count() as u64))],
        )?;
        family(
            e,
            "weir_max_client_conn",
            "The max_client_conn setting.",
            None,
            vec![(vec![], g(live.max_client_conn))],
        )?;
        if let Some(rss) = resident_bytes() {
            family(
                e,
                "weir_resident_memory",
                "Resident memory of the process.",
                Some(Unit::Bytes),
                vec![(vec![], g(rss))],
            )?;
        }
        if let Ok(dir) = std::fs::read_dir("/proc/self/fd") {
            family(
                e,
                "weir_open_fds",
                "Open file descriptors of the process.",
                None,
                vec![(vec![], g(dir.count() as u64))],
            )?;
        }
        let (ok, failed, last) = stats::reloads();
        family(
            e,
            "weir_config_reloads",
            "Configuration reloads (SIGHUP or RELOAD), by result.",
            None,
            vec![
                (vec![("result", "success".into())], c(ok)),
                (vec![("result", "failure".into())], c(failed)),
            ],
        )?;
        if last > 0 {
            family(e, "weir_config_last_reload", "When the configuration was last reloaded successfully, seconds since the Unix epoch.", Some(Unit::Seconds), vec![(vec![], V::Gauge(secs(last)))])?;
        }

        // ---- clients and servers by state ----
        let state = |s: &str| vec![("state", s.to_owned())];
        family(e, "weir_clients", "Client connections by state: active (linked to a server), waiting (queued for one), idle, login (not logged in yet).", None, vec![
            (state("active"), g(live.clients_active)),
            (state("waiting"), g(live.clients_waiting)),
            (state("idle"), g(live.clients_idle)),
            (state("login"), g(live.clients_login)),
        ])?;
        family(
            e,
            "weir_servers",
            "Server connections by state: active (lent to a client), idle, login (logging in).",
            None,
            vec![
                (state("active"), g(live.servers_active)),
                (state("idle"), g(live.servers_idle)),
                (state("login"), g(live.servers_login)),
            ],
        )?;
        family(
            e,
            "weir_tls_connections",
            "Connections over TLS, by side: client (SHOW CLIENTS tls) or server (SHOW SERVERS tls).",
            None,
            vec![
                (vec![("side", "client".into())], g(live.clients_tls)),
                (vec![("side", "server".into())], g(live.servers_tls)),
            ],
        )?;

        // ---- pools, as SHOW POOLS ----
        family(
            e,
            "weir_pool_client_active",
            "Clients of the pool not waiting for a server (SHOW POOLS cl_active).",
            None,
            per_pool(pools, |p| g(p.cl_active)),
        )?;
        family(
            e,
            "weir_pool_client_pinned",
            "Clients of the pool (transaction or statement mode) kept on their server by what cannot move to another: an advisory lock, a temporary table, a WITH HOLD cursor, LISTEN (SHOW CLIENTS pinned says which).",
            None,
            per_pool(pools, |p| g(p.pinned)),
        )?;
        family(
            e,
            "weir_pool_client_waiting",
            "Clients of the pool waiting for a server (SHOW POOLS cl_waiting).",
            None,
            per_pool(pools, |p| g(p.cl_waiting)),
        )?;
        family(
            e,
            "weir_pool_client_pipelined",
            "Of the waiting clients, those whose request runs behind another's on a busy server (SHOW POOLS cl_pipelined).",
            None,
            per_pool(pools, |p| g(p.cl_pipelined)),
        )?;
        family(
            e,
            "weir_pool_pipeline_depth",
            "Requests that may go behind the running one on a server of the pool, 0 if pipelining is off (SHOW POOLS pipeline_depth).",
            None,
            per_pool(pools, |p| g(p.pipeline_depth)),
        )?;
        family(
            e,
            "weir_pool_server_active",
            "Servers of the pool lent to clients (SHOW POOLS sv_active).",
            None,
            per_pool(pools, |p| g(p.sv_active)),
        )?;
        family(
            e,
            "weir_pool_server_idle",
            "Idle servers of the pool (SHOW POOLS sv_idle).",
            None,
            per_pool(pools, |p| g(p.sv_idle)),
        )?;
        family(
            e,
            "weir_pool_server_login",
            "Servers of the pool logging in (SHOW POOLS sv_login).",
            None,
            per_pool(pools, |p| g(p.sv_login)),
        )?;
        family(
            e,
            "weir_pool_max_wait",
            "How long the pool's oldest waiting client has waited (SHOW POOLS maxwait).",
            Some(Unit::Seconds),
            per_pool(pools, |p| V::Gauge(secs(p.max_wait_us))),
        )?;
        family(
            e,
            "weir_pool_size",
            "The pool's size setting.",
            None,
            per_pool(pools, |p| g(p.pool_size)),
        )?;

        // ---- traffic, as SHOW STATS (per pool; sum by database for SHOW STATS) ----
        family(
            e,
            "weir_pool_server_assignments",
            "Times a server was lent to a client of the pool.",
            None,
            per_pool(pools, |p| c(p.totals.server_assignments)),
        )?;
        family(
            e,
            "weir_pool_transactions",
            "Transactions completed through the pool.",
            None,
            per_pool(pools, |p| c(p.totals.xacts)),
        )?;
        family(
            e,
            "weir_pool_queries",
            "Queries completed through the pool.",
            None,
            per_pool(pools, |p| c(p.totals.queries)),
        )?;
        family(
            e,
            "weir_pool_received",
            "Bytes received from the pool's clients.",
            Some(Unit::Bytes),
            per_pool(pools, |p| c(p.totals.received)),
        )?;
        family(
            e,
            "weir_pool_sent",
            "Bytes sent to the pool's clients.",
            Some(Unit::Bytes),
            per_pool(pools, |p| c(p.totals.sent)),
        )?;
        family(
            e,
            "weir_pool_transaction_time",
            "Time spent in transactions.",
            Some(Unit::Seconds),
            per_pool(pools, |p| V::Counter(secs(p.totals.xact_time_us))),
        )?;
        family(
            e,
            "weir_pool_query_time",
            "Time spent in queries.",
            Some(Unit::Seconds),
            per_pool(pools, |p| V::Counter(secs(p.totals.query_time_us))),
        )?;
        family(
            e,
            "weir_pool_wait_time",
            "Time clients spent waiting for a server.",
            Some(Unit::Seconds),
            per_pool(pools, |p| V::Counter(secs(p.totals.wait_time_us))),
        )?;
        family(
            e,
            "weir_pool_client_logins",
            "Clients that logged in to the pool (SHOW STATS total_client_login_count).",
            None,
            per_pool(pools, |p| c(p.totals.client_logins)),
        )?;
        family(
            e,
            "weir_pool_pipelined_requests",
            "Requests sent to a busy server behind another client's (pipeline_depth; SHOW STATS total_pipelined_count).",
            None,
            per_pool(pools, |p| c(p.totals.pipelined)),
        )?;
        family(
            e,
            "weir_pool_state_applied",
            "Servers put into a client's session state (parameters, settings) as they were lent (SHOW STATS total_state_applied_count).",
            None,
            per_pool(pools, |p| c(p.totals.state_applied)),
        )?;
        family(
            e,
            "weir_pool_state_round_trips",
            "Of those, the ones that took a round trip of their own instead of going in front of the request (SHOW STATS total_state_round_trip_count).",
            None,
            per_pool(pools, |p| c(p.totals.state_apart)),
        )?;
        for (name, help, pick) in [
            (
                "weir_pool_client_parses",
                "Named statements prepared by clients (Parse messages).",
                0,
            ),
            (
                "weir_pool_server_parses",
                "Statements Weir prepared on servers (a client's statement new to that server).",
                1,
            ),
            (
                "weir_pool_binds",
                "Executions of named statements (Bind messages).",
                2,
            ),
            (
                "weir_pool_prepared_cache_hits",
                "Named statements that needed no prepare on the server (it held them, or Weir answered the Parse).",
                3,
            ),
            (
                "weir_pool_prepared_evictions",
                "Statements closed on servers to stay within max_prepared_statements.",
                4,
            ),
        ] {
            family(
                e,
                name,
                help,
                None,
                per_pool(pools, |p| {
                    let t = &p.totals.prepared;
                    c([t.client_parses, t.server_parses, t.binds, t.hits, t.evictions][pick])
                }),
            )?;
        }

        // ---- latency histograms ----
        for (name, help, pick) in [
            (
                "weir_pool_transaction_duration",
                "Transaction latency, from the first query to the ReadyForQuery that ends it.",
                0,
            ),
            (
                "weir_pool_query_duration",
                "Query latency, from the query (or Sync) to its ReadyForQuery.",
                1,
            ),
        ] {
            if pools.is_empty() {
                continue;
            }
            let mut m =
                e.encode_descriptor(name, help, Some(&Unit::Seconds), MetricType::Histogram)?;
            for p in pools {
                let h = if pick == 0 {
                    Hist {
                        sum_us: p.totals.xact_time_us,
                        buckets: p.xact_hist,
                    }
                } else {
                    Hist {
                        sum_us: p.totals.query_time_us,
                        buckets: p.query_hist,
                    }
                };
                let labels = pool_labels(p);
                h.encode(m.encode_family(&labels)?)?;
            }
        }

        // ---- hosts of database entries with several hosts ----
        let mut up = Vec::new();
        let mut primary = Vec::new();
        let mut lag = Vec::new();
        for (name, set) in crate::server::hosts::all() {
            for h in &set.hosts {
                let (host, port) = match &h.addr {
                    crate::server::ServerAddr::Tcp { host, port } => {
                        (host.clone(), port.to_string())
                    }
                    crate::server::ServerAddr::Unix { path } => {
                        (path.display().to_string(), String::new())
                    }
                };
                let labels: Labels =
                    vec![("database", name.clone()), ("host", host), ("port", port)];
                up.push((labels.clone(), g(u64::from(h.state() == "up"))));
                primary.push((
                    labels.clone(),
                    g(u64::from(h.role() == crate::server::hosts::Role::Primary)),
                ));
                if let Some(l) = h.lag() {
                    lag.push((labels, V::Gauge(l)));
                }
            }
        }
        family(e, "weir_host_up", "Whether a database entry's host is up (1), as health checks and logins last saw it; 0 when down or not seen yet.", None, up)?;
        family(e, "weir_host_is_primary", "Whether a database entry's host was last seen as a primary (1) rather than a standby or unknown (0).", None, primary)?;
        family(
            e,
            "weir_host_replication_lag",
            "How far a standby host's replay is behind, as the last health check saw it.",
            Some(Unit::Seconds),
            lag,
        )?;

        // ---- read/write splitting ----
        let mut routed = Vec::new();
        for (name, entry) in crate::split::all() {
            for (slot, to, class) in [
                (crate::split::READ_STANDBY, "standby", "read"),
                (crate::split::READ_PRIMARY, "primary", "read"),
                (crate::split::WRITE, "primary", "write"),
            ] {
                let n = entry.routed[slot].load(std::sync::atomic::Ordering::Relaxed);
                let labels: Labels = vec![
                    ("database", name.clone()),
                    ("to", to.to_owned()),
                    ("class", class.to_owned()),
                ];
                routed.push((labels, c(n)));
            }
        }
        family(e, "weir_split_requests", "Requests of read_write_split entries by where they were sent (to) and what they were classified as (class): reads to the primary are those with no fit standby, or of a client waiting to read its own write.", None, routed)?;

        // ---- errors ----
        let errors: Vec<(Labels, V)> = stats::error_counts()
            .into_iter()
            .map(|(src, class, n)| {
                let src = match src {
                    ErrorSource::Pooler => "pooler",
                    ErrorSource::Server => "server",
                };
                (vec![("source", src.to_owned()), ("class", class)], c(n))
            })
            .collect();
        family(e, "weir_errors", "Errors sent to clients by SQLSTATE class (first two characters), from Weir itself (pooler) or relayed from a server.", None, errors)?;
        Ok(())
    }
}

/// Resident set size, from /proc/self/statm.
fn resident_bytes() -> Option<u64> {
    let statm = std::fs::read_to_string("/proc/self/statm").ok()?;
    let pages: u64 = statm.split_whitespace().nth(1)?.parse().ok()?;
    // SAFETY: sysconf has no preconditions.
    let page = unsafe { libc::sysconf(libc::_SC_PAGESIZE) };
    Some(pages * page.max(4096) as u64)
}
