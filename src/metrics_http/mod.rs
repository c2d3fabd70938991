//! Weir's built-in HTTP endpoint, off unless `http_listen = host:port` is set (a Weir
//! option, not a PgBouncer one):
//!
//! * `/metrics`: Prometheus/OpenMetrics text (pools, clients and servers by state,
//!   traffic counters, latency histograms, errors by SQLSTATE class, TLS connections,
//!   reloads, process);
//! * `/healthz`: 200 while the process runs;
//! * `/readyz`: 200 when Weir takes clients and reaches its databases, else 503 and why;
//! * `/`: a live dashboard (HTML, CSS and JS embedded in the binary, no external assets),
//!   fed by `/api/stats`, which also returns up to ten minutes of per-second history.
//!
//! It reads the same shared state as the admin console and adds nothing to the data path
//! but the latency histograms and error counters in `stats`. There is no authentication:
//! bind it to a private address.

mod health;
mod history;
mod live;
mod prom;

use std::convert::Infallible;
use std::net::{SocketAddr, ToSocketAddrs};
use std::sync::{Arc, Mutex};
use std::time::{Duration, Instant};

use bytes::Bytes;
use http_body_util::Full;
use hyper::body::Incoming;
use hyper::header::{CACHE_CONTROL, CONTENT_TYPE};
use hyper::{Method, Request, Response, StatusCode};
use hyper_util::rt::{TokioIo, TokioTimer};
use serde_json::{json, Value};
use tokio::sync::Semaphore;
use weir_config::General;

use crate::admin::control;
use crate::app::App;
use crate::registry::now_micros;
use crate::stats;
use history::History;

const DASHBOARD_HTML: &str = include_str!("dashboard.html");
const DASHBOARD_CSS: &str = include_str!("dashboard.css");
const DASHBOARD_JS: &str = include_str!("dashboard.js");

/// At most this many HTTP connections are served at once; more wait to be accepted.
const MAX_CONNECTIONS: usize = 64;

/// Parses `http_listen`: `host:port`, `[v6]:port`, or `*:port` / `:port` for all addresses.
pub fn parse_listen(spec: &str) -> Result<Vec<SocketAddr>, String> {
    let spec = spec.trim();
    let bad = || format!("invalid http_listen '{spec}': expected host:port");
    let (host, port) = spec.rsplit_once(':').ok_or_else(bad)?;
    let port: u16 = port.parse().map_err(|_| bad())?;
    let host = host.trim_start_matches('[').trim_end_matches(']');
    let host = if host.is_empty() || host == "*" {
        "0.0.0.0"
    } else {
        host
    };
    let addrs: Vec<SocketAddr> = (host, port)
        .to_socket_addrs()
        .map_err(|e| format!("invalid http_listen '{spec}': {e}"))?
        .collect();
    if addrs.is_empty() {
        return Err(bad());
    }
    Ok(addrs)
}

/// Binds the HTTP listener if `http_listen` is set: done early, before daemonizing, so
/// that a bad address or a port in use is reported on the terminal.
pub fn bind(g: &General) -> Result<Option<std::net::TcpListener>, String> {
    let Some(spec) = g.http_listen.as_deref().filter(|s| !s.trim().is_empty()) else {
        return Ok(None);
    };
    let addrs = parse_listen(spec)?;
    let l = std::net::TcpListener::bind(&addrs[..])
        .map_err(|e| format!("cannot listen on http_listen {spec}: {e}"))?;
    l.set_nonblocking(true)
        .map_err(|e| format!("http_listen {spec}: {e}"))?;
    Ok(Some(l))
}

struct State {
    app: Arc<App>,
    started: Instant,
    start_time_secs: f64,
    history: Mutex<History>,
}

impl State {
    fn live(&self) -> live::Live {
        live::read(&self.app, self.started, self.start_time_secs)
    }

    fn history(&self) -> std::sync::MutexGuard<'_, History> {
        self.history.lock().unwrap_or_else(|p| p.into_inner())
    }
}

