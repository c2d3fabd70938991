//! Read/write splitting (`read_write_split=1` in a database entry, pooled modes): each
//! request is classified when the client asks for a server (`verdicts`, with
//! PostgreSQL's own parser), and a read outside a write transaction goes to the entry's
//! pool of reads, whose servers are on standbys; anything else to the primary.
//!
//! A read stays on the primary when no standby is fit for reads (up, in the rotation,
//! within max_replica_lag), and, for a client that just committed a write, until the
//! standbys have replayed it (`lsn`).

pub mod classify;
pub mod functions;
pub mod lsn;
pub mod verdicts;

use std::collections::HashMap;
use std::sync::atomic::{AtomicBool, AtomicU64, Ordering};
use std::sync::{Arc, LazyLock, Mutex, Weak};
use std::time::Duration;

pub use classify::Class;

use crate::registry::now_micros;
use crate::server::hosts::{Host, HostSet, Role};
use crate::server::{ScramCredential, ServerTarget};

/// How to log in to the entry's servers, asked again at each use so that a reload is
/// followed: the pool that owns the entry answers (it sits above routing, so it is
/// passed in rather than named).
pub trait Upstream: Send + Sync {
    /// Where the servers are and how to log in, with the SCRAM keys a client's login
    /// left (auth_query and SCRAM pass-through give no password to log in with).
    fn login(&self) -> (ServerTarget, Option<ScramCredential>);
}

/// The function list is read again when a read calls functions and it is older than
/// this (a function created or made VOLATILE since).
const FUNCTIONS_REFRESH: Duration = Duration::from_secs(60);

/// What routing knows of one split database entry; kept across reloads.
#[derive(Debug)]
pub struct Entry {
    pub name: Arc<str>,
    pub functions: functions::SafeFunctions,
    /// When the function list was last asked for (µs since the epoch; 0: never).
    functions_at: AtomicU64,
    loading: AtomicBool,
    /// max_replica_lag in ms; 0: no limit.
    max_lag_ms: AtomicU64,
    pub lsn: lsn::Watch,
    /// Requests routed: reads to a standby, reads to the primary, writes (/metrics).
    pub routed: [AtomicU64; 3],
}

/// `Entry::routed`'s slots.
pub const READ_STANDBY: usize = 0;
pub const READ_PRIMARY: usize = 1;
pub const WRITE: usize = 2;

static ENTRIES: LazyLock<Mutex<HashMap<String, Arc<Entry>>>> =
    LazyLock::new(|| Mutex::new(HashMap::new()));

/// The routing state of a split entry, created on first use.
pub fn entry(name: &str, max_lag: Duration) -> Arc<Entry> {
    let mut map = ENTRIES.lock().unwrap_or_else(|p| p.into_inner());
    let e = map
        .entry(name.to_owned())
        .or_insert_with(|| {
            Arc::new(Entry {
                name: name.into(),
                functions: Default::default(),
                functions_at: AtomicU64::new(0),
                loading: AtomicBool::new(false),
                max_lag_ms: AtomicU64::new(0),
                lsn: Default::default(),
                routed: Default::default(),
            })
        })
        .clone();
    e.max_lag_ms
        .store(max_lag.as_millis() as u64, Ordering::Relaxed);
    e
}

/// Every split entry, by name (/metrics).
pub fn all() -> Vec<(String, Arc<Entry>)> {
    let mut v: Vec<_> = ENTRIES
        .lock()
        .unwrap_or_else(|p| p.into_inner())
        .iter()
        .map(|(k, e)| (k.clone(), e.clone()))
        .collect();
    v.sort_by(|a, b| a.0.cmp(&b.0));
    v
}

/// Where a request goes.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum Route {
    Primary,
    Standby,
}

impl Entry {
    pub fn max_lag(&self) -> Option<Duration> {
        match self.max_lag_ms.load(Ordering::Relaxed) {
            0 => None,
            ms => Some(Duration::from_millis(ms)),
        }
    }

    /// A standby reads may go to: up, in the rotation, known to be a standby, and within
    /// max_replica_lag.
    pub fn fit_for_reads(&self, h: &Host) -> bool {
        h.role() == Role::Standby
            && h.state() == "up"
            && !h.out_of_rotation()
            && match (self.max_lag(), h.lag()) {
                (Some(max), Some(lag)) => lag <= max.as_secs_f64(),
                _ => true,
            }
    }

    /// The class of a request whose verdicts were `class` with `calls`: a read calling a
    /// function not known to be read-only is a write. A function not known asks for the
    /// database's list (again, if it was read long enough ago).
    pub fn read_or_write<P: Upstream>(&self, calls: &[Box<str>], pool: &Arc<P>) -> Class {
        let at = self.functions_at.load(Ordering::Relaxed);
        if !calls.is_empty()
            && (at == 0 || now_micros().saturating_sub(at) > FUNCTIONS_REFRESH.as_micros() as u64)
        {
            self.load_functions(pool);
        }
        if self.functions.all_safe(calls) {
            Class::Read
        } else {
            Class::Write
        }
    }

