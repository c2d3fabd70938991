//! Health checks of the hosts of database entries with several hosts (or with
//! target_session_attrs): one short login per host every `host_check_interval`, asking
//! its role and replication lag. A host that fails `host_failure_threshold` checks in a
//! row is down and leaves the rotation, and is checked again with a capped exponential
//! backoff until a check succeeds. The checks run beside the pools: lending a server
//! reads only the hosts' atomics.

use std::collections::HashMap;
use std::sync::atomic::Ordering;
use std::sync::Arc;
use std::time::Duration;

use weir_config::TargetSessionAttrs;

use crate::app::App;
use crate::pool::Pool;
use crate::registry::now_micros;
use crate::server::hosts::{HostSet, Role, Session};
use crate::server::{ScramCredential, ServerTarget};

/// How often the scheduler looks for checks that are due.
const TICK: Duration = Duration::from_millis(100);

/// Role, read-only-ness and lag in one round trip. The lag is zero while the standby has replayed all it
/// received (an idle primary sends nothing, and now() - last replay would grow forever).
const CHECK_SQL: &str = "SELECT pg_catalog.pg_is_in_recovery()::text, \
     CASE WHEN NOT pg_catalog.pg_is_in_recovery() THEN NULL \
     WHEN pg_catalog.pg_last_wal_receive_lsn() = pg_catalog.pg_last_wal_replay_lsn() THEN 0 \
     ELSE extract(epoch FROM now() - pg_catalog.pg_last_xact_replay_timestamp()) END, \
     pg_catalog.current_setting('transaction_read_only')";

#[derive(Debug, Clone, Copy)]
struct Policy {
    interval: Duration,
    timeout: Duration,
    threshold: u32,
}

impl Policy {
    /// When the next check is due after `fails` failures in a row: the interval, then
    /// doubling past the threshold, at most 16 intervals (and a minute, unless the
    /// interval itself is longer).
    fn delay(&self, fails: u32) -> Duration {
        let over = fails.saturating_sub(self.threshold.max(1) - 1).min(4);
        let d = self.interval * (1u32 << over);
        d.min(Duration::from_secs(60).max(self.interval))
    }
}

pub fn start(app: &Arc<App>) {
    let app = app.clone();
    tokio::spawn(async move {
        let mut tick = crate::timers::interval(TICK, crate::timers::MissedTickBehavior::Skip);
        loop {
            tick.tick().await;
            schedule(&app);
        }
    });
}

/// Starts the checks that are due.
fn schedule(app: &App) {
    let policy = {
        let snap = app.snapshot.load();
        let g = &snap.config.general;
        Policy {
            interval: g.host_check_interval,
            timeout: g.host_check_timeout,
            threshold: g.host_failure_threshold,
        }
    };
    if policy.interval.is_zero() {
        return;
    }
    let now = now_micros();
    // Most ticks find nothing due: the pools are only gone through when something is.
    let sets: Vec<_> = crate::server::hosts::all()
        .into_iter()
        .filter(|(_, s)| {
            s.needs_checks()
                && s.hosts.iter().any(|h| {
                    h.next_check_us.load(Ordering::Relaxed) <= now
                        && !h.checking.load(Ordering::Relaxed)
                })
        })
        .collect();
    if sets.is_empty() {
        return;
    }
    // The pools of each host set, in one pass over the pools.
    let mut by_set: HashMap<*const HostSet, Vec<Arc<Pool>>> = HashMap::new();
    for p in app.all_pools_with_readers() {
        let key = Arc::as_ptr(&p.settings().target.hosts);
        by_set.entry(key).or_default().push(p);
    }
    for (_, set) in sets {
        // The checks log in as one of the entry's pools does; an entry no client has used
        // yet has no pool, and nothing to check for.
        let mine = by_set.remove(&Arc::as_ptr(&set)).unwrap_or_default();
        let Some(first) = mine.iter().find(|p| !p.reads) else {
            continue;
        };
        let (target, scram) = (first.settings().target.clone(), first.scram_keys());
        let mine = Arc::new(mine);
        for i in 0..set.hosts.len() {
            let h = &set.hosts[i];
            if h.next_check_us.load(Ordering::Relaxed) > now
                || h.checking.swap(true, Ordering::AcqRel)
            {
                continue;
            }
            tokio::spawn(check(
                set.clone(),
                i,
                mine.clone(),
                target.clone(),
                scram.clone(),
                policy,
            ));
        }
    }
}

