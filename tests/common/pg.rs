//! A scratch PostgreSQL server per test.
//!
//! `initdb` runs once per machine into a template directory (guarded by a
//! lock file so that parallel test binaries do not race); each [`PgServer`]
//! copies the template into its own temporary directory and starts
//! `postgres` there (as the `postgres` OS user when the tests run as root,
//! since PostgreSQL refuses to run as root).

use super::{
    free_port, ipv6_available, is_root, psql_at, run_with_timeout, tail_file, wait_timeout, TIMEOUT,
};
use std::ffi::CString;
use std::fs;
use std::os::unix::fs::PermissionsExt;
use std::os::unix::process::CommandExt;
use std::path::{Path, PathBuf};
use std::process::{Child, Command, Stdio};
use std::sync::OnceLock;
use std::time::{Duration, Instant};

/// The directory with `postgres`, `initdb`, `pg_ctl`: `pg_config --bindir`,
/// else the newest `/usr/lib/postgresql/*/bin`.
pub fn bindir() -> &'static Path {
    static DIR: OnceLock<PathBuf> = OnceLock::new();
    DIR.get_or_init(|| {
        if let Ok(out) = Command::new("pg_config").arg("--bindir").output() {
            if out.status.success() {
                let d = PathBuf::from(String::from_utf8_lossy(&out.stdout).trim());
                if d.join("postgres").exists() && d.join("initdb").exists() {
                    return d;
                }
            }
        }
        let mut best: Option<(u32, PathBuf)> = None;
        if let Ok(entries) = fs::read_dir("/usr/lib/postgresql") {
            for e in entries.flatten() {
                let v: u32 = e.file_name().to_string_lossy().parse().unwrap_or(0);
                let d = e.path().join("bin");
                if d.join("postgres").exists() && best.as_ref().is_none_or(|(bv, _)| v > *bv) {
                    best = Some((v, d));
                }
            }
        }
        best.map(|(_, d)| d)
            .expect("no PostgreSQL server found (pg_config --bindir, /usr/lib/postgresql/*/bin); run scripts/install-deps")
    })
}

fn pg_version(bin: &Path) -> String {
    let out = Command::new(bin.join("postgres"))
        .arg("--version")
        .output()
        .expect("postgres --version");
    // "postgres (PostgreSQL) 15.18 (Debian ...)"
    String::from_utf8_lossy(&out.stdout)
        .split_whitespace()
        .nth(2)
        .unwrap_or("unknown")
        .to_string()
}

/// uid/gid that PostgreSQL runs as: `postgres` when we are root, else us.
pub fn pg_owner() -> Option<(u32, u32)> {
    if !is_root() {
        return None;
    }
    let name = CString::new("postgres").unwrap();
    let pw = unsafe { libc::getpwnam(name.as_ptr()) };
    assert!(
        !pw.is_null(),
        "running as root but there is no 'postgres' OS user (scripts/install-deps creates it)"
    );
    unsafe { Some(((*pw).pw_uid, (*pw).pw_gid)) }
}

/// A command that runs as the PostgreSQL owner.
fn pg_command(program: &Path) -> Command {
    let mut cmd = super::clean_command(program);
    if let Some((uid, gid)) = pg_owner() {
        // std drops supplementary groups when changing uid from root.
        cmd.uid(uid).gid(gid);
    }
    cmd.env("LC_ALL", "C").env_remove("PGDATA");
    cmd
}

fn chown_r(path: &Path) {
    if let Some((uid, gid)) = pg_owner() {
        let st = Command::new("chown")
            .arg("-R")
            .arg(format!("{uid}:{gid}"))
            .arg(path)
            .status()
            .expect("chown");
        assert!(st.success(), "chown -R {path:?} failed");
    }
}

/// The template cluster of the server in `bin`, created on first use (once per machine,
/// found again once per test binary).
fn template(bin: &Path) -> PathBuf {
    static DIRS: std::sync::Mutex<Vec<(PathBuf, PathBuf)>> = std::sync::Mutex::new(Vec::new());
    let mut dirs = DIRS.lock().unwrap_or_else(|p| p.into_inner());
    if let Some((_, dir)) = dirs.iter().find(|(b, _)| b == bin) {
        return dir.clone();
    }
    let dir = make_template(bin);
    dirs.push((bin.to_owned(), dir.clone()));
    dir
}

