//! Command line: `weir [-d] [-q] [-v] [-u user] [-V] config.ini`, and config
//! errors.

// Tests run on their own runtime, which has a time driver (clippy.toml is for Weir's
// workers).
#![allow(clippy::disallowed_methods)]

mod common;

use common::weir::weir_command;
use common::*;
use std::fs;
use std::time::Duration;

fn run(args: &[&str]) -> std::process::Output {
    run_with_timeout(weir_command().args(args), None, TIMEOUT)
}

fn text(out: &std::process::Output) -> String {
    format!(
        "{}{}",
        String::from_utf8_lossy(&out.stdout),
        String::from_utf8_lossy(&out.stderr)
    )
}

#[test]
fn version_flag() {
    let out = run(&["-V"]);
    assert!(out.status.success(), "weir -V failed: {}", text(&out));
    let t = text(&out);
    assert!(
        t.contains(env!("CARGO_PKG_VERSION")),
        "-V output lacks the version: {t}"
    );
}

#[test]
fn help_flag() {
    let out = run(&["-h"]);
    assert!(out.status.success(), "weir -h failed: {}", text(&out));
    let t = text(&out);
    for flag in ["-d", "-q", "-v", "-u", "-V"] {
        assert!(t.contains(flag), "help does not mention {flag}: {t}");
    }
}

#[test]
fn missing_config_file() {
    let out = run(&["/nonexistent/weir.ini"]);
    assert!(
        !out.status.success(),
        "weir started without its config file"
    );
    assert!(
        text(&out).contains("/nonexistent/weir.ini"),
        "{}",
        text(&out)
    );
}

#[test]
fn no_config_argument() {
    let out = run(&[]);
    assert!(!out.status.success());
}

/// An unknown option: non-zero exit and a message naming the file, the line
/// and the option.
#[test]
fn unknown_option_names_file_line_and_option() {
    let dir = tempfile::tempdir().unwrap();
    let ini = dir.path().join("bad.ini");
    fs::write(
        &ini,
        "[databases]\n\
         db = host=127.0.0.1 dbname=postgres\n\
         \n\
         [pgbouncer]\n\
         listen_port = 1\n\
         frobnicate_level = 11\n",
    )
    .unwrap();
    let out = run(&[ini.to_str().unwrap()]);
    assert!(!out.status.success(), "weir accepted an unknown option");
    let t = text(&out);
    assert!(
        t.contains(ini.to_str().unwrap()),
        "message does not name the file: {t}"
    );
    assert!(t.contains('6'), "message does not name line 6: {t}");
    assert!(
        t.contains("frobnicate_level"),
        "message does not name the option: {t}"
    );
}

#[test]
fn invalid_value_is_rejected() {
    for (option, value) in [("pool_mode", "sometimes"), ("log_format", "yaml")] {
        let dir = tempfile::tempdir().unwrap();
        let ini = dir.path().join("bad.ini");
        fs::write(
            &ini,
            format!("[databases]\ndb = host=127.0.0.1\n[pgbouncer]\nlisten_port = 1\n{option} = {value}\n"),
        )
        .unwrap();
        let out = run(&[ini.to_str().unwrap()]);
        assert!(!out.status.success(), "weir accepted {option} = {value}");
        let t = text(&out);
        assert!(t.contains(option), "message does not name the option: {t}");
    }
}

/// max_prepared_statements out of 0..=2147483647 (PgBouncer's C int) is refused at
/// startup in PgBouncer's words (its test_prepared.py:
/// test_prepared_statement_parsing_config); the bounds are taken (weir-config's unit
/// test). Milliseconds.
#[test]
fn max_prepared_statements_past_a_c_int_is_refused() {
    let dir = tempfile::tempdir().unwrap();
    let ini = dir.path().join("ps.ini");
    for value in ["-1", "3147483648"] {
        fs::write(
            &ini,
            format!(
                "[databases]\ndb = host=127.0.0.1\n[pgbouncer]\nlisten_port = 1\n\
                 max_prepared_statements = {value}\n"
            ),
        )
        .unwrap();
        let out = run(&[ini.to_str().unwrap()]);
        let t = text(&out);
        assert!(!out.status.success(), "{value} taken: {t}");
        assert!(
            t.contains(&format!("invalid max_prepared_statements = {value}")),
            "{value}: {t}"
        );
    }
}

