//! The dashboard in a real browser: headless Chromium loads `/` while pgbench runs through
//! Weir, twice a few seconds apart; the figures it renders must be nonzero and moving.
//! A screenshot is kept in target/test-artifacts/dashboard.png for a human to look at.
//!
//! Needs Chromium: found on PATH, else installed once with `apt-get install -y chromium`;
//! if that is impossible the test says so and passes without checking anything.

mod common;

use common::*;
use std::path::{Path, PathBuf};
use std::process::Command;
use std::time::Duration;

fn which(name: &str) -> Option<PathBuf> {
    let out = Command::new("which").arg(name).output().ok()?;
    if !out.status.success() {
        return None;
    }
    let p = String::from_utf8_lossy(&out.stdout).trim().to_owned();
    (!p.is_empty()).then(|| PathBuf::from(p))
}

fn find_browser() -> Option<PathBuf> {
    ["chromium", "chromium-browser", "google-chrome"]
        .iter()
        .find_map(|n| which(n))
}

/// Chromium, installing Debian's package once if needed.
fn chromium() -> Option<PathBuf> {
    if let Some(p) = find_browser() {
        return Some(p);
    }
    eprintln!("chromium not found: trying `apt-get install -y chromium`");
    let mut cmd = Command::new("apt-get");
    cmd.args(["install", "-y", "chromium"])
        .env("DEBIAN_FRONTEND", "noninteractive");
    let out = run_with_timeout(&mut cmd, None, Duration::from_secs(900));
    if !out.status.success() {
        eprintln!(
            "apt-get install chromium failed:\n{}",
            tail(&String::from_utf8_lossy(&out.stderr), 10)
        );
    }
    find_browser()
}

fn artifacts_dir() -> PathBuf {
    let target = std::env::var_os("CARGO_TARGET_DIR")
        .map(PathBuf::from)
        .unwrap_or_else(|| Path::new(env!("CARGO_MANIFEST_DIR")).join("target"));
    let dir = target.join("test-artifacts");
    std::fs::create_dir_all(&dir).unwrap();
    dir
}

struct Browser {
    bin: PathBuf,
    profile: tempfile::TempDir,
}

impl Browser {
    fn command(&self, extra: &[&str], url: &str) -> Command {
        let mut cmd = clean_command(&self.bin);
        cmd.args([
            "--headless",
            "--no-sandbox",
            "--disable-gpu",
            "--disable-dev-shm-usage",
            "--disable-background-networking",
            "--disable-component-update",
            "--disable-sync",
            "--no-first-run",
            "--hide-scrollbars",
            "--window-size=1280,900",
        ])
        .arg(format!("--user-data-dir={}", self.profile.path().display()))
        .args(extra)
        .arg(url);
        cmd
    }

    /// The page's DOM after `budget_ms` of (virtual) time: several polls of /api/stats.
    fn dump_dom(&self, url: &str, budget_ms: u32) -> String {
        let budget = format!("--virtual-time-budget={budget_ms}");
        let out = run_with_timeout(
            &mut self.command(&["--dump-dom", &budget], url),
            None,
            Duration::from_secs(120),
        );
        let dom = String::from_utf8_lossy(&out.stdout).into_owned();
        assert!(
            dom.contains("kpi-xacts-total"),
            "chromium printed no dashboard DOM (exit {:?}):\n{}\n{}",
            out.status,
            tail(&dom, 20),
            tail(&String::from_utf8_lossy(&out.stderr), 20)
        );
        dom
    }

    fn screenshot(&self, url: &str, file: &Path, size: &str) {
        let shot = format!("--screenshot={}", file.display());
        let size = format!("--window-size={size}");
        let out = run_with_timeout(
            &mut self.command(&[&shot, &size, "--virtual-time-budget=4000"], url),
            None,
            Duration::from_secs(120),
        );
        let png = std::fs::read(file).unwrap_or_default();
        assert!(
            png.starts_with(b"\x89PNG") && png.len() > 10_000,
            "no screenshot at {} (exit {:?}): {}",
            file.display(),
            out.status,
            tail(&String::from_utf8_lossy(&out.stderr), 20)
        );
    }
}

/// The `data-value` of the element with this id in a DOM dump.
fn figure(dom: &str, id: &str) -> f64 {
    let at = dom
        .find(&format!("id=\"{id}\""))
        .unwrap_or_else(|| panic!("no #{id} in the DOM"));
    let tag_end = at + dom[at..].find('>').unwrap();
    let tag = &dom[..tag_end];
    let start = tag.rfind('<').unwrap();
    let tag = &tag[start..];
    let v = tag
        .split("data-value=\"")
        .nth(1)
        .and_then(|r| r.split('"').next())
        .unwrap_or_else(|| panic!("#{id} has no data-value: {tag}"));
    v.parse()
        .unwrap_or_else(|_| panic!("#{id} data-value {v:?} is not a number"))
}

