//! The `weir` binary under test, started with a generated pgbouncer.ini.

use super::{free_port, tail, wait_timeout, PgServer, TIMEOUT};
use std::fs;
use std::net::TcpStream;
use std::path::{Path, PathBuf};
use std::process::{Child, Command, ExitStatus, Stdio};
use std::time::{Duration, Instant};

/// Path of the weir binary built by cargo for these tests.
pub fn weir_bin() -> &'static str {
    env!("CARGO_BIN_EXE_weir")
}

/// A `weir` command with a clean environment (no PG* variables).
pub fn weir_command() -> Command {
    let mut cmd = super::clean_command(weir_bin());
    cmd.env_remove("RUST_LOG");
    // Only a test that means to be Weir's systemd gets notified.
    cmd.env_remove("NOTIFY_SOCKET");
    cmd
}

/// Builds a pgbouncer.ini. By default: `listen_addr = 127.0.0.1`, a free
/// `listen_port`, `unix_socket_dir` and `logfile` in Weir's temp dir,
/// `auth_type = trust`, and an auth_file listing `postgres` and `app`
/// (PgBouncer wants the user in auth_file even with trust).
#[derive(Clone, Debug, Default)]
pub struct WeirBuilder {
    databases: Vec<(String, String)>,
    settings: Vec<(String, String)>,
    users: Vec<(String, String)>,
    userlist: Option<Vec<(String, String)>>,
    args: Vec<String>,
    extra: String,
    /// Start weir with this soft RLIMIT_NOFILE (the hard limit is left as it is).
    nofile_soft: Option<u64>,
    /// Listen on this port instead of a free one (several Weirs on one port).
    port: Option<u16>,
    /// Environment variables set for weir.
    envs: Vec<(String, String)>,
}

impl WeirBuilder {
    pub fn new() -> WeirBuilder {
        WeirBuilder::default()
    }

    /// A `[databases]` entry: `name = connstr`.
    pub fn database(mut self, name: &str, connstr: &str) -> Self {
        self.databases.retain(|(n, _)| n != name);
        self.databases.push((name.into(), connstr.into()));
        self
    }

    /// A `[databases]` entry `name` for PostgreSQL at 127.0.0.1:`port`, where nothing need
    /// listen (server logins that fail).
    pub fn database_at(self, name: &str, port: u16) -> Self {
        self.database(name, &format!("host=127.0.0.1 port={port} dbname=postgres"))
    }

    /// Listens on `port` instead of a free one (with so_reuseport, several Weirs share
    /// one).
    pub fn listen_on(mut self, port: u16) -> Self {
        self.port = Some(port);
        self
    }

    /// Starts weir with a low soft limit on open files, as a shell's `ulimit -n` would.
    pub fn nofile_soft_limit(mut self, n: u64) -> Self {
        self.nofile_soft = Some(n);
        self
    }

    /// A `[pgbouncer]` setting (replaces an earlier value of the same key).
    /// md5 logins, with users missing from the auth_file looked up through the role and
    /// function `PgServer::create_user_lookup` makes.
    pub fn auth_query_lookup(self) -> Self {
        self.set("auth_type", "md5").set("auth_user", "lookup").set(
            "auth_query",
            "SELECT usename, passwd FROM public.user_lookup($1)",
        )
    }

    pub fn set(mut self, key: &str, value: impl ToString) -> Self {
        self.settings.retain(|(k, _)| k != key);
        self.settings.push((key.into(), value.to_string()));
        self
    }

    /// Removes a `[pgbouncer]` setting, including a default one.
    pub fn unset(mut self, key: &str) -> Self {
        self.settings.retain(|(k, _)| k != key);
        self.settings.push((key.into(), "\u{0}unset".into()));
        self
    }

    /// A `[users]` entry: `user = settings` (e.g. `pool_mode=statement`).
    pub fn user_setting(mut self, user: &str, settings: &str) -> Self {
        self.users.retain(|(u, _)| u != user);
        self.users.push((user.into(), settings.into()));
        self
    }

    /// The auth_file contents: (user, password-or-verifier) pairs. Replaces
    /// the default list.
    pub fn userlist(mut self, users: &[(&str, &str)]) -> Self {
        self.userlist = Some(
            users
                .iter()
                .map(|(u, p)| (u.to_string(), p.to_string()))
                .collect(),
        );
        self
    }

    /// An environment variable for the weir process (e.g. NOTIFY_SOCKET).
    pub fn env(mut self, key: &str, value: &str) -> Self {
        self.envs.push((key.into(), value.into()));
        self
    }

    /// A command-line argument placed before the config file.
    pub fn arg(mut self, a: &str) -> Self {
        self.args.push(a.into());
        self
    }

    /// Raw text appended to the config file.
    pub fn extra(mut self, text: &str) -> Self {
        self.extra.push_str(text);
        self
    }

