//! deploy/grafana/weir.json, the Grafana dashboard: shaped for import as it is (a title,
//! a uid, unique panel ids, every query on the data source variable), and every metric
//! its queries name is one a live Weir's /metrics serves, with the labels the queries
//! use on it. A renamed metric or label breaks this test, not a user's dashboard.

mod common;

use std::collections::{BTreeMap, BTreeSet};
use std::path::Path;
use std::time::Duration;

use common::hosts::{entry, fast_checks, pair};
use common::http::http_get;
use common::*;
use serde_json::Value;

const DASHBOARD: &str = "deploy/grafana/weir.json";
/// The Helm chart's copy: `.Files.Get` reads only inside the chart.
const CHART_COPY: &str = "deploy/helm/weir/dashboards/weir.json";

/// Labels Prometheus adds to what it scrapes, so /metrics does not carry them.
const TARGET_LABELS: [&str; 2] = ["instance", "job"];

fn read(rel: &str) -> String {
    let path = Path::new(env!("CARGO_MANIFEST_DIR")).join(rel);
    std::fs::read_to_string(&path).unwrap_or_else(|e| panic!("{}: {e}", path.display()))
}

fn dashboard() -> Value {
    serde_json::from_str(&read(DASHBOARD)).expect("deploy/grafana/weir.json is JSON")
}

/// Every panel, those inside rows (collapsed rows keep theirs in `panels`) included.
fn all_panels(d: &Value) -> Vec<&Value> {
    let mut out = Vec::new();
    for p in d["panels"].as_array().expect("panels") {
        out.push(p);
        if let Some(inner) = p["panels"].as_array() {
            out.extend(inner);
        }
    }
    out
}

/// Every PromQL expression: the panels' targets and the query variables' queries.
fn expressions(d: &Value) -> Vec<(String, String)> {
    let mut out = Vec::new();
    for p in all_panels(d) {
        for t in p["targets"].as_array().into_iter().flatten() {
            let expr = t["expr"]
                .as_str()
                .unwrap_or_else(|| panic!("a target without expr: {t}"));
            out.push((
                p["title"].as_str().unwrap_or("").to_owned(),
                expr.to_owned(),
            ));
        }
    }
    for v in d["templating"]["list"].as_array().expect("templating.list") {
        if v["type"] == "query" {
            let q = v["query"]["query"]
                .as_str()
                .or(v["query"].as_str())
                .expect("query");
            out.push((format!("variable {}", v["name"]), q.to_owned()));
        }
    }
    out
}

fn is_ident(c: u8) -> bool {
    c.is_ascii_alphanumeric() || c == b'_' || c == b':'
}

/// The index one past the bracket that closes the one at `open`, skipping quoted strings.
fn closing(s: &[u8], open: usize) -> usize {
    let (o, c) = (
        s[open],
        match s[open] {
            b'(' => b')',
            b'{' => b'}',
            _ => b']',
        },
    );
    let (mut depth, mut i) = (0, open);
    while i < s.len() {
        match s[i] {
            b'"' => {
                i += 1;
                while s[i] != b'"' {
                    i += if s[i] == b'\\' { 2 } else { 1 };
                }
            }
            x if x == o => depth += 1,
            x if x == c => {
                depth -= 1;
                if depth == 0 {
                    return i + 1;
                }
            }
            _ => {}
        }
        i += 1;
    }
    panic!("unbalanced {} in {}", o as char, String::from_utf8_lossy(s));
}

/// A metric a query names, and the labels it asks of that metric: in its own matchers,
/// in a `by (...)` around it, or as label_values' label.
#[derive(Debug, Default)]
struct Uses(BTreeMap<String, BTreeSet<String>>);