/// Serves the endpoint on `listener` and starts the once-a-second sampler.
pub fn start(app: &Arc<App>, listener: std::net::TcpListener) -> Result<(), String> {
    let listener = tokio::net::TcpListener::from_std(listener).map_err(|e| e.to_string())?;
    stats::KEEP_RECENT_ERRORS.store(true, std::sync::atomic::Ordering::Relaxed);
    let state = Arc::new(State {
        app: app.clone(),
        started: Instant::now(),
        start_time_secs: now_micros() as f64 / 1e6,
        history: Mutex::new(History::default()),
    });
    if let Ok(a) = listener.local_addr() {
        tracing::info!("HTTP metrics and dashboard on http://{a}/");
    }
    let _ = STATE.set(state.clone());
    tokio::spawn(sample(state.clone()));
    tokio::spawn(accept(state, listener));
    Ok(())
}

async fn sample(state: Arc<State>) {
    let mut tick = crate::timers::interval(
        Duration::from_secs(1),
        crate::timers::MissedTickBehavior::Skip,
    );
    loop {
        tick.tick().await;
        let live = state.live();
        let errors: u64 = stats::error_counts().iter().map(|(_, _, n)| n).sum();
        state.history().record(&live, now_micros() / 1000, errors);
    }
}

/// The endpoint's state, for serving it again on the same socket (`resume`).
static STATE: std::sync::OnceLock<Arc<State>> = std::sync::OnceLock::new();

/// Serves the endpoint again on `listener` (an online restart whose new process died).
pub fn resume(listener: std::net::TcpListener) {
    let Some(state) = STATE.get().cloned() else {
        return;
    };
    crate::workers::spawn_background(async move {
        match tokio::net::TcpListener::from_std(listener) {
            Ok(l) => accept(state, l).await,
            Err(e) => tracing::error!("cannot serve http_listen again: {e}"),
        }
    });
}

async fn accept(state: Arc<State>, listener: tokio::net::TcpListener) {
    let stop = crate::listener::stop_token();
    let slots = Arc::new(Semaphore::new(MAX_CONNECTIONS));
    loop {
        let Ok(permit) = slots.clone().acquire_owned().await else {
            return;
        };
        // An online restart gives the socket to the new process.
        let accepted = tokio::select! {
            _ = stop.cancelled() => return,
            r = listener.accept() => r,
        };
        let (stream, _) = match accepted {
            Ok(s) => s,
            Err(e) => {
                tracing::debug!("http accept: {e}");
                crate::timers::sleep(Duration::from_millis(50)).await;
                continue;
            }
        };
        let state = state.clone();
        tokio::spawn(async move {
            let service = hyper::service::service_fn(move |req| {
                let state = state.clone();
                async move { Ok::<_, Infallible>(route(&state, req).await) }
            });
            let conn = hyper::server::conn::http1::Builder::new()
                .timer(TokioTimer::new())
                .header_read_timeout(Duration::from_secs(10))
                .serve_connection(TokioIo::new(stream), service);
            if let Err(e) = conn.await {
                tracing::debug!("http connection: {e}");
            }
            drop(permit);
        });
    }
}

fn respond(
    status: StatusCode,
    content_type: &str,
    body: impl Into<Bytes>,
) -> Response<Full<Bytes>> {
    let mut r = Response::new(Full::new(body.into()));
    *r.status_mut() = status;
    let h = r.headers_mut();
    if let Ok(v) = content_type.parse() {
        h.insert(CONTENT_TYPE, v);
    }
    h.insert(
        CACHE_CONTROL,
        hyper::header::HeaderValue::from_static("no-store"),
    );
    r
}

const TEXT: &str = "text/plain; charset=utf-8";

