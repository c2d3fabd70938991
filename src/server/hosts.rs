//! Several hosts per database entry (`host=a,b,c`): which one a new server connection
//! goes to (`load_balance_hosts`), whether a host that accepted the login will do
//! (`target_session_attrs`), and what Weir last saw of each host (SHOW HOSTS).
//!
//! The state is kept per database entry name, shared by all its pools, and survives
//! reloads that leave the entry's hosts and policies as they were.

use std::collections::HashMap;
use std::sync::atomic::{AtomicBool, AtomicU32, AtomicU64, AtomicU8, AtomicUsize, Ordering};
use std::sync::{Arc, LazyLock, Mutex};

use weir_config::{LoadBalanceHosts, TargetSessionAttrs};

use super::{ConnectError, ServerAddr, ServerConn};
use crate::protocol::PgError;
use crate::registry::now_micros;
use crate::registry::servers::{ServerState, SERVERS};

#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum Role {
    Unknown,
    Primary,
    Standby,
}

impl Role {
    pub fn as_str(self) -> &'static str {
        match self {
            Role::Unknown => "unknown",
            Role::Primary => "primary",
            Role::Standby => "standby",
        }
    }
}

/// What a host turned out to be after a login: its role, and whether its sessions are
/// read-only (a standby, or `default_transaction_read_only=on`).
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub struct Session {
    pub role: Role,
    pub read_only: bool,
}

/// Whether a session fits `target_session_attrs`, as libpq decides it. prefer-standby
/// asks for a standby here; the fallback to any host is the caller's.
pub fn fits(attrs: TargetSessionAttrs, s: Session) -> bool {
    match attrs {
        TargetSessionAttrs::Any => true,
        TargetSessionAttrs::ReadWrite => !s.read_only,
        TargetSessionAttrs::ReadOnly => s.read_only,
        TargetSessionAttrs::Primary => s.role == Role::Primary,
        TargetSessionAttrs::Standby | TargetSessionAttrs::PreferStandby => s.role == Role::Standby,
    }
}

const STATE_UNKNOWN: u8 = 0;
const STATE_UP: u8 = 1;
const STATE_DOWN: u8 = 2;

#[derive(Debug)]
pub struct Host {
    pub addr: ServerAddr,
    role: AtomicU8,
    state: AtomicU8,
    /// The last failure (connect, login, or not fitting), with its time in µs since the
    /// epoch; kept after the host recovers, for SHOW HOSTS.
    last_error: Mutex<Option<(u64, String)>>,
    /// Health checks (see crate::host_check): failures in a row, when the next check is due (µs
    /// since the epoch), whether one is under way, and whether the host is out of the
    /// rotation (tried last by new server connections).
    pub(crate) check_fails: AtomicU32,
    pub(crate) next_check_us: AtomicU64,
    pub(crate) checking: AtomicBool,
    out: AtomicBool,
    /// Replication lag in seconds (f64 bits) as the last check saw it; NO_LAG when the
    /// host is a primary or has not been checked.
    lag: AtomicU64,
    /// Connections to it being opened for the entry, not yet in SERVERS under its name:
    /// counted by least-outstanding, so that a burst of new connections spreads out.
    opening: AtomicUsize,
}

const NO_LAG: u64 = u64::MAX;

impl Host {
    fn new(addr: ServerAddr) -> Host {
        Host {
            addr,
            role: AtomicU8::new(Role::Unknown as u8),
            state: AtomicU8::new(STATE_UNKNOWN),
            last_error: Mutex::new(None),
            check_fails: AtomicU32::new(0),
            next_check_us: AtomicU64::new(0),
            checking: AtomicBool::new(false),
            out: AtomicBool::new(false),
            lag: AtomicU64::new(NO_LAG),
            opening: AtomicUsize::new(0),
        }
    }

    /// Seconds behind the primary's last replayed transaction, for a standby.
    pub fn lag(&self) -> Option<f64> {
        match self.lag.load(Ordering::Relaxed) {
            NO_LAG => None,
            bits => Some(f64::from_bits(bits)),
        }
    }

    /// Whether health checks took the host out of the rotation.
    pub fn out_of_rotation(&self) -> bool {
        self.out.load(Ordering::Relaxed)
    }

