//! The built-in HTTP endpoint (`http_listen`): /metrics in the Prometheus (OpenMetrics)
//! text format following real traffic, /healthz, /readyz following PostgreSQL, the
//! dashboard's JSON API, and no listener at all when the option is unset.

mod common;

use common::*;
use std::time::Duration;

// ---------------------------------------------------------------------------
// Local helpers: a tiny HTTP/1.0 client and a metrics reader.

fn get(port: u16, path: &str) -> HttpResponse {
    http_get(port, path).unwrap_or_else(|e| panic!("GET {path} on port {port}: {e}"))
}

fn start_with_http(pg: &PgServer, mode: &str) -> (Weir, u16) {
    let http = free_port();
    let weir = Weir::for_pg(pg)
        .set("pool_mode", mode)
        .set("http_listen", format!("127.0.0.1:{http}"))
        .start();
    assert!(
        eventually(TIMEOUT, || http_get(http, "/healthz").is_ok()),
        "nothing listens on http_listen 127.0.0.1:{http}\n{}",
        weir.log_tail()
    );
    (weir, http)
}

/// A scrape parsed by the `prometheus-parse` crate, after a strict line check of our own
/// (that crate skips lines it cannot parse, so we make sure there are none).
struct Scrape(prometheus_parse::Scrape);

fn scrape(port: u16) -> Scrape {
    let r = get(port, "/metrics");
    assert_eq!(r.status, 200, "{}", r.body);
    let ct = r.headers.get("content-type").cloned().unwrap_or_default();
    assert!(
        ct.starts_with("application/openmetrics-text") || ct.starts_with("text/plain"),
        "content-type {ct}"
    );
    check_exposition_lines(&r.body);
    let lines = r.body.lines().map(|l| Ok(l.to_owned()));
    Scrape(prometheus_parse::Scrape::parse(lines).expect("prometheus-parse"))
}

/// Every line is a comment (HELP, TYPE, UNIT, EOF) or `name{labels} value`, and the text
/// ends with `# EOF` as OpenMetrics requires.
fn check_exposition_lines(text: &str) {
    let name_ok = |n: &str| {
        !n.is_empty()
            && n.chars()
                .all(|c| c.is_ascii_alphanumeric() || c == '_' || c == ':')
            && !n.starts_with(|c: char| c.is_ascii_digit())
    };
    for line in text.lines() {
        if let Some(rest) = line.strip_prefix("# ") {
            let kind = rest.split(' ').next().unwrap_or("");
            assert!(
                ["HELP", "TYPE", "UNIT", "EOF"].contains(&kind),
                "unexpected comment line: {line}"
            );
            continue;
        }
        let (series, value) = line
            .rsplit_once(' ')
            .unwrap_or_else(|| panic!("no value in line: {line}"));
        let name = series.split('{').next().unwrap();
        assert!(name_ok(name), "bad metric name in line: {line}");
        if series.contains('{') {
            assert!(series.ends_with('}'), "bad labels in line: {line}");
        }
        let v = value.trim();
        assert!(
            v.parse::<f64>().is_ok() || ["+Inf", "-Inf", "NaN"].contains(&v),
            "bad value in line: {line}"
        );
    }
    assert_eq!(text.lines().last(), Some("# EOF"), "must end with # EOF");
}

impl Scrape {
    /// The value of the sample `name` whose labels include all of `labels`.
    fn value(&self, name: &str, labels: &[(&str, &str)]) -> Option<f64> {
        self.0.samples.iter().find_map(|s| {
            if s.metric != name || !labels.iter().all(|(k, v)| s.labels.get(k) == Some(*v)) {
                return None;
            }
            match &s.value {
                prometheus_parse::Value::Counter(v)
                | prometheus_parse::Value::Gauge(v)
                | prometheus_parse::Value::Untyped(v) => Some(*v),
                _ => None,
            }
        })
    }

    /// The buckets (le, cumulative count) of histogram `name` with these labels.
    fn buckets(&self, name: &str, labels: &[(&str, &str)]) -> Vec<(f64, f64)> {
        let bucket = format!("{name}_bucket");
        for s in &self.0.samples {
            if (s.metric == name || s.metric == bucket)
                && labels.iter().all(|(k, v)| s.labels.get(k) == Some(*v))
            {
                if let prometheus_parse::Value::Histogram(h) = &s.value {
                    return h.iter().map(|b| (b.less_than, b.count)).collect();
                }
            }
        }
        panic!("no histogram {name} {labels:?}");
    }
}

const POOL: [(&str, &str); 2] = [("database", "postgres"), ("user", "postgres")];

