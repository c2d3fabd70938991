//! stats_period: every period Weir logs PgBouncer's `stats:` line (log_stats) and moves
//! the window SHOW STATS_AVERAGES averages over.

mod common;

use common::*;

const STATS_PREFIX: &str = "LOG stats: ";

/// The numbers of a `stats:` line, checked against PgBouncer's wording on the way.
fn parse_stats(message: &str) -> Vec<u64> {
    let mut shape = message.to_owned();
    let mut numbers = Vec::new();
    for part in message.split(", ") {
        let n: String = part.chars().filter(char::is_ascii_digit).collect();
        numbers.push(
            n.parse()
                .unwrap_or_else(|_| panic!("no number in {part:?}")),
        );
        shape = shape.replacen(&n, "", 1);
    }
    assert_eq!(
        shape,
        " xacts/s,  queries/s,  client parses/s,  server parses/s,  binds/s, in  B/s, out  B/s, xact  us, query  us, wait  us",
        "not PgBouncer's stats line: {message:?}"
    );
    numbers
}

fn stats_lines(weir: &Weir) -> Vec<Vec<u64>> {
    weir.logfile()
        .lines()
        .filter_map(|l| l.split_once(STATS_PREFIX).map(|(_, m)| parse_stats(m)))
        .collect()
}

/// avg_query_count of database postgres in SHOW STATS_AVERAGES.
fn avg_queries(admin: &mut RawConn) -> u64 {
    let rows = admin.simple_query("SHOW STATS_AVERAGES").unwrap();
    rows.iter()
        .find(|r| r[0].as_deref() == Some("postgres"))
        .and_then(|r| r[3].as_deref()?.parse().ok())
        .unwrap_or(0)
}

#[test]
fn stats_line_every_period_and_averages_follow_it() {
    let pg = PgServer::start();
    let weir = Weir::for_pg(&pg)
        .set("stats_period", 1)
        .set("admin_users", "postgres")
        .set("max_prepared_statements", 10)
        .set("pool_mode", "transaction")
        .start();
    assert!(
        !weir.log().contains("stats_period is not implemented"),
        "{}",
        weir.log()
    );
    let mut c = RawConn::startup(weir.port(), "postgres", "postgres", &[]).unwrap();
    let mut admin = RawConn::startup(weir.port(), "postgres", "pgbouncer", &[]).unwrap();
    // Queries keep coming until a period has seen some: its line shows them per second.
    assert!(
        eventually(TIMEOUT, || {
            c.query_one("select 1");
            stats_lines(&weir)
                .iter()
                .any(|n| n[1] > 0 && n[5] > 0 && n[6] > 0)
        }),
        "no stats line with queries:\n{}",
        weir.log_tail()
    );
    // Simple queries prepare nothing: the prepared-statement rates stay 0.
    assert!(stats_lines(&weir)
        .iter()
        .all(|n| n[2] == 0 && n[3] == 0 && n[4] == 0));
    assert!(avg_queries(&mut admin) > 0);
    // Named statements (tracked in transaction mode), prepared once each and bound:
    // client parses/s and binds/s move.
    let mut i = 0;
    assert!(
        eventually(TIMEOUT, || {
            i += 1;
            let name = format!("s{i}");
            c.send(&proto::parse(&name, "select 1"));
            c.send(&proto::bind("", &name, &[]));
            c.send(&proto::execute("", 0));
            c.send(&proto::sync());
            c.read_until_ready();
            stats_lines(&weir).iter().any(|n| n[2] > 0 && n[4] > 0)
        }),
        "no stats line with parses and binds:\n{}",
        weir.log_tail()
    );
    // Once the queries stop, two periods later the average window holds none of them: with
    // the default period (60 s) that would not happen within the test's timeout.
    assert!(
        eventually(TIMEOUT, || avg_queries(&mut admin) == 0),
        "SHOW STATS_AVERAGES still averages old queries"
    );
    assert!(
        eventually(TIMEOUT, || stats_lines(&weir)
            .last()
            .is_some_and(|n| n[1] == 0)),
        "no idle stats line:\n{}",
        weir.log_tail()
    );
}

#[test]
fn log_stats_off_writes_no_stats_line() {
    let pg = PgServer::start();
    let weir = Weir::for_pg(&pg)
        .set("stats_period", 1)
        .set("log_stats", 0)
        .set("admin_users", "postgres")
        .start();
    let mut c = RawConn::startup(weir.port(), "postgres", "postgres", &[]).unwrap();
    let mut admin = RawConn::startup(weir.port(), "postgres", "pgbouncer", &[]).unwrap();
    // The period still ticks (the averages move) but nothing is logged.
    assert!(eventually(TIMEOUT, || {
        c.query_one("select 1");
        avg_queries(&mut admin) > 0
    }));
    assert!(eventually(TIMEOUT, || avg_queries(&mut admin) == 0));
    assert!(stats_lines(&weir).is_empty(), "{}", weir.logfile());
}
