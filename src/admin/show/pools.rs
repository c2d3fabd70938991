//! SHOW POOLS: how each pool's clients and servers stand now, the view
//! pgbouncer_exporter and the HTTP dashboard (metrics_http) read most.

use std::collections::HashMap;

use super::super::rowset::{int, text, RowSet, Value, NULL};
use super::super::sessions;
use super::{load_balance, sorted_pools, ADMIN_DB};
use crate::app::{App, Snapshot};
use crate::registry::clients::{ClientState, CLIENTS};
use crate::registry::now_micros;

/// The pool user a client's pool uses: the database's forced user, else the client's own.
fn pool_user(snap: &Snapshot, database: &str, client_user: &str) -> String {
    snap.resolve_database(database)
        .and_then(|(db, _)| db.user.clone())
        .unwrap_or_else(|| client_user.to_owned())
}

pub(crate) fn pools(app: &App) -> RowSet {
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