async fn route(state: &State, req: Request<Incoming>) -> Response<Full<Bytes>> {
    if req.method() != Method::GET && req.method() != Method::HEAD {
        return respond(StatusCode::METHOD_NOT_ALLOWED, TEXT, "only GET\n");
    }
    match req.uri().path() {
        "/metrics" => respond(
            StatusCode::OK,
            prom::CONTENT_TYPE,
            prom::encode(state.live()),
        ),
        "/healthz" => respond(StatusCode::OK, TEXT, "ok\n"),
        "/readyz" => match health::readiness(&state.app, health::READYZ_TTL).await {
            Ok(msg) => respond(StatusCode::OK, TEXT, msg),
            Err(reasons) => respond(
                StatusCode::SERVICE_UNAVAILABLE,
                TEXT,
                format!("not ready:\n{}\n", reasons.join("\n")),
            ),
        },
        "/api/stats" => {
            let since = req
                .uri()
                .query()
                .unwrap_or("")
                .split('&')
                .find_map(|kv| kv.strip_prefix("since="))
                .and_then(|v| v.parse().ok())
                .unwrap_or(0);
            let body = api_stats(state, since).await.to_string();
            respond(StatusCode::OK, "application/json", body)
        }
        "/" | "/index.html" => respond(StatusCode::OK, "text/html; charset=utf-8", DASHBOARD_HTML),
        "/dashboard.css" => respond(StatusCode::OK, "text/css; charset=utf-8", DASHBOARD_CSS),
        "/dashboard.js" => respond(
            StatusCode::OK,
            "text/javascript; charset=utf-8",
            DASHBOARD_JS,
        ),
        _ => respond(StatusCode::NOT_FOUND, TEXT, "not found\n"),
    }
}

fn round3(v: f64) -> f64 {
    (v * 1000.0).round() / 1000.0
}

