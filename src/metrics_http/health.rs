//! `/readyz`: is this Weir worth sending clients to? Not when it is shutting down, paused
//! or suspended, and not when a configured database cannot be reached.
//!
//! Reachability is tested by opening a connection to the database's server and closing it
//! before any startup packet: PostgreSQL ends such a backend silently (no log line unless
//! log_connections is on), and a refused or timed-out connect is exactly "cannot reach".
//! Results are cached for a moment so that a probe storm cannot become a connect storm.
//! Server logins failing (e.g. a wrong password) are reported but do not make Weir
//! unready: an unready instance gets no clients, so it would never try again.

use std::collections::HashMap;
use std::sync::{LazyLock, Mutex};
use std::time::{Duration, Instant};

use crate::admin::control::{self, Mode};
use crate::app::{self, App};
use crate::server::ServerAddr;

/// How long a probe result stands for /readyz.
pub const READYZ_TTL: Duration = Duration::from_secs(2);
/// How long it stands for the dashboard, which asks every second or two.
pub const DASHBOARD_TTL: Duration = Duration::from_secs(5);
/// The longest a probe may take.
const PROBE_TIMEOUT: Duration = Duration::from_secs(2);

#[derive(Debug, Clone)]
pub struct Probe {
    pub at: Instant,
    pub ok: bool,
    /// How long the connect took, or the error.
    pub latency: Duration,
    pub error: Option<String>,
}

static PROBES: LazyLock<Mutex<HashMap<ServerAddr, Probe>>> =
    LazyLock::new(|| Mutex::new(HashMap::new()));

fn cached(addr: &ServerAddr, ttl: Duration) -> Option<Probe> {
    let probes = PROBES.lock().unwrap_or_else(|p| p.into_inner());
    probes.get(addr).filter(|p| p.at.elapsed() < ttl).cloned()
}

/// The last probe of `addr`, however old.
pub fn last_probe(addr: &ServerAddr) -> Option<Probe> {
    cached(addr, Duration::MAX)
}

async fn connect(addr: &ServerAddr) -> std::io::Result<()> {
    match addr {
        ServerAddr::Tcp { host, port } => {
            tokio::net::TcpStream::connect((host.as_str(), *port)).await?;
        }
        ServerAddr::Unix { path } => {
            tokio::net::UnixStream::connect(path).await?;
        }
    }
    Ok(())
}

/// Probes `addr` unless a result younger than `ttl` is cached.
pub async fn probe(addr: &ServerAddr, ttl: Duration) -> Probe {
    if let Some(p) = cached(addr, ttl) {
        return p;
    }
    let started = Instant::now();
    let result = crate::timers::timeout(PROBE_TIMEOUT, connect(addr)).await;
    let error = match result {
        Ok(Ok(())) => None,
        Ok(Err(e)) => Some(e.to_string()),
        Err(_) => Some(format!("no answer within {PROBE_TIMEOUT:?}")),
    };
    let p = Probe {
        at: Instant::now(),
        ok: error.is_none(),
        latency: started.elapsed(),
        error,
    };
    PROBES
        .lock()
        .unwrap_or_else(|p| p.into_inner())
        .insert(addr.clone(), p.clone());
    p
}

/// A configured database and where its servers are (one per host of the entry).
#[derive(Debug, Clone)]
pub struct Target {
    pub name: String,
    pub addrs: Vec<ServerAddr>,
}

impl Target {
    /// The entry's hosts as an operator wrote them, comma-separated.
    pub fn address(&self) -> String {
        let all: Vec<String> = self.addrs.iter().map(|a| a.to_string()).collect();
        all.join(",")
    }
}

/// The best of a database's hosts' last probes: a reachable one if there is one (the
/// database can be served), else the first failure.
pub fn best_probe(
    addrs: &[ServerAddr],
    probes: impl Fn(&ServerAddr) -> Option<Probe>,
) -> Option<Probe> {
    let all: Vec<Probe> = addrs.iter().filter_map(probes).collect();
    all.iter().find(|p| p.ok).or_else(|| all.first()).cloned()
}

/// Every `[databases]` entry (and the `*` fallback), with its server address.
pub fn targets(app: &App) -> Vec<Target> {
    let snap = app.snapshot.load();
    let mut out: Vec<Target> = snap
        .config
        .databases
        .iter()
        .map(|(name, db)| Target {
            name: name.clone(),
            addrs: app::server_addrs(db),
        })
        .collect();
    if let Some(db) = &snap.config.fallback_database {
        out.push(Target {
            name: "*".into(),
            addrs: app::server_addrs(db),
        });
    }
    out
}

/// Probes every distinct server address at once.
pub async fn probe_all(targets: &[Target], ttl: Duration) -> HashMap<ServerAddr, Probe> {
    let mut addrs: Vec<ServerAddr> = targets.iter().flat_map(|t| t.addrs.clone()).collect();
    addrs.sort_by_key(|a| a.to_string());
    addrs.dedup();
    let handles: Vec<_> = addrs
        .into_iter()
        .map(|a| tokio::spawn(async move { (a.clone(), probe(&a, ttl).await) }))
        .collect();
    let mut out = HashMap::new();
    for h in handles {
        if let Ok((a, p)) = h.await {
            out.insert(a, p);
        }
    }
    out
}

/// Whether Weir is ready, and if not, why (one line per reason).
/// Probe results younger than `ttl` are reused.
pub async fn readiness(app: &App, ttl: Duration) -> Result<String, Vec<String>> {
    let mut reasons = Vec::new();
    if app.shutdown.is_cancelled() || control::shutdown_mode().is_some() {
        reasons.push("shutting down".to_owned());
    }
    match control::mode() {
        Mode::Running => {}
        Mode::Paused => reasons.push("paused (PAUSE)".to_owned()),
        Mode::Suspended => reasons.push("suspended (SUSPEND)".to_owned()),
    }
    let targets = targets(app);
    for t in &targets {
        if control::is_paused(&t.name) {
            reasons.push(format!("database {} is paused", t.name));
        }
    }
    let probes = probe_all(&targets, ttl).await;
    // A database with several hosts is ready when any of them answers: Weir moves to it.
    for t in &targets {
        match best_probe(&t.addrs, |a| probes.get(a).cloned()) {
            Some(p) if p.ok => {}
            Some(_) => {
                for a in &t.addrs {
                    if let Some(p) = probes.get(a).filter(|p| !p.ok) {
                        reasons.push(format!(
                            "database {}: cannot reach {}: {}",
                            t.name,
                            a,
                            p.error.as_deref().unwrap_or("unknown error")
                        ));
                    }
                }
            }
            None => reasons.push(format!("database {}: not probed", t.name)),
        }
    }
    if reasons.is_empty() {
        Ok(format!("ready: {} database(s) reachable\n", targets.len()))
    } else {
        Err(reasons)
    }
}
