//! SHOW CONFIG, STATE and VERSION, the console's fake session parameters, and MEM, FDS,
//! DNS_HOSTS and DNS_ZONES: what is said of the process rather than of its pools or
//! connections, including the PgBouncer internals Weir has none of, which keep their
//! columns so that tools reading them still work.

use weir_config::General;

use super::super::control;
use super::super::rowset::{text, RowSet};
use crate::app::App;

pub(crate) fn config(app: &App) -> RowSet {
    let mut rs = RowSet::new("ssss", &["key", "value", "default", "changeable"]);
    let snap = app.snapshot.load();
    let g = &snap.config.general;
    let defaults = General::default();
    for name in General::OPTION_NAMES {
        let value = g.show_option(name).flatten();
        let default = defaults.show_option(name).flatten();
        let changeable = !control::NOT_RELOADABLE.contains(name);
        rs.push(vec![
            text(*name),
            value,
            default,
            text(if changeable { "yes" } else { "no" }),
        ]);
    }
    rs
}

pub(crate) fn state() -> RowSet {
    let mut rs = RowSet::new("ss", &["key", "value"]);
    let mode = control::mode();
    let yn = |b: bool| text(if b { "yes" } else { "no" });
    rs.push(vec![text("active"), yn(mode == control::Mode::Running)]);
    rs.push(vec![text("paused"), yn(mode == control::Mode::Paused)]);
    rs.push(vec![
        text("suspended"),
        yn(mode == control::Mode::Suspended),
    ]);
    rs
}

pub(crate) fn version() -> RowSet {
    let mut rs = RowSet::new("s", &["version"]);
    rs.push(vec![text(crate::cli::VERSION)]);
    rs
}

/// Weir allocates from the system allocator, not slab caches: no rows.
pub(crate) fn mem() -> RowSet {
    RowSet::new("siiii", &["name", "size", "used", "free", "memtotal"])
}

/// PgBouncer hands these to a new process for an online restart (-R); Weir has no online
/// restart, so there is nothing to hand over: no rows.
pub(crate) fn fds() -> RowSet {
    RowSet::new(
        "issssiqisssssbb",
        &[
            "fd",
            "task",
            "user",
            "database",
            "addr",
            "port",
            "cancel",
            "link",
            "client_encoding",
            "std_strings",
            "datestyle",
            "timezone",
            "password",
            "scram_client_key",
            "scram_server_key",
        ],
    )
}

/// Weir keeps no DNS cache: no rows.
pub(crate) fn dns_hosts() -> RowSet {
    RowSet::new("sqs", &["hostname", "ttl", "addrs"])
}

pub(crate) fn dns_zones() -> RowSet {
    RowSet::new("sqi", &["zonename", "serial", "count"])
}

/// The session parameters PgBouncer's console pretends to have, for clients that SHOW them.
pub(crate) const FAKE_PARAMS: &[(&str, &str)] = &[
    ("client_encoding", "UTF-8"),
    ("default_transaction_isolation", "read committed"),
    ("standard_conforming_strings", "on"),
    ("datestyle", "ISO"),
    ("timezone", "GMT"),
    ("extra_float_digits", "2"),
];

pub(crate) fn fake_param(name: &str) -> Option<RowSet> {
    let (n, v) = FAKE_PARAMS
        .iter()
        .find(|(n, _)| n.eq_ignore_ascii_case(name))?;
    let mut rs = RowSet::new("s", &[n]);
    rs.push(vec![text(*v)]);
    Some(rs)
}
