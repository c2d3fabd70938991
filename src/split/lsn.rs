//! Read-your-writes: where each host's WAL stands, sampled on demand.
//!
//! A client that committed a write may read on a standby only once that standby has
//! replayed past the commit. The commit's own LSN is not in the protocol, so Weir uses a
//! bound: the primary's WAL insert position sampled after the commit was acknowledged
//! is at or past it. Samples are taken in rounds, each with a number (its epoch) drawn
//! before its queries are sent; a client notes the epoch current when its commit was
//! acknowledged, and only a later round's primary sample bounds its commit.
//!
//! The rounds run only while clients wait on them, over one connection per host kept by
//! the watcher; until a round answers, such a client reads on the primary.

use std::collections::HashMap;
use std::sync::atomic::{AtomicBool, AtomicU64, Ordering};
use std::sync::{Arc, Mutex};
use std::time::Duration;

use tokio::sync::Notify;

use crate::server::hosts::Role;
use crate::server::{ScramCredential, ServerAddr, ServerConn, ServerTarget};

const SQL: &str = "SELECT pg_catalog.pg_is_in_recovery()::text, \
     (CASE WHEN pg_catalog.pg_is_in_recovery() THEN pg_catalog.pg_last_wal_replay_lsn() \
     ELSE pg_catalog.pg_current_wal_insert_lsn() END)::text";

/// The watcher stops (and closes its connections) after this long without demand.
const IDLE_EXIT: Duration = Duration::from_secs(5);
/// At most one round per this long, however many clients ask.
const PACE: Duration = Duration::from_millis(1);
const QUERY_TIMEOUT: Duration = Duration::from_secs(2);

#[derive(Debug, Clone, Copy)]
struct Sample {
    lsn: u64,
    epoch: u64,
    role: Role,
}

#[derive(Debug, Default)]
pub struct Watch {
    epoch: AtomicU64,
    samples: Mutex<HashMap<ServerAddr, Sample>>,
    wake: Notify,
    running: AtomicBool,
}

/// How far the standbys are with a client's write.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum Caught {
    /// Not every standby fit for reads has it (or the bound is not known yet).
    No,
    /// Every fit standby has it; some other standby (down, lagging) may not.
    Fit,
    /// Every standby has it: nothing is left to wait for.
    All,
}

/// What a client that wrote waits for: None when it has nothing to wait for.
#[derive(Debug, Clone, Copy, Default, PartialEq, Eq)]
pub struct Pending {
    /// The round current when the write was acknowledged.
    epoch: u64,
    /// A bound on the commit's LSN, once a later round gave one (0 before).
    lsn: u64,
}

impl Pending {
    /// The bound on the write's LSN, 0 until a round gave one.
    pub fn lsn(&self) -> u64 {
        self.lsn
    }
}

impl Watch {
    /// Called once a client's write transaction is acknowledged.
    pub fn wrote(&self) -> Pending {
        Pending {
            epoch: self.epoch.load(Ordering::SeqCst),
            lsn: 0,
        }
    }

    fn samples(&self) -> std::sync::MutexGuard<'_, HashMap<ServerAddr, Sample>> {
        self.samples.lock().unwrap_or_else(|p| p.into_inner())
    }

    /// Whether the client's write has been replayed: by every standby in `fit` (those
    /// reads may go to now) and by every one in `known` (all the standbys seen). When the
    /// fit ones have not (or it is not known yet), a round is asked for (`start` starts
    /// the watcher if it is not running) and the client reads on the primary meanwhile.
    pub fn caught_up<'a>(
        &self,
        pending: &mut Pending,
        fit: impl Iterator<Item = &'a ServerAddr>,
        known: impl Iterator<Item = &'a ServerAddr>,
        start: impl FnOnce(),
    ) -> Caught {
        let caught = {
            let samples = self.samples();
            if pending.lsn == 0 {
                if let Some(p) = samples
                    .values()
                    .find(|s| s.role == Role::Primary && s.epoch > pending.epoch)
                {
                    pending.lsn = p.lsn.max(1);
                }
            }
            let replayed = |a: &ServerAddr| {
                samples
                    .get(a)
                    .is_some_and(|s| s.role == Role::Standby && s.lsn >= pending.lsn)
            };
            let mut fit = fit;
            if pending.lsn == 0 || !fit.all(replayed) {
                Caught::No
            } else if known.into_iter().all(replayed) {
                Caught::All
            } else {
                Caught::Fit
            }
        };
        if caught == Caught::No {
            self.ask(start);
        }
        caught
    }

    /// Whether the standby at `addr` was last seen past `lsn`.
    pub fn replayed(&self, addr: &ServerAddr, lsn: u64) -> bool {
        self.samples()
            .get(addr)
            .is_some_and(|s| s.role == Role::Standby && s.lsn >= lsn)
    }

    fn ask(&self, start: impl FnOnce()) {
        self.wake.notify_one();
        if !self.running.swap(true, Ordering::AcqRel) {
            start();
        }
    }
}

