//! SHOW STATS, STATS_TOTALS, STATS_AVERAGES and TOTALS: the traffic counters per
//! database, as totals and as rates over the averaging window (`period`), which share one
//! walk over the pools and one order of figures.

use std::collections::BTreeMap;

use super::super::period;
use super::super::rowset::{int, text, RowSet};
use super::{sorted_pools, ADMIN_DB};
use crate::app::App;
use crate::stats::Delta;

const STATS_TOTALS_COLS: [&str; 12] = [
    "server_assignment_count",
    "xact_count",
    "query_count",
    "bytes_received",
    "bytes_sent",
    "xact_time",
    "query_time",
    "wait_time",
    "client_parse_count",
    "server_parse_count",
    "bind_count",
    "client_login_count",
];

/// The twelve figures PgBouncer reports, in its order.
fn figures(d: &Delta) -> [u64; 12] {
    [
        d.server_assignments,
        d.xacts,
        d.queries,
        d.received,
        d.sent,
        d.xact_time_us,
        d.query_time_us,
        d.wait_time_us,
        d.prepared.client_parses,
        d.prepared.server_parses,
        d.prepared.binds,
        d.client_logins,
    ]
}

/// Per database: (totals now, totals at the start of the averaging window).
fn stats_by_database(app: &App) -> BTreeMap<String, (Delta, Delta)> {
    let mut out: BTreeMap<String, (Delta, Delta)> = BTreeMap::new();
    let console = (
        super::super::sessions::console_stats(),
        period::window_start(ADMIN_DB, ""),
    );
    out.insert(ADMIN_DB.to_owned(), console);
    for p in sorted_pools(app) {
        let e = out.entry(p.database.clone()).or_default();
        period::add(&mut e.0, &p.stats.read());
        period::add(&mut e.1, &period::window_start(&p.database, &p.user));
    }
    out
}

pub(crate) fn stats(app: &App) -> RowSet {
    let mut rs = RowSet::new(
        "sNNNNNNNNNNNNNNNNNNNNNNNNNNNN",
        &[
            "database",
            "total_server_assignment_count",
            "total_xact_count",
            "total_query_count",
            "total_received",
            "total_sent",
            "total_xact_time",
            "total_query_time",
            "total_wait_time",
            "total_client_parse_count",
            "total_server_parse_count",
            "total_bind_count",
            "total_client_login_count",
            "avg_server_assignment_count",
            "avg_xact_count",
            "avg_query_count",
            "avg_recv",
            "avg_sent",
            "avg_xact_time",
            "avg_query_time",
            "avg_wait_time",
            "avg_client_parse_count",
            "avg_server_parse_count",
            "avg_bind_count",
            "avg_client_login_count",
            // Weir's own, after PgBouncer's: requests pipelined (pool::pipeline).
            "total_pipelined_count",
            "avg_pipelined_count",
            // Servers put into a client's session state at a lend, and of those, the ones
            // that took a round trip of their own (client::on_the_way).
            "total_state_applied_count",
            "total_state_round_trip_count",
        ],
    );
    let window = period::window_us();
    for (db, (cur, old)) in stats_by_database(app) {
        let avg = period::averages(&cur, &old, window);
        let mut row = vec![text(db)];
        row.extend(figures(&cur).iter().map(int));
        row.extend(figures(&avg).iter().map(int));
        row.push(int(cur.pipelined));
        row.push(int(avg.pipelined));
        row.push(int(cur.state_applied));
        row.push(int(cur.state_apart));
        rs.push(row);
    }
    rs
}

pub(crate) fn stats_totals(app: &App) -> RowSet {
    let mut names = vec!["database"];
    names.extend(STATS_TOTALS_COLS);
    let mut rs = RowSet::new("sNNNNNNNNNNNN", &names);
    for (db, (cur, _)) in stats_by_database(app) {
        let mut row = vec![text(db)];
        row.extend(figures(&cur).iter().map(int));
        rs.push(row);
    }
    rs
}

pub(crate) fn stats_averages(app: &App) -> RowSet {
    let mut names = vec!["database"];
    names.extend(&STATS_TOTALS_COLS[..8]);
    names.extend([
        "avg_client_parse_count",
        "avg_server_parse_count",
        "avg_bind_count",
        // Unprefixed, like the rates above that are not prepared-statement counts.
        "client_login_count",
    ]);
    let mut rs = RowSet::new("sNNNNNNNNNNNN", &names);
    let window = period::window_us();
    for (db, (cur, old)) in stats_by_database(app) {
        let mut row = vec![text(db)];
        row.extend(
            figures(&period::averages(&cur, &old, window))
                .iter()
                .map(int),
        );
        rs.push(row);
    }
    rs
}

pub(crate) fn totals(app: &App) -> RowSet {
    let mut rs = RowSet::new("sN", &["name", "value"]);
    let mut cur = Delta::default();
    let mut old = Delta::default();
    for (c, o) in stats_by_database(app).values() {
        period::add(&mut cur, c);
        period::add(&mut old, o);
    }
    let avg = period::averages(&cur, &old, period::window_us());
    let names = [
        "server_assignment_count",
        "xact_count",
        "query_count",
        "client_bytes",
        "server_bytes",
        "xact_time",
        "query_time",
        "wait_time",
        "ps_client_parse_count",
        "ps_server_parse_count",
        "ps_bind_count",
        "client_login_count",
    ];
    for (prefix, d) in [("total_", &cur), ("avg_", &avg)] {
        for (name, v) in names.iter().zip(figures(d)) {
            rs.push(vec![text(format!("{prefix}{name}")), int(v)]);
        }
    }
    rs
}