    /// A check succeeded: the host is up, back in the rotation, with this role and lag.
    /// Returns the role it had before.
    pub(crate) fn check_ok(&self, role: Role, lag: Option<f64>) -> Role {
        let before = self.role();
        self.check_fails.store(0, Ordering::Relaxed);
        self.out.store(false, Ordering::Relaxed);
        self.lag
            .store(lag.map_or(NO_LAG, f64::to_bits), Ordering::Relaxed);
        self.logged_in(role);
        before
    }

    /// A check's login was refused: the host is there, but the check learnt nothing
    /// else; the failures in a row are not counted.
    pub(crate) fn check_refused(&self, text: String) {
        self.set_error(text);
    }

    /// A check failed; after `threshold` in a row the host is down and out of the
    /// rotation. Returns the failures in a row so far.
    pub(crate) fn check_failed(&self, text: String, threshold: u32) -> u32 {
        let fails = self.check_fails.fetch_add(1, Ordering::Relaxed) + 1;
        self.set_error(text);
        if fails >= threshold.max(1) {
            self.state.store(STATE_DOWN, Ordering::Relaxed);
            self.out.store(true, Ordering::Relaxed);
            self.lag.store(NO_LAG, Ordering::Relaxed);
        }
        fails
    }

    pub fn role(&self) -> Role {
        match self.role.load(Ordering::Relaxed) {
            1 => Role::Primary,
            2 => Role::Standby,
            _ => Role::Unknown,
        }
    }

    /// "up", "down", or "unknown" before the first connection.
    pub fn state(&self) -> &'static str {
        match self.state.load(Ordering::Relaxed) {
            STATE_UP => "up",
            STATE_DOWN => "down",
            _ => "unknown",
        }
    }

    pub fn last_error(&self) -> Option<(u64, String)> {
        self.last_error
            .lock()
            .unwrap_or_else(|p| p.into_inner())
            .clone()
    }

    fn set_error(&self, text: String) {
        *self.last_error.lock().unwrap_or_else(|p| p.into_inner()) = Some((now_micros(), text));
    }

    fn logged_in(&self, role: Role) {
        self.state.store(STATE_UP, Ordering::Relaxed);
        if role != Role::Unknown {
            self.role.store(role as u8, Ordering::Relaxed);
        }
    }

    /// A host that could not be reached is down; one that answered with an error (a
    /// refused login) is up, and the error is remembered.
    fn failed(&self, e: &ConnectError) {
        let reached = matches!(e, ConnectError::Server(_) | ConnectError::Auth(_));
        self.state.store(
            if reached { STATE_UP } else { STATE_DOWN },
            Ordering::Relaxed,
        );
        self.set_error(e.to_string());
    }
}

#[derive(Debug)]
pub struct HostSet {
    /// The database entry's name.
    pub name: Arc<str>,
    pub hosts: Vec<Host>,
    pub balance: LoadBalanceHosts,
    pub attrs: TargetSessionAttrs,
    /// One per host, each at least 1 (Weir's `host_weights`; all 1 when not given).
    pub weights: Vec<u32>,
    /// round-robin: where the next connection starts; disable: the host in use;
    /// least-outstanding: where ties start.
    next: AtomicUsize,
    /// Weighted round-robin: each host's current weight (nginx's smooth weighted
    /// round-robin, which interleaves rather than sending runs to the heavy host).
    current: Mutex<Vec<i64>>,
}

/// Weights as given, or all 1 when the list does not match the hosts.
fn weights_for(n: usize, given: &[u32]) -> Vec<u32> {
    if given.len() == n {
        given.iter().map(|&w| w.max(1)).collect()
    } else {
        vec![1; n]
    }
}

/// Takes one host off a count when dropped: the attempt ended, or was abandoned.
struct Opening<'a>(&'a AtomicUsize);

impl<'a> Opening<'a> {
    fn new(c: &'a AtomicUsize) -> Self {
        c.fetch_add(1, Ordering::Relaxed);
        Opening(c)
    }
}

impl Drop for Opening<'_> {
    fn drop(&mut self) {
        self.0.fetch_sub(1, Ordering::Relaxed);
    }
}