impl Uses {
    fn of(expr: &str) -> Uses {
        let s = expr.as_bytes();
        assert_balanced(expr);
        let mut uses = Uses::default();
        for (name, at) in metric_names(s, 0, s.len()) {
            let labels = uses.0.entry(name).or_default();
            let end = at;
            if s.get(end) == Some(&b'{') {
                labels.extend(matcher_labels(&expr[end + 1..closing(s, end) - 1]));
            }
        }
        // `by (labels) (body)`: each metric in the body must carry the labels.
        let mut i = 0;
        while let Some(pos) = expr[i..].find("by") {
            let at = i + pos;
            i = at + 2;
            if at > 0 && is_ident(s[at - 1]) || s.get(at + 2).is_some_and(|c| is_ident(*c)) {
                continue;
            }
            let open = at + 2 + expr[at + 2..].find('(').expect("by (");
            let close = closing(s, open);
            let grouping: Vec<String> = expr[open + 1..close - 1]
                .split(',')
                .map(|l| l.trim().to_owned())
                .collect();
            let body = close
                + expr[close..].find('(').unwrap_or_else(|| {
                    panic!("write `by (...)` before its body, not after: {expr}")
                });
            for (name, _) in metric_names(s, body, closing(s, body)) {
                uses.0
                    .get_mut(&name)
                    .expect("seen")
                    .extend(grouping.iter().cloned());
            }
        }
        if let Some(args) = expr.strip_prefix("label_values(") {
            let label = args
                .trim_end_matches(')')
                .rsplit(',')
                .next()
                .unwrap()
                .trim();
            for labels in uses.0.values_mut() {
                labels.insert(label.to_owned());
            }
        }
        for labels in uses.0.values_mut() {
            labels.retain(|l| !TARGET_LABELS.contains(&l.as_str()));
        }
        uses
    }

    /// The metrics inside `rate(...)` or `increase(...)`.
    fn rated(expr: &str) -> BTreeSet<String> {
        let s = expr.as_bytes();
        let mut out = BTreeSet::new();
        for f in ["rate(", "increase("] {
            let mut i = 0;
            while let Some(pos) = expr[i..].find(f) {
                let start = i + pos;
                i = start + f.len();
                if start > 0 && is_ident(s[start - 1]) {
                    continue; // irate( is not rate(
                }
                let open = i - 1;
                out.extend(
                    metric_names(s, open, closing(s, open))
                        .into_iter()
                        .map(|(n, _)| n),
                );
            }
        }
        out
    }
}

/// `weir_...` identifiers in s[from..to], each with the index just past it.
fn metric_names(s: &[u8], from: usize, to: usize) -> Vec<(String, usize)> {
    let mut out = Vec::new();
    let mut i = from;
    while i < to {
        if s[i] == b'"' {
            i = skip_string(s, i);
            continue;
        }
        if s[i..].starts_with(b"weir_") && (i == 0 || !is_ident(s[i - 1])) {
            let end = i + s[i..].iter().take_while(|c| is_ident(**c)).count();
            out.push((String::from_utf8_lossy(&s[i..end]).into_owned(), end));
            i = end;
        } else {
            i += 1;
        }
    }
    out
}

fn skip_string(s: &[u8], open: usize) -> usize {
    let mut i = open + 1;
    while s[i] != b'"' {
        i += if s[i] == b'\\' { 2 } else { 1 };
    }
    i + 1
}

/// The label names of matchers `a="x", b=~"y"`.
fn matcher_labels(m: &str) -> Vec<String> {
    let s = m.as_bytes();
    let (mut out, mut i) = (Vec::new(), 0);
    while i < s.len() {
        while i < s.len() && (s[i] == b',' || s[i].is_ascii_whitespace()) {
            i += 1;
        }
        let start = i;
        while i < s.len() && is_ident(s[i]) {
            i += 1;
        }
        if i == start {
            break;
        }
        out.push(m[start..i].to_owned());
        let q = i + m[i..]
            .find('"')
            .unwrap_or_else(|| panic!("matcher without a value: {m}"));
        assert!(
            ["=", "!=", "=~", "!~"].contains(&m[i..q].trim()),
            "bad matcher operator in {{{m}}}"
        );
        i = skip_string(s, q);
    }
    out
}