/// The watcher of one database entry: rounds of samples while clients ask for them.
/// The hosts and the login are read from `pool` at every round, so that a reload that
/// changes them is followed.
pub async fn run(watch: Arc<super::Entry>, pool: std::sync::Weak<dyn super::Upstream>) {
    let w = &watch.lsn;
    let mut conns: HashMap<ServerAddr, ServerConn> = HashMap::new();
    loop {
        if crate::timers::timeout(IDLE_EXIT, w.wake.notified())
            .await
            .is_err()
        {
            w.running.store(false, Ordering::Release);
            break;
        }
        let Some(pool) = pool.upgrade() else {
            w.running.store(false, Ordering::Release);
            break;
        };
        let (target, scram): (ServerTarget, Option<ScramCredential>) = pool.login();
        drop(pool);
        let epoch = w.epoch.fetch_add(1, Ordering::SeqCst) + 1;
        let gone = |a: &ServerAddr| !target.hosts.hosts.iter().any(|h| &h.addr == a);
        w.samples().retain(|a, _| !gone(a));
        conns.retain(|a, _| !gone(a));
        for host in &target.hosts.hosts {
            let addr = &host.addr;
            let conn = match conns.remove(addr) {
                Some(c) => c,
                None => match crate::server::connect_one(
                    &target,
                    addr,
                    target.connect_timeout,
                    scram.clone(),
                )
                .await
                {
                    Ok(c) => c,
                    Err(e) => {
                        tracing::debug!(%addr, "read-your-writes watcher: {e}");
                        w.samples().remove(addr);
                        continue;
                    }
                },
            };
            if let Some((sample, conn)) = sample(conn, epoch).await {
                w.samples().insert(addr.clone(), sample);
                conns.insert(addr.clone(), conn);
            } else {
                w.samples().remove(addr);
            }
        }
        crate::timers::sleep(PACE).await;
    }
    for (_, c) in conns {
        tokio::spawn(c.terminate());
    }
}

async fn sample(mut conn: ServerConn, epoch: u64) -> Option<(Sample, ServerConn)> {
    let mut rows = Vec::new();
    if let Err(e) = conn.query_rows(SQL, QUERY_TIMEOUT, Some(&mut rows)).await {
        tracing::debug!("read-your-writes watcher: {e}");
        tokio::spawn(conn.terminate());
        return None;
    }
    let row = rows.first()?;
    let standby = row.first().cloned().flatten().as_deref() == Some("true");
    let lsn = parse_lsn(row.get(1).cloned().flatten().as_deref()?)?;
    let role = if standby {
        Role::Standby
    } else {
        Role::Primary
    };
    Some((Sample { lsn, epoch, role }, conn))
}

/// `16/B374D848` as one number.
pub fn parse_lsn(s: &str) -> Option<u64> {
    let (hi, lo) = s.split_once('/')?;
    let hi = u64::from_str_radix(hi, 16).ok()?;
    let lo = u64::from_str_radix(lo, 16).ok()?;
    (hi <= u32::MAX as u64 && lo <= u32::MAX as u64).then_some((hi << 32) | lo)
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn lsns_compare_as_numbers() {
        assert_eq!(parse_lsn("0/0"), Some(0));
        assert_eq!(parse_lsn("16/B374D848"), Some(0x16_B374_D848));
        assert!(parse_lsn("1/FFFFFFFF") < parse_lsn("2/0"));
        assert_eq!(parse_lsn("x"), None);
        assert_eq!(parse_lsn("1/"), None);
    }

    #[test]
    fn only_a_later_rounds_primary_bounds_the_write() {
        let w = Watch::default();
        let p = ServerAddr::Tcp {
            host: "p".into(),
            port: 1,
        };
        let s = ServerAddr::Tcp {
            host: "s".into(),
            port: 2,
        };
        let put = |addr: &ServerAddr, lsn, epoch, role| {
            w.samples()
                .insert(addr.clone(), Sample { lsn, epoch, role });
        };
        put(&p, 100, 0, Role::Primary);
        put(&s, 100, 0, Role::Standby);
        w.running.store(true, Ordering::Relaxed);
        let other = ServerAddr::Tcp {
            host: "o".into(),
            port: 3,
        };
        let mut pending = w.wrote();
        let check = |pending: &mut Pending| {
            w.caught_up(pending, [&s].into_iter(), [&s, &other].into_iter(), || {})
        };
        assert_eq!(check(&mut pending), Caught::No);
        // The round after the write: the primary is at 150, the standby at 120.
        let epoch = w.epoch.fetch_add(1, Ordering::SeqCst) + 1;
        put(&p, 150, epoch, Role::Primary);
        put(&s, 120, epoch, Role::Standby);
        assert_eq!(check(&mut pending), Caught::No);
        assert_eq!(pending.lsn, 150);
        put(&s, 150, epoch + 1, Role::Standby);
        // The fit standby has it; the other (not fit now) has not been seen.
        assert_eq!(check(&mut pending), Caught::Fit);
        assert!(w.replayed(&s, 150) && !w.replayed(&other, 150));
        put(&other, 160, epoch + 1, Role::Standby);
        assert_eq!(check(&mut pending), Caught::All);
    }
}
