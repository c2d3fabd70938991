//! The Debian package (scripts/package-deb, packaging/debian/): built once from the
//! test binary, then its contents, control fields and systemd unit are checked, and the
//! binary it ships, extracted with `dpkg -x`, serves psql against a real PostgreSQL
//! with the packaged weir.ini (only ports and paths changed), rotates its log as the
//! packaged logrotate config does and hands over to `weir -d -R` as the online-restart
//! drop-in does. Installing it for real (postinst, the weir user) is not done here:
//! it would change the machine the other tests run on.

// Tests run on their own runtime, which has a time driver (clippy.toml is for Weir's
// workers).
#![allow(clippy::disallowed_methods)]

mod common;

use common::*;
use std::collections::BTreeMap;
use std::fs;
use std::path::{Path, PathBuf};
use std::process::{Child, Command, Stdio};
use std::sync::OnceLock;
use std::time::Duration;

/// The package built once for all tests here, extracted into `root`.
struct Built {
    deb: PathBuf,
    root: PathBuf,
    _dir: tempfile::TempDir,
}

fn built() -> &'static Built {
    static BUILT: OnceLock<Built> = OnceLock::new();
    BUILT.get_or_init(|| {
        let dir = tempfile::Builder::new()
            .prefix("weir-deb-")
            .tempdir()
            .expect("tempdir");
        let script = Path::new(env!("CARGO_MANIFEST_DIR")).join("scripts/package-deb");
        let out = run_with_timeout(
            Command::new(script)
                .arg("--binary")
                .arg(env!("CARGO_BIN_EXE_weir"))
                .arg("--out")
                .arg(dir.path()),
            None,
            Duration::from_secs(300),
        );
        let stdout = String::from_utf8_lossy(&out.stdout);
        assert!(
            out.status.success(),
            "scripts/package-deb failed:\n{stdout}\n{}",
            String::from_utf8_lossy(&out.stderr)
        );
        let deb = PathBuf::from(stdout.lines().last().unwrap_or_default().trim());
        assert!(
            deb.is_file() && deb.extension().is_some_and(|e| e == "deb"),
            "the last line of scripts/package-deb is not a .deb: {stdout}"
        );
        let root = dir.path().join("root");
        let x = run_with_timeout(
            Command::new("dpkg").arg("-x").arg(&deb).arg(&root),
            None,
            TIMEOUT,
        );
        assert!(x.status.success(), "dpkg -x: {x:?}");
        let e = run_with_timeout(
            Command::new("dpkg-deb")
                .arg("-e")
                .arg(&deb)
                .arg(root.join("DEBIAN")),
            None,
            TIMEOUT,
        );
        assert!(e.status.success(), "dpkg-deb -e: {e:?}");
        Built {
            deb,
            root,
            _dir: dir,
        }
    })
}

fn output(cmd: &mut Command) -> String {
    let out = run_with_timeout(cmd, None, TIMEOUT);
    assert!(
        out.status.success(),
        "{cmd:?} failed: {}",
        String::from_utf8_lossy(&out.stderr)
    );
    String::from_utf8_lossy(&out.stdout).into_owned()
}

fn tool_exists(name: &str) -> bool {
    Command::new("sh")
        .args(["-c", &format!("command -v {name}")])
        .stdout(Stdio::null())
        .status()
        .is_ok_and(|s| s.success())
}