/// The text inside the element with this id (up to its first child tag).
fn text_of<'a>(dom: &'a str, id: &str) -> &'a str {
    let at = dom
        .find(&format!("id=\"{id}\""))
        .unwrap_or_else(|| panic!("no #{id} in the DOM"));
    let rest = &dom[at..];
    let start = rest.find('>').unwrap() + 1;
    let end = rest[start..].find('<').unwrap();
    &rest[start..start + end]
}

/// The cells of the pools table's first row.
fn first_pool_row(dom: &str) -> Vec<&str> {
    let table = &dom[dom.find("id=\"pools\"").expect("no pools table")..];
    let body = &table[table.find("<tbody>").unwrap()..];
    let row = &body[..body.find("</tr>").unwrap()];
    row.split("<td")
        .skip(1)
        .map(|c| {
            let c = &c[c.find('>').unwrap() + 1..];
            &c[..c.find("</td>").unwrap()]
        })
        .collect()
}

#[test]
fn dashboard_renders_live_figures() {
    let Some(bin) = chromium() else {
        eprintln!(
            "SKIPPED dashboard_renders_live_figures: chromium is not installed and \
             `apt-get install -y chromium` did not work"
        );
        return;
    };
    let browser = Browser {
        bin,
        profile: tempfile::tempdir().unwrap(),
    };

    let pg = PgServer::start();
    pgbench_direct(&pg, "postgres", "postgres", &["-i", "-q", "-s", "1"]).assert_ok();
    let http = free_port();
    let weir = Weir::for_pg(&pg)
        .set("pool_mode", "transaction")
        .set("default_pool_size", 4)
        .set("http_listen", format!("127.0.0.1:{http}"))
        .start();
    let url = format!("http://127.0.0.1:{http}/");

    // Load for the whole test: 8 clients on 4 servers, so some wait in the queue.
    let port = weir.port();
    let bench = std::thread::spawn(move || {
        let p = port.to_string();
        pgbench(&[
            "-h",
            "127.0.0.1",
            "-p",
            &p,
            "-U",
            "postgres",
            "-c",
            "8",
            "-j",
            "2",
            "-T",
            "40",
            "-N",
            "postgres",
        ])
    });
    // Some history for the charts first.
    std::thread::sleep(Duration::from_secs(6));

    let first = browser.dump_dom(&url, 3000);
    let xacts1 = figure(&first, "kpi-xacts-total");
    let tps1 = figure(&first, "kpi-tps");
    let servers1 = figure(&first, "kpi-sv-active") + figure(&first, "kpi-sv-idle");
    std::thread::sleep(Duration::from_secs(3));
    let second = browser.dump_dom(&url, 3000);
    let xacts2 = figure(&second, "kpi-xacts-total");
    let tps2 = figure(&second, "kpi-tps");

    assert!(xacts1 > 0.0, "no transactions shown: {xacts1}");
    assert!(
        xacts2 > xacts1,
        "transactions did not move: {xacts1} then {xacts2}"
    );
    assert!(tps1 > 0.0 && tps2 > 0.0, "TPS shown: {tps1}, {tps2}");
    assert!(servers1 >= 1.0, "servers shown: {servers1}");
    for dom in [&first, &second] {
        assert!(dom.contains("data-ready=\"yes\""), "status pill says ready");
        assert!(
            dom.contains("<td>postgres</td>"),
            "pools table lists the pool"
        );
        assert!(dom.contains("reachable"), "server health is shown");
        assert!(
            dom.contains("<td><span class=\"dot ok\"></span>up</td>"),
            "the hosts table shows the entry's host up"
        );
        // Tiles and pools table say which window they average over, and it is the same.
        assert!(
            dom.contains("<div class=\"sub\" data-window=\"\">last 5 s</div>"),
            "tiles do not name their window"
        );
        assert_eq!(text_of(dom, "pools-window"), "rates and averages: last 5 s");
        // One pool: the TPS tile and the pool's TPS come from the same readings.
        let row = first_pool_row(dom);
        assert_eq!(row.len(), 14, "{row:?}");
        assert_eq!(
            text_of(dom, "kpi-tps"),
            row[11],
            "tile and pools table disagree"
        );
        // Queue waits read in µs or ms, never as a bare 0.00.
        let wait = &dom[dom.find("id=\"legend-wait\"").unwrap()..];
        let wait = &wait[..wait.find("</div>").unwrap()];
        assert!(!wait.contains("0.00"), "wait legend: {wait}");
        assert!(
            wait.contains(" µs") || wait.contains(" ms") || wait.contains("<b>0</b>"),
            "wait legend: {wait}"
        );
    }

    // Two errors for the recent-errors table: one relayed from PostgreSQL, one Weir's.
    assert!(psql_via(&weir, "postgres", "postgres", "select 1/0").is_err());
    assert!(psql_via(&weir, "nosuchdb", "postgres", "select 1").is_err());

    let dir = artifacts_dir();
    let file = dir.join("dashboard.png");
    browser.screenshot(&url, &file, "1280,900");
    browser.screenshot(&url, &dir.join("dashboard-full.png"), "1280,1500");
    eprintln!("screenshots: {} and dashboard-full.png", file.display());

    let result = bench.join().unwrap();
    result.assert_clean();
}
