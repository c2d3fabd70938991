//! SHOW DATABASES, USERS, PEERS, PEER_POOLS, LISTS and HOSTS: the entries of the
//! configuration (with those only pools or logins brought in) and their limits, counts
//! and hosts, apart from the live connections.

use std::collections::BTreeSet;
use std::sync::Arc;

use super::super::rowset::{int, text, RowSet, NULL};
use super::super::{control, sessions};
use super::{format_time, load_balance, server_addr, sorted_pools, ADMIN_DB};
use crate::app::{App, Snapshot};
use crate::pool::Pool;
use crate::registry::client_limits;
use crate::registry::clients::CLIENTS;
use crate::registry::servers::SERVERS;

/// PgBouncer's current_connections of a database or a user: the server connections open
/// or opening in the pools `keep` picks.
fn servers_of(pools: &[Arc<Pool>], keep: impl Fn(&Pool) -> bool) -> usize {
    pools
        .iter()
        .filter(|p| keep(p))
        .map(|p| {
            let c = p.counts();
            c.active + c.idle + c.connecting
        })
        .sum()
}

pub(crate) fn databases(app: &App) -> RowSet {
    let mut rs = RowSet::new(
        "ssissiiiissiiiiii",
        &[
            "name",
            "host",
            "port",
            "database",
            "force_user",
            "pool_size",
            "min_pool_size",
            "reserve_pool_size",
            "server_lifetime",
            "pool_mode",
            "load_balance_hosts",
            "max_connections",
            "current_connections",
            "max_client_connections",
            "current_client_connections",
            "paused",
            "disabled",
        ],
    );
    let snap = app.snapshot.load();
    let g = &snap.config.general;
    let pools = sorted_pools(app);
    let mut names: BTreeSet<String> = snap
        .config
        .databases
        .iter()
        .map(|(n, _)| n.clone())
        .collect();
    names.extend(pools.iter().map(|p| p.database.clone()));
    let mut rows = vec![(
        ADMIN_DB.to_owned(),
        vec![
            text(ADMIN_DB),
            NULL,
            int(g.listen_port),
            text(ADMIN_DB),
            text(ADMIN_DB),
            int(2),
            int(g.min_pool_size),
            int(g.reserve_pool_size),
            int(g.server_lifetime.as_secs()),
            text("statement"),
            NULL,
            int(g.max_db_connections),
            int(0),
            int(g.max_db_client_connections),
            int(client_limits::in_database(ADMIN_DB)),
            int(0),
            int(0),
        ],
    )];
    for name in names {
        let Some((db, server_db)) = snap.resolve_database(&name) else {
            continue;
        };
        let servers = servers_of(&pools, |p| p.database == name);
        rows.push((
            name.clone(),
            vec![
                text(&name),
                if db.host.is_empty() {
                    NULL
                } else {
                    text(db.host.join(","))
                },
                int(db.port_for(0)),
                text(server_db),
                db.user.clone(),
                int(db.pool_size.unwrap_or(g.default_pool_size)),
                int(db.min_pool_size.unwrap_or(g.min_pool_size)),
                int(db.reserve_pool_size.unwrap_or(g.reserve_pool_size)),
                int(db.server_lifetime.unwrap_or(g.server_lifetime).as_secs()),
                db.pool_mode.map(|m| m.as_str().to_owned()),
                load_balance(Some(db)),
                int(db.max_db_connections.unwrap_or(g.max_db_connections)),
                int(servers),
                int(db
                    .max_db_client_connections
                    .unwrap_or(g.max_db_client_connections)),
                int(client_limits::in_database(&name)),
                int(u8::from(control::is_paused(&name))),
                int(u8::from(control::is_disabled(&name))),
            ],
        ));
    }
    rows.sort_by(|a, b| a.0.cmp(&b.0));
    for (_, r) in rows {
        rs.push(r);
    }
    rs
}

fn user_names(app: &App, snap: &Snapshot) -> BTreeSet<String> {
    let mut names: BTreeSet<String> = snap.auth_file.keys().cloned().collect();
    names.extend(snap.config.users.keys().cloned());
    names.extend(app.all_pools().iter().map(|p| p.user.clone()));
    names.extend(CLIENTS.snapshot().iter().map(|c| c.user.to_string()));
    names.extend(sessions::all().iter().map(|a| a.user.clone()));
    names.insert(ADMIN_DB.to_owned());
    names
}