#[test]
fn contents_modes_and_owners() {
    let listing = output(Command::new("dpkg-deb").arg("-c").arg(&built().deb));
    // path -> (mode, owner/group)
    let mut files = BTreeMap::new();
    for line in listing.lines() {
        let f: Vec<&str> = line.split_whitespace().collect();
        assert!(f.len() >= 6, "odd dpkg-deb -c line: {line}");
        let path = f[5].trim_start_matches('.').to_string();
        files.insert(path, (f[0].to_string(), f[1].to_string()));
    }
    let expected = [
        ("/usr/bin/weir", "-rwxr-xr-x"),
        ("/usr/lib/systemd/system/weir.service", "-rw-r--r--"),
        ("/etc/weir/weir.ini", "-rw-r--r--"),
        // Group weir comes from postinst (the group does not exist when dpkg unpacks).
        ("/etc/weir/userlist.txt", "-rw-r-----"),
        ("/etc/logrotate.d/weir", "-rw-r--r--"),
        ("/usr/share/man/man1/weir.1.gz", "-rw-r--r--"),
        ("/usr/share/doc/weir/copyright", "-rw-r--r--"),
        ("/usr/share/lintian/overrides/weir", "-rw-r--r--"),
        ("/usr/share/doc/weir/changelog.gz", "-rw-r--r--"),
        ("/usr/share/doc/weir/README.md.gz", "-rw-r--r--"),
        (
            "/usr/share/doc/weir/examples/online-restart.conf",
            "-rw-r--r--",
        ),
    ];
    for (path, mode) in expected {
        let Some((m, owner)) = files.get(path) else {
            panic!("{path} is not in the package:\n{listing}");
        };
        assert_eq!(m, mode, "mode of {path}");
        assert_eq!(owner, "root/root", "owner of {path}");
    }
    for (path, (mode, owner)) in &files {
        assert_eq!(owner, "root/root", "owner of {path}");
        if mode.starts_with('d') {
            assert_eq!(mode, "drwxr-xr-x", "mode of directory {path}");
        }
    }
    let regular = files.values().filter(|(m, _)| m.starts_with('-')).count();
    assert_eq!(
        regular,
        expected.len(),
        "files beyond the expected ones:\n{listing}"
    );

    let root = &built().root;
    let conffiles = fs::read_to_string(root.join("DEBIAN/conffiles")).unwrap();
    let mut conffiles: Vec<&str> = conffiles.lines().collect();
    conffiles.sort();
    assert_eq!(
        conffiles,
        [
            "/etc/logrotate.d/weir",
            "/etc/weir/userlist.txt",
            "/etc/weir/weir.ini"
        ]
    );

    // The man page renders without groff warnings, and is the binary's.
    if !tool_exists("man") {
        println!("man is not installed (package man-db): weir.1 is not rendered");
        return;
    }
    let man = root.join("usr/share/man/man1/weir.1.gz");
    let out = run_with_timeout(
        Command::new("man")
            .args(["--warnings", "-l"])
            .arg(&man)
            .env("MANWIDTH", "80")
            .env_remove("MAN_KEEP_FORMATTING"),
        None,
        TIMEOUT,
    );
    assert!(out.status.success(), "man -l weir.1.gz: {out:?}");
    // Bold and underline come as overstrikes (`X\bX`, `_\bX`): keep what is after each.
    let mut page = String::new();
    for c in String::from_utf8_lossy(&out.stdout).chars() {
        if c == '\u{8}' {
            page.pop();
        } else {
            page.push(c);
        }
    }
    assert!(
        out.stderr.is_empty(),
        "groff warnings in weir.1:\n{}",
        String::from_utf8_lossy(&out.stderr)
    );
    for flag in ["--reboot", "--daemon", "/etc/weir/weir.ini"] {
        assert!(page.contains(flag), "the man page lacks {flag}:\n{page}");
    }
    assert!(
        page.contains(env!("CARGO_PKG_VERSION")),
        "the man page names another version:\n{page}"
    );
}

#[test]
fn maintainer_scripts_parse() {
    for script in ["postinst", "prerm", "postrm"] {
        let path = built().root.join("DEBIAN").join(script);
        let out = run_with_timeout(Command::new("sh").arg("-n").arg(&path), None, TIMEOUT);
        assert!(out.status.success(), "sh -n {script}: {out:?}");
    }
}