impl HostSet {
    fn new(
        name: &str,
        addrs: Vec<ServerAddr>,
        balance: LoadBalanceHosts,
        attrs: TargetSessionAttrs,
        weights: &[u32],
    ) -> Self {
        let n = addrs.len();
        HostSet {
            name: name.into(),
            hosts: addrs.into_iter().map(Host::new).collect(),
            balance,
            attrs,
            weights: weights_for(n, weights),
            next: AtomicUsize::new(0),
            current: Mutex::new(vec![0; n]),
        }
    }

    fn same_config(
        &self,
        addrs: &[ServerAddr],
        b: LoadBalanceHosts,
        a: TargetSessionAttrs,
        weights: &[u32],
    ) -> bool {
        self.balance == b
            && self.attrs == a
            && self.hosts.len() == addrs.len()
            && self.hosts.iter().zip(addrs).all(|(h, a)| &h.addr == a)
            && self.weights == weights_for(addrs.len(), weights)
    }

    /// Whether two sets send connections to the same places in the same way.
    pub fn same_as(&self, other: &HostSet) -> bool {
        let addrs: Vec<ServerAddr> = other.hosts.iter().map(|h| h.addr.clone()).collect();
        self.same_config(&addrs, other.balance, other.attrs, &other.weights)
    }

    fn weighted(&self) -> bool {
        self.weights.iter().any(|&w| w != self.weights[0])
    }

    /// The hosts to try for one new connection, in order. round-robin starts each
    /// connection one host further (with weights, at the host smooth weighted round-robin
    /// picks); disable (PgBouncer's semantics) stays on the host in use until it fails,
    /// then moves on; least-outstanding (Weir's) starts at the host with the fewest open
    /// server connections of the entry for its weight.
    fn order(&self) -> Vec<usize> {
        let n = self.hosts.len();
        let start = match self.balance {
            LoadBalanceHosts::RoundRobin if self.weighted() => self.smooth_pick(),
            LoadBalanceHosts::RoundRobin | LoadBalanceHosts::LeastOutstanding => {
                self.next.fetch_add(1, Ordering::Relaxed)
            }
            LoadBalanceHosts::Disable => self.next.load(Ordering::Relaxed),
        } % n.max(1);
        let mut order: Vec<usize> = (0..n).map(|i| (start + i) % n).collect();
        if self.balance == LoadBalanceHosts::LeastOutstanding {
            let open = self.open_counts();
            // Fewest per weight first (a/wa < b/wb, without division); the stable sort
            // keeps the rotation among equals, so that ties take turns.
            order.sort_by(|&a, &b| {
                (open[a] * u64::from(self.weights[b])).cmp(&(open[b] * u64::from(self.weights[a])))
            });
        }
        // Hosts the checks took out of the rotation come last: tried only when no other
        // host will do, so that a failed check never leaves the pool with no host at all.
        order.sort_by_key(|&i| self.hosts[i].out_of_rotation());
        order
    }

    /// Smooth weighted round-robin: every host gains its weight, the one with the most
    /// goes first and gives back the total. Over a cycle each host is first exactly
    /// weight times, interleaved (3,1 gives a a b a ...).
    fn smooth_pick(&self) -> usize {
        let mut cur = self.current.lock().unwrap_or_else(|p| p.into_inner());
        let total: i64 = self.weights.iter().map(|&w| i64::from(w)).sum();
        let mut best = 0;
        for (i, c) in cur.iter_mut().enumerate() {
            *c += i64::from(self.weights[i]);
        }
        for i in 1..cur.len() {
            if cur[i] > cur[best] {
                best = i;
            }
        }
        if let Some(c) = cur.get_mut(best) {
            *c -= total;
        }
        best
    }

    /// Open server connections of this entry per host (any state, and those being
    /// opened), as SHOW HOSTS counts them.
    fn open_counts(&self) -> Vec<u64> {
        let mut open: Vec<u64> = self
            .hosts
            .iter()
            .map(|h| h.opening.load(Ordering::Relaxed) as u64)
            .collect();
        SERVERS.for_each(|s| {
            if s.entry() == Some(&*self.name) {
                if let Some(i) = self.hosts.iter().position(|h| h.addr == s.addr) {
                    open[i] += 1;
                }
            }
        });
        open
    }

    /// Whether the hosts are worth checking in the background: several of them, or a
    /// target_session_attrs that depends on their roles.
    pub fn needs_checks(&self) -> bool {
        self.hosts.len() > 1 || self.attrs != TargetSessionAttrs::Any
    }