fn make_template(bin: &Path) -> PathBuf {
    {
        let uid = unsafe { libc::geteuid() };
        let base = std::env::temp_dir();
        let dir = base.join(format!("weir-pg-template-{}-{uid}", pg_version(bin)));
        if dir.join("PG_VERSION").exists() {
            return dir;
        }
        // Lock so that parallel test binaries initdb only once.
        let lock_path = base.join(format!("weir-pg-template-{uid}.lock"));
        let lock = fs::OpenOptions::new()
            .create(true)
            .truncate(false)
            .write(true)
            .open(&lock_path)
            .expect("open template lock file");
        use std::os::unix::io::AsRawFd;
        assert_eq!(
            unsafe { libc::flock(lock.as_raw_fd(), libc::LOCK_EX) },
            0,
            "flock"
        );
        if !dir.join("PG_VERSION").exists() {
            let tmp = base.join(format!("weir-pg-template-tmp-{}", std::process::id()));
            let _ = fs::remove_dir_all(&tmp);
            fs::create_dir(&tmp).unwrap();
            fs::set_permissions(&tmp, fs::Permissions::from_mode(0o700)).unwrap();
            chown_r(&tmp);
            let out = run_with_timeout(
                pg_command(&bin.join("initdb")).arg("-D").arg(&tmp).args([
                    "-U",
                    "postgres",
                    "--auth=trust",
                    "-E",
                    "UTF8",
                    "--locale=C",
                    "--no-sync",
                    "--no-instructions",
                ]),
                None,
                Duration::from_secs(300),
            );
            assert!(
                out.status.success(),
                "initdb failed:\n{}\n{}",
                String::from_utf8_lossy(&out.stdout),
                String::from_utf8_lossy(&out.stderr)
            );
            let _ = fs::remove_dir_all(&dir);
            fs::rename(&tmp, &dir).expect("rename template");
        }
        unsafe { libc::flock(lock.as_raw_fd(), libc::LOCK_UN) };
        dir
    }
}

/// A running PostgreSQL server owned by one test. Stopped and removed on drop.
pub struct PgServer {
    dir: tempfile::TempDir,
    port: u16,
    child: Option<Child>,
    /// Where its `postgres` and `pg_isready` are.
    bin: &'static Path,
}

impl PgServer {
    /// Starts a fresh server (trust authentication for everything).
    pub fn start() -> PgServer {
        Self::start_in(bindir())
    }

    /// Starts a fresh PostgreSQL 18 server (protocol 3.2), installed on first use by
    /// `scripts/install-drivers pg18`; panics when it cannot be.
    pub fn start_18() -> PgServer {
        Self::start_in(super::pg18::bindir())
    }

    fn start_in(bin: &'static Path) -> PgServer {
        let tmpl = template(bin);
        let dir = tempfile::Builder::new()
            .prefix("weir-pg-")
            .tempdir()
            .expect("tempdir");
        let data = dir.path().join("data");
        let st = Command::new("cp")
            .arg("-a")
            .arg(tmpl)
            .arg(&data)
            .status()
            .expect("cp -a template");
        assert!(st.success(), "copying the template cluster failed");
        let listen = if ipv6_available() {
            "127.0.0.1,::1"
        } else {
            "127.0.0.1"
        };
        let mut conf = fs::OpenOptions::new()
            .append(true)
            .open(data.join("postgresql.conf"))
            .unwrap();
        use std::io::Write;
        writeln!(
            conf,
            "\n# weir test harness\n\
             listen_addresses = '{listen}'\n\
             unix_socket_directories = '{}'\n\
             max_connections = 200\n\
             shared_buffers = 16MB\n\
             fsync = off\n\
             synchronous_commit = off\n\
             full_page_writes = off\n\
             logging_collector = off\n\
             log_min_messages = warning\n\
             log_line_prefix = '%m [%p] %u@%d '\n",
            dir.path().display()
        )
        .unwrap();
        drop(conf);
        fs::set_permissions(dir.path(), fs::Permissions::from_mode(0o700)).unwrap();
        chown_r(dir.path());
        let mut pg = PgServer {
            dir,
            port: 0,
            child: None,
            bin,
        };
        pg.start_on_new_port();
        pg
    }