/// `Key: value` fields of `dpkg-deb -f`, continuation lines folded into the value.
fn control_fields() -> BTreeMap<String, String> {
    let text = output(Command::new("dpkg-deb").arg("-f").arg(&built().deb));
    let mut fields = BTreeMap::new();
    let mut last = String::new();
    for line in text.lines() {
        if line.starts_with(' ') {
            fields
                .entry(last.clone())
                .and_modify(|v: &mut String| v.push_str(&format!("\n{line}")));
        } else if let Some((k, v)) = line.split_once(':') {
            last = k.to_string();
            fields.insert(last.clone(), v.trim().to_string());
        }
    }
    fields
}

#[test]
fn control_fields_match_the_build() {
    let info = output(Command::new("dpkg-deb").arg("-I").arg(&built().deb));
    let f = control_fields();
    assert_eq!(f["Package"], "weir", "{info}");
    assert_eq!(f["Version"], env!("CARGO_PKG_VERSION"), "{info}");
    let arch = output(Command::new("dpkg").arg("--print-architecture"));
    assert_eq!(f["Architecture"], arch.trim(), "{info}");
    let maint = &f["Maintainer"];
    assert!(
        maint.contains('<') && maint.ends_with('>'),
        "Maintainer is not 'name <address>': {info}"
    );
    let desc = &f["Description"];
    assert!(
        desc.lines().count() > 2 && desc.contains("PgBouncer"),
        "Description lacks a long description: {info}"
    );

    // Every shared library the packaged binary loads belongs to a package in Depends.
    let depends: Vec<String> = f["Depends"]
        .split(',')
        .map(|d| d.split_whitespace().next().unwrap_or_default().to_string())
        .collect();
    assert!(depends.iter().any(|d| d == "adduser"), "{info}");
    let bin = built().root.join("usr/bin/weir");
    let ldd = output(Command::new("ldd").arg(&bin));
    let mut libs = 0;
    for line in ldd.lines() {
        // `libc.so.6 => /lib/x86_64-linux-gnu/libc.so.6 (0x...)` or `/lib64/ld-linux... (0x...)`
        let Some(path) = line.split_whitespace().find(|w| w.starts_with('/')) else {
            continue;
        };
        let owner = output(Command::new("dpkg").arg("-S").arg(path));
        let pkg = owner.split(':').next().unwrap_or_default().trim();
        assert!(
            depends.iter().any(|d| d == pkg),
            "{path} (from {pkg}) is not in Depends: {}",
            f["Depends"]
        );
        libs += 1;
    }
    assert!(libs >= 2, "ldd found no libraries:\n{ldd}");
    let installed_kib: u64 = f["Installed-Size"].parse().expect("Installed-Size");
    let bin_kib = fs::metadata(&bin).unwrap().len() / 1024;
    assert!(
        installed_kib >= bin_kib,
        "Installed-Size {installed_kib} KiB < the binary's {bin_kib} KiB"
    );
}

#[test]
fn systemd_unit_verifies() {
    let root = &built().root;
    let unit = fs::read_to_string(root.join("usr/lib/systemd/system/weir.service")).unwrap();
    for line in [
        "Type=notify",
        "NotifyAccess=all",
        "User=weir",
        "ExecStart=/usr/bin/weir -q /etc/weir/weir.ini",
        "ExecReload=/bin/kill -HUP $MAINPID",
        "RuntimeDirectory=weir",
        "LimitNOFILE=65536",
    ] {
        assert!(unit.lines().any(|l| l == line), "weir.service lacks {line}");
    }
    if !tool_exists("systemd-analyze") {
        println!("systemd-analyze is not installed (package systemd): the unit is not verified");
        return;
    }
    // The unit as installed, but with the extracted binary, so that verify finds an
    // executable ExecStart; MANPATH lets it find Documentation=man:weir(1) in the package.
    let dir = tempfile::tempdir().unwrap();
    let bin = root.join("usr/bin/weir");
    let copy = dir.path().join("weir.service");
    fs::write(&copy, unit.replace("/usr/bin/weir", bin.to_str().unwrap())).unwrap();
    let out = run_with_timeout(
        Command::new("systemd-analyze")
            .arg("verify")
            .arg(&copy)
            .env("MANPATH", root.join("usr/share/man")),
        None,
        TIMEOUT,
    );
    // Unknown keys and bad values are warnings with exit code 0: any output fails.
    assert!(
        out.status.success() && out.stderr.is_empty() && out.stdout.is_empty(),
        "systemd-analyze verify weir.service:\n{}{}",
        String::from_utf8_lossy(&out.stdout),
        String::from_utf8_lossy(&out.stderr)
    );
}