    /// The config file text for a Weir living in `dir` on `port`.
    pub fn render(&self, dir: &Path, port: u16) -> String {
        let mut out = String::from("[databases]\n");
        for (n, c) in &self.databases {
            out.push_str(&format!("{n} = {c}\n"));
        }
        out.push_str("\n[pgbouncer]\n");
        let mut settings: Vec<(String, String)> = vec![
            ("listen_addr".into(), "127.0.0.1".into()),
            ("listen_port".into(), port.to_string()),
            ("unix_socket_dir".into(), dir.display().to_string()),
            ("logfile".into(), dir.join("weir.log").display().to_string()),
            ("auth_type".into(), "trust".into()),
            (
                "auth_file".into(),
                dir.join("userlist.txt").display().to_string(),
            ),
        ];
        for (k, v) in &self.settings {
            settings.retain(|(k2, _)| k2 != k);
            if v != "\u{0}unset" {
                settings.push((k.clone(), v.clone()));
            }
        }
        for (k, v) in &settings {
            out.push_str(&format!("{k} = {v}\n"));
        }
        if !self.users.is_empty() {
            out.push_str("\n[users]\n");
            for (u, s) in &self.users {
                out.push_str(&format!("{u} = {s}\n"));
            }
        }
        out.push_str(&self.extra);
        out
    }

    fn userlist_text(&self) -> String {
        let default = vec![
            ("postgres".to_string(), String::new()),
            ("app".to_string(), String::new()),
        ];
        let list = self.userlist.clone().unwrap_or(default);
        list.iter()
            .map(|(u, p)| {
                format!(
                    "\"{}\" \"{}\"\n",
                    u.replace('"', "\"\""),
                    p.replace('"', "\"\"")
                )
            })
            .collect()
    }

    /// Writes pgbouncer.ini and userlist.txt into `dir`; returns the ini path.
    pub fn write(&self, dir: &Path, port: u16) -> PathBuf {
        fs::write(dir.join("userlist.txt"), self.userlist_text()).unwrap();
        let ini = dir.join("pgbouncer.ini");
        fs::write(&ini, self.render(dir, port)).unwrap();
        ini
    }

    /// Starts Weir and waits until it accepts TCP connections. If the port
    /// was taken meanwhile (another test process), retries on a new one.
    pub fn start(self) -> Weir {
        for attempt in 0.. {
            let w = self.clone().spawn();
            match w.try_wait_ready() {
                Ok(()) => return w,
                // Dropping `w` kills it; try another port.
                Err(msg) if attempt < 3 && msg.contains("in use") => continue,
                Err(msg) => panic!("{msg}"),
            }
        }
        unreachable!()
    }

    /// Starts Weir without waiting for it to listen.
    pub fn spawn(self) -> Weir {
        let dir = tempfile::Builder::new()
            .prefix("weir-test-")
            .tempdir()
            .expect("tempdir");
        // Readable by others, so that `weir -u someone` can still read it.
        use std::os::unix::fs::PermissionsExt;
        fs::set_permissions(dir.path(), fs::Permissions::from_mode(0o755)).unwrap();
        let port = self.port.unwrap_or_else(free_port);
        let ini = self.write(dir.path(), port);
        let mut cmd = weir_command();
        if let Some(soft) = self.nofile_soft {
            use std::os::unix::process::CommandExt;
            // SAFETY: only async-signal-safe calls between fork and exec.
            unsafe {
                cmd.pre_exec(move || {
                    let mut lim = libc::rlimit {
                        rlim_cur: 0,
                        rlim_max: 0,
                    };
                    libc::getrlimit(libc::RLIMIT_NOFILE, &mut lim);
                    lim.rlim_cur = soft.min(lim.rlim_max);
                    libc::setrlimit(libc::RLIMIT_NOFILE, &lim);
                    Ok(())
                });
            }
        }
        let child = cmd
            .envs(self.envs.iter().map(|(k, v)| (k, v)))
            .args(&self.args)
            .arg(&ini)
            .stdout(Stdio::from(
                fs::File::create(dir.path().join("stdout.log")).unwrap(),
            ))
            .stderr(Stdio::from(
                fs::File::create(dir.path().join("stderr.log")).unwrap(),
            ))
            .spawn()
            .expect("spawn weir");
        Weir {
            dir,
            port,
            child: Some(child),
            builder: self,
        }
    }
}

/// A running weir process. Killed (SIGKILL) and its directory removed on drop.
pub struct Weir {
    dir: tempfile::TempDir,
    port: u16,
    child: Option<Child>,
    builder: WeirBuilder,
}

impl Weir {
    pub fn builder() -> WeirBuilder {
        WeirBuilder::new()
    }

    /// A builder with database `postgres` pointing at `pg`'s `postgres`
    /// database.
    pub fn for_pg(pg: &PgServer) -> WeirBuilder {
        WeirBuilder::new().database("postgres", &pg.connstr())
    }