fn assert_histogram_consistent(s: &Scrape, name: &str, min_count: f64) {
    let buckets = s.buckets(name, &POOL);
    assert!(buckets.len() > 5, "{name}: buckets {buckets:?}");
    for w in buckets.windows(2) {
        assert!(
            w[0].0 < w[1].0,
            "{name}: bounds not increasing: {buckets:?}"
        );
        assert!(
            w[0].1 <= w[1].1,
            "{name}: counts not cumulative: {buckets:?}"
        );
    }
    let (last_le, last_count) = *buckets.last().unwrap();
    assert!(last_le.is_infinite(), "{name}: no +Inf bucket: {buckets:?}");
    let count = s.value(&format!("{name}_count"), &POOL).expect("_count");
    let sum = s.value(&format!("{name}_sum"), &POOL).expect("_sum");
    assert_eq!(last_count, count, "{name}: +Inf bucket != _count");
    assert!(count >= min_count, "{name}: count {count} < {min_count}");
    assert!(sum > 0.0, "{name}: sum {sum}");
}

// ---------------------------------------------------------------------------

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn metrics_follow_transactions_errors_and_reloads() {
    const N: usize = 200;
    let pg = PgServer::start();
    let (weir, http) = start_with_http(&pg, "transaction");

    // A first client makes the pool exist; the counter starts from wherever it is.
    let c = connect(weir.port(), "postgres", "postgres").await.unwrap();
    q1(&c, "select 1").await;
    let before = scrape(http);
    let xacts_before = before
        .value("weir_pool_transactions_total", &POOL)
        .expect("pool transaction counter");
    assert_eq!(
        before.value("weir_pool_client_logins_total", &POOL),
        Some(1.0),
        "one client has logged in"
    );
    assert!(before.value("weir_uptime_seconds", &[]).is_some());
    assert!(before.value("weir_build_info", &[]).is_some());

    for i in 0..N {
        if i % 2 == 0 {
            q1(&c, "select 1").await;
        } else {
            c.batch_execute("begin; select 1; select 2; commit")
                .await
                .unwrap();
        }
    }
    // One error relayed from PostgreSQL (22012 division_by_zero, class 22) ...
    let err = q(&c, "select 1/0").await.unwrap_err();
    assert_eq!(expect_db_error(&err).code, "22012");
    // ... and one from Weir itself (3D000 for an unknown database, class 3D).
    let err = connect(weir.port(), "nosuchdb", "postgres")
        .await
        .unwrap_err();
    assert_eq!(expect_db_error(&err).code, "3D000");

    // Three more logins, each counted once: the refused one above is not.
    for _ in 0..3 {
        let c = connect(weir.port(), "postgres", "postgres").await.unwrap();
        q1(&c, "select 1").await;
    }

    let after = scrape(http);
    assert_eq!(
        after.value("weir_pool_client_logins_total", &POOL),
        Some(4.0)
    );
    let xacts_after = after.value("weir_pool_transactions_total", &POOL).unwrap();
    assert!(
        xacts_after - xacts_before >= N as f64,
        "transactions grew by {} only",
        xacts_after - xacts_before
    );
    let queries = after.value("weir_pool_queries_total", &POOL).unwrap();
    assert!(
        queries >= xacts_after,
        "queries {queries} < xacts {xacts_after}"
    );
    assert_histogram_consistent(&after, "weir_pool_transaction_duration_seconds", N as f64);
    assert_histogram_consistent(&after, "weir_pool_query_duration_seconds", N as f64);
    // Every completed transaction was observed once.
    assert_eq!(
        after
            .value("weir_pool_transaction_duration_seconds_count", &POOL)
            .unwrap(),
        xacts_after
    );
    let time = after
        .value("weir_pool_transaction_time_seconds_total", &POOL)
        .unwrap();
    let hist_sum = after
        .value("weir_pool_transaction_duration_seconds_sum", &POOL)
        .unwrap();
    assert!((time - hist_sum).abs() < 1e-6, "{time} vs {hist_sum}");
    assert!(
        after
            .value("weir_pool_received_bytes_total", &POOL)
            .unwrap()
            > 0.0
    );
    assert!(after.value("weir_pool_sent_bytes_total", &POOL).unwrap() > 0.0);

    // Pools, clients and servers right now: our client is logged in and idle between
    // transactions; its pool keeps an idle server. (The session task marks itself idle
    // just after the reply went out: give it a moment.)
    let mut last = String::new();
    let settled = eventually(TIMEOUT, || {
        let s = scrape(http);
        let v = |name: &str, labels: &[(&str, &str)]| s.value(name, labels).unwrap_or(-1.0);
        last = format!(
            "pool cl_active {} cl_waiting {} sv_idle {}, clients idle {}, servers idle {}, connections {}",
            v("weir_pool_client_active", &POOL),
            v("weir_pool_client_waiting", &POOL),
            v("weir_pool_server_idle", &POOL),
            v("weir_clients", &[("state", "idle")]),
            v("weir_servers", &[("state", "idle")]),
            v("weir_client_connections", &[]),
        );
        v("weir_pool_client_active", &POOL) == 1.0
            && v("weir_pool_client_waiting", &POOL) == 0.0
            && v("weir_pool_server_idle", &POOL) >= 1.0
            && v("weir_clients", &[("state", "idle")]) == 1.0
            && v("weir_servers", &[("state", "idle")]) >= 1.0
            && v("weir_client_connections", &[]) == 1.0
    });
    assert!(settled, "live figures: {last}");
    assert_eq!(after.value("weir_max_client_conn", &[]), Some(100.0));

    let errors = |s: &Scrape, source: &str, class: &str| {
        s.value("weir_errors_total", &[("source", source), ("class", class)])
            .unwrap_or(0.0)
    };
    assert!(errors(&after, "server", "22") >= 1.0);
    assert!(errors(&after, "pooler", "3D") >= 1.0);

    // A reload is counted.
    let reloads = |s: &Scrape| {
        s.value("weir_config_reloads_total", &[("result", "success")])
            .unwrap_or(0.0)
    };
    assert_eq!(reloads(&after), 0.0);
    weir.signal(libc::SIGHUP);
    assert!(
        eventually(TIMEOUT, || reloads(&scrape(http)) == 1.0),
        "reload not counted\n{}",
        weir.log_tail()
    );

    // The dashboard's API agrees and carries history.
    let api = get(http, "/api/stats");
    assert_eq!(api.status, 200);
    let v: serde_json::Value = serde_json::from_str(&api.body).expect("JSON");
    let pool = v["pools"]
        .as_array()
        .unwrap()
        .iter()
        .find(|p| p["database"] == "postgres")
        .expect("pool in /api/stats");
    assert!(pool["xacts"].as_u64().unwrap() as f64 >= xacts_after);
    assert!(v["totals"]["errors"].as_u64().unwrap() >= 2);
    assert!(v["errors"]["recent"]
        .as_array()
        .unwrap()
        .iter()
        .any(|e| e["code"] == "22012"));
    assert!(v["history"].is_array());
    assert_eq!(v["ready"], true);
    // The hosts table: SHOW HOSTS' rows, here the entry's one host with its servers.
    let hosts = v["hosts"].as_array().expect("hosts in /api/stats");
    let host = hosts
        .iter()
        .find(|h| h["database"] == "postgres")
        .unwrap_or_else(|| panic!("the postgres entry's host: {hosts:?}"));
    assert_eq!(host["state"], "up", "{host}");
    assert_eq!(host["role"], "primary", "{host}");
    assert!(host["lag_s"].is_null(), "{host}");
    assert!(
        host["host"].is_string() && host.get("port").is_some(),
        "{host}"
    );
    let servers = host["active"].as_u64().unwrap() + host["idle"].as_u64().unwrap();
    assert!(servers >= 1, "{host}");
}