    fn start_on_new_port(&mut self) {
        for attempt in 0..3 {
            self.port = free_port();
            match self.try_start() {
                Ok(()) => return,
                Err(log) if attempt < 2 && log.contains("could not bind") => continue,
                Err(log) => panic!("PostgreSQL did not start on port {}:\n{log}", self.port),
            }
        }
    }

    fn try_start(&mut self) -> Result<(), String> {
        let log_path = self.log_path();
        let log = fs::OpenOptions::new()
            .create(true)
            .append(true)
            .open(&log_path)
            .unwrap();
        if let Some((uid, gid)) = pg_owner() {
            unsafe {
                libc::chown(
                    CString::new(log_path.to_str().unwrap()).unwrap().as_ptr(),
                    uid,
                    gid,
                )
            };
        }
        let child = pg_command(&self.bin.join("postgres"))
            .arg("-D")
            .arg(self.data_dir())
            .arg("-p")
            .arg(self.port.to_string())
            .stdout(Stdio::from(log.try_clone().unwrap()))
            .stderr(Stdio::from(log))
            .spawn()
            .map_err(|e| format!("cannot spawn postgres: {e}"))?;
        self.child = Some(child);
        let deadline = Instant::now() + Duration::from_secs(60);
        loop {
            if let Some(st) = self.child.as_mut().unwrap().try_wait().unwrap() {
                self.child = None;
                return Err(format!(
                    "postgres exited with {st}; log:\n{}",
                    tail_file(&self.log_path(), 40)
                ));
            }
            if self.accepts() {
                return Ok(());
            }
            if Instant::now() > deadline {
                self.kill();
                return Err(format!(
                    "postgres not ready after 60 s; log:\n{}",
                    tail_file(&self.log_path(), 40)
                ));
            }
            std::thread::sleep(Duration::from_millis(50));
        }
    }

    fn accepts(&self) -> bool {
        let out = Command::new(self.bin.join("pg_isready"))
            .args([
                "-q",
                "-h",
                "127.0.0.1",
                "-p",
                &self.port.to_string(),
                "-U",
                "postgres",
                "-d",
                "postgres",
                "-t",
                "2",
            ])
            .stdout(Stdio::null())
            .stderr(Stdio::null())
            .status();
        matches!(out, Ok(s) if s.success())
    }

    pub fn port(&self) -> u16 {
        self.port
    }

    /// Directory holding the server's Unix socket `.s.PGSQL.<port>`.
    pub fn socket_dir(&self) -> &Path {
        self.dir.path()
    }

    pub fn data_dir(&self) -> PathBuf {
        self.dir.path().join("data")
    }

    pub fn log_path(&self) -> PathBuf {
        self.dir.path().join("postgres.log")
    }

    pub fn log(&self) -> String {
        fs::read_to_string(self.log_path()).unwrap_or_default()
    }

    /// Connection string for a `[databases]` entry of Weir's config.
    pub fn connstr(&self) -> String {
        format!("host=127.0.0.1 port={} dbname=postgres", self.port)
    }

    /// `psql -c sql` as postgres over the Unix socket; panics on error.
    pub fn psql(&self, sql: &str) -> String {
        self.try_psql(sql)
            .unwrap_or_else(|e| panic!("psql failed: {sql}\n{e}"))
    }

    pub fn try_psql(&self, sql: &str) -> Result<String, String> {
        psql_at(
            self.dir.path().to_str().unwrap(),
            self.port,
            "postgres",
            "postgres",
            None,
            sql,
        )
    }

    /// Runs SQL (possibly several statements) as postgres; panics on error.
    pub fn exec(&self, sql: &str) {
        self.psql(sql);
    }