/// A process started here, killed on drop (a failed assertion must not leave it).
struct Started(Child);

impl Drop for Started {
    fn drop(&mut self) {
        let _ = self.0.kill();
        let _ = self.0.wait();
    }
}

/// A process found through a pidfile (not our child), killed on drop.
struct Daemon(i32);

impl Drop for Daemon {
    fn drop(&mut self) {
        unsafe { libc::kill(self.0, libc::SIGKILL) };
    }
}

fn pid_alive(pid: i32) -> bool {
    // A zombie is gone for our purposes: /proc/<pid>/stat says Z.
    fs::read_to_string(format!("/proc/{pid}/stat")).is_ok_and(|s| {
        !s.rsplit(')')
            .next()
            .unwrap_or("")
            .trim_start()
            .starts_with('Z')
    })
}

fn read_pid(path: &Path) -> Option<i32> {
    fs::read_to_string(path).ok()?.trim().parse().ok()
}

/// The packaged weir.ini with only its port and paths moved into `scratch`; panics if
/// one of the settings to move is missing, so a changed default config shows here.
fn adapted_config(packaged: &str, scratch: &Path, port: u16, pg_port: u16) -> String {
    let moved = |p: &str| {
        let p = p.trim();
        for dir in ["/run/weir", "/var/log/weir", "/etc/weir"] {
            if let Some(rest) = p.strip_prefix(dir) {
                return scratch.join(&dir[1..]).display().to_string() + rest;
            }
        }
        panic!("packaged path {p} is outside /run/weir, /var/log/weir and /etc/weir");
    };
    let mut seen = Vec::new();
    let mut out = String::new();
    for line in packaged.lines() {
        let mut line = line.to_string();
        if let Some((k, v)) = line.split_once('=').filter(|_| !line.starts_with(';')) {
            let key = k.trim();
            let value = match key {
                "listen_port" => {
                    assert_eq!(v.trim(), "6432");
                    port.to_string()
                }
                "unix_socket_dir" | "pidfile" | "logfile" | "auth_file" => moved(v),
                "*" => {
                    assert!(v.contains("port=5432"), "* = {v}");
                    v.replace("port=5432", &format!("port={pg_port}"))
                }
                _ => v.trim().to_string(),
            };
            seen.push(key.to_string());
            line = format!("{key} = {value}");
        }
        out.push_str(&line);
        out.push('\n');
    }
    for key in [
        "*",
        "listen_port",
        "unix_socket_dir",
        "pidfile",
        "logfile",
        "auth_file",
        "listen_addr",
        "auth_type",
        "admin_users",
    ] {
        assert!(
            seen.iter().any(|k| k == key),
            "the packaged weir.ini has no {key}"
        );
    }
    out
}