/// Whether /readyz answers `status` within 15 s, and its last answer ("status body").
fn readyz_turns(http: u16, status: u16) -> (bool, String) {
    let mut last = String::new();
    let turned = eventually(Duration::from_secs(15), || {
        let r = get(http, "/readyz");
        last = format!("{} {}", r.status, r.body);
        r.status == status
    });
    (turned, last)
}

#[test]
fn healthz_and_readyz_follow_postgres() {
    let mut pg = PgServer::start();
    let http = free_port();
    let weir = Weir::for_pg(&pg)
        .set("http_listen", format!("127.0.0.1:{http}"))
        .start();
    assert!(eventually(TIMEOUT, || http_get(http, "/healthz").is_ok()));
    let h = get(http, "/healthz");
    assert_eq!(h.status, 200);
    let r = get(http, "/readyz");
    assert_eq!(r.status, 200, "readyz with PostgreSQL up: {}", r.body);
    assert_eq!(get(http, "/nosuchpage").status, 404);

    pg.stop();
    let (unready, last) = readyz_turns(http, 503);
    assert!(unready, "readyz stayed ready with PostgreSQL down: {last}");
    assert!(
        last.contains("postgres"),
        "reason names the database: {last}"
    );
    assert_eq!(get(http, "/healthz").status, 200, "still alive");

    pg.start_again();
    assert!(
        eventually(Duration::from_secs(15), || get(http, "/readyz").status
            == 200),
        "readyz did not recover\n{}",
        weir.log_tail()
    );
}