    /// Creates a login role whose stored password uses `method` (`md5` or
    /// `scram-sha-256`), with rights to create tables in schema public.
    pub fn create_user(&self, name: &str, password: &str, method: &str) {
        self.exec(&format!(
            "set password_encryption = '{method}'; \
             create role \"{name}\" login password '{password}'; \
             grant all on schema public to \"{name}\";"
        ));
    }

    /// The role `lookup` and PgBouncer's documented auth_query function,
    /// `public.user_lookup`, which only it may call (see `WeirBuilder::auth_query_lookup`).
    pub fn create_user_lookup(&self) {
        self.exec(
            "create role lookup login; \
             create function public.user_lookup(in i_username text, out usename text, out passwd text) \
             returns record as $$ \
             begin \
               select s.usename, s.passwd from pg_catalog.pg_shadow s \
                where s.usename = i_username and not s.usesuper into usename, passwd; \
               return; \
             end; $$ language plpgsql security definer; \
             revoke all on function public.user_lookup(text) from public; \
             grant execute on function public.user_lookup(text) to lookup;",
        );
    }

    /// The stored password verifier of a role (`md5...` or `SCRAM-SHA-256$...`).
    pub fn stored_password(&self, name: &str) -> String {
        self.psql(&format!(
            "select rolpassword from pg_authid where rolname = '{name}'"
        ))
    }

    /// Replaces pg_hba.conf: `local all postgres trust` first (the harness's
    /// own connections), then `lines`, then trust for everything else; then
    /// reloads and waits until the new file is in effect.
    pub fn set_hba(&self, lines: &[&str]) {
        let mut text = String::from("local all postgres trust\n");
        for l in lines {
            text.push_str(l);
            text.push('\n');
        }
        text.push_str(
            "local all all trust\n\
             host all all 127.0.0.1/32 trust\n\
             host all all ::1/128 trust\n",
        );
        let path = self.data_dir().join("pg_hba.conf");
        fs::write(&path, text).unwrap();
        chown_r(&path);
        self.reload();
    }

    /// Turns TLS on with `cert`/`key` (copied into the data directory, as PostgreSQL
    /// wants its key owned by it and private) and `ca` for client certificates, then
    /// reloads. Other tests are untouched: the harness starts servers with ssl off.
    pub fn enable_tls(&self, cert: &Path, key: &Path, ca: &Path) {
        let data = self.data_dir();
        for (from, to) in [(cert, "server.crt"), (key, "server.key"), (ca, "root.crt")] {
            fs::copy(from, data.join(to)).expect("copy TLS file");
            fs::set_permissions(data.join(to), fs::Permissions::from_mode(0o600)).unwrap();
            chown_r(&data.join(to));
        }
        let mut conf = fs::OpenOptions::new()
            .append(true)
            .open(data.join("postgresql.conf"))
            .unwrap();
        use std::io::Write;
        writeln!(
            conf,
            "ssl = on\nssl_cert_file = 'server.crt'\nssl_key_file = 'server.key'\n\
             ssl_ca_file = 'root.crt'"
        )
        .unwrap();
        drop(conf);
        self.reload();
    }

    /// Replaces pg_hba.conf with exactly `local all postgres trust` (the harness's own
    /// connections) and `lines`: unlike `set_hba`, nothing else is let in.
    pub fn set_hba_only(&self, lines: &[&str]) {
        let mut text = String::from("local all postgres trust\n");
        for l in lines {
            text.push_str(l);
            text.push('\n');
        }
        let path = self.data_dir().join("pg_hba.conf");
        fs::write(&path, text).unwrap();
        chown_r(&path);
        self.reload();
    }

    /// `pg_reload_conf()` and wait until new backends see the reload.
    pub fn reload(&self) {
        let before = self.psql("select pg_conf_load_time()");
        std::thread::sleep(Duration::from_millis(20));
        self.psql("select pg_reload_conf()");
        let ok = super::eventually(TIMEOUT, || {
            self.psql("select pg_conf_load_time()") != before
        });
        assert!(ok, "PostgreSQL did not reload its configuration");
    }

    /// Number of client backends whose `usename` is `user`.
    pub fn count_backends(&self, user: &str) -> i64 {
        self.count_backends_where(&format!("usename = '{user}'"))
    }