/// Everything the dashboard shows: current figures, the pools, server health, errors and
/// the history samples newer than `since_ms`.
async fn api_stats(state: &State, since_ms: u64) -> Value {
    let live = state.live();
    let ready = health::readiness(&state.app, health::DASHBOARD_TTL).await;
    let totals = live.totals();
    let (history, last, pools) = {
        let h = state.history();
        let pools: Vec<Value> = live
            .pools
            .iter()
            .map(|p| {
                let r = h.pool_rates(&p.database, &p.user);
                json!({
                    "database": p.database,
                    "user": p.user,
                    "pool_mode": p.pool_mode,
                    "pool_size": p.pool_size,
                    "cl_active": p.cl_active,
                    "cl_waiting": p.cl_waiting,
                    "sv_active": p.sv_active,
                    "sv_idle": p.sv_idle,
                    "sv_login": p.sv_login,
                    "max_wait_ms": round3(p.max_wait_us as f64 / 1000.0),
                    "tps": round3(r.tps),
                    "qps": round3(r.qps),
                    "xact_avg_ms": round3(r.xact_avg_ms),
                    "wait_avg_ms": round3(r.wait_avg_ms),
                    "xacts": p.totals.xacts,
                    "queries": p.totals.queries,
                    "login_error": p.login_failure.as_ref().map(|(ago, msg)| json!({"ago_s": round3(*ago), "message": msg})),
                })
            })
            .collect();
        (h.since(since_ms), h.current(), pools)
    };

    let targets = health::targets(&state.app);
    let databases: Vec<Value> = targets
        .iter()
        .map(|t| {
            let probe = health::best_probe(&t.addrs, health::last_probe);
            let pools: Vec<_> = live.pools.iter().filter(|p| p.database == t.name).collect();
            let login_error = pools
                .iter()
                .filter_map(|p| p.login_failure.as_ref())
                .map(|(_, m)| m.clone())
                .next();
            json!({
                "name": t.name,
                "address": t.address(),
                "reachable": probe.as_ref().map(|p| p.ok),
                "probe_ms": probe.as_ref().map(|p| round3(p.latency.as_secs_f64() * 1000.0)),
                "checked_ago_s": probe.as_ref().map(|p| round3(p.at.elapsed().as_secs_f64())),
                "probe_error": probe.and_then(|p| p.error),
                "sv_active": pools.iter().map(|p| p.sv_active).sum::<u64>(),
                "sv_idle": pools.iter().map(|p| p.sv_idle).sum::<u64>(),
                "sv_login": pools.iter().map(|p| p.sv_login).sum::<u64>(),
                "paused": control::is_paused(&t.name),
                "disabled": control::is_disabled(&t.name),
                "login_error": login_error,
            })
        })
        .collect();

    // The same rows as SHOW HOSTS.
    let hosts: Vec<Value> = crate::app::host_rows(&state.app)
        .iter()
        .map(|row| {
            let h = row.host();
            let (host, port) = match &h.addr {
                crate::server::ServerAddr::Tcp { host, port } => (host.clone(), Some(*port)),
                crate::server::ServerAddr::Unix { path } => (path.display().to_string(), None),
            };
            json!({
                "database": row.database,
                "host": host,
                "port": port,
                "role": h.role().as_str(),
                "state": h.state(),
                "lag_s": h.lag().map(round3),
                "in_rotation": !h.out_of_rotation(),
                "weight": row.set.weights.get(row.index),
                "active": row.active,
                "idle": row.idle,
                "last_error": h.last_error().map(|(_, e)| e),
            })
        })
        .collect();

    let by_class: Vec<Value> = stats::error_counts()
        .into_iter()
        .map(|(src, class, n)| {
            json!({
                "source": match src { stats::ErrorSource::Pooler => "pooler", stats::ErrorSource::Server => "server" },
                "class": class,
                "count": n,
            })
        })
        .collect();
    let recent: Vec<Value> = stats::recent_errors()
        .into_iter()
        .rev()
        .map(|e| {
            json!({
                "t": e.at_micros / 1000,
                "source": match e.source { stats::ErrorSource::Pooler => "pooler", stats::ErrorSource::Server => "server" },
                "severity": e.severity,
                "code": e.code,
                "message": e.message,
                "database": e.database,
            })
        })
        .collect();
    let (reloads_ok, reloads_failed, last_reload) = stats::reloads();
    let mode = match control::mode() {
        control::Mode::Running => "running",
        control::Mode::Paused => "paused",
        control::Mode::Suspended => "suspended",
    };

    json!({
        "now": now_micros() / 1000,
        "version": env!("CARGO_PKG_VERSION"),
        "uptime_s": round3(live.uptime_secs),
        "mode": mode,
        "ready": ready.is_ok(),
        "ready_reasons": ready.err().unwrap_or_default(),
        "process": {
            "client_connections": live.client_connections,
            "max_client_conn": live.max_client_conn,
            "reloads_ok": reloads_ok,
            "reloads_failed": reloads_failed,
            "last_reload": if last_reload > 0 { json!(last_reload / 1000) } else { Value::Null },
        },
        "clients": {
            "active": live.clients_active,
            "waiting": live.clients_waiting,
            "idle": live.clients_idle,
            "login": live.clients_login,
        },
        "servers": {
            "active": live.servers_active,
            "idle": live.servers_idle,
            "login": live.servers_login,
        },
        "totals": {
            "xacts": totals.xacts,
            "queries": totals.queries,
            "received": totals.received,
            "sent": totals.sent,
            "errors": by_class.iter().filter_map(|v| v["count"].as_u64()).sum::<u64>(),
        },
        "current": {
            "window_s": round3(last.window_s),
            "tps": round3(last.rates.tps),
            "qps": round3(last.rates.qps),
            "xact_avg_ms": round3(last.rates.xact_avg_ms),
            "xact_p99_ms": round3(last.xact_p99_ms),
            "wait_avg_ms": round3(last.rates.wait_avg_ms),
            "max_wait_ms": round3(live.pools.iter().map(|p| p.max_wait_us).max().unwrap_or(0) as f64 / 1000.0),
        },
        "pools": pools,
        "databases": databases,
        "hosts": hosts,
        "errors": { "by_class": by_class, "recent": recent },
        "history": history,
    })
}