/// Brackets pair up and strings close: what a typo most often breaks. (The full grammar
/// was checked with Prometheus' own parser when the dashboard was written.)
fn assert_balanced(expr: &str) {
    let mut stack = Vec::new();
    let s = expr.as_bytes();
    let mut i = 0;
    while i < s.len() {
        match s[i] {
            b'"' => {
                assert!(expr[i + 1..].contains('"'), "unclosed string in {expr}");
                i = skip_string(s, i);
                continue;
            }
            b'(' | b'{' | b'[' => stack.push(s[i]),
            c @ (b')' | b'}' | b']') => {
                let want = match c {
                    b')' => b'(',
                    b'}' => b'{',
                    _ => b'[',
                };
                assert_eq!(stack.pop(), Some(want), "unbalanced brackets in {expr}");
            }
            _ => {}
        }
        i += 1;
    }
    assert!(stack.is_empty(), "unclosed brackets in {expr}");
}

#[test]
fn dashboard_is_importable_as_it_is() {
    let d = dashboard();
    assert_eq!(d["title"], "Weir");
    let uid = d["uid"].as_str().expect("uid");
    assert!(!uid.is_empty() && uid.len() <= 40, "uid {uid}");
    // An import that keeps the id would overwrite whichever dashboard has it.
    assert!(d["id"].is_null(), "id must be null");
    assert!(d["schemaVersion"].as_u64().unwrap() >= 36, "schemaVersion");

    // The data source is a variable of type datasource: the import asks nothing, and the
    // sidecar (which does not fill in ${DS_...} inputs) loads it as well.
    let vars = d["templating"]["list"].as_array().expect("templating");
    let ds = vars
        .iter()
        .find(|v| v["type"] == "datasource")
        .expect("a datasource variable");
    assert_eq!(ds["query"], "prometheus");
    let ds_ref = format!("${{{}}}", ds["name"].as_str().unwrap());
    assert!(d.get("__inputs").is_none(), "no import inputs");
    for v in vars.iter().filter(|v| v["type"] == "query") {
        assert_eq!(
            v["datasource"]["uid"],
            ds_ref.as_str(),
            "variable {}",
            v["name"]
        );
    }
    for name in ["instance", "database", "user"] {
        assert!(vars.iter().any(|v| v["name"] == name), "variable {name}");
    }

    let mut ids = BTreeSet::new();
    let mut kinds = BTreeSet::new();
    for p in all_panels(&d) {
        let id = p["id"]
            .as_u64()
            .unwrap_or_else(|| panic!("a panel without id: {}", p["title"]));
        assert!(ids.insert(id), "panel id {id} twice");
        assert!(
            p["title"].as_str().is_some_and(|t| !t.is_empty()),
            "panel {id} has no title"
        );
        assert!(
            p["gridPos"]["w"].as_u64().is_some_and(|w| w <= 24),
            "panel {id} gridPos"
        );
        let kind = p["type"].as_str().expect("type");
        kinds.insert(kind);
        if kind == "row" {
            continue;
        }
        assert_eq!(
            p["datasource"]["uid"],
            ds_ref.as_str(),
            "panel {}",
            p["title"]
        );
        let targets = p["targets"].as_array().expect("targets");
        assert!(!targets.is_empty(), "panel {} has no query", p["title"]);
        let mut refs = BTreeSet::new();
        for t in targets {
            assert_eq!(
                t["datasource"]["uid"],
                ds_ref.as_str(),
                "panel {}",
                p["title"]
            );
            assert!(
                refs.insert(t["refId"].as_str().expect("refId")),
                "refId twice"
            );
        }
    }
    let known = [
        "row",
        "timeseries",
        "stat",
        "table",
        "state-timeline",
        "heatmap",
    ];
    assert!(
        kinds.iter().all(|k| known.contains(k)),
        "panel types {kinds:?}"
    );

    // Every query keeps to the selected instances, and a pool's metrics to the selected
    // pools.
    for (panel, expr) in expressions(&d) {
        for (name, at) in metric_names(expr.as_bytes(), 0, expr.len()) {
            let matchers = if expr.as_bytes().get(at) == Some(&b'{') {
                &expr[at..closing(expr.as_bytes(), at)]
            } else {
                ""
            };
            if panel != "variable \"instance\"" {
                assert!(
                    matchers.contains("instance=~\"$instance\""),
                    "{panel}: {expr}"
                );
            }
            if name.starts_with("weir_pool_") && !panel.starts_with("variable") {
                for m in ["database=~\"$database\"", "user=~\"$user\""] {
                    assert!(matchers.contains(m), "{panel}: {name} without {m}: {expr}");
                }
            }
        }
    }

    assert!(
        read(CHART_COPY) == read(DASHBOARD),
        "{CHART_COPY} differs from {DASHBOARD}: copy it over"
    );
}