    /// Number of client backends (other than the one asking) matching an SQL
    /// condition over pg_stat_activity.
    pub fn count_backends_where(&self, condition: &str) -> i64 {
        self.psql(&format!(
            "select count(*) from pg_stat_activity where backend_type = 'client backend' \
             and pid <> pg_backend_pid() and ({condition})"
        ))
        .trim()
        .parse()
        .unwrap()
    }

    fn postmaster_pid(&self) -> Option<i32> {
        let text = fs::read_to_string(self.data_dir().join("postmaster.pid")).ok()?;
        text.lines().next()?.trim().parse().ok()
    }

    /// Stops the server (fast shutdown: sessions are terminated).
    pub fn stop(&mut self) {
        self.stop_with(libc::SIGINT);
    }

    /// Immediate shutdown (like a crash).
    pub fn stop_immediate(&mut self) {
        self.stop_with(libc::SIGQUIT);
    }

    /// A crash of the whole server, as near at once as signals go: the postmaster is
    /// stopped (so it forks and notices nothing more), every process of the server gets
    /// SIGKILL, and this returns once all are gone (their sockets closed by the kernel).
    /// Unlike `stop_immediate`, no backend says anything to its client first.
    pub fn kill_hard(&mut self) {
        let Some(mut child) = self.child.take() else {
            return;
        };
        let pm = child.id() as i32;
        unsafe { libc::kill(pm, libc::SIGSTOP) };
        let children = child_pids(pm);
        for &pid in &children {
            unsafe { libc::kill(pid, libc::SIGKILL) };
        }
        unsafe { libc::kill(pm, libc::SIGKILL) };
        let _ = child.wait();
        // Reparented to init once the postmaster is gone: a zombie has closed its files.
        let gone = super::eventually(TIMEOUT, || children.iter().all(|&p| !process_alive(p)));
        assert!(gone, "processes of the killed server are still there");
    }

    fn stop_with(&mut self, sig: i32) {
        if let Some(mut child) = self.child.take() {
            unsafe { libc::kill(child.id() as i32, sig) };
            if wait_timeout(&mut child, Duration::from_secs(30)).is_none() {
                let _ = child.kill();
                let _ = child.wait();
            }
        }
    }

    fn kill(&mut self) {
        if let Some(mut child) = self.child.take() {
            let _ = child.kill();
            let _ = child.wait();
        }
        // A postmaster left over (should not happen: it is our child).
        if let Some(pid) = self.postmaster_pid() {
            unsafe { libc::kill(pid, libc::SIGQUIT) };
        }
    }

    /// Starts a stopped server again on the same port.
    pub fn start_again(&mut self) {
        assert!(self.child.is_none(), "server is already running");
        let mut last = String::new();
        for _ in 0..20 {
            match self.try_start() {
                Ok(()) => return,
                // The port may linger a moment after the stop.
                Err(log) if log.contains("could not bind") || log.contains("already in use") => {
                    last = log;
                    std::thread::sleep(Duration::from_millis(250));
                }
                Err(log) => panic!("PostgreSQL did not restart:\n{log}"),
            }
        }
        panic!("PostgreSQL did not restart:\n{last}");
    }

    /// Fast stop, then start again on the same port.
    pub fn restart(&mut self) {
        self.stop();
        self.start_again();
    }

    pub fn is_running(&self) -> bool {
        self.child.is_some()
    }