pub(crate) fn users(app: &App) -> RowSet {
    let mut rs = RowSet::new(
        "ssssiiii",
        &[
            "name",
            "pool_size",
            "reserve_pool_size",
            "pool_mode",
            "max_user_connections",
            "current_connections",
            "max_user_client_connections",
            "current_client_connections",
        ],
    );
    let snap = app.snapshot.load();
    let g = &snap.config.general;
    let pools = app.all_pools();
    for name in user_names(app, &snap) {
        let u = snap.config.users.get(&name);
        let servers = servers_of(&pools, |p| p.user == name);
        rs.push(vec![
            text(&name),
            text(
                u.and_then(|u| u.pool_size)
                    .map(|n| format!("{n:>9}"))
                    .unwrap_or_default(),
            ),
            text(
                u.and_then(|u| u.reserve_pool_size)
                    .map(|n| format!("{n:>9}"))
                    .unwrap_or_default(),
            ),
            u.and_then(|u| u.pool_mode).map(|m| m.as_str().to_owned()),
            int(u
                .and_then(|u| u.max_user_connections)
                .unwrap_or(g.max_user_connections)),
            int(servers),
            int(u
                .and_then(|u| u.max_user_client_connections)
                .unwrap_or(g.max_user_client_connections)),
            int(client_limits::of_user(&name)),
        ]);
    }
    rs
}

pub(crate) fn peers(app: &App) -> RowSet {
    let mut rs = RowSet::new("isii", &["peer_id", "host", "port", "pool_size"]);
    let snap = app.snapshot.load();
    let default = snap.config.general.default_pool_size;
    for (id, p) in &snap.config.peers {
        rs.push(vec![
            int(id),
            text(&p.host),
            int(p.port),
            int(p.pool_size.unwrap_or(default)),
        ]);
    }
    rs
}

/// Weir keeps no pools of connections to peers (yet): no rows.
pub(crate) fn peer_pools() -> RowSet {
    RowSet::new(
        "iiiii",
        &[
            "peer_id",
            "cl_active_cancel_req",
            "cl_waiting_cancel_req",
            "sv_active_cancel",
            "sv_login",
        ],
    )
}

pub(crate) fn lists(app: &App) -> RowSet {
    let mut rs = RowSet::new("si", &["list", "items"]);
    let snap = app.snapshot.load();
    let databases = databases(app).rows().len();
    let users = user_names(app, &snap).len();
    let pools = app.all_pools().len() + 1;
    let logged_in = CLIENTS.snapshot().len() + sessions::count();
    let total = app.clients.load(std::sync::atomic::Ordering::Relaxed);
    let servers = SERVERS.snapshot().len();
    for (name, n) in [
        ("databases", databases),
        ("users", users),
        ("peers", snap.config.peers.len()),
        ("pools", pools),
        ("peer_pools", 0),
        // Weir keeps no free lists of client or server objects.
        ("free_clients", 0),
        ("used_clients", total.max(logged_in)),
        ("login_clients", total.saturating_sub(logged_in)),
        ("free_servers", 0),
        ("used_servers", servers),
        // Weir resolves host names per connect and keeps no DNS cache.
        ("dns_names", 0),
        ("dns_zones", 0),
        ("dns_queries", 0),
        ("dns_pending", 0),
    ] {
        rs.push(vec![text(name), int(n)]);
    }
    rs
}

/// Weir's own: one row per host of each database entry (`host=a,b,c`), with what the last
/// connections to it found (role from `in_hot_standby` or `pg_is_in_recovery()`, reachable
/// or not, the last error) and its servers now.
pub(crate) fn hosts(app: &App) -> RowSet {
    let mut rs = RowSet::new(
        "ssisssssiiiss",
        &[
            "database",
            "host",
            "port",
            "role",
            "state",
            "lag",
            "in_rotation",
            "load_balance_hosts",
            "weight",
            "active",
            "idle",
            "last_error",
            "last_error_time",
        ],
    );
    for row in crate::app::host_rows(app) {
        let h = row.host();
        let (host, port) = server_addr(&h.addr);
        let (err, at) = match h.last_error() {
            Some((at, e)) => (text(e), text(format_time(at))),
            None => (NULL, NULL),
        };
        rs.push(vec![
            text(&row.database),
            host,
            port,
            text(h.role().as_str()),
            text(h.state()),
            h.lag().map_or(NULL, |l| text(format!("{l:.3}"))),
            text(if h.out_of_rotation() { "no" } else { "yes" }),
            text(row.set.balance.as_str()),
            int(row.set.weights.get(row.index).copied().unwrap_or(1)),
            int(row.active),
            int(row.idle),
            err,
            at,
        ]);
    }
    rs
}