/// A scrape: for each sample name, the label names its samples carry; and each family's
/// declared type.
struct Scrape {
    samples: BTreeMap<String, BTreeSet<String>>,
    types: BTreeMap<String, String>,
}

fn scrape(http: u16) -> Scrape {
    let body = http_get(http, "/metrics").expect("GET /metrics").body;
    let mut s = Scrape {
        samples: BTreeMap::new(),
        types: BTreeMap::new(),
    };
    for line in body.lines() {
        if let Some(rest) = line.strip_prefix("# TYPE ") {
            let (family, kind) = rest.split_once(' ').expect("# TYPE name type");
            s.types.insert(family.to_owned(), kind.to_owned());
            continue;
        }
        if line.starts_with('#') || line.is_empty() {
            continue;
        }
        let name_end = line.find(['{', ' ']).expect("a sample");
        let labels = s.samples.entry(line[..name_end].to_owned()).or_default();
        if line.as_bytes()[name_end] == b'{' {
            let close = closing(line.as_bytes(), name_end);
            labels.extend(matcher_labels(&line[name_end + 1..close - 1]));
        }
    }
    s
}

impl Scrape {
    /// The family a sample name belongs to, by the suffixes OpenMetrics gives samples.
    fn family(&self, sample: &str) -> Option<(&str, &str)> {
        let mut candidates = vec![sample];
        for suffix in ["_total", "_bucket", "_sum", "_count", "_info"] {
            if let Some(f) = sample.strip_suffix(suffix) {
                candidates.push(f);
            }
        }
        candidates.into_iter().find_map(|f| {
            self.types
                .get_key_value(f)
                .map(|(f, t)| (f.as_str(), t.as_str()))
        })
    }

    /// What the dashboard names that this scrape lacks or contradicts.
    fn problems(&self, d: &Value) -> Vec<String> {
        let mut out = Vec::new();
        for (panel, expr) in expressions(d) {
            for (name, labels) in Uses::of(&expr).0 {
                let Some(have) = self.samples.get(&name) else {
                    out.push(format!("{panel}: {name} is not in /metrics"));
                    continue;
                };
                let missing: Vec<_> = labels.difference(have).collect();
                if !missing.is_empty() {
                    out.push(format!(
                        "{panel}: {name} has no label {missing:?} ({have:?})"
                    ));
                }
            }
            for name in Uses::rated(&expr) {
                match self.family(&name) {
                    Some((_, "counter" | "histogram")) => {}
                    other => out.push(format!("{panel}: rate of {name}, a {other:?}")),
                }
            }
        }
        out
    }
}