    /// disable: the host that just worked is the one to stay on.
    fn settle(&self, index: usize) {
        if self.balance == LoadBalanceHosts::Disable {
            self.next.store(index, Ordering::Relaxed);
        }
    }
}

static SETS: LazyLock<Mutex<HashMap<String, Arc<HostSet>>>> =
    LazyLock::new(|| Mutex::new(HashMap::new()));

fn sets() -> std::sync::MutexGuard<'static, HashMap<String, Arc<HostSet>>> {
    SETS.lock().unwrap_or_else(|p| p.into_inner())
}

/// The host set of a database entry: the one already known when its hosts and policies
/// are unchanged (so that the rotation and what SHOW HOSTS knows carry over), else a new one.
pub fn for_database(
    name: &str,
    addrs: Vec<ServerAddr>,
    balance: LoadBalanceHosts,
    attrs: TargetSessionAttrs,
    weights: &[u32],
) -> Arc<HostSet> {
    let mut sets = sets();
    if let Some(s) = sets.get(name) {
        if s.same_config(&addrs, balance, attrs, weights) {
            return s.clone();
        }
    }
    let s = Arc::new(HostSet::new(name, addrs, balance, attrs, weights));
    sets.insert(name.to_owned(), s.clone());
    s
}

/// Every known host set, by database name (SHOW HOSTS).
pub fn all() -> Vec<(String, Arc<HostSet>)> {
    let mut v: Vec<_> = sets().iter().map(|(k, s)| (k.clone(), s.clone())).collect();
    v.sort_by(|a, b| a.0.cmp(&b.0));
    v
}

/// One host of one database entry as SHOW HOSTS and the dashboard show it.
pub struct HostRow {
    pub database: String,
    pub set: Arc<HostSet>,
    pub index: usize,
    /// Its servers for this entry now, lent and idle.
    pub active: u64,
    pub idle: u64,
}

impl HostRow {
    pub fn host(&self) -> &Host {
        &self.set.hosts[self.index]
    }
}

/// Every host of every known entry, by database name then host order, with its servers.
pub fn rows() -> Vec<HostRow> {
    let servers = SERVERS.snapshot();
    let mut rows = Vec::new();
    for (database, set) in all() {
        for (index, h) in set.hosts.iter().enumerate() {
            let (mut active, mut idle) = (0, 0);
            for s in &servers {
                if s.addr == h.addr && s.entry() == Some(&*database) {
                    match s.state() {
                        ServerState::Active => active += 1,
                        ServerState::Idle => idle += 1,
                        ServerState::Login => {}
                    }
                }
            }
            rows.push(HostRow {
                database: database.clone(),
                set: set.clone(),
                index,
                active,
                idle,
            });
        }
    }
    rows
}

/// Forgets the host sets of database entries that are gone.
pub fn retain(keep: impl Fn(&str) -> bool) {
    sets().retain(|name, _| keep(name));
}

/// What the server said of itself at login: PostgreSQL 14+ reports `in_hot_standby` and
/// `default_transaction_read_only`; older ones are asked.
async fn session_of(
    conn: &mut ServerConn,
    timeout: std::time::Duration,
) -> Result<Session, ConnectError> {
    let flag = |v: &str| v.eq_ignore_ascii_case("on");
    if let (Some(hs), Some(ro)) = (
        conn.params.get("in_hot_standby"),
        conn.params.get("default_transaction_read_only"),
    ) {
        let standby = flag(hs);
        return Ok(Session {
            role: if standby {
                Role::Standby
            } else {
                Role::Primary
            },
            read_only: standby || flag(ro),
        });
    }
    let mut rows = Vec::new();
    conn.query_rows(
        "SELECT pg_catalog.pg_is_in_recovery()::text, \
         pg_catalog.current_setting('transaction_read_only')",
        timeout,
        Some(&mut rows),
    )
    .await?;
    let row = rows
        .first()
        .ok_or(ConnectError::Protocol("no row for pg_is_in_recovery()"))?;
    let standby = row.first().cloned().flatten().as_deref() == Some("true");
    let ro = row.get(1).cloned().flatten().is_some_and(|v| flag(&v));
    Ok(Session {
        role: if standby {
            Role::Standby
        } else {
            Role::Primary
        },
        read_only: standby || ro,
    })
}