/// One host with two ports is refused at startup in PgBouncer's words (its test_misc.py:
/// test_multi_port_validation looks for `invalid number of ports`). Milliseconds.
#[test]
fn a_port_list_that_does_not_fit_the_hosts_is_refused() {
    let dir = tempfile::tempdir().unwrap();
    let ini = dir.path().join("ports.ini");
    fs::write(
        &ini,
        "[databases]\ndb = host=127.0.0.1 port=5432,5433\n[pgbouncer]\nlisten_port = 1\n",
    )
    .unwrap();
    let out = run(&[ini.to_str().unwrap()]);
    assert!(!out.status.success(), "weir took 2 ports for 1 host");
    let t = text(&out);
    assert!(t.contains("invalid number of ports"), "{t}");
}

/// Reads a process's real uid from /proc.
fn uid_of(pid: i32) -> Option<u32> {
    let status = fs::read_to_string(format!("/proc/{pid}/status")).ok()?;
    let line = status.lines().find(|l| l.starts_with("Uid:"))?;
    line.split_whitespace().nth(1)?.parse().ok()
}

fn pid_alive(pid: i32) -> bool {
    let exists = unsafe { libc::kill(pid, 0) } == 0;
    let zombie = fs::read_to_string(format!("/proc/{pid}/stat"))
        .map(|s| {
            s.rsplit(')')
                .next()
                .unwrap_or("")
                .trim_start()
                .starts_with('Z')
        })
        .unwrap_or(true);
    exists && !zombie
}

/// SIGKILLs the processes that have `arg` (a unique temp path) as one of
/// their command-line arguments.
fn kill_processes_with_arg(arg: &str) {
    for e in fs::read_dir("/proc").unwrap().flatten() {
        let Ok(pid) = e.file_name().to_string_lossy().parse::<i32>() else {
            continue;
        };
        let Ok(cmdline) = fs::read(e.path().join("cmdline")) else {
            continue;
        };
        if cmdline.split(|&b| b == 0).any(|a| a == arg.as_bytes()) {
            unsafe { libc::kill(pid, libc::SIGKILL) };
        }
    }
}

/// Kills a daemonized weir (found by its unique config path) when the test
/// ends, however it ends.
struct DaemonGuard(String);
impl Drop for DaemonGuard {
    fn drop(&mut self) {
        kill_processes_with_arg(&self.0);
    }
}

/// `-d`: the command returns, the daemon runs on, writes its pid file and
/// log file, and serves.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn daemon_mode_with_logfile_and_pidfile() {
    let pg = PgServer::start();
    let dir = tempfile::tempdir().unwrap();
    let port = free_port();
    let pidfile = dir.path().join("weir.pid");
    let ini = Weir::for_pg(&pg)
        .set("pidfile", pidfile.display())
        .write(dir.path(), port);
    let _guard = DaemonGuard(ini.to_str().unwrap().to_string());
    let out = run(&["-d", ini.to_str().unwrap()]);
    assert!(out.status.success(), "weir -d failed: {}", text(&out));
    assert!(
        eventually(TIMEOUT, || fs::read_to_string(&pidfile)
            .is_ok_and(|s| s.trim().parse::<i32>().is_ok())),
        "no pid file at {pidfile:?}"
    );
    let pid: i32 = fs::read_to_string(&pidfile)
        .unwrap()
        .trim()
        .parse()
        .unwrap();
    assert!(pid_alive(pid), "the pid in the pid file is not running");
    assert!(eventually(TIMEOUT, || std::net::TcpStream::connect((
        "127.0.0.1",
        port
    ))
    .is_ok()));
    let c = connect(port, "postgres", "postgres").await.unwrap();
    assert_eq!(q1(&c, "select 'daemon'").await, "daemon");
    drop(c);
    let log = dir.path().join("weir.log");
    assert!(
        eventually(TIMEOUT, || fs::metadata(&log).is_ok_and(|m| m.len() > 0)),
        "the daemon wrote nothing to its logfile"
    );
    unsafe { libc::kill(pid, libc::SIGTERM) };
    assert!(
        eventually(TIMEOUT, || !pid_alive(pid)),
        "daemon did not exit on SIGTERM"
    );
    assert!(
        eventually(Duration::from_secs(5), || !pidfile.exists()),
        "pid file left behind after a clean exit"
    );
}