/// A database entry with several hosts is ready while any of them answers (Weir moves to
/// it), and not ready, naming each, when none does.
#[test]
fn readyz_with_several_hosts_needs_one() {
    let mut pg = PgServer::start();
    let dead = free_port();
    let http = free_port();
    let weir = Weir::builder()
        .database(
            "postgres",
            &format!(
                "host=127.0.0.1,127.0.0.1 port={dead},{} dbname=postgres",
                pg.port()
            ),
        )
        .set("http_listen", format!("127.0.0.1:{http}"))
        .start();
    assert!(eventually(TIMEOUT, || http_get(http, "/readyz").is_ok()));
    let r = get(http, "/readyz");
    assert_eq!(r.status, 200, "one host of two answers: {}", r.body);
    let v = serde_json::from_str::<serde_json::Value>(&get(http, "/api/stats").body)
        .expect("stats JSON");
    let db = v["databases"]
        .as_array()
        .and_then(|a| a.iter().find(|d| d["name"] == "postgres"))
        .cloned()
        .unwrap_or_default();
    assert_eq!(db["reachable"], true, "{db}");
    assert!(
        db["address"]
            .as_str()
            .is_some_and(|a| a.contains(&dead.to_string())),
        "{db}"
    );
    assert_eq!(
        psql_via(&weir, "postgres", "postgres", "select 1").as_deref(),
        Ok("1")
    );

    pg.stop();
    let (unready, last) = readyz_turns(http, 503);
    assert!(unready, "readyz stayed ready with no host up: {last}");
    assert!(
        last.contains(&dead.to_string()) && last.contains(&pg.port().to_string()),
        "each host is named: {last}"
    );
}

/// TCP ports the process listens on, from /proc (its socket inodes matched against the
/// kernel's tables of listening sockets).
fn listening_ports(pid: i32) -> Vec<u16> {
    let inodes: Vec<String> = std::fs::read_dir(format!("/proc/{pid}/fd"))
        .unwrap()
        .filter_map(|e| std::fs::read_link(e.ok()?.path()).ok())
        .filter_map(|l| {
            let l = l.to_string_lossy().into_owned();
            Some(l.strip_prefix("socket:[")?.strip_suffix(']')?.to_owned())
        })
        .collect();
    let mut ports = Vec::new();
    for table in ["/proc/net/tcp", "/proc/net/tcp6"] {
        let text = std::fs::read_to_string(table).unwrap_or_default();
        for line in text.lines().skip(1) {
            let f: Vec<&str> = line.split_whitespace().collect();
            // local_address is f[1] (hex ip:port), st is f[3] (0A = LISTEN), inode f[9].
            if f.len() > 9 && f[3] == "0A" && inodes.iter().any(|i| i == f[9]) {
                if let Some((_, port)) = f[1].rsplit_once(':') {
                    ports.push(u16::from_str_radix(port, 16).unwrap());
                }
            }
        }
    }
    ports.sort();
    ports.dedup();
    ports
}

#[test]
fn nothing_listens_without_http_listen() {
    let pg = PgServer::start();
    let weir = Weir::for_pg(&pg).start();
    assert_eq!(listening_ports(weir.pid()), vec![weir.port()]);

    // With it, exactly one more port.
    let http = free_port();
    let weir2 = Weir::for_pg(&pg)
        .set("http_listen", format!("127.0.0.1:{http}"))
        .start();
    let mut want = vec![weir2.port(), http];
    want.sort();
    assert_eq!(listening_ports(weir2.pid()), want);
}

#[test]
fn bad_http_listen_is_refused_at_startup() {
    let pg = PgServer::start();
    let mut weir = Weir::for_pg(&pg).set("http_listen", "nonsense").spawn();
    let status = weir.wait_exit(TIMEOUT).expect("weir should exit");
    assert!(!status.success());
    assert!(weir.log().contains("http_listen"), "{}", weir.log());
}

#[test]
fn dashboard_is_self_contained() {
    let pg = PgServer::start();
    let (_weir, http) = start_with_http(&pg, "session");
    let page = get(http, "/");
    assert_eq!(page.status, 200);
    assert!(page.headers["content-type"].starts_with("text/html"));
    assert!(page.body.contains("id=\"hosts\""), "the hosts table");
    for asset in ["/dashboard.css", "/dashboard.js"] {
        assert!(page.body.contains(asset), "page links {asset}");
        let r = get(http, asset);
        assert_eq!(r.status, 200, "{asset}");
        assert!(!r.body.is_empty());
    }
    // No CDN, no external fonts: everything comes from Weir itself.
    for body in [
        &page.body,
        &get(http, "/dashboard.js").body,
        &get(http, "/dashboard.css").body,
    ] {
        assert!(
            !body.contains("http://") && !body.contains("https://") && !body.contains("//cdn"),
            "external reference in the dashboard"
        );
    }
}