#[test]
fn packaged_binary_and_config_serve_psql() {
    // TLS on, as Debian's PostgreSQL has it: the packaged config must not let that keep
    // a session-mode client from moving in the online restart below.
    let pg = PgServer::start();
    let certs = common::tls::Certs::new();
    pg.enable_tls(
        &certs.path("server.crt"),
        &certs.path("server.key"),
        &certs.path("ca.crt"),
    );
    let root = &built().root;
    let scratch = tempfile::Builder::new()
        .prefix("weir-deb-run-")
        .tempdir()
        .unwrap();
    for d in ["run/weir", "var/log/weir", "etc/weir"] {
        fs::create_dir_all(scratch.path().join(d)).unwrap();
    }
    let port = free_port();
    let packaged = fs::read_to_string(root.join("etc/weir/weir.ini")).unwrap();
    let ini = scratch.path().join("etc/weir/weir.ini");
    fs::write(
        &ini,
        adapted_config(&packaged, scratch.path(), port, pg.port()),
    )
    .unwrap();
    // The packaged userlist (comments only) with one user added, as an admin would.
    let password = format!("pw-{}", std::process::id());
    let mut userlist = fs::read_to_string(root.join("etc/weir/userlist.txt")).unwrap();
    userlist.push_str(&format!("\"postgres\" \"{password}\"\n"));
    fs::write(scratch.path().join("etc/weir/userlist.txt"), userlist).unwrap();
    let log = scratch.path().join("var/log/weir/weir.log");
    let pidfile = scratch.path().join("run/weir/weir.pid");
    let bin = root.join("usr/bin/weir");

    // systemd's end of Type=notify, as the unit gives it to both processes (the -R one
    // runs inside the unit too).
    let notify_path = scratch.path().join("notify.sock");
    let notify = std::os::unix::net::UnixDatagram::bind(&notify_path).unwrap();
    notify.set_read_timeout(Some(TIMEOUT)).unwrap();
    let next_notice = || {
        let mut buf = [0u8; 4096];
        let n = notify.recv(&mut buf).expect("no sd_notify message");
        String::from_utf8_lossy(&buf[..n]).into_owned()
    };

    // As the unit's ExecStart, stderr kept for failure messages.
    let stderr = scratch.path().join("stderr");
    let mut first = Started(
        clean_command(&bin)
            .arg("-q")
            .arg(&ini)
            .env("NOTIFY_SOCKET", &notify_path)
            .stderr(fs::File::create(&stderr).unwrap())
            .spawn()
            .expect("spawn the packaged weir"),
    );
    let first_pid = first.0.id() as i32;
    let why = || {
        format!(
            "stderr:\n{}\nlog:\n{}",
            tail_file(&stderr, 20),
            tail_file(&log, 30)
        )
    };
    assert!(
        eventually(TIMEOUT, || std::net::TcpStream::connect((
            "127.0.0.1",
            port
        ))
        .is_ok()),
        "the packaged weir does not listen on {port}\n{}",
        why()
    );
    assert_eq!(next_notice(), "READY=1");
    let sock_dir = scratch.path().join("run/weir");
    let sock_dir = sock_dir.to_str().unwrap();

    // TCP and the Unix socket in unix_socket_dir, with the userlist's password (the
    // packaged auth_type is scram-sha-256); a wrong one is refused.
    let q = |host: &str, db: &str, pw: &str, sql: &str| {
        psql_at(host, port, db, "postgres", Some(pw), sql)
    };
    assert_eq!(
        q("127.0.0.1", "postgres", &password, "select 6 * 7")
            .unwrap_or_else(|e| panic!("psql over TCP through the packaged weir: {e}\n{}", why())),
        "42"
    );
    assert_eq!(
        q(sock_dir, "postgres", &password, "select current_user").unwrap_or_else(|e| panic!(
            "psql over the Unix socket in /run/weir's stand-in: {e}\n{}",
            why()
        )),
        "postgres"
    );
    let refused = q("127.0.0.1", "postgres", "wrong", "select 1").unwrap_err();
    assert!(refused.contains("authentication failed"), "{refused}");
    // admin_users = postgres: the console answers.
    let version = q("127.0.0.1", "pgbouncer", &password, "SHOW VERSION").unwrap();
    assert!(version.contains("weir"), "SHOW VERSION: {version}");
    assert_eq!(read_pid(&pidfile), Some(first_pid), "pidfile");

    // logrotate's copytruncate: Weir appends, so after the truncation its next line
    // starts the file (no hole of NULs where the old end was).
    assert!(fs::metadata(&log).unwrap().len() > 0, "nothing in {log:?}");
    fs::OpenOptions::new()
        .write(true)
        .open(&log)
        .unwrap()
        .set_len(0)
        .unwrap();
    q("127.0.0.1", "postgres", &password, "select 1").unwrap();
    assert!(
        eventually(TIMEOUT, || fs::metadata(&log).is_ok_and(|m| m.len() > 0)),
        "no log line after the truncation"
    );
    let after = fs::read(&log).unwrap();
    assert_ne!(after[0], 0, "the log after copytruncate starts with a hole");

    // The online-restart drop-in's ExecReload: `weir -d -R` with the packaged config
    // takes over, returns, and the pidfile names the new process, while a client that
    // stayed connected keeps working.
    let rt = tokio::runtime::Builder::new_current_thread()
        .enable_all()
        .build()
        .unwrap();
    let mut cfg = pg_config(port, "postgres", "postgres");
    cfg.password(password.as_str());
    let (client, conn) = rt
        .block_on(cfg.connect(tokio_postgres::NoTls))
        .unwrap_or_else(|e| panic!("tokio-postgres through weir: {e}\n{}", why()));
    rt.spawn(conn);
    let before: i32 = rt
        .block_on(client.query_one("select pg_backend_pid()", &[]))
        .unwrap()
        .get(0);
    let out = run_with_timeout(
        clean_command(&bin)
            .args(["-d", "-R"])
            .arg(&ini)
            .env("NOTIFY_SOCKET", &notify_path),
        None,
        TIMEOUT,
    );
    // The parent returns once the sockets are taken over; its daemon writes the pidfile
    // a moment later.
    let mut new_pid = None;
    eventually(TIMEOUT, || {
        new_pid = read_pid(&pidfile).filter(|&p| p != first_pid);
        new_pid.is_some()
    });
    let _second = new_pid.map(Daemon);
    assert!(
        out.status.success(),
        "weir -d -R: {}\n{}",
        String::from_utf8_lossy(&out.stderr),
        why()
    );
    assert!(
        new_pid.is_some_and(pid_alive),
        "the pidfile does not name a new running weir: {new_pid:?}\n{}",
        why()
    );
    // What lets systemd follow (NotifyAccess=all): the daemonized new process names
    // itself the main process, then is ready.
    assert_eq!(next_notice(), format!("MAINPID={}", new_pid.unwrap_or(0)));
    assert_eq!(next_notice(), "READY=1");
    // Session mode: the client moves with its server connection, between transactions.
    let after: i32 = rt
        .block_on(client.query_one("select pg_backend_pid()", &[]))
        .unwrap_or_else(|e| panic!("the client after the takeover: {e}\n{}", why()))
        .get(0);
    assert_eq!(before, after, "the session changed server connection");
    // It exits only once the client has moved (a client over a TLS server connection
    // would stay with it until it disconnects).
    assert!(
        wait_timeout(&mut first.0, TIMEOUT).is_some(),
        "the old weir did not exit: its client did not move\n{}",
        why()
    );
    // The old process leaves without STOPPING=1, which would tell systemd the service
    // is going away.
    notify.set_nonblocking(true).unwrap();
    let mut buf = [0u8; 4096];
    match notify.recv(&mut buf) {
        Err(e) if e.kind() == std::io::ErrorKind::WouldBlock => {}
        other => panic!(
            "a notification after the takeover: {:?}",
            other.map(|n| String::from_utf8_lossy(&buf[..n]).into_owned())
        ),
    }
    assert_eq!(
        q("127.0.0.1", "postgres", &password, "select 'new'").unwrap(),
        "new"
    );
    drop(client);
    rt.shutdown_background();
}