    /// A streaming replica of `primary` (which must be running): `pg_basebackup -R` into a
    /// data directory of its own, started on its own free port, returned once it is in
    /// recovery and streaming. The template cluster already has what that needs
    /// (`wal_level = replica`, wal senders, and initdb's trust lines for replication).
    /// Stopped and removed on drop, like any PgServer.
    pub fn replica_of(primary: &PgServer) -> PgServer {
        let dir = tempfile::Builder::new()
            .prefix("weir-pg-replica-")
            .tempdir()
            .expect("tempdir");
        fs::set_permissions(dir.path(), fs::Permissions::from_mode(0o700)).unwrap();
        chown_r(dir.path());
        let data = dir.path().join("data");
        let out = run_with_timeout(
            pg_command(&primary.bin.join("pg_basebackup"))
                .arg("-h")
                .arg(primary.socket_dir())
                .arg("-p")
                .arg(primary.port().to_string())
                .args(["-U", "postgres", "-R", "-X", "stream", "-c", "fast", "-D"])
                .arg(&data),
            None,
            Duration::from_secs(120),
        );
        assert!(
            out.status.success(),
            "pg_basebackup failed:\n{}\n{}",
            String::from_utf8_lossy(&out.stdout),
            String::from_utf8_lossy(&out.stderr)
        );
        // The copied configuration names the primary's socket directory: the replica gets
        // its own (a later line wins).
        let mut conf = fs::OpenOptions::new()
            .append(true)
            .open(data.join("postgresql.conf"))
            .unwrap();
        use std::io::Write;
        writeln!(
            conf,
            "\n# weir test harness: replica\nunix_socket_directories = '{}'\nhot_standby = on",
            dir.path().display()
        )
        .unwrap();
        drop(conf);
        chown_r(dir.path());
        let mut pg = PgServer {
            dir,
            port: 0,
            child: None,
            bin: primary.bin,
        };
        pg.start_on_new_port();
        let streaming = super::eventually(TIMEOUT, || {
            pg.try_psql("select pg_is_in_recovery()::text || ',' || (select status from pg_stat_wal_receiver)")
                .is_ok_and(|s| s.trim() == "true,streaming")
        });
        assert!(
            streaming,
            "the replica on port {} is not streaming",
            pg.port
        );
        pg
    }

    /// `pg_ctl promote` and wait until the server is out of recovery.
    pub fn promote(&self) {
        let out = run_with_timeout(
            pg_command(&self.bin.join("pg_ctl"))
                .arg("promote")
                .arg("-w")
                .arg("-D")
                .arg(self.data_dir()),
            None,
            Duration::from_secs(60),
        );
        assert!(
            out.status.success(),
            "pg_ctl promote failed:\n{}\n{}",
            String::from_utf8_lossy(&out.stdout),
            String::from_utf8_lossy(&out.stderr)
        );
        let ok = super::eventually(TIMEOUT, || {
            self.try_psql("select pg_is_in_recovery()")
                .is_ok_and(|s| s.trim() == "f")
        });
        assert!(ok, "server on port {} is still in recovery", self.port);
    }

    /// Whether the server is a standby (`pg_is_in_recovery()`).
    pub fn in_recovery(&self) -> bool {
        self.psql("select pg_is_in_recovery()").trim() == "t"
    }
}

impl Drop for PgServer {
    fn drop(&mut self) {
        if std::thread::panicking() {
            eprintln!(
                "---- PostgreSQL log (port {}), last lines ----\n{}",
                self.port,
                tail_file(&self.log_path(), 30)
            );
        }
        self.stop_with(libc::SIGQUIT);
    }
}

/// The pids whose parent is `parent` (from /proc).
fn child_pids(parent: i32) -> Vec<i32> {
    let Ok(dir) = fs::read_dir("/proc") else {
        return Vec::new();
    };
    dir.filter_map(|e| e.ok()?.file_name().to_str()?.parse::<i32>().ok())
        .filter(|&pid| proc_stat(pid).is_some_and(|(_, ppid)| ppid == parent))
        .collect()
}

/// True while `pid` exists and is not a zombie.
fn process_alive(pid: i32) -> bool {
    proc_stat(pid).is_some_and(|(state, _)| state != 'Z' && state != 'X')
}

/// (state, ppid) from /proc/<pid>/stat; the command name may hold spaces and parentheses.
fn proc_stat(pid: i32) -> Option<(char, i32)> {
    let text = fs::read_to_string(format!("/proc/{pid}/stat")).ok()?;
    let rest = &text[text.rfind(')')? + 1..];
    let mut fields = rest.split_whitespace();
    let state = fields.next()?.chars().next()?;
    let ppid = fields.next()?.parse().ok()?;
    Some((state, ppid))
}