/// Role as reported without asking (for SHOW HOSTS when no attribute is asked for).
fn reported_role(conn: &ServerConn) -> Role {
    match conn.params.get("in_hot_standby") {
        Some(v) if v.eq_ignore_ascii_case("on") => Role::Standby,
        Some(_) => Role::Primary,
        None => Role::Unknown,
    }
}

/// Opens a server connection to the first host, in the set's order, that accepts the
/// login and fits `target_session_attrs`. `attempt` opens one connection to one address.
pub async fn connect<F, Fut>(
    set: &HostSet,
    attrs: TargetSessionAttrs,
    timeout: std::time::Duration,
    mut attempt: F,
) -> Result<ServerConn, ConnectError>
where
    F: FnMut(&ServerAddr) -> Fut,
    Fut: std::future::Future<Output = Result<ServerConn, ConnectError>>,
{
    let mut last_error = None;
    // prefer-standby: the first primary that accepted, kept in case no standby does.
    let mut fallback: Option<(usize, ServerConn)> = None;
    let mut unfit = Vec::new();
    for i in set.order() {
        let host = &set.hosts[i];
        let opening = Opening::new(&host.opening);
        let attempted = attempt(&host.addr).await;
        let mut conn = match attempted {
            Ok(c) => c,
            Err(e) => {
                tracing::warn!(addr = %host.addr, "server host failed: {e}");
                host.failed(&e);
                last_error = Some(e);
                continue;
            }
        };
        conn.info.0.set_entry(set.name.clone());
        // From here on SERVERS counts it under the entry.
        drop(opening);
        if attrs == TargetSessionAttrs::Any {
            host.logged_in(reported_role(&conn));
            set.settle(i);
            return Ok(conn);
        }
        let session = match session_of(&mut conn, timeout).await {
            Ok(s) => s,
            Err(e) => {
                host.failed(&e);
                last_error = Some(e);
                continue;
            }
        };
        host.logged_in(session.role);
        if fits(attrs, session) {
            set.settle(i);
            if let Some((_, spare)) = fallback {
                tokio::spawn(spare.terminate());
            }
            return Ok(conn);
        }
        let what = match session.role {
            Role::Standby => "server is in hot standby mode",
            _ if session.read_only => "session is read-only",
            _ => "server is not in hot standby mode",
        };
        host.set_error(format!("{what} (target_session_attrs={})", attrs.as_str()));
        unfit.push(host.addr.to_string());
        if attrs == TargetSessionAttrs::PreferStandby && fallback.is_none() {
            fallback = Some((i, conn));
        } else {
            tokio::spawn(conn.terminate());
        }
    }
    if let Some((i, conn)) = fallback {
        set.settle(i);
        return Ok(conn);
    }
    if !unfit.is_empty() {
        return Err(ConnectError::Server(PgError::fatal(
            "08001",
            format!(
                "no server host fits target_session_attrs={} (tried {})",
                attrs.as_str(),
                unfit.join(", ")
            ),
        )));
    }
    Err(last_error.unwrap_or(ConnectError::Protocol("database entry has no host")))
}

#[cfg(test)]
mod tests {
    use super::*;

    fn addr(port: u16) -> ServerAddr {
        ServerAddr::Tcp {
            host: "127.0.0.1".into(),
            port,
        }
    }

    #[test]
    fn round_robin_rotates_and_disable_sticks() {
        let rr = HostSet::new(
            "rr",
            vec![addr(1), addr(2), addr(3)],
            LoadBalanceHosts::RoundRobin,
            TargetSessionAttrs::Any,
            &[],
        );
        assert_eq!(rr.order(), vec![0, 1, 2]);
        assert_eq!(rr.order(), vec![1, 2, 0]);
        assert_eq!(rr.order(), vec![2, 0, 1]);
        let d = HostSet::new(
            "d",
            vec![addr(1), addr(2)],
            LoadBalanceHosts::Disable,
            TargetSessionAttrs::Any,
            &[],
        );
        assert_eq!(d.order(), vec![0, 1]);
        assert_eq!(d.order(), vec![0, 1]);
        d.settle(1);
        assert_eq!(d.order(), vec![1, 0]);
    }