/// Like PgBouncer, `-d` without a pidfile is refused. With log_format = json the refusal,
/// written before logging starts, is a JSON line like every other.
#[test]
fn daemon_mode_without_pidfile_is_refused() {
    for format in ["text", "json"] {
        let dir = tempfile::tempdir().unwrap();
        let port = free_port();
        let ini = Weir::builder()
            .database("db", "host=127.0.0.1 dbname=postgres")
            .set("log_format", format)
            .write(dir.path(), port);
        let out = run(&["-d", ini.to_str().unwrap()]);
        if out.status.success() {
            // It daemonized anyway: stop that daemon (we know it only by the
            // unique config path on its command line) before failing.
            kill_processes_with_arg(ini.to_str().unwrap());
        }
        assert!(
            !out.status.success(),
            "weir -d without pidfile exited 0 (and daemonized)"
        );
        let t = text(&out);
        assert!(
            t.contains("pidfile"),
            "message does not mention pidfile: {t}"
        );
        if format == "json" {
            let v: serde_json::Value = serde_json::from_str(t.trim_end())
                .unwrap_or_else(|e| panic!("not one JSON line ({e}): {t}"));
            assert_eq!(v["level"], "FATAL", "{t}");
            assert_eq!(v["msg"], "daemon mode needs pidfile configured", "{t}");
        } else {
            assert!(t.starts_with("weir: "), "{t}");
        }
        assert!(std::net::TcpStream::connect(("127.0.0.1", port)).is_err());
    }
}

/// Without `-q` Weir logs to stderr (as well as to the logfile); with `-q`
/// stderr stays empty while the logfile still gets the log.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn quiet_flag_silences_stderr() {
    let pg = PgServer::start();
    let loud = Weir::for_pg(&pg).start();
    assert_serving(&loud, "postgres", "postgres").await;
    let quiet = Weir::for_pg(&pg).arg("-q").start();
    assert_serving(&quiet, "postgres", "postgres").await;
    assert!(
        eventually(TIMEOUT, || !loud.stderr().is_empty()),
        "without -q nothing is logged to stderr"
    );
    assert!(
        eventually(TIMEOUT, || !quiet.logfile().is_empty()),
        "-q: logfile empty"
    );
    assert_eq!(quiet.stderr(), "", "-q: stderr is not empty");
}

/// `-v` makes the log more verbose for the same work.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn verbose_flag_logs_more() {
    let pg = PgServer::start();
    let normal = Weir::for_pg(&pg).set("pool_mode", "transaction").start();
    let verbose = Weir::for_pg(&pg)
        .set("pool_mode", "transaction")
        .arg("-v")
        .start();
    for w in [&normal, &verbose] {
        for _ in 0..3 {
            let c = connect(w.port(), "postgres", "postgres").await.unwrap();
            q1(&c, "select 1").await;
        }
    }
    tokio::time::sleep(Duration::from_millis(300)).await;
    let (n, v) = (normal.logfile().len(), verbose.logfile().len());
    assert!(
        v > n,
        "-v log ({v} bytes) is not longer than the normal log ({n} bytes)"
    );
}

/// `-u user`: switch to that user after reading the config (root only).
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn user_flag_switches_user() {
    if !is_root() {
        eprintln!("skipped: -u needs root");
        return;
    }
    let pg = PgServer::start();
    let weir = Weir::for_pg(&pg).arg("-u").arg("nobody").spawn();
    // The temp dir is root's; the log file may not be writable after the
    // switch, so wait on the port and the process only.
    let port = weir.port();
    let ok = eventually(TIMEOUT, || {
        std::net::TcpStream::connect(("127.0.0.1", port)).is_ok()
    });
    assert!(ok, "weir -u nobody is not listening\n{}", weir.log_tail());
    let nobody: u32 = {
        let name = std::ffi::CString::new("nobody").unwrap();
        let pw = unsafe { libc::getpwnam(name.as_ptr()) };
        assert!(!pw.is_null());
        unsafe { (*pw).pw_uid }
    };
    assert!(
        eventually(TIMEOUT, || uid_of(weir.pid()) == Some(nobody)),
        "weir -u nobody still runs as uid {:?}",
        uid_of(weir.pid())
    );
    assert_serving(&weir, "postgres", "postgres").await;
}

/// Several workers listen with SO_REUSEPORT, which must not let a second instance share
/// a port the first one holds: it is refused as "in use", as without workers.
#[test]
fn second_instance_on_the_same_port_is_refused_with_workers() {
    let pg = PgServer::start();
    let first = Weir::for_pg(&pg).set("workers", 2).start();
    let dir = tempfile::tempdir().unwrap();
    let ini = Weir::for_pg(&pg)
        .set("workers", 2)
        .set("unix_socket_dir", "")
        .write(dir.path(), first.port());
    let out = run(&[ini.to_str().unwrap()]);
    if out.status.success() {
        kill_processes_with_arg(ini.to_str().unwrap());
    }
    assert!(
        !out.status.success(),
        "a second weir started on port {} beside the first",
        first.port()
    );
    assert!(text(&out).contains("in use"), "{}", text(&out));
}