    /// Waits until the listen port accepts connections; panics (with the
    /// log) if Weir exits or does not listen within the timeout.
    pub fn wait_ready(&self) {
        if let Err(msg) = self.try_wait_ready() {
            panic!("{msg}");
        }
    }

    fn try_wait_ready(&self) -> Result<(), String> {
        let deadline = Instant::now() + TIMEOUT;
        loop {
            if TcpStream::connect(("127.0.0.1", self.port)).is_ok() {
                return Ok(());
            }
            if let Some(c) = &self.child {
                // try_wait needs &mut self; look at /proc instead.
                if is_zombie(c.id()) {
                    return Err(format!(
                        "weir exited before listening on 127.0.0.1:{}\n{}",
                        self.port,
                        self.log_tail()
                    ));
                }
            }
            if Instant::now() > deadline {
                return Err(format!(
                    "weir is not listening on 127.0.0.1:{} after {TIMEOUT:?}\n{}",
                    self.port,
                    self.log_tail()
                ));
            }
            std::thread::sleep(Duration::from_millis(20));
        }
    }

    pub fn port(&self) -> u16 {
        self.port
    }

    pub fn dir(&self) -> &Path {
        self.dir.path()
    }

    pub fn config_path(&self) -> PathBuf {
        self.dir.path().join("pgbouncer.ini")
    }

    /// The Unix socket Weir should listen on: `<unix_socket_dir>/.s.PGSQL.<port>`.
    pub fn socket_path(&self) -> PathBuf {
        self.dir.path().join(format!(".s.PGSQL.{}", self.port))
    }

    /// libpq-style URL.
    pub fn url(&self, db: &str, user: &str) -> String {
        format!("postgresql://{user}@127.0.0.1:{}/{db}", self.port)
    }

    pub fn pid(&self) -> i32 {
        self.child.as_ref().expect("weir has exited").id() as i32
    }

    pub fn signal(&self, sig: i32) {
        let r = unsafe { libc::kill(self.pid(), sig) };
        assert_eq!(r, 0, "kill({}, {sig}) failed", self.pid());
    }

    /// Rewrites the config (same port and directories) from `builder` and
    /// sends SIGHUP.
    pub fn reload_with(&mut self, builder: WeirBuilder) {
        builder.write(self.dir.path(), self.port);
        self.builder = builder;
        self.signal(libc::SIGHUP);
    }

    pub fn builder_used(&self) -> &WeirBuilder {
        &self.builder
    }

    /// The log file plus stderr and stdout.
    pub fn log(&self) -> String {
        let read = |n: &str| fs::read_to_string(self.dir.path().join(n)).unwrap_or_default();
        format!(
            "== weir.log ==\n{}\n== stderr ==\n{}\n== stdout ==\n{}",
            read("weir.log"),
            read("stderr.log"),
            read("stdout.log")
        )
    }

    pub fn stderr(&self) -> String {
        fs::read_to_string(self.dir.path().join("stderr.log")).unwrap_or_default()
    }

    pub fn logfile(&self) -> String {
        fs::read_to_string(self.dir.path().join("weir.log")).unwrap_or_default()
    }

    /// Waits until the log file holds `text`; panics with the log's tail if it does not
    /// within TIMEOUT.
    pub fn wait_for_log(&self, text: &str) {
        assert!(
            super::eventually(TIMEOUT, || self.logfile().contains(text)),
            "no {text:?} in the log:\n{}",
            self.log_tail()
        );
    }

    pub fn log_tail(&self) -> String {
        let read = |n: &str| {
            tail(
                &fs::read_to_string(self.dir.path().join(n)).unwrap_or_default(),
                40,
            )
        };
        format!(
            "---- weir.log (last lines) ----\n{}\n---- weir stderr (last lines) ----\n{}",
            read("weir.log"),
            read("stderr.log")
        )
    }

    /// Waits for the process to exit; `None` if it is still running after
    /// `timeout`.
    pub fn wait_exit(&mut self, timeout: Duration) -> Option<ExitStatus> {
        let child = self.child.as_mut()?;
        let st = wait_timeout(child, timeout);
        if st.is_some() {
            self.child = None;
        }
        st
    }

    /// Whether the process is still running.
    pub fn is_running(&mut self) -> bool {
        match self.child.as_mut() {
            Some(c) => matches!(c.try_wait(), Ok(None)),
            None => false,
        }
    }
}

fn is_zombie(pid: u32) -> bool {
    fs::read_to_string(format!("/proc/{pid}/stat"))
        .map(|s| {
            s.rsplit(')')
                .next()
                .unwrap_or("")
                .trim_start()
                .starts_with('Z')
        })
        .unwrap_or(true)
}

impl Drop for Weir {
    fn drop(&mut self) {
        if let Some(mut c) = self.child.take() {
            let _ = c.kill();
            let _ = c.wait();
        }
        if std::thread::panicking() {
            eprintln!("---- weir on port {} ----\n{}", self.port, self.log_tail());
        }
    }
}