    #[test]
    fn weights_interleave_in_proportion() {
        let w = HostSet::new(
            "w",
            vec![addr(1), addr(2)],
            LoadBalanceHosts::RoundRobin,
            TargetSessionAttrs::Any,
            &[3, 1],
        );
        let firsts: Vec<usize> = (0..8).map(|_| w.order()[0]).collect();
        assert_eq!(firsts, vec![0, 0, 1, 0, 0, 0, 1, 0]);
        assert_eq!(w.order(), vec![0, 1], "the others follow the first");
    }

    #[test]
    fn least_outstanding_goes_to_the_emptiest_host_for_its_weight() {
        let lo = HostSet::new(
            "unit-lo",
            vec![addr(1), addr(2), addr(3)],
            LoadBalanceHosts::LeastOutstanding,
            TargetSessionAttrs::Any,
            &[],
        );
        lo.hosts[0].opening.store(2, Ordering::Relaxed);
        lo.hosts[1].opening.store(1, Ordering::Relaxed);
        lo.hosts[2].opening.store(3, Ordering::Relaxed);
        assert_eq!(lo.order(), vec![1, 0, 2]);
        // Ties take turns.
        lo.hosts[0].opening.store(1, Ordering::Relaxed);
        let a = lo.order()[0];
        let b = lo.order()[0];
        assert!(a != b && a < 2 && b < 2, "{a} {b}");
        // Out of the rotation: last, however empty.
        lo.hosts[2].opening.store(0, Ordering::Relaxed);
        lo.hosts[2].out.store(true, Ordering::Relaxed);
        assert_eq!(lo.order()[2], 2);
        // With weights 4,1: 3 open on the first is still less per weight than 1 on the second.
        let lw = HostSet::new(
            "unit-lw",
            vec![addr(1), addr(2)],
            LoadBalanceHosts::LeastOutstanding,
            TargetSessionAttrs::Any,
            &[4, 1],
        );
        lw.hosts[0].opening.store(3, Ordering::Relaxed);
        lw.hosts[1].opening.store(1, Ordering::Relaxed);
        assert_eq!(lw.order(), vec![0, 1]);
        lw.hosts[0].opening.store(5, Ordering::Relaxed);
        assert_eq!(lw.order(), vec![1, 0]);
    }

    #[test]
    fn session_attrs_as_libpq() {
        let primary = Session {
            role: Role::Primary,
            read_only: false,
        };
        let ro_primary = Session {
            role: Role::Primary,
            read_only: true,
        };
        let standby = Session {
            role: Role::Standby,
            read_only: true,
        };
        use TargetSessionAttrs::*;
        assert!(fits(ReadWrite, primary) && !fits(ReadWrite, ro_primary));
        assert!(!fits(ReadWrite, standby));
        assert!(fits(ReadOnly, ro_primary) && fits(ReadOnly, standby));
        assert!(fits(Primary, ro_primary) && !fits(Primary, standby));
        assert!(fits(Standby, standby) && !fits(Standby, primary));
        assert!(fits(PreferStandby, standby) && !fits(PreferStandby, primary));
        assert!(fits(Any, standby));
    }

    #[test]
    fn unchanged_entry_keeps_its_state() {
        let a = for_database(
            "unit-hosts",
            vec![addr(1), addr(2)],
            LoadBalanceHosts::RoundRobin,
            TargetSessionAttrs::Any,
            &[],
        );
        let b = for_database(
            "unit-hosts",
            vec![addr(1), addr(2)],
            LoadBalanceHosts::RoundRobin,
            TargetSessionAttrs::Any,
            &[],
        );
        assert!(Arc::ptr_eq(&a, &b));
        let c = for_database(
            "unit-hosts",
            vec![addr(1), addr(2)],
            LoadBalanceHosts::Disable,
            TargetSessionAttrs::Any,
            &[],
        );
        assert!(!Arc::ptr_eq(&a, &c));
        let d = for_database(
            "unit-hosts",
            vec![addr(1), addr(2)],
            LoadBalanceHosts::Disable,
            TargetSessionAttrs::Any,
            &[2, 1],
        );
        assert!(!Arc::ptr_eq(&c, &d), "new weights make a new set");
    }
}
