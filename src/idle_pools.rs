//! pool_idle_timeout (PgBouncer's master after 1.25, its pull request #1491): a pool (one database and user
//! pair) that has had no client and no server for that long is freed, so that pools of
//! users who come and go (generated per deployment, per tenant) do not pile up in SHOW
//! POOLS, the metrics and memory. As PgBouncer documents, the freed pool's statistics
//! go with it, so the per-database totals of SHOW STATS (sums over the pools there are)
//! go down; that is why 0, the default, disables it. A client that comes later gets a
//! new pool.
//!
//! Unlike server_idle_timeout this closes nothing: a pool is freed only once it is empty.

use std::sync::Arc;
use std::time::{Duration, Instant};

use crate::app::App;

/// How often pools are looked at; PgBouncer's janitor looks three times a second, and a
/// timeout in seconds needs no finer grain.
const PERIOD: Duration = Duration::from_secs(1);

pub fn start(app: &Arc<App>) {
    let app = app.clone();
    tokio::spawn(async move {
        let mut tick = crate::timers::interval(PERIOD, crate::timers::MissedTickBehavior::Skip);
        // Whether the last look was with the timeout set. Read at every look, so RELOAD
        // and the console's SET apply from the next.
        let mut looking = false;
        loop {
            tick.tick().await;
            let timeout = app.snapshot.load().config.general.pool_idle_timeout;
            if timeout.is_zero() {
                looking = false;
                continue;
            }
            if !looking {
                // A pool seen unused before the timeout was turned off may have been
                // used since: its time starts now.
                for p in app.all_pools() {
                    p.forget_unused();
                }
                looking = true;
            }
            sweep(&app, timeout);
        }
    });
}

/// Frees the pools unused for `timeout`. They are picked outside the map's lock (looking
/// takes each pool's lock), then taken out under it, if nothing holds them then: a
/// client that got one in between keeps it.
fn sweep(app: &App, timeout: Duration) {
    let now = Instant::now();
    let due: Vec<(String, String)> = app
        .all_pools()
        .iter()
        .filter(|p| p.unused_for(now).is_some_and(|d| d >= timeout))
        .map(|p| (p.database.clone(), p.user.clone()))
        .collect();
    if due.is_empty() {
        return;
    }
    for pool in app.free_pools(&due, |p| p.held_only_by_map() && p.is_unused()) {
        crate::admin::period::forget(&pool.database, &pool.user);
        tracing::info!(
            "freeing pool {}/{}: no clients and no servers for pool_idle_timeout ({}s)",
            pool.database,
            pool.user,
            timeout.as_secs_f64()
        );
    }
}