async fn check(
    set: Arc<HostSet>,
    index: usize,
    pools: Arc<Vec<Arc<Pool>>>,
    target: ServerTarget,
    scram: Option<ScramCredential>,
    policy: Policy,
) {
    let host = &set.hosts[index];
    let result = probe(&target, &host.addr, scram, policy.timeout).await;
    let delay = match result {
        Ok((session, lag)) => {
            let role = session.role;
            let before = host.check_ok(role, lag);
            if before != role && before != Role::Unknown {
                tracing::warn!(database = %set.name, addr = %host.addr, "host role changed from {} to {}", before.as_str(), role.as_str());
            }
            sweep(&host.addr, session, lag, &pools);
            policy.interval
        }
        // Refused credentials (say a pool whose password is learnt from its clients and
        // not known yet): the host answered, so this says nothing of its health.
        Err(e) if refused_login(&e) => {
            host.check_refused(format!("health check: {e}"));
            policy.interval
        }
        Err(e) => {
            let fails = host.check_failed(format!("health check: {e}"), policy.threshold);
            if fails == policy.threshold.max(1) {
                tracing::warn!(database = %set.name, addr = %host.addr, "host down after {fails} failed checks: {e}");
            }
            policy.delay(fails)
        }
    };
    let next = now_micros() + u64::try_from(delay.as_micros()).unwrap_or(u64::MAX / 2);
    host.next_check_us.store(next, Ordering::Relaxed);
    host.checking.store(false, Ordering::Release);
}

/// A host that no longer fits a pool's target_session_attrs (a standby promoted under a
/// standby or read-only entry, a primary that came back as a standby): the pool's idle
/// servers there are closed, so that they are not lent again. At every check, so that
/// servers lent when the role changed are closed once they are given back.
/// prefer-standby keeps them (a primary is its fallback), except in a split entry's pool
/// of reads, which keeps only servers on standbys within max_replica_lag.
fn sweep(
    addr: &crate::server::ServerAddr,
    session: Session,
    lag: Option<f64>,
    pools: &[Arc<Pool>],
) {
    for p in pools {
        let settings = p.settings();
        let attrs = settings.target.attrs;
        let reason = if p.reads {
            let max = settings
                .split
                .as_ref()
                .and_then(|s| s.max_lag())
                .map(|d| d.as_secs_f64());
            match (session.role, lag, max) {
                (Role::Standby, Some(l), Some(m)) if l > m => {
                    format!("replication lag {l:.1}s is over max_replica_lag ({m}s)")
                }
                (Role::Standby, _, _) => continue,
                _ => format!("host is {} (reads go to standbys)", session.role.as_str()),
            }
        } else if crate::server::hosts::fits(attrs, session)
            || attrs == TargetSessionAttrs::PreferStandby
        {
            continue;
        } else {
            format!(
                "host is {} (target_session_attrs={})",
                session.role.as_str(),
                attrs.as_str()
            )
        };
        p.close_idle_at(addr, &reason);
    }
}

fn refused_login(e: &crate::server::ConnectError) -> bool {
    match e {
        crate::server::ConnectError::Auth(_) => true,
        crate::server::ConnectError::Server(pg) => pg.code.starts_with("28"),
        _ => false,
    }
}

async fn probe(
    target: &ServerTarget,
    addr: &crate::server::ServerAddr,
    scram: Option<ScramCredential>,
    timeout: Duration,
) -> Result<(Session, Option<f64>), crate::server::ConnectError> {
    let started = std::time::Instant::now();
    let mut conn = crate::server::connect_one(target, addr, timeout, scram).await?;
    let left = timeout
        .saturating_sub(started.elapsed())
        .max(Duration::from_millis(1));
    let mut rows = Vec::new();
    let asked = conn.query_rows(CHECK_SQL, left, Some(&mut rows)).await;
    tokio::spawn(conn.terminate());
    asked?;
    let row = rows.first().ok_or(crate::server::ConnectError::Protocol(
        "no row from the host check",
    ))?;
    let standby = row.first().cloned().flatten().as_deref() == Some("true");
    let lag = row
        .get(1)
        .cloned()
        .flatten()
        .and_then(|v| v.parse::<f64>().ok())
        .map(|v| v.max(0.0));
    let read_only = row
        .get(2)
        .cloned()
        .flatten()
        .is_some_and(|v| v.eq_ignore_ascii_case("on"));
    let role = if standby {
        Role::Standby
    } else {
        Role::Primary
    };
    Ok((
        Session {
            role,
            read_only: standby || read_only,
        },
        lag,
    ))
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn backoff_doubles_past_the_threshold_and_is_capped() {
        let p = Policy {
            interval: Duration::from_secs(1),
            timeout: Duration::from_secs(1),
            threshold: 3,
        };
        let d: Vec<u64> = (1..=9).map(|f| p.delay(f).as_secs()).collect();
        assert_eq!(d, vec![1, 1, 2, 4, 8, 16, 16, 16, 16]);
        let long = Policy {
            interval: Duration::from_secs(30),
            ..p
        };
        assert_eq!(long.delay(9), Duration::from_secs(60));
    }
}