    fn load_functions<P: Upstream>(&self, pool: &Arc<P>) {
        if self.loading.swap(true, Ordering::AcqRel) {
            return;
        }
        self.functions_at.store(now_micros(), Ordering::Relaxed);
        let (target, scram) = pool.login();
        let Some(me) = entries_get(&self.name) else {
            self.loading.store(false, Ordering::Release);
            return;
        };
        tokio::spawn(async move {
            match read_functions(&target, scram).await {
                Ok(names) => {
                    tracing::debug!(database = %me.name, "read_write_split: {} read-only function names", names.len());
                    me.functions.learn(names);
                }
                Err(e) => {
                    tracing::warn!(database = %me.name, "read_write_split: could not read the function list: {e}");
                }
            }
            me.loading.store(false, Ordering::Release);
        });
    }

    /// Where a request of class `class` goes, for a client that may be waiting to read
    /// its own write (`pending`, cleared once every standby has it); counted in `routed`.
    /// Only reads go to a standby: a request of SET, RESET, DISCARD and the like alone
    /// goes to the primary (SET SESSION AUTHORIZATION pins the client where it runs).
    pub fn route<P: Upstream + 'static>(
        self: &Arc<Self>,
        class: Class,
        set: &HostSet,
        pending: &mut Option<lsn::Pending>,
        pool: &Arc<P>,
    ) -> Route {
        let route = match class {
            Class::Read => self.read_route(set, pending, pool),
            Class::Write | Class::Neutral => Route::Primary,
        };
        let slot = match (class, route) {
            (Class::Write, _) => WRITE,
            (_, Route::Standby) => READ_STANDBY,
            (_, Route::Primary) => READ_PRIMARY,
        };
        self.routed[slot].fetch_add(1, Ordering::Relaxed);
        route
    }

    fn read_route<P: Upstream + 'static>(
        self: &Arc<Self>,
        set: &HostSet,
        pending: &mut Option<lsn::Pending>,
        pool: &Arc<P>,
    ) -> Route {
        let fit = || set.hosts.iter().filter(|h| self.fit_for_reads(h));
        if fit().next().is_none() {
            return Route::Primary;
        }
        let Some(p) = pending.as_mut() else {
            return Route::Standby;
        };
        let known = set.hosts.iter().filter(|h| h.role() == Role::Standby);
        let start = || {
            let upstream: Weak<dyn Upstream> = Arc::downgrade(pool) as Weak<P>;
            tokio::spawn(lsn::run(self.clone(), upstream));
        };
        match self
            .lsn
            .caught_up(p, fit().map(|h| &h.addr), known.map(|h| &h.addr), start)
        {
            lsn::Caught::No => Route::Primary,
            lsn::Caught::Fit => Route::Standby,
            lsn::Caught::All => {
                *pending = None;
                Route::Standby
            }
        }
    }

    /// Whether a server of the pool of reads, on `addr`, may serve a read now: its host
    /// is still a fit standby, and has replayed the client's write (`lsn`, 0 for none).
    /// Ok(false): the host is fine but behind this client.
    pub fn lends(
        &self,
        set: &HostSet,
        addr: &crate::server::ServerAddr,
        lsn: u64,
    ) -> Result<bool, ()> {
        let host = set.hosts.iter().find(|h| &h.addr == addr).ok_or(())?;
        if !self.fit_for_reads(host) {
            return Err(());
        }
        Ok(lsn == 0 || self.lsn.replayed(addr, lsn))
    }
}

fn entries_get(name: &str) -> Option<Arc<Entry>> {
    ENTRIES
        .lock()
        .unwrap_or_else(|p| p.into_inner())
        .get(name)
        .cloned()
}

/// Forgets the entries that are gone from the configuration.
pub fn retain(keep: impl Fn(&str) -> bool) {
    ENTRIES
        .lock()
        .unwrap_or_else(|p| p.into_inner())
        .retain(|name, _| keep(name));
}

async fn read_functions(
    target: &crate::server::ServerTarget,
    scram: Option<crate::server::ScramCredential>,
) -> Result<Vec<(String, bool, bool)>, crate::server::ConnectError> {
    let mut conn = crate::server::connect(target, scram).await?;
    let mut rows = Vec::new();
    let r = conn
        .query_rows(
            functions::CATALOG_SQL,
            Duration::from_secs(10),
            Some(&mut rows),
        )
        .await;
    tokio::spawn(conn.terminate());
    r?;
    Ok(rows
        .into_iter()
        .filter_map(|r| {
            let mut r = r.into_iter();
            let name = r.next().flatten()?;
            let safe = r.next().flatten().as_deref() == Some("true");
            let builtin = r.next().flatten().as_deref() == Some("true");
            Some((name, safe, builtin))
        })
        .collect())
}