/// Weir with a pool in front of a primary and its replica, read/write splitting and
/// health checks (so that the hosts' and replication metrics exist), given traffic of
/// every kind the dashboard shows: transactions, a prepared statement, an error.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn every_metric_the_dashboard_names_is_served() {
    let d = dashboard();
    let (primary, replica) = pair();
    let http = free_port();
    let weir = fast_checks()
        .set("http_listen", format!("127.0.0.1:{http}"))
        .set("max_prepared_statements", 10)
        .database(
            "app",
            &entry(&[primary.port(), replica.port()], "read_write_split=1"),
        )
        .start();

    let c = connect(weir.port(), "app", "postgres").await.unwrap();
    q1(&c, "select 1").await;
    c.batch_execute("begin; select 1; commit").await.unwrap();
    let stmt = c.prepare("select $1::int + 1").await.unwrap();
    for i in 0..3 {
        let row = c.query_one(&stmt, &[&i]).await.unwrap();
        assert_eq!(row.get::<_, i32>(0), i + 1);
    }
    let err = q(&c, "select 1/0").await.unwrap_err();
    assert_eq!(expect_db_error(&err).code, "22012");

    // The replica's lag appears with the first health check that finds it a standby.
    let mut problems = Vec::new();
    let ok = eventually(Duration::from_secs(10), || {
        problems = scrape(http).problems(&d);
        problems.is_empty()
    });
    assert!(
        ok,
        "the dashboard names what /metrics lacks:\n{}\n{}",
        problems.join("\n"),
        weir.log_tail()
    );

    // The traffic reached the counters the dashboard plots (not only their names).
    let body = http_get(http, "/metrics").unwrap().body;
    let value = |prefix: &str| -> f64 {
        body.lines()
            .find(|l| l.starts_with(prefix))
            .and_then(|l| l.rsplit(' ').next()?.parse().ok())
            .unwrap_or_else(|| panic!("no {prefix} in\n{body}"))
    };
    assert!(value("weir_pool_binds_total{database=\"app\"") >= 3.0);
    assert!(value("weir_errors_total{source=\"server\",class=\"22\"}") >= 1.0);
    assert!(value("weir_pool_transactions_total{database=\"app\"") >= 2.0);
}

#[test]
fn the_checker_catches_what_it_is_for() {
    let u = Uses::of(
        "sum by (database, user) (rate(weir_a_total{instance=~\"$instance\", side=\"x\"}[5m])) / sum(weir_b)",
    );
    assert_eq!(
        u.0["weir_a_total"],
        ["database", "side", "user"].map(String::from).into()
    );
    assert!(
        u.0["weir_b"].is_empty(),
        "a label outside the by's body: {u:?}"
    );
    let u = Uses::of("label_values(weir_pool_size{instance=~\"$instance\"}, database)");
    assert_eq!(u.0["weir_pool_size"], ["database".to_owned()].into());
    assert_eq!(
        Uses::rated("irate(weir_x[1m]) + increase(weir_y_total[1m])"),
        ["weir_y_total".to_owned()].into()
    );
    assert!(std::panic::catch_unwind(|| assert_balanced("sum(rate(x[5m])")).is_err());
    assert!(std::panic::catch_unwind(|| matcher_labels("a=>\"x\"")).is_err());
}

/// Grafana's own dashboard schema reads it strictly: tests/drivers/grafana, built by
/// scripts/install-drivers with Grafana's Foundation SDK (the types Grafana generates from
/// its schema, the panel plugins' options included), fails on an unknown or misspelt
/// field, a required one missing, or a value of the wrong type.
#[test]
fn grafanas_schema_reads_it_strictly() {
    let bin = drivers_dir().join("bin/grafana-check");
    let path = Path::new(env!("CARGO_MANIFEST_DIR")).join(DASHBOARD);
    let out = std::process::Command::new(&bin)
        .arg(&path)
        .output()
        .unwrap_or_else(|e| panic!("{}: {e}: run scripts/install-drivers go", bin.display()));
    let said = String::from_utf8_lossy(&out.stdout);
    assert!(
        out.status.success(),
        "{said}{}",
        String::from_utf8_lossy(&out.stderr)
    );
    assert!(said.starts_with("ok: \"Weir\""), "{said}");
}
