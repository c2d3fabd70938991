//! The SHOW commands, with PgBouncer 1.24's columns, order and types (its admin.c and
//! stats.c). Values come from Weir's live state; where Weir has no equivalent of a
//! PgBouncer internal (slab caches, libevent fds, a DNS cache, cancel-request queues) the
//! command returns its columns with the rows that are true for Weir (often none, or zero
//! counts), and values Weir cannot know are NULL rather than made up.
//!
//! One file per kind of view, so that each stays readable on its own: `stats` (traffic
//! counters), `pools` (pool occupancy), `sockets` (the connection listings), `entries`
//! (the configured databases, users and peers), `process` (the process itself and the
//! internals Weir lacks). This file keeps what more than one of them formats alike.

mod entries;
mod pools;
mod process;
mod sockets;
mod stats;

use std::sync::Arc;

use weir_config::{Database, LoadBalanceHosts};

use super::rowset::{int, text, Value};
use crate::app::App;
use crate::pool::Pool;
use crate::server::ServerAddr;

pub(crate) use entries::{databases, hosts, lists, peer_pools, peers, users};
pub(crate) use pools::pools;
pub(crate) use process::{
    config, dns_hosts, dns_zones, fake_param, fds, mem, state, version, FAKE_PARAMS,
};
pub(crate) use sockets::{clients, servers, sockets};
pub(crate) use stats::{stats, stats_averages, stats_totals, totals};

/// The admin console's own database and user, listed as PgBouncer lists them.
pub use crate::pool::gates::ADMIN_DB;

/// PgBouncer's `format_time_s`: local time, `YYYY-MM-DD HH:MM:SS TZ`.
fn format_time(micros: u64) -> String {
    let secs = (micros / 1_000_000) as libc::time_t;
    // SAFETY: localtime_r and strftime write only into the buffers given, which outlive
    // the calls; the format is a NUL-terminated literal.
    unsafe {
        let mut tm: libc::tm = std::mem::zeroed();
        if libc::localtime_r(&secs, &mut tm).is_null() {
            return String::new();
        }
        let mut buf = [0u8; 64];
        let n = libc::strftime(
            buf.as_mut_ptr().cast(),
            buf.len(),
            c"%Y-%m-%d %H:%M:%S %Z".as_ptr(),
            &tm,
        );
        String::from_utf8_lossy(&buf[..n]).into_owned()
    }
}

fn server_addr(addr: &ServerAddr) -> (Value, Value) {
    match addr {
        ServerAddr::Tcp { host, port } => (text(host), int(port)),
        ServerAddr::Unix { path } => {
            let port = path
                .to_string_lossy()
                .rsplit_once(".s.PGSQL.")
                .and_then(|(_, p)| p.parse::<u16>().ok());
            (text("unix"), port.map(|p| p.to_string()))
        }
    }
}

fn sorted_pools(app: &App) -> Vec<Arc<Pool>> {
    let mut pools = app.all_pools();
    pools.sort_by(|a, b| (&a.database, &a.user).cmp(&(&b.database, &b.user)));
    pools
}

fn load_balance(db: Option<&Database>) -> Value {
    let db = db?;
    if db.host.len() > 1 {
        Some(
            db.load_balance_hosts
                .unwrap_or(LoadBalanceHosts::RoundRobin)
                .as_str()
                .to_owned(),
        )
    } else {
        None
    }
}
